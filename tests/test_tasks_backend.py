"""SqlQueueBackend against Django's own expectations for a task backend (django/tests/tasks), in-process.

Jobs are run here by :func:`tests.test_tasks_defs.run_one` (the worker's own runner, in-process), so
these tests pin the backend's mapping without a subprocess; tests/test_tasks_worker.py repeats the
round trip through a real ``run_queue_worker`` process.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone

from django_sqlqueue import Status, enqueue
from django_sqlqueue.handlers import registry
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.tasks import runner as task_runner
from django_sqlqueue.tasks.backend import STATUS_MAP, SqlQueueBackend, TaskArgumentsError, exception_entry

from . import test_tasks_defs as defs
from .test_tasks_defs import run_one

pytestmark = pytest.mark.django_db

BACKEND = "django_sqlqueue.tasks.SqlQueueBackend"


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    settings.TASKS = {
        "default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]},
        "once": {"BACKEND": BACKEND, "QUEUES": [], "OPTIONS": {"max_attempts": 1}},
    }
    yield task_backends["default"]


# ----- the backend's shape ------------------------------------------------------------------------------
def test_backend_is_configured_with_truthful_flags(tasks_backend) -> None:
    assert default_task_backend == tasks_backend
    assert isinstance(tasks_backend, SqlQueueBackend)
    assert tasks_backend.alias == "default" and tasks_backend.options == {}
    assert tasks_backend.supports_defer and tasks_backend.supports_async_task
    assert tasks_backend.supports_get_result and tasks_backend.supports_priority
    assert task_backends["once"].max_attempts == 1


def test_every_queue_status_has_a_framework_status() -> None:
    assert set(STATUS_MAP) == set(Status)
    assert STATUS_MAP[Status.CANCELLED] == STATUS_MAP[Status.TERMINATED] == TaskResultStatus.FAILED
    assert STATUS_MAP[Status.ERROR] == TaskResultStatus.READY


# ----- enqueue ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [defs.noop_task, defs.noop_task_async], ids=["sync", "async"])
def test_enqueue_returns_a_ready_result(t) -> None:
    result = t.enqueue(1, two=3)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.started_at is None and result.finished_at is None and result.last_attempted_at is None
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert result.task == t and result.args == [1] and result.kwargs == {"two": 3}
    assert result.attempts == 0 and result.errors == [] and result.worker_ids == []
    assert isinstance(result.id, str) and len(result.id) < 64 and result.backend == "default"
    job = Job.objects.select_related("job_type").get(pk=int(result.id))
    assert job.job_type.name == t.module_path and job.state is Status.PENDING
    assert job.payload["args"] == [1] and job.payload["kwargs"] == {"two": 3}


@pytest.mark.parametrize("t", [defs.noop_task, defs.noop_task_async], ids=["sync", "async"])
def test_aenqueue(t) -> None:
    result = async_to_sync(t.aenqueue)()
    assert result.status == TaskResultStatus.READY and result.task == t
    assert result.args == [] and result.kwargs == {}
    assert Job.objects.filter(pk=int(result.id)).exists()


def test_enqueue_sends_task_enqueued_and_logs(caplog) -> None:
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(receiver)
    try:
        with caplog.at_level("DEBUG", logger="django.tasks"):
            result = defs.noop_task.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(SqlQueueBackend, result.id, TaskResultStatus.READY)]
    assert any("enqueued" in r.getMessage() and result.id in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("bad", [datetime.now(), {1, 2}, object()])
def test_non_serialisable_argument_is_refused_at_enqueue(bad) -> None:
    with pytest.raises(TypeError, match="Unsupported type") as info:
        defs.noop_task.enqueue(bad)
    assert isinstance(info.value, TaskArgumentsError) and "JSON-serialisable" in str(info.value)
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(defs.noop_task.aenqueue)(when=bad)
    assert not Job.objects.exists()


def test_nan_is_refused_because_json_cannot_carry_it() -> None:
    with pytest.raises(TaskArgumentsError, match="JSON-serialisable"):
        defs.noop_task.enqueue(float("nan"))
    assert not Job.objects.exists()


def test_arguments_round_trip_through_json() -> None:
    result = defs.echo.enqueue((1, 2), {3: "three"}, b"bytes", nested={"t": (True, None, 1.5)})
    assert result.args == [[1, 2], {"3": "three"}, "bytes"]
    assert result.kwargs == {"nested": {"t": [True, None, 1.5]}}
    assert default_task_backend.get_result(result.id).args == result.args
    done = run_one()
    assert done.response == {"args": result.args, "kwargs": result.kwargs}


def test_priority_queue_and_run_after_map_to_the_job() -> None:
    when = timezone.now() + timedelta(hours=1)
    t = defs.noop_task.using(priority=10, queue_name="queue_1", run_after=when)
    result = t.enqueue()
    job = Job.objects.get(pk=int(result.id))
    assert (job.priority, job.queue) == (10, "queue_1")
    assert abs((job.scheduled_for - when).total_seconds()) < 0.001
    again = default_task_backend.get_result(result.id)
    assert again.task == t and again.task.run_after == when
    assert run_one() is None  # not due for an hour


def test_higher_priority_runs_first() -> None:
    low = defs.calculate_meaning_of_life.using(priority=TASK_MIN_PRIORITY).enqueue()
    high = defs.calculate_meaning_of_life.using(priority=TASK_MAX_PRIORITY).enqueue()
    assert str(run_one().pk) == high.id
    assert str(run_one().pk) == low.id


def test_framework_validation_applies() -> None:
    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend."):
        defs.noop_task.using(queue_name="queue-2")
    with pytest.raises(InvalidTask, match="priority must be a whole number"):
        defs.noop_task.using(priority=TASK_MAX_PRIORITY + 1)
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime."):
        defs.noop_task.using(run_after=datetime.now())
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(defs.calculate_meaning_of_life.func)
    with pytest.raises(InvalidTask, match="module level"):
        task()(lambda: None)
    # QUEUES = [] accepts any queue name that fits the column
    assert defs.noop_task.using(queue_name="anything", backend="once").queue_name == "anything"
    with pytest.raises(InvalidTask, match="longer than 100"):
        defs.noop_task.using(queue_name="q" * 101, backend="once")


def test_a_task_a_worker_cannot_import_is_refused() -> None:
    orphan = task()(defs.not_a_task)  # not bound to its module-level name: the path leads elsewhere
    with pytest.raises(InvalidTask, match="does not lead back to this task"):
        orphan.enqueue()
    assert not Job.objects.exists()


def test_max_attempts_option_sets_the_job_attempts() -> None:
    result = defs.noop_task.using(backend="once").enqueue()
    assert Job.objects.get(pk=int(result.id)).max_attempts == 1
    assert result.backend == "once"
    assert Job.objects.get(pk=int(defs.noop_task.enqueue().id)).max_attempts is None


# ----- get_result / refresh -----------------------------------------------------------------------------
def test_get_result_equals_the_enqueued_result() -> None:
    result = default_task_backend.enqueue(defs.noop_task, (), {})
    assert default_task_backend.get_result(result.id) == result
    assert defs.noop_task.get_result(result.id) == result
    assert async_to_sync(default_task_backend.aget_result)(result.id) == result
    assert async_to_sync(defs.noop_task.aget_result)(result.id) == result


def test_refresh_keeps_an_unchanged_result_identical() -> None:
    result = defs.noop_task.enqueue()
    original = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original


def test_missing_results_do_not_exist(make_type) -> None:
    make_type("Noop")
    typed = enqueue("Noop", {"a": 1})  # a typed job is not a task result
    for missing in ["123", "not-a-number", str(typed.pk)]:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(missing)
        with pytest.raises(TaskResultDoesNotExist):
            async_to_sync(defs.noop_task.aget_result)(missing)


def test_result_of_another_task_is_a_mismatch() -> None:
    result = default_task_backend.enqueue(defs.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        defs.noop_task.get_result(result.id)


# ----- running --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [defs.calculate_meaning_of_life, defs.echo_async], ids=["sync", "async"])
def test_successful_run(t) -> None:
    result = t.enqueue()
    run_one("w1")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == (42 if t is defs.calculate_meaning_of_life else
                                   {"args": [], "kwargs": {}, "async": True})
    assert result.attempts == 1 and result.worker_ids == ["w1"] and result.errors == []
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at


@pytest.mark.parametrize(
    ("t", "exception", "message"),
    [
        (defs.failing_task_value_error, ValueError, "This Task failed due to ValueError"),
        (defs.failing_task_system_exit, SystemExit, "This Task failed due to SystemExit"),
    ],
    ids=["ValueError", "SystemExit"],
)
def test_failing_run(t, exception, message) -> None:
    result = t.using(backend="once").enqueue()
    run_one()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert len(result.errors) == 1
    assert result.errors[0].exception_class is exception
    assert message in result.errors[0].traceback and result.errors[0].traceback.endswith("\n")


def test_complex_exception_and_complex_return_value() -> None:
    exc_result = defs.complex_exception.using(backend="once").enqueue()
    ret_result = defs.complex_return_value.enqueue()  # not retried even with attempts left
    run_one()
    run_one()
    exc_result.refresh()
    ret_result.refresh()
    assert exc_result.status == ret_result.status == TaskResultStatus.FAILED
    assert exc_result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in exc_result.errors[0].traceback
    assert ret_result.errors[0].exception_class is TypeError
    assert "Unsupported type" in ret_result.errors[0].traceback and ret_result.attempts == 1


def test_takes_context() -> None:
    result = defs.get_task_id.enqueue()
    info = defs.context_info.enqueue(1)
    run_one("w1")
    run_one("w1")
    result.refresh()
    info.refresh()
    assert result.return_value == result.id
    assert info.status == TaskResultStatus.SUCCESSFUL
    assert info.return_value == {"id": info.id, "attempt": 1, "status": "RUNNING", "workers": ["w1"]}


def test_retry_keeps_every_attempt_in_errors_and_worker_ids() -> None:
    result = defs.fail_first_attempt.enqueue({"v": 1})
    run_one("w1")
    result.refresh()
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.attempts == 1 and result.finished_at is None
    assert [e.exception_class for e in result.errors] == [ConnectionError]
    run_one("w2")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"v": 1}
    assert result.worker_ids == ["w1", "w2"] and result.attempts == 2 and len(result.errors) == 1
    assert result.started_at <= result.last_attempted_at


def test_runner_sends_started_and_finished_signals() -> None:
    seen = []

    def on_started(sender, task_result, **kwargs):
        seen.append(("started", task_result.status, task_result.attempts))

    def on_finished(sender, task_result, **kwargs):
        seen.append(("finished", task_result.status, task_result.attempts))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        defs.fail_first_attempt.enqueue(1)
        run_one()
        run_one()
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert seen == [
        ("started", TaskResultStatus.RUNNING, 1), ("finished", TaskResultStatus.READY, 1),
        ("started", TaskResultStatus.RUNNING, 2), ("finished", TaskResultStatus.SUCCESSFUL, 2),
    ]


def test_operator_cancel_maps_to_failed_with_its_reason() -> None:
    result = defs.noop_task.enqueue()
    Job.objects.modify(int(result.id), None, Status.CANCELLED, error="cancelled by an operator")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.finished_at is not None
    assert [e.traceback for e in result.errors] == ["cancelled by an operator\n"]
    assert result.errors[0].exception_class_path == "django_sqlqueue.exceptions.SqlQueueError"


def test_status_mapping_of_stored_jobs() -> None:
    result = defs.noop_task.enqueue()
    for status, expected in STATUS_MAP.items():
        Job.objects.filter(pk=int(result.id)).update(status_id=int(status))
        assert default_task_backend.get_result(result.id).status == expected, status


def test_exception_entry_parsing() -> None:
    assert exception_entry("timed out after 30s").exception_class_path == "django_sqlqueue.exceptions.SqlQueueError"
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: 1\n'
    assert exception_entry(tb).exception_class is KeyError
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\ndjango.tasks.exceptions.InvalidTask\n'
    assert exception_entry(tb).exception_class is InvalidTask


# ----- the resolver and the job types ---------------------------------------------------------------------
def test_resolver_knows_tasks_and_nothing_else() -> None:
    handler = registry.get(defs.calculate_meaning_of_life.module_path)
    assert handler.steps == ()
    for name in ["Noop", "tests.test_tasks_defs.not_a_task", "no.such.module.fn", "os.path.join", None, 42, ""]:
        assert task_runner.resolve(name) is None, name
        if isinstance(name, str) and name:
            assert not registry.is_registered(name), name
    assert all(isinstance(h.name, str) for h in registry.all())


def test_task_job_types_are_created_on_first_enqueue() -> None:
    defs.noop_task.enqueue()
    defs.noop_task.enqueue()
    assert JobType.objects.filter(name=defs.noop_task.module_path).count() == 1


# ----- checks -------------------------------------------------------------------------------------------
def test_checks(settings) -> None:
    assert task_backends["default"].check() == []
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["x" * 101],
                                  "OPTIONS": {"max_attempts": 0, "retries": 2}}}
    ids = sorted(m.id for m in task_backends["default"].check())
    assert ids == ["sqlqueue.E102", "sqlqueue.E103", "sqlqueue.E104"]


def test_a_payload_holds_only_what_differs_from_the_defaults(settings) -> None:
    # Every byte is stored and parsed on every claim: a no-argument task's payload is {}; arguments,
    # run_after and a backend that is not the task's own are kept, and each reaches the run.
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}, "other": {"BACKEND": BACKEND, "QUEUES": []}}
    plain = defs.echo.enqueue()
    assert Job.objects.get(pk=int(plain.id)).payload == {}
    later = timezone.now() - timedelta(seconds=1)
    full = task_backends["other"].enqueue(defs.echo.using(run_after=later), [1], {"k": "v"})
    stored = Job.objects.get(pk=int(full.id)).payload
    assert stored == {"args": [1], "kwargs": {"k": "v"}, "backend": "other", "run_after": later.isoformat()}
    seen = []
    with _Connected(task_started, lambda sender, task_result, **kw: seen.append(task_result)):
        run_one()
        run_one()
    by_id = {r.id: r for r in seen}
    assert (by_id[plain.id].args, by_id[plain.id].kwargs, by_id[plain.id].backend) == ([], {}, "default")
    assert (by_id[full.id].args, by_id[full.id].kwargs, by_id[full.id].backend) == ([1], {"k": "v"}, "other")
    assert by_id[full.id].task.run_after == later
    plain.refresh()
    full.refresh()
    assert plain.return_value == {"args": [], "kwargs": {}}
    assert full.return_value == {"args": [1], "kwargs": {"k": "v"}}


class _Connected:
    def __init__(self, signal, receiver) -> None:
        self.signal, self.receiver = signal, receiver

    def __enter__(self) -> None:
        self.signal.connect(self.receiver)

    def __exit__(self, *exc) -> None:
        self.signal.disconnect(self.receiver)
