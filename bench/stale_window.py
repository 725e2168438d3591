"""The stale window: how long a handler paused past its lease runs on after it resumes.

    python bench/stale_window.py                    # SQLite and PostgreSQL, 5 rounds per kind
    python bench/stale_window.py --db sqlite --n 3

A worker's whole process group is paused (SIGSTOP: a VM pause, a container freeze) while its one slot
runs ``test.Ticker`` (a line with the wall time every 20 ms). The pause outlasts the dead-after time
(2 s here, ``SQLQUEUE_TEST_DEAD_AFTER``), a second worker takes the job over and starts it, and then the
first is resumed (SIGCONT): every thread of it wakes at once, the stale handler's included. Printed:
from the resume to the stale handler's last line (killed by its supervisor, or stopped by itself), for
a handler that checks ``job.should_stop()`` every tick ("cooperative") and one that never does
("deaf"). Whatever it does in that window is refused at the end by the job's token; the docs
(docs/worker.md, "Side effects that must not repeat") say what a handler does about its side effects.
Not run in CI: it prints numbers for the docs. Same machine, one wall clock for both processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from throwaway import parser, run_children, setup_child, start_worker, wait

KINDS = {"cooperative (should_stop)": True, "deaf": False}
FAST = {"SQLQUEUE_TEST_DEAD_AFTER": "2", "SQLQUEUE_TEST_HEARTBEAT": "0.2"}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--n", type=int, default=5, help="rounds per kind of handler (default 5)")
    args = p.parse_args()
    if args.child:
        return child(args)
    print(f"resume -> the stale handler's last line, ms; {args.n} rounds per row; cpu count {os.cpu_count()}")
    print(f"{'db':9} {'handler':27} {'min':>6} {'p50':>6} {'max':>6}  all")
    return run_children(__file__, args.db, "sqlqueue-bench-stale-", ["--n", str(args.n)], FAST)


def lines(path: Path) -> list[tuple[int, float, str, int]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, when, event, attempt = line.split()
        out.append((int(pid), float(when), event, int(attempt)))
    return out


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def child(args: argparse.Namespace) -> int:
    setup_child()
    from django_sqlqueue.models import Job

    tmp = Path(os.environ["BENCH_TMP"])
    for label, cooperative in KINDS.items():
        took = []
        for i in range(args.n):
            path = tmp / f"ticks-{int(cooperative)}-{i}.log"
            job = Job.objects.enqueue("test.Ticker", {"ticks": str(path), "seconds": 20, "cooperative": cooperative})
            first = start_worker(f"stale-a{i}{int(cooperative)}", "--concurrency", "1")
            other = None
            try:
                wait(lambda path=path: any(e == "start" for *_x, e, _a in lines(path)), 60, 0.02)
                stale_pid = lines(path)[0][0]
                os.killpg(first.pid, signal.SIGSTOP)
                time.sleep(3.0)  # past the dead-after time (2 s): the job may be taken over
                other = start_worker(f"stale-b{i}{int(cooperative)}", "--concurrency", "1")
                wait(lambda path=path, stale_pid=stale_pid: any(p != stale_pid and e == "start"
                                                                for p, _w, e, _a in lines(path)), 60, 0.02)
                resumed = time.time()
                os.killpg(first.pid, signal.SIGCONT)
                time.sleep(3.0)
                stale = [w for p, w, _e, _a in lines(path) if p == stale_pid and w >= resumed]
                took.append(((max(stale) - resumed) * 1000) if stale else 0.0)
            finally:
                for proc in (first, other):
                    if proc is not None:
                        stop(proc)
                Job.objects.filter(pk=job.pk).delete()
        print(f"{args.child:9} {label:27} {min(took):6.1f} {statistics.median(took):6.1f} {max(took):6.1f}  "
              + " ".join(f"{t:.1f}" for t in took), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
