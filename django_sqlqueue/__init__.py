"""django-sqlqueue: a reliable, fast job queue in your own SQL tables (SQL Server, PostgreSQL, SQLite).

Public API::

    import django_sqlqueue as sqlqueue

    @sqlqueue.handler("SendEmail")
    def send_email(job): ...

    sqlqueue.enqueue("SendEmail", {"to": "a@example.com"}, delay=30)
    Job.objects.enqueue_many([sqlqueue.JobSpec("SendEmail", {"to": "b@example.com"}), ...])
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .exceptions import (
    IllegalTransition,
    InvalidArgument,
    InvalidPayload,
    JobNotFound,
    SqlQueueConfigError,
    SqlQueueError,
    StaleJob,
    SubtypeMismatch,
    UnknownJobType,
    UnsupportedDatabase,
)
from .handlers import handler, registry
from .states import Status

if TYPE_CHECKING:
    from .models import Job

__version__ = "0.1.0"

__all__ = [
    "IllegalTransition",
    "InvalidArgument",
    "InvalidPayload",
    "JobNotFound",
    "SqlQueueConfigError",
    "SqlQueueError",
    "StaleJob",
    "Status",
    "SubtypeMismatch",
    "UnknownJobType",
    "UnsupportedDatabase",
    "Retry",
    "Cancel",
    "Fail",
    "JobContext",
    "JobSpec",
    "signals",
    "__version__",
    "enqueue",
    "handler",
    "registry",
]


_LAZY = {"Retry": "worker.runner", "Cancel": "worker.runner", "Fail": "worker.runner", "JobContext": "worker.runner",
         "JobSpec": "queue",
         "signals": None}


def __getattr__(name: str) -> Any:
    """Lazy exports: these modules import models, which must wait until Django's apps are ready."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
        return module if _LAZY[name] is None else getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """``dir(django_sqlqueue)`` lists the lazily loaded names too (Retry, Cancel, Fail, JobSpec...)."""
    return sorted({*globals(), *__all__})


def enqueue(
    job_type: str,
    payload: Any = None,
    *,
    queue: str = "default",
    priority: int = 0,
    scheduled_for: datetime | None = None,
    delay: float | timedelta | None = None,
    dedupe_key: str | None = None,
    max_attempts: int | None = None,
    subtypes: Sequence[Any] = (),
    after: Sequence[Any] = (),
    on_dependency_failure: str = "cancel",
    batch: Any = None,
    using: str | None = None,
    concurrency_key: str | int | None = None,
) -> Job:
    """Enqueue one job of ``job_type`` (a registered handler's name) with a JSON ``payload``; return it.

    Shortcut for :meth:`django_sqlqueue.queue.JobManager.enqueue` (``Job.objects.enqueue``), whose
    options it spells out: ``queue`` (a worker's ``-q``), ``priority`` (higher first), when to run
    (``scheduled_for`` or ``delay`` seconds), ``dedupe_key`` (one unfinished job per key),
    ``max_attempts``, ``subtypes`` (typed rows stored with it), ``after`` / ``on_dependency_failure`` /
    ``batch`` (docs/workflows.md), ``using`` (a database alias) and ``concurrency_key`` (docs/limits.md).
    """
    from .models import Job

    return Job.objects.enqueue(job_type, payload, queue=queue, priority=priority, scheduled_for=scheduled_for,
                               delay=delay, dedupe_key=dedupe_key, max_attempts=max_attempts, subtypes=subtypes,
                               after=after, on_dependency_failure=on_dependency_failure, batch=batch, using=using,
                               concurrency_key=concurrency_key)
