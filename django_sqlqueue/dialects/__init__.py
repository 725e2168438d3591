"""Vendor SQL, one module per vendor. :func:`get_dialect` is the one place that branches on vendor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import UnsupportedDatabase
from .base import COL, JOB_COLUMNS, ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["COL", "JOB_COLUMNS", "ClaimRequest", "Dialect", "get_dialect", "dialect_class", "capabilities"]


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
