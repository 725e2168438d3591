"""``ENGINE = "testproject.babelfish"``: mssql-django with two Babelfish gaps papered over (tests only).

- ``ALTER TABLE ... ALTER COLUMN ... [NOT] NULL`` is refused: the nullability clause is dropped (the type
  change still happens; the column keeps its nullability).
- ``ALTER DATABASE ... SET SINGLE_USER`` is refused: the test database is dropped without it.
"""

from __future__ import annotations

import re
from typing import Any

from mssql.base import DatabaseWrapper as MssqlDatabaseWrapper
from mssql.creation import DatabaseCreation as MssqlDatabaseCreation
from mssql.schema import DatabaseSchemaEditor as MssqlSchemaEditor

# "ALTER TABLE [t] ALTER COLUMN [c] <type> NULL" / "... NOT NULL", as one statement or inside a batch.
_NULLABILITY = re.compile(r"(ALTER COLUMN \[[^\]]+\] [^;]*?) (?:NOT )?NULL(?=;|$|\s*ALTER TABLE)", re.IGNORECASE)


class DatabaseSchemaEditor(MssqlSchemaEditor):
    def execute(self, sql: Any, params: Any = (), has_result: bool = False) -> Any:
        return super().execute(_NULLABILITY.sub(r"\1", str(sql)), params, has_result)


class DatabaseCreation(MssqlDatabaseCreation):
    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        with self.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {self.connection.ops.quote_name(test_database_name)}")


class DatabaseWrapper(MssqlDatabaseWrapper):
    SchemaEditorClass = DatabaseSchemaEditor
    creation_class = DatabaseCreation
