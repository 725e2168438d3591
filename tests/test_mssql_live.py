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

#: Everything but this file and the browser (its Chromium needs nothing from SQL Server that the admin
#: tests do not already check).
LIVE_ARGS = ["tests", "--deselect", "tests/test_mssql_live.py", "--deselect", "tests/test_browser_admin.py"]


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
