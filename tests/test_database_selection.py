"""The suite really runs on the database it was asked to (guards against a silent SQLite fallback)."""

import os

import pytest
from django.db import connection

EXPECTED_VENDOR = {"sqlite": "sqlite", "postgres": "postgresql", "mssql": "microsoft", "tds": "microsoft"}


def test_suite_runs_on_the_requested_database() -> None:
    assert connection.vendor == EXPECTED_VENDOR[os.environ.get("SQLQUEUE_TEST_DB", "sqlite")]


@pytest.mark.django_db
def test_tds_stage_talks_to_babelfish_over_tds() -> None:
    """The tds stage reaches Babelfish through mssql-django (and a real SQL Server run is not Babelfish)."""
    if connection.vendor != "microsoft":
        pytest.skip("SQL Server / Babelfish only")
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(SERVERPROPERTY('ProductVersion') AS nvarchar(128)), "
                       "CAST(SERVERPROPERTY('Babelfish') AS nvarchar(128))")
        version, babelfish = cursor.fetchone()
    assert version.split(".")[0].isdigit()
    assert (babelfish is not None) == (os.environ.get("SQLQUEUE_TEST_DB") == "tds")
