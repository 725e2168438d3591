"""Cancel latency: from ``Job.objects.cancel()`` on a running job to the job being Cancelled.

    python bench/cancel.py                      # SQLite and PostgreSQL, 8 cancels per kind
    python bench/cancel.py --db sqlite --n 4

Default settings (CANCEL_CHECK_SECONDS = 1, CANCEL_GRACE_SECONDS = 2), one ``run_queue_worker`` with
one slot. Two kinds of handler, each running 30 s unless cancelled:

- cooperative (``test.CancelAware``): checks ``job.cancelled`` every 50 ms and stops;
- deaf (``test.Sleep``): ignores it, so its slot process is killed after the grace period.

Each cancel is sent at a random moment 1.2-2.7 s into the run (so the slot's 1-s looks fall anywhere
relative to it); the time is measured in this process, from just before the call to the first poll
(every 10 ms) that reads the job Cancelled. SQLite runs on a file in a temporary directory, PostgreSQL
on a throwaway local cluster (tests/pgcluster.py). Not run in CI: it prints numbers for the docs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throwaway import parser, run_children, setup_child, start_worker, wait

KINDS = {"cooperative": "test.CancelAware", "deaf (killed after grace)": "test.Sleep"}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--n", type=int, default=8, help="cancels per kind of handler (default 8)")
    args = p.parse_args()
    if args.child:
        return child(args)
    print(f"cancel -> Cancelled, seconds; {args.n} cancels per row; default settings; cpu count {os.cpu_count()}")
    print(f"{'db':9} {'handler':27} {'min':>5} {'p50':>5} {'max':>5}  all")
    return run_children(__file__, args.db, "sqlqueue-bench-cancel-", ["--n", str(args.n)])


def child(args: argparse.Namespace) -> int:
    setup_child()
    from django_sqlqueue.models import Job
    from django_sqlqueue.states import Status

    log = Path(os.environ["BENCH_TMP"]) / "jobs.log"
    log.touch()
    worker = start_worker("bench-cancel")
    try:
        for label, type_name in KINDS.items():
            took = []
            for _ in range(args.n):
                job = Job.objects.enqueue(type_name, {"seconds": 30, "log": str(log)})
                wait(lambda job=job: f"{job.pk} 1 start" in log.read_text(), 60, 0.05)
                time.sleep(random.uniform(1.2, 2.7))
                started = time.monotonic()
                Job.objects.cancel(job.pk, by="bench", reason="latency")
                wait(lambda job=job: Job.objects.get(pk=job.pk).status_id == Status.CANCELLED, 30, 0.01)
                took.append(time.monotonic() - started)
            print(f"{args.child:9} {label:27} {min(took):5.2f} {statistics.median(took):5.2f} {max(took):5.2f}  "
                  + " ".join(f"{t:.2f}" for t in took), flush=True)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
