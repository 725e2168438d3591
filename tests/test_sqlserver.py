"""SQL Server behaviour of the queue's own statements, on a real database.

The behaviours (scalar JSON values, row counts after the queue's batches, time arithmetic) are asserted
on every vendor; the T-SQL-specific checks run where the vendor is SQL Server: the ``tds`` stage
(Babelfish, labelled as such) and the live suite (a real SQL Server, tests/test_mssql_live.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection

from django_sqlqueue import Status, enqueue, jobtypes
from django_sqlqueue.dialects import get_dialect
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.queue import JobSpec

pytestmark = pytest.mark.django_db(transaction=True)

SCALARS = [42, "done", True, False, None, 2.5, "", [], {}]


def microsoft_only() -> None:
    if connection.vendor != "microsoft":
        pytest.skip("SQL Server (or Babelfish over TDS) only")


def is_babelfish() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(SERVERPROPERTY('Babelfish') AS nvarchar(10))")
        return cursor.fetchone()[0] is not None


# ----- JSON values --------------------------------------------------------------------------------
def test_any_json_value_is_a_payload_and_a_response(noop_type: JobType) -> None:
    payloads = [v for v in SCALARS if v is not None]  # a None payload means "no payload": {}
    jobs = [enqueue("Noop", value) for value in payloads]
    assert [Job.objects.get(pk=j.pk).payload for j in jobs] == payloads
    jobs = [*jobs, enqueue("Noop")]
    claimed = Job.objects.claim("w", len(SCALARS))
    by_id = {job.pk: job for job in claimed}
    # one batch of successes holding every kind of value: none may roll the others back
    done = Job.objects.complete_many([(by_id[j.pk], value) for j, value in zip(jobs, SCALARS, strict=True)])
    assert len(done) == len(SCALARS)
    for job, value in zip(jobs, SCALARS, strict=True):
        stored = Job.objects.get(pk=job.pk)
        assert stored.state is Status.COMPLETED and stored.response == value and type(stored.response) is type(value)


def test_modify_stores_a_scalar_response(noop_type: JobType) -> None:
    enqueue("Noop")
    [job] = Job.objects.claim("w", 1)
    job = Job.objects.advance_step(job, "half", response="halfway")
    assert Job.objects.get(pk=job.pk).response == "halfway"
    Job.objects.complete(job, 7)
    assert Job.objects.get(pk=job.pk).response == 7


def test_the_json_columns_check_takes_scalars_and_refuses_bad_text(noop_type: JobType) -> None:
    """The database's own check (SQL Server: migration 0004's) still refuses text that is not JSON."""
    microsoft_only()
    job = enqueue("Noop", {"a": 1})
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(Job._meta.db_table)} SET {qn('payload')} = %s WHERE {qn('id')} = %s", ["42", job.pk])
        with pytest.raises(DatabaseError):
            cursor.execute(f"UPDATE {qn(Job._meta.db_table)} SET {qn('payload')} = %s WHERE {qn('id')} = %s",
                           ["{not json", job.pk])
        cursor.execute(
            "SELECT cc.definition FROM sys.check_constraints AS cc INNER JOIN sys.columns AS c "
            "ON c.object_id = cc.parent_object_id AND c.column_id = cc.parent_column_id "
            "WHERE cc.parent_object_id = OBJECT_ID(%s) AND c.name IN (%s, %s)",
            [Job._meta.db_table, "payload", "response"])
        checks = [row[0].lower().replace(" ", "") for row in cursor.fetchall()]
    assert len(checks) == 2 and all("isjson" in c and "'['" in c for c in checks), checks
    assert Job.objects.get(pk=job.pk).payload == 42


# ----- session state after the queue's batches ------------------------------------------------------
def test_row_counts_are_right_after_the_queues_statements(noop_type: JobType) -> None:
    """NOCOUNT turned on by a batch must not outlive it: later DML on the connection counts its rows."""
    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(3)])
    enqueue("Noop")  # the one-statement enqueue
    claimed = Job.objects.claim("w", 2)
    Job.objects.complete_many([(claimed[0], {"ok": 1})])
    Job.objects.advance_step(claimed[1], "next")
    # the worker's lease renewal relies on the row count
    assert Job.objects.renew_leases("w", [claimed[1].pk], 60) == 1
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(Job._meta.db_table)} SET {qn('priority')} = {qn('priority')} "
                       f"WHERE {qn('status_id')} = %s", [int(Status.PENDING)])
        assert cursor.rowcount == 2


def test_a_failed_batch_rolls_back_whole_and_puts_the_session_back(noop_type: JobType) -> None:
    microsoft_only()
    from django_sqlqueue.dialects.mssql import Batch, batch

    job = enqueue("Noop", priority=1)
    dialect = get_dialect(connection)
    j = dialect.n.j
    failing = Batch(body=[f"UPDATE {dialect.n.job} SET {j['priority']} = 9 WHERE {j['id']} = %s",
                          "SELECT 1 / 0"], params=[job.pk])
    with connection.cursor() as cursor:
        with pytest.raises(DatabaseError):
            cursor.execute(batch(failing), failing.params)
        cursor.execute("SELECT @@OPTIONS & 512, @@OPTIONS & 16384, @@TRANCOUNT")
        assert cursor.fetchone() == (0, 0, 0)  # NOCOUNT off, XACT_ABORT off, no transaction left open
    assert Job.objects.get(pk=job.pk).priority == 1  # the UPDATE before the error was rolled back


# ----- time arithmetic -----------------------------------------------------------------------------
def test_a_fractional_delay_is_kept(noop_type: JobType) -> None:
    enqueue("Noop")
    [job] = Job.objects.claim("w", 1)
    failed = Job.objects.fail(job, "boom", retry_in=0.5)
    waited = (failed.scheduled_for - failed.updated_at).total_seconds()
    assert 0.4 <= waited <= 0.6, waited  # not truncated to whole seconds


def test_a_delay_of_decades_does_not_overflow(noop_type: JobType) -> None:
    enqueue("Noop")
    [job] = Job.objects.claim("w", 1)
    ninety_years = 90 * 365 * 86400  # past 2**31 seconds, where DATEADD(second, ...) overflows
    failed = Job.objects.fail(job, "later", retry_in=ninety_years)
    assert abs(failed.scheduled_for - failed.updated_at - timedelta(seconds=ninety_years)) < timedelta(seconds=1)


# ----- indexes (migration 0004) -------------------------------------------------------------------
def test_the_claim_indexes_exist_with_their_filters() -> None:
    microsoft_only()
    babelfish = is_babelfish()
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sys.indexes WHERE object_id = OBJECT_ID(%s)", [Job._meta.db_table])
        names = [row[0] or "" for row in cursor.fetchall()]
    for wanted in ("sqlqueue_job_claim", "sqlqueue_job_processing", "sqlqueue_job_processing_worker"):
        # Babelfish stores name + table name, cut short, + a 32-digit hash; SQL Server keeps the name
        assert any(n == wanted or (babelfish and len(n) > 32 and (wanted + Job._meta.db_table).startswith(n[:-32]))
                   for n in names), names
    if not babelfish:  # Babelfish accepts LOCK_ESCALATION and reports TABLE regardless
        with connection.cursor() as cursor:
            cursor.execute("SELECT lock_escalation_desc FROM sys.tables WHERE object_id = OBJECT_ID(%s)",
                           [Job._meta.db_table])
            assert cursor.fetchone()[0] == "DISABLE"


def test_the_queues_writes_work_beside_a_trigger(noop_type: JobType) -> None:
    """OUTPUT without INTO fails (Msg 334) on a table with an enabled trigger: every write goes INTO."""
    microsoft_only()
    if is_babelfish():
        pytest.skip("Babelfish: OUTPUT ... INTO a table variable on a table with a trigger fails there "
                    "('portal snapshots did not account for all active snapshots'); a real SQL Server runs it")
    qn = connection.ops.quote_name
    table = qn(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TRIGGER sqlqueue_test_audit ON {table} AFTER INSERT, UPDATE AS SET NOCOUNT ON")
    try:
        enqueue("Noop")
        Job.objects.enqueue_many([JobSpec("Noop"), JobSpec("Noop", dedupe_key="k")])
        claimed = Job.objects.claim("w", 3)
        Job.objects.complete_many([(claimed[0], 1)])
        Job.objects.fail(claimed[1], "boom")
        assert Job.objects.with_status(Status.COMPLETED).count() == 1
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER sqlqueue_test_audit")


def test_completions_and_a_claim_are_one_batch_in_autocommit(noop_type: JobType) -> None:
    """No client-side BEGIN/COMMIT: the batch holds its own transaction (see dialects/mssql.batch)."""
    microsoft_only()
    from django.test.utils import CaptureQueriesContext

    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(3)])
    [first] = Job.objects.claim("w", 1)
    # The limited-type ids are cached for TYPE_CACHE_SECONDS (5 s); on a loaded machine the claim above
    # can outlast that, and the refresh is its own read. Warm it here: the batch itself is what counts.
    jobtypes.limited_type_ids(connection.alias)
    with CaptureQueriesContext(connection) as ctx:
        [done], claimed = Job.objects.complete_and_claim([(first, "ok")], "w", 2)
    assert len(ctx.captured_queries) == 1 and ctx.captured_queries[0]["sql"].startswith("DECLARE @sqlqueue_options")
    assert done.state is Status.COMPLETED and done.response == "ok"
    assert len(claimed) == 2 and all(j.state is Status.PROCESSING for j in claimed)
    assert connection.get_autocommit() and not connection.in_atomic_block


def test_inside_atomic_a_batch_joins_the_callers_transaction(noop_type: JobType) -> None:
    """In Django's atomic() (ODBC manual commit: implicit transactions) the batch neither commits nor
    turns XACT_ABORT on: the caller's rollback takes the job back."""
    microsoft_only()
    from django.db import transaction

    class Rollback(Exception):
        pass

    from django_sqlqueue.dialects.mssql import Batch, batch

    owns = batch(Batch(results=["SELECT @sqlqueue_own"]))
    with connection.cursor() as cursor:
        cursor.execute(owns)
        assert cursor.fetchone()[0] == 1  # autocommit: the batch opens and commits its own transaction
    with pytest.raises(Rollback), transaction.atomic():
        with connection.cursor() as cursor:
            # the first statement of the caller's transaction: @@TRANCOUNT is still 0 there (implicit
            # transactions), yet the batch must see that it is inside one
            cursor.execute(owns)
            assert cursor.fetchone()[0] == 0
        job = enqueue("Noop")
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@OPTIONS & 16384")
            assert cursor.fetchone()[0] == 0
        raise Rollback
    assert not Job.objects.filter(pk=job.pk).exists()
