"""Django Tasks used by the task-backend tests (no tests here).

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
