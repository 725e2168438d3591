"""Time the admin's job list and dashboard with 1,000,000 jobs in PostgreSQL.

    python bench/admin_changelist.py                  # throwaway cluster, 1,000,000 jobs
    python bench/admin_changelist.py --jobs 200000    # smaller
    SQLQUEUE_DATABASE_URL=postgres://... python bench/admin_changelist.py --reuse     # jobs already there
    SQLQUEUE_DATABASE_URL=postgres://... python bench/admin_changelist.py --truncate  # empty, then load

Loads the jobs with one INSERT ... SELECT generate_series (a realistic mix: mostly Completed, some
Failed / Error with tracebacks, a Pending backlog, a few Processing with some leases expired, five
queues, eight types, steps, workers, enqueue times spread over 30 days, an hour of finishes), runs
VACUUM ANALYZE, then requests each page in-process through Django's test client (server time:
queries + template rendering, no network) and prints the median and worst of ``--repeat`` runs, the
number of queries and the slowest query of each page.

The admin's filters expect the indexes docs/admin.md lists; those missing from the model are created
here first (with the same ``models.Index`` definitions) unless ``--no-extra-indexes`` is given, and
the script says which it created. Not run in CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUEUES = ["default", "emails", "reports", "webhooks", "billing"]
TYPES = ["SendEmail", "RenderReport", "CallWebhook", "ChargeCard", "ResizeImage", "SyncCrm", "Cleanup",
         "ResetPassword"]
STEPS = ["", "", "", "Render", "Send", "Confirm"]

# status by (i % 100): 70 Completed, 8 Failed, 5 Error, 10 Pending, 1 Processing, 3 Cancelled,
# 1 Paused, 1 Terminated, 1 PartiallyCompleted
STATUS_CASE = """CASE
  WHEN g % 100 < 70 THEN 5 WHEN g % 100 < 78 THEN 4 WHEN g % 100 < 83 THEN 3 WHEN g % 100 < 93 THEN 1
  WHEN g % 100 < 94 THEN 2 WHEN g % 100 < 97 THEN 6 WHEN g % 100 < 98 THEN 7 WHEN g % 100 < 99 THEN 8
  ELSE 9 END"""


def extra_indexes() -> list:
    """The indexes docs/admin.md asks the model for (kept identical to that list)."""
    from django.db import models
    from django.db.models import Q

    return [
        models.Index(fields=["queue", "id"], name="sqlqueue_job_queue"),
        models.Index(fields=["step", "id"], name="sqlqueue_job_step"),
        models.Index(fields=["worker", "id"], name="sqlqueue_job_worker"),
        models.Index(fields=["id"], name="sqlqueue_job_has_error", condition=Q(error__gt="")),
        models.Index(fields=["dedupe_key"], name="sqlqueue_job_dedupe_key", condition=Q(dedupe_key__isnull=False)),
        # replaces the model's ["finished_at"]: the chart's GROUP BY (minute, status) becomes index-only
        models.Index(fields=["finished_at", "status"], name="sqlqueue_job_finished"),
    ]


def load(n: int) -> float:
    from django.db import connection

    from django_sqlqueue.models import Job, JobType, Worker

    started = time.perf_counter()
    for name in TYPES:
        JobType.objects.get_or_create(name=name)
    type_ids = list(JobType.objects.filter(name__in=TYPES).order_by("id").values_list("id", flat=True))
    table = connection.ops.quote_name(Job._meta.db_table)
    queues = "ARRAY[" + ",".join(f"'{q}'" for q in QUEUES) + "]"
    steps = "ARRAY[" + ",".join(f"'{s}'" for s in STEPS) + "]"
    types = "ARRAY[" + ",".join(str(t) for t in type_ids) + "]"
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
        cursor.execute(f"""
        INSERT INTO {table} (queue, type_id, status_id, step, priority, attempt_num, max_attempts, payload,
                             response, error, enqueued_at, scheduled_for, started_at, finished_at, duration_ms,
                             version, updated_at, worker, lease_expires_at, dedupe_key)
        SELECT ({queues})[1 + g %% {len(QUEUES)}],
               ({types})[1 + (g / 7) %% {len(type_ids)}],
               s.status,
               ({steps})[1 + (g / 3) %% {len(STEPS)}],
               (g %% 3) - 1,
               CASE WHEN s.status IN (1, 7) THEN 0 WHEN s.status = 4 THEN 3 ELSE 1 + g %% 2 END,
               NULL,
               jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'),
               CASE WHEN s.status = 5 THEN jsonb_build_object('ok', true) END,
               CASE WHEN s.status IN (3, 4) THEN
                 'Traceback (most recent call last):' || chr(10) || '  File "handlers.py", line 42, in send' || chr(10)
                 || CASE WHEN g %% 1000 = 75 THEN 'RareProblem: quota exceeded for tenant ' || g
                         ELSE 'SMTPServerDisconnected: Connection unexpectedly closed' END
                 ELSE '' END,
               t.enq,
               CASE WHEN s.status IN (1, 3) THEN t.enq + (g %% 600) * interval '1 second' ELSE t.enq END,
               CASE WHEN s.status NOT IN (1, 6, 7) THEN t.enq + interval '2 seconds' END,
               CASE WHEN s.status IN (3, 4, 5, 6, 8, 9) THEN
                 CASE WHEN g %% 50 = 0 THEN now() - (g %% 3600) * interval '1 second'
                      ELSE t.enq + interval '3 seconds' END END,
               CASE WHEN s.status IN (3, 4, 5, 9) THEN 100 + g %% 5000 END,
               2, t.enq,
               CASE WHEN s.status = 1 OR s.status = 7 THEN '' ELSE 'worker-' || (g %% 40) END,
               CASE WHEN s.status = 2 THEN now() + ((g %% 5) * 60 - 120) * interval '1 second' END,
               CASE WHEN g %% 10 = 0 THEN 'key-' || g END
        FROM generate_series(1, %s) AS g
        CROSS JOIN LATERAL (SELECT {STATUS_CASE.replace('%', '%%')} AS status) s
        CROSS JOIN LATERAL (SELECT now() - interval '30 days' + (g::float / %s) * interval '30 days' AS enq) t
        """, [n, n])
    from django.utils import timezone

    now = timezone.now()
    for i in range(40):
        Worker.objects.update_or_create(
            name=f"worker-{i}",
            defaults={"host": f"host-{i % 4}", "pid": 1000 + i, "started_at": now,
                      "last_heartbeat": now if i % 10 else now - timezone.timedelta(minutes=30)})
    with connection.cursor() as cursor:
        # What autovacuum leaves a loaded table in: every page all-visible (index-only scans read no
        # heap). A VACUUM that races autovacuum's own ANALYZE of the fresh rows (its snapshot holds the
        # horizon back) marks nothing, and the status counts then read the whole heap: 0.3 s instead of
        # 0.1 s at 1M jobs, a different result from run to run. So it is repeated until it has.
        for _attempt in range(10):
            cursor.execute(f"VACUUM ANALYZE {table}")
            cursor.execute("SELECT relpages, relallvisible FROM pg_class WHERE oid = %s::regclass",
                           [Job._meta.db_table])
            pages, visible = cursor.fetchone()
            if visible >= 0.95 * pages:
                break
            time.sleep(3)
        else:
            print(f"warning: {visible} of {pages} pages all-visible after VACUUM (autovacuum busy?)")
    return time.perf_counter() - started


def ensure_indexes() -> list[str]:
    from django.db import connection

    from django_sqlqueue.models import Job

    with connection.cursor() as cursor:
        existing = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    created = []
    with connection.schema_editor() as editor:
        for index in extra_indexes():
            columns = [Job._meta.get_field(f.lstrip("-")).column for f in index.fields]
            if index.name in existing and existing[index.name]["columns"] == columns:
                continue
            if index.name in existing:
                editor.remove_index(Job, index)
            editor.add_index(Job, index)
            created.append(index.name)
    if created:
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {connection.ops.quote_name(Job._meta.db_table)}")
    return created


def pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_sqlqueue.models import Job, JobType

    jobs = reverse("admin:django_sqlqueue_job_changelist")
    some = Job.objects.filter(status_id=4).order_by("-id").values_list("id", flat=True).first()
    key = Job.objects.filter(dedupe_key__isnull=False).order_by("id").values_list("dedupe_key", flat=True)[5000]
    type_id = JobType.objects.get(name="RenderReport").pk
    year = Job.objects.order_by("-id").values_list("enqueued_at", flat=True).first()
    return [
        ("list, first page", jobs),
        ("list, page 2", f"{jobs}?p=2"),
        ("list, page 100", f"{jobs}?p=100"),
        ("filter status=Failed", f"{jobs}?status=4"),
        ("filter status=Processing", f"{jobs}?status=2"),
        ("filter type", f"{jobs}?type={type_id}"),
        ("filter queue=billing", f"{jobs}?queue=billing"),
        ("filter step=Send", f"{jobs}?step=Send"),
        ("filter worker=worker-7", f"{jobs}?worker=worker-7"),
        ("filter overdue", f"{jobs}?overdue=1"),
        ("filter lease expired", f"{jobs}?lease_expired=1"),
        ("filter has error", f"{jobs}?has_error=1"),
        ("filter Failed + queue + type", f"{jobs}?status=4&queue=emails&type={type_id}"),
        ("date hierarchy: a day", f"{jobs}?enqueued_at__year={year.year}&enqueued_at__month={year.month}"
                                  f"&enqueued_at__day={year.day}"),
        ("search id", f"{jobs}?q={some}"),
        ("search dedupe key", f"{jobs}?q={key}"),
        ("search error text (common)", f"{jobs}?q=SMTPServerDisconnected"),
        ("search error text (rare)", f"{jobs}?q=RareProblem"),
        ("search error text + Failed", f"{jobs}?q=RareProblem&status=4"),
        ("job page", reverse("admin:django_sqlqueue_job_change", args=[some])),
        ("dashboard", reverse("admin:django_sqlqueue_dashboard")),
        ("job types list", reverse("admin:django_sqlqueue_jobtype_changelist")),
        ("workers list", reverse("admin:django_sqlqueue_worker_changelist")),
    ]


def measure(repeat: int) -> None:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    print(f"{'page':34} {'median ms':>10} {'worst ms':>9} {'queries':>8}  slowest query")
    for label, url in pages():
        times = []
        for _ in range(repeat + 1):  # the first run warms caches and is not counted
            with CaptureQueriesContext(connection) as ctx:
                started = time.perf_counter()
                response = client.get(url)
                times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        slowest = max(ctx.captured_queries, key=lambda q: float(q["time"]))
        sql = " ".join(slowest["sql"].split())[:90]
        print(f"{label:34} {statistics.median(times[1:]):10.1f} {max(times[1:]):9.1f} "
              f"{len(ctx.captured_queries):8d}  {float(slowest['time']) * 1000:6.1f} ms {sql}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reuse", action="store_true", help="use SQLQUEUE_DATABASE_URL's jobs as they are")
    parser.add_argument("--no-extra-indexes", action="store_true")
    parser.add_argument("--truncate", action="store_true",
                        help="empty the job tables of SQLQUEUE_DATABASE_URL first (a throwaway cluster always starts empty)")
    args = parser.parse_args()

    cluster = None
    if not os.environ.get("SQLQUEUE_DATABASE_URL"):
        from tests.pgcluster import PgCluster

        cluster = PgCluster().start()
        os.environ["SQLQUEUE_DATABASE_URL"] = cluster.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    try:
        import django

        django.setup()
        from django.conf import settings
        from django.core.management import call_command
        from django.db import connection

        settings.DEBUG = False
        if connection.vendor != "postgresql":
            raise SystemExit("this benchmark is for PostgreSQL")
        call_command("migrate", verbosity=0)
        from django_sqlqueue.models import Job

        if args.truncate:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {connection.ops.quote_name(Job._meta.db_table)} CASCADE")
        if not args.reuse or not Job.objects.exists():
            print(f"loading {args.jobs:,} jobs ...", flush=True)
            print(f"loaded in {load(args.jobs):.1f} s")
        if not args.no_extra_indexes:
            created = ensure_indexes()
            if created:
                print(f"created the indexes the admin expects but the model lacks: {', '.join(created)}")
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            print(cursor.fetchone()[0].split(",")[0], f"| {Job.objects.count():,} jobs")
        measure(args.repeat)
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
