"""Modify: a job moved from one status to another, checked against the transition table and its token."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from .. import bounds, hooks, jobtypes
from ..conf import get_settings
from ..dialects import get_dialect, retrying
from ..dialects.base import queue_model
from ..exceptions import IllegalTransition, InvalidArgument, JobNotFound, StaleJob
from ..states import FINISHED, TRANSITIONS, Status
from .rows import RowsMixin
from .values import UNSET, check_response, duration_ms, storable_error
from .wakeups import wake_on_commit

if TYPE_CHECKING:
    from ..models import Job


#: Entering Processing is the claim's job (it bumps the attempt and writes history); modify refuses it
#: except for a job already Processing (a step advance within the same attempt).
CLAIM_ONLY = frozenset({(Status.PENDING, Status.PROCESSING), (Status.ERROR, Status.PROCESSING)})


class ModifyMixin(RowsMixin):
    """Every other change of a job's status: the transition rules, the token, the history row."""

    def get_for_update(self, job_id: int, *, using: str | None = None) -> Job:
        """Read the current row (a locking read on SQL Server, so row versioning cannot show a stale one)."""
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        with connections[alias].cursor() as cursor:
            dialect.execute(cursor, dialect.select_job_sql(f"{dialect.n.j['id']} = %s"), [job_id])
            rows = cursor.fetchall()
        if not rows:
            raise JobNotFound(f"no job with id {job_id}")
        return self._rows_to_jobs(rows, alias)[0]

    def modify(
        self,
        job: Job | int,
        token: int | None,
        status: Status | int,
        *,
        step: str | None = None,
        response: Any = UNSET,
        error: str | None = None,
        scheduled_for: datetime | None = None,
        run_in: float | None = None,
        reset_attempts: bool = False,
        duration: float | None = None,
        using: str | None = None,
        wake: bool = True,
        _release_note: str = "",
    ) -> Job:
        """Move a job to ``status`` if ``token`` still matches its ``version``; return the new row.

        Refuses transitions not in the table (:class:`IllegalTransition`) and writes nothing when the token is stale (:class:`StaleJob`). An Error when attempts are
        exhausted becomes Failed. Finishing an attempt stamps finished_at and duration and closes the
        history row; handing a Processing job back to Pending gives its attempt back. ``step`` keeps
        or advances the step. ``run_in`` sets scheduled_for to the database clock plus that many
        seconds (so a retry's due time does not depend on the worker host's clock). ``duration``: the
        seconds the handler itself ran, as the worker measured it, stored as the attempt's duration
        when it finishes (without it: the time since the claim, by the database clock). ``job`` may be
        a Job (its status and version are what the caller read) or an id (the current row is read
        first; ``token=None`` then means "whatever it is now").
        """
        alias = self._alias(using)
        new = Status(status)
        if not isinstance(job, self.model):
            job = self.get_for_update(int(job), using=alias)  # type: ignore[arg-type]
        if token is None:
            token = job.version
        if job.version != token:
            raise StaleJob(f"job {job.pk}: token {token} is stale (now {job.version}); nothing was changed")
        current = job.state
        if new not in TRANSITIONS[current] or (current, new) in CLAIM_ONLY:
            raise IllegalTransition(f"job {job.pk}: {current.label} -> {new.label} is not allowed")
        if new == Status.PENDING and current in FINISHED:
            self._refuse_early_retry(job, alias)
        if scheduled_for is not None:
            bounds.check_when(scheduled_for)
        if run_in is not None:
            if scheduled_for is not None:
                raise InvalidArgument("give run_in or scheduled_for, not both")
            bounds.check_delay(run_in, "run_in (a retry's delay)")
        ms = duration_ms(duration)
        connection = connections[alias]
        dialect = get_dialect(connection)
        sql, params = self._modify_statement(dialect, job, current, new, step, response, error, scheduled_for,
                                             run_in, reset_attempts, alias, ms)

        def write() -> Job:
            with transaction.atomic(using=alias), connection.cursor() as cursor:
                dialect.execute(cursor, sql, [*params, job.pk, token])
                rows = cursor.fetchall()
                if not rows:
                    raise StaleJob(f"job {job.pk} changed since token {token} was read; nothing was changed")
                updated = self._rows_to_jobs(rows, alias)[0]
                if current == Status.PROCESSING and updated.state in (Status.ERROR, Status.PENDING):
                    updated = self._cancel_if_asked(cursor, dialect, job, updated, alias)
                if current == Status.PROCESSING and new != Status.PROCESSING:
                    self._close_attempt(cursor, dialect, job, updated, released=new == Status.PENDING,
                                        note=_release_note)
                    if job.job_type_id in jobtypes.limited_type_ids(alias):
                        hooks.release_permits(cursor, dialect, [job.pk])  # its concurrency permit, if it holds one
                        jobtypes.permits_released(alias)  # (if this rolls back: one claim looks in vain)
                if new == Status.PENDING and current in FINISHED:  # an operator's retry: limits as they are now
                    hooks.follow_type_on_retry(updated, alias)
            return updated

        # A by-id write meets the claim in the opposite lock order on SQL Server (docs/sqlserver.md): a
        # deadlock victim's transaction is gone whole, and is run again (not inside the caller's).
        updated = retrying(alias, write)
        if (updated.has_dependents or updated.batch_id) and updated.state in FINISHED:  # workflows only (markers)
            hooks.after_finish([updated], alias)
        if wake and updated.state == Status.PENDING:
            # Claimable again, often with a due time long past (a hand-back, a workflow release, a retry,
            # a resume): the fleet's look names only jobs that came due lately, so wake its queue here.
            # A caller changing many jobs passes wake=False and wakes their queues once at the end.
            wake_on_commit(alias, {updated.queue})
        return updated

    def _cancel_if_asked(self, cursor: Any, dialect: Any, before: Job, updated: Job, alias: str) -> Job:
        """An attempt that ends to be retried (Error) or handed back (Pending) while a cancel request
        applies to it is Cancelled instead, in the same transaction (docs/cancel.md).

        The request may have come in after the handler started and before it failed, faster than its
        slot's first look (``CANCEL_CHECK_SECONDS``): retrying would run a job the operator asked to stop.
        Read after this transaction's UPDATE took the job row's lock, so a request is either seen here or
        written after it, where cancel() finds the job Error and cancels it at once. One seek on the
        requests' unique index, on these ends only (never on a success).
        """
        from .cancel import cancel_text

        request = self.cancel_request_for(before.pk, before.attempt_num, using=alias)  # type: ignore[attr-defined]
        if request is None:
            return updated
        if updated.state == Status.ERROR:
            last = (updated.error.strip().splitlines() or [""])[-1][:200]
            how = f"attempt {before.attempt_num} failed before its worker acted on the request ({last}): not retried"
        else:
            how = f"attempt {before.attempt_num} was handed back unstarted: not run"
        sql, params = self._modify_statement(dialect, updated, updated.state, Status.CANCELLED, None, UNSET,
                                             f"{cancel_text(request.requested_by, request.reason)} ({how})",
                                             None, None, False, alias)
        dialect.execute(cursor, sql, [*params, updated.pk, updated.version])
        return self._rows_to_jobs(cursor.fetchall(), alias)[0]

    def retry_with_payload(self, job: Job | int, token: int | None, payload: Any, *,
                           using: str | None = None) -> Job:
        """Retry ``job`` now (to Pending, as :meth:`modify` allows) with ``payload`` in place of its own:
        an operator's fix of the input that made it fail. One transaction: the transition (its table and
        the token apply) and the new payload, checked as enqueue checks one (JSON, storable, within
        ``MAX_PAYLOAD_BYTES``), with the concurrency key its handler derives from the payload. Nothing is
        written when a check fails (:class:`InvalidPayload`, :class:`StaleJob`, :class:`IllegalTransition`).
        """
        from ..handlers import registry
        from .values import encode_json

        alias = self._alias(using)
        encode_json(payload, "payload", get_settings().MAX_PAYLOAD_BYTES)
        with transaction.atomic(using=alias):
            new = self.modify(job, token, Status.PENDING, using=alias)
            fields: dict[str, Any] = {"payload": payload}
            found = registry.declared(jobtypes.get_type_by_id(new.job_type_id, using=alias).name)
            if found is not None and found.concurrency_key is not None:
                fields["concurrency_key"] = found.key_of(payload)
            self.using(alias).filter(pk=new.pk, version=new.version).update(**fields)  # type: ignore[attr-defined]
        for name, value in fields.items():
            setattr(new, name, value)
        return new

    def _refuse_early_retry(self, job: Job, alias: str) -> None:
        """An operator's retry of a finished job that waits for unfinished ones (cancelled while it was
        Waiting) would run it before them: refused. One seek on the dependencies' unique index, on
        retries only (never on a worker's path)."""
        from ..states import UNFINISHED

        JobDependency = queue_model("JobDependency")
        pending = list(JobDependency.objects.using(alias).filter(
            job_id=job.pk, depends_on__status_id__in=sorted(UNFINISHED)).order_by("depends_on_id")
            .values_list("depends_on_id", flat=True)[:10])
        if pending:
            raise IllegalTransition(
                f"job {job.pk} waits for job {', '.join(map(str, pending))}, not finished yet: a retry now would "
                "run it before them; retry it once they have finished")

    def _modify_statement(self, dialect: Any, job: Job, current: Status, new: Status, step: str | None,
                          response: Any, error: str | None, scheduled_for: datetime | None,
                          run_in: float | None, reset_attempts: bool, alias: str,
                          run_ms: int | None = None) -> tuple[str, list[Any]]:
        """Modify's checked values, in database form, as the dialect's statement: (SQL, params before
        the job's id and token)."""
        if step is not None and (not isinstance(step, str) or len(step) > 100):
            raise InvalidArgument("step must be a string of at most 100 characters")
        if response is not UNSET:
            check_response(response)
        sets, params = dialect.modify_sets(
            current, new, default_max_attempts=get_settings().MAX_ATTEMPTS, step=step,
            set_response=response is not UNSET,
            response=None if response is UNSET else self._prep("response", response, alias),
            error=None if error is None else storable_error(str(error)),
            scheduled_for=self._prep("scheduled_for", scheduled_for, alias), run_in=run_in,
            reset_attempts=reset_attempts, run_ms=run_ms)
        return dialect.modify_sql(sets), params

    def _close_attempt(self, cursor: Any, dialect: Any, before: Job, after: Job, *, released: bool,
                       note: str = "") -> None:
        if released and note:
            dialect.execute(cursor, dialect.close_attempt_sql(),
                            [int(Status.PENDING), storable_error(note), None, before.step, before.pk,
                             before.attempt_num])
            return
        if released:
            dialect.execute(cursor, dialect.delete_attempt_sql(), [before.pk, before.attempt_num])
            return
        # A cancel's reason (who cancelled it, and why) is the attempt's record too.
        error = after.error if after.status_id in (Status.ERROR, Status.FAILED, Status.CANCELLED) else ""
        dialect.execute(cursor, dialect.close_attempt_sql(),
                       [after.status_id, error, after.duration_ms, after.step, before.pk, before.attempt_num])

    # ----- conveniences over modify ---------------------------------------------------------------
    def complete(self, job: Job, response: Any = None, *, duration: float | None = None,
                 using: str | None = None) -> Job:
        """Processing -> Completed with ``response`` stored (``duration``: as in :meth:`modify`)."""
        return self.modify(job, job.version, Status.COMPLETED, response=response, duration=duration,
                           using=using or job._state.db)

    def fail(self, job: Job, error: str, *, retry_in: float | None = None, duration: float | None = None,
             using: str | None = None) -> Job:
        """Processing -> Error, due again after ``retry_in`` seconds (default: the type's backoff).

        Becomes Failed instead when the job has no attempts left.
        """
        if retry_in is None:
            from .backoff import backoff_seconds

            info = jobtypes.get_type_by_id(job.job_type_id, using=using or job._state.db or self._alias(None))
            retry_in = backoff_seconds(job.attempt_num, info)
        return self.modify(job, job.version, Status.ERROR, error=error, run_in=max(0.0, float(retry_in)),
                           duration=duration, using=using or job._state.db)

    def advance_step(self, job: Job, step: str, *, response: Any = UNSET, using: str | None = None) -> Job:
        """Record that ``job`` reached ``step`` (still Processing, same attempt)."""
        return self.modify(job, job.version, Status.PROCESSING, step=step, response=response,
                           using=using or job._state.db)

    def release(self, job: Job, *, using: str | None = None, note: str = "", wake: bool = True) -> Job:
        """Hand a claimed, unstarted job back to Pending without spending its attempt.

        The attempt's history row is dropped, or, with a ``note`` (e.g. "claim reply lost"), kept and
        closed as Pending with the note as its error, so the history shows what happened. ``wake``: as
        for :meth:`modify`.
        """
        return self.modify(job, job.version, Status.PENDING, using=using or job._state.db, wake=wake,
                           _release_note=note)
