"""SQLite: one writer at a time, so the claim is ``UPDATE ... RETURNING`` inside ``BEGIN IMMEDIATE``.

SQLite has no row locks and needs none: ``BEGIN IMMEDIATE`` takes the write lock before the claim
reads, so two claimers are serialised by the database (the second waits up to the connection's
``timeout``) and can never see the same row as claimable. Requires SQLite >= 3.35 for RETURNING.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..states import Status
from .base import COL, LIMITED_INDEX, ClaimRequest, Dialect

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

# Django stores datetimes in SQLite as ISO text in UTC; strftime renders the clock the same way, so
# text comparison is time comparison. %% because Django's cursor treats % as a placeholder marker.
_FMT = "'%%Y-%%m-%%d %%H:%%M:%%f'"


class SqliteDialect(Dialect):
    vendor = "sqlite"
    true_literal = "1"
    false_literal = "0"
    watches_data_version = True

    @classmethod
    def version_problem(cls) -> str | None:
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            return f"SQLite {sqlite3.sqlite_version} is too old: the claim needs UPDATE ... RETURNING (3.35+)"
        return None

    def claim_plan(self, cursor: CursorWrapper, sql: str, params: list[Any], table: str) -> tuple[list[str], bool]:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        lines = [r[-1] for r in cursor.fetchall()]
        # "SCAN j" without an index is a full pass over the table; "SCAN j USING INDEX x" walks the
        # partial index in claim order and stops at LIMIT.
        return lines, any(line.startswith("SCAN") and f" {table}" in line + " " and "INDEX" not in line
                          for line in lines)

    def now(self) -> str:
        # SQLite fixes 'now' once per statement (every reference in one sqlite3_step run reads the same
        # time), not per transaction: a claim or completion stamps its own statement's time, so a job
        # released by a dependency's completion never records a start before that finish (issue 31).
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

    def epoch_bucket_sql(self, column_sql: str, seconds: int) -> str:
        # Whole seconds since the epoch, in C (SQLite keeps datetimes as UTC text); integer division.
        return f"(CAST(strftime('%%s', {column_sql}) AS INTEGER) / {int(seconds)})"

    # ----- the claim ------------------------------------------------------------------------------
    def claim_sql(self, req: ClaimRequest, limited_job: int | None = None) -> tuple[str, list[Any]]:
        """The claim's UPDATE (its history rows follow, see :meth:`claim`)::

            UPDATE job SET <claim SET list> WHERE id IN (
                SELECT id FROM (SELECT * FROM (due) [UNION ALL SELECT * FROM (reclaim)]
                                [UNION ALL SELECT * FROM (the limited job)])
                ORDER BY <claim order> LIMIT n)
            RETURNING *

        No row locks: :meth:`write_transaction` (``BEGIN IMMEDIATE``) serialises claimers. The limited
        job (``limited_job``, picked with its permit by :meth:`limited_pick_sql` in the same
        transaction) is a third branch.
        """
        n, j = self.n, self.n.j
        branches, params = self.claim_branches(req, limit=" LIMIT %s")
        if limited_job is not None:
            branches.append(f"SELECT {self.candidate_columns()} FROM {n.job} j WHERE j.{j['id']} = %s")
            params.append(limited_job)
        set_sql, set_params = self.claim_set_clause(req)
        sql = (
            f"UPDATE {n.job} SET {set_sql} WHERE {j['id']} IN ("
            f"SELECT id FROM ({' UNION ALL '.join(f'SELECT * FROM ({b})' for b in branches)}) "
            f"ORDER BY priority DESC, scheduled_for, id LIMIT %s) "
            f"RETURNING {', '.join(n.job_columns)}"
        )
        return sql, [*set_params, *params, req.limit]

    def limited_pick_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        """The first free permit whose scope has a job to take, and that job: rows of (permit id, job
        id). Runs first in the claim's immediate transaction (SQLite serialises writers: nobody else can
        take either before this transaction ends)."""
        n, j, p = self.n, self.n.j, self.n.p
        common, common_params = self.common_filters(req, limited=True)
        free, free_params = self.permit_filters(req)
        first_job = (
            f"SELECT j.{j['id']} FROM {n.job} j{self.index_hint(LIMITED_INDEX)} "
            f"WHERE {self.limited_job_predicate('p.' + p['job_type_id'], 'p.' + p['key'])} AND {common} "
            f"ORDER BY {self.candidate_order()} LIMIT 1"
        )
        sql = (f"SELECT pid, jid FROM (SELECT p.{p['id']} AS pid, ({first_job}) AS jid, p.{p['held_until']} AS ph "
               f"FROM {n.permit} p WHERE {free}) WHERE jid IS NOT NULL ORDER BY ph, pid LIMIT 1")
        return sql, [*common_params, *free_params]

    def hold_permit_sql(self) -> str:
        """Take the picked permit for the claimed job. Params: job id (its lease), job id, permit id."""
        n, j, p = self.n, self.n.j, self.n.p
        lease = f"(SELECT {j['lease_expires_at']} FROM {n.job} WHERE {j['id']} = %s)"
        return (f"UPDATE {n.permit} SET {p['held_until']} = {self.permit_hold(p['hold_seconds'], lease)}, "
                f"{p['job_id']} = %s WHERE {p['id']} = %s")

    def attempt_insert_sql(self) -> str:
        """The history row of one claimed job. Params: job id, attempt, worker, claimed at, step."""
        return f"{self.attempt_insert()} VALUES (%s, %s, %s, %s, %s, '')"

    @contextmanager
    def write_transaction(self, cursor: CursorWrapper, completions: int = 0, claim: bool = True,
                          extra: int = 0) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (or the caller's transaction, if one is open).

        IMMEDIATE takes the write lock before the claim reads, so two claimers are serialised by the
        database instead of both reading the same candidates.
        """
        if self.connection.in_atomic_block:
            yield
            return
        cursor.execute("BEGIN IMMEDIATE", [])
        try:
            yield
        except BaseException:
            cursor.execute("ROLLBACK", [])
            raise
        cursor.execute("COMMIT", [])

    def exclusive_transaction(self, cursor: CursorWrapper) -> Any:
        # No row locks: BEGIN IMMEDIATE takes the database's write lock before the first read.
        return self.write_transaction(cursor)

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        """Claim and write history (inside :meth:`write_transaction`); with ``req.limited``, first pick
        a permit and its job, and take the permit once the job is claimed (three statements, one
        immediate transaction: SQLite has one writer at a time, so nothing runs between them)."""
        pick = None
        if req.limited:
            sql, params = self.limited_pick_sql(req)
            cursor.execute(sql, params)
            pick = cursor.fetchone()
        sql, params = self.claim_sql(req, None if pick is None else pick[1])
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if rows:
            cursor.executemany(
                self.attempt_insert_sql(),
                [(r[COL["id"]], r[COL["attempt_num"]], r[COL["worker"]], r[COL["started_at"]], r[COL["step"]])
                 for r in rows],
            )
            if pick is not None and any(r[COL["id"]] == pick[1] for r in rows):
                cursor.execute(self.hold_permit_sql(), [pick[1], pick[1], pick[0]])
        rows.sort(key=lambda r: (-r[COL["priority"]], r[COL["scheduled_for"]], r[COL["id"]]))
        return rows

    def complete_values(self, nrows: int) -> str:
        # SQLite names VALUES columns column1, column2, ...: rename them in a subquery.
        rows = ", ".join(["(%s, %s, %s, %s)"] * nrows)
        return (f"(SELECT column1 AS vid, column2 AS vversion, column3 AS vresponse, column4 AS vduration "
                f"FROM (VALUES {rows})) AS v")

    def complete_sql(self, nrows: int) -> str:
        """UPDATE ... FROM (VALUES ...) RETURNING (no data-modifying CTEs in SQLite; history follows)."""
        n, j = self.n, self.n.j
        return (
            f"UPDATE {n.job} SET {self.complete_set_clause(n.job)} FROM {self.complete_values(nrows)} "
            f"WHERE {n.job}.{j['id']} = v.vid AND {n.job}.{j['version']} = v.vversion "
            f"AND {n.job}.{j['status_id']} = {int(Status.PROCESSING)} RETURNING {', '.join(n.job_columns)}"
        )

    def complete_many(self, cursor: CursorWrapper, items: list[tuple[int, int, Any, int | None]]
                      ) -> list[tuple[Any, ...]]:
        rows = super().complete_many(cursor, items)
        if rows:
            cursor.executemany(
                f"UPDATE {self.n.attempt} SET {self.completed_attempt_set('%s')} WHERE {self.open_attempt()}",
                [(r[COL["duration_ms"]], r[COL["id"]], r[COL["attempt_num"]]) for r in rows],
            )
        return rows

    max_params = 30000  # SQLite >= 3.32 allows 32766 host parameters

    def database_identity(self) -> Any:
        name = str(self.connection.settings_dict.get("NAME") or "")
        if not name or name == ":memory:" or name.startswith("file:"):
            return None
        try:
            st = os.stat(name)
        except FileNotFoundError:
            return "missing"
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def is_retryable_error(self, exc: BaseException) -> bool:
        return "database is locked" in str(exc)

    # ----- recurring schedules ---------------------------------------------------------------------
    @contextmanager
    def schedules_transaction(self) -> Iterator[None]:
        """An immediate transaction: the write lock is taken before the due rows are read, so two
        lookers are serialised by the database and the second sees the schedule already advanced.

        Django's ``atomic()`` begins ``IMMEDIATE`` only when the settings say so (``transaction_mode``);
        a no-op UPDATE as the first statement takes the write lock either way.
        """
        from django.db import transaction

        s_table, s, _, _ = self.schedule_tables()
        with transaction.atomic(using=self.connection.alias), self.connection.cursor() as cursor:
            cursor.execute(f"UPDATE {s_table} SET {s['enabled']} = {s['enabled']} WHERE 1 = 0", [])
            yield
