"""Small helpers shared by the worker, its heartbeat thread and the supervisor."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.db.models import Case, IntegerField, Q, Value, When
from django.db.models.expressions import RawSQL

from ..dialects import get_dialect
from ..states import Status

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


def lease_ran_out(using: str) -> Case:
    """1 if a limited job is Processing with a lease past the database clock, else 0, as an ORM
    expression: after a renewal that did not extend it (``Dialect.permit_guard_sql``, which refuses only
    limited jobs), the job is lost to its holder. (An integer, not a boolean: SQL Server selects no bare
    comparison.)"""
    return Case(When(Q(status_id=int(Status.PROCESSING), limited=True, lease_expires_at__lt=db_now(using)),
                     then=Value(1)), default=Value(0), output_field=IntegerField())


def send(sig: Any, sender: type, **kwargs: Any) -> None:
    """Send a :mod:`django_sqlqueue.signals` signal robustly (a failing receiver is only logged).

    ``sender`` is always the :class:`~django_sqlqueue.worker.Worker` class (signals.py): the callers pass
    it, so that this module, below the worker, does not import it.
    """
    if not sig.has_listeners():
        return
    for receiver, result in sig.send_robust(sender=sender, **kwargs):
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
    got = _stat(pid)
    return got is None or got[0] != "Z"  # unreadable /proc: alive for all we know


# ----- process identity: is a worker of this host gone? ---------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks after boot) from /proc/<pid>/stat (fields 3 and 22); None when
    it cannot be read (no such process, no /proc, or hidden)."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(") ", 1)[-1].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _start_ticks(pid: int) -> str | None:
    """The start time of a live (not zombie) process ``pid``, or None."""
    got = _stat(pid)
    return got[1] if got is not None and got[0] != "Z" else None


def _namespace() -> str | None:
    """This machine's boot and this process's PID namespace: pids compare only within both."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot}:{pidns}" if boot else None


def process_key(pid: int | None = None) -> str:
    """``boot id:pid namespace:pid:start ticks`` of a process of ours ("" where /proc is missing).

    Stored on the worker row, it lets another worker of the same host tell, without waiting for the
    heartbeat to go stale, that the process is gone: its pid no longer exists, or was reused by a
    process that started at another time. Containers sharing a hostname have their own PID namespace
    (or boot id) and never judge each other's pids.
    """
    pid = pid or os.getpid()
    own = _read("/proc/self/stat")
    if own is None or own.split(" ", 1)[0] != str(os.getpid()):
        return ""  # a /proc of another PID namespace is mounted here: its pids are not ours to judge
    space, start = _namespace(), _start_ticks(pid)
    return f"{space}:{pid}:{start}" if space and start else ""


def process_gone(key: str) -> bool:
    """True only when ``key`` (see :func:`process_key`) names a process of this boot and PID namespace
    that no longer runs; False when it runs or when this process cannot tell (another host, another
    namespace, no /proc)."""
    space = _namespace()
    if not key or not space or not key.startswith(space + ":"):
        return False
    try:
        pid_text, start = key[len(space) + 1:].split(":")
        pid = int(pid_text)
    except ValueError:
        return False
    if not pid_alive(pid):
        return True  # no such process, or a zombie
    got = _stat(pid)
    return got is not None and got[1] != start  # other start ticks: the pid was reused
