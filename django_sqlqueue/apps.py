"""App config: autodiscovers ``jobs`` modules, syncs job types after migrate, registers checks."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save
from django.utils.module_loading import autodiscover_modules


class SqlQueueConfig(AppConfig):
    name = "django_sqlqueue"
    label = "django_sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers system checks)
        from .jobtypes import clear_cache
        from .models import JobType

        # Handlers live in each app's jobs.py, found the way the admin finds admin.py.
        autodiscover_modules("jobs")
        from .task_runner import install as install_task_resolver

        # Django tasks: the job type is the task's import path, resolved lazily in worker processes.
        install_task_resolver()
        post_save.connect(clear_cache, sender=JobType, dispatch_uid="sqlqueue-type-cache-save")
        post_delete.connect(clear_cache, sender=JobType, dispatch_uid="sqlqueue-type-cache-delete")
        post_migrate.connect(_sync_types, sender=self, dispatch_uid="sqlqueue-sync-types")
        from .metrics import connect_tracing

        connect_tracing()  # a span per job attempt when opentelemetry-api is installed; else nothing


def _sync_types(sender: Any, using: str = "default", **kwargs: Any) -> None:
    from .handlers import sync_job_types

    sync_job_types(using=using)
