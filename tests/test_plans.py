"""The claim is an index walk over claimable rows, never a table scan (PostgreSQL, SQLite, SQL Server).

On Babelfish (the tds stage) there is no SQL Server plan to read: queue_explain must say so, clearly.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from django_sqlqueue.models import Job, JobType
from django_sqlqueue.ops.explain import explain_claim, picking_lines, postgresql_scans
from django_sqlqueue.queue import JobSpec

pytestmark = pytest.mark.django_db


def _fill() -> None:
    JobType.objects.get_or_create(name="Noop")
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, priority=i % 3) for i in range(5000))
    # many finished rows: a scan would have to pass over them
    done = list(Job.objects.values_list("pk", flat=True)[:4000])
    Job.objects.filter(pk__in=done).update(status_id=5)
    with connection.cursor() as cursor:
        if connection.vendor != "microsoft":
            cursor.execute("ANALYZE")
        elif not babelfish():  # Babelfish refuses UPDATE STATISTICS
            cursor.execute(f"UPDATE STATISTICS {connection.ops.quote_name(Job._meta.db_table)}")


def babelfish() -> bool:
    if connection.vendor != "microsoft":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(SERVERPROPERTY('Babelfish') AS nvarchar(10))")
        return cursor.fetchone()[0] is not None


def test_claim_plan_uses_the_claim_index() -> None:
    if babelfish():  # no plan to read: a few jobs show that it says so and claims none
        JobType.objects.get_or_create(name="Noop")
        Job.objects.enqueue("Noop")
        with pytest.raises(NotImplementedError, match="returned no plan"):
            explain_claim(limit=10)
        assert Job.objects.filter(status_id=1).count() == 1  # the rolled-back transaction claimed nothing
        return
    _fill()
    report = explain_claim(limit=10)
    assert report.uses_claim_index, report.plan
    assert not report.scans_job_table, report.plan


def test_queue_explain_command_prints_the_plan(capsys) -> None:
    if babelfish():
        from django.core.management.base import CommandError

        with pytest.raises(CommandError, match="returned no plan"):
            call_command("queue_explain", "--limit", "5")
        return
    _fill()
    call_command("queue_explain", "--limit", "5")
    out = capsys.readouterr().out
    assert "sqlqueue_job_claim" in out and out.strip().endswith("OK: the claim walks the claim index")


#: The plan PostgreSQL gave for a claim of 10 on a fresh database holding 32 jobs (issue 20 item 7),
#: abridged to its node lines: the pick walks the claim index; the UPDATE's join by id seq-scans the
#: tiny table. queue_explain failed it ("run ANALYZE", which does not help).
FRESH_PLAN = """Sort  (cost=93.85..93.86 rows=2 width=1454)
  Sort Key: claimed.priority DESC, claimed.scheduled_for, claimed.id
  CTE due
    ->  Limit  (cost=0.14..27.48 rows=1 width=30)
          ->  LockRows  (cost=0.14..27.48 rows=1 width=30)
                ->  Nested Loop Anti Join  (cost=0.14..27.47 rows=1 width=30)
                      Join Filter: (pt.id = j.type_id)
                      ->  Index Scan using sqlqueue_job_claim on django_sqlqueue_job j  (cost=0.14..16.34 rows=1 width=32)
                            Index Cond: (scheduled_for <= now())
                      ->  Seq Scan on django_sqlqueue_jobtype pt  (cost=0.00..10.70 rows=35 width=14)
                            Filter: paused
  CTE claimed
    ->  Update on django_sqlqueue_job j_2  (cost=0.11..27.18 rows=2 width=506)
          ->  Hash Join  (cost=0.11..27.18 rows=2 width=506)
                Hash Cond: (j_2.id = picked.id)
                ->  Seq Scan on django_sqlqueue_job j_2  (cost=0.00..10.50 rows=50 width=30)
                ->  Hash  (cost=0.09..0.09 rows=2 width=40)
                      ->  Subquery Scan on picked  (cost=0.06..0.09 rows=2 width=40)
                            ->  Limit  (cost=0.06..0.07 rows=2 width=18)
                                  ->  Sort  (cost=0.06..0.07 rows=2 width=18)
                                        ->  Append  (cost=0.00..0.05 rows=2 width=18)
                                              ->  CTE Scan on due  (cost=0.00..0.02 rows=1 width=18)
  CTE hist
    ->  Insert on django_sqlqueue_jobattempt  (cost=0.00..0.04 rows=0 width=0)
          ->  CTE Scan on claimed claimed_1  (cost=0.00..0.04 rows=2 width=496)
  ->  CTE Scan on claimed  (cost=0.00..0.04 rows=2 width=1454)"""


def test_only_the_part_that_picks_jobs_is_judged() -> None:
    lines = FRESH_PLAN.splitlines()
    assert not postgresql_scans(lines, "django_sqlqueue_job")  # the join's seq scan does not count
    picking = "\n".join(picking_lines(lines))
    assert "Index Scan using sqlqueue_job_claim" in picking and "Subquery Scan on picked" not in picking
    bad = [line.replace("Index Scan using sqlqueue_job_claim on", "Seq Scan on") for line in lines]
    assert postgresql_scans(bad, "django_sqlqueue_job")  # a pick that scans the table still fails


def test_a_pick_that_scans_the_job_table_is_still_caught() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("planner settings are PostgreSQL's")
    JobType.objects.get_or_create(name="Noop")
    Job.objects.enqueue_many([JobSpec("Noop", {"i": i}) for i in range(32)])
    with connection.cursor() as cursor:  # the test's transaction ends these with it
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
    report = explain_claim(limit=10)
    assert report.scans_job_table and not report.ok, report.plan


def test_a_claim_over_a_deep_backlog_is_priced_below_the_jit_threshold_once_the_types_are_synced() -> None:
    """Without statistics on the job type table (autovacuum never analyzes fewer than 50 rows) the
    planner priced this claim at ~800,000 and PostgreSQL JIT-compiled every claim: 1.1 s of a 6 ms claim
    at 100,000 due jobs. sync_job_types (migrate, every worker's start) analyzes the small tables."""
    if connection.vendor != "postgresql":
        pytest.skip("planner settings are PostgreSQL's")
    import json

    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.handlers import sync_job_types

    type_id = JobType.objects.get_or_create(name="Noop")[0].pk
    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (queue, type_id, status_id, step, priority, attempt_num, payload, error, "
            f"enqueued_at, scheduled_for, version, updated_at, worker) SELECT 'default', %s, 1, '', g %% 3, 0, "
            f"'{{}}'::jsonb, '', now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 ms', "
            f"1, now(), '' FROM generate_series(1, 30000) g", [type_id])
        cursor.execute(f"ANALYZE {table}")
    sync_job_types("default")
    with CaptureQueriesContext(connection) as captured:
        assert len(Job.objects.claim("plan/0", 10)) == 10
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('jit_above_cost')::float")
        threshold = cursor.fetchone()[0]
        claim_sql = next(q["sql"] for q in captured.captured_queries if "UPDATE" in q["sql"])
        cursor.execute("EXPLAIN (FORMAT JSON) " + claim_sql)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    assert plan[0]["Plan"]["Total Cost"] < threshold, plan[0]["Plan"]["Total Cost"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = %s",
                       [JobType._meta.db_table])
        assert cursor.fetchone() == (True,)
