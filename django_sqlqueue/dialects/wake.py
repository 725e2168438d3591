"""The wake-up's payload: which queues a notification names (PostgreSQL LISTEN/NOTIFY).

Written by enqueue (queue/enqueue.py) and by the fleet's look (the maintenance holder, see
:meth:`~django_sqlqueue.dialects.postgresql.PostgresDialect.fleet_look_sql`), read by the listeners
(worker/wakeup.py): one small protocol, kept here, below them.

An enqueue's payload is the queues' names, comma-separated. A look's starts with :data:`LOOK_MARK`: it
names the queues holding work a claim could take now (possibly none), and its arrival alone tells
each listening worker that the fleet's look is running, so that its slots need not poll (docs/scaling.md).
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
    named = set(queues)
    if WAKE_ALL in named:
        return WAKE_ALL
    names = ",".join(sorted(named))
    return names if len(names.encode()) <= WAKE_PAYLOAD_MAX_BYTES else WAKE_ALL


#: The first character of a look's payload (a control character: no queue name starts with it in
#: practice, and one that did would only be read as a look that names the rest). A look's payload is
#: ``LOOK_MARK <interval>/<live slots>/<stamp> LOOK_MARK <queue>:<jobs> LOOK_SEP ...`` (or ``*``): the
#: receiver counts the looks as running for three of the SENDER's intervals (its own FLEET_LOOK_SECONDS
#: may differ), and wakes its share of the idle slots the jobs named in its queues need. ``stamp`` is the
#: database's clock when the look began (seconds since 1970): the look stamped the heartbeat of every
#: worker row whose session lock was held then (session liveness, worker/beats.py).
LOOK_MARK = "\x1e"
#: Between a look's queues (a queue name may hold a comma; an enqueue's payload, older, uses commas).
LOOK_SEP = "\x1f"
#: The look stamps a locked worker row whose heartbeat is older than this (seconds): a row it leaves
#: alone is at most this much older than the look's stamp.
LOOK_STAMPS_OLDER_THAN = 5.0
#: A look naming every queue (``*``) counts as this many jobs.
LOOK_ALL_JOBS = 1_000_000


#: The first character of a worker's hello: ``HELLO_MARK <host>``, sent when a worker row of that host
#: is registered, so that the host's other workers read its rows for their sweep of gone processes
#: (worker/heartbeat.HostSweep) at once instead of on a timer.
HELLO_MARK = "\x1d"


def hello_payload(host: str) -> str:
    return f"{HELLO_MARK}{host}"


def hello_host(payload: str) -> str | None:
    """The host a worker's hello names (None: not a hello)."""
    return payload[len(HELLO_MARK):] if payload.startswith(HELLO_MARK) else None


def is_look(payload: str) -> bool:
    """Whether ``payload`` came from the fleet's look rather than from an enqueue."""
    return payload.startswith(LOOK_MARK)


def _look_header(payload: str) -> tuple[float, int, float | None] | None:
    if not is_look(payload):
        return None
    interval, _, rest = payload[len(LOOK_MARK):].partition(LOOK_MARK)[0].partition("/")
    slots, _, rest = rest.partition("/")
    stamp = rest.partition("/")[0]  # fields a later version adds after it are passed over
    try:
        return float(interval), int(slots or 0), float(stamp) if stamp else None
    except ValueError:
        return None


def look_stamp(payload: str) -> float | None:
    """When the look's statement began on the database's clock (seconds since 1970): it stamped every
    live worker row whose session lock was taken before that. None: not a look, or a look without it."""
    header = _look_header(payload)
    return None if header is None else header[2]


def look_interval(payload: str) -> float | None:
    """The interval a look's payload says its sender looks at (None: not a look, or unreadable)."""
    header = _look_header(payload)
    return None if header is None else header[0]


def look_jobs(payload: str, queues: Iterable[str]) -> int:
    """How many jobs a look's payload names in ``queues`` (empty: every queue); 0 for what is not a
    look. ``*`` counts as :data:`LOOK_ALL_JOBS`."""
    if not is_look(payload):
        return 0
    names = payload[len(LOOK_MARK):].partition(LOOK_MARK)[2]
    if names == WAKE_ALL:
        return LOOK_ALL_JOBS
    served = set(queues)
    total = 0
    for item in names.split(LOOK_SEP) if names else ():
        queue, _, count = item.rpartition(":")
        if not served or queue in served:
            total += int(count) if count.isdigit() else 1
    return total


def look_wakes(payload: str, queues: Iterable[str], slots: int) -> int:
    """How many of its ``slots`` idle slots a worker serving ``queues`` wakes for a look: its share of
    the jobs named in its queues, by its slots among the fleet's live ones (so W workers do not each
    wake one slot per job: W times the claims for the same jobs), one at least when any are named."""
    jobs = look_jobs(payload, queues)
    if jobs <= 0:
        return 0
    header = _look_header(payload)
    fleet = header[1] if header is not None else 0
    if fleet <= slots:
        return min(jobs, slots)
    return max(1, min(slots, -(-jobs * slots // fleet)))


def wakes(payload: str, queues: Iterable[str]) -> bool:
    """Whether a wake-up with ``payload`` concerns a worker serving ``queues`` (empty: every queue). A
    look that names no job of them wakes nobody: it only says that the look runs."""
    if is_look(payload):
        return look_jobs(payload, queues) > 0
    if payload.startswith(HELLO_MARK):
        return False
    served = set(queues)
    return not served or payload == WAKE_ALL or not served.isdisjoint(payload.split(","))
