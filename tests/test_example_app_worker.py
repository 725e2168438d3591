"""The notifications example through real worker processes, and the README demo end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_sqlqueue import Status
from django_sqlqueue.models import JobAttempt, JobType
from testproject.notifications.models import Outbox, SmsChannel
from testproject.notifications.services import request_password_reset

from . import procutil

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db(transaction=True)
def test_reset_password_resumes_at_send_in_a_worker_process() -> None:
    job = request_password_reset(user_id=1, username="alice", email="alice@example.com",
                                 phone="+44 20 7946 0001", fail_send_attempts=1)
    JobType.objects.filter(name="ResetPassword").update(backoff_base_seconds=0)  # retry at once
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "run_queue_worker", "--burst", "--no-progress",
         "--wait-due", "3", "--log-level", "WARNING"],
        cwd=ROOT, env=procutil.test_db_env(), capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    job.refresh_from_db()
    assert job.state is Status.COMPLETED and job.attempt_num == 2 and job.step == "Confirm"
    assert job.response["Confirm"] == {"delivered": ["email", "sms"]}
    assert sorted(Outbox.objects.filter(job_id=job.pk).values_list("channel", flat=True)) == ["email", "sms"]
    assert SmsChannel.objects.get(job=job).error == ""
    outcomes = list(JobAttempt.objects.filter(job=job).order_by("attempt_num").values_list("outcome_id", flat=True))
    assert outcomes == [Status.ERROR, Status.COMPLETED]


@pytest.mark.timeout(480)
def test_demo_runs_every_sample_to_its_expected_end(tmp_path) -> None:
    """``bash scripts/demo.sh`` runs this command; here on a fresh SQLite file, and in the tds stage also
    on a fresh database over TDS (Babelfish) with one slot, as a new SQL Server user would run it.

    No wall-clock bound on the whole run (its time is printed; a busy machine slows migrate most): the
    demo's own ``--time-limit`` bounds the jobs' part, from the moment they are enqueued: 240 s here
    (its default, 45 s, is for a person at a quiet machine; the demo stops as soon as the jobs are done)."""
    vendor = os.environ.get("SQLQUEUE_TEST_DB", "sqlite")
    if vendor not in ("sqlite", "tds"):
        pytest.skip("the demo runs on SQLite (and over TDS in the tds stage); the SQLite session covers it")
    args = ["--no-color", "--time-limit", "240"]
    url = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    if vendor == "tds":
        from tests import babelfish

        url = babelfish.create_database(babelfish.start(), f"demo_{os.getpid()}")
        args += ["--concurrency", "1"]
    env = dict(os.environ, SQLQUEUE_DATABASE_URL=url, DJANGO_SETTINGS_MODULE="testproject.settings")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "manage.py"), "sqlqueue_demo", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=400, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # The time is a figure (about 15 s on a quiet machine), not an assertion: at load 8-16 a fresh
    # process and its worker take several times longer. The subprocess timeout bounds a hang.
    print(f"sqlqueue_demo took {elapsed:.1f} s")
    summary = dict(re.findall(r"^\s*(Completed|Failed|Error|Pending|Processing)\s+(\d+)\s*$", out, re.M))
    assert summary.get("Failed") == "1" and "duplicates after retries: 0" in out, out
    # 5 typed samples and the @task sample (issue 32 item 11: the test project's TASKS uses SqlQueueBackend)
    assert int(summary["Completed"]) >= 6 and "Django @task (TASKS backend)" in out and "no @task sample" not in out
    assert "Send fails once" in out and "attempt 1 by" in out


@pytest.mark.django_db
def test_the_demo_time_limit_counts_from_the_enqueue_not_from_migrate(monkeypatch) -> None:
    """Issue 29.8: over TDS at load 8 the demo once left its scheduled-ahead sample Pending. Its 45 s
    limit was counted from the start, migrate included, so a migrate slowed by a busy machine left the
    worker too little of it. The limit is the jobs' time: the worker rounds get all of it."""
    import io

    from django.core.management import call_command

    from testproject.notifications.management.commands import sqlqueue_demo as demo

    real = demo.call_command

    def slow_migrate(name: str, *args, **kwargs):
        if name == "migrate":
            time.sleep(1.5)  # a migrate on a busy machine (the test database is migrated already)
            return None
        return real(name, *args, **kwargs)

    seen: dict[str, float] = {}

    def drain(self, ids, concurrency: int, deadline: float) -> int:
        seen["left"] = deadline - time.monotonic()
        return 1

    monkeypatch.setattr(demo, "call_command", slow_migrate)
    monkeypatch.setattr(demo.Command, "drain", drain)
    monkeypatch.setattr(demo.Command, "report", lambda self, *args: True)
    call_command("sqlqueue_demo", "--time-limit", "10", stdout=io.StringIO())
    assert seen["left"] > 9.0, seen  # all of the limit, not what migrate left of it
