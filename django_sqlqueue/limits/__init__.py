"""Limit permits: the semaphore rows behind concurrency and rate limits (docs/limits.md).

The claim takes a permit together with a job of its scope (dialects: ``permit_filters`` and the
limited branch); this module keeps the rows in line with the limits (one row per slot and scope,
created when a limit is set and, for keys, when a job of a new key is enqueued), frees a concurrency
permit when its job leaves Processing, holds it while the job's lease is renewed, and says why a job
waits for one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import DateTimeField, F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from .. import bounds

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from ..dialects import Dialect
    from ..jobtypes import TypeInfo
    from ..models import Job, JobType

CONCURRENCY, RATE = 1, 2


def wanted(concurrency_limit: int | None, rate_limit: str) -> tuple[int, int, float | None] | None:
    """(kind, slots, hold seconds) of the permits a type with these limits needs; None: no limit."""
    if concurrency_limit is not None:
        return CONCURRENCY, int(concurrency_limit), None
    if rate_limit:
        count, period = bounds.parse_rate(rate_limit)
        return RATE, count, period
    return None


def release(cursor: CursorWrapper, dialect: Dialect, job_ids: Sequence[int]) -> None:
    """Free the concurrency permits of ``job_ids`` (they left Processing), in the caller's transaction."""
    for start in range(0, len(job_ids), 1000):
        part = list(job_ids[start:start + 1000])
        dialect.execute(cursor, dialect.release_permits_sql(len(part)), part)


def renew(cursor: CursorWrapper, dialect: Dialect, job_ids: Sequence[int], lease_seconds: int) -> None:
    """Hold the concurrency permits of running ``job_ids`` as long as their renewed leases."""
    for start in range(0, len(job_ids), 1000):
        part = list(job_ids[start:start + 1000])
        dialect.execute(cursor, dialect.renew_permits_sql(len(part)), [int(lease_seconds), *part])


def ensure(using: str, type_id: int, keys: Iterable[str], need: tuple[int, int, float | None]) -> None:
    """Create the permit rows of scopes (``type_id``, each of ``keys``) that are missing.

    Insert-if-missing, one row per statement, each in a savepoint: a racing enqueue of the same new key
    may insert the same row first, and the unique (type, key, kind, slot) index refuses the second.
    """
    kind, slots, hold = need
    connection = connections[using]
    from ..dialects import get_dialect

    dialect = get_dialect(connection)
    sql = dialect.insert_permits_sql()
    with connection.cursor() as cursor:
        for key in set(keys):
            for slot in range(slots):
                try:
                    with transaction.atomic(using=using):
                        dialect.execute(cursor, sql, [type_id, key, kind, slot, hold, type_id, key, kind, slot])
                except IntegrityError:
                    continue  # another process created it


def sync_type(row: JobType, using: str) -> None:
    """Bring a type's permit rows in line with its limits (after it was saved: admin, handler sync).

    Rows of another kind, or of slots at or beyond the limit, go once free; a held one stays, held by
    its running job, as a surplus row that is never taken and keeps its scope from admitting while it
    is held (a lowered limit admits again only once the jobs above it have finished; raised back, the
    slot is an ordinary row again, still held). Missing rows are created for the type's "" scope and for
    every key of its unfinished jobs (Waiting and Paused too).
    """
    from ..dialects import get_dialect
    from ..models import Job, LimitPermit
    from ..states import UNFINISHED

    need = wanted(row.concurrency_limit, row.rate_limit)
    permits = LimitPermit.objects.using(using).filter(job_type_id=row.pk)
    # The type's unfinished jobs leave (or join) the ordinary claim's index: one UPDATE of its jobs.
    # Waiting and Paused ones too: they become Pending later without passing through here (a workflow's
    # release, a resume), and heal (the maintenance pass's) looks only at types saved lately.
    unfinished = sorted(UNFINISHED)
    flag_jobs(using, Job.objects.using(using).filter(job_type_id=row.pk, status_id__in=unfinished),
              need is not None)
    if need is None:
        permits.delete()
        return
    kind, slots, hold = need
    # A limit change never frees a permit a running job holds (issue 31: deleting it and creating the
    # slot again free, on a limit lowered and raised back, admitted a third job under a limit of 2). A
    # held row the limit no longer has (another kind, a slot at or beyond N) stays, as a surplus row
    # (hold_seconds < 0: never taken; while held, its scope admits nothing, see Dialect.permit_filters);
    # free ones go. A slot the limit has again is an ordinary row again, held or not.
    now = RawSQL(get_dialect(connections[using]).now(), [], output_field=DateTimeField())
    free = Q(held_until__isnull=True) | Q(held_until__lt=now)
    dropped = Q(slot__gte=slots) | ~Q(kind=kind)
    permits.filter(dropped).filter(free).delete()
    surplus = permits.filter(dropped).exclude(hold_seconds__lt=0)
    surplus.filter(hold_seconds__isnull=True).update(hold_seconds=-1.0)
    surplus.filter(hold_seconds__gt=0).update(hold_seconds=-F("hold_seconds"))
    kept = permits.filter(kind=kind, slot__lt=slots)
    if hold is None:
        kept.filter(hold_seconds__isnull=False).update(hold_seconds=None)
    else:
        kept.filter(Q(hold_seconds__isnull=True) | ~Q(hold_seconds=hold)).update(hold_seconds=hold)
    keys = set(Job.objects.using(using).filter(job_type_id=row.pk, status_id__in=unfinished)
               .values_list("concurrency_key", flat=True).order_by().distinct())
    ensure(using, row.pk, keys | {""}, need)


#: Jobs per UPDATE of :func:`flag_jobs`: far under the ~5,000 locks at which a statement's locks
#: escalate (where escalation is on), and a bounded number of row locks per transaction.
FLAG_BATCH = 1000


def flag_jobs(using: str, jobs: Any, limited: bool) -> int:
    """Set ``limited`` on the jobs of queryset ``jobs`` that do not have it yet, ``FLAG_BATCH`` at a time;
    return how many changed.

    One UPDATE of every unfinished job of a type would lock them all at once: millions of row locks
    with lock escalation off (SQL Server: error 1204, out of lock memory), or a table lock that stops
    every claim where it is on. In batches, each its own transaction outside a caller's (a deadlock
    victim run again); inside one (the admin's save) the first batch is written in it, and the rest
    after it commits, each batch alone (the supervisor's :func:`heal` mends what a process that died
    meanwhile left). A job without the flag yet is claimed by neither branch (its type has a limit):
    it waits, it is never run past its limit.
    """
    from django.db import connections

    from ..dialects import retrying

    todo = jobs.exclude(limited=limited)

    def one_batch() -> tuple[int, int]:
        """(jobs looked at, jobs changed): the next batch, in id order (the order every writer takes)."""
        ids = list(todo.order_by("pk").values_list("pk", flat=True)[:FLAG_BATCH])
        if not ids:
            return 0, 0
        return len(ids), retrying(using, lambda: todo.filter(pk__in=ids).update(limited=limited))

    def batches(first: int = 0) -> int:
        changed, seen = first, FLAG_BATCH
        while seen == FLAG_BATCH:
            seen, n = one_batch()
            changed += n
        return changed

    if connections[using].in_atomic_block:
        seen, changed = one_batch()
        if seen == FLAG_BATCH:
            transaction.on_commit(batches, using=using)
        return changed
    return batches()


def remove_idle_key_permits(using: str, limit: int = 500) -> int:
    """Delete the permits of per-key scopes that nothing needs now: no unfinished job of the key, and
    no permit of the scope held (a rate limit's period still running counts as held); return how many
    rows went. The type's shared "" scope is never removed (its rows follow the limit itself).

    Every key ever enqueued got its scope's permits (:func:`ensure_for_enqueue`); left in place they
    grow the permit table without bound, and the limited claim's walk over free permits with them.
    An enqueue of the key again creates them again; one racing this delete (its permits checked just
    before, its job inserted just after) leaves a job whose scope has no permits, which :func:`heal`
    creates within a pass (the job waits, it is never run past its limit).

    For periodic maintenance (``limit`` scopes a call); :func:`heal` calls it on every pass. Each
    DELETE re-checks both conditions, so a scope that came back to life between the look and the
    delete is kept.
    """
    from django.db.models import Exists, OuterRef
    from django.db.models.functions import Now

    from ..dialects import retrying
    from ..models import Job, LimitPermit
    from ..states import UNFINISHED

    def idle(qs: Any) -> Any:
        busy = Job.objects.using(using).filter(job_type_id=OuterRef("job_type_id"), concurrency_key=OuterRef("key"),
                                               status_id__in=sorted(UNFINISHED))
        held = LimitPermit.objects.using(using).filter(job_type_id=OuterRef("job_type_id"), key=OuterRef("key"),
                                                       held_until__gte=Now())
        return qs.exclude(key="").exclude(Exists(busy)).exclude(Exists(held))

    permits = LimitPermit.objects.using(using)
    scopes = list(idle(permits).order_by().values_list("job_type_id", "key").distinct()[:limit])
    removed = 0
    for type_id, key in scopes:
        removed += retrying(using, lambda t=type_id, k=key: idle(permits.filter(job_type_id=t, key=k)).delete()[0])
    return removed


def follow_type_on_retry(job: Job, using: str) -> None:
    """An operator's retry of a finished job (-> Pending): its ``limited`` flag, and its key's permits,
    follow the type's limit as it is now.

    :func:`sync_type` updates unfinished jobs only, so a job that finished before its type's limit was
    set (or removed) would otherwise come back with a stale flag, claimable by neither branch until the
    supervisor's heal. The type row is read, not the cache: a retry is rare, and a stale cache is what
    this mends. In the retry's transaction.
    """
    from ..models import Job, JobType, LimitPermit

    row = JobType.objects.using(using).only("concurrency_limit", "rate_limit").get(pk=job.job_type_id)
    need = wanted(row.concurrency_limit, row.rate_limit)
    if bool(job.limited) != (need is not None):
        Job.objects.using(using).filter(pk=job.pk).update(limited=need is not None)
        job.limited = need is not None
    if need is not None:
        kind, slots, _ = need
        for key in {job.concurrency_key or "", ""}:
            have = LimitPermit.objects.using(using).filter(
                job_type_id=row.pk, key=key, kind=kind, slot__lt=slots).count()
            if have < slots:
                ensure(using, row.pk, [key], need)


def ensure_for_enqueue(using: str, info: TypeInfo, keys: Iterable[str]) -> None:
    """At enqueue, for a limited type: the permits of each key's scope exist (the "" scope's are made
    when the limit is set)."""
    need = wanted(info.concurrency_limit, info.rate_limit)
    fresh = {k for k in keys if k}
    if need is None or not fresh:
        return
    from ..models import JobType, LimitPermit

    def missing(need: tuple[int, int, float | None]) -> set[str]:
        return fresh - set(LimitPermit.objects.using(using).filter(
            job_type_id=info.id, key__in=fresh, kind=need[0], slot=need[1] - 1).values_list("key", flat=True))

    if not missing(need):
        return
    # Rows are created from the type row, never from the cached limits: the claim takes whatever permit
    # rows exist, so permits made from a limit another process has just lowered (or changed to a rate)
    # would admit more than the limit, for good. One more read, only when a scope lacks permits.
    row = JobType.objects.using(using).filter(pk=info.id).values("concurrency_limit", "rate_limit").first()
    need = None if row is None else wanted(row["concurrency_limit"], row["rate_limit"] or "")
    if need is not None and (keys := missing(need)):
        ensure(using, info.id, keys, need)


def heal(using: str, type_ids: Collection[int] | None = None, since: datetime | None = None) -> int:
    """Bring jobs in line with their types' limits (a job enqueued by a process whose type cache did not
    know the limit yet): their ``limited`` flag, and the permits of their keys; return how many jobs
    and scopes were fixed.

    ``type_ids``: only the jobs of these types (the maintenance pass gives the types saved lately: a
    stale cache is at most ``TYPE_CACHE_SECONDS`` old, so only a type whose limit just changed can have
    stale jobs); None: every type. ``since``: only jobs enqueued since then (the maintenance pass gives
    a minute before the oldest of those saves: a stale enqueue follows the change, so its look is a
    range of the enqueue-time index, not the type's whole backlog). Each statement seeks an index, with the partial indexes' own
    predicates as literals so SQL Server and SQLite match them (a bound parameter never matches a
    filtered index): with no type limited, one seek of the (empty) limited index, whatever the backlog.
    """
    from django.db.models import Exists, OuterRef, Q

    from ..dialects import get_dialect
    from ..dialects.predicates import index_predicate
    from ..models import Job, JobType, LimitPermit
    from ..states import CLAIMABLE, UNFINISHED, Status, sql_list

    rows = JobType.objects.using(using).filter(Q(concurrency_limit__isnull=False) | ~Q(rate_limit=""))
    if type_ids is not None:
        type_ids = sorted(set(type_ids))
        if not type_ids:
            return 0
        rows = rows.filter(pk__in=type_ids)
    types = {t.pk: t for t in rows}
    jobs = Job.objects.using(using)
    if since is not None:
        jobs = jobs.filter(enqueued_at__gte=since)
    true = get_dialect(connections[using]).true_literal
    # The limited index's own predicate: claimable or Processing, limited (literals).
    in_limited_index = (index_predicate(using, "status", f"IN ({sql_list(CLAIMABLE | {Status.PROCESSING})})")
                        & index_predicate(using, "limited", f"= {true}"))
    # 1. Flagged limited, type has none (its limit was removed while a stale process enqueued).
    healed = 0
    if type_ids is None:  # a walk of the limited index, whose jobs are the limited types' (none: empty)
        healed = jobs.filter(in_limited_index).exclude(job_type_id__in=list(types)).update(limited=False)
    elif unlimited := [t for t in type_ids if t not in types]:  # their unfinished jobs: the (status, type) index
        for status in sorted(UNFINISHED):
            healed += jobs.filter(index_predicate(using, "status", f"= {int(status)}"), job_type_id__in=unlimited,
                                  limited=True).update(limited=False)
    if type_ids is None:  # (the maintenance pass runs it on every pass of its own)
        # Idle key scopes' permits go (the permit table would grow with every key ever used).
        remove_idle_key_permits(using)
    if not types:
        return healed
    # 2. Not flagged, type has a limit: seeks of the (status, type) index, limited types only, one status
    # per statement (SQLite's planner, which knows averages only, scans the table for a list of them).
    for status in sorted(UNFINISHED) if type_ids is not None else sorted(CLAIMABLE | {Status.PROCESSING}):
        healed += jobs.filter(index_predicate(using, "status", f"= {int(status)}"), job_type_id__in=list(types),
                              limited=False).update(limited=True)
    # 3. Keys of claimable limited jobs without permits: the limited index, by type.
    orphans = (jobs.filter(in_limited_index, job_type_id__in=list(types), status_id__in=sorted(CLAIMABLE))
               .exclude(Exists(LimitPermit.objects.using(using).filter(
                   job_type_id=OuterRef("job_type_id"), key=OuterRef("concurrency_key"))))
               .values_list("job_type_id", "concurrency_key").order_by().distinct()[:1000])
    for type_id, key in orphans:
        row = types[type_id]
        need = wanted(row.concurrency_limit, row.rate_limit)
        if need is not None:
            ensure(using, type_id, [key], need)
            healed += 1
    return healed


def explain_many(jobs: Iterable[Job]) -> dict[Job, str]:
    """:func:`explain` for the due claimable jobs of limited types among ``jobs`` (the admin's page): one
    read of their scopes' permits, not one per job."""
    from django.db.models import Q

    from ..jobtypes import get_type_by_id
    from ..models import LimitPermit
    from ..states import CLAIMABLE

    now = timezone.now()
    waiting = [j for j in jobs if j.status_id in CLAIMABLE and j.scheduled_for <= now]
    if not waiting:
        return {}
    using = waiting[0]._state.db or "default"
    infos: dict[int, Any] = {}
    for j in waiting:  # the admin's list selects the type with the job: no query per type
        if j.job_type_id not in infos:
            infos[j.job_type_id] = (_row_info(j.job_type) if type(j).job_type.is_cached(j)
                                    else get_type_by_id(j.job_type_id, using=using))
    waiting = [j for j in waiting if infos[j.job_type_id].limited]
    if not waiting:
        return {}
    scopes = {(j.job_type_id, j.concurrency_key) for j in waiting}
    where = Q()
    for type_id, key in scopes:
        where |= Q(job_type_id=type_id, key=key)
    rows: dict[tuple[int, str], list[Any]] = {}
    for permit in LimitPermit.objects.using(using).filter(where):
        rows.setdefault((permit.job_type_id, permit.key), []).append(permit)
    out = {}
    for job in waiting:
        why = _why(infos[job.job_type_id], job.concurrency_key, rows.get((job.job_type_id, job.concurrency_key), []),
                   now)
        if why:
            out[job] = why
    return out


def _row_info(row: JobType) -> Any:
    """What :func:`_why` reads of a type, from its row."""
    from ..jobtypes import TypeInfo

    return TypeInfo(id=row.pk, name=row.name, max_attempts=0, backoff_base_seconds=0, backoff_max_seconds=0,
                    timeout_seconds=0, lease_seconds=0, paused=row.paused, concurrency_limit=row.concurrency_limit,
                    rate_limit=row.rate_limit or "")


def explain(job: Job) -> str | None:
    """Why a claimable job waits for its limit ("held by the concurrency limit of Export: 2 of 2
    running"), or None when its scope has a free permit (or its type has no limit)."""
    from ..jobtypes import get_type_by_id
    from ..models import LimitPermit

    using = job._state.db or "default"
    info = get_type_by_id(job.job_type_id, using=using)
    need = wanted(info.concurrency_limit, info.rate_limit)
    if need is None:
        return None
    rows = list(LimitPermit.objects.using(using).filter(job_type_id=info.id, key=job.concurrency_key))
    return _why(info, job.concurrency_key, rows, timezone.now())


def _why(info: TypeInfo, key: str, rows: list[Any], now: Any) -> str | None:
    need = wanted(info.concurrency_limit, info.rate_limit)
    if need is None:
        return None
    kind, slots, _ = need
    scope = f"{info.name}" + (f" for key {key!r}" if key else "")
    above = [r for r in rows if r.hold_seconds is not None and r.hold_seconds < 0
             and r.held_until is not None and r.held_until >= now]
    rows = [r for r in rows if r.kind == kind and r.slot < slots and not (r.hold_seconds or 0) < 0]
    if above:
        return (f"held by the lowered limit of {scope}: {len(above)} job(s) started under the earlier limit still "
                f"run; none starts until they have finished")
    if len(rows) < slots:
        return (f"its limit's permits for {scope} are not created yet: the worker creates them within a "
                f"minute (or save the job type in the admin)")
    held = [r for r in rows if r.held_until is not None and r.held_until >= now]
    if len(held) < slots:
        return None
    if kind == CONCURRENCY:
        return f"held by the concurrency limit of {scope}: {len(held)} of {slots} running"
    soonest = min(r.held_until for r in held if r.held_until is not None)
    return (f"held by the rate limit of {scope} ({info.rate_limit}): {len(held)} of {slots} starts in the "
            f"last period; the next may start at {soonest:%H:%M:%S} UTC")




def usage(row: JobType, top: int = 20) -> list[tuple[str, int, int]]:
    """(key, permits held now, slots) of a type's busiest ``top`` scopes, for the admin's type page."""
    from ..models import LimitPermit

    need = wanted(row.concurrency_limit, row.rate_limit)
    if need is None:
        return []
    kind, slots, _ = need
    now = timezone.now()
    held: dict[str, int] = {}
    for key in (LimitPermit.objects.using(row._state.db or "default")
                .filter(job_type_id=row.pk, kind=kind, slot__lt=slots, held_until__gte=now)
                .values_list("key", flat=True)):
        held[key] = held.get(key, 0) + 1
    return [(k, n, slots) for k, n in sorted(held.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
