"""SQL Server, round 2 (issue 29): the shapes that decide what a busy server locks, checked on the T-SQL.

No SQL Server runs here and Babelfish drops every table hint, so what these statements lock is argued
from Microsoft's documentation (docs/sqlserver.md) and checked here by shape: each property the
argument rests on is read from the parsed statement (sqlglot, T-SQL). tests/test_mssql_live.py shows the
same properties on a real server when one is configured.
"""

from __future__ import annotations

import importlib
import re

import pytest
from sqlglot import exp

from django_sqlqueue.dialects import ClaimRequest
from django_sqlqueue.dialects.mssql import CLAIM_INDEXES, MssqlDialect, batch
from tests.test_tsql import dialect, hints, index_hint, parse, parse_batch  # noqa: F401  (the rendering fixture)

JOB, PERMIT = "django_sqlqueue_job", "django_sqlqueue_limitpermit"
M0014 = importlib.import_module("django_sqlqueue.migrations.0014_sqlserver_locking")


def columns_of(text: str) -> list[str]:
    """``[a], [b] DESC, [c]`` -> ["a", "b", "c"]."""
    return re.findall(r"\[(\w+)\]", text)


#: name -> (table, key columns, included columns, filter columns) as migration 0014 leaves them.
INDEXES = {name: (table, columns_of(keys), columns_of(include), columns_of(where))
           for table, name, keys, include, where in M0014.FORWARD}


def reads(tree: exp.Expression, table: str) -> list[exp.Table]:
    return [t for t in tree.find_all(exp.Table) if t.name == table]


def select_of(table: exp.Table) -> exp.Select:
    """The SELECT whose FROM (or join) reads ``table``."""
    node = table.parent
    while not isinstance(node, exp.Select):
        node = node.parent
    return node


def columns_read(select: exp.Select, alias: str) -> set[str]:
    """Every column of ``alias`` the SELECT (and its correlated subqueries) reads."""
    return {c.name for c in select.find_all(exp.Column) if c.table == alias}


def order_by(select: exp.Select) -> list[tuple[str, bool]]:
    order = select.args.get("order")
    if order is None:
        return []
    return [(o.this.name, bool(o.args.get("desc"))) for o in order.expressions]


REQUESTS = [
    ClaimRequest("host:1/0", 10),
    ClaimRequest("host:1/0", 10, queues=("emails", "sms"), types=(3,)),
    ClaimRequest("host:1/0", 10, limited=True),
    ClaimRequest("host:1/0", 10, queues=("emails",), limited=True, reclaim=False),
]


# ----- 1. deadlocks: the claim is the victim, and re-checks what it picked ------------------------------
@pytest.mark.parametrize("req", REQUESTS)
def test_the_claim_runs_at_low_deadlock_priority_and_puts_normal_back(dialect: MssqlDialect, req) -> None:  # noqa: F811
    sql = batch(dialect.claim_batch(req))
    low = sql.index("SET DEADLOCK_PRIORITY LOW;")
    assert low < sql.index("BEGIN TRANSACTION")  # before any lock is taken
    # NORMAL again on both ways out: after the CATCH's rollback (before THROW) and before the results
    catch = sql[sql.index("BEGIN CATCH"):sql.index("END CATCH")]
    assert catch.index("SET DEADLOCK_PRIORITY NORMAL;") < catch.index("THROW")
    assert sql.rindex("SET DEADLOCK_PRIORITY NORMAL;") > sql.index("END CATCH")
    [statement] = [s for s in parse("SET DEADLOCK_PRIORITY LOW")]
    assert isinstance(statement, exp.Set)


def test_a_completion_alone_keeps_normal_priority_and_beside_a_claim_shares_its_low(dialect: MssqlDialect) -> None:  # noqa: F811
    alone = dialect.complete_batch([(1, 2, "{}", None)])
    assert "DEADLOCK_PRIORITY" not in batch(alone)
    shared = dialect.complete_batch([(1, 2, "{}", None)]).extend(dialect.claim_batch(ClaimRequest("w", 1)))
    assert "SET DEADLOCK_PRIORITY LOW;" in batch(shared)


@pytest.mark.parametrize("req", REQUESTS)
def test_the_update_re_checks_the_version_each_branch_picked(dialect: MssqlDialect, req) -> None:  # noqa: F811
    parts = dialect.claim_batch(req)
    _, body, _ = parse_batch(parts)
    update = next(s for s in body if isinstance(s, exp.Update) and isinstance(s.args.get("from_"), exp.From)
                  and s.args["from_"].this.alias == "picked")
    assert "j.[version] = picked.version" in update.args["where"].sql("tsql")
    picked = update.args["from_"].this.this
    assert [e.alias_or_name for e in picked.expressions] == ["id", "priority", "scheduled_for", "version"]
    # every branch carries the version it read (the limited one from @permit, read with its job)
    for table in reads(picked, JOB):
        assert "version" in {e.alias_or_name for e in select_of(table).expressions}
    if req.limited:
        [pick] = [s for s in body if isinstance(s, exp.Insert)
                  and "@permit" in s.this.sql("tsql")]
        assert "c.version" in pick.sql("tsql")


# ----- 2, 4, 6. every read pinned to its index, covered by it, in its order ----------------------------------
def branch_reads(d: MssqlDialect, req: ClaimRequest) -> list[tuple[exp.Table, exp.Select]]:
    parts = d.claim_batch(req)
    _, body, _ = parse_batch(parts)
    out = []
    for statement in body:
        for table in [*reads(statement, JOB), *reads(statement, PERMIT)]:
            if index_hint(table) is not None:
                out.append((table, select_of(table)))
    return out


@pytest.mark.parametrize("req", REQUESTS)
def test_every_locking_read_is_pinned_to_an_index_that_covers_it(dialect: MssqlDialect, req) -> None:  # noqa: F811
    """Hinted (a stale filtered-index statistic cannot flip a branch to another index with key lookups),
    and covered: every column the branch reads of the row is in the index's keys, INCLUDE list or filter,
    so a rejected row is rejected from the index entry, with no U lock on the base row."""
    found = branch_reads(dialect, req)
    locking = [t for t in [*(t for s in parse_batch(dialect.claim_batch(req))[1] for t in reads(s, JOB)),
                           *(t for s in parse_batch(dialect.claim_batch(req))[1] for t in reads(s, PERMIT))]
               if "UPDLOCK" in hints(t)]
    assert len(locking) == len(found) > 0, "every UPDLOCK read names its index"
    for table, select in found:
        name = index_hint(table)
        assert name in CLAIM_INDEXES and hints(table) == {"INDEX", "UPDLOCK", "ROWLOCK", "READPAST"}
        on, keys, include, where = INDEXES[name]
        assert on == table.name
        covered = {*keys, *include, *where, "id"}
        read = columns_read(select, table.alias_or_name)
        assert read <= covered, f"{name} lacks {read - covered}: each such row would be looked up and U-locked"


@pytest.mark.parametrize("req", REQUESTS)
def test_each_branch_reads_in_its_index_order_so_top_stops_at_n(dialect: MssqlDialect, req) -> None:  # noqa: F811
    """A branch whose ORDER BY is not its index's order sorts first: it reads (and U-locks) every row that
    matches before TOP returns one. So each ORDER BY is the index's key order after the columns the
    branch fixes by equality (the clustered key, id, follows a non-unique index's keys), or absent
    (the dead workers' nested loops stop at the n-th row in their own order)."""
    j = dialect.n.j
    found = branch_reads(dialect, req)
    # due; with reclaim mine, expired, dead; limited: its permit and its job
    assert len(found) == 1 + 3 * req.reclaim + 2 * req.limited
    for table, select in found:
        name = index_hint(table)
        _, keys, _, _ = INDEXES[name]
        order = [c for c, _ in order_by(select)]
        where = select.args["where"].sql("tsql")
        fixed = [k for k in keys if re.search(rf"\.\[{k}\] = (q\.name|@p\d+|p\.)", where)]
        index_order = [k for k in keys if k not in fixed] + (["id"] if "id" not in keys else [])
        if name == "sqlqueue_job_processing_worker" and select.find(exp.Join) is not None:
            assert order == [] and select.args.get("limit") is not None, "dead workers: TOP without a sort"
            continue
        assert order and order == index_order[:len(order)], f"{name}: ORDER BY {order}, index order {index_order}"
        assert select.args.get("limit") is not None  # TOP (n)
    assert f"ORDER BY j.{j['priority']} DESC" in batch(dialect.claim_batch(req))  # the due branch: claim order


def test_a_queue_filtered_claim_seeks_each_queue_instead_of_walking_the_others(dialect: MssqlDialect) -> None:  # noqa: F811
    req = ClaimRequest("w", 10, queues=("emails", "sms"), reclaim=False)
    _, [update, _], _ = parse_batch(dialect.claim_batch(req))
    [due] = [t for t in reads(update, JOB) if index_hint(t) is not None]
    assert index_hint(due) == "sqlqueue_job_claim_queue" and INDEXES["sqlqueue_job_claim_queue"][1][0] == "queue"
    inner = select_of(due)
    where = inner.args["where"].sql("tsql")
    assert "j.[queue] = q.name" in where and "j.[queue] IN (" not in where
    apply = inner.parent
    while not isinstance(apply, exp.Select):
        apply = apply.parent
    values = apply.find(exp.Values)
    assert values is not None and len(values.expressions) == 2  # one seek per queue
    # the same filter as the claim index: a plan compiled for one matches the other
    assert INDEXES["sqlqueue_job_claim_queue"][3] == INDEXES["sqlqueue_job_claim"][3]


def test_the_permit_pick_is_an_ordered_seek_on_held_until(dialect: MssqlDialect) -> None:  # noqa: F811
    pick, _ = dialect.limited_pick(ClaimRequest("w", 1, limited=True))
    [insert] = parse(pick)
    # The pick's pinned read; the other read of the table is the surplus check's NOT EXISTS (issue 31.4).
    [permit] = [r for r in reads(insert, PERMIT) if index_hint(r)]
    assert index_hint(permit) == "sqlqueue_permit_free" and INDEXES["sqlqueue_permit_free"][1] == ["held_until", "id"]
    outer = select_of(permit)
    assert order_by(outer) == [("held_until", False), ("id", False)]  # NULL (never held) sorts first
    assert outer.args["limit"].expression.name == "1"  # TOP (1)


# ----- 3. lock escalation off for the history table; counts that must not read a snapshot (5) -----------------
def test_migration_0014_turns_escalation_off_for_the_history_table_too() -> None:
    class Editor:
        def __init__(self, vendor: str) -> None:
            from django.db import connection

            self.sent: list[str] = []
            self.connection = type("C", (), {"vendor": vendor, "ops": connection.ops})()

        def execute(self, sql: str) -> None:
            self.sent.append(sql)

    editor = Editor("microsoft")
    M0014.forward(None, editor)
    assert any(s.endswith("[django_sqlqueue_jobattempt] SET (LOCK_ESCALATION = DISABLE)") or
               s.endswith('"django_sqlqueue_jobattempt" SET (LOCK_ESCALATION = DISABLE)') for s in editor.sent)
    created = [s for s in editor.sent if s.startswith("CREATE INDEX")]
    assert len(created) == len(M0014.FORWARD)
    other = Editor("postgresql")
    M0014.forward(None, other)
    assert other.sent == []  # SQL Server only


def test_the_reads_that_must_wait_for_a_writer_lock(dialect: MssqlDialect) -> None:  # noqa: F811
    """Under READ_COMMITTED_SNAPSHOT (Azure SQL Database's default) a plain read returns the last committed
    version: the permit renewal's look at the job's other permits, and a batch's second count under its
    lock, must see a change being made now, so they read WITH (READCOMMITTEDLOCK)."""
    [renew] = parse(dialect.renew_permits_sql(2), [60, 1, 2])
    inner = [t for t in reads(renew, PERMIT) if t.alias == "q"]
    assert len(inner) == 1 and hints(inner[0]) == {"READCOMMITTEDLOCK"}
    [count] = parse(dialect.batch_counts_sql(locked=True), [7])
    assert hints(count.find(exp.Table)) == {"READCOMMITTEDLOCK"}
    [plain] = parse(dialect.batch_counts_sql(), [7])
    assert hints(plain.find(exp.Table)) == set()


# ----- 1. writers take their locks in one order ---------------------------------------------------------------
class Capture:
    def __init__(self) -> None:
        self.sent: list[tuple[str, list]] = []

    def setinputsizes(self, sizes: list) -> None:
        pass

    def execute(self, sql: str, params: list) -> None:
        self.sent.append((sql, params))

    def fetchall(self) -> list:
        return []


def test_dedupe_inserts_go_in_key_order(dialect: MssqlDialect) -> None:  # noqa: F811
    """One statement per keyed row on SQL Server, each holding its key's range lock to commit: two bulk
    enqueues sharing keys take them in one order (keyless rows last, in their own order)."""
    from django_sqlqueue.queue import INSERT_COLUMNS

    at = INSERT_COLUMNS.index("dedupe_key")

    def row(key: str | None, n: int) -> list:
        r = ["default", 1, 1, "", 0, 0, None, "{}", "", None, None, 1, None, "", None, "", False, None]
        r[at], r[INSERT_COLUMNS.index("payload")] = key, f'{{"n": {n}}}'
        return r

    cursor = Capture()
    dialect.insert_job(cursor, INSERT_COLUMNS, [row("b", 1), row(None, 2), row("a", 3), row("c", 4), row(None, 5)],
                       dedupe=True)  # type: ignore[arg-type]
    sent = [params for _, params in cursor.sent]
    assert [p[-1] for p in sent] == ["a", "b", "c", None, None]  # the guard's key, last parameter
    assert [next(v for v in p if isinstance(v, str) and v.startswith('{"n"')) for p in sent[3:]] == [
        '{"n": 2}', '{"n": 5}']
