"""Small helpers shared by the worker, its heartbeat thread and the supervisor."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.db.models.expressions import RawSQL

from .dialects import get_dialect

log = logging.getLogger("django_sqlqueue.worker")

#: Errors that mean "the database connection is gone or the database is unavailable": retried.
DB_DOWN_ERRORS = (OperationalError, InterfaceError)


def configure_logging(level: str | None) -> None:
    """Apply ``--log-level`` to the ``django_sqlqueue`` loggers; add a stderr handler if none is set up."""
    logger = logging.getLogger("django_sqlqueue")
    if level:
        logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)


def db_now(using: str) -> RawSQL:
    """The database clock as an ORM expression: heartbeats are compared with it by the claim."""
    return RawSQL(get_dialect(connections[using]).now(), [])


def send(sig: Any, **kwargs: Any) -> None:
    """Send a :mod:`django_sqlqueue.signals` signal robustly (a failing receiver is only logged)."""
    if not sig.has_listeners():
        return
    from .worker import Worker

    for receiver, result in sig.send_robust(sender=Worker, **kwargs):
        if isinstance(result, Exception):
            log.error("signal_receiver_failed receiver=%r error=%s", receiver, one_line(result))


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def close_connection(using: str) -> None:
    try:
        connections[using].close()
    except Exception:  # closing a broken connection may itself fail; it is gone either way
        pass


def tidy_connections() -> None:
    """Between batches: close connections a handler broke or left outside autocommit.

    Django closes connections at the end of each request; a worker is one long "request", so it
    keeps its connection (reconnecting per job would cost more than the job) but drops it as soon as
    it is unusable, and honours a positive ``CONN_MAX_AGE``.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"] or (conn.errors_occurred and not conn.is_usable()):
            conn.close()
            continue
        conn.errors_occurred = False
        if conn.settings_dict.get("CONN_MAX_AGE") and conn.close_at is not None and time.monotonic() >= conn.close_at:
            conn.close()


def pid_alive(pid: int | None) -> bool:
    """Is process ``pid`` of this host alive (a zombie counts as dead)?"""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(") ", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
