"""Model fields the queue's tables need beyond Django's own."""

from __future__ import annotations

from typing import Any

from django.db import models


class JSONValueField(models.JSONField):
    """A JSONField whose column takes any JSON value on every vendor: objects, arrays and scalars.

    mssql-django gives every JSONField ``CHECK (ISJSON(col) = 1)``, and SQL Server's ISJSON is 0 for a
    scalar (``42``, ``"done"``, ``true``, ``null``) before SQL Server 2022's ``ISJSON(x, VALUE)``: a handler
    or ``@task`` returning one would fail with a check violation. Wrapped in brackets any single JSON
    value is an array, so the check here keeps refusing most malformed text on SQL Server 2016 and later
    while taking every value ``json.dumps`` writes (see :func:`json_value_check`). Other vendors keep
    Django's own check (none).
    """

    def db_check(self, connection: Any) -> str | None:
        from .dialects import capabilities

        check = capabilities(connection.vendor).json_value_check(connection.ops.quote_name(self.column))
        return check if check is not None else super().db_check(connection)


def json_value_check(quoted_column: str) -> str:
    """The SQL Server check that ``quoted_column`` holds JSON of any kind (the SQL is the SQL Server
    dialect's, :meth:`MssqlDialect.json_value_check`; this name is kept for migration 0004)."""
    from .dialects.mssql import MssqlDialect

    return MssqlDialect.json_value_check(quoted_column)
