"""Every statement of a maintenance pass seeks an index, whatever the backlog (worker/maintenance.py).

The statements are the real ones, captured while the passes run over a table holding a backlog, then
judged per vendor: PostgreSQL's EXPLAIN and SQLite's EXPLAIN QUERY PLAN must not read the whole job
table; on SQL Server (the tds stage, Babelfish: no plan to read) the statements that must match a
filtered index carry that index's predicate as literals, never parameters, which is what lets SQL
Server match it (and what ``permits.heal`` used to miss).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue.limits import heal
from django_sqlqueue.models import Job, JobType, ThroughputCursor
from django_sqlqueue.ops.rollup import CURSOR, HOUR, Rollup, floor_hour
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.queue.housekeeping import retention_batch
from django_sqlqueue.schedules import run_due
from django_sqlqueue.states import Status
from django_sqlqueue.worker.maintenance import take_lease

pytestmark = pytest.mark.django_db

JOB = Job._meta.db_table
#: Partial indexes whose whole walk is the point (their rows are the few the pass is about).
SMALL_PARTIAL = ("sqlqueue_job_limited", "sqlqueue_job_processing")


#: The backlog's finished and waiting jobs. Over TDS no plan is read (the statements' literals are what
#: is judged there), so a tenth of it does: Babelfish took 30-90 s to fill the whole one, per test.
FINISHED, WAITING = (600, 150) if connection.vendor == "microsoft" else (6000, 1500)


def _fill(analyze: bool = True) -> int:
    """A backlog: :data:`FINISHED` finished jobs, :data:`WAITING` waiting ones; returns the id of a
    second, limited-to-be type (``analyze``: with planner statistics, as a database a while in use has
    them)."""
    JobType.objects.get_or_create(name="Noop")
    export, _ = JobType.objects.get_or_create(name="Export")
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}) for i in range(FINISHED + WAITING))
    Job.objects.enqueue_many(JobSpec("Export", {"i": i}) for i in range(20))
    done = list(Job.objects.order_by("id").values_list("pk", flat=True)[:FINISHED])
    for start in range(0, len(done), 1000):
        Job.objects.filter(pk__in=done[start:start + 1000]).update(
            status_id=Status.COMPLETED, finished_at=timezone.now() - timedelta(days=3))
    with connection.cursor() as cursor:
        if connection.vendor != "microsoft" and analyze:
            cursor.execute("ANALYZE")
    return export.pk


def _statements(fn: Callable[[], object]) -> list[tuple[str, object]]:
    """The statements ``fn`` sends that touch the job table, as sent: the SQL with its placeholders,
    and its parameters (a literal is told from a parameter by the text, the plan is asked with both)."""
    seen: list[tuple[str, object]] = []

    def record(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()
    return [(sql, params) for sql, params in seen if _touches_job(sql)]


def _touches_job(sql: str) -> bool:
    return re.search(rf"\W{JOB}\W", sql) is not None


def _plan(sql: str, params: object) -> list[str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN {sql}", params)
            return [r[0] for r in cursor.fetchall()]
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return [r[-1] for r in cursor.fetchall()]


def _reads_whole_table(lines: list[str]) -> bool:
    if connection.vendor == "postgresql":
        return any(re.search(rf"Seq Scan on {JOB}\s", line) for line in lines)
    scans = [line for line in lines if re.match(rf"SCAN {JOB}\b", line)]
    return any(not any(index in line for index in SMALL_PARTIAL) for line in scans)


def _judge(statements: list[tuple[str, object]], literal: list[str] = ()) -> None:
    assert statements
    for sql, params in statements:
        if connection.vendor == "microsoft":
            continue  # no plan over TDS (Babelfish); the literals are checked below
        lines = _plan(sql, params)
        assert not _reads_whole_table(lines), (sql, params, lines)
    for pattern in literal:  # the filtered/partial index's own predicate, in the statement's own text
        assert any(re.search(pattern, sql) for sql, _ in statements), (pattern, statements)


def _q(column: str) -> str:
    return re.escape(connection.ops.quote_name(column))


def test_heal_with_no_limited_type_seeks_the_limited_index_with_its_literal_predicate() -> None:
    _fill()
    statements = _statements(lambda: heal("default"))
    # The flag's UPDATE, and the look for idle key permits (whose job subquery runs per permit: none here).
    assert any("UPDATE" in sql.upper() and '"limited"' in sql.replace("[", '"').replace("]", '"')
               for sql, _ in statements), statements
    true = "1" if connection.vendor == "microsoft" else "(TRUE|1)"
    _judge(statements, [rf"{_q('status_id')} IN \(1, 2, 3\)", rf"{_q('limited')} = {true}"])


def test_heal_of_types_saved_lately_seeks_by_type() -> None:
    export = _fill()
    JobType.objects.filter(pk=export).update(concurrency_limit=2)
    jobtypes.clear_cache()
    statements = _statements(lambda: heal("default", [export], since=timezone.now() - timedelta(minutes=5)))
    assert Job.objects.filter(job_type_id=export, limited=True).count() == 20
    _judge(statements)


def test_reap_seeks_the_processing_index() -> None:
    _fill()
    _judge(_statements(lambda: Job.objects.reap(using="default")), [rf"{_q('status_id')} = 2\b"])


def test_a_retention_batch_reads_an_index_range() -> None:
    _fill()
    cutoff = timezone.now() - timedelta(days=1)
    statements = _statements(lambda: retention_batch(Status.COMPLETED, cutoff, None, 500, "default"))
    assert Job.objects.filter(status_id=Status.COMPLETED).count() == FINISHED - 500
    _judge(statements[:1], [rf"{_q('status_id')} = 5\b"])  # the read; the deletes are by primary key


def test_the_lease_and_the_schedule_look_touch_no_job_row() -> None:
    _fill()
    with CaptureQueriesContext(connection) as seen:
        take_lease("default", "me", 30)
        run_due("default")
    assert seen.captured_queries and not any(_touches_job(q["sql"]) for q in seen.captured_queries)
    [(lease, params)] = [s for s in _all(lambda: take_lease("default", "me", 30)) if "maintenancelease" in s[0]]
    if connection.vendor == "sqlite":  # (PostgreSQL rightly reads a one-row table whole)
        plan = _plan(lease, params)
        assert any(line.startswith("SEARCH") for line in plan), plan


def _all(fn: Callable[[], object]) -> list[tuple[str, object]]:
    seen: list[tuple[str, object]] = []

    def record(execute, sql, params, many, context):  # noqa: ANN001, ANN202
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()
    return seen


@pytest.mark.parametrize("analyze", [True, False], ids=["statistics", "fresh"])
def test_the_throughput_rollup_reads_an_hours_range_of_the_time_indexes(analyze) -> None:
    """Each series of an hour is a range of the enqueue-time or finish-time index, never all the jobs of
    a status (5,500 Completed here, 550 over TDS, finished 3 days before the hours rolled up), with or without the
    planner's statistics (a new user's database has none)."""
    _fill(analyze)
    ThroughputCursor.objects.create(name=CURSOR, counted_until=floor_hour(timezone.now()) - 3 * HOUR)
    statements = _statements(lambda: Rollup("default").run(timezone.now()))
    reads = [(sql, params) for sql, params in statements if "GROUP BY" in sql]
    assert len(reads) == 3
    _judge(reads)
    if connection.vendor != "microsoft":
        used = [" ".join(_plan(sql, params)) for sql, params in reads]
        assert "sqlqueue_job_enqueued" in used[0], used[0]
        assert all("sqlqueue_job_finished" in plan for plan in used[1:]), used[1:]
