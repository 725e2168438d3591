"""Who serves what: live workers, which queues and types they serve, orphaned jobs -- the facts
:mod:`.diagnose` (the one answer to "why is this job not running") and the admin's lists build on.

Each mirrors the claim
(``dialects/base.py`` ``reclaim_candidates``): a worker is live when it has not stopped and its
heartbeat is younger than ``WORKER_DEAD_AFTER_SECONDS``; it serves a queue / type when its row lists
it (``Worker.queues`` / ``Worker.types``, empty meaning all); a Processing job is taken over by the
next claim when its lease expired or its worker is stopped or stale -- but only by a live worker that
serves its queue and type. The worker table holds one row per worker process (small): it is read
whole and matched in Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Count, Min, Q, QuerySet, Subquery
from django.db.models.expressions import Col

from ..conf import get_settings
from ..dialects import get_dialect
from ..dialects.base import CLAIM_INDEX, STATUS_INDEX
from ..dialects.predicates import claim_index_rows, index_predicate
from ..states import CLAIMABLE, Status, sql_list

if TYPE_CHECKING:
    from ..models import Job, Worker


def dead_after() -> timedelta:
    return timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS)


def live_q(now: datetime) -> Q:
    """Workers not stopped whose heartbeat is recent: the claim's notion of alive."""
    return Q(stopped_at__isnull=True, last_heartbeat__gte=now - dead_after())


def dead_q(now: datetime) -> Q:
    """Stopped, or heartbeat stale: the claim takes their jobs over."""
    return Q(stopped_at__isnull=False) | Q(last_heartbeat__lt=now - dead_after())


def serves(worker: Worker, queue: str, type_name: str) -> bool:
    """Whether ``worker`` claims jobs of this queue and type (an empty list means all)."""
    queues, types = worker.queues or [], worker.types or []
    return (not queues or queue in queues) and (not types or type_name in types)


def live_workers(now: datetime, using: str | None = None) -> list[Worker]:
    from ..models import Worker

    return list(Worker.objects.using(using).filter(live_q(now)).only("name", "queues", "types"))


def orphaned_q(now: datetime, using: str = "default") -> Q:
    """Processing jobs the claim would take over: lease expired, or held by a stopped / stale worker.

    The status test is the partial Processing index's own literal predicate (SQL Server matches a
    filtered index only on a literal), so this reads that index's few rows, never the job table.
    """
    from ..models import Worker

    processing = index_predicate(using, "status", f"= {int(Status.PROCESSING)}")
    dead_names = Worker.objects.using(using).filter(dead_q(now)).values("name")
    return processing & (Q(lease_expires_at__lt=now) | Q(worker__in=dead_names))


@dataclass
class Holder:
    """The worker named on a Processing job, as the claim sees it."""

    state: str  # "alive", "stopped", "stale", "missing"
    worker: Worker | None


def holder_of(job: Job, now: datetime) -> Holder:
    from ..models import Worker

    worker = Worker.objects.using(job._state.db).filter(name=job.worker).first() if job.worker else None
    if worker is None:
        return Holder("missing", None)
    if worker.stopped_at is not None:
        return Holder("stopped", worker)
    if worker.last_heartbeat < now - dead_after():
        return Holder("stale", worker)
    return Holder("alive", worker)


def is_orphan(job: Job, now: datetime, holder: Holder | None = None) -> bool:
    """The claim would take this Processing job over (see :func:`orphaned_q`)."""
    if job.status_id != Status.PROCESSING:
        return False
    if job.lease_expires_at is not None and job.lease_expires_at < now:
        return True
    holder = holder or holder_of(job, now)
    return holder.state in ("stopped", "stale")


def orphans(job_model: type[Job], now: datetime) -> QuerySet:
    return job_model.objects.filter(orphaned_q(now, job_model.objects.db))


# ----- counts by status (the dashboard, the job types' list, the metrics) ------------------------------
#: The (status, type, queue) index's columns, in its order (``Job.Meta.indexes``: sqlqueue_job_status_type).
STATUS_INDEX_KEYS = ("status_id", "job_type_id", "queue")


def status_counts(qs: QuerySet, *keys: str) -> list[tuple[Any, ...]]:
    """``(key..., jobs)`` rows of ``qs`` (the job table) counted by ``keys``, a leading part of the
    (status, type, queue) index, in that order: read index-only, grouped as the rows stream.

    Both the GROUP BY and an ORDER BY list the keys in the index's order. Without the ORDER BY a
    planner may hash every row instead: PostgreSQL's does under Babelfish's case-insensitive
    collation of the queue column (0.9 s for the whole table at 1M jobs, where the streamed groups
    took 0.26 s, timed by the client), and before version 17 it never reorders GROUP BY keys itself.
    The index gives the order for free, so the ORDER BY costs no sort on any vendor. SQLite is told the
    index: with no statistics it counted the job types' list through the type foreign key's index
    instead, each job's table row read and the groups sorted.
    """
    if not keys or keys != STATUS_INDEX_KEYS[:len(keys)]:
        raise ValueError(f"the keys must lead the (status, type, queue) index in its order, not {keys}")
    return rows_through(qs.order_by(*keys).values(*keys).annotate(n=Count("*")).values_list(*keys, "n"),
                        STATUS_INDEX)


# ----- the backlog's oldest due job (the admin's dashboard and the metrics) ----------------------------
#: How many distinct queue / step values a filter lists at most (each costs one index seek).
MAX_DISTINCT_VALUES = 50


def distinct_values(queryset: QuerySet, field: str, limit: int = MAX_DISTINCT_VALUES,
                    index: str | None = None) -> list[Any]:
    """The distinct values of ``field``, smallest first, by a loose index scan (through ``index`` where
    the dialect pins indexes, :func:`rows_through`).

    ``SELECT DISTINCT`` reads every row; this asks for "the smallest value greater than the last one"
    once per distinct value, which an index on ``field`` answers with one seek each. Portable: plain
    ORM queries, so it runs the same on SQL Server, PostgreSQL and SQLite.
    """
    values: list[Any] = []
    base = queryset.order_by(field).values_list(field)
    last: Any = None
    for _i in range(limit):
        query = base if last is None else base.filter(**{f"{field}__gt": last})
        rows = rows_through(query[:1], index)
        if not rows:
            break
        values.append(rows[0][0])
        last = rows[0][0]
    return values


def rows_through(qs: QuerySet, index: str | None) -> list[tuple[Any, ...]]:
    """The rows of ``qs`` (a ``values_list`` of the job table) read through ``index`` where the dialect
    pins indexes (SQLite's ``INDEXED BY``), else (or with no ``index``) as the planner chooses.

    On a SQLite database with no statistics (a new user's: SQLite never gathers them by itself) the
    planner answers a read of the claim index's rows by the (status, type, queue) index's range of every
    claimable job, sorted: about 0.5 s a read at 1M jobs with 150,000 due, where the claim index is one
    seek. The ORM names no index, so the statement it compiles gets the hint (:func:`_pinned`).
    """
    pinned = _pinned(qs, index)
    if pinned is None:
        return [tuple(row) for row in qs]
    compiler, sql, params = pinned
    with connections[qs.db].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    converters = compiler.get_converters([column for column, _, _ in compiler.select])
    return [tuple(row) for row in (compiler.apply_converters(rows, converters) if converters else rows)]


def count_through(qs: QuerySet, index: str | None, cap: int | None = None) -> int:
    """How many rows ``qs`` (of the job table) holds, at most ``cap`` + 1 when capped, counted by the
    database through ``index`` where the dialect pins indexes (see :func:`rows_through`)."""
    qs = qs.order_by()
    limited = qs.values_list("pk")[: cap + 1] if cap is not None else qs.values_list("pk")
    pinned = _pinned(limited, index)
    if pinned is None:
        return qs[: cap + 1].count() if cap is not None else qs.count()
    _compiler, sql, params = pinned
    with connections[qs.db].cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM ({sql}) pinned", params)
        return int(cursor.fetchone()[0])


def _pinned(qs: QuerySet, index: str | None) -> tuple[Any, str, Any] | None:
    """``(compiler, sql, params)`` of ``qs`` with the dialect's hint for ``index`` after the job table,
    or None where the dialect pins no index (PostgreSQL and SQL Server match a filtered index by cost)
    or the query can match no row (``pk__in=[]``: the ORM answers it without a statement).
    The hint goes after the first ``FROM`` of the job table, which must be the statement's own (no
    subquery of the job table in its select list; one in its WHERE, after that FROM, is fine)."""
    connection = connections[qs.db]
    hint = get_dialect(connection).index_hint(index) if index else ""
    if not hint:
        return None
    compiler = qs.query.get_compiler(qs.db)
    try:
        sql, params = compiler.as_sql()
    except EmptyResultSet:
        return None
    table = connection.ops.quote_name(qs.model._meta.db_table)
    head, found, tail = sql.partition(f" FROM {table} ")
    return (compiler, f"{head} FROM {table}{hint} {tail}", params) if found else None


#: Distinct priorities among claimable jobs that :func:`claim_priorities` lists at most.
MAX_PRIORITIES = 100


def claim_priorities(jobs: QuerySet, limit: int = MAX_PRIORITIES) -> list[int]:
    """The distinct priorities of the claim index's rows, highest first as that index orders them: one
    seek each (a loose index scan). The oldest due job and each queue's are both found per priority,
    and a page that shows both lists them once (:func:`oldest_due`, :func:`oldest_due_by_queue`)."""
    return distinct_values(jobs.filter(claim_index_rows(jobs.db)), "priority", limit=limit, index=CLAIM_INDEX)


def oldest_due(job_model: type[Job], now: datetime, priorities: list[int] | None = None) -> datetime | None:
    """The scheduled time of the oldest due Pending job, in a few index seeks however long the backlog.

    ``MIN(scheduled_for) WHERE status = Pending`` reads every Pending row. The partial claim index is
    ordered by (-priority, scheduled_for): list its few distinct priorities (loose index scan), then
    take the first due Pending row of each priority, which is where that index starts. Jobs of limited
    types are not in that index; they are few (they wait for a permit, in sqlqueue_job_limited, which
    holds their due time) and are read with one MIN. ``priorities``: :func:`claim_priorities`, when the
    caller has listed them.
    """
    # The index's own predicate as literals: a parameter never matches a partial index on SQLite or a
    # filtered one on SQL Server, and without ``limited`` PostgreSQL cannot use it either (a walk of
    # the (status, type, queue) index and every claimable row per priority: 0.3 s each at 100,000 due).
    using = job_model.objects.db
    unlimited = job_model.objects.filter(claim_index_rows(using))
    oldest = _oldest_limited_due(job_model)
    if priorities is None:
        priorities = claim_priorities(job_model.objects.all())
    for priority in priorities:
        rows = rows_through(unlimited.filter(status_id=Status.PENDING, priority=priority, scheduled_for__lte=now)
                            .order_by("scheduled_for").values_list("scheduled_for")[:1], CLAIM_INDEX)
        if rows and (oldest is None or rows[0][0] < oldest):
            oldest = rows[0][0]
    return oldest


def _oldest_limited_due(job_model: type[Job]) -> datetime | None:
    """The due time of the oldest due Pending job of a limited type (the database's clock)."""
    connection = connections[job_model.objects.db]
    with connection.cursor() as cursor:
        cursor.execute(get_dialect(connection).oldest_limited_due_sql(), [])
        value = cursor.fetchone()[0]
    return None if value is None else _as_scheduled_for(job_model, connection, value)


def _oldest_limited_due_by_queue(jobs: QuerySet, now: datetime) -> list[tuple[str, datetime]]:
    """(queue, due time of its oldest due Pending/Error job of a limited type), from sqlqueue_job_limited."""
    connection = connections[jobs.db]
    with connection.cursor() as cursor:
        cursor.execute(get_dialect(connection).oldest_limited_due_sql(by_queue=True), [now])
        rows = cursor.fetchall()
    return [(queue, _as_scheduled_for(jobs.model, connection, value)) for queue, value in rows]


def _as_scheduled_for(job_model: type[Job], connection: Any, value: Any) -> datetime:
    """A raw ``scheduled_for`` value converted as the ORM converts the column (SQLite's text, SQL
    Server's naive UTC)."""
    column = Col(job_model._meta.db_table, job_model._meta.get_field("scheduled_for"))
    for convert in connection.ops.get_db_converters(column):
        value = convert(value, column, connection)
    return value


# ----- per-queue latency (the dashboard, the metrics, the throughput page) ------------------------------
#: Claim-index rows :func:`oldest_due_by_queue` reads over all priorities before it counts what is left
#: instead (each priority's walk gets its share, one step at least).
QUEUE_WALK_ROWS = 2_000
#: ... in steps of this many rows (one statement each).
QUEUE_WALK_STEP = 250
#: More distinct priorities than this among claimable jobs: the walk is not tried.
QUEUE_WALK_PRIORITIES = 20


def oldest_due_by_queue(jobs: QuerySet, now: datetime, queues: Iterable[str] | None = None,
                        priorities: list[int] | None = None) -> dict[str, datetime]:
    """Each queue's oldest due Pending/Error job's scheduled time, for the queues that have one.

    ``queues``: the queues that hold claimable jobs (the caller's status counts know them); without them
    one ``GROUP BY`` over the claimable rows (every due row's table row read) answers.

    With them, the claim index is walked per priority, oldest due first, a few hundred rows a step: the
    first row of a queue is its oldest due job of that priority. A priority's walk stops when it ends,
    when no queue it has not shown could still be older there than what is known of it, or when it has
    read its share of :data:`QUEUE_WALK_ROWS`; a queue is settled when each priority either showed it,
    ended, or stopped at or past the oldest time found for it. A backlog of 150,000 due jobs in five
    queues is a few rows' read (the GROUP BY read all 150,000: 0.16 s at 1M jobs). Only the queues left
    unsettled (say, one whose jobs are all scheduled ahead, or a rare queue behind a large one) are
    counted by the GROUP BY, over their own rows, and limited types' jobs (not in the claim index) by one
    ``GROUP BY`` over ``sqlqueue_job_limited``'s rows. ``priorities``: :func:`claim_priorities`, when the
    caller has listed them.

    A step continues after the last row read as the database holds it (a subquery by its id), not as
    Python read it back: SQLite keeps a time its own clock wrote as ``...:58.684``, which sorts before
    the ``...:58.684000`` Django would send, and the rows tied with it would be passed over.
    """
    claimable = jobs.filter(index_predicate(jobs.db, "status", f"IN ({sql_list(CLAIMABLE)})"))

    def grouped(qs: QuerySet) -> dict[str, datetime]:
        return dict(qs.filter(scheduled_for__lte=now).order_by().values("queue")
                    .annotate(oldest=Min("scheduled_for")).values_list("queue", "oldest"))

    if queues is None:
        return grouped(claimable)
    wanted = set(queues)
    if not wanted:
        return {}
    unlimited = jobs.filter(claim_index_rows(jobs.db))
    if priorities is None:
        priorities = claim_priorities(jobs, limit=QUEUE_WALK_PRIORITIES + 1)
    if len(priorities) > QUEUE_WALK_PRIORITIES:
        return grouped(claimable)
    share = max(QUEUE_WALK_STEP, QUEUE_WALK_ROWS // max(1, len(priorities)))
    oldest: dict[str, datetime] = {}
    # per priority: the queues it showed, and None when it ended or the time it stopped at
    walks: list[tuple[set[str], datetime | None]] = []
    for priority in priorities:
        seen: set[str] = set()
        due = unlimited.filter(priority=priority, scheduled_for__lte=now).order_by("scheduled_for", "id")
        step, read = due, 0
        while True:
            rows = rows_through(step.values_list("queue", "scheduled_for", "id")[:QUEUE_WALK_STEP], CLAIM_INDEX)
            for queue, at, _pk in rows:
                if queue not in seen:
                    seen.add(queue)
                    if queue not in oldest or at < oldest[queue]:
                        oldest[queue] = at
            read += len(rows)
            if len(rows) < QUEUE_WALK_STEP:
                walks.append((seen, None))
                break
            at, pk = rows[-1][1], rows[-1][2]
            if read >= share or all(q in seen or (q in oldest and oldest[q] <= at) for q in wanted):
                walks.append((seen, at))
                break
            last = Subquery(jobs.model._base_manager.using(jobs.db).filter(pk=pk).values("scheduled_for")[:1])
            step = due.filter(Q(scheduled_for__gte=last),  # a range to seek; the OR only splits its ties
                              Q(scheduled_for__gt=last) | Q(scheduled_for=last, id__gt=pk))
    wanted |= set(oldest)
    unsettled = {q for q in wanted
                 if any(q not in seen and stop is not None and (q not in oldest or oldest[q] > stop)
                        for seen, stop in walks)}
    rest = _oldest_limited_due_by_queue(jobs, now)
    if unsettled:
        rest = [*rest, *grouped(claimable.filter(queue__in=sorted(unsettled))).items()]
    for queue, at in rest:
        if queue not in oldest or at < oldest[queue]:
            oldest[queue] = at
    return oldest


#: Finished jobs read (newest first) for the per-queue wait percentiles.
WAIT_SAMPLE = 5_000


def waits_by_queue(jobs: QuerySet, since: datetime, now: datetime, limit: int = WAIT_SAMPLE
                   ) -> dict[str, list[float]]:
    """Queue wait (``started_at - scheduled_for``, seconds: from due to the claim of the attempt that
    finished) of the jobs finished since ``since``, by queue; at most ``limit`` jobs, the
    newest (a backward range of the finished_at index, stopped at the limit)."""
    rows = (jobs.filter(finished_at__gte=since, finished_at__lte=now, started_at__isnull=False)
            .order_by("-finished_at").values_list("queue", "scheduled_for", "started_at")[:limit])
    out: dict[str, list[float]] = {}
    for queue, due, started in rows:
        if due is not None and started is not None:
            out.setdefault(queue, []).append(max(0.0, (started - due).total_seconds()))
    return out


def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]
