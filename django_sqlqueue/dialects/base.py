"""The contract every vendor implements, and the SQL they share.

A dialect renders statements; the manager executes them. Every dialect's ``claim`` returns rows in
:data:`JOB_COLUMNS` order, whatever the vendor's way of returning them (``RETURNING`` or ``OUTPUT``).
Table and column names come from model meta through ``connection.ops.quote_name``; values are always
bound parameters, except status ids, which are code constants from :mod:`django_sqlqueue.states`
rendered as literals so that filtered indexes match at compile time.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import transaction

from ..states import CLAIMABLE, FINISHED, Status, sql_list

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

#: Columns every claim/modify returns, in this order (attnames of ``Job``).
JOB_COLUMNS: tuple[str, ...] = (
    "id",
    "queue",
    "job_type_id",
    "status_id",
    "step",
    "priority",
    "attempt_num",
    "max_attempts",
    "payload",
    "response",
    "error",
    "enqueued_at",
    "scheduled_for",
    "started_at",
    "finished_at",
    "duration_ms",
    "version",
    "updated_at",
    "worker",
    "lease_expires_at",
    "dedupe_key",
    "trace_context",
    "has_dependents",  # workflow markers: the finish path decides from the row it gets back (workflows.py)
    "batch_id",
)
#: The partial indexes the claim's two branches walk (names from Job.Meta.indexes).
CLAIM_INDEX = "sqlqueue_job_claim"
PROCESSING_INDEX = "sqlqueue_job_processing"
#: Every job by (status, type, queue): the operator's counts read it index-only.
STATUS_INDEX = "sqlqueue_job_status_type"
#: The jobs of limited types that wait or run (they are not in the claim index).
LIMITED_INDEX = "sqlqueue_job_limited"
#: Position of each of JOB_COLUMNS in a returned row.
COL: dict[str, int] = {c: i for i, c in enumerate(JOB_COLUMNS)}


@dataclass(frozen=True)
class ClaimRequest:
    """What one claim asks for. Validated by the manager before a dialect sees it."""

    worker: str
    limit: int
    queues: tuple[str, ...] = ()
    types: tuple[int, ...] = ()  # job type ids
    default_max_attempts: int = 3
    default_lease_seconds: int = 60
    worker_dead_after_seconds: float = 60.0
    #: Also take stuck Processing jobs (this worker's own, expired leases, dead or stopped workers).
    #: A busy worker leaves this off between periodic looks: the due-only claim is much cheaper.
    reclaim: bool = True
    #: The claiming process's incarnation (``Worker.incarnation``), stamped on the claimed jobs. Jobs
    #: held under this worker name by ANOTHER incarnation are taken back as leftovers, but only while
    #: no other incarnation holds the name's worker row (a replaced process must not take its
    #: replacement's jobs).
    incarnation: str = ""
    #: Also take at most one job of a limited type (docs/limits.md) with a free permit of its scope.
    #: Off while no type has a limit: claims of unlimited jobs then carry nothing of the feature but
    #: the due branch's exclusion of limited types (a test of the type row it already reads).
    limited: bool = False


def _marks(count: int) -> str:
    return ", ".join(["%s"] * count)


@cache
def queue_model(name: str) -> Any:
    """The queue's model ``name``, from Django's app registry: the dialects and the queue wing sit below
    models.py (which builds its manager on them) and reach the models without importing it. Resolved
    once per name and process (a dict hit after that), so no caller pays a registry lookup per job."""
    return apps.get_model("django_sqlqueue", name)


class Names:
    """Quoted table and column names, all taken from model meta (once per connection's dialect)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        Job, JobAttempt, JobType, LimitPermit, QueuePause, Worker = map(
            queue_model, ("Job", "JobAttempt", "JobType", "LimitPermit", "QueuePause", "Worker"))
        qn = connection.ops.quote_name
        self.job = qn(Job._meta.db_table)
        self.attempt = qn(JobAttempt._meta.db_table)
        self.jobtype = qn(JobType._meta.db_table)
        self.worker_table = qn(Worker._meta.db_table)
        self.permit = qn(LimitPermit._meta.db_table)
        self.queuepause = qn(QueuePause._meta.db_table)

        def cols(model: Any) -> dict[str, str]:
            return {f.attname: qn(f.column) for f in model._meta.concrete_fields}

        self.j = cols(Job)
        self.a = cols(JobAttempt)
        self.t = cols(JobType)
        self.w = cols(Worker)
        self.p = cols(LimitPermit)
        self.qp = cols(QueuePause)
        self.job_columns = [self.j[c] for c in JOB_COLUMNS]


class Dialect:
    """Base class: shared statement shapes, with vendor fragments supplied by subclasses."""

    vendor: str = ""
    #: Literal for boolean true in this vendor's SQL.
    true_literal: str = "TRUE"
    false_literal: str = "FALSE"
    #: The empty string as a literal of the text columns' type.
    empty_string: str = "''"
    #: True when ``payload @> {...}`` (JSON containment) is served by an index (see
    #: :meth:`payload_index_sql`); elsewhere the admin's payload search reads each payload it filters.
    payload_containment_indexed: bool = False

    def payload_index_sql(self, table: str, column: str, name: str) -> str | None:
        """DDL for an index serving payload containment searches, or None where the vendor has none."""
        return None

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.n = Names(connection)
        self._insert_sql_cache: dict[tuple[Any, ...], str] = {}

    # ----- fragments each vendor provides -------------------------------------------------------
    def now(self) -> str:
        """The database clock, in the type the datetime columns use (UTC)."""
        raise NotImplementedError

    def now_plus(self, seconds_sql: str) -> str:
        """The database clock plus ``seconds_sql`` seconds (an SQL expression; whole seconds suffice)."""
        raise NotImplementedError

    def ms_since(self, column_sql: str) -> str:
        """Whole milliseconds from ``column_sql`` to now."""
        raise NotImplementedError

    def epoch_bucket_sql(self, column_sql: str, seconds: int) -> str:
        """``floor(unix time of column_sql / seconds)``: which ``seconds``-long bucket since 1970 (UTC) a
        time falls in, in the database's own date arithmetic (Django's ``Trunc`` runs a Python function
        per row on SQLite). No parameters, so that a GROUP BY repeats it as the same expression. Written
        with ``%%`` for a literal ``%``: it goes into statements that carry parameters."""
        raise NotImplementedError

    def index_hint(self, index_name: str) -> str:
        """Clause after a table alias that pins the candidate SELECT to an index ("" = trust the planner)."""
        return ""

    def small_tables_stats_sql(self) -> str | None:
        """A statement refreshing the planner statistics of the small tables the claim joins (job types,
        queue pauses), or None where the vendor keeps them itself. Sent after the job types are synced."""
        return None

    def locked_read_hint(self) -> str:
        """Table hint for a read that must see the current committed row, not a version."""
        return ""

    #: True where one statement (PostgreSQL's data-modifying CTE, SQL Server's batch with its own
    #: transaction) is atomic by itself: sent alone in autocommit, it needs no BEGIN/COMMIT round trips.
    atomic_statement: bool = False

    def write_transaction(self, cursor: CursorWrapper, completions: int = 0,
                          claim: bool = True, extra: int = 0) -> AbstractContextManager[Any]:
        """The transaction :meth:`complete_many` of ``completions`` jobs and then (``claim``) a claim run
        in; ``extra``: statements sent besides (a permit release)."""
        if (self.atomic_statement and self.statements(completions, claim) + extra == 1
                and self.connection.get_autocommit() and not self.connection.in_atomic_block):
            return nullcontext()
        return transaction.atomic(using=self.connection.alias)

    def statements(self, completions: int, claim: bool) -> int:
        """How many statements :meth:`complete_many` of ``completions`` jobs plus a claim send."""
        return -(-completions // self.complete_chunk) + int(claim)

    # ----- statements ---------------------------------------------------------------------------
    def execute(self, cursor: CursorWrapper, sql: str, params: Sequence[Any]) -> None:
        """Send one of the queue's statements (a vendor may declare the parameters' types first)."""
        cursor.execute(sql, params)

    def claim(self, cursor: CursorWrapper, req: ClaimRequest) -> list[tuple[Any, ...]]:
        """Claim up to ``req.limit`` jobs in ONE statement (or one batch); return JOB_COLUMNS rows.

        Runs inside :meth:`write_transaction`, opened by the caller.
        """
        raise NotImplementedError

    #: Most jobs one completion statement carries (4 parameters each; T-SQL VALUES takes 1000 rows).
    complete_chunk: int = 500

    def complete_and_claim(self, cursor: CursorWrapper, items: list[tuple[int, int, Any, int | None]],
                           req: ClaimRequest | None) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """:meth:`complete_many` of ``items``, then (``req``) :meth:`claim`, inside
        :meth:`write_transaction`: (completed rows, claimed rows). A vendor may send both at once."""
        finished = self.complete_many(cursor, items) if items else []
        return finished, (self.claim(cursor, req) if req is not None else [])

    def complete_many(self, cursor: CursorWrapper, items: list[tuple[int, int, Any, int | None]]
                      ) -> list[tuple[Any, ...]]:
        """Complete jobs given as (id, token, response in database form, run time in ms or None); return
        their new JOB_COLUMNS rows.

        Only Processing jobs whose token still matches are completed; their open history row is closed
        in the same statement. Runs inside :meth:`write_transaction`.
        """
        out: list[tuple[Any, ...]] = []
        for start in range(0, len(items), self.complete_chunk):
            part = items[start:start + self.complete_chunk]
            self.execute(cursor, self.complete_sql(len(part)), [p for item in part for p in item])
            out.extend(cursor.fetchall())
        return out

    def complete_values(self, nrows: int) -> str:
        """``(VALUES ...) AS v (vid, vversion, vresponse, vduration)``: the rows to complete."""
        row = "(" + ", ".join(self.complete_casts) + ")"
        return f"(VALUES {', '.join([row] * nrows)}) AS v (vid, vversion, vresponse, vduration)"

    #: Placeholders of one VALUES row of :meth:`complete_values` (casts where the vendor needs types).
    complete_casts: tuple[str, ...] = ("%s", "%s", "%s", "%s")

    def complete_set_clause(self, alias: str) -> str:
        """The SET list of a completion (modify's Processing -> Completed), ``alias`` the job table's."""
        j = self.n.j
        return (
            f"{j['status_id']} = {int(Status.COMPLETED)}, {j['version']} = {alias}.{j['version']} + 1, "
            f"{j['updated_at']} = {self.now()}, {j['response']} = v.vresponse, {j['finished_at']} = {self.now()}, "
            # The handler's own run time when the worker measured it: a job that waited its turn in a
            # batch, or for its success to be recorded, did not run all that time.
            f"{j['duration_ms']} = COALESCE(v.vduration, {self.ms_since(f'{alias}.' + j['started_at'])}), "
            # The job's error is its current one: a success clears an earlier attempt's (history keeps it).
            f"{j['lease_expires_at']} = NULL, {j['error']} = ''"
        )

    def complete_sql(self, nrows: int) -> str:
        """The completion statement for ``nrows`` jobs (see :meth:`complete_many`); each vendor writes its
        own. Params: id, token, response, run time in ms (or None) for each job (the rows of
        :meth:`complete_values`)."""
        raise NotImplementedError

    def completed_attempt_set(self, duration_sql: str) -> str:
        """The SET list closing a completed attempt's history row, its duration ``duration_sql``."""
        a = self.n.a
        return (f"{a['finished_at']} = {self.now()}, {a['outcome_id']} = {int(Status.COMPLETED)}, "
                f"{a['error']} = {self.empty_string}, {a['duration_ms']} = {duration_sql}")

    def effective(self, alias: str, attr: str, default_placeholder: str = "%s") -> str:
        """A job's effective ``max_attempts`` or ``lease_seconds`` as an SQL expression.

        ``COALESCE(job override, its type's setting, default)`` (no per-job override for
        ``lease_seconds``); ``alias`` names the job row (an alias or the quoted table), and
        ``default_placeholder`` is where the default goes (a bound parameter: the caller passes
        ``SQLQUEUE['MAX_ATTEMPTS']`` or ``['LEASE_SECONDS']``).
        """
        n = self.n
        type_val = (
            f"(SELECT t.{n.t[attr]} FROM {n.jobtype} t WHERE t.{n.t['id']} = {alias}.{n.j['job_type_id']})"
        )
        if attr == "max_attempts":
            return f"COALESCE({alias}.{n.j['max_attempts']}, {type_val}, {default_placeholder})"
        return f"COALESCE({type_val}, {default_placeholder})"

    def common_filters(self, req: ClaimRequest, limited: bool = False) -> tuple[str, list[Any]]:
        """The predicates every candidate branch shares (alias ``j``): type not paused (and, outside the
        ``limited`` branch, without a limit: those jobs are claimed only with a permit), queue not paused
        (a primary-key seek into the queue pause table, empty unless an operator paused one), attempts
        left, the worker's queue and type filters. Returns (SQL, params)."""
        n, j, t = self.n, self.n.j, self.n.t
        held_back = f"pt.{t['paused']} = {self.true_literal}"
        if not limited:
            held_back = (f"({held_back} OR pt.{t['concurrency_limit']} IS NOT NULL "
                         f"OR pt.{t['rate_limit']} <> {self.empty_string})")
        filters: list[str] = [
            f"NOT EXISTS (SELECT 1 FROM {n.jobtype} pt WHERE pt.{t['id']} = j.{j['job_type_id']} "
            f"AND {held_back})",
            f"NOT EXISTS (SELECT 1 FROM {n.queuepause} qp WHERE qp.{n.qp['queue']} = j.{j['queue']})",
            f"j.{j['attempt_num']} < {self.effective('j', 'max_attempts', '%s')}",
        ]
        params: list[Any] = [req.default_max_attempts]
        if req.queues:
            filters.append(f"j.{j['queue']} IN ({', '.join(['%s'] * len(req.queues))})")
            params.extend(req.queues)
        if req.types:
            filters.append(f"j.{j['job_type_id']} IN ({', '.join(['%s'] * len(req.types))})")
            params.extend(req.types)
        return " AND ".join(filters), params

    def candidate_columns(self) -> str:
        """What a candidate branch selects: (id, priority, scheduled_for), enough to order the union."""
        j = self.n.j
        return f"j.{j['id']} AS id, j.{j['priority']} AS priority, j.{j['scheduled_for']} AS scheduled_for"

    def candidate_order(self) -> str:
        """Claim order: priority (higher first), then due time, then id (first in, first out)."""
        j = self.n.j
        return f"j.{j['priority']} DESC, j.{j['scheduled_for']}, j.{j['id']}"

    def due_predicate(self) -> str:
        """Claimable (Pending/Error), not limited (docs/limits.md) and due: the claim index's filter and
        its range."""
        j = self.n.j
        return (f"j.{j['status_id']} IN ({sql_list(CLAIMABLE)}) AND j.{j['limited']} = {self.false_literal} "
                f"AND j.{j['scheduled_for']} <= {self.now()}")

    def claim_branches(self, req: ClaimRequest, *, limit: str, lock: str = "") -> tuple[list[str], list[Any]]:
        """The due branch, and with ``req.reclaim`` the reclaim branch, as each vendor's claim takes
        them (each a SELECT with its own ``limit`` and ``lock``); and their params, in order."""
        common, common_params = self.common_filters(req)
        branches = [self.due_candidates(common, limit=limit, lock=lock)]
        params = [*common_params, req.limit]
        if req.reclaim:
            branches.append(self.reclaim_candidates(common, limit=limit, lock=lock))
            params += [*self.reclaim_candidates_params(req), *common_params, req.limit]
        return branches, params

    def due_candidates(self, common: str, *, limit: str = "", lock: str = "") -> str:
        """Claim branch "due": claimable (Pending/Error) and due jobs passing ``common``
        (:meth:`common_filters`), as a SELECT of :meth:`candidate_columns` in claim order, seeking the
        claim index. ``limit``/``lock`` end it. Params: ``common``'s, then ``limit``'s."""
        return (
            f"SELECT {self.candidate_columns()} FROM {self.n.job} j{self.index_hint(CLAIM_INDEX)} "
            f"WHERE {self.due_predicate()} AND {common} ORDER BY {self.candidate_order()}{limit}{lock}"
        )

    # ----- the limited branch (docs/limits.md) ----------------------------------------------------
    def free_permit(self) -> str:
        """A permit (alias ``p``) that no job holds: a test of the permit row's own columns only, so a
        claimer that waited for another's lock on it re-checks exactly what that one changed."""
        p = self.n.p
        return f"(p.{p['held_until']} IS NULL OR p.{p['held_until']} < {self.now()})"

    def limited_job_predicate(self, type_sql: str, key_sql: str) -> str:
        """Jobs (alias ``j``) of the limit scope (``type_sql``, ``key_sql``) a permit lets a worker take:
        claimable and due, or Processing with an expired lease (its worker died: its permit expired
        with the lease). Seeks ``sqlqueue_job_limited`` on (type, key)."""
        j = self.n.j
        return (
            f"j.{j['job_type_id']} = {type_sql} AND j.{j['concurrency_key']} = {key_sql} "
            # the index's own filter, literally, so that every planner matches it (then the two cases)
            f"AND j.{j['status_id']} IN ({sql_list(CLAIMABLE | {Status.PROCESSING})}) "
            f"AND j.{j['limited']} = {self.true_literal} "
            f"AND ((j.{j['status_id']} IN ({sql_list(CLAIMABLE)}) AND j.{j['scheduled_for']} <= {self.now()}) "
            f"OR (j.{j['status_id']} = {int(Status.PROCESSING)} AND j.{j['lease_expires_at']} < {self.now()}))"
        )

    def oldest_limited_due_sql(self, *, by_queue: bool = False) -> str:
        """``MIN(scheduled_for)`` of the due Pending jobs of limited types (the dashboard, the metrics);
        ``by_queue``: of the Pending and Error jobs due at the one parameter, per queue (``queue,
        MIN(...)`` rows).

        Those jobs are not in the claim index. Read from ``sqlqueue_job_limited`` alone (its own filter,
        literally), which holds only limited jobs: SQLite's planner, without statistics, took the status
        index's range of EVERY Pending job instead (an equality on its first column looks cheaper), so
        the index is pinned there."""
        j = self.n.j
        statuses = sql_list(CLAIMABLE) if by_queue else str(int(Status.PENDING))
        select, group = (f"j.{j['queue']}, ", f" GROUP BY j.{j['queue']}") if by_queue else ("", "")
        return (f"SELECT {select}MIN(j.{j['scheduled_for']}) FROM {self.n.job} j"
                f"{self.index_hint(LIMITED_INDEX)} "
                f"WHERE j.{j['status_id']} IN ({sql_list(CLAIMABLE | {Status.PROCESSING})}) "
                f"AND j.{j['limited']} = {self.true_literal} AND j.{j['status_id']} IN ({statuses}) "
                f"AND j.{j['scheduled_for']} <= {'%s' if by_queue else self.now()}{group}")

    def permit_filters(self, req: ClaimRequest) -> tuple[str, list[Any]]:
        """The permits (alias ``p``) a claim may take: free, of the worker's types if it names some, not
        *surplus*, and of a scope none of whose surplus permits is held.

        A surplus permit (``hold_seconds < 0``) is one a limit change took away while a running job held
        it (limits.sync_type): it stays held by its job, is never taken, and while it is held its scope
        admits nothing, so a lowered limit admits again only once the jobs above it have finished, and
        raising the limit back cannot hand out a slot a running job still holds (issue 31). Rows of one
        scope, sought on the permit's unique (type, key, kind, slot) index; none exist unless a limit was
        lowered under running jobs."""
        n, p = self.n, self.n.p
        sql = (
            f"{self.free_permit()} AND (p.{p['hold_seconds']} IS NULL OR p.{p['hold_seconds']} >= 0) "
            f"AND NOT EXISTS (SELECT 1 FROM {n.permit} sp WHERE sp.{p['job_type_id']} = "
            f"p.{p['job_type_id']} AND sp.{p['key']} = p.{p['key']} AND sp.{p['hold_seconds']} < 0 "
            f"AND sp.{p['held_until']} >= {self.now()})"
        )
        if req.types:
            sql += f" AND p.{self.n.p['job_type_id']} IN ({_marks(len(req.types))})"
        return sql, list(req.types)

    def permit_order(self) -> str:
        """Which free permit first: never used (or released, see released_until) ones, then the longest expired
        or released; then id."""
        p = self.n.p
        return f"p.{p['held_until']}, p.{p['id']}"

    def permit_hold(self, hold_sql: str, lease_sql: str) -> str:
        """Until when a permit taken now is held: a concurrency permit (``hold_sql`` NULL) as long as the
        job's lease ``lease_sql``, a rate permit ``hold_sql`` seconds (its period) from now."""
        return f"CASE WHEN {hold_sql} IS NULL THEN {lease_sql} ELSE {self.now_plus(hold_sql)} END"

    def release_permits_sql(self, count: int) -> str:
        """Free the concurrency permits ``count`` jobs hold (they left Processing). Params: job ids."""
        p = self.n.p
        return (f"UPDATE {self.n.permit} SET {p['held_until']} = {self.released_until()}, {p['job_id']} = NULL "
                f"WHERE {p['job_id']} IN ({_marks(count)}) AND {p['kind']} = 1")

    def released_until(self) -> str:
        """What a released permit's ``held_until`` becomes: NULL (free, like a permit never used), unless
        the vendor runs the fleet's look, which must see when a permit freed (see PostgresDialect)."""
        return "NULL"

    def renew_permits_sql(self, count: int) -> str:
        """Hold the concurrency permits of ``count`` running jobs as long as their renewed leases.
        Params: lease seconds, job ids.

        A job taken over after its lease expired may have been given another permit than its old one,
        which still names it (expired): that one is renewed only while the job holds no live permit
        (a late renewal of a lease nobody took over), else the job would hold two to its end. An expired
        surplus permit (a slot the limit lost while its job ran, ``hold_seconds`` < 0) is never revived:
        once it ran out the scope admitted again under the lower limit.

        The re-check of the other permits is a locked read (:meth:`locked_read_hint`): under SQL Server's
        READ_COMMITTED_SNAPSHOT it would otherwise read the last committed version and miss a permit a
        claim is giving the job right now; it must wait for that writer."""
        p, permit = self.n.p, self.n.permit
        live = f"{{t}}.{p['held_until']} >= {self.now()}"
        return (f"UPDATE {permit} SET {p['held_until']} = {self.now_plus('%s')} "
                f"WHERE {p['job_id']} IN ({_marks(count)}) AND {p['kind']} = 1 AND {p['held_until']} IS NOT NULL "
                f"AND ({live.format(t=permit)} OR ({p['hold_seconds']} IS NULL "
                f"AND NOT EXISTS (SELECT 1 FROM {permit} q{self.locked_read_hint()} "
                f"WHERE q.{p['job_id']} = {permit}.{p['job_id']} AND q.{p['kind']} = 1 AND {live.format(t='q')})))")

    def insert_permits_sql(self) -> str:
        """Create one permit row unless it exists. Params: type id, key, kind, slot, hold seconds, then
        type id, key, kind, slot again (the guard). A racing twin may still hit the unique index: the
        caller ignores that conflict."""
        p = self.n.p
        return (
            f"INSERT INTO {self.n.permit} ({p['job_type_id']}, {p['key']}, {p['kind']}, {p['slot']}, "
            f"{p['hold_seconds']}) SELECT %s, %s, %s, %s, %s WHERE NOT EXISTS (SELECT 1 FROM {self.n.permit} "
            f"WHERE {p['job_type_id']} = %s AND {p['key']} = %s AND {p['kind']} = %s AND {p['slot']} = %s)"
        )

    def reclaim_candidates(self, common: str, *, limit: str = "", lock: str = "") -> str:
        """Claim branch "reclaim": Processing jobs passing ``common`` whose holder is this worker name
        (a restart, :meth:`own_leftovers`), whose lease expired, or whose worker stopped or has a stale
        heartbeat; one SELECT seeking the Processing index (SQL Server splits it, see mssql.py).
        Params: :meth:`reclaim_candidates_params`, ``common``'s, then ``limit``'s.

        Kept apart from :meth:`due_candidates` (the vendor joins them with UNION ALL) so that each seeks
        its own partial index in claim order; one WHERE with an OR would scan.
        """
        n, j = self.n, self.n.j
        dead_workers = (
            f"SELECT w.{n.w['name']} FROM {n.worker_table} w WHERE w.{n.w['stopped_at']} IS NOT NULL "
            f"OR w.{n.w['last_heartbeat']} < {self.now_plus('%s')}"
        )
        return (
            f"SELECT {self.candidate_columns()} FROM {n.job} j{self.index_hint(PROCESSING_INDEX)} "
            f"WHERE j.{j['status_id']} = {int(Status.PROCESSING)} "
            f"AND (({self.own_leftovers()}) OR j.{j['lease_expires_at']} < {self.now()} "
            f"OR j.{j['worker']} IN ({dead_workers})) "
            f"AND {common} ORDER BY {self.candidate_order()}{limit}{lock}"
        )

    def reclaim_candidates_params(self, req: ClaimRequest) -> list[Any]:
        """The params :meth:`reclaim_candidates` takes before the common filters' params."""
        return [*self.own_leftovers_params(req), -float(req.worker_dead_after_seconds)]

    def own_leftovers(self) -> str:
        """Processing jobs (alias ``j``) this worker name holds from another, earlier incarnation (a
        restart), while no other incarnation holds the name. Params: :meth:`own_leftovers_params`."""
        n, j, w = self.n, self.n.j, self.n.w
        return (
            f"j.{j['worker']} = %s AND j.{j['incarnation']} <> %s AND NOT EXISTS (SELECT 1 FROM "
            f"{n.worker_table} ow WHERE ow.{w['name']} = %s AND ow.{w['incarnation']} <> %s)"
        )

    @staticmethod
    def own_leftovers_params(req: ClaimRequest) -> list[Any]:
        return [req.worker, req.incarnation, req.worker, req.incarnation]

    #: Names of the claim's candidate branches, in the order the vendor's claim lists them.
    BRANCH_NAMES = ("due", "reclaim")

    @classmethod
    def union_all(cls, branches: list[str], alias: bool = False) -> str:
        """``SELECT * FROM (b1) [AS due] UNION ALL SELECT * FROM (b2) [AS reclaim]``, or the one branch."""
        return " UNION ALL ".join(
            f"SELECT * FROM ({b})" + (f" AS {name}" if alias else "")
            for name, b in zip(cls.BRANCH_NAMES, branches, strict=False))

    def claim_set_clause(self, req: ClaimRequest, alias: str = "") -> tuple[str, list[Any]]:
        """SET list shared by every vendor's claim: Processing, attempt + 1, stamps, lease, token.

        ``alias`` prefixes right-hand column references (``j`` on vendors whose UPDATE has a FROM).
        """
        j = self.n.j
        a = f"{alias}." if alias else ""
        lease = self.now_plus(self.effective(alias or self.n.job, "lease_seconds", "%s"))
        sets = [
            f"{j['status_id']} = {int(Status.PROCESSING)}",
            f"{j['attempt_num']} = {a}{j['attempt_num']} + 1",
            f"{j['started_at']} = {self.now()}",
            f"{j['finished_at']} = NULL",
            f"{j['duration_ms']} = NULL",
            f"{j['worker']} = %s",
            f"{j['incarnation']} = %s",
            f"{j['lease_expires_at']} = {lease}",
            f"{j['version']} = {a}{j['version']} + 1",
            f"{j['updated_at']} = {self.now()}",
        ]
        return ", ".join(sets), [req.worker, req.incarnation, int(req.default_lease_seconds)]

    def attempt_insert(self) -> str:
        """``INSERT INTO <history> (job_id, attempt_num, worker, claimed_at, step, error)``: the head of
        the history row a claim writes for each job it claims."""
        a = self.n.a
        return (f"INSERT INTO {self.n.attempt} ({a['job_id']}, {a['attempt_num']}, {a['worker']}, "
                f"{a['claimed_at']}, {a['step']}, {a['error']})")

    def attempt_insert_from(self, source: str) -> str:
        """:meth:`attempt_insert` of one history row per claimed job in ``source`` (a CTE or table
        variable holding the claimed rows' JOB_COLUMNS)."""
        j = self.n.j
        return (f"{self.attempt_insert()} SELECT {j['id']}, {j['attempt_num']}, {j['worker']}, "
                f"{j['started_at']}, {j['step']}, {self.empty_string} FROM {source}")

    def claimed_order(self) -> str:
        """Claim order over the claimed rows themselves (no alias), for the rows a claim returns."""
        j = self.n.j
        return f"{j['priority']} DESC, {j['scheduled_for']}, {j['id']}"

    def returning(self, columns: list[str]) -> tuple[str, str]:
        """(fragment after SET, fragment at the end) that make an UPDATE return ``columns``."""
        return "", " RETURNING " + ", ".join(columns)

    def update_returning(self, set_sql: str, where_sql: str) -> str:
        """``UPDATE job SET ... WHERE ...`` returning JOB_COLUMNS (RETURNING or OUTPUT per vendor)."""
        mid, end = self.returning(self.n.job_columns)
        return f"UPDATE {self.n.job} SET {set_sql}{mid} WHERE {where_sql}{end}"

    @cached_property
    def attempts_exhausted_sql(self) -> str:
        """Attempts exhausted, decided by the row and its type, not by the caller (one ``%s``: the
        default max attempts). The same text for every modify: built once per dialect."""
        return f"{self.n.j['attempt_num']} >= {self.effective(self.n.job, 'max_attempts')}"

    def modify_sets(self, current: Status, new: Status, *, default_max_attempts: int, step: str | None = None,
                    set_response: bool = False, response: Any = None, error: str | None = None,
                    scheduled_for: Any = None, run_in: float | None = None, reset_attempts: bool = False,
                    run_ms: int | None = None) -> tuple[list[str], list[Any]]:
        """The SET list of modify's ``current`` -> ``new`` (a transition the manager has allowed), and its
        params, for :meth:`modify_sql`. Values come checked and in database form: ``response`` (stored
        when ``set_response``), ``error``, ``scheduled_for``; ``run_in`` is seconds from the database
        clock; ``run_ms`` the handler's own run time (None: the time since the claim).

        The rules that depend on the row are decided here, by the database: an Error with no attempts
        left becomes Failed (and keeps its due time); an operator's retry gets one attempt more.
        """
        j = self.n.j
        sets = [f"{j['version']} = {j['version']} + 1", f"{j['updated_at']} = {self.now()}"]
        params: list[Any] = []
        exhausted = self.attempts_exhausted_sql
        if new == Status.ERROR:
            sets.append(f"{j['status_id']} = CASE WHEN {exhausted} THEN {int(Status.FAILED)} ELSE {int(Status.ERROR)} END")
            params.append(default_max_attempts)
        else:
            sets.append(f"{j['status_id']} = %s")
            params.append(int(new))
        if step is not None:
            sets.append(f"{j['step']} = %s")
            params.append(step)
        if set_response:
            sets.append(f"{j['response']} = %s")
            params.append(response)
        if error is not None:
            sets.append(f"{j['error']} = %s")
            params.append(error)
        elif new == Status.COMPLETED:  # the job's error is its current one (the history keeps each attempt's)
            sets.append(f"{j['error']} = ''")
        if scheduled_for is not None:
            sets.append(f"{j['scheduled_for']} = %s")
            params.append(scheduled_for)
        elif run_in is not None and new == Status.ERROR:
            # A retry is due after run_in; a job out of attempts becomes Failed now, due never: keep
            # its scheduled_for where it was instead of showing a retry time that will not come.
            sets.append(f"{j['scheduled_for']} = CASE WHEN {exhausted} "
                        f"THEN {j['scheduled_for']} ELSE {self.now_plus('%s')} END")
            params += [default_max_attempts, run_in]
        elif run_in is not None:
            sets.append(f"{j['scheduled_for']} = {self.now_plus('%s')}")
            params.append(run_in)
        if current == Status.PROCESSING and (new in FINISHED or new == Status.ERROR):
            if run_ms is None:
                sets.append(f"{j['duration_ms']} = {self.ms_since(j['started_at'])}")
            else:
                sets.append(f"{j['duration_ms']} = %s")
                params.append(run_ms)
            sets += [f"{j['finished_at']} = {self.now()}", f"{j['lease_expires_at']} = NULL"]
        elif current == Status.PROCESSING and new == Status.PENDING:
            # Handed back unstarted (graceful shutdown): the attempt was not spent.
            sets += [f"{j['attempt_num']} = {j['attempt_num']} - 1", f"{j['worker']} = ''",
                     f"{j['lease_expires_at']} = NULL", f"{j['started_at']} = NULL"]
        elif new in FINISHED and current != Status.PROCESSING:
            sets.append(f"{j['finished_at']} = {self.now()}")
        elif current == Status.WAITING:
            pass  # released (workflows.py): keeps the due time and attempts it was enqueued with
        elif new == Status.PENDING:
            # An operator's retry: due now unless told otherwise, and at least one attempt left.
            if scheduled_for is None and run_in is None:
                sets.append(f"{j['scheduled_for']} = {self.now()}")
            sets += [f"{j['finished_at']} = NULL", f"{j['lease_expires_at']} = NULL"]
            if reset_attempts:
                sets.append(f"{j['attempt_num']} = 0")
            else:
                sets.append(f"{j['max_attempts']} = CASE WHEN {exhausted} "
                            f"THEN {j['attempt_num']} + 1 ELSE {j['max_attempts']} END")
                params.append(default_max_attempts)
        if reset_attempts and new != Status.PENDING:
            sets.append(f"{j['attempt_num']} = 0")
        return sets, params

    def modify_sql(self, sets: list[str]) -> str:
        """The token-checked UPDATE of modify: params are the SET params, then id and token."""
        j = self.n.j
        return self.update_returning(", ".join(sets), f"{j['id']} = %s AND {j['version']} = %s")

    def close_attempt_sql(self) -> str:
        """Close the open history row of an attempt.

        Params: outcome, error, duration, the step it ended at, job id, attempt."""
        a = self.n.a
        return (
            f"UPDATE {self.n.attempt} SET {a['finished_at']} = {self.now()}, {a['outcome_id']} = %s, "
            f"{a['error']} = %s, {a['duration_ms']} = %s, {a['step']} = %s WHERE {self.open_attempt()}"
        )

    def delete_attempt_sql(self) -> str:
        """Drop the history row of an attempt handed back unstarted. Params: job id, attempt."""
        return f"DELETE FROM {self.n.attempt} WHERE {self.open_attempt()}"

    def open_attempt(self) -> str:
        """The open (unfinished) history row of an attempt. Params: job id, attempt."""
        a = self.n.a
        return f"{a['job_id']} = %s AND {a['attempt_num']} = %s AND {a['finished_at']} IS NULL"

    def renew_leases_sql(self, count: int, incarnation: bool = True, *, guarded: bool = False) -> str:
        """Extend the leases a worker process still holds. Params: lease seconds (twice when ``guarded``),
        ``count`` ids, worker name, and (``incarnation``) the incarnation. ``guarded``: see
        :meth:`permit_guard_sql`."""
        j = self.n.j
        marks = ", ".join(["%s"] * count)
        return (
            f"UPDATE {self.n.job} SET {j['lease_expires_at']} = {self.renewed_lease_sql(guarded)} "
            f"WHERE {j['id']} IN ({marks}) AND {j['worker']} = %s "
            + (f"AND {j['incarnation']} = %s " if incarnation else "")
            + f"AND {j['status_id']} = {int(Status.PROCESSING)}"
            + (f" AND {self.permit_guard_sql()}" if guarded else "")
        )

    def renew_held_sql(self, counts: Sequence[int], *, guarded: bool = False) -> str:
        """Extend the leases several worker processes (a supervisor's slots) hold, in one statement.
        Params: lease seconds (twice when ``guarded``), every id (the primary-key seek), then for each
        holder its ``counts[i]`` ids, its name and its incarnation: a job is renewed only under the holder
        that claimed it. ``guarded``: see :meth:`permit_guard_sql`."""
        j = self.n.j
        every = ", ".join(["%s"] * sum(counts))
        holders = " OR ".join(
            f"({j['id']} IN ({', '.join(['%s'] * n)}) AND {j['worker']} = %s AND {j['incarnation']} = %s)"
            for n in counts)
        return (
            f"UPDATE {self.n.job} SET {j['lease_expires_at']} = {self.renewed_lease_sql(guarded)} "
            f"WHERE {j['id']} IN ({every}) AND {j['status_id']} = {int(Status.PROCESSING)} AND ({holders})"
            + (f" AND {self.permit_guard_sql()}" if guarded else "")
        )

    @staticmethod
    def renewed_lease_params(lease_seconds: int, guarded: bool) -> list[Any]:
        """The parameters :meth:`renewed_lease_sql` takes, first in a renewal's list."""
        return [int(lease_seconds)] * (2 if guarded else 1)

    def renewed_lease_sql(self, guarded: bool) -> str:
        """A renewed lease: ``lease seconds`` from now (one param); ``guarded`` (two params, the lease
        seconds twice), never past the live concurrency permit the job holds. The permits are renewed
        by a statement of their own just before, from that statement's clock: a lease from this one's
        would outlive its permit by the time between the two, and a claim could take the permit while
        the lease still ran (a stall between the statements, a retry). Capped, the lease and its permit
        run out together."""
        if not guarded:
            return self.now_plus("%s")
        # One scalar aggregate, read once: SQL Server expands COALESCE((subquery), x) into a CASE that
        # runs the subquery twice, and a renewal between the two reads could make the second NULL.
        j, p, job = self.n.j, self.n.p, self.n.job
        return (f"(SELECT COALESCE(MIN(h.{p['held_until']}), {self.now_plus('%s')}) FROM {self.n.permit} "
                f"h{self.locked_read_hint()} WHERE h.{p['job_id']} = {job}.{j['id']} AND h.{p['kind']} = 1 "
                f"AND h.{p['held_until']} >= {self.now()} AND h.{p['held_until']} < {self.now_plus('%s')})")

    def permit_guard_sql(self) -> str:
        """The condition under which a lease renewal may extend a job's lease while some type has a
        limit; the renewal sends it after it has renewed the permits (:meth:`renew_permits_sql`).

        A late renewal (the lease ran out, nobody took the job over) used to extend the lease whatever
        had become of the job's concurrency permit, which ran out with it: a claim may have given that
        permit to another job of the scope, and then both ran under a limit of one. So an expired lease
        is extended only for a job that is not limited, or whose scope has no concurrency permits (a
        rate limit), or that holds a live concurrency permit, which the permit renewal just before gave
        back to it if nobody had taken it. A live lease is extended, never past the live permit the job
        holds (:meth:`renewed_lease_sql`): a job flagged limited after its claim, which holds none, keeps
        running while its lease is live. The permit reads are locked reads (:meth:`locked_read_hint`), as
        the permit renewal's."""
        j, p, job, permit = self.n.j, self.n.p, self.n.job, self.n.permit
        hint = self.locked_read_hint()
        return (
            f"({j['lease_expires_at']} >= {self.now()} OR {j['limited']} = {self.false_literal} "
            f"OR NOT EXISTS (SELECT 1 FROM {permit} s{hint} WHERE s.{p['job_type_id']} = {job}.{j['job_type_id']} "
            f"AND s.{p['key']} = {job}.{j['concurrency_key']} AND s.{p['kind']} = 1) "
            f"OR EXISTS (SELECT 1 FROM {permit} h{hint} WHERE h.{p['job_id']} = {job}.{j['id']} "
            f"AND h.{p['kind']} = 1 AND h.{p['held_until']} >= {self.now()}))"
        )

    def reap_candidates_sql(self) -> str:
        """Processing jobs whose lease expired with no attempts left. Params: default max attempts."""
        j = self.n.j
        return (
            f"SELECT {j['id']} FROM {self.n.job} WHERE {j['status_id']} = {int(Status.PROCESSING)} "
            f"AND {j['lease_expires_at']} < {self.now()} "
            f"AND {j['attempt_num']} >= {self.effective(self.n.job, 'max_attempts', '%s')}"
        )

    def batch_counts_sql(self, locked: bool = False) -> str:
        """A batch's members by status: rows of (status id, count). Params: the batch id. ``locked``: a
        locked read (:meth:`locked_read_hint`), which waits for a member's uncommitted change instead of
        reading its last committed version (SQL Server's READ_COMMITTED_SNAPSHOT)."""
        j = self.n.j
        hint = self.locked_read_hint() if locked else ""
        return (f"SELECT {j['status_id']}, COUNT(*) FROM {self.n.job}{hint} WHERE {j['batch_id']} = %s "
                f"GROUP BY {j['status_id']}")

    def select_job_sql(self, where_sql: str) -> str:
        """A locked-read SELECT of JOB_COLUMNS (sees the current row even under row versioning)."""
        return f"SELECT {', '.join(self.n.job_columns)} FROM {self.n.job}{self.locked_read_hint()} WHERE {where_sql}"

    #: False where a dedupe insert must go one row per statement (SQL Server's NOT EXISTS guard).
    multi_row_dedupe: bool = True

    def insert_sql(self, columns: list[str], nrows: int, dedupe: bool, returning: Sequence[str] = ()) -> str:
        """INSERT of ``nrows`` job rows returning JOB_COLUMNS (or just the ``returning`` attnames); with
        ``dedupe`` a key conflict inserts nothing.

        PostgreSQL and SQLite: ``ON CONFLICT DO NOTHING`` against the partial unique dedupe index (a
        racing second enqueue waits for the first to commit, then inserts nothing).
        """
        key = (tuple(columns), nrows, dedupe, tuple(returning))
        sql = self._insert_sql_cache.get(key)
        if sql is None:  # built once per shape: an app's enqueue asks for the same few shapes
            values = ", ".join([self.insert_values_sql(columns)] * nrows)
            conflict = " ON CONFLICT DO NOTHING" if dedupe else ""
            back = ", ".join(self.n.j[c] for c in returning) if returning else ", ".join(self.n.job_columns)
            sql = (f"INSERT INTO {self.n.job} ({self.insert_columns_sql(columns)}) VALUES {values}{conflict} "
                   f"RETURNING {back}")
            if len(self._insert_sql_cache) < 64:
                self._insert_sql_cache[key] = sql
        return sql

    def insert_params(self, columns: list[str], row: list[Any], dedupe: bool) -> list[Any]:
        return self.values_params(columns, row)

    def insert_job(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]],
                   dedupe: bool) -> list[tuple[Any, ...]]:
        """Insert job rows; return JOB_COLUMNS rows of the inserted ones (skipping dedupe conflicts).

        ``columns`` are attnames and each row's values are in database form; ``scheduled_for`` may be
        ``None`` (meaning the database's now), and ``enqueued_at``/``updated_at`` are stamped by the
        database clock, whatever the row holds for them.
        """
        if dedupe and not self.multi_row_dedupe:
            # In dedupe-key order (rows without a key last, in their own order): each statement locks
            # its key's range until the transaction ends, so two bulk enqueues sharing keys must take
            # them in one order, or each could hold a key the other waits for (a deadlock).
            at = columns.index("dedupe_key")
            out: list[tuple[Any, ...]] = []
            sql = self.insert_sql(columns, 1, True)
            for row in sorted(rows, key=lambda r: (r[at] is None, r[at] or "")):
                self.execute(cursor, sql, self.insert_params(columns, row, True))
                out.extend(cursor.fetchall())
            return out
        params = [p for row in rows for p in self.insert_params(columns, row, dedupe)]
        self.execute(cursor, self.insert_sql(columns, len(rows), dedupe), params)
        return cursor.fetchall()

    #: What the database decides when a job is inserted: its id and its clock stamps.
    STAMPED: tuple[str, ...] = ("id", "enqueued_at", "scheduled_for", "updated_at")

    def insert_stamped(self, cursor: CursorWrapper, columns: list[str], rows: list[list[Any]], channel: str,
                       queues: str) -> list[tuple[Any, ...]]:
        """Insert a few job rows (no dedupe) in ONE statement that also wakes idle workers where the
        vendor can (``channel`` set, see :meth:`notify_sql`); return each row's :attr:`STAMPED` values,
        in row order.

        Only what the database decided comes back: the rest of a job is what was sent, and sending
        the payload back to parse it again cost a sixth of an enqueue.
        """
        params = [p for row in rows for p in self.insert_params(columns, row, False)]
        self.execute(cursor, self.insert_sql(columns, len(rows), False, returning=self.STAMPED), params)
        # RETURNING/OUTPUT order is not promised; ids are drawn in VALUES order.
        return sorted(cursor.fetchall(), key=lambda r: r[0])

    def json_param(self, text: str) -> Any:
        """A JSON document, already encoded by the caller, as the parameter its column takes."""
        return text

    @staticmethod
    def json_text(param: Any) -> str:
        """The JSON text of a :meth:`json_param` (or of Django's own form of a JSONField value)."""
        return param

    def insert_values_sql(self, columns: list[str]) -> str:
        """One ``(%s, ..., COALESCE(%s, now), now, now)`` values group for :meth:`insert_job`."""
        parts = []
        for c in columns:
            if c == "scheduled_for":
                parts.append(f"COALESCE(%s, {self.now()})")
            elif c in ("enqueued_at", "updated_at"):
                parts.append(self.now())
            else:
                parts.append("%s")
        return "(" + ", ".join(parts) + ")"

    @staticmethod
    def values_params(columns: list[str], row: list[Any]) -> list[Any]:
        return [v for c, v in zip(columns, row, strict=True) if c not in ("enqueued_at", "updated_at")]

    def insert_columns_sql(self, columns: list[str]) -> str:
        return ", ".join(self.n.j[c] for c in columns)

    #: Most parameters one statement may carry (SQL Server allows 2100).
    max_params: int = 30000

    # ----- retention (purge_queue) ------------------------------------------------------------------
    def exclusive_transaction(self, cursor: CursorWrapper) -> AbstractContextManager[Any]:
        """A transaction whose locking reads (:meth:`purge_lock_sql`) hold their rows until it ends."""
        return transaction.atomic(using=self.connection.alias)

    def row_lock_hint(self) -> str:
        """Table hint of a read that locks the rows it returns until the transaction ends."""
        return ""

    def row_lock_clause(self) -> str:
        """Clause ending a read that locks the rows it returns until the transaction ends."""
        return ""

    def purge_where(self, nids: int, nstatuses: int, nqueues: int) -> str:
        """The jobs of a purge batch that may still go: these ids, still in one of these (finished)
        statuses, finished (else last updated) before the cutoff, of these queues if any.

        Params: ``nids`` ids, ``nstatuses`` status ids, the cutoff twice, ``nqueues`` queue names.
        """
        j = self.n.j
        where = (
            f"{j['id']} IN ({_marks(nids)}) AND {j['status_id']} IN ({_marks(nstatuses)}) "
            f"AND ({j['finished_at']} < %s OR ({j['finished_at']} IS NULL AND {j['updated_at']} < %s))"
        )
        if nqueues:
            where += f" AND {j['queue']} IN ({_marks(nqueues)})"
        return where

    def purge_lock_sql(self, where_sql: str) -> str:
        """The ids of the jobs matching ``where_sql``, locked against every other write until commit:
        a job a worker or an operator moves on (retried to Pending) is either seen moved, and kept, or
        waits until the purge is over. No other column is read (payloads can be large)."""
        j = self.n.j
        return f"SELECT {j['id']} FROM {self.n.job}{self.row_lock_hint()} WHERE {where_sql}{self.row_lock_clause()}"

    def delete_by_job_sql(self, table: str, column: str, count: int) -> str:
        """Delete the rows of ``table`` (history, a subtype table) whose ``column`` names one of ``count``
        jobs. ``table`` and ``column`` come from model meta."""
        qn = self.connection.ops.quote_name
        return f"DELETE FROM {qn(table)} WHERE {qn(column)} IN ({_marks(count)})"

    def purge_delete_sql(self, where_sql: str) -> str:
        """Delete the job rows matching ``where_sql`` (the purge's conditions, repeated)."""
        return f"DELETE FROM {self.n.job} WHERE {where_sql}"

    def insert_chunk(self, per_row: int) -> int:
        """Rows per bulk INSERT statement, for rows of ``per_row`` parameters."""
        return max(1, min(1000, self.max_params // per_row))

    def database_identity(self) -> Any:
        """What changes when the database this alias names is swapped under a live connection (SQLite:
        its file deleted or replaced, while the open connection goes on writing to the old one); None
        where that cannot happen. The heartbeat compares it at every beat."""
        return None

    def is_retryable_error(self, exc: BaseException) -> bool:
        """True for transient conflicts the caller should simply retry (deadlock victim, lock timeout)."""
        return False

    @staticmethod
    def error_hint(exc: BaseException) -> str:
        """A sentence for the log that says what to change when ``exc`` comes from a known setup mistake."""
        return ""

    @classmethod
    def connect_timeout_options(cls, seconds: float) -> dict[str, Any]:
        """Backend OPTIONS that bound a connection attempt to about ``seconds`` ({}: nothing to bound)."""
        return {}

    def notify_sql(self) -> str | None:
        return None

    #: Whether the fleet's look stamps the worker rows whose session lock a live supervisor holds, so
    #: that an idle worker need not beat (PostgreSQL: worker/beats.py, "session liveness").
    session_liveness = False

    def lock_rows_sql(self, count: int) -> str:
        raise NotImplementedError(f"{self.vendor} has no session liveness")

    def lock_rows_params(self, pairs: list[tuple[str, str]]) -> list[Any]:
        raise NotImplementedError(f"{self.vendor} has no session liveness")

    def unlock_row_sql(self) -> str:
        raise NotImplementedError(f"{self.vendor} has no session liveness")

    def unlock_row_params(self, row_id: int) -> list[Any]:
        raise NotImplementedError(f"{self.vendor} has no session liveness")

    @staticmethod
    def keepalive_sql() -> str:
        raise NotImplementedError("no session liveness here")

    def liveness_key_sql(self) -> str:
        raise NotImplementedError(f"{self.vendor} has no session liveness")

    def fleet_look_sql(self, channel: str, *, interval: float, since_seconds: float, default_max_attempts: int,
                       worker_dead_after_seconds: float, rows: int,
                       stamp_older_than: float = 0.0) -> tuple[str, list[Any]] | None:
        """The fleet's look (sent by the maintenance holder where workers LISTEN): ONE statement that
        notifies ``channel`` with a look's payload (dialects/wake.py: its ``interval``, and the queues of
        work that a claim could take and that came within reach in the last ``since_seconds``); None
        where the vendor has no notifications."""
        return None

    def notify_after_commit(self, cursor: CursorWrapper, channel: str, queues: str) -> None:
        """Wake idle workers for jobs committed just before (an ``on_commit`` hook, in autocommit), where
        the vendor can notify."""
        sql = self.notify_sql()
        if sql:
            cursor.execute(sql, [channel, queues])

    # ----- what the rest of the package asks instead of testing connection.vendor ------------------
    #: True where a worker can be woken by LISTEN/NOTIFY (:class:`~django_sqlqueue.wakeup.PgListener`),
    #: and so where ``SQLQUEUE["LISTEN_DATABASE"]`` may name a database.
    can_listen: bool = False
    #: True where a worker can see other connections' commits by polling ``PRAGMA data_version``
    #: (:class:`~django_sqlqueue.wakeup.SqliteWatcher`).
    watches_data_version: bool = False

    @classmethod
    def version_problem(cls) -> str | None:
        """Why the installed database library is too old for the queue's statements, or None (a system
        check: no connection is opened)."""
        return None

    @staticmethod
    def json_value_check(quoted_column: str) -> str | None:
        """The CHECK a :class:`~django_sqlqueue.fields.JSONValueField` column gets instead of Django's
        own, or None to keep Django's."""
        return None

    def estimated_rows(self, table: str) -> int | None:
        """The planner's cheap estimate of ``table``'s row count (the admin's unfiltered job list), or
        None where the vendor keeps none worth showing."""
        return None

    def claim_plan_indexes(self, req: ClaimRequest) -> list[str]:
        """The indexes the plan of ``req``'s claim must read (``queue_explain``'s verdict)."""
        return [CLAIM_INDEX]

    def claim_plan(self, cursor: CursorWrapper, sql: str, params: list[Any], table: str) -> tuple[list[str], bool]:
        """The plan of the claim statement ``sql`` (not executed), as lines, and whether the part that
        picks jobs reads the whole job ``table`` (``manage.py queue_explain``)."""
        raise NotImplementedError

    # ----- recurring schedules (django_sqlqueue.schedules) -----------------------------------------
    def schedule_tables(self) -> tuple[str, dict[str, str], str, dict[str, str]]:
        """Quoted (schedule table, its columns by attname, run table, its columns), from model meta."""
        Schedule, ScheduleRun = queue_model("Schedule"), queue_model("ScheduleRun")
        qn = self.connection.ops.quote_name
        return (qn(Schedule._meta.db_table), {f.attname: qn(f.column) for f in Schedule._meta.concrete_fields},
                qn(ScheduleRun._meta.db_table), {f.attname: qn(f.column) for f in ScheduleRun._meta.concrete_fields})

    def schedule_clock(self, now: Any) -> tuple[str, list[Any]]:
        """The "now" of a schedule statement: the database clock, or (tests) a given aware datetime."""
        if now is None:
            return self.now(), []
        return "%s", [self.connection.ops.adapt_datetimefield_value(now)]

    def schedules_probe_sql(self, now: Any = None) -> tuple[str, list[Any]]:
        """The look: ONE statement, two index seeks, no locks. Returns (any schedule due, any tick's job
        past its expiry) as 1/0. Seeks the partial indexes ``sqlqueue_schedule_due`` and
        ``sqlqueue_schedule_run_expiry`` (their predicates are repeated literally so they match)."""
        s_table, s, r_table, r = self.schedule_tables()
        clock, clock_params = self.schedule_clock(now)
        sql = (
            f"SELECT CASE WHEN EXISTS (SELECT 1 FROM {s_table} s WHERE s.{s['enabled']} = {self.true_literal} "
            f"AND s.{s['next_run_at']} <= {clock}) THEN 1 ELSE 0 END, "
            f"CASE WHEN EXISTS (SELECT 1 FROM {r_table} r WHERE r.{r['expires_at']} IS NOT NULL "
            f"AND r.{r['expires_at']} <= {clock}) THEN 1 ELSE 0 END"
        )
        return sql, [*clock_params, *clock_params]

    def schedules_due_where(self, clock: str) -> str:
        _, s, _, _ = self.schedule_tables()
        return f"s.{s['enabled']} = {self.true_literal} AND s.{s['next_run_at']} <= {clock}"

    def claim_schedules_sql(self, limit: int, now: Any = None) -> tuple[str, list[Any]]:
        """Due enabled schedules, oldest tick first, locked for this transaction and skipped by other
        lookers: rows of (id, the clock). Runs inside :meth:`schedules_transaction`.

        This shape (plain ``LIMIT``) is for vendors whose transaction itself serialises writers.
        """
        s_table, s, _, _ = self.schedule_tables()
        clock, clock_params = self.schedule_clock(now)
        sql = (f"SELECT s.{s['id']}, {clock} FROM {s_table} s WHERE {self.schedules_due_where(clock)} "
               f"ORDER BY s.{s['next_run_at']}, s.{s['id']} LIMIT %s")
        return sql, [*clock_params, *clock_params, limit]

    def schedules_transaction(self) -> AbstractContextManager[Any]:
        """The transaction a look claims and enqueues in (one per look)."""
        return transaction.atomic(using=self.connection.alias)

    # ----- the maintenance lease (worker/maintenance.py) ---------------------------------------------
    def lease_names(self) -> tuple[str, dict[str, str]]:
        """Quoted (lease table, its columns by attname), from model meta."""
        MaintenanceLease = queue_model("MaintenanceLease")
        qn = self.connection.ops.quote_name
        return (qn(MaintenanceLease._meta.db_table),
                {f.attname: qn(f.column) for f in MaintenanceLease._meta.concrete_fields})

    def lease_update_hint(self) -> str:
        """Table hint of the lease's conditional UPDATE ("" where the vendor has none)."""
        return ""

    def take_lease_sql(self) -> str:
        """Take or renew a lease: ONE conditional UPDATE by primary key, which succeeds (1 row) when the
        lease has run out or is already this holder's. Params: holder, seconds, name, holder.

        The database clock decides expiry, so hosts with skewed clocks agree on who holds it.
        """
        table, c = self.lease_names()
        return (f"UPDATE {table}{self.lease_update_hint()} SET {c['holder']} = %s, "
                f"{c['expires_at']} = {self.now_plus('%s')} "
                f"WHERE {c['name']} = %s AND ({c['expires_at']} < {self.now()} OR {c['holder']} = %s)")

    def insert_lease_sql(self) -> str:
        """Create a lease row already held (the first take on a new database). Params: name, holder,
        seconds. A racing insert of the same name is refused by the primary key."""
        table, c = self.lease_names()
        return (f"INSERT INTO {table} ({c['name']}, {c['holder']}, {c['expires_at']}) "
                f"VALUES (%s, %s, {self.now_plus('%s')})")

    def release_lease_sql(self) -> str:
        """Give a lease up (a worker stopping): it is expired at once, so the next look takes it.
        Params: name, holder."""
        table, c = self.lease_names()
        return (f"UPDATE {table} SET {c['expires_at']} = {self.now_plus('-1')} "
                f"WHERE {c['name']} = %s AND {c['holder']} = %s")
