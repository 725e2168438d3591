"""JobQuerySet (reads) and JobManager (enqueue, claim, complete, modify, purge, reap).

Every change of a job's status goes through :class:`JobManager` (:meth:`~JobManager.claim`,
:meth:`~JobManager.modify` and the batched :meth:`~JobManager.complete_many`), so the transition table
and the concurrency token are enforced in one place for the worker, the admin and the API alike.
Reads do not all come through here: the admin's filters (admin_filters.py) and explain.py send their
own SQL.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import models
from django.utils import timezone

from ..states import CLAIMABLE, Status
from .cancel import CancelMixin, cancel_text
from .claim import CLAIM_RETRIES, ClaimMixin
from .enqueue import INSERT_COLUMNS, EnqueueMixin, JobSpec
from .housekeeping import HousekeepingMixin, purge_references, purge_statuses
from .modify import CLAIM_ONLY, ModifyMixin
from .pauses import PauseMixin
from .values import (
    MAX_DELAY_SECONDS,
    MAX_ERROR_CHARS,
    UNSET,
    duration_ms,
    finite_seconds,
    new_incarnation,
    offending_path,
    storable_error,
    unstorable,
)

__all__ = ["CLAIM_ONLY", "CLAIM_RETRIES", "INSERT_COLUMNS", "MAX_DELAY_SECONDS", "MAX_ERROR_CHARS", "UNSET",
           "JobManager", "JobQuerySet", "JobSpec", "cancel_text", "duration_ms", "finite_seconds", "new_incarnation",
           "offending_path", "purge_references", "storable_error", "unstorable"]


class JobQuerySet(models.QuerySet):
    """Read helpers used by the admin, the worker and tests."""

    def with_status(self, *statuses: Status | int | str) -> JobQuerySet:
        ids = [Status.from_label(s) if isinstance(s, str) else Status(s) for s in statuses]
        return self.filter(status_id__in=ids)

    def overdue(self) -> JobQuerySet:
        return self.filter(status_id__in=CLAIMABLE, scheduled_for__lte=timezone.now())

    def purgeable(self, statuses: Iterable[Status | int], cutoff: datetime, queues: Sequence[str] = ()) -> JobQuerySet:
        """Jobs :meth:`JobManager.purge` would delete: in ``statuses`` (finished ones only), finished
        (or, without a finish time, last updated) before ``cutoff``, of ``queues`` if given.

        Read ids from it (``values_list("id")``), never whole rows: payloads can be large.
        """
        old = models.Q(finished_at__lt=cutoff) | models.Q(finished_at__isnull=True, updated_at__lt=cutoff)
        qs = self.filter(old, status_id__in=purge_statuses(statuses))
        return qs.filter(queue__in=list(queues)) if queues else qs


class JobManager(EnqueueMixin, ClaimMixin, ModifyMixin, CancelMixin, HousekeepingMixin, PauseMixin,
                 models.Manager.from_queryset(JobQuerySet)):  # type: ignore[misc]
    """Enqueue, claim and modify jobs. ``using`` picks the database (default: SQLQUEUE['DATABASE']).

    One part per concern: :class:`~.enqueue.EnqueueMixin`, :class:`~.claim.ClaimMixin` (claim and batched
    completion), :class:`~.modify.ModifyMixin` (every other transition), :class:`~.cancel.CancelMixin` (cancel, of a running job too),
    :class:`~.housekeeping.HousekeepingMixin`
    (leases, purge, reap), :class:`~.pauses.PauseMixin` (pause and resume a queue), all on :class:`~.rows.RowsMixin` (database choice, rows to Job objects).
    """
