"""Django @task functions the schedule tests enqueue through the TASKS backend."""

from __future__ import annotations

from django.tasks import task


@task
def tick(label: str = "tick") -> str:
    return label


@task
def noop() -> None:
    """Does nothing: the Tasks twin of the ``test.Noop`` handler, for per-job cost comparisons."""


@task
def interrupted() -> None:
    """Raises KeyboardInterrupt (issue 32 item 13: the job must not stay Processing)."""
    raise KeyboardInterrupt("raised by the task itself")
