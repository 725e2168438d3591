"""Time the operator's views (issue 18) at 10k (or more) jobs on SQLite, PostgreSQL and over TDS.

    python bench/operator_views.py --db sqlite --jobs 10000
    python bench/operator_views.py --db postgres --jobs 10000      # a throwaway cluster
    python bench/operator_views.py --db postgres --jobs 1000000     # loaded by generate_series
    python bench/operator_views.py --db tds --jobs 1000000          # Babelfish (../shared/babelfish), one INSERT
    SQLQUEUE_DATABASE_URL=mssql://... python bench/operator_views.py --db tds   # a SQL Server you name:
                                                    # migrated and loaded as it is, never emptied: a scratch one

The database is as a new user's is: SQLite never gathers the planner's statistics by itself, so none are
gathered (``--analyze`` runs ``ANALYZE`` first, for comparison); PostgreSQL's autovacuum vacuums and
analyzes a table after a load without being asked, so the bench runs that ``VACUUM ANALYZE`` at once
rather than wait for it; SQL Server creates and updates statistics itself (AUTO_CREATE_STATISTICS), and
over TDS the bench asks for none. Results over TDS on Babelfish are Babelfish's (PostgreSQL's planner
under T-SQL), never SQL Server's.

Loads a realistic mix (bench/admin_changelist.py's: mostly Completed, Failed / Error with tracebacks,
a Pending backlog, some Processing with expired leases, 40 workers, some stale, a few serving only
some queues), then requests each page in-process through Django's test client (queries + template
rendering, no network) and prints the median and worst of ``--repeat`` runs and the query count.
Pages: the dashboard, the job list filtered to orphans and sorted three ways, the failure triage page,
the throughput page (1 h, 7 d and 30 d, after the throughput rollup has caught up, as a worker would
have done), the job types' and the workers' lists and the Prometheus endpoint. Not run in CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_generic(n: int) -> float:
    """bulk_create in batches: any vendor (SQLite here); the same mix as admin_changelist.load."""
    from django.utils import timezone

    from bench.admin_changelist import QUEUES, STEPS, TYPES
    from django_sqlqueue.models import Job, JobType

    started = time.perf_counter()
    types = [JobType.objects.get_or_create(name=name)[0].pk for name in TYPES]
    now = timezone.now()
    batch = []
    for g in range(1, n + 1):
        r = g % 100
        status = (5 if r < 70 else 4 if r < 78 else 3 if r < 83 else 1 if r < 93 else 2 if r < 94 else 6 if r < 97
                  else 7 if r < 98 else 8 if r < 99 else 9)
        enq = now - timedelta(days=30) + timedelta(days=30) * (g / n)
        finished = None
        if status in (3, 4, 5, 6, 8, 9):
            finished = now - timedelta(seconds=g % 3600) if g % 50 == 0 else enq + timedelta(seconds=3)
        error = ""
        if status in (3, 4):
            error = ("Traceback (most recent call last):\n  File \"handlers.py\", line 42, in send\n"
                     + (f"RareProblem: quota exceeded for tenant {g}" if g % 1000 == 75
                        else "smtplib.SMTPServerDisconnected: Connection unexpectedly closed"))
        batch.append(Job(
            queue=QUEUES[g % len(QUEUES)], job_type_id=types[(g // 7) % len(types)], status_id=status,
            step=STEPS[(g // 3) % len(STEPS)], priority=(g % 3) - 1,
            attempt_num=0 if status in (1, 7) else 3 if status == 4 else 1 + g % 2,
            payload={"n": g, "to": f"user{g}@example.com"}, response={"ok": True} if status == 5 else None,
            error=error, enqueued_at=enq,
            scheduled_for=enq + timedelta(seconds=g % 600) if status in (1, 3) else enq,
            started_at=None if status in (1, 6, 7) else enq + timedelta(seconds=2), finished_at=finished,
            duration_ms=100 + g % 5000 if status in (3, 4, 5, 9) else None, version=2, updated_at=enq,
            worker="" if status in (1, 7) else f"worker-{g % 40}",
            lease_expires_at=now + timedelta(seconds=(g % 5) * 60 - 120) if status == 2 else None,
            dedupe_key=f"key-{g}" if g % 10 == 0 else None))
        if len(batch) == 2000:
            Job.objects.bulk_create(batch)
            batch.clear()
    Job.objects.bulk_create(batch)
    return time.perf_counter() - started


def load_tsql(n: int) -> float:
    """One INSERT ... SELECT over a numbers table made of cross-joined digits (T-SQL; the same mix as
    :func:`load_generic` and bench/admin_changelist.py's generate_series): 1M jobs in one statement
    where ``bulk_create`` would send 500 batches over TDS."""
    from django.db import connection

    from bench.admin_changelist import QUEUES, STATUS_CASE, STEPS, TYPES
    from django_sqlqueue.models import Job, JobType

    def pick(expr: str, values: list) -> str:
        whens = " ".join(f"WHEN {i} THEN {v!r}" if isinstance(v, int) else f"WHEN {i} THEN N'{v}'"
                         for i, v in enumerate(values))
        return f"CASE ({expr}) %% {len(values)} {whens} END"

    started = time.perf_counter()
    types = [JobType.objects.get_or_create(name=name)[0].pk for name in TYPES]
    table = connection.ops.quote_name(Job._meta.db_table)
    digits = "(SELECT v FROM (VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)) AS d(v))"
    places = max(1, len(str(n)))
    number = " + ".join(f"p{i}.v * {10 ** i}" for i in range(places))
    joins = " CROSS JOIN ".join(f"{digits} AS p{i}" for i in range(places))
    with connection.cursor() as cursor:
        cursor.execute(f"""
        INSERT INTO {table} (queue, type_id, status_id, step, priority, attempt_num, max_attempts, payload,
                             response, error, enqueued_at, scheduled_for, started_at, finished_at, duration_ms,
                             version, updated_at, worker, lease_expires_at, dedupe_key)
        SELECT {pick("x.g", QUEUES)}, {pick("x.g / 7", types)}, x.status, {pick("x.g / 3", STEPS)},
               (x.g %% 3) - 1,
               CASE WHEN x.status IN (1, 7) THEN 0 WHEN x.status = 4 THEN 3 ELSE 1 + x.g %% 2 END,
               NULL,
               CONCAT(N'{{"n": ', x.g, N', "to": "user', x.g, N'@example.com"}}'),
               CASE WHEN x.status = 5 THEN N'{{"ok": true}}' END,
               CASE WHEN x.status IN (3, 4) THEN CONCAT(N'Traceback (most recent call last):', NCHAR(10),
                    N'  File "handlers.py", line 42, in send', NCHAR(10),
                    CASE WHEN x.g %% 1000 = 75 THEN CONCAT(N'RareProblem: quota exceeded for tenant ', x.g)
                         ELSE N'SMTPServerDisconnected: Connection unexpectedly closed' END)
                    ELSE N'' END,
               x.enq,
               CASE WHEN x.status IN (1, 3) THEN DATEADD(second, x.g %% 600, x.enq) ELSE x.enq END,
               CASE WHEN x.status NOT IN (1, 6, 7) THEN DATEADD(second, 2, x.enq) END,
               CASE WHEN x.status IN (3, 4, 5, 6, 8, 9) THEN
                    CASE WHEN x.g %% 50 = 0 THEN DATEADD(second, -(x.g %% 3600), SYSUTCDATETIME())
                         ELSE DATEADD(second, 3, x.enq) END END,
               CASE WHEN x.status IN (3, 4, 5, 9) THEN 100 + x.g %% 5000 END,
               2, x.enq,
               CASE WHEN x.status IN (1, 7) THEN N'' ELSE CONCAT(N'worker-', x.g %% 40) END,
               CASE WHEN x.status = 2 THEN DATEADD(second, (x.g %% 5) * 60 - 120, SYSUTCDATETIME()) END,
               CASE WHEN x.g %% 10 = 0 THEN CONCAT(N'key-', x.g) END
        FROM (SELECT n.g, {STATUS_CASE.replace("%", "%%").replace("g ", "n.g ")} AS status,
                     DATEADD(second, CAST(2592000.0 * n.g / %s AS int), DATEADD(day, -30, SYSUTCDATETIME())) AS enq
              FROM (SELECT 1 + {number} AS g FROM {joins}) AS n WHERE n.g <= %s) AS x
        """, [n, n])
    return time.perf_counter() - started


def analyze() -> None:
    """Gather the planner's statistics (``--analyze``): what a fresh database does not have."""
    from django.db import connection

    from django_sqlqueue.models import Job

    table = connection.ops.quote_name(Job._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute({"postgresql": f"VACUUM ANALYZE {table}", "sqlite": "ANALYZE",
                        "microsoft": f"UPDATE STATISTICS {table}"}[connection.vendor])


def workers() -> None:
    from django.utils import timezone

    from bench.admin_changelist import QUEUES
    from django_sqlqueue.models import Worker

    now = timezone.now()
    for i in range(40):
        Worker.objects.update_or_create(name=f"worker-{i}", defaults={
            "host": f"host-{i % 4}", "pid": 1000 + i, "started_at": now,
            "last_heartbeat": now if i % 10 else now - timedelta(minutes=30),
            "stopped_at": now if i % 13 == 0 else None,
            # like the setup: the workers serve 4 of the 5 queues ("billing" is nobody's)
            "queues": QUEUES[:2] if i % 2 else QUEUES[1:4], "types": []})


def pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_sqlqueue.admin.site import JobAdmin

    jobs = reverse("admin:django_sqlqueue_job_changelist")
    column = {name: i + 1 for i, name in enumerate(JobAdmin.list_display)}  # ?o= counts the checkbox as 0
    return [
        ("dashboard", reverse("admin:django_sqlqueue_dashboard")),
        ("job list, orphaned", f"{jobs}?orphaned=1"),
        ("job list by finished", f"{jobs}?o=-{column['finished_col']}"),
        ("job list by priority", f"{jobs}?o=-{column['priority_col']}"),
        ("failed by attempts", f"{jobs}?status=4&o=-{column['attempts_col']}"),
        ("failure triage", reverse("admin:django_sqlqueue_failures")),
        ("throughput 1 h", reverse("admin:django_sqlqueue_throughput")),
        ("throughput 7 d", reverse("admin:django_sqlqueue_throughput") + "?window=7d"),
        ("throughput 30 d", reverse("admin:django_sqlqueue_throughput") + "?window=30d"),
        ("job types", reverse("admin:django_sqlqueue_jobtype_changelist")),
        ("workers", reverse("admin:django_sqlqueue_worker_changelist")),
        ("metrics endpoint", reverse("sqlqueue-metrics")),
    ]


def roll_up() -> None:
    """What the fleet's maintenance holder does before anyone opens the page: the throughput rollup
    (ops/rollup.py) catches up, a day a pass; timed, since a new deployment pays it once."""
    from django.utils import timezone

    from django_sqlqueue.ops.rollup import Rollup

    rollup = Rollup("default")
    started, passes = time.perf_counter(), 1
    while rollup.run(timezone.now()):
        passes += 1
    print(f"throughput rollup caught up in {time.perf_counter() - started:.1f} s ({passes} passes of a day)")


def measure(repeat: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    print(f"{'page':24} {'median ms':>10} {'worst ms':>9} {'queries':>8}  slowest queries")
    for label, url in pages():
        times = []
        for _ in range(repeat + 1):  # the first run warms caches and is not counted
            with CaptureQueriesContext(connection) as ctx:
                started = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        slow = sorted(ctx.captured_queries, key=lambda q: -float(q["time"]))[:2]
        detail = "; ".join(f"{float(q['time']) * 1000:.0f} ms {' '.join(q['sql'].split())[:70]}" for q in slow)
        print(f"{label:24} {statistics.median(times[1:]):10.1f} {max(times[1:]):9.1f} {len(ctx.captured_queries):8d}  {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "tds"], default="sqlite")
    parser.add_argument("--analyze", action="store_true",
                        help="gather the planner's statistics after the load (always done on PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cluster = None
    tmp = None
    if args.db == "postgres":
        from tests.pgcluster import PgCluster

        cluster = PgCluster().start()
        os.environ["SQLQUEUE_DATABASE_URL"] = cluster.url
    elif args.db == "tds":
        if not os.environ.get("SQLQUEUE_DATABASE_URL", "").startswith("mssql://"):
            from tests import babelfish

            os.environ.update(babelfish.ENV)
            os.environ["SQLQUEUE_DATABASE_URL"] = babelfish.create_database(babelfish.start(), "sqlqueue_opviews",
                                                                            fresh=True)
    else:
        tmp = tempfile.mkdtemp(prefix="sqlqueue-bench-")
        os.environ["SQLQUEUE_DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection

        settings.DEBUG = False
        call_command("migrate", verbosity=0)
        print(f"loading {args.jobs:,} jobs into {connection.vendor} ...", flush=True)
        gathered = args.analyze or connection.vendor == "postgresql"
        if connection.vendor == "postgresql" and args.jobs > 50_000:
            from bench.admin_changelist import load

            took = load(args.jobs)  # ends with VACUUM ANALYZE, as autovacuum would
        else:
            took = load_tsql(args.jobs) if connection.vendor == "microsoft" and args.jobs > 50_000 else \
                load_generic(args.jobs)
            if gathered:
                analyze()
        workers()
        print(f"loaded in {took:.1f} s ({'statistics gathered' if gathered else 'no statistics gathered'})")
        roll_up()
        measure(args.repeat)
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
