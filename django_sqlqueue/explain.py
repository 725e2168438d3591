"""Read the claim's query plan and say whether it seeks the claim index (``manage.py queue_explain``).

A claim that scans the table gets slower as the queue grows; one that walks the partial claim index
in claim order stops after ``limit`` rows whatever the depth. This module asks the database for the
plan of the exact statement the worker issues.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from .conf import get_settings
from .dialects import ClaimRequest, get_dialect
from .dialects.base import CLAIM_INDEX


@dataclass(frozen=True)
class PlanReport:
    vendor: str
    plan: str
    uses_claim_index: bool
    scans_job_table: bool

    @property
    def ok(self) -> bool:
        return self.uses_claim_index and not self.scans_job_table


def explain_claim(*, using: str | None = None, limit: int = 10, worker: str = "explain") -> PlanReport:
    """The plan of a claim of ``limit`` jobs; nothing is claimed (the statement is not executed)."""
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    dialect = get_dialect(connection)
    req = ClaimRequest(worker=worker, limit=limit, default_max_attempts=get_settings().MAX_ATTEMPTS,
                       default_lease_seconds=get_settings().LEASE_SECONDS)
    sql, params = dialect.claim_sql(req)
    table = connection.ops.quote_name("django_sqlqueue_job").strip('"[]`')
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN " + sql, params)
            lines = [r[0] for r in cursor.fetchall()]
            scans = any(f"Seq Scan on {table} " in line + " " for line in lines)
        elif connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            lines = [r[-1] for r in cursor.fetchall()]
            # "SCAN j" without an index is a full pass over the table; "SCAN j USING INDEX x" walks
            # the partial index in claim order and stops at LIMIT.
            scans = any(line.startswith("SCAN") and f" {table}" in line + " " and "INDEX" not in line
                        for line in lines)
        else:
            raise NotImplementedError(
                "plan reading is implemented for PostgreSQL and SQLite; on SQL Server use "
                "SET SHOWPLAN_XML ON in SSMS with the statement from docs/claim-sql.md"
            )
    plan = "\n".join(lines)
    return PlanReport(connection.vendor, plan, CLAIM_INDEX in plan, scans)
