"""Housekeeping: lease renewal, purging finished jobs, reaping jobs stuck without attempts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, models
from django.utils import timezone

from .. import hooks, jobtypes
from ..conf import get_settings
from ..dialects import get_dialect, retrying
from ..dialects.base import queue_model
from ..exceptions import IllegalTransition, InvalidArgument, JobNotFound, StaleJob
from ..states import FINISHED, Status
from .rows import RowsMixin

if TYPE_CHECKING:
    from ..models import Job


def purge_statuses(statuses: Iterable[Status | int]) -> list[int]:
    out = sorted({int(Status(s)) for s in statuses})
    if not out or any(Status(s) not in FINISHED for s in out):
        raise InvalidArgument("only finished jobs may be purged: statuses must be some of "
                              f"{', '.join(s.label for s in sorted(FINISHED))}, got {statuses!r}")
    return out


class HousekeepingMixin(RowsMixin):
    """Leases, retention and reaping."""

    def renew_leases(self, worker: str, job_ids: Sequence[int], lease_seconds: int, *,
                     using: str | None = None, incarnation: str | None = None) -> int:
        """Push the lease of jobs ``worker`` (its ``incarnation``, if given) still holds; return how many.

        No token bump: a lease renewal is not a state change. A job someone else reclaimed has another
        worker name or incarnation and is left alone (fencing: the late worker's finish is refused by
        the token).
        """
        if not job_ids:
            return 0
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        # Sorted: two renewals (or a renewal and a completion) lock the same rows in one order.
        ids = sorted(job_ids)

        def renew() -> int:
            with connections[alias].cursor() as cursor:
                limited = bool(jobtypes.limited_type_ids(alias))
                if limited:
                    # Concurrency permits are held as long as their jobs' leases: one more statement,
                    # only while some type has a limit (docs/limits.md). The permits first: a job whose
                    # lease ran out is renewed only if it got its permit back (permit_guard_sql).
                    hooks.renew_permits(cursor, dialect, ids, int(lease_seconds))
                dialect.execute(cursor, dialect.renew_leases_sql(len(ids), incarnation is not None, guarded=limited),
                                [*dialect.renewed_lease_params(lease_seconds, limited), *ids, worker,
                                 *([incarnation] if incarnation is not None else [])])
                return cursor.rowcount

        # Each statement commits alone (autocommit) and is idempotent: a deadlock victim (the renewal
        # meets the claim's expired branch in the opposite lock order on SQL Server) is run again.
        return retrying(alias, renew)

    def renew_held(self, holders: Sequence[tuple[str, str, Sequence[int]]], lease_seconds: int, *,
                   using: str | None = None) -> int:
        """:meth:`renew_leases` for several holders at once, in one statement: ``holders`` are
        (worker name, incarnation, job ids) of a supervisor's slots, whose one connection beats for all.
        Returns how many leases were renewed (fewer than the ids: some were taken over, or finished).

        One statement per part of the holders whose parameters fit the vendor's limit (each id is sent
        twice, each holder's name and incarnation once: a supervisor of 150 slots with 900 held jobs
        passed SQL Server's 2,100 in one statement)."""
        holders = [(name, incarnation, list(ids)) for name, incarnation, ids in holders if ids]
        if not holders:
            return 0
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        limited = bool(jobtypes.limited_type_ids(alias))
        lease_params = dialect.renewed_lease_params(lease_seconds, limited)
        renewed = 0
        with connections[alias].cursor() as cursor:
            for part in held_parts(holders, dialect.max_params - len(lease_params)):
                every = [job_id for _n, _i, ids in part for job_id in ids]
                params: list[Any] = [*lease_params, *every]
                for name, incarnation, ids in part:
                    params += [*ids, name, incarnation]
                if limited:  # the permits first, as renew_leases does
                    hooks.renew_permits(cursor, dialect, every, int(lease_seconds))
                dialect.execute(cursor, dialect.renew_held_sql([len(ids) for _n, _i, ids in part], guarded=limited),
                                params)
                renewed += cursor.rowcount
        return renewed

    def purge(self, ids: Sequence[int], *, statuses: Iterable[Status | int], cutoff: datetime,
              queues: Sequence[str] = (), using: str | None = None) -> int:
        """Delete those of jobs ``ids`` that :meth:`JobQuerySet.purgeable` still selects, with their
        history and subtype rows, in one transaction (one per chunk where the database takes fewer
        parameters than ``ids`` needs); return how many jobs were deleted.

        The ids were read earlier, without a lock: a job retried (back to Pending) or otherwise changed
        since is kept, rows and all. The jobs that still qualify are locked first, so none can change
        between the deletion of its rows and its own; the conditions are repeated in the job DELETE.
        Rows are deleted by job id and never read: no payload is loaded, whatever its size, and no
        delete signal is sent. Every model referencing ``Job`` must do so with ``on_delete=CASCADE``
        (history, subtype tables: their rows go too) or ``DO_NOTHING``; see :func:`purge_references`.
        """
        if timezone.is_naive(cutoff):
            raise InvalidArgument("cutoff must be timezone-aware")
        status_ids = purge_statuses(statuses)
        ids = [int(i) for i in ids]
        queues = list(queues)
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        room = dialect.max_params - len(status_ids) - len(queues) - 2
        if room < 1:
            raise InvalidArgument(f"too many queues for one purge statement on this database: {len(queues)}")
        when = self._prep("finished_at", cutoff, alias)
        references = purge_references(self.model)
        deleted = 0
        for start in range(0, len(ids), room):
            deleted += self._purge_chunk(ids[start:start + room], status_ids, when, queues, references, alias)
        return deleted

    def _purge_chunk(self, ids: list[int], status_ids: list[int], when: Any, queues: list[str],
                     references: list[tuple[str, str]], alias: str) -> int:
        connection = connections[alias]
        dialect = get_dialect(connection)
        tail = [*status_ids, when, when, *queues]
        with connection.cursor() as cursor, dialect.exclusive_transaction(cursor):
            where = dialect.purge_where(len(ids), len(status_ids), len(queues))
            dialect.execute(cursor, dialect.purge_lock_sql(where), [*ids, *tail])
            locked = [row[0] for row in cursor.fetchall()]
            if not locked:
                return 0
            for table, column in references:
                dialect.execute(cursor, dialect.delete_by_job_sql(table, column, len(locked)), locked)
            where = dialect.purge_where(len(locked), len(status_ids), len(queues))
            dialect.execute(cursor, dialect.purge_delete_sql(where), [*locked, *tail])
            return cursor.rowcount

    def reap(self, *, using: str | None = None, limit: int = 500) -> int:
        """Move Processing jobs with an expired lease and no attempts left to Failed; return how many.

        These would never be claimed again (the claim requires attempts left), so without this they
        would sit in Processing forever. Each goes through :meth:`modify`, so history is closed.
        """
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        with connections[alias].cursor() as cursor:
            dialect.execute(cursor, dialect.reap_candidates_sql(), [get_settings().MAX_ATTEMPTS])
            ids = [r[0] for r in cursor.fetchmany(limit)]
        done = 0
        for job_id in ids:
            try:
                job = self.get_for_update(job_id, using=alias)
                self.modify(job, job.version, Status.FAILED,
                            error=(job.error + "\n" if job.error else "")
                            + f"lease expired with no attempts left (last worker {job.worker!r})",
                            using=alias)
                done += 1
            except (StaleJob, IllegalTransition, JobNotFound):
                continue  # someone else moved it meanwhile
        return done


def purge_references(job_model: type[Job]) -> list[tuple[str, str]]:
    """(table, column) of every model that references a job and is deleted with it: the attempt
    history and the subtype tables (``on_delete=CASCADE``), in model order.

    :meth:`JobManager.purge` deletes these rows by job id, one level deep, as the database would have
    them gone; a reference it cannot honour that way (``PROTECT``, ``SET_NULL``, a cascaded model that
    is itself referenced) is refused up front with :class:`~.exceptions.SqlQueueError` rather than
    half done or failed by a foreign key at commit.
    """
    from ..exceptions import SqlQueueError

    def references(model: Any) -> list[Any]:
        # Every reverse relation, hidden ones too (the subtypes' related_name is "+").
        return [f for f in model._meta.get_fields(include_hidden=True) if f.auto_created and not f.concrete
                and (f.one_to_many or f.one_to_one or f.many_to_many)]

    out = []
    for rel in references(job_model):
        related = rel.related_model
        if rel.on_delete is models.DO_NOTHING or related._meta.proxy:
            continue
        where = f"{related._meta.label}.{rel.field.name}"
        if rel.on_delete is not models.CASCADE or rel.many_to_many:
            raise SqlQueueError(f"purge_queue deletes jobs by id and cannot honour {where} "
                                f"(on_delete={getattr(rel.on_delete, '__name__', rel.on_delete)!s}): "
                                "references to jobs must use CASCADE or DO_NOTHING")
        if any(r.on_delete is not models.DO_NOTHING for r in references(related)):
            raise SqlQueueError(f"purge_queue deletes the rows of {related._meta.label} by job id, one level "
                                f"deep, but other models reference them: delete those first")
        out.append((related._meta.db_table, rel.field.column))
    return out


#: Batch ids per DELETE statement of :func:`purge_batches`.
BATCH_IDS_PER_STATEMENT = 2000


def purge_batches(batches: Any, using: str, limit: int | None = None) -> int:
    """Delete the workflow batches of the queryset ``batches`` by id (ids read first, rows never loaded:
    a batch's callbacks carry job payloads), in chunks; the DELETE repeats "no member", so a member
    added meanwhile keeps its batch. Returns how many went (at most ``limit``, if given, lowest ids
    first). Used by ``purge_queue`` and retention."""
    Batch, Job = queue_model("Batch"), queue_model("Job")
    connection = connections[using]
    qn = connection.ops.quote_name
    batch_t, job_t = qn(Batch._meta.db_table), qn(Job._meta.db_table)
    batch_col = qn(Job._meta.get_field("batch").column)
    gone = 0
    ids = list(batches.order_by("id").values_list("id", flat=True)[:limit])
    for start in range(0, len(ids), BATCH_IDS_PER_STATEMENT):
        chunk = ids[start:start + BATCH_IDS_PER_STATEMENT]
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {batch_t} WHERE {qn('id')} IN ({', '.join(['%s'] * len(chunk))}) "
                f"AND NOT EXISTS (SELECT 1 FROM {job_t} j WHERE j.{batch_col} = {batch_t}.{qn('id')})", chunk)
            gone += cursor.rowcount
    return gone


def retention_batch(status: Status, cutoff: datetime, after: datetime | None, size: int,
                    using: str) -> tuple[int, int, datetime | None]:
    """One short batch of retention (``SQLQUEUE["RETENTION"]``): the ``size`` oldest jobs of ``status``
    finished before ``cutoff`` (and not before ``after``, where the previous batch of this status
    stopped) are deleted with :meth:`JobManager.purge` (their history, subtype, dependency and cancel
    rows with them, each job re-checked under a lock). Returns (ids read, jobs deleted, the finish time
    to start the next batch from).

    The read walks the ``(finished_at, status)`` index from ``after``: an index range whose length is
    the batch, however many finished jobs of other statuses (kept longer, or for ever) lie before it,
    once the first batch has found where this status's due rows begin. The status is a literal of the
    statement (a code constant).
    """
    from ..dialects.predicates import index_predicate

    Job = queue_model("Job")
    qs = Job.objects.using(using).filter(index_predicate(using, "status", f"= {int(Status(status))}"),
                                         finished_at__lt=cutoff)
    if after is not None:
        qs = qs.filter(finished_at__gte=after)
    rows = list(qs.order_by("finished_at").values_list("id", "finished_at")[:size])
    if not rows:
        return 0, 0, after
    deleted = Job.objects.purge([r[0] for r in rows], statuses=[status], cutoff=cutoff, using=using)
    return len(rows), deleted, rows[-1][1]


def held_parts(holders: list[tuple[str, str, list[int]]], budget: int) -> list[list[tuple[str, str, list[int]]]]:
    """``holders`` cut into parts whose renewal takes at most ``budget`` parameters: two per id, two
    per holder's share of a part (a holder whose ids do not fit is split across parts)."""
    parts: list[list[tuple[str, str, list[int]]]] = [[]]
    used = 0
    for name, incarnation, ids in holders:
        start = 0
        while start < len(ids):
            room = (budget - used - 2) // 2
            if room < 1:
                parts.append([])
                used = 0
                continue
            share = ids[start:start + room]
            parts[-1].append((name, incarnation, share))
            used += 2 * len(share) + 2
            start += len(share)
    return [part for part in parts if part]
