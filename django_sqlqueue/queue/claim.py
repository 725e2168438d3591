"""Claim and batched completion: the worker's statements, sent through the dialect."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from .. import hooks, jobtypes
from ..conf import get_settings
from ..dialects import COL, ClaimRequest, get_dialect
from ..exceptions import InvalidArgument
from .rows import RowsMixin
from .values import check_response, duration_ms, new_incarnation

if TYPE_CHECKING:
    from ..models import Job


#: Tries of a claim that lost a deadlock or a lock timeout (retried after a short sleep).
CLAIM_RETRIES = 5


class ClaimMixin(RowsMixin):
    """The worker's side: claim jobs, record their completions, both in one transaction."""

    def claim(
        self,
        worker: str,
        limit: int = 1,
        *,
        queues: Sequence[str] = (),
        types: Sequence[str] = (),
        using: str | None = None,
        incarnation: str | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` jobs for ``worker`` in one statement; return them, claim order.

        Takes, in priority (high first), scheduled_for, id order: Pending/Error jobs that are due with
        attempts left and an unpaused type; Processing jobs held by this worker name from an earlier
        incarnation (its own unfinished work after a restart) unless another incarnation holds the
        name's worker row now; Processing jobs whose lease expired or whose worker's heartbeat is stale.
        Each becomes Processing with attempt + 1, a lease from the database clock, a new token
        (``version``), ``incarnation`` (a fresh random one when None: each call is its own incarnation)
        and a history row. Never returns a job to two claimers.
        """
        if not isinstance(limit, int) or limit < 1 or limit > 10_000:
            raise InvalidArgument(f"limit must be an integer from 1 to 10000, got {limit!r}")
        return self.complete_and_claim((), worker, limit, queues=queues, types=types, using=using,
                                       incarnation=incarnation)[1]

    def complete_many(self, done: Sequence[tuple[Job, Any] | tuple[Job, Any, float | None]], *,
                      using: str | None = None) -> list[Job]:
        """Processing -> Completed for many jobs at once: ``done`` is (job, response) pairs, or (job,
        response, seconds the handler ran) triples: without it the duration is claim to completion.

        One statement per chunk (on PostgreSQL one data-modifying CTE updates the jobs and closes their
        history rows), all in one transaction. Each job must still carry the token it was claimed with:
        a job whose token moved on (reclaimed after a stall, changed by an operator) is left alone and
        missing from the result, exactly as :meth:`complete` would refuse it with :class:`StaleJob`.
        Returns the updated rows of the jobs that were completed.
        """
        return self.complete_and_claim(done, "", 0, using=using)[0]

    def complete_and_claim(
        self,
        done: Sequence[tuple[Job, Any] | tuple[Job, Any, float | None]],
        worker: str,
        limit: int,
        *,
        queues: Sequence[str] = (),
        types: Sequence[str] = (),
        using: str | None = None,
        reclaim: bool = True,
        incarnation: str | None = None,
    ) -> tuple[list[Job], list[Job]]:
        """Record finished jobs and claim the next ones in ONE transaction (one commit, not two).

        ``done``: the jobs to complete, as :meth:`complete_many` takes them; then up to ``limit``
        jobs are claimed for ``worker`` as :meth:`claim` does (``limit=0``: complete only). A worker
        that just finished a batch would otherwise commit its results and then, at once, commit a
        claim: joining the two loses nothing (the results are committed before the new jobs run, and
        a failure rolls both back, so the jobs are still Processing under the old token and the
        caller records them again). Returns (completed rows, claimed jobs).

        ``reclaim=False`` claims only due Pending/Error jobs, not stuck Processing ones: a busy worker
        uses it between periodic full claims because it is much cheaper (see worker.py).
        """
        if not isinstance(limit, int) or limit < 0 or limit > 10_000:
            raise InvalidArgument(f"limit must be an integer from 0 to 10000, got {limit!r}")
        if limit and (not isinstance(worker, str) or not worker or len(worker) > 200):
            raise InvalidArgument("worker must be a non-empty string of at most 200 characters")
        alias = self._alias(using)
        items = []
        for job, response, *ran in done:
            check_response(response)
            items.append((job.pk, job.version, self._prep("response", response, alias),
                          duration_ms(ran[0] if ran else None)))
        # By job id: concurrent completions (and renewals, modify) lock their rows in one order, so two
        # of them never wait for each other's rows crosswise (SQL Server's nested-loop UPDATE takes the
        # rows in the order of its VALUES list).
        items.sort(key=lambda item: item[0])
        settings = get_settings()
        type_ids = jobtypes.type_ids(types, using=alias) if limit and types else ()
        limited = jobtypes.limited_type_ids(alias)
        # The permits of completed jobs of limited types are freed in the same transaction (one more
        # statement, only when such jobs finish; see docs/limits.md).
        releasing = {job.pk for job, *_ in done if job.job_type_id in limited} if limited else set()
        req = ClaimRequest(
            worker=worker or "-",
            limit=limit,
            queues=tuple(queues),
            types=type_ids,
            default_max_attempts=settings.MAX_ATTEMPTS,
            default_lease_seconds=settings.LEASE_SECONDS,
            worker_dead_after_seconds=settings.WORKER_DEAD_AFTER_SECONDS,
            reclaim=reclaim,
            incarnation=new_incarnation() if incarnation is None else str(incarnation)[:32],
            limited=(bool(limited) and bool(limit) and (not type_ids or not limited.isdisjoint(type_ids))
                     and (bool(releasing) or jobtypes.limited_branch_due(alias))),
        )
        connection = connections[alias]
        dialect = get_dialect(connection)
        for attempt in range(CLAIM_RETRIES):
            try:
                # SQLite: BEGIN IMMEDIATE (the write lock before the first read); PostgreSQL: one
                # statement alone runs in autocommit; otherwise atomic().
                with connection.cursor() as cursor, dialect.write_transaction(
                        cursor, len(items), bool(limit), extra=1 if releasing else 0):
                    if releasing:
                        # Completions first, then the permits of the jobs that did complete (a job whose
                        # token moved on was taken over: its permit is its new holder's), then the claim,
                        # which may take a permit just freed.
                        finished, _ = dialect.complete_and_claim(cursor, items, None)
                        hooks.release_permits(cursor, dialect, [r[COL["id"]] for r in finished
                                                                if r[COL["id"]] in releasing])
                        rows = dialect.claim(cursor, req) if limit else []
                    else:
                        finished, rows = dialect.complete_and_claim(cursor, items, req if limit else None)
                if req.limited:
                    jobtypes.limited_branch_result(alias, any(r[COL["job_type_id"]] in limited for r in rows))
                completed = self._rows_to_jobs(finished, alias)
                if any(j.has_dependents or j.batch_id for j in completed):  # workflows only (markers)
                    hooks.after_finish(completed, alias)
                return completed, self._rows_to_jobs(rows, alias)
            except DatabaseError as exc:
                # Inside the caller's transaction a deadlock victim's whole transaction is gone: no retry.
                if (attempt == CLAIM_RETRIES - 1 or not dialect.is_retryable_error(exc)
                        or connection.in_atomic_block):
                    raise
                time.sleep(0.01 * 2**attempt)
        return [], []  # pragma: no cover
