"""SQL Server (mssql-django reports vendor ``microsoft``): UPDLOCK/ROWLOCK/READPAST candidates, OUTPUT.

The claim is one batch and one round trip: a CTE picks the candidates with ``SELECT TOP (n) ...
WITH (UPDLOCK, ROWLOCK, READPAST) ... ORDER BY``, the UPDATE joins it and returns the new rows with
``OUTPUT inserted.*`` into a table variable, the history rows are inserted from that variable, and the
variable is selected back. ``UPDATE TOP (n)`` cannot take an ORDER BY, hence the CTE; ``OUTPUT`` goes
INTO a table variable because the history table has a foreign key, which ``OUTPUT INTO`` refuses as a
target. This module is rendered and parsed in tests (sqlglot, dialect tsql) and runs live only where a
SQL Server is configured (see tests/test_mssql_live.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..states import UNFINISHED, Status, sql_list
from .base import COL, JOB_COLUMNS, ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

# UPDLOCK: the candidate SELECT takes update locks, held to the end of the claim's transaction, so a
#   second claimer cannot take the same row between our read and our write.
# ROWLOCK: lock the rows, not pages: other jobs on the same page stay claimable.
# READPAST: skip rows other claimers hold instead of waiting for them (only honoured under READ
#   COMMITTED or REPEATABLE READ; under SNAPSHOT isolation it is an error, see docs/sqlserver.md).
CLAIM_HINTS = " WITH (UPDLOCK, ROWLOCK, READPAST)"
# Under READ_COMMITTED_SNAPSHOT a plain read sees a row version and ignores locks; reads that must see
# the current row (modify's token check, diagnosis after a refused update) ask for the lock explicitly.
LOCKED_READ_HINT = " WITH (READCOMMITTEDLOCK)"

# SQL Server types of the returned columns, for the table variable that receives OUTPUT.
_DECLARE_TYPES = {
    "id": "bigint",
    "queue": "nvarchar(100)",
    "job_type_id": "int",
    "status_id": "smallint",
    "step": "nvarchar(100)",
    "priority": "smallint",
    "attempt_num": "int",
    "max_attempts": "smallint",
    "payload": "nvarchar(max)",
    "response": "nvarchar(max)",
    "error": "nvarchar(max)",
    "enqueued_at": "datetimeoffset",
    "scheduled_for": "datetimeoffset",
    "started_at": "datetimeoffset",
    "finished_at": "datetimeoffset",
    "duration_ms": "bigint",
    "version": "int",
    "updated_at": "datetimeoffset",
    "worker": "nvarchar(200)",
    "lease_expires_at": "datetimeoffset",
    "dedupe_key": "nvarchar(200)",
}


class MssqlDialect(Dialect):
    vendor = "microsoft"
    true_literal = "1"
    max_params = 2000  # SQL Server allows 2100 parameters per statement

    def now(self) -> str:
        # The server's UTC clock; with USE_TZ the columns are datetimeoffset and this converts at +00:00.
        return "SYSUTCDATETIME()"

    def now_plus(self, seconds_sql: str) -> str:
        return f"DATEADD(second, CAST({seconds_sql} AS int), SYSUTCDATETIME())"

    def ms_since(self, column_sql: str) -> str:
        return f"DATEDIFF_BIG(millisecond, {column_sql}, SYSUTCDATETIME())"

    def locked_read_hint(self) -> str:
        return LOCKED_READ_HINT

    def returning(self, columns: list[str]) -> tuple[str, str]:
        return " OUTPUT " + ", ".join(f"inserted.{c}" for c in columns), ""

    def _declare(self) -> str:
        cols = ", ".join(f"{self.n.j[c]} {_DECLARE_TYPES[c]}" for c in JOB_COLUMNS)
        return f"DECLARE @claimed TABLE ({cols})"

    def claim_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        n, j, a = self.n, self.n.j, self.n.a
        branches, params = self.candidate_branches(req, hint=CLAIM_HINTS, top="TOP (%s) ")
        set_sql, set_params = self.claim_set_clause(req, alias="j")
        output = ", ".join(f"inserted.{c}" for c in n.job_columns)
        cols = ", ".join(n.job_columns)
        sql = (
            # NOCOUNT: no row-count messages, so the only result the driver sees is the final SELECT.
            "SET NOCOUNT ON; "
            f"{self._declare()}; "
            f"WITH picked AS (SELECT TOP (%s) c.id FROM ("
            f"{self.union_all(branches, alias=True)}"
            f") AS c ORDER BY c.priority DESC, c.scheduled_for, c.id) "
            # INTO without a column list: @claimed is declared in exactly the OUTPUT order.
            f"UPDATE j SET {set_sql} OUTPUT {output} INTO @claimed "
            f"FROM {n.job} AS j INNER JOIN picked ON picked.id = j.{j['id']}; "
            f"INSERT INTO {n.attempt} ({a['job_id']}, {a['attempt_num']}, {a['worker']}, {a['claimed_at']}, "
            f"{a['error']}) SELECT {j['id']}, {j['attempt_num']}, {j['worker']}, {j['started_at']}, N'' "
            f"FROM @claimed; "
            f"SELECT {cols} FROM @claimed ORDER BY {j['priority']} DESC, {j['scheduled_for']}, {j['id']};"
        )
        return sql, [req.limit, *params, *set_params]

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        sql, params = self.claim_sql(req)
        cursor.execute(sql, params)
        return cursor.fetchall()

    def complete_sql(self, nrows: int) -> str:
        """One batch: UPDATE ... OUTPUT INTO @done, close the history rows from @done, SELECT @done.

        OUTPUT goes INTO a table variable (not straight to the client) so the history UPDATE can join
        it, as in the claim. The UPDATE's own update locks make the token test current even under
        READ_COMMITTED_SNAPSHOT (an UPDATE reads the latest committed row, never a version).
        """
        n, j, a = self.n, self.n.j, self.n.a
        output = ", ".join(f"inserted.{c}" for c in n.job_columns)
        return (
            "SET NOCOUNT ON; "
            f"{self._declare().replace('@claimed', '@done')}; "
            f"UPDATE j SET {self.complete_set_clause('j')} OUTPUT {output} INTO @done "
            f"FROM {n.job} AS j INNER JOIN {self.complete_values(nrows)} "
            f"ON j.{j['id']} = v.vid AND j.{j['version']} = v.vversion "
            f"WHERE j.{j['status_id']} = {int(Status.PROCESSING)}; "
            f"UPDATE a SET {a['finished_at']} = SYSUTCDATETIME(), {a['outcome_id']} = {int(Status.COMPLETED)}, "
            f"{a['error']} = N'', {a['duration_ms']} = d.{j['duration_ms']} "
            f"FROM {n.attempt} AS a INNER JOIN @done AS d ON a.{a['job_id']} = d.{j['id']} "
            f"AND a.{a['attempt_num']} = d.{j['attempt_num']} WHERE a.{a['finished_at']} IS NULL; "
            f"SELECT {', '.join(n.job_columns)} FROM @done;"
        )

    multi_row_dedupe = False

    def insert_sql(self, columns: list[str], nrows: int, dedupe: bool, returning: Sequence[str] = ()) -> str:
        back = [self.n.j[c] for c in returning] if returning else self.n.job_columns
        output = ", ".join(f"inserted.{c}" for c in back)
        cols = self.insert_columns_sql(columns)
        if not dedupe:
            values = ", ".join([self.insert_values_sql(columns)] * nrows)
            return f"INSERT INTO {self.n.job} ({cols}) OUTPUT {output} VALUES {values}"
        # Dedupe, one row per statement: insert only if no unfinished job holds the key. UPDLOCK +
        # HOLDLOCK take a key-range lock on the (possibly absent) key, so a racing second enqueue waits
        # here, then sees the first row and inserts nothing; the filtered unique index is the backstop.
        j = self.n.j
        select_values = self.insert_values_sql(columns)[1:-1]
        return (
            f"INSERT INTO {self.n.job} ({cols}) OUTPUT {output} SELECT {select_values} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {self.n.job} WITH (UPDLOCK, HOLDLOCK) "
            f"WHERE {j['dedupe_key']} = %s AND {j['status_id']} IN ({sql_list(UNFINISHED)}))"
        )

    def insert_params(self, columns: list[str], row: list[Any], dedupe: bool) -> list[Any]:
        params = self.values_params(columns, row)
        return [*params, row[columns.index("dedupe_key")]] if dedupe else params

    def is_retryable_error(self, exc: BaseException) -> bool:
        # 1205: chosen as deadlock victim; 1222: lock request timeout. Both are safe to retry.
        text = str(exc)
        return "1205" in text or "1222" in text or "deadlock" in text.lower()


__all__ = ["MssqlDialect", "CLAIM_HINTS", "LOCKED_READ_HINT", "COL"]
