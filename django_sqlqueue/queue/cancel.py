"""Cancel: a job that is not running is Cancelled at once; a running one gets a request its worker acts on.

A running job belongs to the worker holding its lease: no one else may finish it (the concurrency token
would refuse the worker's own result, confusingly, and the handler would run on). So cancelling a
Processing job writes a :class:`~django_sqlqueue.models.CancelRequest` for its current attempt, and
the slot running it picks that up (heartbeat.py), tells the handler (``ctx.cancelled``), kills the slot
after the grace period if the handler does not stop, and records the job Cancelled itself, with the
request's "who and why" in the job's error and the attempt's history row.

The race with the job's own end is decided by the job row: the request is written only while the job
is Processing in the attempt the caller saw, under that row's lock, so either the request is in before
the worker's finish (and the worker, if it still runs the handler, sees it) or the finish came first
and the caller gets :class:`~django_sqlqueue.exceptions.CancelTooLate`. A request that is in but
reaches the worker after its handler has returned successfully loses: the job stays Completed and the
request remains as the record of a cancel that came too late.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL

from ..dialects import get_dialect, retrying
from ..exceptions import CancelTooLate, IllegalTransition, InvalidArgument, StaleJob
from ..states import FINISHED, TRANSITIONS, Status
from .rows import RowsMixin

if TYPE_CHECKING:
    from ..models import CancelRequest, Job

#: How often cancel() looks again at a job that changed under it (claimed, or its attempt ended).
CANCEL_TRIES = 3


def cancel_text(by: str, reason: str) -> str:
    """"cancelled by <by>: <reason>": what the job's error and the attempt's history row say."""
    return f"cancelled by {by or 'an unnamed caller'}" + (f": {reason}" if reason else "")


class CancelMixin(RowsMixin):
    """:meth:`cancel` and the read the worker's heartbeat uses to find a request."""

    def cancel(self, job: Job | int, *, reason: str = "", by: str = "", token: int | None = None,
               using: str | None = None) -> Job:
        """Cancel ``job``: Pending / Error / Paused -> Cancelled at once; Processing: ask its worker.

        Returns the job as it is now: Cancelled, or still Processing with a cancel request recorded for
        its current attempt (``job.cancel_request``; the worker running it stops it within
        ``CANCEL_CHECK_SECONDS`` + the grace period, see docs/worker.md). Asking twice keeps the first
        request. ``by`` (who asks) and ``reason`` are stored and shown in the history. ``token``: the
        version the caller read; a job changed since is refused (:class:`StaleJob`).

        Raises :class:`CancelTooLate` for a job that already finished (e.g. it Completed just before),
        :class:`IllegalTransition` for one that cannot be cancelled; nothing is written then.
        """
        if not isinstance(reason, str) or len(reason) > 1000:
            raise InvalidArgument("reason must be a string of at most 1000 characters")
        if not isinstance(by, str) or len(by) > 200:
            raise InvalidArgument("by must be a string of at most 200 characters")
        alias = self._alias(using)
        job_id = int(job.pk if isinstance(job, self.model) else job)  # type: ignore[union-attr]
        for _ in range(CANCEL_TRIES):
            current = self.get_for_update(job_id, using=alias)  # type: ignore[attr-defined]
            if token is not None and current.version != token:
                raise StaleJob(f"job {job_id}: token {token} is stale (now {current.version}); nothing was changed")
            state = current.state
            # A running job is asked to stop, unless its lease ran out (its worker is dead, or stalled past
            # the lease): then no one would act on a request and the next claim would run the job again,
            # so it is cancelled now, below, as a takeover would have taken it (a stalled holder's late
            # result is refused by the token, as after any takeover).
            if state == Status.PROCESSING and not self._lease_expired(current, alias):
                request = self._request_cancel(current, reason, by, alias)
                if request is not None:
                    current.cancel_request = request  # type: ignore[attr-defined]
                    return current
                continue  # its attempt ended meanwhile: look at what it became
            if state in FINISHED:
                raise CancelTooLate(f"job {job_id} is {state.label} already: the cancel came too late; "
                                    f"nothing was changed")
            if Status.CANCELLED not in TRANSITIONS[state]:
                raise IllegalTransition(f"job {job_id}: {state.label} -> Cancelled is not allowed")
            try:
                return self.modify(current, current.version, Status.CANCELLED,  # type: ignore[attr-defined]
                                   error=cancel_text(by, reason), using=alias)
            except StaleJob:
                if token is not None:
                    raise
                continue  # claimed, taken over or changed between the read and the write: look again
        raise StaleJob(f"job {job_id} kept changing while it was being cancelled; nothing was changed")

    def _lease_expired(self, job: Job, alias: str) -> bool:
        """Whether ``job``'s lease has run out by the database's clock (the one leases are set by)."""
        if job.lease_expires_at is None:
            return False
        now = RawSQL(get_dialect(connections[alias]).now(), [])
        return self.model._default_manager.using(alias).filter(  # type: ignore[attr-defined]
            pk=job.pk, version=job.version, lease_expires_at__lt=now).exists()

    def _request_cancel(self, job: Job, reason: str, by: str, alias: str) -> CancelRequest | None:
        """Record the request for ``job``'s current attempt if it is still running; None if it is not.

        The no-op UPDATE takes the job row's lock on every vendor (and re-checks status and attempt
        after waiting for it), so the worker's finish is either before it (0 rows: None) or after the
        request is committed.
        """
        from ..models import CancelRequest

        now = RawSQL(get_dialect(connections[alias]).now(), [])  # the database's clock, as leases use

        def write() -> CancelRequest | None:
            with transaction.atomic(using=alias):
                held = self.model._default_manager.using(alias).filter(  # type: ignore[attr-defined]
                    pk=job.pk, status_id=Status.PROCESSING, attempt_num=job.attempt_num).update(version=F("version"))
                if not held:
                    return None
                return CancelRequest.objects.using(alias).get_or_create(
                    job_id=job.pk, attempt_num=job.attempt_num,
                    defaults={"requested_at": now, "requested_by": by, "reason": reason})[0]

        # The no-op UPDATE is a by-id write: it can meet the claim in the opposite lock order on SQL
        # Server (a deadlock victim is run again; see dialects.retrying).
        request = retrying(alias, write)
        if request is None:
            return None
        if not isinstance(request.requested_at, datetime):
            request.refresh_from_db(fields=["requested_at"])  # the database's clock, read back
        return request

    def cancel_request_for(self, job_id: int, attempt_num: int, *, using: str | None = None) -> Any:
        """The cancel request that applies to this attempt of a job, or None.

        That is the request made for this attempt, or one made for an earlier attempt that no attempt
        since has ended in a finished status. A request outlives an attempt that ended before its worker
        acted on it: the worker died and the job was taken over, or the handler failed and the job is being
        retried. The operator asked for the job to stop, not for one attempt to. It does not outlive
        a finished attempt: the job was Cancelled (the request done), Completed (too late), or Failed, and
        an operator's retry of it is a new decision.

        The running slot's check: one seek on the (job, attempt) unique index of a table that holds only
        requests, and a second read of the job's history only when an earlier request exists.
        """
        from ..models import CancelRequest, JobAttempt

        alias = self._alias(using)
        request = CancelRequest.objects.using(alias).filter(
            job_id=job_id, attempt_num__lte=attempt_num).order_by("-attempt_num").first()
        if request is None or request.attempt_num == attempt_num:
            return request
        ended = JobAttempt.objects.using(alias).filter(
            job_id=job_id, attempt_num__gte=request.attempt_num, attempt_num__lt=attempt_num,
            outcome_id__in=sorted(FINISHED)).exists()
        return None if ended else request
