"""PostgreSQL: ``FOR UPDATE SKIP LOCKED`` candidates, ``UPDATE ... RETURNING``, history in the same statement."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from psycopg import ClientCursor
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from ..states import CLAIMABLE, Status, sql_list
from .base import JOB_COLUMNS, ClaimRequest, Dialect, queue_model
from .plans import postgresql_scans
from .wake import LOOK_MARK, LOOK_SEP, WAKE_ALL, WAKE_PAYLOAD_MAX_BYTES

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper


#: Session liveness (docs/scaling.md, "An idle worker sends nothing"): the advisory lock a supervisor
#: holds on each of its slots' worker rows is (the worker table's oid, the row's id), each modulo 2**31
#: (the two-int4 form: pg_locks shows them as classid, objid, objsubid 2). The table's oid, not its
#: name: two installations in one database (schemas) never stamp each other's rows.
LOCK_ID_MODULUS = 2**31


def _as_is(text: str) -> str:
    return text


#: COPY's text format: a backslash, newline, carriage return or tab inside a value is escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _copy_escape(text: str) -> str:
    return text.translate(_COPY_ESCAPES)


def _copy_text(value: Any) -> str:
    """One value as COPY's text format has it (NULL is ``\\N``)."""
    if value is None:
        return "\\N"
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, str):
        return _copy_escape(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return _copy_escape(str(value))


class PostgresDialect(Dialect):
    vendor = "postgresql"
    # A claim alone (an idle slot woken by NOTIFY, a slot's first claim) is ONE statement: the UPDATE and
    # its history INSERT in one data-modifying CTE. Without BEGIN and COMMIT it saves two round trips,
    # which is most of a wake-up's cost.
    atomic_statement = True
    payload_containment_indexed = True

    def payload_index_sql(self, table: str, column: str, name: str) -> str | None:
        """A GIN index with jsonb_path_ops: serves ``payload @> '{"to": "a@example.com"}'`` (the admin's
        payload search); about a third of the payloads' size, updated on insert only."""
        qn = self.connection.ops.quote_name
        return f"CREATE INDEX IF NOT EXISTS {qn(name)} ON {qn(table)} USING gin ({qn(column)} jsonb_path_ops)"

    def small_tables_stats_sql(self) -> str | None:
        """``ANALYZE`` of the job type and queue pause tables. Autovacuum never analyzes a table of fewer
        than 50 rows, so without this they have no statistics; the planner then guesses that the claim's
        NOT EXISTS on them removes almost every job, prices a claim over a deep backlog at ~800,000
        (the LIMIT no longer cuts the cost), and JIT-compiles every claim: 1.1 s of JIT in a claim of
        6 ms, measured at 100,000 due jobs (bench/claim.py). A few ms, after each sync of the types."""
        return f"ANALYZE {self.n.jobtype}, {self.n.queuepause}"

    def now(self) -> str:
        # The server's clock, never a worker host's, and the STATEMENT's start time, not now()'s
        # transaction start: a claim or completion may run in a transaction that began earlier (a
        # completion rides in the next claim's transaction; a caller's atomic() block), and with now()
        # a job released by a dependency's completion could record a started_at before that
        # dependency's finished_at (issue 31, item 10). statement_timestamp() is fixed for the whole
        # statement, so every stamp of one claim or one completion still agrees; it is STABLE like
        # now(), so "scheduled_for <= it" still seeks the index (clock_timestamp() is VOLATILE: it
        # would move between rows and is not an index bound). A later statement never reads an earlier
        # time than a statement that committed before it began: the history respects causality.
        return "statement_timestamp()"

    def now_plus(self, seconds_sql: str) -> str:
        return f"(statement_timestamp() + ({seconds_sql}) * interval '1 second')"

    def ms_since(self, column_sql: str) -> str:
        return f"CAST(EXTRACT(EPOCH FROM (statement_timestamp() - {column_sql})) * 1000 AS bigint)"

    def epoch_bucket_sql(self, column_sql: str, seconds: int) -> str:
        return f"CAST(FLOOR(EXTRACT(EPOCH FROM {column_sql}) / {int(seconds)}) AS bigint)"

    def row_lock_clause(self) -> str:
        # A row a concurrent transaction changes is waited for, then its WHERE is checked again.
        return " FOR UPDATE"

    # ----- the claim ------------------------------------------------------------------------------
    #: FOR UPDATE OF j: lock only job rows (not the job-type rows the filters read). SKIP LOCKED: a row
    #: another claimer holds is passed over, not waited for: concurrent claimers each take different
    #: rows instead of queueing behind one another.
    CANDIDATE_LOCK = " FOR UPDATE OF j SKIP LOCKED"

    def claim_sql(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        """The claim, ONE data-modifying statement (docs/claim-sql.md shows it rendered)::

            WITH due AS (candidates, locked), [reclaim AS (candidates, locked),]
                 [permit AS (one free permit of a scope with a job to take, locked),
                  limited AS (that scope's first job, locked),]
                 picked AS (the first ``limit`` of their union, claim order),
                 claimed AS (UPDATE job SET <claim SET list> FROM picked RETURNING *),
                 [held AS (UPDATE permit SET held_until, job_id FROM permit, limited, claimed),]
                 hist AS (INSERT INTO history SELECT ... FROM claimed)
            SELECT * FROM claimed ORDER BY <claim order>

        Each branch is its own CTE (FOR UPDATE is not allowed beside UNION) and locks inside it, so its
        LIMIT counts only rows it actually got. The permit CTE (``req.limited``, docs/limits.md) tests
        only the permit row's own columns: a permit another claimer took since this statement's snapshot
        is re-checked by FOR UPDATE against its new ``held_until`` and skipped.
        """
        n, j = self.n, self.n.j
        branches, params = self.claim_branches(req, limit=" LIMIT %s", lock=self.CANDIDATE_LOCK)
        set_sql, set_params = self.claim_set_clause(req, alias="j")
        returning = ", ".join(f"j.{c}" for c in n.job_columns)
        names = list(self.BRANCH_NAMES[:len(branches)])
        ctes = [f"{name} AS ({b}), " for name, b in zip(names, branches, strict=True)]
        held = ""
        if req.limited:
            permit_cte, limited_cte, limited_params = self.limited_ctes(req)
            ctes += [f"permit AS ({permit_cte}), ", f"limited AS ({limited_cte}), "]
            params += limited_params
            names.append("limited")
            p = n.p
            held = (f"held AS (UPDATE {n.permit} hp SET {p['held_until']} = "
                    f"{self.permit_hold('permit.phold', 'claimed.' + j['lease_expires_at'])}, "
                    f"{p['job_id']} = claimed.{j['id']} FROM permit, limited, claimed "
                    f"WHERE hp.{p['id']} = permit.pid AND claimed.{j['id']} = limited.id), ")
        sql = (
            "WITH " + "".join(ctes)
            + "picked AS (SELECT id FROM ("
            + " UNION ALL ".join(f"SELECT * FROM {name}" for name in names)
            + ") c ORDER BY priority DESC, scheduled_for, id LIMIT %s), "
            f"claimed AS (UPDATE {n.job} j SET {set_sql} FROM picked WHERE j.{j['id']} = picked.id "
            f"RETURNING {returning}), "
            + held +
            # The history row is written by the same statement: a claim without its history row
            # cannot exist, even if the worker dies right after.
            f"hist AS ({self.attempt_insert_from('claimed')}) "
            f"SELECT * FROM claimed ORDER BY {self.claimed_order()}"
        )
        return sql, [*params, req.limit, *set_params]

    def limited_ctes(self, req: ClaimRequest) -> tuple[str, str, list[Any]]:
        """(permit CTE, limited CTE, their params): one free permit, locked, of a scope that has a job
        to take; then that scope's first job in claim order, locked (both SKIP LOCKED)."""
        n, p = self.n, self.n.p
        common, common_params = self.common_filters(req, limited=True)
        free, free_params = self.permit_filters(req)
        permit = (
            f"SELECT p.{p['id']} AS pid, p.{p['job_type_id']} AS ptype, p.{p['key']} AS pkey, "
            f"p.{p['hold_seconds']} AS phold FROM {n.permit} p WHERE {free} AND EXISTS (SELECT 1 FROM {n.job} j "
            f"WHERE {self.limited_job_predicate('p.' + p['job_type_id'], 'p.' + p['key'])} AND {common}) "
            f"ORDER BY {self.permit_order()} LIMIT 1 FOR UPDATE OF p SKIP LOCKED"
        )
        # LATERAL: the job is sought for the permit taken, one index seek; as a plain join the planner,
        # not knowing that the permit CTE holds one row or none, may walk a deep limited backlog first.
        limited = (
            f"SELECT l.* FROM permit CROSS JOIN LATERAL (SELECT {self.candidate_columns()} FROM {n.job} j "
            f"WHERE {self.limited_job_predicate('permit.ptype', 'permit.pkey')} AND {common} "
            f"ORDER BY {self.candidate_order()} LIMIT 1 FOR UPDATE OF j SKIP LOCKED) l"
        )
        return permit, limited, [*free_params, *common_params, *common_params]

    def permit_order(self) -> str:
        p = self.n.p
        return f"p.{p['held_until']} NULLS FIRST, p.{p['id']}"

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        sql, params = self.claim_sql(req)
        cursor.execute(sql, params)
        return cursor.fetchall()

    # ----- completion -----------------------------------------------------------------------------
    # VALUES rows are typed by their first row; say the types so a NULL response is still jsonb.
    complete_casts = ("%s::bigint", "%s::integer", "%s::jsonb", "%s::bigint")

    def complete_sql(self, nrows: int) -> str:
        """One data-modifying CTE completes the jobs whose token matches and closes their history rows::

            WITH done AS (UPDATE job SET <completion SET list> FROM (VALUES ...) v
                          WHERE id = v.vid AND version = v.vversion AND status = Processing RETURNING *),
                 hist AS (UPDATE history SET <closed as completed> FROM done WHERE <its open row>)
            SELECT * FROM done
        """
        n, j, a = self.n, self.n.j, self.n.a
        cols = ", ".join(f"j.{c}" for c in n.job_columns)
        return (
            f"WITH done AS (UPDATE {n.job} j SET {self.complete_set_clause('j')} "
            f"FROM {self.complete_values(nrows)} "
            f"WHERE j.{j['id']} = v.vid AND j.{j['version']} = v.vversion "
            f"AND j.{j['status_id']} = {int(Status.PROCESSING)} RETURNING {cols}), "
            f"hist AS (UPDATE {n.attempt} a SET {self.completed_attempt_set('done.' + j['duration_ms'])} "
            f"FROM done WHERE a.{a['job_id']} = done.{j['id']} AND a.{a['attempt_num']} = done.{j['attempt_num']} "
            f"AND a.{a['finished_at']} IS NULL) "
            f"SELECT {', '.join(n.job_columns)} FROM done"
        )

    #: Rows per bulk INSERT: the unnest form below carries one array parameter per column, not one
    #: parameter per value, so a statement may hold many rows without a huge query text to build,
    #: send and parse.
    insert_rows = 5000

    def insert_chunk(self, per_row: int) -> int:
        return self.insert_rows

    def insert_unnest_sql(self, columns: list[str], dedupe: bool) -> str:
        """``INSERT ... SELECT ... FROM unnest(%s::type[], ...)``: one array parameter per column.

        Same rows, defaults and conflict rule as :meth:`insert_sql` (enqueued_at/updated_at from the
        database clock, scheduled_for defaulting to it, ``ON CONFLICT DO NOTHING`` for dedupe).
        """
        Job = queue_model("Job")
        arrays, names, select = [], [], []
        for i, c in enumerate(columns):
            if c in ("enqueued_at", "updated_at"):
                select.append(self.now())
                continue
            field = next(f for f in Job._meta.concrete_fields if f.attname == c)
            arrays.append(f"%s::{field.db_type(self.connection)}[]")
            names.append(f"c{i}")
            select.append(f"COALESCE(u.c{i}, {self.now()})" if c == "scheduled_for" else f"u.c{i}")
        conflict = " ON CONFLICT DO NOTHING" if dedupe else ""
        return (
            f"INSERT INTO {self.n.job} ({self.insert_columns_sql(columns)}) SELECT {', '.join(select)} "
            f"FROM unnest({', '.join(arrays)}) AS u({', '.join(names)}){conflict} "
            f"RETURNING {', '.join(self.n.job_columns)}"
        )

    #: The wake-up sent in a transaction of its own, right after the jobs' commit: ``synchronous_commit``
    #: off for that transaction only (``set_config(..., true)``), so its commit does not wait for a WAL
    #: flush. A notification is no data: if the server crashed before that flush, the jobs are
    #: committed and durable all the same, and workers claim them when they come back or poll.
    NOTIFY_AFTER_COMMIT = "SELECT pg_notify(%s, %s), set_config('synchronous_commit', 'off', true)"

    def insert_stamped(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]], channel: str,
                       queues: str) -> list[tuple[Any, ...]]:
        params = [p for row in rows for p in self.insert_params(columns, row, False)]
        # Only the id and the clock come back: enqueued_at and updated_at ARE the statement's
        # statement_timestamp() and so is scheduled_for unless one was sent; each timestamp read costs a parse.
        sql = self.insert_sql(columns, len(rows), False, returning=("id", "enqueued_at"))
        if not channel:  # no wake-up, or the caller's transaction sends it after its commit
            cursor.execute(sql, params)
        elif self.notifies_after_commit(cursor):
            # ONE round trip, two transactions: the INSERT commits (durably) on its own, then the
            # notification goes out in a second, non-durable transaction (docs/worker.md, "Wake-ups").
            # Why not pg_notify in the INSERT's own transaction: PostgreSQL serialises the commits of
            # transactions that notified (a global lock, held through the commit's WAL flush), so
            # concurrent enqueues could not share a flush (group commit) and enqueue throughput stopped
            # growing with writers. The notification still follows the jobs' commit, so a woken worker
            # always sees them.
            # An explicit BEGIN: a COMMIT in an implicit block made the server log a WARNING ("there is
            # no transaction in progress") per enqueue. If the INSERT fails, that block is left aborted:
            # rolled back here, so the session is usable again (autocommit never sends a ROLLBACK).
            try:
                cursor.execute(f"BEGIN; {sql}; COMMIT; {self.NOTIFY_AFTER_COMMIT}", [*params, channel, queues])
                cursor.cursor.nextset()  # past BEGIN's result to the INSERT's rows
            except Exception:
                raw = cursor.cursor.connection
                if raw.info.transaction_status == TransactionStatus.INERROR:
                    raw.execute("ROLLBACK")
                raise
        else:
            # Server-side binding (one statement per message) or a transaction Django does not manage
            # (AUTOCOMMIT off): pg_notify in the RETURNING list, once per row (PostgreSQL folds identical
            # notifications of one transaction into one), delivered when the transaction commits.
            cursor.execute(sql + ", pg_notify(%s, %s)", [*params, channel, queues])
        at = columns.index("scheduled_for")
        return [(job_id, now, now if row[at] is None else row[at].astimezone(now.tzinfo), now)
                for (job_id, now, *_), row in zip(sorted(cursor.fetchall(), key=lambda r: r[0]), rows, strict=True)]

    def notifies_after_commit(self, cursor: CursorWrapper) -> bool:
        """Whether :meth:`insert_stamped` may commit the jobs itself and notify in a transaction of its
        own: in autocommit, with client-side binding (Django's default for psycopg 3), whose simple-query
        messages may carry several statements. With server-side binding each message is one statement."""
        raw = getattr(cursor, "cursor", None)
        # IDLE: no transaction opened behind Django's back (a raw BEGIN), which the COMMIT would end.
        return (self.connection.get_autocommit() and isinstance(raw, ClientCursor)
                and raw.connection.info.transaction_status == TransactionStatus.IDLE)

    def notify_after_commit(self, cursor: CursorWrapper, channel: str, queues: str) -> None:
        """Wake idle workers for jobs committed just before, in autocommit (an on_commit hook)."""
        cursor.execute(self.NOTIFY_AFTER_COMMIT, [channel, queues])

    def json_param(self, text: str) -> Any:
        # psycopg's jsonb wrapper around text that is already JSON: typed jsonb for server-side
        # binding too, and encoded once (Django's own form would run json.dumps again).
        return Jsonb(text, dumps=_as_is)

    @staticmethod
    def json_text(param: Any) -> str:
        if isinstance(param, Jsonb):
            return (param.dumps or json.dumps)(param.obj)
        return param

    #: From this many rows without dedupe keys, bulk enqueue uses COPY (see :meth:`copy_jobs`).
    copy_min_rows = 200

    def insert_job(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]],
                   dedupe: bool) -> list[tuple[Any, ...]]:
        if len(rows) < 4:  # a few rows: the plain VALUES form is as cheap and its plan is cached
            return super().insert_job(cursor, columns, rows, dedupe)
        if not dedupe and len(rows) >= self.copy_min_rows:
            return self.copy_jobs(cursor, columns, rows)
        kept = [i for i, c in enumerate(columns) if c not in ("enqueued_at", "updated_at")]
        cursor.execute(self.insert_unnest_sql(columns, dedupe), [[row[i] for row in rows] for i in kept])
        return cursor.fetchall()

    def copy_jobs(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]]) -> list[tuple[Any, ...]]:
        """Bulk insert with ``COPY ... FROM STDIN``; return the JOB_COLUMNS rows it wrote.

        COPY cannot return rows, so the ids are drawn from the table's identity sequence first
        (``nextval``, safe beside concurrent inserts) and the database clock is read in the same
        transaction: the SELECT's ``statement_timestamp()``, the value an INSERT in its place would
        have stamped. Only for rows without a dedupe key (those need ``ON CONFLICT``).
        """
        Job = queue_model("Job")
        n = len(rows)
        cursor.execute(
            # the clock in the first row only: one timestamp to parse, not one per job
            "SELECT CASE WHEN g = 1 THEN statement_timestamp() END, nextval(pg_get_serial_sequence(%s, %s)) "
            "FROM generate_series(1, %s) g",
            [Job._meta.db_table, Job._meta.pk.column, n],
        )
        drawn = cursor.fetchall()
        now = drawn[0][0]
        index = {c: i for i, c in enumerate(columns)}
        copy_cols = ["id", *columns]
        out: list[tuple[Any, ...]] = []
        cols_sql = ", ".join(self.n.j[c] for c in copy_cols)
        with cursor.cursor.copy(f"COPY {self.n.job} ({cols_sql}) FROM STDIN") as copy:
            for (_, job_id), row in zip(drawn, rows, strict=True):
                values = list(row)
                values[index["enqueued_at"]] = values[index["updated_at"]] = now
                if values[index["scheduled_for"]] is None:
                    values[index["scheduled_for"]] = now
                # psycopg's Jsonb wrapper: encode once, for COPY and the row
                values[index["payload"]] = self.json_text(values[index["payload"]])
                copy.write_row([job_id, *values])
                out.append(self._returned_row(job_id, values, index))
        return out

    # ----- bulk enqueue through COPY, returning ids (issue 30, item 4) ---------------------------------
    #: ``enqueue_many`` of at least this many rows, none with a dedupe key, goes through :meth:`copy_stamped`.
    copy_stamped_min_rows = 200

    def copy_stamped(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]], payloads: list[str],
                     meanwhile: Callable[[list[int], Any], Any]) -> Any:
        """Insert job rows with ONE ``COPY ... FROM STDIN`` in text format; return what ``meanwhile``
        returns, called with their ids (in row order) and the database clock they were stamped with
        after the last row is sent and before the server is waited for: the caller's work on the new
        jobs overlaps the server's (a bulk load's server side takes as long as its client side).

        ``rows`` are in ``columns`` (attnames) order with values in database form; ``payloads`` their
        payloads' JSON text. None of them may carry a dedupe key: COPY has no ``ON CONFLICT``, so keyed
        rows take :meth:`insert_job`. Only what the database decides comes back (as
        :meth:`insert_stamped`): the caller has the rest of every row.

        Why it is faster than :meth:`copy_jobs`: the ids come back as ONE array (not a row per job),
        in one round trip with the clock; each line is formatted here from a prefix shared by every row
        with the same values in the columns that are not the payload (rows of one bulk call mostly
        are), instead of psycopg adapting every value of every row; and the lines go out in large writes.
        """
        Job = queue_model("Job")
        cursor.execute(
            "SELECT statement_timestamp(), (SELECT array_agg(nextval(pg_get_serial_sequence(%s, %s))) "
            "FROM generate_series(1, %s))",
            [Job._meta.db_table, Job._meta.pk.column, len(rows)],
        )
        now, drawn = cursor.fetchone()
        ids = sorted(drawn)  # in row order, as an INSERT's VALUES would have drawn them
        stamp = now.isoformat()
        at = columns.index("payload")
        fixed = [i for i, c in enumerate(columns) if c != "payload"]
        by_column = {c: i for i, c in enumerate(columns)}
        stamped = {by_column["enqueued_at"], by_column["updated_at"]}
        scheduled_at = by_column["scheduled_for"]
        copy_cols = [columns[i] for i in fixed] + ["payload", "id"]
        prefixes: dict[tuple[Any, ...], str] = {}
        lines: list[str] = []
        with cursor.cursor.copy(
                f"COPY {self.n.job} ({', '.join(self.n.j[c] for c in copy_cols)}) FROM STDIN") as copy:
            for row, payload, job_id in zip(rows, payloads, ids, strict=True):
                key = (*row[:at], *row[at + 1:])  # every value but the payload, in ``fixed`` order
                prefix = prefixes.get(key)
                if prefix is None:
                    cells = []
                    for i in fixed:
                        if i in stamped or (i == scheduled_at and row[i] is None):
                            cells.append(stamp)
                        else:
                            cells.append(_copy_text(row[i]))
                    prefix = prefixes[key] = "\t".join(cells) + "\t"
                if "\\" in payload:  # json.dumps escapes control characters: a backslash is all there is
                    payload = _copy_escape(payload)
                lines.append(f"{prefix}{payload}\t{job_id}\n")
                if len(lines) >= 2000:
                    copy.write("".join(lines))
                    lines.clear()
            if lines:
                copy.write("".join(lines))
            done = meanwhile(ids, now)
        return done

    @staticmethod
    def _returned_row(job_id: int, values: list[Any], index: dict[str, int]) -> tuple[Any, ...]:
        """A JOB_COLUMNS row as the database would have returned it (payload is jsonb text, as Django reads it)."""
        row: list[Any] = []
        for c in JOB_COLUMNS:
            if c == "id":
                row.append(job_id)
            elif c in index:
                row.append(values[index[c]])
            else:
                row.append(None)  # response, started_at, finished_at, duration_ms, lease_expires_at
        return tuple(row)

    def is_retryable_error(self, exc: BaseException) -> bool:
        # 40P01 deadlock_detected, 40001 serialization_failure, 55P03 lock_not_available
        code = getattr(getattr(exc, "__cause__", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
        return code in {"40P01", "40001", "55P03"}

    @staticmethod
    def error_hint(exc: BaseException) -> str:
        # 42P05 duplicate_prepared_statement, 26000 invalid_sql_statement_name: psycopg's prepared
        # statements (_pg3_N) on a server connection that a transaction pooler shares between clients.
        code = getattr(getattr(exc, "__cause__", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
        if code in {"42P05", "26000"}:
            return ("prepared statements through a transaction pooler: remove prepare_threshold from the "
                    "database's OPTIONS (Django's default, None, prepares nothing), or use PgBouncer >= 1.21 "
                    "with max_prepared_statements set; see docs/pgbouncer.md")
        return ""

    @classmethod
    def connect_timeout_options(cls, seconds: float) -> dict[str, Any]:
        return {"connect_timeout": max(2, round(seconds))}  # libpq: whole seconds, 2 at least

    def notify_sql(self) -> str | None:
        return "SELECT pg_notify(%s, %s)"

    can_listen = True

    # ----- session liveness: an idle worker's rows stamped by the fleet's look -------------------------
    session_liveness = True

    def liveness_key_sql(self) -> str:
        """The locks' first key, from the worker table's oid (param: the quoted table name)."""
        return f"(%s::regclass::oid::int8 %% {LOCK_ID_MODULUS})::int4"

    def lock_rows_sql(self, count: int) -> str:
        """Take the session lock of the live worker rows of ``count`` (name, incarnation) pairs (params:
        :meth:`lock_rows_params`): each row's id, name, incarnation, whether the lock is held, and the
        clock AFTER it was taken (a look that began later saw it: :meth:`fleet_look_sql`). A lock already
        held is taken again (session locks count): the caller asks for each row once per connection."""
        n, w = self.n, self.n.w
        pairs = ", ".join(["(%s, %s)"] * count)
        return (f"WITH l AS MATERIALIZED (SELECT w.{w['id']} AS id, w.{w['name']} AS name, "
                f"w.{w['incarnation']} AS inc, pg_try_advisory_lock({self.liveness_key_sql()}, "
                f"(w.{w['id']} %% {LOCK_ID_MODULUS})::int4) AS ok FROM {n.worker_table} w "
                f"WHERE (w.{w['name']}, w.{w['incarnation']}) IN ({pairs}) AND w.{w['stopped_at']} IS NULL) "
                f"SELECT l.id, l.name, l.inc, l.ok, extract(epoch FROM clock_timestamp())::float8 FROM l")

    def lock_rows_params(self, pairs: list[tuple[str, str]]) -> list[Any]:
        return [self.n.worker_table, *(value for pair in pairs for value in pair)]

    def unlock_row_sql(self) -> str:
        """Release one row's session lock (params: :meth:`unlock_row_params`)."""
        return f"SELECT pg_advisory_unlock({self.liveness_key_sql()}, (%s %% {LOCK_ID_MODULUS})::int4)"

    def unlock_row_params(self, row_id: int) -> list[Any]:
        return [self.n.worker_table, row_id]

    @staticmethod
    def keepalive_sql() -> str:
        """Make the server drop a vanished client's session within about 25 s: its session locks, which
        keep its rows stamped, must not outlive a host that lost power by the kernel's defaults (two
        hours of silence before keepalives; some 15 minutes of retransmissions while the server has
        notifications to send it, which ``tcp_user_timeout`` bounds). Ignored on a Unix socket, where a
        dead client is seen at once. A proxy between (PgBouncer) keeps the server's session open: there
        these bound nothing."""
        return ("SELECT set_config('tcp_keepalives_idle', '10', false), "
                "set_config('tcp_keepalives_interval', '5', false), set_config('tcp_keepalives_count', '3', false), "
                "set_config('tcp_user_timeout', '25000', false)")

    def fleet_look_sql(self, channel: str, *, interval: float, since_seconds: float, default_max_attempts: int,
                       worker_dead_after_seconds: float, rows: int,
                       stamp_older_than: float = 0.0) -> tuple[str, list[Any]]:
        """The fleet's look, ONE statement of index seeks (docs/scaling.md, "The fleet's look")::

            WITH RECURSIVE stamped AS (the live worker rows whose session lock is held (their
                                       supervisor's connection is alive), whose ``stamp_until`` has not
                                       passed (their supervisor beat lately, for idle slots) and whose
                                       heartbeat is older than ``stamp_older_than``: heartbeat now),
                 pr AS (the claimable priorities, one claim-index seek each),
                 came_due AS (per priority, the queues of the jobs that came due in the last
                              ``since_seconds``: a range of the claim index, at most ``rows`` per priority),
                 back AS (the queues of Processing jobs a claim takes back since the window began
                          (expired lease, stopped or silent worker), from the Processing index, at most
                          ``rows``),
                 scopes AS (the limit scopes with a free permit and a permit of theirs (a surplus one
                            too) freed in the window (its lease ran out, or a finish released it), or a
                            job that came due in it, at most ``rows``),
                 named AS (came_due UNION back UNION per scope the queues of its due jobs (at most
                           ``rows`` read))
            SELECT pg_notify(channel, LOOK_MARK interval/live slots/now LOOK_MARK queue:jobs,...)

        The header's ``now`` (the statement's start, seconds since 1970) tells a supervisor whose rows'
        locks were taken before it, and whose last beat set their ``stamp_until``, that its rows are
        stamped: it need not beat for idle slots (worker/beats.py). ``stamp_older_than`` 0 stamps nothing
        and leaves ``now`` empty (no worker takes a look that stamped nothing for a beat).

        Each queue is named with the number of its jobs found (a worker wakes as many idle slots), or
        the names are ``*`` (every queue, every idle slot) when a part read as many rows as it may
        (``rows`` jobs came due in the window: a busy fleet; or as many jobs to take back, or scopes:
        more may lie beyond) or when they would not fit in one notification. Paused queues and types and jobs without attempts
        left are passed over as the claim passes them over. A job made claimable with a due time before
        the window (a hand-back, a workflow release, a retry or resume by an operator) is not named
        here: those changes wake the workers of its queue themselves (queue/modify.py, pauses.py). A
        job due long ago that no worker took is not named again, so a queue nobody serves wakes nobody.
        """
        n, j, w, p = self.n, self.n.j, self.n.w, self.n.p
        req = ClaimRequest(worker="", limit=rows, default_max_attempts=default_max_attempts)
        common, common_params = self.common_filters(req)
        limited_common, limited_params = self.common_filters(req, limited=True)
        free, free_params = self.permit_filters(req)
        prio, queue = j["priority"], j["queue"]
        in_index = f"j.{j['status_id']} IN ({sql_list(CLAIMABLE)}) AND j.{j['limited']} = {self.false_literal}"
        w_name, stopped, beat = w["name"], w["stopped_at"], w["last_heartbeat"]
        # Workers that died within the window: stopped (the host's sweep stamps a gone process), or
        # whose heartbeat crossed the dead-after age within it.
        died = (f"SELECT w.{w_name} FROM {n.worker_table} w WHERE w.{stopped} > {self.now_plus('%s')} "
                f"OR (w.{beat} < {self.now_plus('%s')} AND w.{beat} > {self.now_plus('%s')})")
        live = (f"SELECT count(*) FROM {n.worker_table} w WHERE w.{stopped} IS NULL "
                f"AND w.{beat} > {self.now_plus('%s')}")
        lease = j["lease_expires_at"]
        scope_job = (f"{self.limited_job_predicate('p.' + p['job_type_id'], 'p.' + p['key'])} AND {limited_common} "
                     f"AND j.{j['scheduled_for']} > {self.now_plus('%s')}")
        # Rows whose supervisor holds their session lock: pg_locks read once (an uncorrelated IN)
        locked = ("SELECT l.objid::int8 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
                  f"AND l.objsubid = 2 AND l.classid::int8 = {self.liveness_key_sql()} "
                  "AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())")
        # The look's clock only when it stamps: a worker answers its slots from a stamp only if there is one
        stamp_clock = f"extract(epoch FROM {self.now()})::float8" if stamp_older_than > 0 else "''"
        sql = (
            f"WITH RECURSIVE stamped AS (UPDATE {n.worker_table} w SET {beat} = {self.now()} "
            f"WHERE %s > 0 AND w.{stopped} IS NULL AND w.{beat} < {self.now_plus('%s')} "
            f"AND w.{w['stamp_until']} > {self.now()} "
            f"AND w.{w["id"]} %% {LOCK_ID_MODULUS} IN ({locked}) RETURNING 1), "
            f"pr(p) AS ("
            f"(SELECT j.{prio} FROM {n.job} j WHERE {in_index} ORDER BY j.{prio} DESC LIMIT 1) "
            f"UNION ALL SELECT (SELECT j.{prio} FROM {n.job} j WHERE {in_index} AND j.{prio} < pr.p "
            f"ORDER BY j.{prio} DESC LIMIT 1) FROM pr WHERE pr.p IS NOT NULL), "
            f"came_due(q) AS (SELECT d.q FROM pr CROSS JOIN LATERAL (SELECT j.{queue} AS q FROM {n.job} j "
            f"WHERE {self.due_predicate()} AND j.{prio} = pr.p AND j.{j['scheduled_for']} > {self.now_plus('%s')} "
            f"AND {common} ORDER BY j.{j['scheduled_for']} DESC LIMIT %s) d), "
            # Processing jobs that became a claim's to take back within the window: the lease ran out, or
            # the worker died (once named, not again: a type no worker serves wakes nobody for ever)
            f"back(q) AS (SELECT j.{queue} FROM {n.job} j "
            f"WHERE j.{j['status_id']} = {int(Status.PROCESSING)} "
            f"AND ((j.{lease} < {self.now()} AND j.{lease} > {self.now_plus('%s')}) OR j.{j['worker']} IN ({died})) "
            f"AND {common} LIMIT %s), "
            # Limit scopes with a free permit and one of its permits (a surplus one too: its release is what
            # opens the scope again) whose lease ran out or that a finish released within the window
            # (released_until stamps it), or with a job that came due within it
            f"scopes(ptype, pkey) AS (SELECT DISTINCT p.{p['job_type_id']}, p.{p['key']} "
            f"FROM {n.permit} p WHERE {free} AND (EXISTS (SELECT 1 FROM {n.permit} sq "
            f"WHERE sq.{p['job_type_id']} = p.{p['job_type_id']} AND sq.{p['key']} = p.{p['key']} "
            f"AND sq.{p['held_until']} > {self.now_plus('%s')} "
            f"AND sq.{p['held_until']} < {self.now()}) "
            f"OR EXISTS (SELECT 1 FROM {n.job} j WHERE {scope_job})) LIMIT %s), "
            f"named(q, n) AS (SELECT q, count(*) FROM came_due GROUP BY q "
            f"UNION ALL SELECT q, 1 FROM back "
            f"UNION ALL SELECT l.q, 1 FROM scopes fp "
            f"CROSS JOIN LATERAL (SELECT DISTINCT x.q FROM (SELECT j.{queue} AS q FROM {n.job} j WHERE "
            f"{self.limited_job_predicate('fp.ptype', 'fp.pkey')} AND {limited_common} LIMIT %s) x) l) "
            # Every queue (*) when a part found as many rows as it reads: more may lie beyond
            f"SELECT pg_notify(%s, %s || ({live}) || %s || {stamp_clock} || %s || COALESCE((SELECT CASE WHEN "
            f"(SELECT count(*) FROM came_due) >= %s OR (SELECT count(*) FROM back) >= %s "
            f"OR (SELECT count(*) FROM scopes) >= %s OR octet_length(x) > %s THEN %s ELSE x END "
            f"FROM (SELECT string_agg(q || ':' || n, %s ORDER BY q) AS x "
            f"FROM (SELECT q, sum(n) AS n FROM named GROUP BY q) t) s), ''))"
        )
        back, dead = -float(since_seconds), -float(worker_dead_after_seconds)
        params = [stamp_older_than, -float(stamp_older_than), n.worker_table,
                  back, *common_params, rows,
                  back, back, dead, dead + back, *common_params, rows,
                  *free_params, back, *limited_params, back, rows, *limited_params, rows,
                  channel, f"{LOOK_MARK}{interval:g}/", dead, "/", LOOK_MARK, rows, rows, rows,
                  WAKE_PAYLOAD_MAX_BYTES - 64, WAKE_ALL, LOOK_SEP]
        return sql, params

    def released_until(self) -> str:
        # A moment in the past, not NULL: the permit is free at once (held_until < now), and the fleet's
        # look, which names each limit scope whose permit freed within its window, sees this one too.
        # With NULL, a job of the scope that waits in a queue the finishing worker does not serve waited
        # for an idle slot's backstop claim, which the look has made rare (LOOKED_BACKSTOP_SECONDS).
        return self.now_plus("-0.001")

    def estimated_rows(self, table: str) -> int | None:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                           [self.connection.ops.quote_name(table)])
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] and row[0] > 0 else None

    def claim_plan(self, cursor: CursorWrapper, sql: str, params: list[Any], table: str) -> tuple[list[str], bool]:
        cursor.execute("EXPLAIN " + sql, params)
        lines = [r[0] for r in cursor.fetchall()]
        return lines, postgresql_scans(lines, table)

    # ----- recurring schedules ---------------------------------------------------------------------
    def claim_schedules_sql(self, limit: int, now: Any = None) -> tuple[str, list[Any]]:
        # FOR UPDATE OF s SKIP LOCKED: a schedule another worker is enqueueing is passed over, and one it
        # has just advanced is re-checked against its new next_run_at (READ COMMITTED re-evaluates the
        # WHERE clause on the locked row's latest version), so each tick is claimed by one worker.
        sql, params = super().claim_schedules_sql(limit, now)
        return sql + " FOR UPDATE OF s SKIP LOCKED", params

    #: The look's transaction may sit between two statements for at most this long (ms) before the
    #: server ends the session, and one of its statements may run at most this long.
    LOOK_IDLE_TIMEOUT_MS = 10_000
    LOOK_STATEMENT_TIMEOUT_MS = 30_000

    @contextmanager
    def schedules_transaction(self) -> Iterator[None]:
        """The look's transaction, bounded by the server (issue 31, item 2).

        It holds the claimed schedule rows (FOR UPDATE) while Python enqueues their ticks, and every
        other worker's SKIP LOCKED read passes them over. A worker frozen there (SIGSTOP, a VM paused,
        swap) would leave its session "idle in transaction" for as long as the freeze lasts, and every
        tick of those schedules would stop for the whole fleet. ``set_config(..., true)`` is SET LOCAL:
        ``idle_in_transaction_session_timeout`` makes the server end the session (rolling back the
        look: nothing half-enqueued) once it waits for its frozen client past the bound, and
        ``statement_timeout`` bounds a statement stuck behind a lock. Local to this transaction only:
        the worker's other transactions and handlers' own (which may legitimately wait long inside
        ``atomic()``) are not touched, and nothing leaks through a transaction pooler. One statement
        more per look that claims (a look with nothing due claims nothing and sends none of this).
        """
        from django.db import transaction

        with transaction.atomic(using=self.connection.alias), self.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true), "
                           "set_config('statement_timeout', %s, true)",
                           [f"{self.LOOK_IDLE_TIMEOUT_MS}ms", f"{self.LOOK_STATEMENT_TIMEOUT_MS}ms"])
            yield
