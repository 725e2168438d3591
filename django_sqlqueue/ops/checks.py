"""System checks: supported vendor, USE_TZ, SQLite version, settings; job type rows against the code."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections

from ..conf import get_settings
from ..dialects import capabilities, dialect_class
from ..exceptions import SqlQueueConfigError


# No ``database`` tag: none of this opens a connection (the vendor and SQLite's version come from the
# backend module), so plain ``manage.py check`` and ``runserver`` report a misspelt setting at once
# instead of ``migrate`` or the worker's start. Checks that query the database keep the tag.
@checks.register(checks.Tags.compatibility)
def check_queue_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    try:
        qs = get_settings()
    except SqlQueueConfigError as exc:  # every problem of the dict, one message each
        return [checks.Error(problem, id="sqlqueue.E002" if "'DATABASE'] names" in problem else "sqlqueue.E001")
                for problem in exc.problems]
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
    elif (qs.LISTEN_DATABASE and capabilities(connection.vendor).can_listen
          and not capabilities(connections[qs.LISTEN_DATABASE].vendor).can_listen):
        errors.append(checks.Error(f"SQLQUEUE['LISTEN_DATABASE'] names {qs.LISTEN_DATABASE!r}, a "
                                   f"{connections[qs.LISTEN_DATABASE].vendor} database: LISTEN needs PostgreSQL",
                                   id="sqlqueue.E007"))
    too_old = capabilities(connection.vendor).version_problem()
    if too_old:
        errors.append(checks.Error(too_old, id="sqlqueue.E005"))
    if connection.vendor == "sqlite":
        errors.extend(sqlite_options_warnings(qs.DATABASE, settings.DATABASES[qs.DATABASE]))
    return errors


#: The SQLite OPTIONS the queue is built and measured with (README's quick start, docs/claim-sql.md).
SQLITE_OPTIONS = {"init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                  "transaction_mode": "IMMEDIATE", "timeout": 20}


def sqlite_options_warnings(alias: str, conf: dict[str, Any]) -> list[checks.CheckMessage]:
    """W020: the queue's SQLite database runs without the recommended OPTIONS (read from the settings:
    no connection opened). Without WAL a reader blocks the writer and the admin stalls workers; without
    IMMEDIATE an ``atomic()`` that reads first and writes later fails with "database is locked" instead of
    waiting; without a timeout (Django's default is 5 s) a busy moment turns into errors."""
    name = str(conf.get("NAME") or "")
    if name == ":memory:" or "mode=memory" in name:
        return []
    options = conf.get("OPTIONS") or {}
    missing = []
    if "journal_mode=wal" not in str(options.get("init_command", "")).lower().replace(" ", ""):
        missing.append("WAL (init_command 'PRAGMA journal_mode=WAL;')")
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        missing.append("transaction_mode 'IMMEDIATE'")
    if not isinstance(options.get("timeout"), int | float) or options["timeout"] < 5:
        missing.append("a timeout (seconds a writer waits for the lock, e.g. 20)")
    if not missing:
        return []
    return [checks.Warning(
        f"the queue's SQLite database {alias!r} runs without {', '.join(missing)}",
        hint=f"DATABASES[{alias!r}]['OPTIONS'] = {SQLITE_OPTIONS!r} (README, Quick start; docs/claim-sql.md)",
        id="sqlqueue.W020")]


@checks.register(checks.Tags.admin)
def check_admin_dependencies(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The job list's filters render with django-admin-list-filter-dropdown's templates.

    The package is a dependency of django-sqlqueue; its app must be installed wherever the admin is,
    or the job list fails with TemplateDoesNotExist.
    """
    from django.apps import apps

    if apps.is_installed("django.contrib.admin") and not apps.is_installed("django_admin_listfilter_dropdown"):
        return [checks.Error(
            "django_sqlqueue's admin needs 'django_admin_listfilter_dropdown' in INSTALLED_APPS "
            "(the job list's filters use its templates)",
            hint="Add 'django_admin_listfilter_dropdown' to INSTALLED_APPS (the package is installed "
                 "with django-sqlqueue).",
            id="sqlqueue.E008")]
    return []


@checks.register(checks.Tags.database)
def check_job_types_follow_code(app_configs: Any = None, databases: Any = None,
                                **kwargs: Any) -> list[checks.CheckMessage]:
    """Where a job type's row disagrees with its handler's options (``check --database default``).

    W010: an operator changed the setting on the row; the row wins. W011: the code changed and the
    row has not caught up yet (``migrate`` or a worker's start writes it).
    """
    from django.db import DatabaseError

    from ..handlers import compare, registry
    from ..models import JobType

    try:
        alias = get_settings().DATABASE
    except SqlQueueConfigError:
        return []  # reported by check_queue_database
    if not databases or alias not in databases:
        return []
    handlers = {h.name: h for h in registry.all()}
    try:
        rows = list(JobType.objects.using(alias).filter(name__in=list(handlers)))
    except DatabaseError:  # not migrated yet: migrate creates the rows from the code
        return []
    messages: list[checks.CheckMessage] = []
    for row in rows:
        options = {k: v for k, v in handlers[row.name].options.items() if v is not None}
        drift = compare(row, options)
        for key, (value, code) in drift.operator.items():
            messages.append(checks.Warning(
                f"job type {row.name!r}: {key} is {value!r} on its row, the handler says {code!r}; the row wins",
                hint="An operator changed it (admin, job types). Blank the field there to follow the code again.",
                obj=row.name, id="sqlqueue.W010"))
        for key, code in drift.follow.items():
            messages.append(checks.Warning(
                f"job type {row.name!r}: the handler says {key}={code!r}, its row still has "
                f"{getattr(row, key)!r}",
                hint="manage.py migrate (after its checks) or a worker's start writes the code's value to the row.",
                obj=row.name, id="sqlqueue.W011"))
    return messages
@checks.register(checks.Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Each bad ``SQLQUEUE["SCHEDULES"]`` entry, by name (no database needed): a worker skips it. A
    setting that is not a dict at all is one error (E202): a worker then syncs nothing and runs jobs."""
    from ..schedules import declared_errors, setting_error

    try:
        qs = get_settings()
    except SqlQueueConfigError:
        return []  # reported by check_queue_database
    if error := setting_error(qs.SCHEDULES):
        return [checks.Error(error, obj="SQLQUEUE['SCHEDULES']", id="sqlqueue.E202",
                             hint='Write SQLQUEUE["SCHEDULES"] = {"name": {"type": ..., "every": ...}, ...}.')]
    return [checks.Error(f"schedule {name!r}: {message}", obj="SQLQUEUE['SCHEDULES']", id="sqlqueue.E201")
            for name, message in declared_errors()]
