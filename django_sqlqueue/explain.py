"""Read the claim's query plan and say whether it seeks the claim index (``manage.py queue_explain``):
``EXPLAIN`` on PostgreSQL, ``EXPLAIN QUERY PLAN`` on SQLite, ``SET SHOWPLAN_XML ON`` on SQL Server.

A claim that scans the table gets slower as the queue grows; one that walks the partial claim index
in claim order stops after ``limit`` rows whatever the depth. This module asks the database for the
plan of the exact statement the worker issues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.etree import ElementTree

from django.db import connections, transaction

from .conf import get_settings
from .dialects import ClaimRequest, get_dialect
from .dialects.base import CLAIM_INDEX

#: Operators that read a whole index or table (a seek reads a range of one).
_SCANS = {"Table Scan", "Clustered Index Scan", "Index Scan"}


def _sqlserver_plan(cursor: Any, sql: str, params: list[Any], table: str) -> tuple[list[str], bool]:
    """SQL Server's estimated plan (``SET SHOWPLAN_XML ON``: the batch is compiled, not run), one line
    per operator that reads an index: ``PhysicalOp [table].[index]``; and whether one scans the job table.

    A scan of one of the claim's filtered indexes reads only the rows the filter keeps, so only scans
    of the job table's unfiltered indexes (or the table) count as scans here.
    """
    # In a transaction that is rolled back: under SHOWPLAN nothing runs on SQL Server, and on a server
    # that ignores SHOWPLAN (Babelfish) the claim it would then run claims nothing for good.
    with transaction.atomic(using=cursor.db.alias):
        cursor.execute("SET SHOWPLAN_XML ON")
        documents = []
        try:
            get_dialect(cursor.db).execute(cursor, sql, params)  # typed as the worker sends it
            while True:
                documents += [row[0] for row in cursor.fetchall() if row]
                if not cursor.nextset():
                    break
        finally:
            cursor.execute("SET SHOWPLAN_XML OFF")
            transaction.set_rollback(True, using=cursor.db.alias)
    documents = [d for d in documents if isinstance(d, str) and d.lstrip().startswith("<ShowPlanXML")]
    if not documents:
        raise NotImplementedError("this server returned no plan for SET SHOWPLAN_XML (Babelfish does not; "
                                  "a SQL Server does): read the plan in SSMS, see docs/sqlserver.md")
    lines, scans = [], False
    for document in documents:
        for relop in ElementTree.fromstring(document).iter(f"{_SHOWPLAN_NS}RelOp"):
            # the operator's own object: a child of its operator element (IndexScan, TableScan, ...),
            # not the objects of the operators below it
            for obj in (o for op in relop for o in op.findall(f"{_SHOWPLAN_NS}Object")):
                lines.append(f"{relop.get('PhysicalOp')} {obj.get('Table', '')}.{obj.get('Index', '')}")
                if (relop.get("PhysicalOp") in _SCANS and obj.get("Table", "").strip("[]") == table
                        and obj.get("Filtered") not in ("1", "true")):
                    scans = True
    return lines, scans


_SHOWPLAN_NS = "{http://schemas.microsoft.com/sqlserver/2004/07/showplan}"


#: PostgreSQL plan nodes of the part that picks jobs: ``LIMIT n ... FOR UPDATE SKIP LOCKED``.
_PICKING_NODES = ("Limit", "LockRows")


def picking_lines(lines: list[str]) -> list[str]:
    """The lines of a PostgreSQL text plan that lie under a ``Limit`` or ``LockRows`` node.

    Only the part that picks jobs must walk the claim index: its cost grows with the queue. The rest
    joins the few picked ids back to the table (the UPDATE, by primary key) and writes history; over a
    small table the planner rightly seq-scans for that join, whatever the statistics say, and that scan
    stays as small as the table is. Judging the whole plan failed a fresh database for no reason.
    """
    stack: list[tuple[int, str]] = []  # (indent, node) of the current node's ancestors
    picked: list[str] = []
    for line in lines:
        text = line.lstrip()
        if not (text.startswith("->") or not stack and line == text):
            continue  # details (Filter:, Sort Key:, CTE x, SubPlan) belong to the node above
        name = text.removeprefix("->").lstrip()
        indent = len(line) - len(name)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if any(node.startswith(_PICKING_NODES) for _, node in stack):
            picked.append(line)
        stack.append((indent, name))
    return picked


def postgresql_scans(lines: list[str], table: str) -> bool:
    """Whether the part of a PostgreSQL plan that picks jobs reads the whole job table."""
    return any(f"Seq Scan on {table} " in line + " " for line in picking_lines(lines))


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
    from .models import Job

    table = Job._meta.db_table  # from model meta, never written out
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN " + sql, params)
            lines = [r[0] for r in cursor.fetchall()]
            scans = postgresql_scans(lines, table)
        elif connection.vendor == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            lines = [r[-1] for r in cursor.fetchall()]
            # "SCAN j" without an index is a full pass over the table; "SCAN j USING INDEX x" walks
            # the partial index in claim order and stops at LIMIT.
            scans = any(line.startswith("SCAN") and f" {table}" in line + " " and "INDEX" not in line
                        for line in lines)
        else:
            lines, scans = _sqlserver_plan(cursor, sql, params, table)
    plan = "\n".join(lines)
    return PlanReport(connection.vendor, plan, CLAIM_INDEX in plan, scans)
