"""Django tasks for the comparison, run by django-tasks' database backend (``db_worker``)."""

from __future__ import annotations

from django.tasks import task

from .latency import record


@task()
def noop() -> None:
    return None


@task()
def latency(t: float) -> None:
    record(t)
