"""App config: fills the queue's hooks with the features, autodiscovers ``jobs`` modules, syncs job
types after migrate, registers checks. The one module that wires the wings together (it imports
features, ops and tasks; nothing imports it)."""

from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save
from django.utils.module_loading import autodiscover_modules

log = logging.getLogger("django_sqlqueue")


class SqlQueueConfig(AppConfig):
    name = "django_sqlqueue"
    label = "django_sqlqueue"
    verbose_name = "SQL queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        _install_hooks()
        from .jobtypes import clear_cache
        from .models import JobType
        from .ops import checks  # noqa: F401  (registers system checks)

        # Handlers live in each app's jobs.py, found the way the admin finds admin.py.
        autodiscover_modules("jobs")
        from django.core.signals import setting_changed

        from .tasks.runner import forget_heard
        from .tasks.runner import install as install_task_resolver

        # Django tasks: the job type is the task's import path, resolved lazily in worker processes.
        install_task_resolver()
        setting_changed.connect(forget_heard, dispatch_uid="sqlqueue-forget-heard")
        post_save.connect(clear_cache, sender=JobType, dispatch_uid="sqlqueue-type-cache-save")
        post_save.connect(_sync_permits, sender=JobType, dispatch_uid="sqlqueue-permits-save")
        post_save.connect(_wake_for_type, sender=JobType, dispatch_uid="sqlqueue-type-wake")
        post_delete.connect(clear_cache, sender=JobType, dispatch_uid="sqlqueue-type-cache-delete")
        post_migrate.connect(_sync_types, sender=self, dispatch_uid="sqlqueue-sync-types")
        _register_task_checks()
        post_migrate.connect(_sync_schedules, sender=self, dispatch_uid="sqlqueue-sync-schedules")


def _install_hooks() -> None:
    """Fill the slots of django_sqlqueue.hooks: where the job's path (queue wing) calls a feature.

    Once per process, before any model is used: the queue then calls each slot directly, no lookup.
    """
    from . import hooks, limits, workflows
    from .ops import tracing

    hooks.release_permits = limits.release
    hooks.renew_permits = limits.renew
    hooks.ensure_permits = limits.ensure_for_enqueue
    hooks.follow_type_on_retry = limits.follow_type_on_retry
    hooks.normalise_dependencies = workflows.dependencies
    hooks.check_workflow_specs = workflows.check_specs
    hooks.link_workflow = workflows.link
    hooks.after_finish = workflows.after_finish
    hooks.tracing_enabled = tracing.enabled
    hooks.enqueue_span = tracing.enqueue_span


def _register_task_checks() -> None:
    """Make ``manage.py check`` validate the TASKS backends (SqlQueueBackend's sqlqueue.E1xx).

    Django registers its task checks when ``django.tasks`` is first imported, which in a project that
    has not used a task yet happens after ``check`` has run (a misspelt OPTIONS key passed ``check``
    and then every ``.enqueue()``). Importing it here, once the project configures TASKS, fixes that.
    """
    from django.conf import settings

    if getattr(settings, "TASKS", None):
        try:
            import django.tasks  # noqa: F401  (registers django.tasks.checks.check_tasks)
        except ImportError:  # Django < 6.0: no tasks framework
            pass


def _wake_for_type(sender: Any, instance: Any, using: str = "default", update_fields: Any = None,
                   **kwargs: Any) -> None:
    """A job type resumed or its limits changed (the admin's action or change form, code): its waiting
    jobs, due long ago, are claimable now, and the fleet's look names only jobs that came due lately:
    wake the workers (every queue: the type's jobs may be in any)."""
    if kwargs.get("raw") or kwargs.get("created") or instance.paused:
        return
    if update_fields is not None and not {"paused", "concurrency_limit", "rate_limit"} & set(update_fields):
        return
    from .dialects import WAKE_ALL
    from .queue.wakeups import wake_on_commit

    wake_on_commit(using, {WAKE_ALL})


def _sync_permits(sender: Any, instance: Any, using: str = "default", update_fields: Any = None,
                  **kwargs: Any) -> None:
    """A job type saved (admin, handler sync): its limit permits follow its limits (permits.sync_type)."""
    if kwargs.get("raw"):
        return  # loaddata
    if update_fields is not None and not {"concurrency_limit", "rate_limit"} & set(update_fields):
        return  # paused, code_options...: the limits did not change
    if kwargs.get("created") and instance.concurrency_limit is None and not instance.rate_limit:
        return  # a new type without limits: no job of it exists yet and it needs no permit
    from .limits import sync_type

    sync_type(instance, using)


def _sync_types(sender: Any, using: str = "default", verbosity: int = 1, **kwargs: Any) -> None:
    """After migrate: job type rows take the handlers' options (see handlers.sync_job_types)."""
    import sys

    from django.db import DatabaseError, router

    from .handlers import describe_overrides, sync_job_types
    from .models import JobType

    if not router.allow_migrate_model(using, JobType):
        return  # the queue's tables live in another database
    state_apps = kwargs.get("apps")
    if state_apps is not None:
        # After migrate: the migration state says which columns the job type table has now, without
        # asking the database's catalog (a flush emits this signal after every transactional test).
        try:
            state = state_apps.get_model("django_sqlqueue", "JobType")
        except LookupError:
            return  # migrated back to zero
        columns = {f.column for f in state._meta.concrete_fields}
        if any(f.column not in columns for f in JobType._meta.concrete_fields):
            return  # migrated back to before this version's job type columns: the rows cannot be read yet
    # Else a flush (no migration state): it emptied this schema's tables; no catalog query either.
    try:
        report = sync_job_types(using=using)
    except DatabaseError as exc:  # a flush of a database migrated back below this version's columns
        log.warning("job_types_not_synced database=%s error=%s", using, exc)
        return
    if verbosity:
        out = kwargs.get("stdout") or sys.stdout
        for line in describe_overrides(report):
            out.write(f"  django_sqlqueue: {line}\n")


def _sync_schedules(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """SQLQUEUE["SCHEDULES"] into the Schedule table (after the job types: a schedule names one)."""
    from django.db import DatabaseError

    from .conf import get_settings
    from .schedules import log, sync_schedules

    if using != get_settings().DATABASE:
        return
    try:
        sync_schedules(using)
    except DatabaseError as exc:  # e.g. migrated back below the schedules migration: nothing to sync into
        log.warning("schedules_not_synced error=%s", exc)
