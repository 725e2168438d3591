"""Settings for the tests and the demo.

The database comes from ``SQLQUEUE_DATABASE_URL``:
- unset: an SQLite file ``db.sqlite3`` in the repository (the demo's embedded default);
- ``sqlite:////abs/path.db``;
- ``postgres://user:password@host:port/name``, optionally with Django's backend options as query
  parameters, e.g. ``?server_side_binding=true`` (values ``true``/``false`` and integers are converted);
- ``mssql://user:password@host:port/name`` (mssql-django with the mssql-python driver).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-test-key-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_admin_listfilter_dropdown",
    "django_sqlqueue",
    "testproject.notifications",
    "testproject.testjobs",
    "testproject.soakjobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "testproject.wsgi.application"


def _option(value: str) -> bool | int | str:
    """A URL query value as a backend option: ``true``/``false`` to bool, digits to int."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return int(value) if value.isdigit() else value


def database_from_url(url: str) -> dict:
    """A DATABASES entry from a URL (see the module docstring)."""
    if not url:
        url = f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        name = unquote(parsed.path)
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            # WAL lets readers run beside the one writer; IMMEDIATE makes every atomic() take the write
            # lock up front (no mid-transaction upgrade failures); timeout is how long a writer waits.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            "TEST": {"NAME": os.environ.get("SQLQUEUE_SQLITE_TEST_NAME", str(Path(name).with_suffix(".test.sqlite3")))},
        }
    common = {
        "NAME": unquote(parsed.path.lstrip("/")),
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
    }
    if parsed.scheme in ("postgres", "postgresql"):
        options = {key: _option(value) for key, value in parse_qsl(parsed.query)}
        return {"ENGINE": "django.db.backends.postgresql", "CONN_HEALTH_CHECKS": True, **common,
                **({"OPTIONS": options} if options else {})}
    if parsed.scheme == "mssql":
        return {
            # SQLQUEUE_MSSQL_ENGINE: the tds test stage sets "testproject.babelfish" (mssql-django plus the
            # test harness's workaround for a Babelfish gap; see that module). A real SQL Server: "mssql".
            "ENGINE": os.environ.get("SQLQUEUE_MSSQL_ENGINE", "mssql"),
            **common,
            # SQLQUEUE_MSSQL_TEST_NAME: the test database (each tds test session names its own).
            **({"TEST": {"NAME": os.environ["SQLQUEUE_MSSQL_TEST_NAME"]}} if os.environ.get("SQLQUEUE_MSSQL_TEST_NAME")
               else {}),
            "OPTIONS": {
                "python_driver": "mssql_python",
                "extra_params": os.environ.get("SQLQUEUE_MSSQL_EXTRA", "Encrypt=yes;TrustServerCertificate=yes"),
            },
        }
    raise ValueError(f"unsupported SQLQUEUE_DATABASE_URL scheme {parsed.scheme!r}")


DATABASES = {"default": database_from_url(os.environ.get("SQLQUEUE_DATABASE_URL", ""))}
# SQLQUEUE_LISTEN_DATABASE_URL: a second alias, "listen", that workers LISTEN through
# (SQLQUEUE["LISTEN_DATABASE"]): a direct connection while "default" goes through PgBouncer.
if os.environ.get("SQLQUEUE_LISTEN_DATABASE_URL"):
    DATABASES["listen"] = database_from_url(os.environ["SQLQUEUE_LISTEN_DATABASE_URL"])


AUTH_PASSWORD_VALIDATORS: list = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend", "QUEUES": ["default", "emails"]}}

SQLQUEUE = {
    # Fast retries keep the demo and the tests short; production keeps the defaults.
    "BACKOFF_BASE_SECONDS": float(os.environ.get("SQLQUEUE_BACKOFF_BASE", "1")),
    "BACKOFF_MAX_SECONDS": 60.0,
    # Process-level tests of pauses and partitions shorten the liveness timings (never set in production).
    **({"WORKER_DEAD_AFTER_SECONDS": float(os.environ["SQLQUEUE_TEST_DEAD_AFTER"]),
        "HEARTBEAT_SECONDS": float(os.environ.get("SQLQUEUE_TEST_HEARTBEAT", "0.2"))}
       if os.environ.get("SQLQUEUE_TEST_DEAD_AFTER") else {}),
    **({"LISTEN_DATABASE": "listen"} if "listen" in DATABASES else {}),
    # Schedule tests: declared schedules (JSON) and how often workers look for due ones.
    **({"SCHEDULES": json.loads(os.environ["SQLQUEUE_TEST_SCHEDULES"])} if os.environ.get("SQLQUEUE_TEST_SCHEDULES") else {}),
    **({"SCHEDULES_CHECK_SECONDS": float(os.environ["SQLQUEUE_TEST_SCHEDULES_CHECK"])}
       if os.environ.get("SQLQUEUE_TEST_SCHEDULES_CHECK") else {}),
    # Maintenance tests: a short lease, so a dead holder's lease runs out within seconds.
    **({"MAINTENANCE_LEASE_SECONDS": float(os.environ["SQLQUEUE_TEST_MAINTENANCE_LEASE"])}
       if os.environ.get("SQLQUEUE_TEST_MAINTENANCE_LEASE") else {}),
    # Session liveness (on by default): "0" turns it off for a test's worker processes.
    **({"SESSION_LIVENESS": os.environ["SQLQUEUE_TEST_SESSION_LIVENESS"] != "0"}
       if os.environ.get("SQLQUEUE_TEST_SESSION_LIVENESS") else {}),
    # Retention (JSON, e.g. {"Completed": "30s"}): bench/sustained.py runs its workers with it.
    **({"RETENTION": json.loads(os.environ["SQLQUEUE_TEST_RETENTION"])} if os.environ.get("SQLQUEUE_TEST_RETENTION")
       else {}),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"django_sqlqueue": {"handlers": ["console"], "level": os.environ.get("SQLQUEUE_LOG_LEVEL", "WARNING")},
                # Maintenance tests read which worker ran which pass (DEBUG lines of this logger only).
                **({"django_sqlqueue.maintenance": {"level": "DEBUG"}} if os.environ.get("SQLQUEUE_TEST_MAINTENANCE_DEBUG")
                   else {})},
}
