"""The wake-up's payload: which queues an enqueue's notification names (PostgreSQL LISTEN/NOTIFY).

Written by enqueue (queue/enqueue.py), read by the listeners (worker/wakeup.py): one small protocol,
kept here, below both.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The wake-up payload that names every queue: sent when the names of the queues an enqueue wrote to
#: would not fit in one notification.
WAKE_ALL = "*"
#: PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more ("payload string too long"), which would
#: fail the enqueue that sends it (or, after its commit, report a failure for committed jobs).
WAKE_PAYLOAD_MAX_BYTES = 7_900


def wake_payload(queues: Iterable[str]) -> str:
    """The payload of a wake-up for jobs enqueued to ``queues``: their names, comma-separated, or
    :data:`WAKE_ALL` when that list is too long for one notification (an enqueue to many queues of
    up to 100 characters each). A worker wakes for a payload that names one of its queues, or all."""
    names = ",".join(sorted(set(queues)))
    return names if len(names.encode()) <= WAKE_PAYLOAD_MAX_BYTES else WAKE_ALL


def wakes(payload: str, queues: Iterable[str]) -> bool:
    """Whether a wake-up with ``payload`` concerns a worker serving ``queues`` (empty: every queue)."""
    served = set(queues)
    return not served or payload == WAKE_ALL or not served.isdisjoint(payload.split(","))
