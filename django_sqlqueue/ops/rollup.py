"""Throughput history that outlives the jobs: hourly counts per job type in :class:`ThroughputHour`.

Retention (``SQLQUEUE["RETENTION"]``) deletes finished jobs after days (or minutes); the throughput
page's 30-day view still needs how many were enqueued, finished and failed each hour. So the fleet's
maintenance holder (worker/maintenance.py) counts, about once a minute, the jobs enqueued and finished
since :class:`ThroughputCursor` up to :data:`GRACE` ago by the database's clock (a recorder's late
flush, a slow commit), with one GROUP BY per series over that range of the job table's enqueue-time and finish-time
indexes, and adds the counts to their hours' rows. Retention deletes only jobs finished before the
cursor (:attr:`Rollup.until`): a count is written before its jobs can go.

Exactly once: the counts are added in the transaction that moves the cursor, with a conditional UPDATE
("still where I read it"). A second holder for a moment (one paused past its lease) waits on the
cursor row, finds it moved, and rolls back: no minute is counted twice, none skipped.

A counted minute is a snapshot: a job that failed in it and succeeded on a later retry counts as failed
there and as finished later, as the live series counted it at the time. A job written with a time
older than the cursor (a transaction open longer than :data:`GRACE`) is not counted.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import F, Max, Min, QuerySet, Sum

from ..dialects import get_dialect
from ..states import Status

HOUR = timedelta(hours=1)
#: A minute is counted this long after it ends (a job's finish written late still counts).
GRACE = timedelta(minutes=5)
#: The cursor row's name.
CURSOR = "throughput"
#: A pass's span of time: at least, at most (see :class:`Rollup`).
MIN_SPAN = timedelta(minutes=5)
MAX_SPAN = timedelta(hours=24)
#: A pass quicker than this doubles the span while more waits; one slower halves it.
QUICK_SECONDS = 0.5
SLOW_SECONDS = 2.0
#: How far back a first pass starts, and how long the rows are kept: the 30-day view plus a margin.
KEEP_DAYS = 35
#: What "finished" and "failed" count (the throughput page's own groups).
DONE = (int(Status.COMPLETED), int(Status.PARTIALLY_COMPLETED))
FAILED = (int(Status.FAILED), int(Status.ERROR))
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_hour(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


#: The index each time column leads (models.py): its range is what a count reads.
TIME_INDEX = {"enqueued_at": "sqlqueue_job_enqueued", "finished_at": "sqlqueue_job_finished"}


def bucket_counts(using: str, field: str, start: datetime, stop: datetime, unit: timedelta,
                  statuses: Iterable[int] = (), by_type: bool = False) -> list[tuple[Any, ...]]:
    """``(bucket start, [job type id,] jobs)`` for the jobs whose ``field`` (``enqueued_at`` or
    ``finished_at``) lies in ``[start, stop)`` and, given ``statuses``, whose status is one of them, per
    ``unit``-long bucket since 1970 (UTC): one GROUP BY over a range of the time column's index.

    The statuses are literals of the statement (code constants). The index is pinned where the dialect
    pins indexes (SQLite: without ANALYZE statistics its planner takes the status index instead and
    reads every job of the status, 1.5 s at 267,000 Completed jobs).
    """
    connection = connections[using]
    dialect = get_dialect(connection)
    meta = apps.get_model("django_sqlqueue", "Job")._meta
    qn = connection.ops.quote_name

    def col(name: str) -> str:
        return f"j.{qn(meta.get_field(name).column)}"

    keys = [dialect.epoch_bucket_sql(col(field), int(unit.total_seconds()))]
    if by_type:
        keys.append(col("job_type"))
    where = [f"{col(field)} >= %s", f"{col(field)} < %s"]
    literal = sorted({int(s) for s in statuses})
    if literal:
        where.append(f"{col('status')} IN ({', '.join(map(str, literal))})")
    sql = (f"SELECT {', '.join(keys)}, COUNT(*) FROM {qn(meta.db_table)} j{dialect.index_hint(TIME_INDEX[field])} "
           f"WHERE {' AND '.join(where)} GROUP BY {', '.join(keys)}")
    params = [connection.ops.adapt_datetimefield_value(start), connection.ops.adapt_datetimefield_value(stop)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [(EPOCH + int(u) * unit, *rest) for u, *rest in rows]


def hourly_counts(using: str, start: datetime, stop: datetime) -> dict[tuple[datetime, int], list[int]]:
    """{(hour, job type id): [enqueued, finished, failed]} for the hours in ``[start, stop)``."""
    counts: dict[tuple[datetime, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    for i, field, statuses in ((0, "enqueued_at", ()), (1, "finished_at", DONE), (2, "finished_at", FAILED)):
        for hour, type_id, n in bucket_counts(using, field, start, stop, HOUR, statuses, by_type=True):
            counts[(hour, int(type_id))][i] += n
    return counts


@dataclass
class Rollup:
    """The maintenance holder's rollup: :meth:`run` counts what is :data:`GRACE` old; :attr:`until` is
    where the counts end (None until this holder's first pass), which retention keeps to.

    A pass counts at most :attr:`span` of time. It runs on the supervisor's database thread, between
    the heartbeats of its slots, so a pass must stay short however busy the hours it counts were: the
    span starts at an hour, doubles (up to a day) after a pass under :data:`QUICK_SECONDS` while more
    waits, halves (down to :data:`MIN_SPAN`) after one over :data:`SLOW_SECONDS` or one that failed
    (a statement timeout would otherwise fail the same range for ever).
    """

    using: str
    until: datetime | None = None
    span: timedelta = HOUR

    def reset(self) -> None:
        """A new holder: nothing is known until its first pass reads the cursor."""
        self.until = None

    def run(self, now: datetime) -> bool:
        """Count up to :attr:`span` of time; True when more waits (call again soon). ``now`` is the
        database's clock: the job times it compares with are stamped by the database."""
        cursors = apps.get_model("django_sqlqueue", "ThroughputCursor").objects.using(self.using)
        end = (now - GRACE).replace(second=0, microsecond=0)
        start = cursors.filter(name=CURSOR).values_list("counted_until", flat=True).first()
        if start is None:
            start = self._first_start(end)
            try:
                with transaction.atomic(using=self.using):
                    cursors.create(name=CURSOR, counted_until=start)
            except IntegrityError:  # another holder's first pass created it: count from its row
                start = cursors.get(name=CURSOR).counted_until
        stop = min(end, start + self.span)
        if stop > start:
            began = time.monotonic()
            try:
                counts = hourly_counts(self.using, start, stop)
            except DatabaseError:
                self.span = max(MIN_SPAN, self.span / 2)
                raise
            if not counts and stop < end:  # an empty stretch (a new database, a fleet stopped for days)
                stop = self._next_job_minute(stop, end)
            with transaction.atomic(using=self.using):
                if not cursors.filter(name=CURSOR, counted_until=start).update(counted_until=stop):
                    self.until = None  # another holder moved it meanwhile: its counts stand
                    return True
                _add(self.using, counts)
                if floor_hour(stop) > floor_hour(start):  # a new hour: the rows past keeping go
                    self._hours().filter(hour__lt=floor_hour(stop) - timedelta(days=KEEP_DAYS)).delete()
            took = time.monotonic() - began
            if took > SLOW_SECONDS:
                self.span = max(MIN_SPAN, self.span / 2)
            elif took < QUICK_SECONDS and stop < end:
                self.span = min(MAX_SPAN, self.span * 2)
            start = stop
        self.until = start
        return stop < end

    def _first_start(self, end: datetime) -> datetime:
        """Where a database's first pass starts: :data:`KEEP_DAYS` back, but not before its oldest job's
        enqueue or finish time (index endpoints: the empty days are not walked), nor before the hour after the newest
        counted one (a cursor row lost while counts stayed: nothing is counted twice)."""
        jobs = apps.get_model("django_sqlqueue", "Job").objects.using(self.using)
        firsts = [t for t in jobs.aggregate(e=Min("enqueued_at"), f=Min("finished_at")).values() if t is not None]
        start = end - timedelta(days=KEEP_DAYS)
        if firsts:
            start = max(start, min(firsts).replace(second=0, microsecond=0))
        newest = self._hours().aggregate(m=Max("hour"))["m"]
        if newest is not None:
            start = max(start, newest + HOUR)
        return min(start, end)

    def _next_job_minute(self, after: datetime, end: datetime) -> datetime:
        """The minute of the first job enqueued or finished at or after ``after`` (one seek of each
        time index), at most ``end``: no job time lies between, so the cursor jumps there in this pass
        instead of walking the empty hours a span at a time (35 days of them, one pass a second, were
        most of what a new database's idle fleet sent in its first minute)."""
        jobs = apps.get_model("django_sqlqueue", "Job").objects.using(self.using)
        nexts = [jobs.filter(**{f"{field}__gte": after}).aggregate(m=Min(field))["m"] for field in TIME_INDEX]
        found = [t.replace(second=0, microsecond=0) for t in nexts if t is not None]
        return max(after, min([end, *found]))  # a span halved to 7.5 min ends mid-minute: never back

    def _hours(self) -> QuerySet:
        return apps.get_model("django_sqlqueue", "ThroughputHour").objects.using(self.using)


def _add(using: str, counts: dict[tuple[datetime, int], list[int]]) -> None:
    """Add ``counts`` to their hours' rows (an UPDATE by the unique key, an INSERT for a new hour)."""
    model = apps.get_model("django_sqlqueue", "ThroughputHour")
    rows = model.objects.using(using)
    new = []
    for (hour, type_id), (enqueued, finished, failed) in sorted(counts.items()):
        if not rows.filter(hour=hour, job_type_id=type_id).update(
                enqueued=F("enqueued") + enqueued, finished=F("finished") + finished, failed=F("failed") + failed):
            new.append(model(hour=hour, job_type_id=type_id, enqueued=enqueued, finished=finished, failed=failed))
    rows.bulk_create(new, batch_size=300)  # 5 columns a row: within SQL Server's 2,100 parameters


def history(using: str, start: datetime, stop: datetime, unit: timedelta) -> tuple[dict[str, dict[datetime, int]], datetime]:
    """The rolled-up counts in ``[start, stop)`` (hour-aligned) per ``unit`` bucket ({"enqueued" |
    "finished" | "failed": {bucket start: n}}), and where they end (the cursor, or ``start``): the
    caller counts from there on in the job table."""
    cursor = (apps.get_model("django_sqlqueue", "ThroughputCursor").objects.using(using)
              .filter(name=CURSOR).values_list("counted_until", flat=True).first())
    until = max(start, min(stop, cursor)) if cursor else start
    out: dict[str, dict[datetime, int]] = {"enqueued": defaultdict(int), "finished": defaultdict(int),
                                           "failed": defaultdict(int)}
    if until > start:
        rows = apps.get_model("django_sqlqueue", "ThroughputHour").objects.using(using)
        per_hour = (rows.filter(hour__gte=start, hour__lt=until).order_by().values("hour")
                    .annotate(e=Sum("enqueued"), f=Sum("finished"), x=Sum("failed"))
                    .values_list("hour", "e", "f", "x"))
        for hour, enqueued, finished, failed in per_hour:
            bucket = start + ((hour - start) // unit) * unit
            out["enqueued"][bucket] += enqueued
            out["finished"][bucket] += finished
            out["failed"][bucket] += failed
    return out, until
