"""Read the claim's query plan and say whether it seeks the claim index (``manage.py queue_explain``):
``EXPLAIN`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite, ``SET SHOWPLAN_XML ON`` on SQL Server.

A claim that scans the table gets slower as the queue grows; one that walks the partial claim index
in claim order stops after ``limit`` rows whatever the depth. This module asks the database for the
plan of the exact statement the worker issues.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from ..conf import get_settings
from ..dialects import ClaimRequest, get_dialect
from ..dialects.plans import picking_lines, postgresql_scans  # noqa: F401 (also imported from here)


@dataclass(frozen=True)
class PlanReport:
    vendor: str
    plan: str
    uses_claim_index: bool
    scans_job_table: bool

    @property
    def ok(self) -> bool:
        return self.uses_claim_index and not self.scans_job_table


def explain_claim(*, using: str | None = None, limit: int = 10, worker: str = "explain",
                  limited: bool | None = None) -> PlanReport:
    """The plan of a claim of ``limit`` jobs; nothing is claimed (the statement is not executed).

    ``limited``: with the limited branch (docs/limits.md); None: as a worker's claim would be now (with
    it while some type has a limit)."""
    from ..jobtypes import limited_type_ids

    alias = using or get_settings().DATABASE
    connection = connections[alias]
    dialect = get_dialect(connection)
    if limited is None:
        limited = bool(limited_type_ids(alias))
    req = ClaimRequest(worker=worker, limit=limit, default_max_attempts=get_settings().MAX_ATTEMPTS,
                       default_lease_seconds=get_settings().LEASE_SECONDS, limited=limited)
    sql, params = dialect.claim_sql(req)
    from ..models import Job

    table = Job._meta.db_table  # from model meta, never written out
    with connection.cursor() as cursor:
        lines, scans = dialect.claim_plan(cursor, sql, params, table)
    plan = "\n".join(lines)
    # Every index the claim's branches are written for (SQL Server pins each with a hint): one missing
    # from the plan means a branch reads something else.
    expected = dialect.claim_plan_indexes(req)
    return PlanReport(dialect.vendor, plan, all(name in plan for name in expected), scans)
