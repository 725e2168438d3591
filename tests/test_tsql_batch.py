"""SQL Server: the batched completion renders and parses as T-SQL (see tests/test_tsql.py)."""

from __future__ import annotations

from sqlglot import exp

from django_sqlqueue.dialects.mssql import MssqlDialect
from tests.test_tsql import dialect, parse  # noqa: F401  (the module's rendering fixture)


def test_complete_many_batch(dialect: MssqlDialect) -> None:  # noqa: F811
    sql = dialect.complete_sql(3)
    statements = parse(sql, [1, 2, "{}", 15] * 3)
    assert [type(s).__name__ for s in statements] == ["Set", "Declare", "Update", "Update", "Select"]
    jobs, history = statements[2], statements[3]
    # the token test: id and version joined from the VALUES rows, Processing as a literal
    on = jobs.find(exp.Join).args["on"].sql("tsql")
    assert "[id] = v.vid" in on and "[version] = v.vversion" in on
    assert "[status_id] = 2" in jobs.args["where"].sql("tsql")
    assert "@done" in jobs.args["returning"].sql("tsql")  # OUTPUT inserted.* INTO @done
    assert "[status_id] = 5" in sql and "SYSUTCDATETIME()" in sql
    assert "COALESCE(v.vduration, " in sql  # the measured run time, else claim to completion
    assert "django_sqlqueue_jobattempt" in {t.name for t in history.find_all(exp.Table)}
    assert "@done" in history.sql("tsql")


def test_complete_chunk_fits_sql_server_limits(dialect: MssqlDialect) -> None:  # noqa: F811
    sql = dialect.complete_sql(dialect.complete_chunk)
    assert sql.count("%s") <= 2100 and dialect.complete_chunk <= 1000  # params; VALUES rows
