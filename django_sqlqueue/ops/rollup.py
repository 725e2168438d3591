"""Throughput history that outlives the jobs: hourly counts per job type in :class:`ThroughputHour`.

Retention (``SQLQUEUE["RETENTION"]``) deletes finished jobs after days; the throughput page's 30-day
view still needs how many were enqueued, finished and failed each hour. So the fleet's maintenance
holder (worker/maintenance.py) rolls every hour up once it is over and :data:`GRACE` has passed (a
recorder's late flush, clock skew between hosts), with one GROUP BY per series over the job table's
enqueue-time and finish-time indexes, and retention deletes only jobs finished before the hour the
rollup has reached (:attr:`Rollup.until`): a count is written before its jobs can go.

A rolled-up hour is a snapshot: a job that failed in it and succeeded on a later retry counts as failed
there and as finished in the later hour, as the live series counted it at the time.

Writing an hour replaces its rows in one transaction, so two holders for a moment (one paused past its
lease) write the same numbers; if both insert at once, the unique key refuses one, whose pass is then
retried. A new holder starts from the newest hour written: hours after it had no jobs (or they would
have rows), and re-counting them is an index range over nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connections, transaction
from django.db.models import Max, Sum

from ..dialects import get_dialect
from ..states import Status

HOUR = timedelta(hours=1)
#: An hour is rolled up this long after it ends.
GRACE = timedelta(minutes=5)
#: The hours one pass rolls up at most (a first pass on an old database catches up a day at a time).
MAX_HOURS_PER_PASS = 24
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
    """The maintenance holder's rollup: :meth:`run` writes the hours that are over; :attr:`until` is
    where the written hours end (None until the first pass of this holder), which retention keeps to."""

    using: str
    until: datetime | None = None

    def reset(self) -> None:
        """A new holder: start again from what the table says."""
        self.until = None

    def run(self, now: datetime) -> bool:
        """Write up to :data:`MAX_HOURS_PER_PASS` hours; True when more are over and wait (call again soon)."""
        model = apps.get_model("django_sqlqueue", "ThroughputHour")
        rows = model.objects.using(self.using)
        end = floor_hour(now - GRACE)
        if self.until is None:
            newest = rows.aggregate(m=Max("hour"))["m"]
            self.until = newest + HOUR if newest else end - timedelta(days=KEEP_DAYS)
        start = self.until
        stop = min(end, start + MAX_HOURS_PER_PASS * HOUR)
        if stop > start:
            counts = hourly_counts(self.using, start, stop)
            with transaction.atomic(using=self.using):
                rows.filter(hour__gte=start, hour__lt=stop).delete()
                model.objects.using(self.using).bulk_create(
                    [model(hour=hour, job_type_id=type_id, enqueued=n[0], finished=n[1], failed=n[2])
                     for (hour, type_id), n in sorted(counts.items())], batch_size=500)
                rows.filter(hour__lt=stop - timedelta(days=KEEP_DAYS)).delete()  # an index range, mostly none
            self.until = stop
        return stop < end


def history(using: str, start: datetime, stop: datetime, unit: timedelta) -> tuple[dict[str, dict[datetime, int]], datetime]:
    """The rolled-up counts in ``[start, stop)`` per ``unit`` bucket ({"enqueued"|"finished"|"failed":
    {bucket start: n}}), and the hour where they end: the caller counts the rest from the job table."""
    rows = apps.get_model("django_sqlqueue", "ThroughputHour").objects.using(using)
    newest = rows.aggregate(m=Max("hour"))["m"]
    until = max(start, min(stop, newest + HOUR)) if newest else start
    out: dict[str, dict[datetime, int]] = {"enqueued": defaultdict(int), "finished": defaultdict(int),
                                           "failed": defaultdict(int)}
    if until > start:
        per_hour = (rows.filter(hour__gte=start, hour__lt=until).order_by().values("hour")
                    .annotate(e=Sum("enqueued"), f=Sum("finished"), x=Sum("failed"))
                    .values_list("hour", "e", "f", "x"))
        for hour, enqueued, finished, failed in per_hour:
            bucket = start + ((hour - start) // unit) * unit
            out["enqueued"][bucket] += enqueued
            out["finished"][bucket] += finished
            out["failed"][bucket] += failed
    return out, until
