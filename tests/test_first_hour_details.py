"""Small first-hour traps (issue 20 item 9): each message says what it means, once."""

from __future__ import annotations

import subprocess
import sys

import pytest

import django_sqlqueue
from django_sqlqueue import InvalidPayload, Status, enqueue
from django_sqlqueue.handlers import registry
from django_sqlqueue.models import Job, JobType
from tests import procutil
from tests.workerutil import REPO

from . import test_tasks_defs as defs


def test_run_queue_worker_version_is_the_packages(tmp_path) -> None:
    env = {**procutil.os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "SQLQUEUE_DATABASE_URL": f"sqlite:///{tmp_path}/v.sqlite3"}
    done = subprocess.run([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--version"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"django-sqlqueue {django_sqlqueue.__version__}"


@pytest.mark.django_db
def test_a_task_module_the_worker_cannot_import_is_reported_with_its_import_error() -> None:
    name = "sqq_gone_app.tasks.send"  # a task enqueued earlier whose module is not importable here
    JobType.objects.create(name=name, is_task=True)
    handler = registry.get(name)  # not "no handler is registered"
    with pytest.raises(RuntimeError, match=r"task 'sqq_gone_app.tasks.send' cannot be imported: "
                                           r"ModuleNotFoundError\(\"No module named 'sqq_gone_app'\"\)"):
        handler.func(None)


@pytest.mark.django_db
def test_the_task_argument_error_says_it_once_and_names_the_argument() -> None:
    from datetime import datetime

    with pytest.raises(TypeError) as caught:
        defs.noop_task.enqueue(1, when=datetime(2026, 1, 1))
    message = str(caught.value)
    assert message.count("Unsupported type") <= 1 and "kwargs['when']" in message and "datetime" in message


@pytest.mark.django_db
def test_the_payload_error_names_the_offending_key() -> None:
    with pytest.raises(InvalidPayload, match=r"payload\['order'\]\['items'\]\[1\]"):
        enqueue("test.Noop", {"order": {"items": [1, {2, 3}]}})
    with pytest.raises(InvalidPayload, match=r"payload\['ratio'\]"):
        enqueue("test.Noop", {"ratio": float("nan")})


@pytest.mark.django_db
def test_a_job_in_a_shell_says_what_it_is() -> None:
    job = enqueue("test.Noop", {})
    assert repr(Job.objects.get(pk=job.pk)) == f"<Job: job {job.pk} (type {job.job_type_id}, Pending)>"


@pytest.mark.django_db
@pytest.mark.parametrize("record", ["complete", "complete_many"])
def test_a_completed_job_no_longer_shows_an_earlier_attempts_error(record) -> None:
    from django_sqlqueue.models import JobAttempt

    job = enqueue("test.Steps", {})
    Job.objects.fail(Job.objects.claim("w1")[0], "Send failed: relay down", retry_in=0)
    again = Job.objects.claim("w1")[0]
    if record == "complete":
        Job.objects.complete(again, {"ok": True})
    else:
        Job.objects.complete_many([(again, {"ok": True})])
    done = Job.objects.get(pk=job.pk)
    assert done.status_id == Status.COMPLETED and done.error == ""  # Completed: the job's error is its current one
    assert list(JobAttempt.objects.filter(job=done).values_list("error", flat=True)) == [
        "Send failed: relay down", ""]  # the history keeps it


@pytest.mark.django_db
def test_a_failed_job_is_not_scheduled_in_the_future() -> None:
    job = enqueue("test.Noop", {}, max_attempts=1)
    assert Job.objects.claim("w1")[0].pk == job.pk
    failed = Job.objects.fail(Job.objects.get(pk=job.pk), "boom", retry_in=3600)
    assert failed.status_id == Status.FAILED and failed.scheduled_for <= failed.finished_at  # not "due in an hour"
    retrying = enqueue("test.Noop", {}, max_attempts=2)
    later = Job.objects.fail(Job.objects.claim("w1")[0], "boom", retry_in=3600)
    assert later.pk == retrying.pk and later.status_id == Status.ERROR and later.scheduled_for > later.finished_at
