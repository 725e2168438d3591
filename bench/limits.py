"""Limits benchmark (docs/limits.md): what concurrency limits cost the claim, and a limited type's throughput.

Usage::

    python bench/limits.py                  # SQLite and a throwaway PostgreSQL, side by side
    python bench/limits.py --db postgres --backlog 100000

Prints, per database, the median time of one claim of 10 unlimited jobs (20,000 due) in four cases,
the samples interleaved so that every case sees the same machine noise:

- ``no_limits``: no type has a limit (the claim carries no limited branch);
- ``limits_idle``: a type has a limit, none of its jobs wait (the branch is there, finds nothing);
- ``backlog_behind``: ``--backlog`` jobs of a type limited to 2 wait, the limit saturated (2 running),
  with a lower priority than the unlimited jobs;
- ``backlog_ahead``: the same backlog with a HIGHER priority than the unlimited jobs (the due branch's
  index walk passes over them: the case a separate index would remove, see docs/limits.md);

then the throughput of claim + complete, batch 10, of the unlimited jobs with and without the
saturated backlog ahead, and of a limited type alone (limit 4, one claimer: one limited job per claim).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from claim import _bulk_fill, _reset, _setup  # noqa: E402


def _set_limit(name: str, limit: int | None) -> int:
    from django_sqlqueue import jobtypes
    from django_sqlqueue.models import JobType

    row, _ = JobType.objects.get_or_create(name=name)
    row.concurrency_limit = limit
    row.save()
    jobtypes.clear_cache()
    return row.id


def _priority(type_id: int, priority: int) -> None:
    """The jobs' priority; and their ``limited`` flag, as an enqueue would have set it (the bulk fill
    inserts rows server-side)."""
    from django_sqlqueue.models import Job

    Job.objects.filter(job_type_id=type_id).update(priority=priority, limited=True)


def _claim_ms(samples: int, worker: str) -> float:
    """Median ms of a claim of 10 unlimited jobs, each batch completed right after (not timed)."""
    from django_sqlqueue.models import Job

    times = []
    for i in range(samples):
        start = time.perf_counter()
        got = Job.objects.complete_and_claim((), f"{worker}/{i}", 10, reclaim=False)[1]
        times.append(time.perf_counter() - start)
        assert got and all(j.job_type.name == "Noop" for j in got), [j.job_type.name for j in got]
        Job.objects.complete_many([(j, None) for j in got])
    return statistics.median(times) * 1000


def _drain_per_s(n: int) -> float:
    from django_sqlqueue.models import Job

    done, start = 0, time.perf_counter()
    got = Job.objects.claim("drain/0", 10)
    while got and done < n:
        done += len(got)
        got = Job.objects.complete_and_claim([(j, None) for j in got], "drain/0", 10, reclaim=False)[1]
    return done / (time.perf_counter() - start)


def run_one(url: str, backlog: int, samples: int) -> dict:
    _setup(url)
    from django.db import connection

    from django_sqlqueue.models import Job, JobType
    from django_sqlqueue.queue import JobSpec

    noop = JobType.objects.get_or_create(name="Noop")[0].id
    export = _set_limit("Export", None)
    out: dict = {"vendor": connection.vendor}
    cases = {"no_limits": [], "limits_idle": [], "backlog_behind": [], "backlog_ahead": []}
    for _ in range(3):  # rounds, the cases interleaved
        _reset()
        _bulk_fill(20_000, noop)
        _set_limit("Export", None)
        cases["no_limits"].append(_claim_ms(samples, "none"))
        _set_limit("Export", 2)
        cases["limits_idle"].append(_claim_ms(samples, "idle"))
        _bulk_fill(backlog, export)
        _priority(export, -5)
        Job.objects.claim("holder", 10, types=["Export"])  # the limit saturated: 2 of 2 running
        Job.objects.claim("holder2", 10, types=["Export"])
        assert Job.objects.filter(job_type_id=export, status_id=2).count() == 2
        cases["backlog_behind"].append(_claim_ms(samples, "behind"))
        _priority(export, 5)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        cases["backlog_ahead"].append(_claim_ms(samples, "ahead"))
    for name, values in cases.items():
        out[f"claim_ms_{name}"] = round(statistics.median(values), 3)
    # throughput of unlimited jobs, with and without the saturated backlog ahead
    _reset()
    _set_limit("Export", None)
    _bulk_fill(5000, noop)
    out["unlimited_drain_per_s_no_limits"] = round(_drain_per_s(5000), 1)
    _reset()
    _set_limit("Export", 2)
    _bulk_fill(5000, noop)
    _bulk_fill(backlog, export)
    _priority(export, 5)
    Job.objects.claim("holder", 10, types=["Export"])
    Job.objects.claim("holder2", 10, types=["Export"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    out["unlimited_drain_per_s_backlog_ahead"] = round(_drain_per_s(5000), 1)
    # a limited type alone: one limited job per claim
    _reset()
    _set_limit("Export", 4)
    Job.objects.enqueue_many(JobSpec("Export") for _ in range(2000))
    out["limited_drain_per_s_limit_4"] = round(_drain_per_s(2000), 1)
    out["backlog"] = backlog
    _reset()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--inner-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner_url:
        print(json.dumps(run_one(args.inner_url, args.backlog, args.samples)))
        return 0
    from tests.pgcluster import PgCluster

    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        cluster = None
        with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-") as tmp:
            if db == "postgres":
                cluster = PgCluster(fsync=True).start()
                url = cluster.url
            else:
                url = f"sqlite:///{tmp}/bench.sqlite3"
            try:
                out = subprocess.run([sys.executable, __file__, "--inner-url", url, "--backlog", str(args.backlog),
                                      "--samples", str(args.samples)], capture_output=True, text=True, cwd=ROOT)
            finally:
                if cluster is not None:
                    cluster.destroy()
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            raise SystemExit(f"{db} run failed")
        print(json.dumps(json.loads(out.stdout.strip().splitlines()[-1]), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
