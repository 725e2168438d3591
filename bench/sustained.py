"""Sustained volume with retention on: does the job table stay flat? (PostgreSQL and SQLite.)

A worker (``run_queue_worker --concurrency 2``, ``SQLQUEUE["RETENTION"] = {"Completed": "<age>"}``) drains
``test.Noop`` jobs that this process enqueues at a steady ``--rate`` (in batches every 100 ms) for
``--minutes``. Every ``--every`` seconds it samples: the job table's rows and size, the Pending backlog,
the claim's p99 (this process times claims of one job by a probe name between samples, then completes
them) and, on PostgreSQL, the job table's dead tuples (``n_dead_tup``). It prints the series, then each
series' slope over the run after the warm-up (the retention age, or the throughput rollup's lag of about
6 minutes if longer, plus a minute) and a verdict: FLAT when the
fitted change over the measured part is within 20 % of the series' mean (or tiny in absolute terms),
else GROWS or FALLS. Each sample also shows the enqueue rate this process achieved since the last one
(on a loaded machine it may fall short of ``--rate``, and the table with it).

    .venv/bin/python bench/sustained.py --db postgres --minutes 10
    .venv/bin/python bench/sustained.py --db sqlite --minutes 10 --rate 150 --retention 30s
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: How far behind the clock retention may delete (ops/rollup.py GRACE + worker/maintenance.py ROLLUP_SECONDS).
ROLLUP_LAG_SECONDS = 5 * 60 + 60

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (per unit of x)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def verdict(name: str, xs: list[float], ys: list[float], floor: float) -> str:
    """'flat' when the fitted change over the span is within 20 % of the mean (or below ``floor``)."""
    if len(xs) < 3:
        return f"{name}: too few samples"
    change = slope(xs, ys) * (xs[-1] - xs[0])
    mean = statistics.fmean(ys)
    bound = max(0.2 * abs(mean), floor)
    word = "FLAT" if abs(change) <= bound else ("GROWS" if change > 0 else "FALLS (the producer slowed down?)")
    return f"{name}: mean {mean:,.1f}, fitted change over the measured {xs[-1] - xs[0]:.0f} s {change:+,.1f} -> {word}"


def child(args: argparse.Namespace) -> int:
    """The measuring process (Django set up on the bench database)."""
    import django

    django.setup()
    from django.db import connection

    from django_sqlqueue.models import Job, JobType
    from django_sqlqueue.queue import JobSpec
    from django_sqlqueue.states import Status

    JobType.objects.get_or_create(name="test.Noop")
    table = Job._meta.db_table
    env = {**os.environ, "SQLQUEUE_TEST_RETENTION": json.dumps({"Completed": args.retention}),
           "SQLQUEUE_LOG_LEVEL": "WARNING"}
    worker = subprocess.Popen([sys.executable, "manage.py", "run_queue_worker", "--no-progress", "--worker-name",
                               "sustained", "--concurrency", str(args.slots), "--log-level", "WARNING"], cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    per_tick = max(1, round(args.rate / 10))
    samples: list[dict] = []
    claims: list[float] = []
    started = time.monotonic()
    next_sample = started + args.every
    next_probe = started + 0.25
    end = started + args.minutes * 60
    enqueued = last_enqueued = 0
    try:
        tick = started
        while time.monotonic() < end:
            Job.objects.enqueue_many([JobSpec("test.Noop", {"n": enqueued + i}) for i in range(per_tick)])
            enqueued += per_tick
            now = time.monotonic()
            if now >= next_probe:  # one timed claim of one job, by a probe name
                t0 = time.perf_counter()
                got = Job.objects.claim("sustained-probe", 1)
                claims.append((time.perf_counter() - t0) * 1000)
                for job in got:
                    Job.objects.complete(job)
                next_probe = now + 0.25
            if now >= next_sample:
                samples.append(sample(connection, table, Job, Status, now - started, claims, args))
                samples[-1]["rate"] = (enqueued - last_enqueued) / args.every
                last_enqueued = enqueued
                print(fmt(samples[-1]), flush=True)
                claims = []
                next_sample += args.every
            tick += 0.1
            time.sleep(max(0.0, tick - time.monotonic()))
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
    print(f"\nenqueued {enqueued} jobs in {args.minutes:g} min ({enqueued / (args.minutes * 60):.0f}/s)")
    # Retention deletes only jobs the throughput rollup has counted: those finished before its cursor,
    # 5 minutes (GRACE) behind the clock and moved about once a minute (ROLLUP_SECONDS).
    held = max(args.retention_seconds, ROLLUP_LAG_SECONDS)
    warm = held + 60
    kept = [s for s in samples if s["t"] >= warm]
    xs = [s["t"] for s in kept]
    print(f"measured part: from {warm:.0f} s (retention {args.retention}, or the throughput rollup's lag of "
          f"{ROLLUP_LAG_SECONDS:.0f} s if longer, plus a minute), {len(kept)} samples")
    print(verdict("job rows", xs, [s["rows"] for s in kept], 500))
    print(verdict("job table size (kB)", xs, [s["kb"] for s in kept], 256))
    print(verdict("pending backlog", xs, [s["pending"] for s in kept], 500))
    print(verdict("claim p99 (ms)", xs, [s["p99"] for s in kept], 5))
    if kept and "dead" in kept[0]:
        print(verdict("n_dead_tup", xs, [s["dead"] for s in kept], 5000))
    return 0


def sample(connection, table, Job, Status, t: float, claims: list[float], args) -> dict:  # noqa: ANN001
    out = {"t": t, "rows": Job.objects.count(), "pending": Job.objects.filter(status_id=Status.PENDING).count(),
           "p99": (statistics.quantiles(claims, n=100)[98] if len(claims) >= 2 else (claims[0] if claims else 0.0))}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_total_relation_size(%s), n_dead_tup FROM pg_stat_user_tables WHERE relname = %s",
                           [table, table])
            size, dead = cursor.fetchone()
            out.update(kb=size / 1024, dead=dead)
        else:
            cursor.execute("SELECT SUM(pgsize) FROM dbstat WHERE name = %s OR name LIKE 'sqlqueue_job_%%'", [table])
            out["kb"] = (cursor.fetchone()[0] or 0) / 1024
    return out


def fmt(s: dict) -> str:
    dead = f" dead={s['dead']:>7}" if "dead" in s else ""
    return (f"t={s['t']:6.0f}s enq={s.get('rate', 0):5.0f}/s rows={s['rows']:>8} pending={s['pending']:>7} size={s['kb']:>9.0f}kB "
            f"claim_p99={s['p99']:6.2f}ms{dead}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=200.0, help="jobs enqueued per second (default 200)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--retention", default="30s", help="retention of Completed jobs (default 30s)")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from django_sqlqueue.bounds import parse_age

    args.retention_seconds = parse_age(args.retention).total_seconds()
    if args.child:
        return child(args)
    print(f"sustained: {args.db}, {args.rate:g} jobs/s for {args.minutes:g} min, {args.slots} slots, "
          f"retention Completed {args.retention}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = None
        if args.db == "postgres":
            from tests.pgcluster import PgCluster

            cluster = PgCluster().start()
            url = cluster.url
        else:
            url = f"sqlite:///{tmp}/sustained.sqlite3"
        try:
            env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
            return subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child"], cwd=REPO, env=env).returncode
        finally:
            if cluster is not None:
                cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
