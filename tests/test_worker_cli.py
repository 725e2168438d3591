"""``run_queue_worker`` option validation: bad values are refused with a clear CommandError."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from tests import procutil
from tests.workerutil import REPO


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency=-1"], "--concurrency must be an integer from 1 to 256, got -1"),
        (["--concurrency", "0"], "--concurrency must be an integer from 1 to 256"),
        (["--concurrency", "100000"], "--concurrency must be an integer from 1 to 256"),
        (["--concurrency", "two"], "invalid int value"),
        (["--batch", "0"], "--batch must be 'auto' or an integer from 1 to 1000, got '0'"),
        (["--batch", "5000"], "--batch must be 'auto' or an integer from 1 to 1000"),
        (["--batch", "lots"], "--batch must be 'auto' or an integer from 1 to 1000, got 'lots'"),
        (["--max-jobs", "0"], "--max-jobs must be an integer from 1"),
        (["--max-seconds=-5"], "--max-seconds must be a number of seconds"),
        (["--max-seconds", "0"], "--max-seconds must be greater than 0"),
        (["--max-seconds", "inf"], "--max-seconds must be a number of seconds"),
        (["--grace-seconds=-1"], "--grace-seconds must be a number of seconds"),
        (["--grace-seconds", "nan"], "--grace-seconds must be a number of seconds"),
        (["--wait-due", "5"], "--wait-due only makes sense with --burst"),
        (["--burst", "--wait-due=-5"], "--wait-due must be a number of seconds"),
        (["--log-level", "loud"], "--log-level must be one of"),
        (["--worker-name", ""], "--worker-name must be 1-190 printable characters"),
        (["--worker-name", "x" * 300], "--worker-name must be 1-190 printable characters"),
        (["--worker-name", "tab\there"], "--worker-name must be 1-190 printable characters"),
        (["--queue", ""], "--queue names must be 1-100 characters"),
        (["--type", ""], "--type: a job type name must be"),
    ],
)
def test_bad_option_values(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("run_queue_worker", *args)


@pytest.mark.django_db
def test_unknown_type_is_refused() -> None:
    with pytest.raises(CommandError, match="--type 'NoSuchType': unknown job type"):
        call_command("run_queue_worker", "--type", "NoSuchType", "--burst")


@pytest.mark.django_db
@pytest.mark.timeout(300)  # two Django process startups: seconds each on a quiet machine, far more at load 8-16
def test_command_line_exit_code_and_help(tmp_path) -> None:
    env = procutil.test_db_env()
    if env["SQLQUEUE_DATABASE_URL"].startswith("sqlite"):
        # no database access in this test: give the child a file of its own to open for system checks
        env["SQLQUEUE_DATABASE_URL"] = f"sqlite:///{tmp_path}/cli.sqlite3"
    cmd = [sys.executable, str(REPO / "manage.py"), "run_queue_worker"]
    bad = subprocess.run([*cmd, "--batch", "-3"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert "CommandError: --batch must be 'auto' or an integer from 1 to 1000, got '-3'" in bad.stderr
    usage = subprocess.run([*cmd, "--help"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0
    for option in ("--queue", "--type", "--concurrency", "--batch", "--burst", "--until-empty", "--wait-due",
                   "--max-jobs", "--max-seconds", "--worker-name", "--grace-seconds", "--log-level", "--no-progress"):
        assert option in usage.stdout


@pytest.mark.timeout(120)
def test_a_worker_started_before_migrate_says_run_migrate(tmp_path) -> None:
    """Issue 20 item 4: it looped forever on SQLite ("no such table") and dumped tracebacks on PostgreSQL."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "SQLQUEUE_DATABASE_URL": f"sqlite:///{tmp_path}/fresh.sqlite3"}
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--burst"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stderr
    assert "run manage.py migrate" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(240)
def test_a_worker_on_a_database_one_queue_migration_behind_says_run_migrate(tmp_path) -> None:
    """The start's migration check reads the queue's migration files and django_migrations (not every
    app's migrations): a database with every table but the last queue migration unrecorded is refused."""
    import sqlite3

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "SQLQUEUE_DATABASE_URL": f"sqlite:///{tmp_path}/behind.sqlite3"}
    subprocess.run([sys.executable, str(REPO / "manage.py"), "migrate", "-v0"], cwd=REPO, env=env, check=True,
                   timeout=200)
    with sqlite3.connect(tmp_path / "behind.sqlite3") as db:
        last = db.execute("SELECT name FROM django_migrations WHERE app = 'django_sqlqueue' ORDER BY name DESC"
                          ).fetchone()[0]
        db.execute("DELETE FROM django_migrations WHERE app = 'django_sqlqueue' AND name = ?", [last])
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--burst"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1, done.stderr
    assert f"django_sqlqueue {last} not applied" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_burst_says_how_many_jobs_are_not_due_yet_and_when_the_next_is() -> None:
    """Issue 20 item 5: ``delay=10`` then ``--burst`` printed processed=0 and nothing else."""
    from django_sqlqueue.models import Job
    from tests import workerutil as wu

    Job.objects.enqueue("test.Noop", delay=600)
    Job.objects.enqueue("test.Noop", delay=3600, queue="other")
    Job.objects.enqueue("test.Noop", delay=900)
    w = wu.WorkerProcess("--burst", "--worker-name", "notdue", "--queue", "default")
    try:
        assert w.wait(90) == 0, w.output()
        out = w.stdout()
    finally:
        w.cleanup()
    assert "processed=0" in out
    assert "2 jobs of this worker's queues and types are not due yet; the next is due at " in out
    assert re.search(r"\(in (5\d\d|600) s\)", out), out  # the job due in 10 minutes, not the other queue's
    assert "--wait-due" in out
