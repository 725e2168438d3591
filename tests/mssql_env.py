"""The SQL Server the live suite uses, from SQLQUEUE_MSSQL_HOST, _PORT, _USER, _PASSWORD, _NAME."""

from __future__ import annotations

import os
from urllib.parse import quote

VARS = ("SQLQUEUE_MSSQL_HOST", "SQLQUEUE_MSSQL_PORT", "SQLQUEUE_MSSQL_USER", "SQLQUEUE_MSSQL_PASSWORD",
        "SQLQUEUE_MSSQL_NAME")


def mssql_url() -> str | None:
    """``mssql://user:password@host:port/name`` when SQLQUEUE_MSSQL_HOST is set, else None."""
    host = os.environ.get("SQLQUEUE_MSSQL_HOST")
    if not host:
        return None
    port = os.environ.get("SQLQUEUE_MSSQL_PORT", "1433")
    user = quote(os.environ.get("SQLQUEUE_MSSQL_USER", "sa"), safe="")
    password = quote(os.environ.get("SQLQUEUE_MSSQL_PASSWORD", ""), safe="")
    name = os.environ.get("SQLQUEUE_MSSQL_NAME", "sqlqueue")
    return f"mssql://{user}:{password}@{host}:{port}/{name}"
