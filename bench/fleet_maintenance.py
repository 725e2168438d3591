"""The maintenance a fleet of idle workers costs one PostgreSQL, before and after the maintenance lease.

One throwaway cluster (tests/pgcluster.py, with pg_stat_statements) holds a backlog: ``--finished``
Completed jobs and ``--waiting`` Pending jobs scheduled a day ahead (a backlog no idle worker may take).
For each code version (``--before``: a git ref, checked out to a temporary directory with ``git archive``;
"after": this tree) and each fleet size W (``--workers``, e.g. ``1,40``), W ``run_queue_worker`` processes
with distinct names and ``--slots`` slots each are started, left to settle, then pg_stat_statements is
reset and read again ``--window`` seconds later. Each statement is sorted by its text into maintenance
(lease, reap, heal, backstop, schedule look, retention), sweep (each host's look for its dead workers),
heartbeat, claim/poll, LISTEN and other; printed per minute for the whole fleet: calls, execution time
and buffers touched (shared hits + reads: the work, which grows with the backlog when a statement walks
it).

    .venv/bin/python bench/fleet_maintenance.py --workers 1,40 --slots 2            # ~15 min
    .venv/bin/python bench/fleet_maintenance.py --workers 1,4 --finished 100000 --waiting 10000 --window 40

The functions (``fill``, ``start_fleet``, ``measure``, ``classify``) are meant to be called from the
fleet benchmark too (bench/fleet.py).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.pgcluster import PgCluster  # noqa: E402

#: (class, pattern on pg_stat_statements' normalised text: every literal is a $n there), first match wins.
CLASSES: list[tuple[str, re.Pattern[str]]] = [
    ("maintenance:lease", re.compile(r"maintenancelease")),
    # The fleet's look (PostgreSQL), which also stamps the rows of idle workers (session liveness)
    ("maintenance:look", re.compile(r"^\s*WITH RECURSIVE")),
    ("maintenance:schedules", re.compile(r"django_sqlqueue_schedule")),
    ("slots:claim", re.compile(r"^\s*WITH due AS|^\s*DECLARE")),
    ("maintenance:heal", re.compile(r'SET "limited"|limitpermit.*DISTINCT|jobtype".*updated_at" >=', re.S)),
    ("maintenance:reap", re.compile(r'"status_id" = \$\d+ AND "lease_expires_at" < (?:now|statement_timestamp)\(\) AND "attempt_num" >=')),
    ("maintenance:backstop", re.compile(r"jobdependency|django_sqlqueue_batch")),
    ("maintenance:retention", re.compile(r'ORDER BY "django_sqlqueue_job"."finished_at"|^\s*DELETE', re.S)),
    ("sweep", re.compile(r'django_sqlqueue_worker".*"host" =', re.S)),
    ("heartbeat", re.compile(r'UPDATE "django_sqlqueue_worker"|SET "lease_expires_at"')),
    ("listen", re.compile(r"^\s*(LISTEN|UNLISTEN|SELECT pg_notify)", re.I)),
    ("slots:types", re.compile(r"django_sqlqueue_jobtype")),
    ("slots:other", re.compile(r"django_sqlqueue_job")),
]


def classify(query: str) -> str:
    for name, pattern in CLASSES:
        if pattern.search(query):
            return name
    return "other"


def psql(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def fill(url: str, finished: int, waiting: int) -> None:
    """``finished`` Completed jobs (finished over the last day) and ``waiting`` Pending jobs due tomorrow."""
    psql(url, "INSERT INTO django_sqlqueue_jobtype (name, description, paused, code_options, is_task, rate_limit, "
              "created_at, updated_at) VALUES ('bench.Idle', '', false, '{}', false, '', now(), now()) "
              "ON CONFLICT (name) DO NOTHING")
    [(type_id,)] = psql(url, "SELECT id FROM django_sqlqueue_jobtype WHERE name = 'bench.Idle'")
    columns = ("queue, type_id, status_id, step, priority, attempt_num, payload, error, enqueued_at, scheduled_for, "
               "started_at, finished_at, duration_ms, version, updated_at, worker, incarnation, concurrency_key, limited")
    step = 200_000
    for start in range(0, finished, step):
        n = min(step, finished - start)
        psql(url, f"INSERT INTO django_sqlqueue_job ({columns}) SELECT 'default', %s, 5, '', 0, 1, '{{}}', '', "
                  f"now() - interval '1 day', now() - interval '1 day', now() - (g * interval '80 ms'), "
                  f"now() - (g * interval '80 ms'), 5, 3, now(), 'bench', '', '', false "
                  f"FROM generate_series(1, {n}) g", (type_id,))
    if waiting:
        psql(url, f"INSERT INTO django_sqlqueue_job ({columns}) SELECT 'default', %s, 1, '', 0, 0, '{{}}', '', "
                  f"now(), now() + interval '1 day', NULL, NULL, NULL, 1, now(), '', '', '', false "
                  f"FROM generate_series(1, {waiting}) g", (type_id,))
    psql(url, "VACUUM ANALYZE")


def checkout(ref: str) -> Path:
    """``ref`` of this repository, extracted to a temporary directory (the "before" code)."""
    target = Path(tempfile.mkdtemp(prefix="fleet-before-"))
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO, check=True, capture_output=True).stdout
    tar_path = target / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(target, filter="data")
    tar_path.unlink()
    return target


def start_fleet(code: Path, url: str, workers: int, slots: int, label: str, extra_env: dict | None = None
                ) -> list[subprocess.Popen]:
    """``workers`` run_queue_worker processes of the code at ``code``, named ``<label>-<i>``, started a
    little apart (each spawns its slots' interpreters: a burst of CPU)."""
    env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "SQLQUEUE_LOG_LEVEL": "WARNING", "PYTHONPATH": str(code), **(extra_env or {})}
    procs = []
    for i in range(workers):
        procs.append(subprocess.Popen(
            [sys.executable, str(code / "manage.py"), "run_queue_worker", "--no-progress", "--worker-name",
             f"{label}-{i}", "--concurrency", str(slots)],
            cwd=code, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
        time.sleep(0.3)
    return procs


def stop_fleet(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def live_workers(url: str, label: str) -> int:
    [(n,)] = psql(url, "SELECT count(*) FROM django_sqlqueue_worker WHERE name LIKE %s AND stopped_at IS NULL "
                       "AND last_heartbeat > now() - interval '30 seconds'", (f"{label}-%",))
    return n


def measure(url: str, seconds: float) -> dict[str, dict[str, float]]:
    """Per class, per minute over ``seconds``: calls, ms of execution, buffers touched (hit + read)."""
    psql(url, "SELECT pg_stat_statements_reset()")
    time.sleep(seconds)
    rows = psql(url, "SELECT query, calls, total_exec_time, shared_blks_hit + shared_blks_read FROM pg_stat_statements "
                     "WHERE query NOT LIKE '%%pg_stat_statements%%'")
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "ms": 0.0, "buffers": 0.0})
    per_minute = 60.0 / seconds
    if os.environ.get("BENCH_VERBOSE"):
        for query, calls, ms, buffers in sorted(rows, key=lambda r: -r[1])[:25]:
            print(f"    {classify(query):22} {calls:6d} {ms:9.1f}ms {buffers:8d}  {' '.join(query.split())[:150]}")
    for query, calls, ms, buffers in rows:
        row = out[classify(query)]
        row["calls"] += calls * per_minute
        row["ms"] += ms * per_minute
        row["buffers"] += buffers * per_minute
    return dict(out)


def report(label: str, workers: int, slots: int, stats: dict[str, dict[str, float]]) -> dict[str, float]:
    maint = {k: v for k, v in stats.items() if k.startswith("maintenance")}
    total = sum(v["calls"] for v in stats.values())
    summary = {"maintenance_calls": sum(v["calls"] for v in maint.values()),
               "maintenance_ms": sum(v["ms"] for v in maint.values()),
               "maintenance_buffers": sum(v["buffers"] for v in maint.values()),
               "all_per_s": total / 60.0}
    print(f"\n== {label}: {workers} worker(s) x {slots} slots, per minute for the whole fleet")
    print(f"  {'class':24} {'calls/min':>10} {'ms/min':>10} {'buffers/min':>12}")
    for name in sorted(stats):
        v = stats[name]
        print(f"  {name:24} {v['calls']:10.1f} {v['ms']:10.1f} {v['buffers']:12.0f}")
    print(f"  {'MAINTENANCE (sum)':24} {summary['maintenance_calls']:10.1f} {summary['maintenance_ms']:10.1f} "
          f"{summary['maintenance_buffers']:12.0f}")
    print(f"  all statements: {summary['all_per_s']:.2f}/s")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,40", help="fleet sizes, comma-separated (default 1,40)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--window", type=float, default=90.0, help="seconds measured per run (>= 60: a reap period)")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after all workers are live")
    parser.add_argument("--before", default="3a0a1b9", help="git ref of the code before (default: main before the lease)")
    parser.add_argument("--only", choices=["before", "after"], default=None)
    args = parser.parse_args()
    sizes = [int(w) for w in args.workers.split(",")]
    versions = [("before", checkout(args.before)), ("after", REPO)]
    if args.only:
        versions = [v for v in versions if v[0] == args.only]
    with PgCluster() as pg:
        psql(pg.url, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        psql(pg.url, "ALTER SYSTEM SET max_connections = 600")
        pg.restart()
        psql(pg.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        env = {**os.environ, "SQLQUEUE_DATABASE_URL": pg.url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=REPO, env=env, check=True)
        started = time.monotonic()
        fill(pg.url, args.finished, args.waiting)
        print(f"filled: {args.finished} finished, {args.waiting} waiting jobs in {time.monotonic() - started:.0f} s")
        results = {}
        for label, code in versions:
            for w in sizes:
                name = f"{label}{w}"
                procs = start_fleet(code, pg.url, w, args.slots, name)
                try:
                    deadline = time.monotonic() + 120 + 3 * w
                    while live_workers(pg.url, name) < w * args.slots and time.monotonic() < deadline:
                        time.sleep(1)
                    print(f"\n{name}: {live_workers(pg.url, name)} of {w * args.slots} slots live")
                    time.sleep(args.settle)
                    results[(label, w)] = report(label, w, args.slots, measure(pg.url, args.window))
                finally:
                    stop_fleet(procs)
                psql(pg.url, "DELETE FROM django_sqlqueue_maintenancelease")
        print("\n== side by side (per minute, whole fleet)")
        print(f"  {'version':8} {'W':>4} {'maint calls':>12} {'maint ms':>10} {'maint buffers':>14} {'all stmts/s':>12}")
        for (label, w), s in results.items():
            print(f"  {label:8} {w:4d} {s['maintenance_calls']:12.1f} {s['maintenance_ms']:10.1f} "
                  f"{s['maintenance_buffers']:14.0f} {s['all_per_s']:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
