"""``ENGINE = "testproject.babelfish"``: mssql-django, dropping the test database without
``ALTER DATABASE ... SET SINGLE_USER``, which Babelfish refuses (tests only).

testproject/settings.py also builds django.contrib's tables from their models on this engine (Babelfish
refuses the ``ALTER COLUMN ... NULL`` their later migrations emit).
"""

from __future__ import annotations

from mssql.base import DatabaseWrapper as MssqlDatabaseWrapper
from mssql.creation import DatabaseCreation as MssqlDatabaseCreation


class DatabaseCreation(MssqlDatabaseCreation):
    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        with self.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {self.connection.ops.quote_name(test_database_name)}")


class DatabaseWrapper(MssqlDatabaseWrapper):
    creation_class = DatabaseCreation
