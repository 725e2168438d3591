"""Round trips of Django tasks through a real ``run_queue_worker --burst`` process on the test database.

The worker process uses ``testproject.settings``, whatever its TASKS setting says: it finds each task by
the job type name (the task's import path) through the resolver that django_sqlqueue installs.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

from django_sqlqueue.models import JobType

from . import procutil
from . import test_tasks_defs as defs
from .conftest import VENDOR_DB

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
BACKEND = "django_sqlqueue.tasks.SqlQueueBackend"


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    settings.TASKS = {
        "default": {"BACKEND": BACKEND},
        "once": {"BACKEND": BACKEND, "OPTIONS": {"max_attempts": 1}},
    }


def test_a_fresh_django_process_resolves_tasks() -> None:
    """Worker slots are fresh processes: django_sqlqueue's app config must install the task resolver."""
    code = (
        "import django; django.setup()\n"
        "from django_sqlqueue.handlers import registry\n"
        # a task of an installed app (a task elsewhere resolves once the backend has flagged its row)
        "print(registry.is_registered('testproject.notifications.tasks.send_welcome_email'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=procutil.test_db_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "True", (
        "a worker process cannot resolve Django tasks: django_sqlqueue.apps.SqlQueueConfig.ready() must call "
        "django_sqlqueue.tasks.runner.install()"
    )


def run_worker(*extra: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(ROOT / "manage.py"), "run_queue_worker", "--burst", "--no-progress",
               "--log-level", "WARNING", *extra]
    proc = subprocess.run(command, cwd=ROOT, env=procutil.test_db_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_tasks_round_trip_through_a_worker_process() -> None:
    ok = defs.calculate_meaning_of_life.using(priority=5).enqueue()
    echoed = defs.echo_async.enqueue([1, "two"], key={"nested": True})
    own_id = defs.get_task_id.enqueue()
    context = defs.context_info.enqueue(1)
    value_error = defs.failing_task_value_error.using(backend="once").enqueue()
    system_exit = defs.failing_task_system_exit.using(backend="once").enqueue()
    bad_return = defs.complex_return_value.enqueue()
    flaky = defs.fail_first_attempt.enqueue("second time lucky")
    later = defs.calculate_meaning_of_life.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue()
    # Retry the flaky task at once (its type's backoff), so one burst run sees both attempts.
    JobType.objects.filter(name=defs.fail_first_attempt.module_path).update(backoff_base_seconds=0)

    started = time.monotonic()
    # two slots claiming side by side, except on Babelfish (the tds stage), which drops READPAST/UPDLOCK
    run_worker("--concurrency", "1" if VENDOR_DB == "tds" else "2", "--wait-due", "5")
    # A figure, not a bound (the run's own subprocess timeout bounds a hang): a loaded machine is slow.
    print(f"burst run took {time.monotonic() - started:.1f} s")

    backend = task_backends["default"]
    get = backend.get_result
    results = {name: get(r.id) for name, r in [
        ("ok", ok), ("echoed", echoed), ("own_id", own_id), ("context", context), ("value_error", value_error),
        ("system_exit", system_exit), ("bad_return", bad_return), ("flaky", flaky), ("later", later)]}

    for name in ["ok", "echoed", "own_id", "context", "flaky", "later"]:
        assert results[name].status == TaskResultStatus.SUCCESSFUL, (name, results[name].errors)
    assert results["ok"].return_value == 42 and results["ok"].task.priority == 5
    assert results["echoed"].return_value == {"args": [[1, "two"]], "kwargs": {"key": {"nested": True}},
                                              "async": True}
    assert results["own_id"].return_value == own_id.id
    assert results["context"].return_value["attempt"] == 1
    assert results["context"].return_value["status"] == "RUNNING"
    assert results["flaky"].return_value == "second time lucky"
    assert results["flaky"].attempts == 2 and [e.exception_class for e in results["flaky"].errors] == [ConnectionError]
    assert results["later"].started_at >= later.task.run_after

    for name, exc in [("value_error", ValueError), ("system_exit", SystemExit), ("bad_return", TypeError)]:
        r = results[name]
        assert r.status == TaskResultStatus.FAILED and r.attempts == 1, (name, r.errors)
        assert r.errors[0].exception_class is exc, (name, r.errors[0].traceback)
    assert "Unsupported type" in results["bad_return"].errors[0].traceback

    for r in results.values():
        assert r.enqueued_at <= r.started_at <= r.finished_at
        # worker ids are the worker's slot names: host:pid/slot
        assert all(":" in w for w in r.worker_ids) and r.attempts == len(r.worker_ids)


def test_scalar_and_object_return_values_come_back() -> None:
    """Every JSON value a task may return is stored and read back: on SQL Server mssql-django's own
    ISJSON check would refuse the scalars (see django_sqlqueue.fields.JSONValueField)."""
    values = [42, "done", True, None, 2.5, {"a": [1, "x"]}, [1, 2]]
    results = [defs.give_back.enqueue(v) for v in values]
    proc = run_worker("--concurrency", "1")
    assert f"processed={len(values)} " in proc.stdout + proc.stderr
    for value, enqueued in zip(values, results, strict=True):
        result = task_backends["default"].get_result(enqueued.id)
        assert result.status == TaskResultStatus.SUCCESSFUL, (value, result.errors)
        assert result.return_value == value and type(result.return_value) is type(value)


def test_a_rolled_back_enqueue_is_never_run() -> None:
    from django.db import transaction

    kept = defs.calculate_meaning_of_life.enqueue()
    try:
        with transaction.atomic():
            defs.failing_task_value_error.enqueue()
            raise RuntimeError("the caller's transaction fails")
    except RuntimeError:
        pass
    proc = run_worker()
    assert "processed=1 " in proc.stdout + proc.stderr
    assert task_backends["default"].get_result(kept.id).status == TaskResultStatus.SUCCESSFUL
