"""A Django database backend for the test harness only: mssql-django, plus what Babelfish needs.

Babelfish for PostgreSQL (``../shared/babelfish``) is the TDS endpoint the ``tds`` test stage runs
on. It refuses ``ALTER TABLE ... ALTER COLUMN ... NULL`` / ``NOT NULL``, which mssql-django emits for
every ``AlterField``, so ``migrate`` of ``django.contrib.contenttypes`` and ``auth`` fails at their
later migrations. This backend drops the nullability clause from those statements (the column keeps
the nullability it had; its type change still happens). Nothing in ``django_sqlqueue`` depends on it:
the package talks to ``ENGINE="mssql"`` on a real SQL Server.
"""
