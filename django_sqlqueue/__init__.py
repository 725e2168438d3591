"""django-sqlqueue: a reliable, fast job queue in your own SQL tables (SQL Server, PostgreSQL, SQLite).

Public API::

    import django_sqlqueue as sqlqueue

    @sqlqueue.handler("SendEmail")
    def send_email(job): ...

    sqlqueue.enqueue("SendEmail", {"to": "a@example.com"}, delay=30)
    Job.objects.enqueue_many([sqlqueue.JobSpec("SendEmail", {"to": "b@example.com"}), ...])
"""

from __future__ import annotations

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


def enqueue(job_type: str, payload: Any = None, **options: Any) -> Job:
    """Shortcut for ``Job.objects.enqueue``; see :meth:`django_sqlqueue.queue.JobManager.enqueue`."""
    from .models import Job

    return Job.objects.enqueue(job_type, payload, **options)
