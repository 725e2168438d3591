"""Vendor SQL, one module per vendor. :func:`get_dialect` is the one place that branches on vendor."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from ..exceptions import UnsupportedDatabase
from .base import COL, JOB_COLUMNS, ClaimRequest, Dialect
from .wake import (
    LOOK_MARK,
    LOOK_SEP,
    WAKE_ALL,
    hello_host,
    hello_payload,
    is_look,
    look_interval,
    look_jobs,
    look_stamp,
    look_wakes,
    wake_payload,
    wakes,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["COL", "JOB_COLUMNS", "ClaimRequest", "Dialect", "get_dialect", "dialect_class", "capabilities",
           "retrying", "TRANSIENT_RETRIES", "LOOK_MARK", "LOOK_SEP", "WAKE_ALL", "hello_host", "hello_payload", "is_look",
           "look_interval", "look_jobs", "look_stamp", "look_wakes", "wake_payload", "wakes"]

#: Tries of a statement path that lost a deadlock (or a lock timeout, a snapshot conflict).
TRANSIENT_RETRIES = 5


def dialect_class(vendor: str) -> type[Dialect]:
    """The dialect class for a Django ``connection.vendor``; ImproperlyConfigured for others."""
    if vendor == "postgresql":
        from .postgresql import PostgresDialect

        return PostgresDialect
    if vendor == "sqlite":
        from .sqlite import SqliteDialect

        return SqliteDialect
    if vendor == "microsoft":
        from .mssql import MssqlDialect

        return MssqlDialect
    raise UnsupportedDatabase(
        f"django-sqlqueue supports SQL Server (mssql-django), PostgreSQL and SQLite; "
        f"this database's vendor is {vendor!r}"
    )


def capabilities(vendor: str) -> type[Dialect]:
    """The dialect class for ``vendor``, or the base :class:`Dialect` (every capability off, no CHECK of
    its own) for a vendor the queue does not support: for questions asked where such a vendor is not
    this question's error (a system check, the LISTEN database, a model field's DDL)."""
    try:
        return dialect_class(vendor)
    except UnsupportedDatabase:
        return Dialect


def get_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect for ``connection``, kept on the connection object itself.

    Stored as an attribute rather than in a module-level cache so that it lives and dies with the
    connection (Django opens one per thread): no growth in long-running multi-threaded processes.
    """
    dialect = getattr(connection, "_sqlqueue_dialect", None)
    if dialect is None:
        dialect = dialect_class(connection.vendor)(connection)
        connection._sqlqueue_dialect = dialect  # type: ignore[attr-defined]
    return dialect


def retrying[T](alias: str, work: Callable[[], T], tries: int = TRANSIENT_RETRIES) -> T:
    """``work()``, run again (after 10, 20, 40 ms ...) while it fails with an error the dialect calls
    transient: a deadlock victim (SQL Server 1205), a lock timeout, a snapshot update conflict.

    For the by-id writes that can meet the claim in the opposite lock order on SQL Server (modify, cancel,
    a workflow's release, lease and permit renewal; see docs/sqlserver.md): the claim runs at
    ``DEADLOCK_PRIORITY LOW`` and is the usual victim, but two writers of equal priority are chosen
    between by cost. ``work`` must be its own transaction (an ``atomic()`` block or one autocommit
    statement): a victim's transaction is rolled back whole, so running it again is safe. Inside the
    caller's transaction nothing is retried (the caller's earlier work is gone too): the error is raised.
    """
    connection = connections[alias]
    for attempt in range(tries):
        try:
            return work()
        except DatabaseError as exc:
            if (attempt == tries - 1 or connection.in_atomic_block
                    or not get_dialect(connection).is_retryable_error(exc)):
                raise
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
