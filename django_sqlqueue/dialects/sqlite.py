"""SQLite: one writer at a time, so the claim is ``UPDATE ... RETURNING`` inside ``BEGIN IMMEDIATE``.

SQLite has no row locks and needs none: ``BEGIN IMMEDIATE`` takes the write lock before the claim
reads, so two claimers are serialised by the database (the second waits up to the connection's
``timeout``) and can never see the same row as claimable. Requires SQLite >= 3.35 for RETURNING.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import COL, ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

# Django stores datetimes in SQLite as ISO text in UTC; strftime renders the clock the same way, so
# text comparison is time comparison. %% because Django's cursor treats % as a placeholder marker.
_FMT = "'%%Y-%%m-%%d %%H:%%M:%%f'"


class SqliteDialect(Dialect):
    vendor = "sqlite"
    true_literal = "1"

    def now(self) -> str:
        return f"strftime({_FMT}, 'now')"

    def now_plus(self, seconds_sql: str) -> str:
        return f"strftime({_FMT}, 'now', ({seconds_sql}) || ' seconds')"

    def index_hint(self, index_name: str) -> str:
        # SQLite's planner, without ANALYZE statistics, prefers the (status, type, queue) index and
        # then sorts every claimable row; INDEXED BY pins the partial index whose order is the claim's,
        # so the claim stops after LIMIT rows however deep the queue is.
        return f" INDEXED BY {self.connection.ops.quote_name(index_name)}"

    def ms_since(self, column_sql: str) -> str:
        return f"CAST((julianday('now') - julianday({column_sql})) * 86400000 AS INTEGER)"

    def claim_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        n, j = self.n, self.n.j
        branches, params = self.candidate_branches(req, limit=" LIMIT %s")
        set_sql, set_params = self.claim_set_clause(req)
        sql = (
            f"UPDATE {n.job} SET {set_sql} WHERE {j['id']} IN ("
            f"SELECT id FROM (SELECT * FROM ({branches[0]}) UNION ALL SELECT * FROM ({branches[1]})) "
            f"ORDER BY priority DESC, scheduled_for, id LIMIT %s) "
            f"RETURNING {', '.join(n.job_columns)}"
        )
        return sql, [*set_params, *params, req.limit]

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        """Claim and write history in one IMMEDIATE transaction (or the caller's, if one is open)."""
        sql, params = self.claim_sql(req)
        own_tx = not self.connection.in_atomic_block
        if own_tx:
            cursor.execute("BEGIN IMMEDIATE", [])
        try:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            if rows:
                cursor.executemany(
                    self.attempt_insert_sql(),
                    [(r[COL["id"]], r[COL["attempt_num"]], r[COL["worker"]], r[COL["started_at"]]) for r in rows],
                )
        except BaseException:
            if own_tx:
                cursor.execute("ROLLBACK", [])
            raise
        if own_tx:
            cursor.execute("COMMIT", [])
        rows.sort(key=lambda r: (-r[COL["priority"]], r[COL["scheduled_for"]], r[COL["id"]]))
        return rows

    max_params = 30000  # SQLite >= 3.32 allows 32766 host parameters

    def is_retryable_error(self, exc: BaseException) -> bool:
        return "database is locked" in str(exc)
