"""SQL Server: the batched completion renders and parses as T-SQL (see tests/test_tsql.py)."""

from __future__ import annotations

from sqlglot import exp

from django_sqlqueue.dialects.mssql import MssqlDialect, batch
from tests.test_tsql import dialect, parse_batch  # noqa: F401  (the module's rendering fixture)


def test_complete_many_batch(dialect: MssqlDialect) -> None:  # noqa: F811
    parts = dialect.complete_batch([(1, 2, "{}", 15)] * 3)
    sql = batch(parts)
    assert sql == dialect.complete_sql(3) and sql.count("%s") == len(parts.params) == 12
    declares, body, results = parse_batch(parts)
    assert [type(s).__name__ for s in declares + body + results] == ["Declare", "Update", "Update", "Select"]
    jobs, history = body
    # the token test: id and version matched against the VALUES rows, Processing as a literal
    where = jobs.args["where"].sql("tsql")
    assert "[id] = v.vid" in where and "[version] = v.vversion" in where and "[status_id] = 2" in where
    assert "OPTION (LOOP JOIN)" in parts.body[0]  # seeks by primary key, never a scan of the table
    assert "@done" in jobs.args["returning"].sql("tsql")  # OUTPUT inserted.* INTO @done
    assert "[status_id] = 5" in sql and "SYSUTCDATETIME()" in sql
    assert "COALESCE(v.vduration, " in sql  # the measured run time, else claim to completion
    assert "django_sqlqueue_jobattempt" in {t.name for t in history.find_all(exp.Table)}
    assert "@done" in history.sql("tsql")


def test_complete_chunk_fits_sql_server_limits(dialect: MssqlDialect) -> None:  # noqa: F811
    from django_sqlqueue.dialects import ClaimRequest

    # the last chunk of completions shares its batch with a claim: both together stay under 2100
    parts = dialect.complete_batch([(1, 2, "{}", 15)] * dialect.complete_chunk)
    parts.extend(dialect.claim_batch(ClaimRequest("w", 50, queues=("a", "b"), types=(1, 2))))
    assert len(parts.params) <= 2100 and dialect.complete_chunk <= 1000  # params; VALUES rows
    assert dialect.statements(dialect.complete_chunk, True) == 1 and dialect.statements(0, True) == 1


class Capture:
    """A cursor that records what is sent and returns no rows (nothing is executed)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list]] = []

    def setinputsizes(self, sizes: list) -> None:
        pass

    def execute(self, sql: str, params: list) -> None:
        self.sent.append((sql, params))

    def fetchall(self) -> list:
        return []

    def nextset(self) -> bool:
        return True


def test_completions_and_claim_share_a_batch_unless_it_would_pass_2100_parameters(dialect: MssqlDialect) -> None:  # noqa: F811
    from django_sqlqueue.dialects import ClaimRequest

    items = [(i, 1, "{}", None) for i in range(dialect.complete_chunk)]
    cursor = Capture()
    dialect.complete_and_claim(cursor, items, ClaimRequest("w", 10, queues=("a",)))  # type: ignore[arg-type]
    assert len(cursor.sent) == 1  # one round trip
    many = ClaimRequest("w", 10, queues=tuple(f"q{i}" for i in range(150)))
    cursor = Capture()
    dialect.complete_and_claim(cursor, items, many)  # type: ignore[arg-type]
    assert len(cursor.sent) == 2 and all(len(params) <= 2100 for _, params in cursor.sent)
