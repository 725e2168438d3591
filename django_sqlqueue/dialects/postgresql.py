"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` candidates, ``UPDATE ... RETURNING``, history in the same statement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper


class PostgresDialect(Dialect):
    vendor = "postgresql"
    supports_notify = True

    def now(self) -> str:
        # Transaction start time: every stamp in one claim or modify agrees, and the claim's
        # "due" test uses the server's clock, never a worker host's.
        return "now()"

    def now_plus(self, seconds_sql: str) -> str:
        return f"(now() + ({seconds_sql}) * interval '1 second')"

    def ms_since(self, column_sql: str) -> str:
        return f"CAST(EXTRACT(EPOCH FROM (now() - {column_sql})) * 1000 AS bigint)"

    def claim_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        n, j, a = self.n, self.n.j, self.n.a
        # FOR UPDATE OF j: lock only job rows (not the job-type rows the filters read).
        # SKIP LOCKED: a row another claimer holds is passed over, not waited for: concurrent
        # claimers each take different rows instead of queueing behind one another.
        # Each branch is its own CTE (FOR UPDATE is not allowed beside UNION) and locks inside it, so
        # its LIMIT counts only rows it actually got.
        branches, params = self.candidate_branches(
            req, lock=" FOR UPDATE OF j SKIP LOCKED", limit=" LIMIT %s"
        )
        set_sql, set_params = self.claim_set_clause(req, alias="j")
        returning = ", ".join(f"j.{c}" for c in n.job_columns)
        sql = (
            f"WITH due AS ({branches[0]}), reclaim AS ({branches[1]}), "
            f"picked AS (SELECT id FROM (SELECT * FROM due UNION ALL SELECT * FROM reclaim) c "
            f"ORDER BY priority DESC, scheduled_for, id LIMIT %s), "
            f"claimed AS (UPDATE {n.job} j SET {set_sql} FROM picked WHERE j.{j['id']} = picked.id "
            f"RETURNING {returning}), "
            # The history row is written by the same statement: a claim without its history row
            # cannot exist, even if the worker dies right after.
            f"hist AS (INSERT INTO {n.attempt} ({a['job_id']}, {a['attempt_num']}, {a['worker']}, "
            f"{a['claimed_at']}, {a['error']}) SELECT {j['id']}, {j['attempt_num']}, {j['worker']}, "
            f"{j['started_at']}, '' FROM claimed) "
            f"SELECT * FROM claimed ORDER BY {j['priority']} DESC, {j['scheduled_for']}, {j['id']}"
        )
        return sql, [*params, req.limit, *set_params]

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        sql, params = self.claim_sql(req)
        cursor.execute(sql, params)
        return cursor.fetchall()

    def is_retryable_error(self, exc: BaseException) -> bool:
        # 40P01 deadlock_detected, 40001 serialization_failure, 55P03 lock_not_available
        code = getattr(getattr(exc, "__cause__", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
        return code in {"40P01", "40001", "55P03"}

    def notify_sql(self) -> str | None:
        return "SELECT pg_notify(%s, %s)"
