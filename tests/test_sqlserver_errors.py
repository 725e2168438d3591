"""SQL Server: which driver errors the claim retries, read from the drivers' own exception objects."""

from __future__ import annotations

import pytest

from django_sqlqueue.dialects.mssql import MssqlDialect
from tests.test_tsql import dialect  # noqa: F401  (the rendering fixture)


def _wrapped(driver_exc: BaseException) -> BaseException:
    """As Django raises it: its own class, the driver's exception as the cause."""
    from django.db import OperationalError

    try:
        raise OperationalError(*driver_exc.args) from driver_exc
    except OperationalError as exc:
        return exc


def test_mssql_python_deadlock_and_snapshot_conflict_are_retried(dialect: MssqlDialect) -> None:  # noqa: F811
    from mssql_python.exceptions import OperationalError, ProgrammingError

    deadlock = OperationalError(driver_error="Serialization failure", ddbc_error="[SQL Server]Transaction was deadlocked")
    assert dialect.is_retryable_error(_wrapped(deadlock))
    other = ProgrammingError(driver_error="Syntax error or access violation",
                             ddbc_error="[SQL Server]job 1205 and 1222 deadlock in a payload")
    assert not dialect.is_retryable_error(_wrapped(other))  # digits or words in the text mean nothing


@pytest.mark.parametrize(("state", "message", "retry"), [
    ("40001", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Transaction (Process ID 52) was "
              "deadlocked on lock resources with another process and has been chosen as the deadlock victim. "
              "Rerun the transaction. (1205) (SQLExecDirectW)", True),
    ("HY000", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Lock request time out period exceeded. "
              "(1222) (SQLExecDirectW)", True),
    ("42000", "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Invalid object name 'job_1205'. "
              "(208) (SQLExecDirectW)", False),
])
def test_pyodbc_native_numbers(dialect: MssqlDialect, state: str, message: str, retry: bool) -> None:  # noqa: F811
    pyodbc = pytest.importorskip("pyodbc")
    assert dialect.is_retryable_error(_wrapped(pyodbc.Error(state, message))) is retry
