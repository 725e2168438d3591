"""Bulk enqueue (``Job.objects.enqueue_many``) before and after, side by side in one run (issue 30, item 4).

Usage (the bench virtualenv, see bench/compare.py)::

    mkdir /tmp/base && git archive <commit> django_sqlqueue | tar -x -C /tmp/base
    python bench/bulk.py --db sqlite,postgres --baseline /tmp/base            # 100,000 jobs, 3 rounds
    python bench/bulk.py --url "$(python -m tests.babelfish start benchbulk)" --label Babelfish \\
        --baseline /tmp/base                                                 # over TDS (NOT SQL Server)

Each measurement is its own process (the code under test first on ``PYTHONPATH``, as compare.py does)
against one database migrated once: it empties the job table, enqueues one job (imports, type rows,
connection), then times ``--jobs`` no-op jobs enqueued in calls of ``--call`` specs (what an app
does: bulk calls of a bounded size; compare.py's ``--targets`` does the same). The trees alternate
within each round and the order rotates from round to round, so both see the same machine load;
the median and the minimum of the rounds are printed, with the load average. ``--floor`` (PostgreSQL)
adds the server's share alone: the same rows as pre-built COPY text, no client work at all, the bound
of any client-side change (the job table's indexes and foreign-key checks are most of it). PostgreSQL is a
throwaway cluster with fsync and synchronous_commit on; SQLite a WAL file with synchronous=NORMAL
(the test project's options).
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
sys.path.append(str(ROOT))


#: The pseudo-tree of ``--floor``: the server's share alone (see :func:`floor_copy`).
FLOOR = "floor"


def inner(args: argparse.Namespace) -> dict:
    import django

    django.setup()
    from django.db import connection

    import django_sqlqueue
    from django_sqlqueue.models import Job
    from django_sqlqueue.queue import JobSpec

    qn = connection.ops.quote_name
    with connection.cursor() as cursor:  # a bench's own clean-up: every measurement starts empty
        for model in ("JobAttempt", "JobDependency", "Job"):
            table = qn(Job._meta.apps.get_model("django_sqlqueue", model)._meta.db_table)
            cursor.execute(f"TRUNCATE {table} CASCADE" if connection.vendor == "postgresql" else f"DELETE FROM {table}")
    Job.objects.enqueue("test.Noop")
    started = time.perf_counter()
    for start in range(0, args.jobs, args.call):
        if args.floor:
            floor_copy(min(args.call, args.jobs - start))
        else:
            Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(min(args.call, args.jobs - start))])
    seconds = time.perf_counter() - started
    return {"jobs": args.jobs, "seconds": seconds, "per_s": args.jobs / seconds,
            "code": str(Path(django_sqlqueue.__file__).parent)}


def floor_copy(n: int) -> None:
    """The server's share alone (PostgreSQL): the same rows as a no-op bulk call, ids drawn as one
    array and sent with ONE COPY of pre-built text, then committed; no validation, no Job objects. What
    the table's indexes and foreign key checks cost the server is the bound of any client path."""
    from django.db import connection, transaction

    from django_sqlqueue import jobtypes
    from django_sqlqueue.models import Job

    type_id = jobtypes.get_type("test.Noop", using="default").id
    qn = connection.ops.quote_name
    cols = ["id", "queue", "type_id", "status_id", "step", "priority", "attempt_num", "max_attempts", "payload",
            "error", "enqueued_at", "scheduled_for", "version", "updated_at", "worker", "trace_context",
            "concurrency_key", "limited", "dedupe_key"]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp(), (SELECT array_agg(nextval(pg_get_serial_sequence(%s, %s))) "
                       "FROM generate_series(1, %s))", [Job._meta.db_table, "id", n])
        now, ids = cursor.fetchone()
        ts = now.isoformat()
        data = "".join(f"{i}\tdefault\t{type_id}\t1\t\t0\t0\t\\N\t{{}}\t\t{ts}\t{ts}\t1\t{ts}\t\t\\N\t\tf\t\\N\n"
                       for i in sorted(ids))
        with cursor.cursor.copy(f"COPY {qn(Job._meta.db_table)} ({', '.join(qn(c) for c in cols)}) FROM STDIN") as copy:
            copy.write(data)


def _env(url: str, tree: str) -> dict[str, str]:
    from bench.compare import _site_dir

    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "bench-bulk-pycache"))
    env.update(PYTHONPATH=f"{_site_dir()}:{tree}:{ROOT}" if tree != str(ROOT) else f"{_site_dir()}:{ROOT}",
               DJANGO_SETTINGS_MODULE="testproject.settings", SQLQUEUE_DATABASE_URL=url)
    if url.startswith("mssql://"):
        from tests.babelfish import ENV

        env.update(ENV)
    return env


def measure(url: str, tree: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", "--jobs", str(args.jobs), "--call", str(args.call)]
    if tree == FLOOR:
        cmd.append("--floor")
        tree = str(ROOT)
    out = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=_env(url, tree), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"measurement failed ({tree}):\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(label: str, url: str, trees: dict[str, str], args: argparse.Namespace) -> list[str]:
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=_env(url, str(ROOT)), check=True)
    names = list(trees)
    rates: dict[str, list[float]] = {n: [] for n in names}
    loads = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            loads.append(os.getloadavg()[0])
            got = measure(url, trees[name], args)
            rates[name].append(got["per_s"])
            print(f"  {label} round {r + 1} {name}: {got['per_s']:,.0f} jobs/s ({got['code']})", file=sys.stderr)
    lines = []
    for name in names:
        v = sorted(rates[name])
        lines.append(f"{label:10} {name:8} bulk enqueue of {args.jobs:,} jobs (calls of {args.call:,}): median "
                     f"{statistics.median(v):,.0f} jobs/s, min {v[0]:,.0f}, max {v[-1]:,.0f} ({len(v)} rounds)")
    if "before" in rates:
        ratios = sorted(a / b for a, b in zip(rates["after"], rates["before"], strict=True))
        lines.append(f"{label:10} after / before per round: median {statistics.median(ratios):.2f}x "
                     f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}x); load average during the run "
                     f"{min(loads):.1f}-{max(loads):.1f}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", default="postgres", help="sqlite, postgres or both, comma-separated (default postgres)")
    p.add_argument("--url", help="a database URL to measure instead (e.g. Babelfish's mssql://...)")
    p.add_argument("--label", default="", help="the name printed for --url's database")
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--call", type=int, default=20_000, help="specs per enqueue_many call (default 20,000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", metavar="TREE", help="also measure django_sqlqueue from this tree (before)")
    p.add_argument("--floor", action="store_true",
                   help="PostgreSQL: also time the server's share alone (pre-built COPY text, no client work)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        print(json.dumps(inner(args)))
        return 0
    trees = {"after": str(ROOT)}
    if args.baseline:
        trees = {"before": str(Path(args.baseline).resolve()), **trees}
    lines = []
    if args.url:
        lines += run(args.label or args.url.split(":")[0], args.url, trees, args)
    else:
        for kind in [k.strip() for k in args.db.split(",") if k.strip()]:
            if kind == "sqlite":
                with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp:
                    lines += run("SQLite", f"sqlite:///{tmp}/bulk.sqlite3", trees, args)
            elif kind == "postgres":
                from tests.pgcluster import PgCluster

                with PgCluster(fsync=True) as pg:
                    lines += run("PostgreSQL", pg.url, {**trees, **({"floor": FLOOR} if args.floor else {})}, args)
            else:
                raise SystemExit(f"unknown --db {kind!r}")
    print("\n".join(lines))
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
