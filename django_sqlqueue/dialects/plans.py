"""Reading query plans (``manage.py queue_explain``): the parts that are plain text or XML handling, with
no database driver imported, so that :mod:`django_sqlqueue.explain` and each vendor's dialect share them."""

from __future__ import annotations

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
