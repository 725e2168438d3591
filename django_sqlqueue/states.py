"""The status vocabulary, its classification and the transition table.

This is the ONE place that says which statuses a worker may claim, which are finished, which a
worker may still write results into, and which status may follow which. The database rows of
``QueueStatus`` are seeded from :data:`Status` by a data migration, and the integer ids are code
constants: the claim SQL embeds them as literals so that filtered/partial indexes match at compile
time (a bound parameter would not match a filtered index on SQL Server).
"""

from __future__ import annotations

import re
from enum import IntEnum


class Status(IntEnum):
    """Job statuses; the value is the primary key of the ``QueueStatus`` row."""

    PENDING = 1
    PROCESSING = 2
    ERROR = 3  # the last attempt failed; retryable once scheduled_for is due
    FAILED = 4  # retries exhausted: terminal
    COMPLETED = 5
    CANCELLED = 6
    PAUSED = 7
    TERMINATED = 8
    PARTIALLY_COMPLETED = 9
    WAITING = 10  # waits for other jobs to finish (workflows.py); not claimable until released

    @property
    def label(self) -> str:
        """The vocabulary word, as stored in ``QueueStatus.name``."""
        return _LABELS[self]

    @classmethod
    def from_label(cls, label: str) -> Status:
        try:
            return _BY_LABEL[label.replace(" ", "").lower()]
        except KeyError:
            raise ValueError(f"unknown status {label!r}; expected one of {', '.join(_LABELS.values())}") from None


_LABELS: dict[Status, str] = {
    Status.PENDING: "Pending",
    Status.PROCESSING: "Processing",
    Status.ERROR: "Error",
    Status.FAILED: "Failed",
    Status.COMPLETED: "Completed",
    Status.CANCELLED: "Cancelled",
    Status.PAUSED: "Paused",
    Status.TERMINATED: "Terminated",
    Status.PARTIALLY_COMPLETED: "PartiallyCompleted",
    Status.WAITING: "Waiting",
}
_BY_LABEL = {label.lower(): status for status, label in _LABELS.items()}

#: A worker may claim these once due (Paused is deliberately absent: pausing means "do not run").
CLAIMABLE: frozenset[Status] = frozenset({Status.PENDING, Status.ERROR})
#: Nothing more will happen to a job in these statuses unless an operator revives it.
FINISHED: frozenset[Status] = frozenset(
    {Status.FAILED, Status.COMPLETED, Status.CANCELLED, Status.TERMINATED, Status.PARTIALLY_COMPLETED}
)
#: Not finished: the dedupe key is unique among these.
UNFINISHED: frozenset[Status] = frozenset(set(Status) - FINISHED)
#: Where the dedupe key is unique (the partial unique index): the unfinished statuses a deduplicated
#: job can be in. Waiting is not among them because a job with dependencies may not carry a dedupe key
#: (enqueue refuses it), which keeps the index, and every statement matching it, as it was.
DEDUPE_SCOPE: frozenset[Status] = frozenset({Status.PENDING, Status.PROCESSING, Status.ERROR, Status.PAUSED})
#: A worker may still write a response, error or step into a job in these statuses.
EDITABLE: frozenset[Status] = frozenset({Status.PENDING, Status.PROCESSING, Status.ERROR, Status.FAILED})

_S = Status
#: Allowed transitions: current status -> statuses it may move to. Anything else is refused.
TRANSITIONS: dict[Status, frozenset[Status]] = {
    # an operator may cancel, pause or terminate anything not yet running; the claim moves it to Processing
    _S.PENDING: frozenset({_S.PROCESSING, _S.CANCELLED, _S.PAUSED, _S.TERMINATED}),
    # released when its dependencies have finished; cancelled when one failed under the "cancel"
    # policy (or by an operator). Not Paused: a waiting job does not run anyway, and a pause would
    # need to remember whether to go back to Waiting or Pending on resume.
    _S.WAITING: frozenset({_S.PENDING, _S.CANCELLED, _S.TERMINATED}),
    # a worker finishes an attempt (or keeps it Processing while it advances a step); an operator may
    # terminate a running job (its worker's next write is then refused by the concurrency token)
    _S.PROCESSING: frozenset(
        {
            _S.PROCESSING,
            _S.PENDING,  # handed back unstarted (graceful shutdown), without spending an attempt
            _S.ERROR,
            _S.FAILED,
            _S.COMPLETED,
            _S.CANCELLED,
            _S.TERMINATED,
            _S.PARTIALLY_COMPLETED,
        }
    ),
    _S.ERROR: frozenset({_S.PROCESSING, _S.PENDING, _S.FAILED, _S.CANCELLED, _S.PAUSED, _S.TERMINATED}),
    _S.FAILED: frozenset({_S.PENDING}),  # operator retry
    _S.COMPLETED: frozenset(),
    _S.CANCELLED: frozenset({_S.PENDING}),  # operator retry
    _S.PAUSED: frozenset({_S.PENDING, _S.CANCELLED, _S.TERMINATED}),
    _S.TERMINATED: frozenset(),
    _S.PARTIALLY_COMPLETED: frozenset({_S.PENDING}),  # operator re-runs the rest
}


def can_transition(current: Status, new: Status) -> bool:
    """True when ``current -> new`` is in the transition table."""
    return new in TRANSITIONS[current]


def sql_list(statuses: frozenset[Status] | set[Status]) -> str:
    """Render status ids as a literal SQL list such as ``1, 3``.

    Only ever called with members of :class:`Status` (code constants, never input), so embedding them
    is safe; it is what lets SQL Server match a filtered index at compile time.
    """
    return ", ".join(str(int(Status(s))) for s in sorted(statuses))


def human_label(status: Status | int) -> str:
    """The status as an operator reads it: "Partially completed", not the vocabulary's "PartiallyCompleted"."""
    label = Status(status).label
    return re.sub(r"(?<=[a-z])([A-Z])", lambda m: " " + m.group(1).lower(), label)
