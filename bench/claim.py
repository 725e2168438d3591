"""Claim benchmark: throughput of claim+complete, and claim time as the queue grows.

Usage::

    python bench/claim.py                 # SQLite and a throwaway PostgreSQL, side by side
    python bench/claim.py --db sqlite     # one database only
    python bench/claim.py --depths 10000,1000000 --jobs 5000

Prints, per database: jobs claimed+completed per second with batch 1 and batch 50 (one process), and
the median time of one claim (limit 10) with 10,000 and with 1,000,000 claimable rows, and their
ratio, for the full claim (``Job.objects.claim``) and for the due-only claim a busy worker makes
between its looks for stuck jobs (``complete_and_claim(..., reclaim=False)``) (the claim walks a partial index in claim order, so the ratio should stay near 1). Rows for the
depth test are inserted with one INSERT ... SELECT on the server, not through Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup(url: str) -> None:
    os.environ["SQLQUEUE_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _reset() -> None:
    from django.db import connection

    from django_sqlqueue.models import Job, JobAttempt

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {JobAttempt._meta.db_table}, {Job._meta.db_table} CASCADE")
        else:
            cursor.execute(f"DELETE FROM {JobAttempt._meta.db_table}")
            cursor.execute(f"DELETE FROM {Job._meta.db_table}")


def _bulk_fill(n: int, type_id: int) -> None:
    """Insert ``n`` due Pending jobs server-side (fast), then refresh planner statistics."""
    from django.db import connection

    from django_sqlqueue.models import Job

    table = connection.ops.quote_name(Job._meta.db_table)
    cols = "queue, type_id, status_id, step, priority, attempt_num, payload, error, enqueued_at, scheduled_for, version, updated_at, worker"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO {table} ({cols}) SELECT 'default', %s, 1, '', (g %% 3), 0, '{{}}'::jsonb, '', "
                f"now() - interval '1 hour', now() - interval '1 hour' + g * interval '1 ms', 1, now(), '' "
                f"FROM generate_series(1, %s) g",
                [type_id, n],
            )
            cursor.execute(f"ANALYZE {table}")
        else:
            cursor.execute(
                f"WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < %s) "
                f"INSERT INTO {table} ({cols}) SELECT 'default', %s, 1, '', (x %% 3), 0, '{{}}', '', "
                f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1 hours'), "
                f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1 hours', (x / 1000.0) || ' seconds'), 1, "
                f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'), '' FROM g",
                [n, type_id],
            )
            cursor.execute("ANALYZE")


def _throughput(jobs: int, batch: int) -> float:
    from django_sqlqueue.models import Job
    from django_sqlqueue.queue import JobSpec

    _reset()
    Job.objects.enqueue_many(JobSpec("Noop") for _ in range(jobs))
    start = time.perf_counter()
    done = 0
    while claimed := Job.objects.claim("bench/0", batch):
        for job in claimed:
            job.complete()
            done += 1
    elapsed = time.perf_counter() - start
    assert done == jobs, (done, jobs)
    return done / elapsed


def _claim_time(depth: int, type_id: int, samples: int) -> tuple[float, float]:
    """Median seconds of one claim of 10 jobs: the full claim, and a busy worker's due-only claim."""
    from django_sqlqueue.models import Job

    _reset()
    _bulk_fill(depth, type_id)
    full, due_only = [], []
    for i in range(samples):  # interleaved, so both see the same table and the same machine noise
        start = time.perf_counter()
        got = Job.objects.claim(f"depth/{i}", 10)
        full.append(time.perf_counter() - start)
        start = time.perf_counter()
        _, more = Job.objects.complete_and_claim((), f"busy/{i}", 10, reclaim=False)
        due_only.append(time.perf_counter() - start)
        assert len(got) == len(more) == 10
    return statistics.median(full), statistics.median(due_only)


def run_one(url: str, depths: list[int], jobs: int, samples: int) -> dict:
    _setup(url)
    from django.db import connection

    from django_sqlqueue.models import JobType

    type_id = JobType.objects.get_or_create(name="Noop")[0].id
    result = {"vendor": connection.vendor}
    for batch in (1, 50):
        result[f"claim_complete_per_s_batch_{batch}"] = round(_throughput(jobs, batch), 1)
    for depth in depths:
        full, due_only = _claim_time(depth, type_id, samples)
        result[f"claim_ms_depth_{depth}"] = round(full * 1000, 3)
        result[f"due_only_claim_ms_depth_{depth}"] = round(due_only * 1000, 3)
    for prefix in ("claim", "due_only_claim"):
        result[f"{prefix}_depth_ratio"] = round(
            result[f"{prefix}_ms_depth_{depths[-1]}"] / result[f"{prefix}_ms_depth_{depths[0]}"], 2)
    _reset()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--depths", default="10000,1000000")
    parser.add_argument("--jobs", type=int, default=5000, help="jobs for the throughput runs (default 5000)")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--inner-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    if args.inner_url:
        print(json.dumps(run_one(args.inner_url, depths, args.jobs, args.samples)))
        return 0
    from tests.pgcluster import PgCluster

    results = []
    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        cluster = None
        with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-") as tmp:
            if db == "postgres":
                cluster = PgCluster(fsync=True).start()  # durable settings, as in production
                url = cluster.url
            else:
                url = f"sqlite:///{tmp}/bench.sqlite3"
            try:
                out = subprocess.run(
                    [sys.executable, __file__, "--inner-url", url, "--depths", args.depths,
                     "--jobs", str(args.jobs), "--samples", str(args.samples)],
                    capture_output=True, text=True, cwd=ROOT,
                )
            finally:
                if cluster is not None:
                    cluster.destroy()
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                raise SystemExit(f"{db} run failed")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    keys = [k for k in results[0] if k != "vendor"]
    print(f"{'metric':36}" + "".join(f"{r['vendor']:>14}" for r in results))
    for key in keys:
        print(f"{key:36}" + "".join(f"{r[key]:>14}" for r in results))
    print("durability: PostgreSQL fsync=on, synchronous_commit=on; SQLite WAL, synchronous=NORMAL")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
