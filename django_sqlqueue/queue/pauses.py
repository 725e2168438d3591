"""Pause and resume a queue, fleet-wide: a row in the queue pause table, which the claim reads.

A paused job type stops its jobs in every queue; a paused queue stops every type's jobs in it (the
on-call answer to "the mail provider is down: stop sending, keep everything else going"). Both take
effect at the next claim of every worker, with no message to deliver and no worker to restart: the
claim's shared filter (``common_filters`` in dialects/base.py) holds ``NOT EXISTS`` on the pause
table. Jobs already running are left to finish; a paused queue's jobs stay Pending, due, and keep their
order, so a resume picks up where the queue stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import jobtypes
from ..dialects.base import queue_model
from ..exceptions import InvalidArgument
from .rows import RowsMixin
from .values import storable_key
from .wakeups import wake_on_commit

if TYPE_CHECKING:
    from ..models import QueuePause

#: The longest reason kept (the column's size).
MAX_REASON_CHARS = 500
#: The longest "who paused" kept (the column's size): refused beyond, never cut.
MAX_BY_CHARS = 200


def checked_queue_name(queue: object) -> str:
    """A queue name as enqueue accepts it, else :class:`InvalidArgument` naming the rule."""
    if not isinstance(queue, str) or not queue or len(queue) > 100:
        raise InvalidArgument(f"queue must be a non-empty string of at most 100 characters, got {queue!r}")
    storable_key(queue, "queue name")
    return queue


class PauseMixin(RowsMixin):
    """:meth:`pause_queue`, :meth:`resume_queue` and :meth:`paused_queues`."""

    def pause_queue(self, queue: str, *, by: str = "", reason: str = "", using: str | None = None) -> bool:
        """Pause ``queue``: from the next claim on, no worker takes its jobs. Returns False when it was
        already paused (the first pause's who, when and why are kept)."""
        queue = checked_queue_name(queue)
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
            raise InvalidArgument(f"reason must be a string of at most {MAX_REASON_CHARS} characters")
        if not isinstance(by, str) or len(by) > MAX_BY_CHARS:
            raise InvalidArgument(f"by must be a string (who pauses) of at most {MAX_BY_CHARS} characters, "
                                  f"got {by!r:.80}")
        storable_key(reason, "reason")
        storable_key(by, "by")
        model = queue_model("QueuePause")
        alias = self._alias(using)
        try:
            with transaction.atomic(using=alias):
                model.objects.using(alias).create(queue=queue, paused_at=timezone.now(), paused_by=by,
                                                  reason=reason)
        except IntegrityError:
            if model.objects.using(alias).filter(pk=queue).exists():
                return False
            raise
        return True

    def resume_queue(self, queue: str, *, using: str | None = None) -> bool:
        """Resume ``queue``: its due jobs are claimed again at the next claim. False when it was not
        paused."""
        queue = checked_queue_name(queue)
        alias = self._alias(using)
        deleted, _ = queue_model("QueuePause").objects.using(alias).filter(pk=queue).delete()
        if deleted:
            # This process's claims look for limited jobs at once; other workers' limited branch, backed
            # off after finding nothing, looks again within jobtypes.LIMITED_RECHECK_SECONDS.
            jobtypes.permits_released(alias)
            wake_on_commit(alias, {queue})  # its jobs are due already: the fleet's look would not name them
        return bool(deleted)

    def paused_queues(self, *, using: str | None = None) -> dict[str, QueuePause]:
        """The paused queues by name, with who paused each, when and why."""
        return {p.queue: p for p in queue_model("QueuePause").objects.using(self._alias(using)).all()}
