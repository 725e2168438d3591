"""Shared fixtures: job types, worker processes' environment, the PostgreSQL cluster handle."""

from __future__ import annotations

import os

import pytest
from django.db import connection

from django_sqlqueue import jobtypes
from django_sqlqueue.models import JobType

VENDOR_DB = os.environ.get("SQLQUEUE_TEST_DB", "sqlite")

_NEEDS_LOCKING = ("needs SQL Server's locking (UPDLOCK/READPAST/HOLDLOCK between concurrent sessions): Babelfish "
                  "parses and drops every table hint; runs on a real SQL Server (tests/test_mssql_live.py)")
_FK_BUG = ("Babelfish bug: in this test session a foreign key check on a django.contrib table (admin log, "
           "permissions) looks for '<db>_<db>_dbo.<table>'; the queue's own tables are not affected")
_BUDGET = ("CI time budget (20 min for every stage): vendor-independent worker-process, browser and admin "
           "logic that the sqlite and postgres stages run; the T-SQL these paths send runs here in-process "
           "(test_claim, test_standing, test_schedules, test_limits, test_admin_pages, test_purge)")
#: The tds stage (Babelfish, not SQL Server): what cannot run there, and why. Node id prefixes.
TDS_SKIPS = {
    "tests/test_hostile_worker.py": _BUDGET,
    "tests/test_recovery.py::test_a_worker_killed": _BUDGET,
    "tests/test_browser_operator.py": _BUDGET,
    "tests/test_demo_hint.py": _BUDGET,
    "tests/test_type_cache.py": _BUDGET,
    "tests/test_admin_operator.py": _BUDGET,
    "tests/test_hostile_admin.py": _BUDGET,
    "tests/test_worker_process.py": _BUDGET,
    "tests/test_schedules_workers.py": _BUDGET,
    "tests/test_concurrency.py": _NEEDS_LOCKING,
    "tests/test_soak.py": _NEEDS_LOCKING + "; a chaos soak of several workers",
    "tests/test_enqueue.py::test_dedupe_under_a_race_of_two_processes": _NEEDS_LOCKING,
    "tests/test_admin_dashboard.py::test_job_type_settings_are_editable": _FK_BUG,
    "tests/test_metrics.py::test_metrics_need_a_token_or_a_staff_viewer": _FK_BUG,
    "tests/test_admin_schedules.py": _FK_BUG,
    "tests/test_admin_dashboard.py::test_pause_and_resume_job_types": _FK_BUG,
    "tests/test_security.py::test_admin_actions_keep_csrf_protection": _FK_BUG,
    "tests/test_admin_schedules.py::test_run_now_needs_its_permission": _FK_BUG,
}


_ON_SQLITE = ("CI time budget (the stages run at once in 20 min): vendor-independent worker-process and browser "
              "logic, run in the sqlite stage; this stage keeps the tests of PostgreSQL's own behaviour")
#: The postgres stage: vendor-independent process-level and browser tests that the sqlite stage runs.
PG_SKIPS = {
    "tests/test_hostile_worker.py::test_a_paused_worker": _ON_SQLITE,
    "tests/test_hostile_worker.py::test_a_slot_paused": _ON_SQLITE,
    "tests/test_hostile_worker.py::test_a_handler_": _ON_SQLITE,
    "tests/test_recovery.py::test_a_worker_killed": _ON_SQLITE,
    "tests/test_browser_admin.py": _ON_SQLITE,
    "tests/test_browser_operator.py": _ON_SQLITE,
    "tests/test_demo_hint.py": _ON_SQLITE,
}


def pytest_collection_modifyitems(config, items) -> None:
    skips, label = {"tds": (TDS_SKIPS, "tds stage (Babelfish)"), "postgres": (PG_SKIPS, "postgres stage")}.get(
        VENDOR_DB, ({}, ""))
    for item in items:
        reason = next((why for prefix, why in skips.items() if item.nodeid.startswith(prefix)), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"{label}: {reason}"))


@pytest.fixture
def pg_cluster():
    """The throwaway PostgreSQL cluster (skips on other databases)."""
    from tests.sessiondb import get_cluster

    cluster = get_cluster()
    if cluster is None:
        pytest.skip("needs the test session's own PostgreSQL cluster (SQLQUEUE_TEST_DB=postgres)")
    return cluster


@pytest.fixture(autouse=True)
def _seeded_statuses(request):
    """Re-seed the status vocabulary: transactional tests flush every table, the seed included."""
    marker = request.node.get_closest_marker("django_db")
    if marker is not None:
        transactional = marker.kwargs.get("transaction") or (marker.args and marker.args[0])
        request.getfixturevalue("transactional_db" if transactional else "db")
        from django_sqlqueue.models import QueueStatus
        from django_sqlqueue.states import Status

        # Only the missing rows (not ignore_conflicts: SQL Server's backend does not offer it).
        have = set(QueueStatus.objects.values_list("id", flat=True))
        QueueStatus.objects.bulk_create([QueueStatus(id=int(s), name=s.label) for s in Status if s not in have])
    yield


@pytest.fixture(autouse=True)
def _fresh_type_cache():
    jobtypes.clear_cache()
    yield
    jobtypes.clear_cache()


@pytest.fixture
def noop_type(db):
    return JobType.objects.get_or_create(name="Noop")[0]


@pytest.fixture
def make_type(db):
    def make(name: str, **kwargs):
        # update_or_create: handlers' types (e.g. the example app's) already have rows after migrate
        return JobType.objects.update_or_create(name=name, defaults=kwargs)[0]

    return make


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture(scope="session", autouse=True)
def _babelfish_fresh_connection(request):
    """tds stage only: reconnect once the test database exists. The connection that created it (and
    ran its migrations) keeps name resolution from the database it first logged in to, and Babelfish
    then looks for ``<db>_<db>_dbo.<table>`` in foreign key checks (a Babelfish bug)."""
    if VENDOR_DB != "tds":
        yield
        return
    request.getfixturevalue("django_db_setup")
    with request.getfixturevalue("django_db_blocker").unblock():
        connection.close()
    # The harness's flush keeps content types and permissions (testproject/babelfish: KEPT), so the
    # handlers that would write them back after every transactional test are not needed.
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.db.models.signals import post_migrate

    post_migrate.disconnect(create_contenttypes)
    post_migrate.disconnect(create_permissions, dispatch_uid="django.contrib.auth.management.create_permissions")
    yield
