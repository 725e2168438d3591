"""System checks: supported vendor, USE_TZ, SQLite version, settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from .conf import get_settings
from .dialects import dialect_class
from .exceptions import SqlQueueConfigError


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_queue_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    try:
        qs = get_settings()
    except SqlQueueConfigError as exc:
        return [checks.Error(str(exc), id="sqlqueue.E001")]
    if qs.DATABASE not in settings.DATABASES:
        return [checks.Error(f"SQLQUEUE['DATABASE'] names {qs.DATABASE!r}, which is not in DATABASES",
                             id="sqlqueue.E002")]
    connection = connections[qs.DATABASE]
    try:
        dialect_class(connection.vendor)
    except SqlQueueConfigError as exc:
        errors.append(checks.Error(str(exc), id="sqlqueue.E003"))
    if not settings.USE_TZ:
        errors.append(checks.Error(
            "django-sqlqueue needs USE_TZ = True: the claim compares columns with the database's UTC clock",
            id="sqlqueue.E004"))
    if qs.LISTEN_DATABASE and qs.LISTEN_DATABASE not in settings.DATABASES:
        errors.append(checks.Error(f"SQLQUEUE['LISTEN_DATABASE'] names {qs.LISTEN_DATABASE!r}, which is not in "
                                   f"DATABASES", id="sqlqueue.E006"))
    elif (qs.LISTEN_DATABASE and connection.vendor == "postgresql"
          and connections[qs.LISTEN_DATABASE].vendor != "postgresql"):
        errors.append(checks.Error(f"SQLQUEUE['LISTEN_DATABASE'] names {qs.LISTEN_DATABASE!r}, a "
                                   f"{connections[qs.LISTEN_DATABASE].vendor} database: LISTEN needs PostgreSQL",
                                   id="sqlqueue.E007"))
    if connection.vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            errors.append(checks.Error(
                f"SQLite {sqlite3.sqlite_version} is too old: the claim needs UPDATE ... RETURNING (3.35+)",
                id="sqlqueue.E005"))
    return errors
