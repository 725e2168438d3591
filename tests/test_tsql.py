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
from django_sqlqueue.dialects.mssql import MssqlDialect
from django_sqlqueue.managers import INSERT_COLUMNS, JobManager
from django_sqlqueue.models import Job
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


@pytest.mark.parametrize("req", [
    ClaimRequest("host:1/0", 1),
    ClaimRequest("host:1/0", 50, queues=("emails", "sms"), types=(3, 4)),
    ClaimRequest("host:1/0", 50, reclaim=False),
])
def test_claim_batch(dialect: MssqlDialect, req: ClaimRequest) -> None:
    sql, params = dialect.claim_sql(req)
    statements = parse(sql, params)
    kinds = [type(s).__name__ for s in statements]
    assert kinds == ["Set", "Declare", "Update", "Insert", "Select"]
    update = statements[2]
    # The candidates: every read of the job table inside the CTE holds UPDLOCK, ROWLOCK, READPAST.
    cte = update.find(exp.CTE)
    assert cte is not None and cte.alias == "picked"
    job_reads = [t for t in cte.find_all(exp.Table) if t.name == "django_sqlqueue_job"]
    branches = 2 if req.reclaim else 1  # due jobs, and (with reclaim) stuck Processing ones
    assert len(job_reads) == branches
    for table in job_reads:
        assert hints(table) == {"UPDLOCK", "ROWLOCK", "READPAST"}
    # TOP (n) with ORDER BY in each branch and in the CTE: the order the claim promises.
    assert len(list(cte.find_all(exp.Order))) == branches + 1
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
    # the history rows come from the same batch
    assert statements[3].find(exp.Table).name == "django_sqlqueue_jobattempt"


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
        from django_sqlqueue.managers import _UNSET

        args["response"] = _UNSET
    manager = JobManager()
    manager.model = Job
    sets, params = manager._modify_sets(dialect, _job(current), current, new, args["step"],
                                        args["response"], args["error"], args["scheduled_for"],
                                        args["run_in"], args["reset_attempts"], "default")
    sql = dialect.modify_sql(sets)
    [update] = parse(sql, [*params, 7, 3])
    assert isinstance(update, exp.Update)
    where = update.args["where"].sql("tsql")
    assert "[version] = @p" in where and "[id] = @p" in where  # the concurrency token
    assert update.args.get("returning") is not None  # OUTPUT inserted.*
    assert "[version] = [version] + 1" in sql


@pytest.mark.parametrize("statement", ["close_attempt_sql", "delete_attempt_sql", "reap_candidates_sql"])
def test_housekeeping_statements(dialect: MssqlDialect, statement: str) -> None:
    [parsed] = parse(getattr(dialect, statement)())
    assert parsed is not None


def test_renew_leases(dialect: MssqlDialect) -> None:
    [update] = parse(dialect.renew_leases_sql(3), [60, 1, 2, 3, "w"])
    assert "DATEADD(SECOND" in update.sql("tsql").upper()


def test_locked_read_sees_the_current_row(dialect: MssqlDialect) -> None:
    [select] = parse(dialect.select_job_sql("[id] = %s"), [1])
    assert hints(select.find(exp.Table)) == {"READCOMMITTEDLOCK"}


def test_enqueue_statements(dialect: MssqlDialect) -> None:
    [plain] = parse(dialect.insert_sql(INSERT_COLUMNS, 3, dedupe=False))
    assert isinstance(plain, exp.Insert) and plain.args.get("returning") is not None
    [dedupe] = parse(dialect.insert_sql(INSERT_COLUMNS, 1, dedupe=True))
    guard = [t for t in dedupe.find_all(exp.Table) if hints(t)]
    assert len(guard) == 1 and hints(guard[0]) == {"UPDLOCK", "HOLDLOCK"}
    assert "IN (1, 2, 3, 7)" in dedupe.sql("tsql")  # unfinished statuses, as literals


def test_bulk_enqueue_stays_under_the_parameter_limit(dialect: MssqlDialect) -> None:
    per_row = len(INSERT_COLUMNS) - 2
    rows = dialect.max_params // per_row
    sql = dialect.insert_sql(INSERT_COLUMNS, rows, dedupe=False)
    assert sql.count("%s") <= 2100


def test_every_returned_column_has_a_declared_type(dialect: MssqlDialect) -> None:
    [declare] = parse(dialect._declare())
    assert declare.sql("tsql").count("[") >= len(JOB_COLUMNS)


def test_an_insert_can_return_only_what_the_database_decides(dialect: MssqlDialect) -> None:
    """The one-statement enqueue's INSERT as it is sent (captured at the cursor): OUTPUT of STAMPED only."""

    class Capture:  # the statement and parameters insert_stamped sends; nothing is executed
        def execute(self, sql: str, params: list) -> None:
            self.sql, self.params = sql, params

        def fetchall(self) -> list:
            return []

    cursor = Capture()
    row = ["default", 1, 1, "", 0, 0, None, dialect.json_param("{}"), "", None, None, 1, None, "", None]
    dialect.insert_stamped(cursor, INSERT_COLUMNS, [row, row], "", "default")  # type: ignore[arg-type]
    [insert] = parse(cursor.sql, cursor.params)
    output = insert.args["returning"].sql("tsql")
    assert output == "OUTPUT inserted.[id], inserted.[enqueued_at], inserted.[scheduled_for], inserted.[updated_at]"
    assert dialect.STAMPED == ("id", "enqueued_at", "scheduled_for", "updated_at")
