"""Per-job cost of the Django Tasks path next to a native handler, side by side in one process.

    SQLQUEUE_DATABASE_URL=sqlite:////tmp/cost.sqlite3 python bench/tasks_cost.py --jobs 4000 --rounds 5
    SQLQUEUE_DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres python bench/tasks_cost.py

(a throwaway PostgreSQL: ``python -m tests.pgcluster --fsync`` prints its URL). Each round empties the
queue, enqueues ``--jobs`` no-op jobs of the test project's ``test.Noop`` handler and drains them with
an in-process burst worker (default options, no process start-up), then does the same with as many
``enqueue()`` calls of the test project's no-op ``@task`` (``--task tick``: one returning a short
string) and drains those. Prints the microseconds per job of each round (wall clock, and the process's
CPU time) and the median of the per-round ratios (task / native): the rounds interleave, so a noisy
machine slows both sides of a ratio alike. ``--quiet-tasks-log`` raises the ``django.tasks`` logger to
WARNING first (Django's own receivers of ``task_started`` / ``task_finished`` log at INFO). Not run in
CI.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quiet-tasks-log", action="store_true")
    parser.add_argument("--task", choices=("noop", "tick"), default="noop",
                        help="noop: returns None, like test.Noop (default); tick: returns a short string")
    args = parser.parse_args()
    if not os.environ.get("SQLQUEUE_DATABASE_URL"):
        parser.error("set SQLQUEUE_DATABASE_URL (sqlite:////path or postgres://...)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_sqlqueue.models import Job, JobAttempt
    from django_sqlqueue.queue import JobSpec
    from django_sqlqueue.worker.loop import Worker, WorkerConfig
    from testproject.testjobs import tasks as test_tasks

    call_command("migrate", verbosity=0)
    the_task = getattr(test_tasks, args.task)
    if args.quiet_tasks_log:
        logging.getLogger("django.tasks").setLevel(logging.WARNING)

    def empty() -> None:
        with connection.cursor() as cursor:
            for model in (JobAttempt, Job):
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(model._meta.db_table)}")

    def drain() -> tuple[float, float]:
        worker = Worker(WorkerConfig(name="tasks-cost", burst=True))
        wall, cpu = time.perf_counter(), time.process_time()
        worker.run()
        return ((time.perf_counter() - wall) / args.jobs * 1e6, (time.process_time() - cpu) / args.jobs * 1e6)

    per_job: dict[str, list[tuple[float, float]]] = {"native": [], "task": []}
    for _ in range(args.rounds):
        empty()
        Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(args.jobs)])
        per_job["native"].append(drain())
        empty()
        for _ in range(args.jobs):
            the_task.enqueue()
        per_job["task"].append(drain())
    print(f"{connection.vendor}, {args.jobs} jobs x {args.rounds} rounds, @task {args.task}"
          f"{', django.tasks logging at WARNING' if args.quiet_tasks_log else ''}")
    # Wall time is what a user waits; the worker process's CPU time (all its threads) is the per-job
    # work in this process alone, far less disturbed by other load on the machine (the database
    # server's own work is in it for SQLite only).
    for i, measure in enumerate(("wall", "cpu")):
        for name, values in per_job.items():
            these = [v[i] for v in values]
            print(f"  {name:6} {measure:4} us/job: {', '.join(f'{v:.0f}' for v in these)} "
                  f"(median {statistics.median(these):.0f})")
        ratios = [t[i] / n[i] for t, n in zip(per_job["task"], per_job["native"], strict=True)]
        print(f"  task / native, {measure}: median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
