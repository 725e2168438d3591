"""What a worker does per task run, beyond calling the task: nothing the task does not ask for.

The result a worker builds for ``task_started`` / ``task_finished`` and a ``takes_context`` task's
context reads the job's attempt history (``attempts``, ``worker_ids``, ``errors``, ``started_at``,
``last_attempted_at``) only when something asks for one of those fields; the task object is the one
the job was enqueued with, not a new ``Task`` per run. Jobs are run in-process by
:func:`tests.test_tasks_defs.run_one`, the worker's own runner.
"""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.models import JobAttempt
from django_sqlqueue.tasks.backend import LazyHistoryResult

from . import test_tasks_defs as defs
from .test_tasks_defs import run_one

pytestmark = pytest.mark.django_db

BACKEND = "django_sqlqueue.tasks.SqlQueueBackend"


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue_1"]}}
    yield task_backends["default"]


def _history_reads(queries: CaptureQueriesContext) -> list[str]:
    """The SELECTs of the attempt history among ``queries`` (the claim's INSERT and the close's UPDATE aside)."""
    table = JobAttempt._meta.db_table
    return [q["sql"] for q in queries.captured_queries
            if q["sql"].lstrip().upper().startswith("SELECT") and table in q["sql"]]


def _run_capturing(worker: str = "w1") -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        job = run_one(worker)
    assert job is not None
    return _history_reads(queries)


class _Receivers:
    """Connects receivers to task_started and task_finished for a block; records what ``read`` returns."""

    def __init__(self, read: Any) -> None:
        self.read, self.seen = read, []

    def started(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        self.seen.append(("started", self.read(task_result)))

    def finished(self, sender: Any, task_result: Any, **kwargs: Any) -> None:
        self.seen.append(("finished", self.read(task_result)))

    def __enter__(self) -> _Receivers:
        task_started.connect(self.started)
        task_finished.connect(self.finished)
        return self

    def __exit__(self, *exc: Any) -> None:
        task_started.disconnect(self.started)
        task_finished.disconnect(self.finished)


def test_a_task_run_that_nothing_inspects_reads_no_history() -> None:
    defs.calculate_meaning_of_life.enqueue()
    # Receivers that look only at the status and the return value (as Django's own log receivers do).
    with _Receivers(lambda r: (r.status, r.return_value if r.status == TaskResultStatus.SUCCESSFUL else None)) as rec:
        reads = _run_capturing()
    assert reads == []
    assert rec.seen == [("started", (TaskResultStatus.RUNNING, None)),
                        ("finished", (TaskResultStatus.SUCCESSFUL, 42))]


def test_a_context_task_that_does_not_ask_for_its_attempts_reads_no_history() -> None:
    result = defs.get_task_id.enqueue()
    assert _run_capturing() == []
    result.refresh()
    assert result.return_value == result.id


def test_a_context_task_asking_for_its_attempts_gets_them_with_one_read() -> None:
    info = defs.context_info.enqueue(1)
    reads = _run_capturing("w2")
    assert len(reads) == 1  # attempt, worker_ids: one read fills every history field
    info.refresh()
    assert info.return_value == {"id": info.id, "attempt": 1, "status": "RUNNING", "workers": ["w2"]}


def test_a_receiver_reading_the_history_gets_it_as_before() -> None:
    def read(r: Any) -> Any:
        return (r.status, r.attempts, list(r.worker_ids), [e.exception_class for e in r.errors],
                r.started_at is not None and r.started_at <= r.last_attempted_at)

    result = defs.fail_first_attempt.enqueue({"v": 2})
    with _Receivers(read) as rec:
        run_one("w1")
        run_one("w2")
    assert rec.seen == [
        ("started", (TaskResultStatus.RUNNING, 1, ["w1"], [], True)),
        ("finished", (TaskResultStatus.READY, 1, ["w1"], [], True)),
        ("started", (TaskResultStatus.RUNNING, 2, ["w1", "w2"], [ConnectionError], True)),
        ("finished", (TaskResultStatus.SUCCESSFUL, 2, ["w1", "w2"], [ConnectionError], True)),
    ]
    result.refresh()
    assert result.return_value == {"v": 2} and result.worker_ids == ["w1", "w2"]


def test_the_result_carries_the_task_as_enqueued_without_building_a_new_one() -> None:
    tasks = []
    with _Receivers(lambda r: tasks.append(r.task)):
        defs.noop_task.enqueue()
        run_one()
        defs.noop_task.using(priority=7, queue_name="queue_1").enqueue()
        run_one()
        defs.noop_task.using(priority=7, queue_name="queue_1").enqueue()
        run_one()
    plain, varied, again = tasks[0], tasks[2], tasks[4]
    assert plain is defs.noop_task  # the job's options are the task's own: the task itself
    assert (varied.priority, varied.queue_name, varied.func) == (7, "queue_1", defs.noop_task.func)
    assert again is varied  # the same options again: the same (immutable) Task, not a new one


def test_a_lazy_result_behaves_as_a_task_result() -> None:
    defs.fail_first_attempt.enqueue({"v": 3})
    run_one("w1")
    kept = []
    with _Receivers(kept.append):
        run_one("w2")
    started = kept[0]
    assert isinstance(started, LazyHistoryResult)
    copy = pickle.loads(pickle.dumps(started))  # reads the history: a pickle holds every field
    assert (copy.worker_ids, copy.attempts, copy.status) == (["w1", "w2"], 2, started.status)
    replaced = dataclasses.replace(started, status=TaskResultStatus.READY)
    assert replaced.worker_ids == ["w1", "w2"] and replaced.status == TaskResultStatus.READY
    with pytest.raises(dataclasses.FrozenInstanceError):
        started.worker_ids = []  # type: ignore[misc]
    started.refresh()  # what the framework's refresh() writes goes through too
    assert started.status == TaskResultStatus.SUCCESSFUL and started.worker_ids == ["w1", "w2"]
    assert started.return_value == {"v": 3}


def test_a_task_checked_once_is_checked_again_under_new_settings(settings) -> None:
    defs.noop_task.enqueue()
    defs.noop_task.enqueue()  # remembered as valid by this backend: not validated again
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["queue_1"]}}  # a new backend instance
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match="Queue 'default' is not valid"):
        defs.noop_task.enqueue()


def test_arguments_still_round_trip_with_and_without_any() -> None:
    empty = defs.echo.enqueue()
    some = defs.echo.enqueue((1, 2), when={3: "x"})
    assert (empty.args, empty.kwargs) == ([], {})
    assert (some.args, some.kwargs) == ([[1, 2]], {"when": {"3": "x"}})  # as a worker sees them (JSON)


def test_an_async_context_task_still_sees_its_attempts() -> None:
    # It reads its context inside the event loop async_to_sync runs it in, where the ORM may not query.
    result = defs.context_info_async.enqueue()
    assert len(_run_capturing("w1")) == 1  # read up front for such a task
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == {"attempt": 1, "workers": ["w1"], "errors": 0}


def test_an_async_receiver_still_gets_the_history() -> None:
    seen = []

    async def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((task_result.status, task_result.worker_ids, task_result.attempts))

    defs.calculate_meaning_of_life.enqueue()
    task_finished.connect(on_finished)
    try:
        run_one("w1")
    finally:
        task_finished.disconnect(on_finished)
    assert seen == [(TaskResultStatus.SUCCESSFUL, ["w1"], 1)]


def test_the_worker_result_is_the_one_the_constructor_builds() -> None:
    # The worker builds its RUNNING result without the dataclass constructor (running_result): every
    # field the constructor sets must be set, to the same value, for a task with options and arguments.
    from django_sqlqueue.models import Job
    from django_sqlqueue.tasks.backend import _FAST_RESULT, build_result, running_result

    assert _FAST_RESULT  # this Django's TaskResult has the fields running_result sets (else the slow path)
    defs.echo.using(priority=3, queue_name="queue_1").enqueue([1, {"a": None}], when={"k": [2.5, "x"]})
    job = Job.objects.claim("w1", 1)[0]
    task = defs.echo
    fast = running_result(task, job, job.payload, "default")
    slow = build_result(task, job, backend_alias="default", lazy=True)
    assert type(fast) is type(slow) is LazyHistoryResult
    for f in dataclasses.fields(slow):
        assert getattr(fast, f.name) == getattr(slow, f.name), f.name
    assert fast.status == TaskResultStatus.RUNNING and fast.attempts == 1 and fast.worker_ids == ["w1"]
    assert (fast.task.priority, fast.task.queue_name) == (3, "queue_1")
    assert fast.args is not job.payload["args"]  # the result's lists are its own, as the constructor's


class _CountSends:
    """Counts ``send`` calls of task_started / task_finished (Django's receivers stay connected)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[str] = []
        for name, sig in (("started", task_started), ("finished", task_finished)):
            monkeypatch.setattr(sig, "send", self._counting(name, sig.send))

    def _counting(self, name: str, send: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.sent.append(name)
            return send(*args, **kwargs)
        return counted


def _tasks_log_level(monkeypatch: pytest.MonkeyPatch, level: int) -> None:
    import logging

    monkeypatch.setattr(logging.getLogger("django.tasks"), "level", level)
    logging.getLogger("django.tasks").manager._clear_cache()


def test_signals_nobody_would_hear_are_not_sent(monkeypatch, caplog) -> None:
    # Only Django's own log receivers listen and their logger drops INFO: sending would do nothing.
    import logging

    _tasks_log_level(monkeypatch, logging.WARNING)
    count = _CountSends(monkeypatch)
    result = defs.noop_task.enqueue()
    run_one()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert count.sent == []
    # A FAILED run's task_finished is logged at ERROR by Django's receiver: still sent, still logged.
    with caplog.at_level(logging.WARNING, logger="django.tasks"):
        failed = defs.complex_return_value.enqueue()  # a return value JSON cannot hold: not retried
        run_one()
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED and count.sent == ["finished"]
    retried = defs.failing_task_value_error.enqueue()  # READY again: Django would log that at INFO
    run_one()
    retried.refresh()
    assert retried.status == TaskResultStatus.READY and count.sent == ["finished"]
    assert [(r.levelname, str(failed.id) in r.getMessage()) for r in caplog.records] == [("ERROR", True)]


def test_signals_are_sent_when_their_log_lines_are_kept_or_someone_else_listens(monkeypatch, caplog) -> None:
    import logging

    _tasks_log_level(monkeypatch, logging.INFO)
    count = _CountSends(monkeypatch)
    with caplog.at_level(logging.INFO, logger="django.tasks"):
        result = defs.noop_task.enqueue()
        run_one()
    assert count.sent == ["started", "finished"]
    assert [r.getMessage().split()[-1] for r in caplog.records if str(result.id) in r.getMessage()] == [
        "state=RUNNING", "state=SUCCESSFUL"]
    _tasks_log_level(monkeypatch, logging.WARNING)
    count.sent.clear()
    with _Receivers(lambda r: r.status) as rec:  # a receiver of our own: Django's log level does not matter
        defs.noop_task.enqueue()
        run_one()
    assert count.sent == ["started", "finished"]
    assert rec.seen == [("started", TaskResultStatus.RUNNING), ("finished", TaskResultStatus.SUCCESSFUL)]


def test_signals_whose_log_lines_every_handler_drops_are_not_sent(monkeypatch, settings, request) -> None:
    # Django's default LOGGING (which the test project keeps): "django" logs INFO to a console handler
    # that RequireDebugTrue filters and to mail_admins at ERROR. With DEBUG off, no handler emits the
    # task's INFO lines. (pytest's own capture handlers on the root logger are set aside here.)
    import logging

    from django_sqlqueue.tasks.runner import _heard, forget_heard

    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    forget_heard()  # the answer of a walk is kept for a second (and dropped when a setting changes)
    request.addfinalizer(forget_heard)  # not this test's handlers for the next test's runs
    _tasks_log_level(monkeypatch, logging.NOTSET)
    tasks_log = logging.getLogger("django.tasks")
    assert tasks_log.isEnabledFor(logging.INFO)  # the records would be built: INFO is enabled
    count = _CountSends(monkeypatch)
    settings.DEBUG = False
    assert not _heard(tasks_log, logging.INFO) and _heard(tasks_log, logging.ERROR)  # mail_admins
    defs.noop_task.enqueue()
    run_one()
    assert count.sent == []
    settings.DEBUG = True  # the console handler now prints them: sent
    assert _heard(tasks_log, logging.INFO)
    defs.noop_task.enqueue()
    run_one()
    assert count.sent == ["started", "finished"]
    settings.DEBUG = False
    kept = logging.StreamHandler()  # a handler of the project's own at INFO: sent
    monkeypatch.setattr(logging.getLogger("django"), "handlers", [*logging.getLogger("django").handlers, kept])
    assert _heard(tasks_log, logging.INFO)
    kept.addFilter(lambda record: False)  # any filter but Django's two counts as possibly passing
    assert _heard(tasks_log, logging.INFO)
