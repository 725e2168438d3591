"""Where a worker slot's time goes: cProfile of an in-process Worker draining no-op jobs.

    BENCH_DATABASE_URL=postgres://... PYTHONPATH=. DJANGO_SETTINGS_MODULE=bench.peers.settings \\
        python -m bench.peers.profile --jobs 3000 --batch 1 [--top 25]

Put another tree first on PYTHONPATH to profile an older django_sqlqueue the same way. Prints the
drain rate (under the profiler, so lower than without it) and the share of the wall time spent in:
claim (``Worker._claim``: the claim statement and, since batched recording, the completions
committed with it), handler dispatch (``runner.run``: context, handler call, JSON check), record
(``Worker._record`` and ``Recorder.add``: outcomes written one by one), commit (``commit()`` calls
inside those), database wait (psycopg waiting for the server, inside all of the above).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--batch", default="auto", help="'auto' (the default) or a fixed size")
    p.add_argument("--top", type=int, default=0, help="also print the N most expensive functions")
    args = p.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from django_sqlqueue.models import Job, JobAttempt
    from django_sqlqueue.queue import JobSpec
    from django_sqlqueue.worker.loop import Worker, WorkerConfig

    with connection.cursor() as c:
        for model in (JobAttempt, Job):
            c.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)}")
    Job.objects.enqueue_many([JobSpec("bench.Noop") for _ in range(args.jobs)])
    worker = Worker(WorkerConfig(name="profile", batch=None if args.batch == "auto" else int(args.batch), burst=True))
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    worker.run()
    prof.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(prof)
    done = Job.objects.filter(status_id=5).count()
    print(f"{connection.vendor} batch {args.batch}: {done} jobs in {wall:.2f} s = {done / wall:,.0f} jobs/s "
          f"(under cProfile)")

    def cum(file_part: str, func: str) -> float:
        return sum(v[3] for (f, _, name), v in stats.stats.items() if name == func and f.endswith(file_part))

    buckets = {
        "claim (+ completions in the same transaction)": cum("worker.py", "_claim"),
        "handler dispatch (runner.run)": cum("runner.py", "run"),
        "record, one outcome at a time": cum("worker.py", "_record") + cum("recorder.py", "add"),
        "commit() calls (inside claim and record)": cum("psycopg/connection.py", "commit"),
        "database wait (psycopg wait, all of the above)": cum("psycopg/connection.py", "wait"),
    }
    for name, seconds in buckets.items():
        print(f"  {name:50} {seconds:7.2f} s  {100 * seconds / wall:5.1f}%  {1e6 * seconds / max(done, 1):7.0f} us/job")
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
