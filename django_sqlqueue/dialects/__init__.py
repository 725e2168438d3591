"""Vendor SQL, one module per vendor. :func:`get_dialect` is the one place that branches on vendor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import UnsupportedDatabase
from .base import COL, JOB_COLUMNS, ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["COL", "JOB_COLUMNS", "ClaimRequest", "Dialect", "get_dialect", "dialect_class"]


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


_cache: dict[int, Dialect] = {}


def get_dialect(connection: BaseDatabaseWrapper) -> Dialect:
    """The dialect for ``connection`` (cached per connection object: names do not change)."""
    key = id(connection)
    dialect = _cache.get(key)
    if dialect is None or dialect.connection is not connection:
        dialect = dialect_class(connection.vendor)(connection)
        _cache[key] = dialect
    return dialect
