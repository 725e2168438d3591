"""Django's Tasks framework (``django.tasks``, Django >= 6.0) on the queue.

``TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend"}}`` names the backend by this
package's path. The backend lives in :mod:`.backend`, which imports ``django.tasks``; :mod:`.runner`
(what the worker runs for a task job) must import on Django 5.2, where ``django.tasks`` does not exist,
so this package loads the backend only when asked for it.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "SqlQueueBackend":
        from .backend import SqlQueueBackend

        return SqlQueueBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
