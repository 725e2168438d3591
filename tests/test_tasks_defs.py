"""Django Tasks used by the task-backend tests, and :func:`run_one` (no tests here).

Worker subprocesses import these by path (``tests.test_tasks_defs.<name>``), so this module imports
nothing from pytest. Every task is declared with the framework's defaults (queue "default", priority 0,
no run_after), so it validates against whichever backend the importing process has configured; tests
pick options with ``.using(...)``. None of the names starts with ``test`` (pytest would collect them).
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.tasks import TaskContext, task

from django_sqlqueue import Status


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": args, "kwargs": kwargs}


@task()
async def echo_async(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": args, "kwargs": kwargs, "async": True}


@task()
def failing_task_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    return {"when": datetime(2025, 1, 1)}


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def context_info(context: TaskContext, attempt: int) -> dict[str, Any]:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt, (context.attempt, attempt)
    r = context.task_result
    return {"id": r.id, "attempt": context.attempt, "status": str(r.status), "workers": r.worker_ids}


@task(takes_context=True)
async def context_info_async(context: TaskContext) -> dict[str, Any]:
    r = context.task_result
    return {"attempt": context.attempt, "workers": r.worker_ids, "errors": len(r.errors)}


@task(takes_context=True)
def fail_first_attempt(context: TaskContext, value: Any) -> Any:
    if context.attempt == 1:
        raise ConnectionError("transient failure on the first attempt")
    return value


@task()
def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def not_a_task() -> None:  # a plain function: its path is not a task
    return None


def run_one(worker: str = "w1") -> Any:
    """Claim one due job and run it as a worker slot does; return the job as stored afterwards (or None).

    Uses the worker's own :func:`django_sqlqueue.runner.run` (handler lookup, steps, classification) and
    records the outcome through the manager the way the worker does, without a heartbeat thread, so it
    works inside a test's transaction. Round trips through a real worker process are in
    tests/test_tasks_worker.py and tests/test_example_app_worker.py.
    """
    from django_sqlqueue.handlers import registry
    from django_sqlqueue.models import Job, JobType
    from django_sqlqueue.worker import runner

    claimed = Job.objects.claim(worker, 1)
    if not claimed:
        return None
    handler = registry.get(JobType.objects.get(pk=claimed[0].job_type_id).name)
    outcome = runner.run(runner.JobContext(claimed[0], handler, worker))
    job, kind = outcome.job, outcome.kind
    if kind is runner.Kind.SUCCESS:
        return Job.objects.complete(job, response=outcome.response)
    if kind in (runner.Kind.ERROR, runner.Kind.RETRY):
        return Job.objects.fail(job, outcome.error, retry_in=0 if outcome.retry_in is None else outcome.retry_in)
    status = Status.CANCELLED if kind is runner.Kind.CANCEL else Status.FAILED
    return Job.objects.modify(job, job.version, status, error=outcome.error)


def test_the_registry_asks_its_resolvers_once_per_unknown_name() -> None:
    from django_sqlqueue.handlers import Registry

    asked: list[str] = []

    def resolver(name: str):
        asked.append(name)
        return None

    reg = Registry()
    reg.add_resolver(resolver)
    assert not reg.is_registered("pkg.missing") and not reg.is_registered("pkg.missing")
    assert asked == ["pkg.missing"]  # the miss is remembered: no import attempt per enqueue
    reg.register("pkg.missing", lambda job: None)  # a handler registered later is found at once
    assert reg.is_registered("pkg.missing")
    reg.unregister("pkg.missing")
    reg.add_resolver(lambda name: None)  # a new resolver may know it: ask again
    assert not reg.is_registered("pkg.missing")
    assert asked == ["pkg.missing", "pkg.missing"]


@task()
def give_back(value: Any) -> Any:
    """Returns its argument: scalars (42, "done", True, None) are stored as the job's response as they are."""
    return value
