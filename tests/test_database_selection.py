"""The suite really runs on the database it was asked to (guards against a silent SQLite fallback)."""

import os

from django.db import connection

EXPECTED_VENDOR = {"sqlite": "sqlite", "postgres": "postgresql", "mssql": "microsoft"}


def test_suite_runs_on_the_requested_database() -> None:
    assert connection.vendor == EXPECTED_VENDOR[os.environ.get("SQLQUEUE_TEST_DB", "sqlite")]
