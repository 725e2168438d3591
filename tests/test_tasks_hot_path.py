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
from django_sqlqueue.tasks import LazyHistoryResult

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
