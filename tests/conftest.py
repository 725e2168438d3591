"""Shared fixtures: job types, worker processes' environment, the PostgreSQL cluster handle."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from django.db import connection

from django_sqlqueue import jobtypes
from django_sqlqueue.models import JobType

VENDOR_DB = os.environ.get("SQLQUEUE_TEST_DB", "sqlite")

_NEEDS_LOCKING = ("needs SQL Server's locking (UPDLOCK/READPAST/HOLDLOCK between concurrent sessions): Babelfish "
                  "parses and drops every table hint; runs on a real SQL Server (tests/test_mssql_live.py)")
#: The tds stage (Babelfish, not SQL Server): what cannot run there, and why. Node id prefixes.
TDS_SKIPS = {
    "tests/test_concurrency.py": _NEEDS_LOCKING,
    "tests/test_workflows_workers.py": _NEEDS_LOCKING,
    "tests/test_concurrency_limits.py::test_threads_": _NEEDS_LOCKING,
    "tests/test_limits_workers.py": _NEEDS_LOCKING + "; worker processes claiming at once",
    "tests/test_soak.py": _NEEDS_LOCKING + "; a chaos soak of several workers",
    "tests/test_enqueue.py::test_dedupe_under_a_race_of_two_processes": _NEEDS_LOCKING,
    # two slots / two workers claiming at once (over TDS a job was claimed twice in each, seen 2026-11-27)
    "tests/test_worker_process.py::test_long_job_keeps_its_lease_while_alive": _NEEDS_LOCKING,
    "tests/test_worker_process.py::test_max_jobs_and_max_seconds": _NEEDS_LOCKING,
    # a paused worker and its same-name twin claiming at once (failed over TDS in a quiet check, 2026-11-27)
    "tests/test_hostile_worker.py::test_a_paused_worker_and_its_same_name_twin": _NEEDS_LOCKING,
    # two workers' schedule looks at once: one job per tick rests on the looks' UPDLOCK/READPAST
    "tests/test_schedules_workers.py::test_two_workers_": _NEEDS_LOCKING,
    # a look held up by another session's lock on the schedule table (and, over TDS, the killed slot's
    # claim, still waiting in its server session, went on to claim the next test's job as that slot)
    "tests/test_schedules_workers.py::test_a_look_waiting_on_a_lock": _NEEDS_LOCKING,
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
    "tests/test_browser_safety.py": _ON_SQLITE,
    "tests/test_demo_hint.py": _ON_SQLITE,
}


# ----- unexpected skips fail CI -------------------------------------------------------------------
# Under CI=true a skip whose reason is not listed here for the stage (SQLQUEUE_TEST_DB) fails the run:
# a missing browser, package or server must not pass for green. Each entry is a regular expression
# matched at the start of the skip reason; the reasons are the ones the suite gives today.
def _stage(skips: dict[str, str], label: str) -> list[str]:
    """The stage's own skip table above, as patterns (the reasons exactly)."""
    return [re.escape(f"{label}: {why}") + "$" for why in sorted(set(skips.values()))]


#: Not this vendor's: a test of another database's behaviour, on the sqlite or tds stage.
_POSTGRES_ONLY = [
    r"pg_class\.reltuples is PostgreSQL's$",  # test_admin_pages: the row estimate PostgreSQL keeps
    r"server-side binding is a PostgreSQL \(psycopg 3\) option$",  # test_enqueue_bulk
    r"planner settings are PostgreSQL's$",  # test_plans: the plan under PostgreSQL's planner switches
    r"the one-statement claim is PostgreSQL's ",  # test_claim: autocommit data-modifying CTE
    r"row locks between two sessions: PostgreSQL here ",  # test_schedules: SKIP LOCKED on schedules
    r"needs the test session's own PostgreSQL cluster \(SQLQUEUE_TEST_DB=postgres\)$",  # pg_cluster fixture
    r"a PostgreSQL client against a silent server: runs in the postgres stage$",  # test_supervisor_db
    r"LISTEN/NOTIFY is PostgreSQL only$",  # test_worker_run: the NOTIFY wake-up; test_fleet_look
    r"PostgreSQL: pg_stat_activity and roles with a connection limit$",  # test_worker_connections: starved
    r"PostgreSQL: LISTEN/NOTIFY",  # test_worker_wakeup: one notification wakes one idle slot
]
_SQLITE_ONLY = [
    r"PRAGMA data_version is SQLite only$",  # test_worker_run: SQLite's change counter wake-up
    r"INDEXED BY is SQLite's ",  # test_admin_pages: the limited jobs' MIN pinned to their index
]
_SQL_SERVER_ONLY = [
    r"SQL Server / Babelfish only$",  # test_database_selection: the mssql settings path
    r"SQL Server \(or Babelfish over TDS\) only$",  # test_sqlserver
]
#: Run once, in the sqlite stage: nothing in them depends on the database.
_SQLITE_STAGE_ONLY = [
    r"the walkthrough makes its own SQLite project: run once, in the sqlite stage$",  # test_newcomer_walkthrough
    r"packaging does not depend on the database: run once, in the sqlite stage$",  # test_packaging
    r"the demo runs on SQLite \(and over TDS in the tds stage\); the SQLite session covers it$",  # example app
    r"the skip gate runs pytest on sample files, whatever the database: run once, in the sqlite stage$",  # skip gate
]
#: No SQL Server in CI: tests/test_mssql_live.py runs the suite where one is configured.
_NO_SQL_SERVER = [r"SQL Server live suite: set .* to run it \(no SQL Server here\)$"]

SKIP_ALLOWLIST: dict[str, list[str]] = {
    "sqlite": [
        *_POSTGRES_ONLY, *_SQL_SERVER_ONLY, *_NO_SQL_SERVER,
        r"PostgreSQL: a TCP connection to cut$",  # test_hostile_worker: the connection killed under a worker
        # test_worker_connections: counts a worker's sessions (PostgreSQL and over TDS; SQLite has none)
        r"a server that lists its sessions \(pg_stat_activity, sys\.dm_exec_sessions\)$",
        # test_schedules_workers: a look frozen in its transaction, ended by the server
        r"PostgreSQL's idle_in_transaction_session_timeout: SQLite has no server ",
        # test_concurrency: row locks skipped, not waited for (SQLite serialises writers instead)
        r"SQLite has no row locks: it serialises writers \(BEGIN IMMEDIATE\) instead$",
        r"PostgreSQL's SKIP LOCKED \(SQLite serialises writers",
    ],
    "postgres": [
        *_SQLITE_ONLY, *_SQL_SERVER_ONLY, *_NO_SQL_SERVER, *_SQLITE_STAGE_ONLY,
        r"SQLite: a database file to delete$",  # test_hostile_worker: the file deleted under a worker
        *_stage(PG_SKIPS, "postgres stage"),  # PG_SKIPS above: run by the sqlite stage (time budget)
    ],
    "tds": [
        *_POSTGRES_ONLY, *_SQLITE_ONLY, *_NO_SQL_SERVER, *_SQLITE_STAGE_ONLY,
        # test_admin_sort: an index order read in the planner's EXPLAIN (PostgreSQL, SQLite); Babelfish
        # shows no plan over TDS (a real SQL Server's is for tests/test_mssql_live.py)
        r"no plan to read over TDS \(Babelfish\)$",
        r"PostgreSQL: a TCP connection to cut$",  # test_hostile_worker: the connection killed under a worker
        r"SQLite: a database file to delete$",  # test_hostile_worker: the file deleted under a worker
        # test_schedules_workers: a look frozen in its transaction, ended by PostgreSQL's server setting
        r"PostgreSQL's idle_in_transaction_session_timeout: SQL Server has no setting ",
        # test_sqlserver: a Babelfish bug with OUTPUT INTO beside a trigger (a real SQL Server runs it)
        r"Babelfish: OUTPUT \.\.\. INTO a table variable on a table with a trigger fails there ",
        *_stage(TDS_SKIPS, "tds stage (Babelfish)"),  # TDS_SKIPS above: locking, Babelfish's FK bug, budget
    ],
}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


_SKIPS: list[tuple[str, str]] = []


def _record_skip(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPS.append((report.nodeid, _skip_reason(report)))


def pytest_runtest_logreport(report) -> None:
    _record_skip(report)


def pytest_collectreport(report) -> None:
    _record_skip(report)  # a module-level importorskip or skip


def unexpected_skips(skips: list[tuple[str, str]], stage: str) -> list[tuple[str, str]]:
    """The (node id, reason) of ``skips`` that the stage's allowlist does not account for."""
    allowed = [re.compile(p) for p in SKIP_ALLOWLIST.get(stage, [])]
    return [(node, why) for node, why in skips if not any(p.match(why) for p in allowed)]


def pytest_sessionfinish(session, exitstatus) -> None:
    if os.environ.get("CI") != "true":
        return
    unexpected = unexpected_skips(_SKIPS, VENDOR_DB)
    session.config._sqlqueue_unexpected_skips = unexpected
    if unexpected and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if _CLAIMED:
        mine = sorted(path for path, claimed in _CLAIMED.items() if claimed)
        terminalreporter.line(f"part {os.environ.get('SQLQUEUE_TEST_SHARD')}: ran {len(mine)} of {len(_CLAIMED)} "
                              f"test file segments (dealt at run time): {' '.join(mine)}")
    unexpected = getattr(config, "_sqlqueue_unexpected_skips", None)
    if not unexpected:
        return
    terminalreporter.section(f"unexpected skips (CI=true, stage {VENDOR_DB}): the run fails", sep="=", red=True)
    for node, why in unexpected:
        terminalreporter.line(f"{node}: {why}")
    terminalreporter.line("A skip the stage may produce goes on SKIP_ALLOWLIST in tests/conftest.py, with why; "
                          "a missing browser, package or server is installed instead.")


def pytest_collection_modifyitems(config, items) -> None:
    skips, label = {"tds": (TDS_SKIPS, "tds stage (Babelfish)"), "postgres": (PG_SKIPS, "postgres stage")}.get(
        VENDOR_DB, ({}, ""))
    runs: dict[str, int] = {}
    for item in items:
        reason = next((why for prefix, why in skips.items() if item.nodeid.startswith(prefix)), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"{label}: {reason}"))
        runs[item.nodeid.split("::")[0]] = runs.get(item.nodeid.split("::")[0], 0) + (0 if reason else 1)
    if VENDOR_DB == "tds":
        _stretch_hang_bounds(config, items)
    shard = os.environ.get("SQLQUEUE_TEST_SHARD", "")
    if shard:
        _keep_shard(config, items, runs, shard)


#: How much longer a test's hang bound (pytest-timeout) is over TDS (see tests/workerutil.py's floor).
TDS_TIMEOUT_FACTOR = 2.5


def _stretch_hang_bounds(config, items) -> None:
    """Over TDS, every test's pytest-timeout bound is :data:`TDS_TIMEOUT_FACTOR` times what it says (or the
    ini default): Babelfish compiles each statement a new session sends, and a worker process is several
    new sessions, so a worker test there takes several times what it takes on PostgreSQL. A bound for a
    hang stays one; a test that passes is not slowed by it."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker is not None and marker.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(seconds * TDS_TIMEOUT_FACTOR), append=False)


#: Seconds each test file took in the tds stage (a run of scripts/test.sh; see :func:`_keep_shard`).
TDS_SECONDS_FILE = Path(__file__).with_name("tds_seconds.json")


def _keep_shard(config, items, runs: dict[str, int], shard: str) -> None:
    """``SQLQUEUE_TEST_SHARD=K/N``: run part K of N of the test files (scripts/test.sh runs the tds stage
    in two parts at once, each with its own test database: one session keeps one core busy, Babelfish's
    and the client's turns alternating). Whole files, longest first by what each took in a recorded run
    (tests/tds_seconds.json; a file not recorded counts the recorded median per test, times its tests).

    With ``SQLQUEUE_TEST_SHARD_CLAIMS=DIR`` (a directory the parts share, empty at the start) the files are
    dealt while the parts run: each part collects every file, in the suite's order, and on reaching a
    file runs it only if it is the first to claim it (:func:`pytest_runtest_protocol`). Whichever part is
    free takes the next file, so the parts end within about one file of each other, where the split
    dealt up front once left one part 440 s longer than the other. (Longest first was tried: both parts
    then ran the heaviest worker-process files at once, at the start, beside the other stages' start, and
    five of them failed their bounds over TDS; each part in the suite's order, as before, spreads them.)
    Without it the files are dealt up front, longest first to the part with the least time so far, so
    that every part collects the same split."""
    k, _, n = shard.partition("/")
    part, parts = int(k), int(n)
    if not 1 <= part <= parts:
        raise pytest.UsageError(f"SQLQUEUE_TEST_SHARD must be K/N with 1 <= K <= N, not {shard!r}")
    if _claims_dir():
        _SEGMENTS.update(_segments(items))
        return  # every file collected, in order; pytest_runtest_protocol runs the ones this part claims
    recorded = json.loads(TDS_SECONDS_FILE.read_text()) if TDS_SECONDS_FILE.exists() else {}
    per_test = sorted(recorded[p] / runs[p] for p in recorded if runs.get(p)) or [1.0]
    median = per_test[len(per_test) // 2]

    def cost(path: str) -> float:
        if not runs[path]:
            return 0.0
        return float(recorded[path]) if path in recorded else median * runs[path]

    order = sorted(runs, key=lambda p: (-cost(p), p))
    loads = [0.0] * parts
    owner: dict[str, int] = {}
    for path in order:
        owner[path] = loads.index(min(loads)) + 1
        loads[owner[path] - 1] += cost(path)
    kept = [item for item in items if owner[_file_of(item)] == part]
    config.hook.pytest_deselected(items=[item for item in items if owner[_file_of(item)] != part])
    items[:] = kept


def _file_of(item) -> str:
    return item.nodeid.split("::")[0]


def _claims_dir() -> Path | None:
    """The directory the parts of a sharded run claim their files in, when they are dealt at run time."""
    claims = os.environ.get("SQLQUEUE_TEST_SHARD_CLAIMS", "")
    return Path(claims) if claims and os.environ.get("SQLQUEUE_TEST_SHARD") else None


#: Test file segment -> whether this part claimed it (files dealt at run time; see :func:`_keep_shard`).
_CLAIMED: dict[str, bool] = {}
#: Node id -> its segment: ``path#k``, the k-th run of consecutive tests of that file in the run's order.
_SEGMENTS: dict[str, str] = {}


def _segments(items) -> dict[str, str]:
    """Each test's segment: a file whose tests come in two groups (pytest-django runs the tests inside a
    transaction before the transactional ones) is two segments, dealt apart. Dealt whole, a file claimed
    in the first group bound its transactional tests, the slow worker-process ones, to the part that
    claimed it: in a check, part 2 found nothing left to claim and ended while part 1 ran those alone."""
    out: dict[str, str] = {}
    runs: dict[str, int] = {}
    previous = None
    for item in items:
        path = _file_of(item)
        if path != previous:
            runs[path] = runs.get(path, 0) + 1
            previous = path
        out[item.nodeid] = f"{path}#{runs[path]}"
    return out


def _claim(claims: Path, path: str) -> bool:
    """Claim ``path`` for this part: the first part to create its marker file (O_EXCL) runs it."""
    marker = claims / (re.sub(r"[^A-Za-z0-9_.-]", "_", path) + ".claim")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(os.environ.get("SQLQUEUE_TEST_SHARD", "") + "\n")
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Files dealt at run time: a test of a segment another part claimed is passed over without a report
    (that part runs and reports it). The claim is made at the segment's first test and holds for the
    segment's tests (a run of consecutive tests of one file, :func:`_segments`); every part sees the same
    order, so exactly one part runs each segment, whole."""
    claims = _claims_dir()
    if claims is None:
        return None
    segment = _SEGMENTS.get(item.nodeid, _file_of(item))
    if segment not in _CLAIMED:
        _CLAIMED[segment] = _claim(claims, segment)
    return None if _CLAIMED[segment] else True


@pytest.fixture
def pg_cluster():
    """The throwaway PostgreSQL cluster (skips on other databases)."""
    from tests.sessiondb import get_cluster

    cluster = get_cluster()
    if cluster is None:
        pytest.skip("needs the test session's own PostgreSQL cluster (SQLQUEUE_TEST_DB=postgres)")
    return cluster


@pytest.fixture
def listener():
    """A raw psycopg connection LISTENing on the queue's channel (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    from django_sqlqueue.conf import get_settings
    from tests.procutil import listening

    with listening(get_settings().NOTIFY_CHANNEL) as conn:
        yield conn


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


@pytest.fixture(autouse=True)
def _babelfish_usable_session():
    """tds stage: a session a test left broken (a timeout inside the driver, a server restart) is closed
    after it, so the next test connects anew instead of failing on it too (Django reconnects only after
    a transactional test)."""
    yield
    if VENDOR_DB == "tds" and connection.connection is not None and not connection.is_usable():
        connection.close()


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
    # From here on the driver pools this process's connections (tests/sessiondb.py turned its pool off
    # for the database's creation, above). Babelfish compiles each T-SQL batch once per server
    # session, 2-7 s for the claim's batch, and every transactional test closes its connections: a
    # pooled session is reset on its way back (SET options, temp tables and open transactions are
    # gone, as SQL Server's sp_reset_connection does) but keeps what it compiled, so each test no
    # longer pays the compile again. Worker processes are their own sessions and still pay it.
    import mssql_python

    mssql_python.pooling(max_size=16, idle_timeout=3600)
    # The harness's flush keeps content types and permissions (testproject/babelfish: KEPT), so the
    # handlers that would write them back after every transactional test are not needed.
    from django.contrib.auth.management import create_permissions
    from django.contrib.contenttypes.management import create_contenttypes
    from django.db.models.signals import post_migrate

    post_migrate.disconnect(create_contenttypes)
    post_migrate.disconnect(create_permissions, dispatch_uid="django.contrib.auth.management.create_permissions")
    yield
    # Really close the pooled sessions before the test database is dropped (it refuses while in use).
    with request.getfixturevalue("django_db_blocker").unblock():
        connection.close()
    mssql_python.pooling(enabled=False)


# ----- the browser tests' Chromium (tests/test_browser_*.py) -----------------------------------------------
@pytest.fixture(scope="module")
def chromium(live_server):
    """One Chromium per test module (each test gets its own browser context, :func:`browser`): starting
    Playwright and Chromium took about 2 s a test on a quiet machine, twice that under CI's load."""
    from django.db import connections
    from playwright.sync_api import sync_playwright

    from tests.test_browser_admin import ARTIFACTS, CHROMIUM, LAUNCH_ARGS

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield launched
        launched.close()
        connections.close_all()


@pytest.fixture
def browser(request, chromium):
    """The module's Chromium, with every browser context a test opened closed after it. Only for
    transactional tests (see tests/test_browser_admin.py): a test inside pytest-django's transaction
    would write through the event loop's own connections, outside that transaction, and leak its rows."""
    from django.db import connections

    marker = request.node.get_closest_marker("django_db")
    if marker is None or not marker.kwargs.get("transaction"):
        raise pytest.UsageError(f"{request.node.nodeid}: a browser test must be django_db(transaction=True)")
    yield chromium
    for context in list(chromium.contexts):
        context.close()
    # Database connections opened while Playwright runs (the test's own reads) belong to the
    # context Playwright switched to, which pytest-django never sees: close them here, or the
    # session's teardown cannot drop the PostgreSQL test database ("accessed by other users").
    connections.close_all()
