"""Worker throughput: N no-op jobs drained by ``run_queue_worker --burst``; prints jobs/s and peak RSS.

    python bench/worker.py                       # 20,000 jobs; SQLite and PostgreSQL; concurrency 1,2,4; batch 1,50
    python bench/worker.py --jobs 2000 --db sqlite --concurrency 1 --batch 50
    python bench/worker.py --profile-only        # just the profile (claim / handler dispatch / finish)

SQLite runs on a file in a temporary directory; PostgreSQL on a throwaway local cluster
(tests/pgcluster.py, fsync off). Each measurement: delete every job, enqueue N ``test.Noop`` jobs,
then time the worker process from start to exit (so interpreter and Django start-up, about a second
for the supervisor and its slots, is included in "wall jobs/s"; "worker jobs/s" is the worker's own
summary line). Peak RSS is VmHWM of each process (supervisor and slots) read from /proc while it runs.

The profile runs one slot in-process under cProfile and splits its time into the claim
(``JobManager.claim``), handler dispatch (``runner.run``: context, handler call, JSON check) and
the finish (``Worker._record``: complete + history row + signals), the rest being loop overhead.
Not run in CI: it prints numbers for the closing notes of a change.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from throwaway import REPO, parser, run_children, setup_child


# ----- parent: one child process per database ---------------------------------------------------------
def main() -> int:
    p = parser(__doc__)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", default="1,2,4", help="comma-separated list (default 1,2,4)")
    p.add_argument("--batch", default="1,50", help="comma-separated list (default 1,50)")
    p.add_argument("--profile-only", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    args = p.parse_args()
    if args.child:
        return child(args)
    print(f"{args.jobs} no-op jobs per run; cpu count {os.cpu_count()}")
    print(f"{'db':9} {'conc':>4} {'batch':>5} {'wall s':>7} {'wall jobs/s':>11} {'worker jobs/s':>13}  peak RSS MiB "
          f"(supervisor; slots; resource tracker)")
    cmd = ["--jobs", str(args.jobs), "--concurrency", args.concurrency, "--batch", args.batch]
    cmd += ["--profile-only"] if args.profile_only else []
    cmd += ["--no-profile"] if args.no_profile else []
    return run_children(__file__, args.db, "sqlqueue-bench-", cmd)


# ----- child: Django set up against one database -------------------------------------------------------
def child(args: argparse.Namespace) -> int:
    setup_child()
    db = args.child
    if not args.profile_only:
        for conc in [int(c) for c in args.concurrency.split(",")]:
            for batch in [int(b) for b in args.batch.split(",")]:
                measure(db, args.jobs, conc, batch)
    if not args.no_profile:
        for batch in [int(b) for b in args.batch.split(",")]:
            profile(db, args.jobs, batch)
    return 0


def fill(n: int) -> None:
    from django.db import connection

    from django_sqlqueue.models import Job, JobAttempt, Worker
    from django_sqlqueue.queue import JobSpec

    JobAttempt.objects.all().delete()
    Job.objects.all().delete()
    Worker.objects.all().delete()
    for start in range(0, n, 1000):
        Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(min(1000, n - start))])
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    connection.close()


def measure(db: str, n: int, conc: int, batch: int) -> None:
    from django_sqlqueue.models import Job

    fill(n)
    cmd = [sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--burst", "--no-progress",
           "--log-level", "WARNING", "--concurrency", str(conc), "--batch", str(batch)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    trackers: set[int] = set()  # multiprocessing's resource tracker, started with the spawned slots
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            peaks[pid] = max(peaks.get(pid, 0), _hwm_kib(pid))
            if pid not in trackers and "resource_tracker" in _cmdline(pid):
                trackers.add(pid)
        time.sleep(0.05)
    wall = time.monotonic() - started
    out = proc.stdout.read() if proc.stdout else ""
    done = Job.objects.filter(status_id=5).count()
    summary = dict(kv.split("=") for kv in out.split() if "=" in kv)
    sup = peaks.pop(proc.pid, 0)
    tracker = {pid: v for pid, v in peaks.items() if pid in trackers}
    slots = sorted((v for pid, v in peaks.items() if v and pid not in tracker), reverse=True)
    note = "" if done == n and proc.returncode == 0 else f"  !! completed {done}/{n}, exit {proc.returncode}"
    print(f"{db:9} {conc:>4} {batch:>5} {wall:7.1f} {n / wall:11.0f} {float(summary.get('jobs_per_s', 0)):13.0f}  "
          f"{sup / 1024:.0f}; {', '.join(f'{s / 1024:.0f}' for s in slots)}"
          f"{'; tracker ' + ', '.join(f'{v / 1024:.0f}' for v in tracker.values()) if tracker else ''}{note}",
          flush=True)


def _tree(root: int) -> list[int]:
    pids = [root]
    try:
        with open(f"/proc/{root}/task/{root}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def profile(db: str, n: int, batch: int) -> None:
    import cProfile
    import pstats

    from django_sqlqueue.worker.loop import Worker, WorkerConfig

    n = min(n, 5000)
    fill(n)
    prof = cProfile.Profile()
    worker = Worker(WorkerConfig(name="profile", burst=True, batch=batch))
    started = time.monotonic()
    prof.enable()
    worker.run()
    prof.disable()
    wall = time.monotonic() - started
    stats = pstats.Stats(prof)
    # The worker's claim call (with the completions it carries), the handler's run, the recording.
    parts = {"claim": ("worker/loop.py", "claim"), "handler dispatch": ("worker/runner.py", "run"),
             "finish": ("worker/loop.py", "_record")}
    total = sum(v[3] for k, v in stats.stats.items() if k[2] == "_loop" and k[0].endswith("worker/loop.py"))  # type: ignore[attr-defined]
    shares = {}
    for label, (file, func) in parts.items():
        shares[label] = sum(v[3] for k, v in stats.stats.items()  # type: ignore[attr-defined]
                            if k[0].endswith(file) and k[2] == func)
    shares["other (loop, signals, bookkeeping)"] = max(0.0, total - sum(shares.values()))
    print(f"\nprofile: {db}, 1 slot in-process, batch {batch}, {n} jobs, {n / wall:.0f} jobs/s under cProfile")
    for label, seconds in shares.items():
        print(f"  {label:36} {seconds:6.2f} s  {100 * seconds / total if total else 0:5.1f}%  "
              f"{1e6 * seconds / n:7.0f} us/job")
    top = sorted(((v[2], k) for k, v in stats.stats.items()), reverse=True)[:8]  # type: ignore[attr-defined]
    print("  top own time: " + json.dumps([f"{Path(k[0]).name}:{k[2]} {t:.2f}s" for t, k in top]))


if __name__ == "__main__":
    sys.exit(main())
