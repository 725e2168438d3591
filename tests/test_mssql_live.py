"""The live SQL Server suite: the whole suite against a real SQL Server.

Runs whenever SQLQUEUE_MSSQL_HOST (and _PORT, _USER, _PASSWORD, _NAME) are set: every test file that
runs on SQLite and PostgreSQL runs in a child pytest with SQLQUEUE_TEST_DB=mssql (mssql-django with the
mssql-python driver): what the tds stage runs on Babelfish, plus the tests that need SQL Server's
locking (concurrent claimers, dedupe races, worker fleets), which Babelfish cannot honour. Skipped,
saying so, everywhere else. It has NOT been run on the machines this project is developed on: none
can host a SQL Server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .mssql_env import VARS, mssql_url

#: Everything but this test itself and the browser (its Chromium needs nothing from SQL Server that the
#: admin tests do not already check). The cases below it run in that child session.
LIVE_ARGS = ["tests", "--deselect", "tests/test_mssql_live.py::test_core_suite_on_a_live_sql_server",
             "--deselect", "tests/test_browser_admin.py"]


@pytest.mark.timeout(3600)
def test_core_suite_on_a_live_sql_server() -> None:
    if mssql_url() is None:
        pytest.skip(f"SQL Server live suite: set {', '.join(VARS)} to run it (no SQL Server here)")
    if os.environ.get("SQLQUEUE_TEST_DB") == "mssql":
        pytest.skip("already running on SQL Server: the files themselves are the live suite")
    env = {**os.environ, "SQLQUEUE_TEST_DB": "mssql"}
    env.pop("SQLQUEUE_DATABASE_URL", None)
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", *LIVE_ARGS], cwd=root, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]


# ----- what only a real SQL Server shows (issue 29): locks, plans, session settings ------------------------
# Each case runs in the live suite's child session (SQLQUEUE_TEST_DB=mssql) and reads the server's own
# views of the claim (sys.dm_tran_locks, SHOWPLAN_XML, sys.dm_exec_sessions, sys.tables): what Babelfish
# cannot show, since it drops every table hint. None has run here: no SQL Server can run on these machines.
def live() -> None:
    """Skip unless this session runs on a real SQL Server."""
    if os.environ.get("SQLQUEUE_TEST_DB") != "mssql":
        if mssql_url() is None:
            pytest.skip(f"SQL Server live suite: set {', '.join(VARS)} to run it (no SQL Server here)")
        pytest.skip("a live SQL Server case: it runs in the live suite's child session (SQLQUEUE_TEST_DB=mssql)")


def held_locks(table: str) -> dict[tuple[str, str, str], int]:
    """This session's locks on ``table`` by (resource type, mode, index name): count."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.resource_type, l.request_mode, COALESCE(i.name, N''), COUNT(*) FROM sys.dm_tran_locks AS l "
            "JOIN sys.partitions AS p ON p.hobt_id = l.resource_associated_entity_id "
            "LEFT JOIN sys.indexes AS i ON i.object_id = p.object_id AND i.index_id = p.index_id "
            "WHERE l.request_session_id = @@SPID AND l.resource_database_id = DB_ID() AND p.object_id = OBJECT_ID(%s) "
            "GROUP BY l.resource_type, l.request_mode, i.name", [table])
        return {(kind, mode, index): n for kind, mode, index, n in cursor.fetchall()}


def key_locks(table: str, index: str) -> int:
    return sum(n for (kind, _, name), n in held_locks(table).items() if kind == "KEY" and name == index)


@pytest.mark.django_db(transaction=True)
def test_live_a_claim_after_a_mass_crash_locks_about_n_expired_jobs(noop_type) -> None:
    """29.4: the expired branch reads the processing index in its own order and stops after n rows; sorted
    into claim order first, it read (and U-locked to commit) every expired job."""
    live()
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from django_sqlqueue.models import Job
    from django_sqlqueue.queue import JobSpec

    Job.objects.enqueue_many([JobSpec("Noop", {"i": i}, priority=i % 7) for i in range(200)])
    assert len(Job.objects.claim("crashed", 200)) == 200
    Job.objects.filter(worker="crashed").update(lease_expires_at=timezone.now() - timedelta(hours=1))
    with transaction.atomic():
        got = Job.objects.claim("rescuer", 2)
        assert len(got) == 2
        held = key_locks(Job._meta.db_table, "sqlqueue_job_processing")
    assert held < 40, f"{held} keys of the processing index locked by a claim of 2 (200 expired jobs)"


@pytest.mark.django_db(transaction=True)
def test_live_the_limited_claim_stops_at_the_first_usable_permit() -> None:
    """29.2: the permit read seeks sqlqueue_permit_free in (held_until, id) order and stops at the first
    permit whose scope has a job: 100 later free permits stay unlocked for other claimers."""
    live()
    from django.db import transaction

    from django_sqlqueue import jobtypes
    from django_sqlqueue import limits as permits
    from django_sqlqueue.models import Job, JobType, LimitPermit

    row, _ = JobType.objects.update_or_create(name="LiveSync", defaults={"concurrency_limit": 1})
    jobtypes.clear_cache()
    Job.objects.enqueue("LiveSync", {}, concurrency_key="first")
    permits.ensure("default", row.pk, [f"idle-{i:03}" for i in range(100)], (1, 1, None))  # after "first"'s
    assert LimitPermit.objects.filter(job_type_id=row.pk).count() >= 101
    with transaction.atomic():
        [job] = Job.objects.claim("w", 1)
        held = key_locks(LimitPermit._meta.db_table, "sqlqueue_permit_free")
    assert job.concurrency_key == "first" and held < 10, f"{held} free-permit keys locked by one limited claim"
    assert permits.remove_idle_key_permits("default") >= 100  # and the idle keys' permits can go


@pytest.mark.django_db(transaction=True)
def test_live_lock_escalation_is_off_for_the_tables_claims_write() -> None:
    """29.3: a table lock is the one lock READPAST cannot skip."""
    live()
    from django.db import connection

    from django_sqlqueue.models import Job, JobAttempt, LimitPermit

    tables = [m._meta.db_table for m in (Job, JobAttempt, LimitPermit)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, lock_escalation_desc FROM sys.tables WHERE name IN (%s, %s, %s)", tables)
        assert dict(cursor.fetchall()) == dict.fromkeys(tables, "DISABLE")


@pytest.mark.django_db(transaction=True)
def test_live_the_claim_puts_normal_deadlock_priority_back(noop_type) -> None:
    """29.1: the claim runs at DEADLOCK_PRIORITY LOW and leaves the session at NORMAL (0), on success and
    on error."""
    live()
    from django.db import connection

    from django_sqlqueue.models import Job

    def priority() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT deadlock_priority FROM sys.dm_exec_sessions WHERE session_id = @@SPID")
            return cursor.fetchone()[0]

    Job.objects.enqueue("Noop", {})
    assert len(Job.objects.claim("w", 1)) == 1
    assert priority() == 0


@pytest.mark.django_db(transaction=True)
def test_live_the_claim_plan_reads_its_pinned_indexes_without_a_sort_per_branch() -> None:
    """29.6 and 29.4: every hinted index is in the plan (queue_explain's verdict), and only the picked
    set is sorted (one Sort or Top N Sort), not a branch before its TOP."""
    live()
    from django.db import connection

    from django_sqlqueue.dialects import ClaimRequest, get_dialect
    from django_sqlqueue.dialects.mssql import showplan_documents, showplan_operators
    from django_sqlqueue.models import Job
    from django_sqlqueue.ops.explain import explain_claim

    report = explain_claim(limit=10, limited=False)
    assert report.ok, report.plan
    dialect = get_dialect(connection)
    for req in (ClaimRequest("w", 10), ClaimRequest("w", 10, queues=("a", "b"))):
        sql, params = dialect.claim_sql(req)
        with connection.cursor() as cursor:
            lines, scans = dialect.claim_plan(cursor, sql, params, Job._meta.db_table)
            operators = showplan_operators(showplan_documents(dialect, cursor, sql, params))
        assert not scans and all(name in "\n".join(lines) for name in dialect.claim_plan_indexes(req)), lines
        assert sum(op in ("Sort", "Top N Sort", "Distinct Sort") for op in operators) <= 1, operators
