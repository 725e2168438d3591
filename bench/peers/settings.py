"""Settings shared by every system bench/compare.py measures: same database, same durability.

The database comes from ``BENCH_DATABASE_URL`` (sqlite:///path or postgres://...), parsed by the
test project's helper, so SQLite gets the same WAL + synchronous=NORMAL + IMMEDIATE options the
project's own tests use, whichever queue runs on it. procrastinate is PostgreSQL only, so it is
installed only when the database is PostgreSQL.
"""

from __future__ import annotations

import os

from testproject.settings import database_from_url

SECRET_KEY = "bench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": database_from_url(os.environ["BENCH_DATABASE_URL"])}
IS_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_sqlqueue",
    "django_tasks_db",
    "bench.peers",
]
if IS_POSTGRES:
    INSTALLED_APPS.insert(0, "procrastinate.contrib.django")

# django-tasks' database backend, as its README configures it; django-sqlqueue's Tasks backend next to
# it, so that the same @task runs through either (bench/peers/tasks.py: ``noop.using(backend="sqlqueue")``).
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]},
    "sqlqueue": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend", "QUEUES": ["default"]},
}

# procrastinate: tasks of this module only (the default autodiscovery of "tasks" modules stays on).
PROCRASTINATE_IMPORT_PATHS = ["bench.peers.pro_tasks"] if IS_POSTGRES else []

# django-sqlqueue: its production defaults (nothing tightened).
SQLQUEUE: dict = {}

# The root handler has no level of its own, so records that loggers with a lower level pass up to it are
# printed: Django's "django" logger is at INFO, and django.tasks' receivers of task_started/task_finished
# log an INFO line for every task run, printed here for every system (as with DEBUG = True in a default
# project). BENCH_QUIET_TASK_LOGS=1 gives the handler WARNING, which leaves those lines unprinted, as with
# Django's default LOGGING and DEBUG = False (bench/compare.py: ``--quiet-tasks-log``; docs/performance.md).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler",
                             **({"level": "WARNING"} if os.environ.get("BENCH_QUIET_TASK_LOGS") == "1" else {})}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
