"""Schedules benchmark: what the look costs a worker per second, and that schedule rows do not slow claims.

Usage::

    python bench/schedules.py                 # SQLite and a throwaway PostgreSQL, side by side
    python bench/schedules.py --db sqlite     # one database only

Prints, per database:

- the look (``run_due`` with nothing due: ONE statement, two partial-index seeks) in microseconds, with
  0, 1,000 and 10,000 schedule rows (none due), and the database time it costs one worker per second at
  the default ``SCHEDULES_CHECK_SECONDS`` (1 s);
- one look that finds 1 due schedule among 1,000 and enqueues its tick (claim, enqueue, advance);
- the median job claim (``Job.objects.claim``, limit 10, ~30,000 claimable jobs) with no schedule rows,
  with 1,000, and with 1,000 while another connection looks 100 times a second;
- the plan of the look (which indexes it seeks).

No timing is asserted anywhere: these are numbers to read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
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


def _median_us(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e6, 1)


def _fill_schedules(n: int, start: int = 0) -> None:
    from django_sqlqueue import schedules
    from django_sqlqueue.models import Schedule

    later = schedules.db_clock("default") + timedelta(days=1)
    Schedule.objects.bulk_create(
        [Schedule(name=f"bench-{start + i}", job_type="test.Noop", every_seconds=3600, timezone="UTC",
                  next_run_at=later + timedelta(seconds=i)) for i in range(n)], batch_size=500)
    _analyze()


def _analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _fill_jobs(n: int) -> None:
    from django_sqlqueue.models import Job
    from django_sqlqueue.queue import JobSpec

    for start in range(0, n, 5000):
        Job.objects.enqueue_many([JobSpec("test.Noop", {}) for _ in range(min(5000, n - start))])
    _analyze()


def _plan() -> str:
    from django.db import connection

    from django_sqlqueue.dialects import get_dialect

    sql, params = get_dialect(connection).schedules_probe_sql()
    prefix = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with connection.cursor() as cursor:
        cursor.execute(prefix + sql, params)
        rows = cursor.fetchall()
    return " | ".join(str(r[-1]).strip() for r in rows)


def run_one(url: str, samples: int) -> dict:
    _setup(url)
    from django.db import connection, connections

    from django_sqlqueue import schedules
    from django_sqlqueue.models import Job, Schedule

    out: dict = {"vendor": connection.vendor}
    look = schedules.run_due
    for n, before in ((0, 0), (1000, 0), (10000, 1000)):
        if n:
            _fill_schedules(n - before, before)
        out[f"look_us_{n}_schedules"] = _median_us(look, samples)
    out["look_db_ms_per_worker_second"] = round(out["look_us_1000_schedules"] / 1000, 3)
    Schedule.objects.filter(name__startswith="bench-").exclude(name__in=[f"bench-{i}" for i in range(1000)]).delete()
    _analyze()

    # One due schedule among 1,000: the look claims it, enqueues its tick and moves it on.
    def one_due() -> None:
        Schedule.objects.filter(name="bench-0").update(next_run_at=schedules.db_clock("default") - timedelta(seconds=1))
        assert look().enqueued == 1

    out["look_us_enqueue_1_of_1000"] = _median_us(one_due, max(10, samples // 5))
    Job.objects.all().delete()

    Schedule.objects.all().delete()
    _fill_jobs(30000)
    claim = lambda: Job.objects.claim("bench", 10)  # noqa: E731  (takes 10 of the 30,000 claimable jobs)
    stop = threading.Event()

    def looker() -> None:
        while not stop.is_set():
            schedules.run_due()
            time.sleep(0.01)
        connections.close_all()

    # Rounds alternate the three conditions, so drift (fsync latency, the other engineers' load on this
    # machine) spreads over all of them instead of biasing one.
    timings: dict[str, list[float]] = {"0": [], "1000": [], "1000+looks": []}
    per_round = max(10, samples // 6)
    for _ in range(3):
        timings["0"].append(_median_us(claim, per_round))
        _fill_schedules(1000)
        timings["1000"].append(_median_us(claim, per_round))
        thread = threading.Thread(target=looker)
        thread.start()
        try:
            timings["1000+looks"].append(_median_us(claim, per_round))
        finally:
            stop.set()
            thread.join()
            stop.clear()
        Schedule.objects.all().delete()
    out["job_claim_us_0_schedules"] = statistics.median(timings["0"])
    out["job_claim_us_1000_schedules"] = statistics.median(timings["1000"])
    out["job_claim_us_1000_schedules_looks_100_per_s"] = statistics.median(timings["1000+looks"])
    out["claim_ratio_1000_vs_0_schedules"] = round(
        out["job_claim_us_1000_schedules"] / out["job_claim_us_0_schedules"], 2)
    out["look_plan"] = _plan()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--inner-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner_url:
        print(json.dumps(run_one(args.inner_url, args.samples)))
        return 0
    from tests.pgcluster import PgCluster

    results = []
    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        cluster = None
        with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-") as tmp:
            if db == "postgres":
                cluster = PgCluster(fsync=True).start()
                url = cluster.url
            else:
                url = f"sqlite:///{tmp}/bench.sqlite3"
            try:
                out = subprocess.run([sys.executable, __file__, "--inner-url", url, "--samples", str(args.samples)],
                                     capture_output=True, text=True, cwd=ROOT)
            finally:
                if cluster is not None:
                    cluster.destroy()
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                raise SystemExit(f"{db} run failed")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    keys = [k for k in results[0] if k not in ("vendor", "look_plan")]
    print(f"{'metric':46}" + "".join(f"{r['vendor']:>14}" for r in results))
    for key in keys:
        print(f"{key:46}" + "".join(f"{r[key]:>14}" for r in results))
    for r in results:
        print(f"plan of the look ({r['vendor']}): {r['look_plan']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
