"""A Django database backend for the test harness only: mssql-django, plus what Babelfish needs.

Babelfish for PostgreSQL (``../shared/babelfish``) is the TDS endpoint the ``tds`` test stage runs
on. Nothing in ``django_sqlqueue`` depends on this package: on a real SQL Server the engine is "mssql".
"""
