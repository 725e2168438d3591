"""SQL Server: every T-SQL statement the app issues is rendered through mssql-django and parsed.

No SQL Server runs on these machines, so this suite checks the statements by construction: they are
produced by the same code paths as the other vendors, with mssql-django's own quoting, and parsed by
sqlglot's T-SQL dialect. tests/test_mssql_live.py runs them for real where a server is configured.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
import sqlglot
from sqlglot import exp

from django_sqlqueue.dialects import JOB_COLUMNS, ClaimRequest
from django_sqlqueue.dialects.mssql import Batch, MssqlDialect, batch
from django_sqlqueue.models import Job
from django_sqlqueue.queue import INSERT_COLUMNS, JobManager
from django_sqlqueue.states import Status


@pytest.fixture(scope="module")
def dialect() -> MssqlDialect:
    """A dialect over a real mssql-django DatabaseWrapper that never connects (rendering only)."""
    from mssql.base import DatabaseWrapper

    settings = {"ENGINE": "mssql", "NAME": "render", "USER": "", "PASSWORD": "", "HOST": "", "PORT": "",
                "OPTIONS": {"python_driver": "mssql_python"}, "TIME_ZONE": None, "CONN_MAX_AGE": 0,
                "CONN_HEALTH_CHECKS": False, "AUTOCOMMIT": True, "ATOMIC_REQUESTS": False, "TEST": {}}
    wrapper = DatabaseWrapper(settings, "mssql-render")
    assert wrapper.vendor == "microsoft"
    return MssqlDialect(wrapper)


def parse(sql: str, params: list | None = None) -> list[exp.Expression]:
    """Parse like the driver sees it: each %s becomes a parameter marker."""
    assert "%%" not in sql, "no literal percent signs are expected in our T-SQL"
    count = sql.count("%s")
    if params is not None:
        assert count == len(params), f"{count} placeholders, {len(params)} params"
    assert count <= 2100, "SQL Server allows at most 2100 parameters"
    numbers = iter(range(1, count + 1))
    marked = re.sub(r"%s", lambda _m: f"@p{next(numbers)}", sql)
    return [s for s in sqlglot.parse(marked, read="tsql") if s is not None]


def hints(table: exp.Table) -> set[str]:
    return {v.name.upper() for h in (table.args.get("hints") or []) for v in h.expressions}


def index_hint(table: exp.Table) -> str | None:
    """The index named by the table's ``INDEX(...)`` hint, or None."""
    found = [v.expressions[0].name for h in (table.args.get("hints") or []) for v in h.expressions
             if v.name.upper() == "INDEX"]
    return found[0] if found else None


def parse_batch(parts: Batch) -> tuple[list[exp.Expression], list[exp.Expression], list[exp.Expression]]:
    """The declarations, body and result SELECTs of a batch, each parsed (placeholders counted against
    the batch's params where it carries them: an INSERT's text is built apart from its rows)."""
    marks = sum(p.count("%s") for p in [*parts.declares, *parts.body, *parts.results])
    assert marks == len(parts.params) or not parts.params, f"{marks} placeholders, {len(parts.params)} params"
    return ([s for d in parts.declares for s in parse(d)], [s for b in parts.body for s in parse(b)],
            [s for r in parts.results for s in parse(r)])


@pytest.mark.parametrize("req", [
    ClaimRequest("host:1/0", 1),
    ClaimRequest("host:1/0", 50, queues=("emails", "sms"), types=(3, 4)),
    ClaimRequest("host:1/0", 50, reclaim=False),
])
def test_claim_batch(dialect: MssqlDialect, req: ClaimRequest) -> None:
    parts = dialect.claim_batch(req)
    sql, params = dialect.claim_sql(req)
    assert sql == batch(parts) and params == parts.params
    declares, body, results = parse_batch(parts)
    assert [type(s).__name__ for s in declares + body + results] == ["Declare", "Update", "Insert", "Select"]
    update = body[0]
    # The candidates: a derived table (not a CTE: see the dialect), every read of the job table in it
    # holding UPDLOCK, ROWLOCK, READPAST.
    assert update.find(exp.CTE) is None
    picked = update.args["from_"].this
    assert isinstance(picked, exp.Subquery) and picked.alias == "picked"
    [join] = picked.args.get("joins") or update.args["joins"]  # where sqlglot hangs the FROM's join
    picked = picked.this
    job_reads = [t for t in picked.find_all(exp.Table) if t.name == "django_sqlqueue_job"]
    branches = 4 if req.reclaim else 1  # due; with reclaim: this worker's own, expired leases, dead workers'
    assert len(job_reads) == branches
    for table in job_reads:
        assert hints(table) == {"INDEX", "UPDLOCK", "ROWLOCK", "READPAST"}
    # each branch pinned to the index it was written for (issue 29.6)
    due_index = "sqlqueue_job_claim_queue" if req.queues else "sqlqueue_job_claim"
    assert sorted(index_hint(t) or "" for t in job_reads) == sorted(
        [due_index, *(["sqlqueue_job_processing_worker", "sqlqueue_job_processing", "sqlqueue_job_processing_worker"]
                      if req.reclaim else [])])
    # TOP (n) with ORDER BY in each branch but the dead workers' (nested loops in their own order,
    # see test_tsql_locking.py) and in the picked set: the order the claim promises.
    assert len(list(picked.find_all(exp.Order))) == (branches - 1 if req.reclaim else 1) + 1
    # The join into the target is pinned to nested loops: one primary-key seek per picked id.
    assert (join.args.get("hint") or "").upper() == "LOOP" and join.this.name == "django_sqlqueue_job"
    # OUTPUT inserted.<every returned column> INTO the table variable.
    output = update.args.get("returning")
    assert output is not None
    out_sql = output.sql("tsql")
    for column in dialect.n.job_columns:
        assert f"inserted.{column}" in out_sql
    assert "@claimed" in out_sql
    # status ids are literals (filtered indexes match at compile time); everything else is a parameter
    assert "IN (1, 3)" in sql and ("j.[status_id] = 2" in sql) == req.reclaim
    assert req.worker not in sql and all(q not in sql for q in req.queues)
    # no OR across the reclaim cases: each branch seeks its own filtered index
    assert " OR j.[lease_expires_at]" not in sql and " OR j.[worker]" not in sql
    # the history rows come from the same batch
    assert body[1].find(exp.Table).name == "django_sqlqueue_jobattempt"


def test_batch_saves_and_restores_session_settings() -> None:
    """NOCOUNT and XACT_ABORT set by a batch outlive it: NOCOUNT ends OFF and XACT_ABORT as it was, on
    success and on error."""
    sql = batch(Batch(["DECLARE @t TABLE (id bigint)"], ["UPDATE x SET a = 1"], ["SELECT id FROM @t"]))
    assert sql.startswith("DECLARE @sqlqueue_options int = @@OPTIONS")
    restore = "SET NOCOUNT OFF; IF (@sqlqueue_options & 16384) = 0 SET XACT_ABORT OFF;"
    assert sql.count(restore) == 2  # in CATCH before THROW, and before the result SELECTs
    assert sql.index("THROW") > sql.index(restore) and sql.rindex(restore) < sql.index("SELECT id FROM @t")
    # its own transaction only in autocommit; inside the caller's it joins that one
    # (ODBC's manual-commit mode is SET IMPLICIT_TRANSACTIONS ON: @@TRANCOUNT is 0 at its first statement)
    assert "CASE WHEN @@TRANCOUNT = 0 AND (@@OPTIONS & 2) = 0 THEN 1 ELSE 0 END" in sql
    assert "IF @sqlqueue_own = 1 BEGIN SET XACT_ABORT ON; BEGIN TRANSACTION; END;" in sql
    assert "IF @sqlqueue_own = 1 COMMIT TRANSACTION;" in sql
    assert "IF @sqlqueue_own = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION;" in sql


def test_claim_uses_the_database_clock(dialect: MssqlDialect) -> None:
    sql, _ = dialect.claim_sql(ClaimRequest("w", 1))
    assert "SYSUTCDATETIME()" in sql and "GETDATE" not in sql.upper()


def _job(status: Status) -> Job:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Job(id=7, queue="default", job_type_id=1, status_id=int(status), attempt_num=1, version=3,
               enqueued_at=now, scheduled_for=now, updated_at=now, payload={})


@pytest.mark.parametrize(("current", "new", "kwargs"), [
    (Status.PROCESSING, Status.COMPLETED, {"response": {"ok": 1}}),
    (Status.PROCESSING, Status.ERROR, {"error": "boom", "run_in": 5}),
    (Status.PROCESSING, Status.PROCESSING, {"step": "Send"}),
    (Status.PROCESSING, Status.PENDING, {}),
    (Status.FAILED, Status.PENDING, {}),
    (Status.FAILED, Status.PENDING, {"reset_attempts": True}),
    (Status.PENDING, Status.CANCELLED, {}),
])
def test_modify_statements(dialect: MssqlDialect, current: Status, new: Status, kwargs: dict) -> None:
    args = {"step": None, "response": object(), "error": None, "scheduled_for": None, "run_in": None,
            "reset_attempts": False, **kwargs}
    if "response" not in kwargs:
        from django_sqlqueue.queue import UNSET

        args["response"] = UNSET
    manager = JobManager()
    manager.model = Job
    sql, params = manager._modify_statement(dialect, _job(current), current, new, args["step"],
                                            args["response"], args["error"], args["scheduled_for"],
                                            args["run_in"], args["reset_attempts"], "default")
    assert sql.count("%s") == len(params) + 2
    [update] = parse(sql[sql.index("UPDATE "):sql.index("; IF @sqlqueue_own = 1 COMMIT")])
    assert isinstance(update, exp.Update)
    assert "@changed" in update.args["returning"].sql("tsql")  # OUTPUT ... INTO: works beside triggers
    where = update.args["where"].sql("tsql")
    assert "[version] = @p" in where and "[id] = @p" in where  # the concurrency token
    assert update.args.get("returning") is not None  # OUTPUT inserted.*
    assert "[version] = [version] + 1" in sql


@pytest.mark.parametrize("statement", ["close_attempt_sql", "delete_attempt_sql", "reap_candidates_sql"])
def test_housekeeping_statements(dialect: MssqlDialect, statement: str) -> None:
    [parsed] = parse(getattr(dialect, statement)())
    assert parsed is not None


def test_renew_leases(dialect: MssqlDialect) -> None:
    sql = dialect.renew_leases_sql(3)
    assert sql.startswith("SET NOCOUNT OFF; ")  # the caller reads the row count
    [_, update] = parse(sql, [60, 1, 2, 3, "w", "incarnation"])
    assert "DATEADD(MILLISECOND" in update.sql("tsql").upper()


def test_guarded_renewals_read_the_permits_locked(dialect: MssqlDialect) -> None:
    """While a type has a limit, an expired lease is renewed only for a job holding a live permit (or
    needing none): the permit reads are locked reads, as READ_COMMITTED_SNAPSHOT would read a version."""
    for sql, params in ((dialect.renew_leases_sql(2, guarded=True), [60, 60, 1, 2, "w", "i"]),
                        (dialect.renew_held_sql([2, 1], guarded=True), [60, 60, 1, 2, 3, 1, 2, "w", "i", 3, "v", "j"])):
        assert sql.startswith("SET NOCOUNT OFF; ")
        [_, update] = parse(sql, params)
        text = update.sql("tsql").upper()
        # the guard's two permit reads and the lease's cap at the live permit, all locked reads
        assert text.count("EXISTS") == 2 and text.count("READCOMMITTEDLOCK") == 3, text
        assert "LIMITED" in text and "HELD_UNTIL" in text and "MIN(" in text


def test_purge_statements(dialect: MssqlDialect) -> None:
    """purge_queue: lock the jobs that still qualify (update locks, the current row), delete their rows by
    job id, then the jobs with the same conditions; the job DELETE reports its row count."""
    cutoff = datetime(2026, 1, 1, tzinfo=UTC)
    where = dialect.purge_where(3, 2, 1)
    params = [1, 2, 3, 4, 5, cutoff, cutoff, "emails"]
    [lock] = parse(dialect.purge_lock_sql(where), params)
    assert hints(lock.find(exp.Table)) == {"UPDLOCK", "ROWLOCK"}
    assert [c.sql("tsql") for c in lock.expressions] == ["[id]"]  # never a payload
    # history and subtype rows: DELETE TOP (n) in a loop, each statement under the ~5,000 locks at which
    # SQL Server escalates to a table lock (issue 29.3). sqlglot misreads DELETE TOP (n): the loop is
    # checked as text, the DELETE inside it parsed without its TOP.
    loop = re.fullmatch(r"SET NOCOUNT ON; WHILE 1 = 1 BEGIN DELETE TOP \((\d+)\) FROM (.+?) WHERE (.+?); "
                        r"IF @@ROWCOUNT < (\d+) BREAK; END; SET NOCOUNT OFF;",
                        dialect.delete_by_job_sql("notifications_emailchannel", "job_id", 3))
    assert loop is not None and loop[1] == loop[4] and int(loop[1]) < 5000
    [delete] = parse(f"DELETE FROM {loop[2]} WHERE {loop[3]}", [1, 2, 3])
    assert isinstance(delete, exp.Delete) and "[job_id] IN (@p1, @p2, @p3)" in delete.sql("tsql")
    sql = dialect.purge_delete_sql(where)
    assert sql.startswith("SET NOCOUNT OFF; ")
    [_, delete] = parse(sql, params)
    assert isinstance(delete, exp.Delete)
    assert "[status_id] IN (@p4, @p5)" in delete.sql("tsql") and "[queue] IN (@p8)" in delete.sql("tsql")


def test_time_arithmetic_keeps_fractions_and_long_delays(dialect: MssqlDialect) -> None:
    """DATEADD takes an int: seconds would overflow past 68 years and drop fractions; days + ms do not."""
    sql = dialect.now_plus("%s")
    assert "DATEADD(second" not in sql and sql.count("%s") == 1  # the parameter is read once
    assert "CAST(ROUND(CAST(%s AS float) * 1000, 0) AS bigint)" in sql
    [select] = parse(f"SELECT {sql}")
    assert select is not None


def test_locked_read_sees_the_current_row(dialect: MssqlDialect) -> None:
    [select] = parse(dialect.select_job_sql("[id] = %s"), [1])
    assert hints(select.find(exp.Table)) == {"READCOMMITTEDLOCK"}


def test_enqueue_statements(dialect: MssqlDialect) -> None:
    parts = dialect.insert_batch(INSERT_COLUMNS, 3, False, JOB_COLUMNS)
    assert dialect.insert_sql(INSERT_COLUMNS, 3, dedupe=False) == batch(parts)
    _, [plain], _ = parse_batch(parts)
    assert isinstance(plain, exp.Insert) and "@inserted" in plain.args["returning"].sql("tsql")
    _, [dedupe], _ = parse_batch(dialect.insert_batch(INSERT_COLUMNS, 1, True, JOB_COLUMNS))
    guard = [t for t in dedupe.find_all(exp.Table) if hints(t)]
    assert len(guard) == 1 and hints(guard[0]) == {"UPDLOCK", "HOLDLOCK"}
    assert "IN (1, 2, 3, 7)" in dedupe.sql("tsql")  # unfinished statuses, as literals


def test_bulk_enqueue_stays_under_the_parameter_limit(dialect: MssqlDialect) -> None:
    per_row = len(INSERT_COLUMNS) - 2
    rows = dialect.max_params // per_row
    sql = dialect.insert_sql(INSERT_COLUMNS, rows, dedupe=False)
    assert sql.count("%s") <= 2100


def test_every_returned_column_has_its_column_type(dialect: MssqlDialect) -> None:
    [declare] = parse(dialect.declare("@claimed"))
    assert declare.sql("tsql").count("[") >= len(JOB_COLUMNS)
    # taken from the model fields, so a bigint foreign key is declared bigint
    types = dialect.declare_types
    assert types["job_type_id"] == "bigint" and types["id"] == "bigint" and types["payload"] == "nvarchar(max)"


def test_an_insert_can_return_only_what_the_database_decides(dialect: MssqlDialect) -> None:
    """The one-statement enqueue's INSERT as it is sent (captured at the cursor): OUTPUT of STAMPED only."""

    class Capture:  # the statement, parameters and declared types insert_stamped sends; nothing is executed
        def setinputsizes(self, sizes: list) -> None:
            self.sizes = sizes

        def execute(self, sql: str, params: list) -> None:
            self.sql, self.params = sql, params

        def fetchall(self) -> list:
            return []

    cursor = Capture()
    row = ["default", 1, 1, "", 0, 0, None, dialect.json_param("{}"), "", None, None, 1, None, "", None, "", False, None]
    dialect.insert_stamped(cursor, INSERT_COLUMNS, [row, row], "", "default")  # type: ignore[arg-type]
    parts = dialect.insert_batch(INSERT_COLUMNS, 2, False, dialect.STAMPED)
    assert cursor.sql == batch(parts) and cursor.sql.count("%s") == len(cursor.params) == len(cursor.sizes)
    # every parameter declared: no per-length string types, no describe round trip for the NULLs
    assert {size for size in cursor.sizes} <= {(-9, 4000, 0), (-5, 19, 0), (93, 27, 7)}

    _, [insert], _ = parse_batch(parts)
    output = insert.args["returning"].sql("tsql")
    assert output == ("OUTPUT inserted.[id], inserted.[enqueued_at], inserted.[scheduled_for], "
                      "inserted.[updated_at] INTO @inserted")
    assert dialect.STAMPED == ("id", "enqueued_at", "scheduled_for", "updated_at")


def test_declared_parameter_types(dialect: MssqlDialect) -> None:
    from datetime import timedelta, timezone

    class Capture:
        def setinputsizes(self, sizes: list) -> None:
            self.sizes = sizes

        def execute(self, sql: str, params: list) -> None:
            self.params = params

    paris = timezone(timedelta(hours=1))
    cursor = Capture()
    dialect.execute(cursor, "SELECT %s, %s, %s, %s, %s, %s, %s",  # type: ignore[arg-type]
                    ["x", "y" * 5000, "\U0001f600" * 2001, 7, 0.5, None, datetime(2026, 1, 1, 13, tzinfo=paris)])
    assert cursor.sizes == [(-9, 4000, 0), (-9, 0, 0), (-9, 0, 0),  # 2001 emoji: 4002 UTF-16 units, nvarchar(max)
                            (-5, 19, 0), (8, 15, 0), (-9, 4000, 0), (93, 27, 7)]
    # an aware datetime goes as UTC datetime2 (pyodbc would drop the offset and the server read local time)
    assert cursor.params[-1] == datetime(2026, 1, 1, 12)
    with pytest.raises(TypeError, match="bytes"):
        dialect.execute(cursor, "SELECT %s", [b"raw"])  # type: ignore[arg-type]
