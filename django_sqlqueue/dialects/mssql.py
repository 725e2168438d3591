"""SQL Server (mssql-django reports vendor ``microsoft``): UPDLOCK/ROWLOCK/READPAST candidates, OUTPUT INTO.

Every write is one batch and one round trip, wrapped by :func:`batch`:

- ``SET NOCOUNT ON`` so the only results the driver sees are the final SELECTs, and ``OFF`` again before
  them (NOCOUNT set in a batch outlives it: left on, every later DML on the connection would report
  rowcount -1; mssql-django prefixes its own UPDATEs with ``SET NOCOUNT OFF`` for that reason).
- In autocommit the batch owns its transaction (``BEGIN TRANSACTION`` ... ``COMMIT`` inside it, with
  ``XACT_ABORT ON`` so that any error, or a client timeout, rolls it back whole): no autocommit switch
  and no COMMIT round trips from the client. Inside the caller's transaction it joins that one.
- ``OUTPUT ... INTO`` a table variable, then ``SELECT`` from it: ``OUTPUT`` without ``INTO`` fails
  (Msg 334) as soon as the table has an enabled trigger, and audit triggers are common.

The claim picks candidates with ``SELECT TOP (n) ... WITH (UPDLOCK, ROWLOCK, READPAST) ... ORDER BY`` in
a derived table and updates the job rows it names through a pinned nested-loop join (``UPDATE TOP (n)``
cannot take an ORDER BY). Each candidate branch seeks a filtered index that covers its predicates
(migration 0004 creates them on SQL Server). This module is rendered and parsed in tests (sqlglot,
dialect tsql), runs over TDS on Babelfish in the ``tds`` test stage (one claimer at a time: Babelfish
ignores table hints), and runs live only where a SQL Server is configured (tests/test_mssql_live.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

from django.db import DatabaseError, transaction

from ..exceptions import InvalidArgument
from ..states import DEDUPE_SCOPE, Status, sql_list
from .base import (
    CLAIM_INDEX,
    COL,
    JOB_COLUMNS,
    LIMITED_INDEX,
    PROCESSING_INDEX,
    ClaimRequest,
    Dialect,
    queue_model,
)

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper


def _utc_naive(value: datetime) -> datetime:
    """An aware datetime as naive UTC (a naive one is taken as it is: USE_TZ=False)."""
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo is not None else value

# UPDLOCK: the candidate SELECT takes update locks, held to the end of the claim's transaction, so a
#   second claimer cannot take the same row between our read and our write.
# ROWLOCK: lock the rows, not pages: other jobs on the same page stay claimable.
# READPAST: skip rows other claimers hold instead of waiting for them. Honoured under READ COMMITTED
#   and REPEATABLE READ; under SNAPSHOT it is allowed only beside a locking hint such as UPDLOCK, as here
#   (see docs/sqlserver.md for what SNAPSHOT does change: update conflicts, error 3960).
CLAIM_HINTS = " WITH (UPDLOCK, ROWLOCK, READPAST)"
# Under READ_COMMITTED_SNAPSHOT a plain read sees a row version and ignores locks; reads that must see
# the current row (modify's token check, diagnosis after a refused update) ask for the lock explicitly.
LOCKED_READ_HINT = " WITH (READCOMMITTEDLOCK)"

#: The filtered indexes only SQL Server has (migration 0004): the claim's reclaim branches seek them.
PROCESSING_WORKER_INDEX = "sqlqueue_job_processing_worker"
#: The due branch of a worker that names its queues: (queue, claim order), filtered as the claim index
#: (migration 0014, SQL Server only).
CLAIM_QUEUE_INDEX = "sqlqueue_job_claim_queue"
#: The permit table's free-permit index (migration 0014); the limited branch reads LIMITED_INDEX (models).
PERMIT_FREE_INDEX = "sqlqueue_permit_free"
#: Every branch of the claim reads the index it was written for, named in a table hint: a filtered
#: index's statistics can go stale (a backlog drained since the last update), and a plan compiled then
#: could read another index with key lookups, U-locking base rows the claim never takes. A hinted
#: index that is missing fails the claim at once (Msg 308) instead of degrading it quietly.
CLAIM_INDEXES = (CLAIM_INDEX, CLAIM_QUEUE_INDEX, PROCESSING_INDEX, PROCESSING_WORKER_INDEX, LIMITED_INDEX,
                 PERMIT_FREE_INDEX)
#: Columns the claim's branches read besides the index keys: INCLUDEd, so that a row the claim rejects
#: is rejected from the index entry, without a key lookup (and its lock) in the base table.
CLAIM_INCLUDE = ("queue", "job_type_id", "attempt_num", "max_attempts")

#: @@OPTIONS bit of XACT_ABORT, which a batch turns on and must put back as it was.
XACT_ABORT_BIT = 16384
#: @@OPTIONS bit of IMPLICIT_TRANSACTIONS: how ODBC's manual-commit mode (Django's atomic()) works, so
#: @@TRANCOUNT is still 0 at the first statement of the caller's transaction.
IMPLICIT_TRANSACTIONS_BIT = 2
#: SQL Server's native error numbers that mean "nothing was done, run it again": 1205 chosen as deadlock
#: victim, 1222 lock request timeout (only with SET LOCK_TIMEOUT), 3960 snapshot update conflict.
RETRYABLE_ERRORS = frozenset({1205, 1222, 3960})
#: SQLSTATE of deadlock victims and snapshot update conflicts (ODBC maps both there).
RETRYABLE_SQLSTATES = frozenset({"40001"})
# ODBC SQL type codes (the same numbers in mssql-python and pyodbc) for the parameters' declared types.
SQL_WVARCHAR, SQL_BIGINT, SQL_DOUBLE, SQL_TYPE_TIMESTAMP = -9, -5, 8, 93
#: Parameters SQL Server takes in one request.
MAX_PARAMS = 2100
#: nvarchar(4000), or nvarchar(max) (column size 0) for longer text.
NVARCHAR_MAX_INLINE = 4000
# pyodbc ends a message with "(<native error>) (SQLExecDirectW)": read the number from that position only.
_PYODBC_NATIVE = re.compile(r"\((\d+)\) \(SQL\w+\)\s*$")
# mssql-python keeps no native number; its exception says which SQLSTATE it was raised for.
_MSSQL_PYTHON_SQLSTATES = {"Serialization failure": "40001"}


@dataclass
class Batch:
    """One T-SQL batch: table-variable declarations, the statements that write (one transaction), and
    the SELECTs that return rows. Rendered by :func:`batch`; kept apart so tests can parse the parts."""

    declares: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)
    #: Run at ``DEADLOCK_PRIORITY LOW`` (the claim: see :meth:`MssqlDialect.claim_batch`), NORMAL after.
    deadlock_low: bool = False

    def extend(self, other: Batch) -> Batch:
        self.declares += other.declares
        self.body += other.body
        self.results += other.results
        self.params += other.params
        self.deadlock_low = self.deadlock_low or other.deadlock_low
        return self


# NOCOUNT ends OFF, Django's baseline: mssql-django's own ORM INSERT leaves it ON (its SCOPE_IDENTITY
# batch) and prefixes its UPDATE/DELETE with SET NOCOUNT OFF rather than trusting it, so "what the
# session had" may be a leaked ON. XACT_ABORT is put back as it was (parenthesised: T-SQL binds & before
# =, and so the statement reads the same on every parser).
_RESTORE = f"SET NOCOUNT OFF; IF (@sqlqueue_options & {XACT_ABORT_BIT}) = 0 SET XACT_ABORT OFF; "


def batch(parts: Batch) -> str:
    """The T-SQL text of ``parts``: session settings put back, the body in one transaction.

    ``@sqlqueue_own`` is 1 in autocommit (no transaction open, implicit transactions off): then the batch
    begins and commits its own, with XACT_ABORT ON so that an error or a client timeout leaves nothing
    half done. Inside the
    caller's transaction it neither begins nor ends one, and leaves XACT_ABORT alone (ON would roll the
    caller's whole transaction back on any error, which Django's atomic() does not expect). Errors are
    re-raised with THROW, so the client sees the original error number.
    """
    # DEADLOCK_PRIORITY is a session setting too: put back to NORMAL (the default, which the queue's
    # connections keep) on both ways out.
    restore = _RESTORE + ("SET DEADLOCK_PRIORITY NORMAL; " if parts.deadlock_low else "")
    return (
        "DECLARE @sqlqueue_options int = @@OPTIONS, "
        f"@sqlqueue_own bit = CASE WHEN @@TRANCOUNT = 0 AND (@@OPTIONS & {IMPLICIT_TRANSACTIONS_BIT}) = 0 "
        "THEN 1 ELSE 0 END; "
        "SET NOCOUNT ON; "
        + ("SET DEADLOCK_PRIORITY LOW; " if parts.deadlock_low else "")
        + "".join(f"{d}; " for d in parts.declares)
        + "BEGIN TRY "
        "IF @sqlqueue_own = 1 BEGIN SET XACT_ABORT ON; BEGIN TRANSACTION; END; "
        + "".join(f"{s}; " for s in parts.body)
        + "IF @sqlqueue_own = 1 COMMIT TRANSACTION; "
        "END TRY BEGIN CATCH "
        "IF @sqlqueue_own = 1 AND @@TRANCOUNT > 0 ROLLBACK TRANSACTION; "
        f"{restore}THROW; "
        "END CATCH; "
        f"{restore}"
        + "".join(f"{r}; " for r in parts.results)
    )


class MssqlDialect(Dialect):
    vendor = "microsoft"
    true_literal = "1"
    false_literal = "0"
    empty_string = "N''"  # nvarchar, as the columns and mssql-django's filtered index definitions
    max_params = 2000  # SQL Server allows 2100 parameters per statement
    #: Completions per batch: 4 parameters each, leaving room for a claim's in the same batch.
    complete_chunk = 400
    #: One batch carries its own transaction (see batch()): no client-side BEGIN/COMMIT round trips.
    atomic_statement = True

    def now(self) -> str:
        # The server's UTC clock; with USE_TZ the columns are datetimeoffset and this converts at +00:00.
        # A runtime constant: evaluated once per reference when its statement starts, never per row and
        # never at the transaction's start, so each statement of a claim or completion batch stamps its
        # own time and recorded history follows the order of events (issue 31; PostgreSQL's now() did not).
        return "SYSUTCDATETIME()"

    def now_plus(self, seconds_sql: str) -> str:
        # DATEADD takes an int: whole seconds overflow past 68 years (the API allows a century) and a
        # fraction would be truncated (a 0.5 s backoff would become 0). So: days plus milliseconds, both
        # far inside int, from one bigint count of milliseconds computed once in a scalar subquery (the
        # expression, often a bound parameter, appears once).
        return (
            # (ms - days * 86400000, not ms % 86400000: a literal % would need escaping for the driver)
            "(SELECT DATEADD(millisecond, CAST(s.ms - s.ms / 86400000 * 86400000 AS int), "
            "DATEADD(day, CAST(s.ms / 86400000 AS int), SYSUTCDATETIME())) "
            f"FROM (SELECT CAST(ROUND(CAST({seconds_sql} AS float) * 1000, 0) AS bigint) AS ms) AS s)"
        )

    def ms_since(self, column_sql: str) -> str:
        return f"DATEDIFF_BIG(millisecond, {column_sql}, SYSUTCDATETIME())"

    def epoch_bucket_sql(self, column_sql: str, seconds: int) -> str:
        # Second boundaries crossed since 1970-01-01 (UTC: the columns are datetimeoffset).
        return f"(DATEDIFF_BIG(second, CAST('1970-01-01T00:00:00+00:00' AS datetimeoffset), {column_sql}) / {int(seconds)})"

    def locked_read_hint(self) -> str:
        return LOCKED_READ_HINT

    def lease_update_hint(self) -> str:
        # A second taker skips the lease row another one is updating (it is not free for it either)
        # instead of queueing behind it.
        return CLAIM_HINTS

    def row_lock_hint(self) -> str:
        # Update locks on the rows read, held to the end of the transaction (the current row is read,
        # not a version, even under READ_COMMITTED_SNAPSHOT).
        return " WITH (UPDLOCK, ROWLOCK)"

    def purge_delete_sql(self, where_sql: str) -> str:
        # The caller reads the row count: make sure it is reported, whatever an earlier batch left.
        return "SET NOCOUNT OFF; " + super().purge_delete_sql(where_sql)

    #: Rows per DELETE of a purge's history and subtype rows: under the ~5,000 locks at which one
    #: statement's locks on one table or index escalate to a table lock (docs/sqlserver.md).
    delete_chunk = 1000

    def delete_by_job_sql(self, table: str, column: str, count: int) -> str:
        """``DELETE TOP (n)`` in a loop until fewer than n rows go: a purge chunk of 2,000 jobs has
        ~5,000 history rows, and one DELETE of them all could escalate to a table X lock on the history
        table (held to the purge's commit), blocking every claim's history INSERT. Escalation is off
        for that table too (migration 0014); the loop keeps each statement under the threshold where it
        is not. The job ids are bound once; NOCOUNT keeps the loop's row counts off the wire."""
        qn = self.connection.ops.quote_name
        marks = ", ".join(["%s"] * count)
        return (f"SET NOCOUNT ON; WHILE 1 = 1 BEGIN DELETE TOP ({self.delete_chunk}) FROM {qn(table)} "
                f"WHERE {qn(column)} IN ({marks}); IF @@ROWCOUNT < {self.delete_chunk} BREAK; END; "
                "SET NOCOUNT OFF;")

    # ----- types ----------------------------------------------------------------------------------
    @cached_property
    def declare_types(self) -> dict[str, str]:
        """SQL Server type of each returned column, from the model fields (``db_type``), never by hand."""
        fields = {f.attname: f for f in queue_model("Job")._meta.concrete_fields}
        return {c: fields[c].db_type(self.connection) for c in JOB_COLUMNS}

    def declare(self, variable: str, columns: Sequence[str] = JOB_COLUMNS) -> str:
        """``DECLARE @variable TABLE (...)`` for ``columns`` (attnames), typed as the job table's."""
        types = self.declare_types
        return f"DECLARE {variable} TABLE ({', '.join(f'{self.n.j[c]} {types[c]}' for c in columns)})"

    def _output(self, columns: Sequence[str], variable: str) -> str:
        # INTO without a column list: the table variable is declared in exactly this order.
        return " OUTPUT " + ", ".join(f"inserted.{self.n.j[c]}" for c in columns) + f" INTO {variable}"

    # ----- claim ----------------------------------------------------------------------------------
    def _hints(self, index: str) -> str:
        """The candidate read's table hints, pinned to ``index`` (see :data:`CLAIM_INDEXES`)."""
        return f" WITH (INDEX({self.connection.ops.quote_name(index)}), UPDLOCK, ROWLOCK, READPAST)"

    def candidate_columns(self) -> str:
        """(id, priority, scheduled_for, version): the token travels with the picked row, so that the
        UPDATE re-checks it (``j.version = picked.version``). Every claim index INCLUDEs ``version``
        (migration 0014), so reading it costs no key lookup."""
        return f"{super().candidate_columns()}, j.{self.n.j['version']} AS version"

    def due_branch(self, req: ClaimRequest, cols: str, order: str) -> tuple[str, list[Any]]:
        """The due branch: one ordered scan of the claim index that stops after ``n`` rows pass.

        A worker that names its queues reads them through ``CROSS APPLY`` over the list: one seek per
        queue into ``sqlqueue_job_claim_queue`` (keyed by queue first, then claim order), each stopping
        after ``n`` rows. Filtering ``queue`` (an INCLUDE column) on the claim index instead would walk,
        and U-lock to the end of the claim, every other queue's due job ahead of ours.
        """
        n, j = self.n, self.n.j
        if not req.queues:
            common, common_params = self.common_filters(req)
            return (f"SELECT TOP (%s) {cols} FROM {n.job} AS j{self._hints(CLAIM_INDEX)} "
                    f"WHERE {self.due_predicate()} AND {common} ORDER BY {order}", [req.limit, *common_params])
        common, common_params = self.common_filters(replace(req, queues=()))
        values = ", ".join(["(%s)"] * len(req.queues))
        return (f"SELECT c.* FROM (VALUES {values}) AS q (name) CROSS APPLY (SELECT TOP (%s) {cols} "
                f"FROM {n.job} AS j{self._hints(CLAIM_QUEUE_INDEX)} WHERE j.{j['queue']} = q.name "
                f"AND {self.due_predicate()} AND {common} ORDER BY {order}) AS c",
                [*req.queues, req.limit, *common_params])

    def reclaim_branches(self, req: ClaimRequest, common: str, common_params: list[Any], cols: str
                         ) -> tuple[list[str], list[Any]]:
        """Three seeks instead of one OR: this worker's own (a restart), expired leases, dead workers'.

        An ``OR`` of the three cannot seek one index; with UPDLOCK every Processing row it scanned and
        rejected would stay locked to the end of the claim, blocking those jobs' completions and lease
        renewals. Each branch here seeks a filtered index over Processing rows that covers it, **in that
        index's own order**, so that ``TOP (n)`` stops after ``n`` rows pass: sorted into claim order
        first, a branch would read (and U-lock) every matching row before the sort could return one,
        and after a mass crash every claim would lock every expired job. The picked set puts the
        union into claim order; a stuck job is taken in lease-expiry (or worker) order, not priority.
        """
        n, j = self.n, self.n.j
        processing = f"j.{j['status_id']} = {int(Status.PROCESSING)}"
        # sqlqueue_job_processing_worker is keyed (worker), and the clustered key (id) follows in a
        # non-unique index: for one worker name, id order is the index's order.
        mine = (f"SELECT TOP (%s) {cols} FROM {n.job} AS j{self._hints(PROCESSING_WORKER_INDEX)} "
                f"WHERE {processing} AND {self.own_leftovers()} AND {common} ORDER BY j.{j['id']}")
        # sqlqueue_job_processing is keyed (lease_expires_at, worker), then id: the range seek on the
        # lease returns rows in exactly this order, oldest expiry first.
        expired = (f"SELECT TOP (%s) {cols} FROM {n.job} AS j{self._hints(PROCESSING_INDEX)} "
                   f"WHERE {processing} AND j.{j['lease_expires_at']} < {self.now()} AND {common} "
                   f"ORDER BY j.{j['lease_expires_at']}, j.{j['worker']}, j.{j['id']}")
        # The dead workers first: the pinned join below forces join order in the whole statement, so
        # the few dead workers' names drive seeks into the worker index, never a read of all
        # Processing rows. No ORDER BY: TOP (n) over the nested loops stops at the n-th row.
        dead = (
            f"SELECT TOP (%s) {cols} FROM {n.worker_table} AS w "
            f"INNER JOIN {n.job} AS j{self._hints(PROCESSING_WORKER_INDEX)} ON j.{j['worker']} = w.{n.w['name']} "
            f"WHERE {processing} AND (w.{n.w['stopped_at']} IS NOT NULL "
            f"OR w.{n.w['last_heartbeat']} < {self.now_plus('%s')}) AND {common}"
        )
        params = [req.limit, *self.own_leftovers_params(req), *common_params,
                  req.limit, *common_params,
                  req.limit, -float(req.worker_dead_after_seconds), *common_params]
        return [mine, expired, dead], params

    BRANCH_NAMES = ("due", "mine", "expired", "dead", "limited")

    def claim_plan_indexes(self, req: ClaimRequest) -> list[str]:
        """The indexes the claim's branches are pinned to (``queue_explain`` checks the plan reads them)."""
        names = [CLAIM_QUEUE_INDEX if req.queues else CLAIM_INDEX]
        if req.reclaim:
            names += [PROCESSING_WORKER_INDEX, PROCESSING_INDEX]
        if req.limited:
            names += [PERMIT_FREE_INDEX, LIMITED_INDEX]
        return names

    def claim_batch(self, req: ClaimRequest) -> Batch:
        """The claim: candidates, the UPDATE of the picked rows, their history rows, the rows back.

        The batch runs at ``DEADLOCK_PRIORITY LOW``: the claim meets by-id writers (modify, cancel,
        completion, lease renewal, an operator's bulk action) in opposite lock order (it U-locks an
        index entry and then needs the clustered row; they lock the clustered row, then its index
        entries), so a deadlock between them is possible; the claim is then the victim, and the
        manager retries it (1205) at no cost to anyone, where the other statement would have been
        a user's request or a worker's result.
        """
        n, j = self.n, self.n.j
        cols, order = self.candidate_columns(), self.candidate_order()
        due, params = self.due_branch(req, cols, order)
        branches = [due]
        if req.reclaim:
            common, common_params = self.common_filters(req)
            more, more_params = self.reclaim_branches(req, common, common_params, cols)
            branches += more
            params += more_params
        declares, body = [self.declare("@claimed")], []
        if req.limited:
            pick, pick_params = self.limited_pick(req)
            types = self.declare_types
            declares.append(f"DECLARE @permit TABLE (pid bigint, jid bigint, jpriority {types['priority']}, "
                            f"jscheduled {types['scheduled_for']}, jversion {types['version']}, phold float)")
            body.append(pick)
            # The job's claim-order columns and token were read with it (covered by its index): no
            # second read of the job row.
            branches.append("SELECT lp.jid AS id, lp.jpriority AS priority, lp.jscheduled AS scheduled_for, "
                            "lp.jversion AS version FROM @permit AS lp")
            pre_params = pick_params
        else:
            pre_params = []
        set_sql, set_params = self.claim_set_clause(req, alias="j")
        body += [
            # The derived table, not a CTE: the same plan on SQL Server (a CTE is inlined), and Babelfish
            # (the tds test stage) cannot run UPDATE ... FROM a CTE with OUTPUT INTO.
            # INNER LOOP JOIN: the picked ids drive one primary-key seek each into the job table; a hash
            # or merge join would scan the target and U-lock every row (and two claimers could deadlock).
            # j.version = picked.version: the row is updated only if it is still the one picked (as
            # PostgreSQL's FOR UPDATE re-checks): a job two claimers reached through two different
            # indexes, one after the other's commit, is not claimed twice.
            f"UPDATE j SET {set_sql}{self._output(JOB_COLUMNS, '@claimed')} "
            # DISTINCT: a stuck job can be in more than one reclaim branch (mine and expired, say).
            f"FROM (SELECT DISTINCT TOP (%s) c.id, c.priority, c.scheduled_for, c.version "
            f"FROM ({self.union_all(branches, alias=True)}) AS c "
            f"ORDER BY c.priority DESC, c.scheduled_for, c.id) AS picked "
            f"INNER LOOP JOIN {n.job} AS j ON j.{j['id']} = picked.id WHERE j.{j['version']} = picked.version",
            self.attempt_insert_from("@claimed"),
        ]
        if req.limited:
            p = n.p
            body.append(
                f"UPDATE hp SET {p['held_until']} = {self.permit_hold('lp.phold', 'c.' + j['lease_expires_at'])}, "
                f"{p['job_id']} = c.{j['id']} FROM @permit AS lp INNER JOIN @claimed AS c ON c.{j['id']} = lp.jid "
                f"INNER LOOP JOIN {n.permit} AS hp ON hp.{p['id']} = lp.pid")
        results = [f"SELECT {', '.join(n.job_columns)} FROM @claimed ORDER BY {self.claimed_order()}"]
        return Batch(declares, body, results, [*pre_params, *set_params, req.limit, *params], deadlock_low=True)

    def limited_pick(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        """INSERT INTO @permit the first free permit whose scope has a job to take, and that job.

        Both reads take UPDLOCK, ROWLOCK, READPAST: a permit (or job) another claimer holds is skipped,
        which is exactly right for a semaphore row: it is not free for us either. Nothing is counted,
        so READPAST cannot make a limit look less used than it is (docs/limits.md).

        The permits are read through ``sqlqueue_permit_free`` (keyed ``held_until``, then id; NULL
        sorts first): an ordered range seek over the free ones, in :meth:`permit_order`, that stops at
        the first permit whose scope has a job. Without it ``TOP (1) ... ORDER BY held_until`` read and
        sorted every permit, U-locking each free one to the end of the claim, so every other limited
        claim skipped them all and found nothing: one limited claim at a time across the fleet.
        """
        n, p = self.n, self.n.p
        common, common_params = self.common_filters(req, limited=True)
        free, free_params = self.permit_filters(req)
        sql = (
            "INSERT INTO @permit (pid, jid, jpriority, jscheduled, jversion, phold) SELECT TOP (1) "
            f"p.{p['id']}, c.id, c.priority, c.scheduled_for, c.version, p.{p['hold_seconds']} "
            f"FROM {n.permit} AS p{self._hints(PERMIT_FREE_INDEX)} CROSS APPLY (SELECT TOP (1) {self.candidate_columns()} "
            f"FROM {n.job} AS j{self._hints(LIMITED_INDEX)} "
            f"WHERE {self.limited_job_predicate('p.' + p['job_type_id'], 'p.' + p['key'])} AND {common} "
            f"ORDER BY {self.candidate_order()}) AS c WHERE {free} ORDER BY {self.permit_order()}"
        )
        return sql, [*common_params, *free_params]

    def claim_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        parts = self.claim_batch(req)
        return batch(parts), parts.params

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        return self.complete_and_claim(cursor, [], req)[1]

    # ----- completion -----------------------------------------------------------------------------
    def complete_batch(self, items: list[tuple[int, int, Any, int | None]]) -> Batch:
        """Complete Processing jobs whose token matches and close their history rows; return them.

        The job table is the UPDATE's target by name, joined in the WHERE clause, not by alias in the
        FROM clause: the same statement on SQL Server, and the form Babelfish runs (an aliased or
        FROM-listed target whose SET reads the VALUES rows, with OUTPUT, fails there). ``OPTION (LOOP
        JOIN)``: the few VALUES rows drive primary-key seeks; a hash or merge join would scan the table.
        The UPDATE's own update locks make the token test current even under READ_COMMITTED_SNAPSHOT.
        """
        n, j, a = self.n, self.n.j, self.n.a
        body = [
            f"UPDATE {n.job} SET {self.complete_set_clause(n.job)}{self._output(JOB_COLUMNS, '@done')} "
            f"FROM {self.complete_values(len(items))} "
            f"WHERE {n.job}.{j['id']} = v.vid AND {n.job}.{j['version']} = v.vversion "
            f"AND {n.job}.{j['status_id']} = {int(Status.PROCESSING)} OPTION (LOOP JOIN)",
            f"UPDATE a SET {self.completed_attempt_set('d.' + j['duration_ms'])} "
            f"FROM @done AS d INNER LOOP JOIN {n.attempt} AS a ON a.{a['job_id']} = d.{j['id']} "
            f"AND a.{a['attempt_num']} = d.{j['attempt_num']} WHERE a.{a['finished_at']} IS NULL",
        ]
        return Batch([self.declare("@done")], body, [f"SELECT {', '.join(n.job_columns)} FROM @done"],
                     [p for item in items for p in item])

    def complete_sql(self, nrows: int) -> str:
        return batch(self.complete_batch([(0, 0, None, None)] * nrows))

    def statements(self, completions: int, claim: bool) -> int:
        # The last chunk of completions and the claim share one batch.
        return max(-(-completions // self.complete_chunk), int(claim))

    def complete_and_claim(self, cursor: CursorWrapper, items: list[tuple[int, int, Any, int | None]],
                           req: ClaimRequest | None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        finished: list[tuple[Any, ...]] = []
        chunks = [items[i:i + self.complete_chunk] for i in range(0, len(items), self.complete_chunk)]
        for chunk in chunks[:-1] if req is not None else chunks:
            self.execute(cursor, batch(b := self.complete_batch(chunk)), b.params)
            finished.extend(cursor.fetchall())
        if req is None:
            return finished, []
        claim = self.claim_batch(req)
        if chunks and len(claim.params) + 4 * len(chunks[-1]) > MAX_PARAMS:
            # Many queue/type filters: the last completions go in a batch of their own, then the claim.
            # In autocommit each commits alone; that is safe: recorded again after a failed claim, a
            # completed job's token no longer matches and nothing is written twice.
            self.execute(cursor, batch(b := self.complete_batch(chunks.pop())), b.params)
            finished.extend(cursor.fetchall())
        parts = Batch()
        if chunks:
            parts.extend(self.complete_batch(chunks[-1]))
        parts.extend(claim)
        if len(parts.params) > MAX_PARAMS:
            raise InvalidArgument(f"a claim with {len(req.queues)} queues and {len(req.types)} types needs "
                                  f"{len(parts.params)} parameters; SQL Server allows {MAX_PARAMS}")
        self.execute(cursor, batch(parts), parts.params)
        if chunks:
            finished.extend(cursor.fetchall())
            cursor.nextset()
        return finished, cursor.fetchall()

    def renew_leases_sql(self, count: int, incarnation: bool = True, *, guarded: bool = False) -> str:
        # The caller reads the row count: make sure it is reported, whatever an earlier batch left.
        return "SET NOCOUNT OFF; " + super().renew_leases_sql(count, incarnation, guarded=guarded)

    def renew_held_sql(self, counts: Sequence[int], *, guarded: bool = False) -> str:
        return "SET NOCOUNT OFF; " + super().renew_held_sql(counts, guarded=guarded)

    # ----- modify and enqueue ---------------------------------------------------------------------
    def update_returning(self, set_sql: str, where_sql: str) -> str:
        return batch(Batch(
            [self.declare("@changed")],
            [f"UPDATE {self.n.job} SET {set_sql}{self._output(JOB_COLUMNS, '@changed')} WHERE {where_sql}"],
            [f"SELECT {', '.join(self.n.job_columns)} FROM @changed"],
        ))

    multi_row_dedupe = False

    def insert_sql(self, columns: list[str], nrows: int, dedupe: bool, returning: Sequence[str] = ()) -> str:
        key = (tuple(columns), nrows, dedupe, tuple(returning))
        sql = self._insert_sql_cache.get(key)
        if sql is None:
            sql = batch(self.insert_batch(columns, nrows, dedupe, tuple(returning) or JOB_COLUMNS))
            if len(self._insert_sql_cache) < 64:
                self._insert_sql_cache[key] = sql
        return sql

    def insert_batch(self, columns: list[str], nrows: int, dedupe: bool, back: Sequence[str]) -> Batch:
        cols = self.insert_columns_sql(columns)
        output = self._output(back, "@inserted")
        select = [f"SELECT {', '.join(self.n.j[c] for c in back)} FROM @inserted"]
        if not dedupe:
            values = ", ".join([self.insert_values_sql(columns)] * nrows)
            return Batch([self.declare("@inserted", back)],
                         [f"INSERT INTO {self.n.job} ({cols}){output} VALUES {values}"], select)
        # Dedupe, one row per statement: insert only if no unfinished job holds the key. UPDLOCK +
        # HOLDLOCK take a key-range lock on the (possibly absent) key, so a racing second enqueue waits
        # here, then sees the first row and inserts nothing; the filtered unique index is the backstop.
        j = self.n.j
        select_values = self.insert_values_sql(columns)[1:-1]
        return Batch([self.declare("@inserted", back)], [
            f"INSERT INTO {self.n.job} ({cols}){output} SELECT {select_values} "
            f"WHERE NOT EXISTS (SELECT 1 FROM {self.n.job} WITH (UPDLOCK, HOLDLOCK) "
            f"WHERE {j['dedupe_key']} = %s AND {j['status_id']} IN ({sql_list(DEDUPE_SCOPE)}))"
        ], select)

    def insert_params(self, columns: list[str], row: list[Any], dedupe: bool) -> list[Any]:
        params = self.values_params(columns, row)
        return [*params, row[columns.index("dedupe_key")]] if dedupe else params

    # ----- parameters -----------------------------------------------------------------------------
    def execute(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
        """Declare every parameter's type, then send the statement.

        Left to itself the driver declares each string at its exact length (``nvarchar(17)``), so every
        payload length, worker name and batch size compiles and caches a plan of its own; and it asks
        the server to describe every NULL parameter (``sp_describe_undeclared_parameters``, an extra
        round trip). Declared here: text as nvarchar(4000) (nvarchar(max) past that), integers as
        bigint, floats, datetimes as UTC datetime2 (pyodbc drops an aware datetime's offset, and SQL
        Server would then read it in the client's zone; datetime2 converts to datetimeoffset at +00:00);
        a NULL as nvarchar, which converts to the column's type. A few stable declarations per
        statement: a few plans.

        If the batch fails where its own CATCH cannot run (a client timeout, a compile error), the
        session is put back here: no transaction the batch opened left open, NOCOUNT and XACT_ABORT off.
        """
        values = [_utc_naive(p) if isinstance(p, datetime) else p for p in params]
        cursor.setinputsizes([self.param_type(p) for p in values])
        try:
            cursor.execute(sql, values)
        except DatabaseError:
            if not self.connection.in_atomic_block:
                self._reset_session(cursor)
            raise

    @staticmethod
    def _reset_session(cursor: CursorWrapper) -> None:
        try:
            cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION; SET NOCOUNT OFF; SET XACT_ABORT OFF;")
        except DatabaseError:
            pass  # the connection itself is gone: Django discards it

    @staticmethod
    def param_type(value: Any) -> tuple[int, int, int]:
        """(ODBC SQL type, column size, decimal digits) declared for ``value`` (as :meth:`execute` sends it)."""
        if value is None:
            return SQL_WVARCHAR, NVARCHAR_MAX_INLINE, 0
        if isinstance(value, str):
            # nvarchar(n) counts UTF-16 code units: a character outside the BMP takes two
            inline = len(value) <= NVARCHAR_MAX_INLINE // 2 or len(value.encode("utf-16-le")) <= 2 * NVARCHAR_MAX_INLINE
            return SQL_WVARCHAR, (NVARCHAR_MAX_INLINE if inline else 0), 0
        if isinstance(value, int):  # bool too (mssql-django sends it as 0/1)
            return SQL_BIGINT, 19, 0
        if isinstance(value, float):
            return SQL_DOUBLE, 15, 0
        if isinstance(value, datetime):
            return SQL_TYPE_TIMESTAMP, 27, 7
        raise TypeError(f"no SQL Server parameter type is declared for {type(value).__name__} values")

    @classmethod
    def connect_timeout_options(cls, seconds: float) -> dict[str, Any]:
        return {"connection_timeout": max(1, round(seconds))}  # mssql-django: the driver's login timeout

    @staticmethod
    def json_value_check(quoted_column: str) -> str:
        """The check that ``quoted_column`` holds JSON of any kind (NULL passes), for
        :class:`~django_sqlqueue.fields.JSONValueField`.

        Close, not exact: a list of values without its brackets (``1,2``) passes too; the empty string
        does not. The queue writes only ``json.dumps`` output; the check catches hand-made damage.
        """
        return f"(ISJSON(N'[' + {quoted_column} + N']') = 1 AND {quoted_column} <> N'')"

    def claim_plan(self, cursor: CursorWrapper, sql: str, params: list[Any], table: str) -> tuple[list[str], bool]:
        return sqlserver_plan(self, cursor, sql, params, table)

    # ----- errors ---------------------------------------------------------------------------------
    def is_retryable_error(self, exc: BaseException) -> bool:
        """Deadlock victim (1205), lock timeout (1222), snapshot update conflict (3960): safe to rerun.

        Read from the driver's exception, never by searching the message for digits (a job id or a
        payload in the text could contain them): pyodbc's native error number at the end of its
        message and its SQLSTATE (``args[0]``); mssql-python's SQLSTATE (it keeps no native number).
        """
        driver = exc.__cause__ if exc.__cause__ is not None else exc
        args = getattr(driver, "args", ())
        if len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):  # pyodbc
            native = _PYODBC_NATIVE.search(args[1])
            return args[0] in RETRYABLE_SQLSTATES or (native is not None and int(native[1]) in RETRYABLE_ERRORS)
        state = _MSSQL_PYTHON_SQLSTATES.get(getattr(driver, "driver_error", None) or "")
        return state in RETRYABLE_SQLSTATES

    # ----- recurring schedules ---------------------------------------------------------------------
    def claim_schedules_sql(self, limit: int, now: Any = None) -> tuple[str, list[Any]]:
        """UPDLOCK: the due rows stay ours to the end of the look's transaction (and the read sees the
        current row even under READ_COMMITTED_SNAPSHOT); READPAST: rows another looker holds are skipped,
        not waited for; ROWLOCK: other schedules stay claimable. Seeks ``sqlqueue_schedule_due``."""
        s_table, s, _, _ = self.schedule_tables()
        clock, clock_params = self.schedule_clock(now)
        sql = (f"SELECT TOP (%s) s.{s['id']}, {clock} FROM {s_table} AS s{CLAIM_HINTS} "
               f"WHERE {self.schedules_due_where(clock)} ORDER BY s.{s['next_run_at']}, s.{s['id']}")
        return sql, [limit, *clock_params, *clock_params]

    def schedule_clock(self, now: Any) -> tuple[str, list[Any]]:
        # A bound datetime goes as UTC datetime2 (see execute), compared with the datetimeoffset columns.
        return ("SYSUTCDATETIME()", []) if now is None else ("%s", [now])


__all__ = ["MssqlDialect", "Batch", "batch", "CLAIM_HINTS", "LOCKED_READ_HINT", "COL"]


#: Operators that read a whole index or table (a seek reads a range of one).
_SCANS = {"Table Scan", "Clustered Index Scan", "Index Scan"}


def sqlserver_plan(dialect: MssqlDialect, cursor: Any, sql: str, params: list[Any],
                   table: str) -> tuple[list[str], bool]:
    """SQL Server's estimated plan (``SET SHOWPLAN_XML ON``: the batch is compiled, not run), one line
    per operator that reads an index: ``PhysicalOp [table].[index]``; and whether one scans the job table.

    A scan of one of the claim's filtered indexes reads only the rows the filter keeps, so only scans
    of the job table's unfiltered indexes (or the table) count as scans here.
    """
    lines, scans = [], False
    for document in showplan_documents(dialect, cursor, sql, params):
        for relop in ElementTree.fromstring(document).iter(f"{_SHOWPLAN_NS}RelOp"):
            # the operator's own object: a child of its operator element (IndexScan, TableScan, ...),
            # not the objects of the operators below it
            for obj in (o for op in relop for o in op.findall(f"{_SHOWPLAN_NS}Object")):
                lines.append(f"{relop.get('PhysicalOp')} {obj.get('Table', '')}.{obj.get('Index', '')}")
                if (relop.get("PhysicalOp") in _SCANS and obj.get("Table", "").strip("[]") == table
                        and obj.get("Filtered") not in ("1", "true")):
                    scans = True
    return lines, scans


def showplan_operators(documents: list[str]) -> list[str]:
    """Every operator (``PhysicalOp``) of the plans, in document order: e.g. how many sorts a claim has."""
    return [relop.get("PhysicalOp", "") for document in documents
            for relop in ElementTree.fromstring(document).iter(f"{_SHOWPLAN_NS}RelOp")]


def showplan_documents(dialect: MssqlDialect, cursor: Any, sql: str, params: list[Any]) -> list[str]:
    """The estimated plans (``SET SHOWPLAN_XML ON``: compiled, not run) of the batch ``sql``, as XML."""
    # In a transaction that is rolled back: under SHOWPLAN nothing runs on SQL Server, and on a server
    # that ignores SHOWPLAN (Babelfish) the claim it would then run claims nothing for good.
    with transaction.atomic(using=cursor.db.alias):
        cursor.execute("SET SHOWPLAN_XML ON")
        documents = []
        try:
            dialect.execute(cursor, sql, params)  # typed as the worker sends it
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
    return documents


_SHOWPLAN_NS = "{http://schemas.microsoft.com/sqlserver/2004/07/showplan}"
