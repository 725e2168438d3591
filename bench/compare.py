"""django-sqlqueue against the Django database queues, side by side, in one invocation.

Usage (in a virtualenv with the ``bench`` extra, kept apart from the test environment)::

    python -m venv /tmp/venv-bench && /tmp/venv-bench/bin/pip install -e ".[bench]"
    /tmp/venv-bench/bin/python bench/compare.py                       # everything (~20 min)
    /tmp/venv-bench/bin/python bench/compare.py --db postgres --slots 1 --jobs 5000 --latency-jobs 10

Every system runs on the same machine, against the same database server (one throwaway PostgreSQL
cluster with fsync=on and synchronous_commit=on; SQLite files in WAL mode with synchronous=NORMAL),
with the same Django settings (bench/peers/settings.py), in a fresh database cloned from one
migrated template for each measurement:

- ``django-sqlqueue``: ``run_queue_worker --burst --concurrency N`` (``--batch`` as given);
- ``django-tasks-db``: django-tasks' DatabaseBackend, N ``db_worker --batch`` processes, SQLite and
  PostgreSQL, ``--interval`` the smallest it accepts (0) unless told otherwise;
- ``procrastinate``: its Django integration, ``procrastinate worker --one-shot --concurrency N``
  (PostgreSQL only), LISTEN/NOTIFY on (its default) and the same poll interval; with N > 1 also as
  N one-slot processes (``procrastinate xN``), and the better of the two counts as the peer.

For each (database, slots, system): enqueue ``--jobs`` no-op jobs one per transaction (timed), drain
them (timed, launch to exit of every worker process), enqueue ``--jobs`` in bulk (timed: our
``enqueue_many``; procrastinate's ``batch_defer``; django-tasks has no bulk API, so its jobs are
enqueued in ONE transaction), drain again; then start the workers in forever mode, let them go idle,
enqueue ``--latency-jobs`` jobs one at a time at random gaps and record, in each job's handler, the
wall-clock time from just before its enqueue to the handler's start (p50/p99). Peak RSS of every
worker process is sampled from /proc.

Then, per database, one-per-transaction enqueue once more, interleaved: every system in ONE process
and database, ``--rounds`` rounds of ``--round-jobs`` enqueues each, back to back, the order rotating
(the table's enqueue column times each system in its own minutes, and a shared machine's load drifts
between them by more than the difference measured); the median of the per-round ratios is reported.

Then, per database, concurrent enqueue (``--concurrent 1,4,16``): each system in a fresh database with 1,
4 and 16 writer processes at once, one job per transaction each, ``--concurrent-rounds`` rounds with the
order rotating; the median rate per writer count, our ratio to the best peer per round, and each system's
scaling (16 writers over 1). ``--concurrent-only`` runs just that (with ``--baseline``, the older tree too).
The interleaved rounds always include our Tasks API enqueue (``task.enqueue()``), next to django-tasks-db's.

Prints the table with our ratio to the best peer in each (database, slots) group (higher is better
for us: throughput ours/peer, latency peer/ours), the durability settings in force, and writes the
raw numbers to ``bench/results/compare-<time>.json`` (git-ignored).

``--targets`` adds the issue's single-system targets: bulk enqueue of 100,000 jobs on PostgreSQL,
and the peak RSS of one slot draining 100,000 jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # tests.pgcluster, bench.peers (last: PYTHONPATH picks django_sqlqueue)
RESULTS = ROOT / "bench" / "results"
SETTINGS = "bench.peers.settings"
OURS = "django-sqlqueue"
#: Our Tasks-API system: the same no-op ``@task`` django-tasks-db runs (bench/peers/tasks.py), enqueued
#: with ``task.enqueue()`` through django_sqlqueue.tasks.SqlQueueBackend and drained by run_queue_worker.
OURS_TASK = "django-sqlqueue-task"
OURS_TASK_NAME = "django-sqlqueue @task"
TASKS_PEER = "django-tasks-db"
PEERS_ON = {"sqlite": ["django-tasks-db"], "postgres": ["django-tasks-db", "procrastinate"]}


# ====================================================================================================
# Process helpers (outer and inner)
# ====================================================================================================
#: sitecustomize for every benchmark process: drop setuptools' editable-install finders, which would
#: otherwise import the installed django_sqlqueue whatever PYTHONPATH says (``pip install -e``).
SITECUSTOMIZE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", "")).startswith("__editable__")]
"""


def _site_dir() -> str:
    """A directory holding that sitecustomize.py (made once per run, shared through the environment)."""
    path = os.environ.get("BENCH_SITE")
    if not path:
        path = tempfile.mkdtemp(prefix="bench-site-")
        Path(path, "sitecustomize.py").write_text(SITECUSTOMIZE)
        os.environ["BENCH_SITE"] = path
    return path


def _env(url: str, **extra: str) -> dict[str, str]:
    """Environment of every benchmark process; BENCH_CODE puts another django_sqlqueue tree first."""
    env = dict(os.environ)
    path = f"{env['BENCH_CODE']}:{ROOT}" if env.get("BENCH_CODE") else str(ROOT)
    if env.get("BENCH_SITE"):
        path = f"{env['BENCH_SITE']}:{path}"
    env.update(PYTHONPATH=path, DJANGO_SETTINGS_MODULE=SETTINGS, BENCH_DATABASE_URL=url,
               PYTHONUNBUFFERED="1", **extra)
    return env


def _manage(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


class RssSampler(threading.Thread):
    """Polls /proc for a set of root processes and their descendants; keeps each pid's peak RSS."""

    def __init__(self, roots: list[int], interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.interval = interval
        self.peak_kb: dict[int, int] = {}
        self._halt = threading.Event()

    @staticmethod
    def _children(pid: int) -> list[int]:
        out: list[int] = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
        return out

    def _sample(self) -> None:
        todo = list(self.roots)
        while todo:
            pid = todo.pop()
            todo.extend(self._children(pid))
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):  # the kernel's own peak RSS of the process
                            kb = int(line.split()[1])
                            self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), kb)
                            break
            except OSError:
                pass

    def run(self) -> None:
        while not self._halt.is_set():
            self._sample()
            self._halt.wait(self.interval)

    def stop(self) -> float:
        self._halt.set()
        self.join()
        return max(self.peak_kb.values(), default=0) / 1024.0


# ====================================================================================================
# Inner side: runs inside Django (one process per measurement, fresh database)
# ====================================================================================================
class System:
    name = ""

    def __init__(self, url: str, slots: int, args: argparse.Namespace, logdir: Path) -> None:
        self.url, self.slots, self.args, self.logdir = url, slots, args, logdir

    # enqueue ------------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """One enqueue before timing (imports, type rows, connection); drained with the rest."""
        self.enqueue_one()

    def enqueue_one(self) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, n: int) -> None:
        raise NotImplementedError

    def enqueue_latency(self, t: float) -> None:
        raise NotImplementedError

    def done_count(self) -> int:
        raise NotImplementedError

    # workers ------------------------------------------------------------------------------------
    def commands(self, burst: bool) -> list[list[str]]:
        raise NotImplementedError

    def start(self, burst: bool, tag: str, extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
        procs = []
        for i, cmd in enumerate(self.commands(burst)):
            log = open(self.logdir / f"{tag}-{i}.log", "wb")  # noqa: SIM115 (closed with the process)
            # cwd: not the repository, whose django_sqlqueue ``python -m`` would put first on sys.path
            procs.append(subprocess.Popen(cmd, cwd=self.logdir, env=_env(self.url, **(extra_env or {})), stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        return procs

    def drain(self, jobs: int, expected: int, tag: str) -> dict[str, float]:
        """Run the workers in burst mode until they exit; ``expected`` jobs must then be done in all."""
        start = time.perf_counter()
        procs = self.start(True, tag)
        sampler = RssSampler([p.pid for p in procs])
        sampler.start()
        codes = [p.wait(timeout=3600) for p in procs]
        seconds = time.perf_counter() - start
        rss = sampler.stop()
        done = self.done_count()
        if any(codes) or done < expected:
            raise SystemExit(f"{self.name}: drain {tag} exit codes {codes}, {done}/{expected} done; see {self.logdir}")
        return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds if seconds else 0.0,
                "peak_rss_mb": rss}

    def latency(self, n: int, settle: float, gap: tuple[float, float]) -> dict[str, Any]:
        path = self.logdir / f"latency-{self.name}-{self.slots}.txt"
        path.unlink(missing_ok=True)
        procs = self.start(False, "latency", {"BENCH_LATENCY_FILE": str(path)})
        rng = random.Random(42)
        try:
            time.sleep(settle)  # let every worker go idle (poll backoff at its cap)
            for _ in range(n):
                self.enqueue_latency(time.time())
                time.sleep(rng.uniform(*gap))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _lines(path) < n:
                time.sleep(0.05)
        finally:
            for p in procs:
                _terminate(p)
        values = sorted(float(x) * 1000 for x in path.read_text().split()) if path.exists() else []
        if len(values) < n:
            raise SystemExit(f"{self.name}: only {len(values)}/{n} latency jobs ran; see {self.logdir}")
        return {"samples": len(values), "p50_ms": _pct(values, 50), "p99_ms": _pct(values, 99),
                "max_ms": values[-1], "mean_ms": statistics.fmean(values)}


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def _pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    k = max(0, min(len(values) - 1, int(round(p / 100 * len(values) + 0.5)) - 1))
    return values[k]


def _terminate(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


class Ours(System):
    name = OURS

    def __init__(self, *a: Any, batch: str = "auto", **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.batch = batch
        if batch != "auto":
            self.name = f"{OURS} (batch {batch})"
        from django_sqlqueue.models import Job
        from django_sqlqueue.queue import JobSpec

        self.Job, self.JobSpec = Job, JobSpec

    def enqueue_one(self) -> None:
        self.Job.objects.enqueue("bench.Noop")

    def enqueue_bulk(self, n: int) -> None:
        self.Job.objects.enqueue_many([self.JobSpec("bench.Noop") for _ in range(n)])

    def enqueue_latency(self, t: float) -> None:
        self.Job.objects.enqueue("bench.Latency", {"t": t})

    def done_count(self) -> int:
        from django_sqlqueue.states import Status

        return self.Job.objects.filter(status_id=Status.COMPLETED).count()

    def commands(self, burst: bool) -> list[list[str]]:
        # "auto" is the default: left unsaid, so an older tree (--baseline) runs with its own default
        batch = [] if self.batch == "auto" else ["--batch", str(self.batch)]
        cmd = _manage("run_queue_worker", "--concurrency", str(self.slots), *batch,
                      "--no-progress", "--log-level", "WARNING", "--worker-name", "bench")
        return [cmd + (["--burst"] if burst else [])]


class OursTask(Ours):
    """The Tasks API on our queue: ``noop.using(backend="sqlqueue").enqueue()``, drained by run_queue_worker."""

    name = OURS_TASK_NAME

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        from bench.peers import tasks

        # Built once, like a module-level @task(backend=...) would be: the enqueue itself is timed.
        self.noop = tasks.noop.using(backend="sqlqueue")
        self.latency_task = tasks.latency.using(backend="sqlqueue")

    def enqueue_one(self) -> None:
        self.noop.enqueue()

    def enqueue_bulk(self, n: int) -> None:
        from django.db import transaction

        with transaction.atomic():  # the Tasks API has no bulk call: as for django-tasks-db, one transaction
            for _ in range(n):
                self.noop.enqueue()

    def enqueue_latency(self, t: float) -> None:
        self.latency_task.enqueue(t)


class TasksDb(System):
    name = "django-tasks-db"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        from django_tasks_db.models import DBTaskResult

        from bench.peers import tasks

        self.tasks, self.Result = tasks, DBTaskResult

    def enqueue_one(self) -> None:
        self.tasks.noop.enqueue()

    def enqueue_bulk(self, n: int) -> None:
        from django.db import transaction

        with transaction.atomic():  # no bulk API: every enqueue in one transaction is the closest
            for _ in range(n):
                self.tasks.noop.enqueue()

    def enqueue_latency(self, t: float) -> None:
        self.tasks.latency.enqueue(t)

    def done_count(self) -> int:
        return self.Result.objects.filter(status="SUCCESSFUL").count()

    def commands(self, burst: bool) -> list[list[str]]:
        cmd = _manage("db_worker", "--interval", str(self.args.peer_interval), "--no-startup-delay", "--no-reload",
                      "--verbosity", "0")
        return [cmd + (["--batch"] if burst else []) + ["--worker-id", f"bench-{i}"] for i in range(self.slots)]


class Procrastinate(System):
    name = "procrastinate"

    def __init__(self, *a: Any, processes: bool = False, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.processes = processes
        if processes:
            self.name = f"procrastinate x{self.slots}"
        from procrastinate.contrib.django.models import ProcrastinateJob

        from bench.peers import pro_tasks

        self.tasks, self.ProJob = pro_tasks, ProcrastinateJob

    def enqueue_one(self) -> None:
        self.tasks.noop.defer()

    def enqueue_bulk(self, n: int) -> None:
        self.tasks.noop.batch_defer(*({} for _ in range(n)))

    def enqueue_latency(self, t: float) -> None:
        self.tasks.latency.defer(t=t)

    def done_count(self) -> int:
        return self.ProJob.objects.filter(status="succeeded").count()

    def commands(self, burst: bool) -> list[list[str]]:
        per, count = (1, self.slots) if self.processes else (self.slots, 1)
        cmd = _manage("procrastinate", "worker", "--concurrency", str(per),
                      "--fetch-job-polling-interval", str(max(self.args.peer_interval, 0.001)))
        return [cmd + (["--one-shot"] if burst else []) + ["--name", f"bench-{i}"] for i in range(count)]


def make_system(spec: str, url: str, slots: int, args: argparse.Namespace, logdir: Path) -> System:
    if spec == OURS_TASK:
        task_system = OursTask(url, slots, args, logdir)
        if os.environ.get("BENCH_CODE"):
            task_system.name = f"{OURS_TASK_NAME} (baseline)"
        return task_system
    if spec.startswith(OURS):
        batch = spec.split(":")[1] if ":" in spec else (args.target_batch if args.mode == "targets" else "auto")
        ours = Ours(url, slots, args, logdir, batch=batch)
        if os.environ.get("BENCH_CODE"):
            ours.name = f"{OURS} (baseline)" if batch == "auto" else f"{OURS} (baseline, batch {batch})"
        return ours
    if spec == "django-tasks-db":
        return TasksDb(url, slots, args, logdir)
    if spec == "procrastinate":
        return Procrastinate(url, slots, args, logdir)
    if spec == "procrastinate-procs":
        return Procrastinate(url, slots, args, logdir, processes=True)
    raise SystemExit(f"unknown system {spec!r}")


def durability() -> dict[str, str]:
    from django.db import connection

    with connection.cursor() as c:
        if connection.vendor == "postgresql":
            out = {}
            for name in ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "server_version"):
                c.execute(f"SHOW {name}")
                out[name] = c.fetchone()[0]
            return out
        c.execute("PRAGMA journal_mode")
        journal = c.fetchone()[0]
        c.execute("PRAGMA synchronous")
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(c.fetchone()[0], "?")
        c.execute("SELECT sqlite_version()")
        return {"journal_mode": journal, "synchronous": sync, "sqlite_version": c.fetchone()[0]}


def inner(args: argparse.Namespace) -> dict[str, Any]:
    import django

    django.setup()
    logdir = Path(args.logdir)
    import django_sqlqueue

    out: dict[str, Any] = {"system": args.system, "slots": args.slots_one, "durability": durability(),
                           "code": str(Path(django_sqlqueue.__file__).parent)}
    if args.mode == "interleaved":
        return {**out, **interleaved(args)}
    if args.mode == "concurrent":
        return {**out, **concurrent(args)}
    system = make_system(args.system, args.inner_url, args.slots_one, args, logdir)
    out["system"] = system.name
    n = args.jobs
    if args.mode == "targets":
        return {**out, **targets(system, args)}
    # Launch-to-exit on an empty queue: the fixed cost inside every drain time below (process start,
    # Django setup, connections). Reported in the JSON; the table's drain rates include it.
    out["startup_s"] = system.drain(0, 0, "startup")["seconds"]
    system.warm_up()
    t = time.perf_counter()
    for _ in range(n):
        system.enqueue_one()
    out["enqueue_tx_per_s"] = n / (time.perf_counter() - t)
    out["drain_after_tx"] = system.drain(n + 1, n + 1, "drain-tx")
    if args.skip_bulk:
        out["drain_per_s"] = out["drain_after_tx"]["jobs_per_s"]
        out["peak_rss_mb"] = out["drain_after_tx"]["peak_rss_mb"]
        return out
    t = time.perf_counter()
    system.enqueue_bulk(n)
    out["enqueue_bulk_per_s"] = n / (time.perf_counter() - t)
    out["drain_after_bulk"] = system.drain(n, 2 * n + 1, "drain-bulk")
    out["drain_per_s"] = statistics.fmean([out["drain_after_tx"]["jobs_per_s"], out["drain_after_bulk"]["jobs_per_s"]])
    out["peak_rss_mb"] = max(out["drain_after_tx"]["peak_rss_mb"], out["drain_after_bulk"]["peak_rss_mb"])
    if args.latency_jobs:
        out["latency"] = system.latency(args.latency_jobs, args.settle, (args.gap_min, args.gap_max))
    return out


def targets(system: System, args: argparse.Namespace) -> dict[str, Any]:
    """Ours only: bulk enqueue of ``--target-jobs`` and one slot draining them (time, peak RSS)."""
    n = args.target_jobs
    system.warm_up()
    t = time.perf_counter()
    for start in range(0, n, 20_000):  # what an app does: bulk calls of a bounded size
        system.enqueue_bulk(min(20_000, n - start))
    bulk = n / (time.perf_counter() - t)
    drain = system.drain(n + 1, n + 1, "targets-drain")
    return {"target_jobs": n, "enqueue_bulk_per_s": bulk, "drain": drain}


def interleaved(args: argparse.Namespace) -> dict[str, Any]:
    """One-per-transaction enqueue of every system in ONE process and database, in alternating rounds.

    The table's enqueue column times each system in its own minutes; on a shared machine the load
    drifts between them by more than the difference being measured. Here every round times
    ``--round-jobs`` enqueues of each system back to back (the order rotating from round to round),
    so each round's ratio compares systems under the same load; the median round is the answer.
    """
    logdir = Path(args.logdir)
    names = [n for n in args.system.split(",") if n]
    systems = [make_system(n, args.inner_url, 1, args, logdir) for n in names]
    for s in systems:
        s.warm_up()
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        rates: dict[str, float] = {}
        for s in order:
            t = time.perf_counter()
            for _ in range(args.round_jobs):
                s.enqueue_one()
            rates[s.name] = args.round_jobs / (time.perf_counter() - t)
        rounds.append(rates)
    ours = systems[0].name
    peers = [s.name for s in systems if not s.name.startswith(OURS)]
    ratios = [rates[ours] / max(rates[p] for p in peers) for rates in rounds]
    # Each of our systems against its own kind of peer: the Tasks API against django-tasks-db.
    by_system = {}
    for s in systems:
        if s.name.startswith(OURS):
            against = [TASKS_PEER] if s.name.startswith(OURS_TASK_NAME) and TASKS_PEER in peers else peers
            per_round = [rates[s.name] / max(rates[p] for p in against) for rates in rounds]
            by_system[s.name] = {"against": against, "per_round": per_round,
                                 "median": statistics.median(per_round)}
    return {"interleaved": {
        "round_jobs": args.round_jobs, "rounds": rounds,
        "median_per_s": {s.name: statistics.median(r[s.name] for r in rounds) for s in systems},
        "ratio_per_round": ratios, "ratio_median": statistics.median(ratios), "ratios": by_system,
    }}


# ====================================================================================================
# Concurrent enqueue (issue 30, item 2): W writer processes, one job per transaction each
# ====================================================================================================
def _writers(args: argparse.Namespace) -> list[int]:
    return [int(w) for w in args.concurrent.split(",") if w.strip() and int(w) > 0]


def concurrent(args: argparse.Namespace) -> dict[str, Any]:
    """One system's enqueue throughput with 1, 4, 16 (``--concurrent``) writer processes at once.

    Each writer is a forked process with its own connection, enqueueing its share of
    ``--concurrent-jobs`` no-op jobs one per transaction (autocommit), all released by one barrier;
    the rate is all jobs over the time from the release to the last writer's end. On PostgreSQL
    commits that sent NOTIFY are serialised by the server (one global lock, held through the WAL flush),
    so a system that notifies in every enqueuing transaction stops scaling: this measures that.
    """
    import multiprocessing

    from django.db import connections

    logdir = Path(args.logdir)
    system = make_system(args.system, args.inner_url, 1, args, logdir)
    system.warm_up()  # the type rows, imports: before the fork, once
    rates: dict[str, float] = {}
    ctx = multiprocessing.get_context("fork")
    for writers in _writers(args):
        per = max(1, args.concurrent_jobs // writers)
        barrier = ctx.Barrier(writers + 1)
        connections.close_all()  # no connection crosses the fork

        def write(system: System = system, barrier: Any = barrier, per: int = per) -> None:
            system.enqueue_one()  # the child's own connection, opened before the start
            barrier.wait()
            for _ in range(per):
                system.enqueue_one()
            connections.close_all()

        procs = [ctx.Process(target=write) for _ in range(writers)]
        for proc in procs:
            proc.start()
        barrier.wait(timeout=300)
        start = time.perf_counter()
        for proc in procs:
            proc.join(timeout=1800)
        seconds = time.perf_counter() - start
        if any(proc.exitcode for proc in procs):
            raise SystemExit(f"{system.name}: a concurrent writer failed ({[p.exitcode for p in procs]})")
        rates[str(writers)] = writers * per / seconds
    return {"system": system.name, "concurrent": rates}


def concurrent_rounds(db: Database, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``--concurrent-rounds`` rounds; in each, every system (the order rotating) measures every writer
    count in a fresh database. Ratios are taken within a round, then the median over the rounds."""
    rounds: list[dict[str, dict[str, float]]] = []
    for r in range(args.concurrent_rounds):
        k = r % len(names)
        got: dict[str, dict[str, float]] = {}
        for name in names[k:] + names[:k]:
            out = run_inner(db, name, 1, args, mode="concurrent")
            got[out["system"]] = out["concurrent"]
        rounds.append(got)
    return {"database": db.kind, "concurrent_run": True, "rounds": rounds}


def concurrent_summary(run: dict[str, Any]) -> str:
    """Median jobs/s per (system, writers), ours / best peer per round (median, range), and each
    system's scaling (its rate at W writers over its rate with 1, per round, median)."""
    rounds = run["rounds"]
    systems = list(rounds[0])
    writers = list(rounds[0][systems[0]])
    peers = [s for s in systems if not s.startswith(OURS)]
    lines = [f"concurrent enqueue 1/tx ({run['database']}, {len(rounds)} rounds, writer processes, one job per "
             f"transaction each; median jobs/s):"]
    head = f"  {'system':40}" + "".join(f"{w + ' writers':>14}" for w in writers) + f"{'scaling':>12}"
    lines += [head, "  " + "-" * (len(head) - 2)]
    for name in systems:
        cells = [statistics.median(r[name][w] for r in rounds) for w in writers]
        scale = statistics.median(r[name][writers[-1]] / r[name][writers[0]] for r in rounds)
        lines.append(f"  {name:40}" + "".join(f"{_fmt(c):>14}" for c in cells) + f"{scale:>11.2f}x")
    for name in [s for s in systems if s.startswith(OURS)]:
        against = [TASKS_PEER] if name.startswith(OURS_TASK_NAME) and TASKS_PEER in peers else peers
        if not against:
            continue
        cells = []
        for w in writers:
            per = sorted(r[name][w] / max(r[p][w] for p in against) for r in rounds)
            cells.append(f"{statistics.median(per):.2f}x ({per[0]:.2f}-{per[-1]:.2f})")
        lines.append(f"  {name + ' / best of ' + ', '.join(against):40} " + "  ".join(
            f"{w}: {c}" for w, c in zip(writers, cells, strict=True)))
    return "\n".join(lines)


# ====================================================================================================
# Outer side: database server, templates, runs, table
# ====================================================================================================
@dataclass
class Database:
    kind: str
    tmp: Path
    cluster: Any = None
    template: str = ""
    counter: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def setup(self, baseline: str = "") -> None:
        """The migrated template; with ``baseline`` (a source tree) a second one, migrated by that tree's
        own migrations, for its runs: a tree's statements expect its own schema (a changed partial
        index, say, that SQLite's INDEXED BY would refuse)."""
        if self.kind == "postgres":
            from tests.pgcluster import PgCluster

            self.cluster = PgCluster(fsync=True).start()  # durable, as in production
            self._pg("CREATE DATABASE bench_template")
            self.template = self.cluster.url_for("bench_template")
        else:
            self.template = f"sqlite:///{self.tmp}/template.sqlite3"
        subprocess.run(_manage("migrate", "-v0"), cwd=ROOT, env=_env(self.template), check=True)
        if baseline:
            if self.kind == "postgres":
                self._pg("CREATE DATABASE bench_template_baseline")
                url = self.cluster.url_for("bench_template_baseline")
            else:
                url = f"sqlite:///{self.tmp}/template-baseline.sqlite3"
            env = _env(url, BENCH_CODE=baseline)
            env["PYTHONPATH"] = f"{env['BENCH_SITE']}:{baseline}:{ROOT}"
            # not cwd=ROOT: ``python -m`` puts the working directory first on sys.path, before PYTHONPATH
            subprocess.run(_manage("migrate", "-v0"), cwd=self.tmp, env=env, check=True)
            self.extra["baseline_template"] = True

    def _pg(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.cluster.url, autocommit=True) as conn:
            conn.execute(sql)

    def fresh(self, baseline: bool = False) -> str:
        """A new database cloned from the migrated template (the baseline tree's, for its runs)."""
        self.counter += 1
        name = f"run{self.counter}"
        own = baseline and self.extra.get("baseline_template")
        if self.kind == "postgres":
            self._pg(f"CREATE DATABASE {name} TEMPLATE {'bench_template_baseline' if own else 'bench_template'}")
            self._pg("CHECKPOINT")
            return self.cluster.url_for(name)
        path = self.tmp / f"{name}.sqlite3"
        shutil.copyfile(self.tmp / ("template-baseline.sqlite3" if own else "template.sqlite3"), path)
        return f"sqlite:///{path}"

    def drop(self, url: str) -> None:
        if self.kind == "postgres":
            self._pg(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)

    def teardown(self) -> None:
        if self.cluster is not None:
            self.cluster.destroy()


def run_inner(db: Database, system: str, slots: int, args: argparse.Namespace, mode: str = "compare") -> dict:
    baseline = system.endswith("@baseline")
    system = system.removesuffix("@baseline")
    url = db.fresh(baseline)
    logdir = Path(tempfile.mkdtemp(prefix=f"bench-{db.kind}-{slots}-", dir=db.tmp))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--inner-url", url, "--system", system,
           "--slots-one", str(slots), "--mode", mode, "--logdir", str(logdir), "--jobs", str(args.jobs),
           "--latency-jobs", str(args.latency_jobs), "--settle", str(args.settle), "--gap-min", str(args.gap_min),
           "--gap-max", str(args.gap_max), "--peer-interval", str(args.peer_interval),
           "--target-jobs", str(args.target_jobs),
           "--target-batch", str(args.target_batch), "--rounds", str(args.rounds),
           "--round-jobs", str(args.round_jobs), *(["--skip-bulk"] if args.skip_bulk else []),
           "--concurrent", args.concurrent, "--concurrent-jobs", str(args.concurrent_jobs)]
    print(f"  {db.kind:8} slots={slots} {system:28} ...", end="", flush=True, file=sys.stderr)
    t = time.perf_counter()
    try:
        env = _env(url, **({"BENCH_CODE": args.baseline} if baseline else {}))
        if baseline:
            env["PYTHONPATH"] = f"{env['BENCH_SITE']}:{args.baseline}:{ROOT}"
        out = subprocess.run(cmd, cwd=logdir, env=env, capture_output=True, text=True)
    finally:
        db.drop(url)
    if out.returncode:
        print(" FAILED", file=sys.stderr)
        print(out.stdout[-3000:], out.stderr[-5000:], file=sys.stderr)
        for log in sorted(logdir.glob("*.log"))[:4]:
            print(f"--- {log.name}\n{log.read_text()[-2000:]}", file=sys.stderr)
        raise SystemExit(f"{system} on {db.kind} failed")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["database"] = db.kind
    if "concurrent" in result:
        print(f" {time.perf_counter() - t:.0f} s: enqueue 1/tx jobs/s by writers "
              + ", ".join(f"{w}: {_fmt(v)}" for w, v in result["concurrent"].items()), file=sys.stderr)
        return result
    if "interleaved" in result:
        print(f" {time.perf_counter() - t:.0f} s: enqueue 1/tx ours / best peer, median round "
              f"{result['interleaved']['ratio_median']:.2f}x", file=sys.stderr)
        return result
    print(f" {time.perf_counter() - t:.0f} s: " + ", ".join(
        f"{key} {_fmt(_value(result, key))}" for _, key, _ in COLUMNS if _value(result, key) is not None),
        file=sys.stderr)
    return result


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}{unit}" if v >= 100 else f"{v:,.1f}{unit}"


COLUMNS = [("enqueue 1/tx /s", "enqueue_tx_per_s", True), ("enqueue bulk /s", "enqueue_bulk_per_s", True),
           ("drain /s", "drain_per_s", True), ("p50 ms", "p50_ms", False), ("p99 ms", "p99_ms", False),
           ("RSS MB", "peak_rss_mb", None)]


def _value(r: dict, key: str) -> float | None:
    if key in ("p50_ms", "p99_ms"):
        return (r.get("latency") or {}).get(key)
    return r.get(key)


def table(results: list[dict]) -> str:
    lines = []
    head = f"{'database':9}{'slots':>5}  {'system':40}" + "".join(f"{c[0]:>17}" for c in COLUMNS)
    lines += [head, "-" * len(head)]
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in results:
        groups.setdefault((r["database"], r["slots"]), []).append(r)
    for (dbk, slots), rows in groups.items():
        for r in rows:
            lines.append(f"{dbk:9}{slots:>5}  {r['system']:40}" + "".join(
                f"{_fmt(_value(r, key)):>17}" for _, key, _ in COLUMNS))
        ours = [r for r in rows if r["system"].startswith(OURS)]
        peers = [r for r in rows if not r["system"].startswith(OURS)]
        for o in ours:
            cells = []
            for _, key, higher in COLUMNS:
                mine = _value(o, key)
                theirs = [v for v in (_value(p, key) for p in peers) if v is not None]
                if higher is None or mine is None or not theirs or not mine:
                    cells.append("")
                    continue
                best = max(theirs) if higher else min(theirs)
                cells.append(f"{(mine / best if higher else best / mine):.2f}x")
            label = "  ours / best peer" + (f" {o['system'][len(OURS):].strip()}" if o["system"] != OURS else "")
            lines.append(f"{'':9}{'':>5}  {label:40}" + "".join(f"{c:>17}" for c in cells))
        lines.append("")
    return "\n".join(lines)


def merge_repeats(rows: list[dict]) -> list[dict]:
    """One row per (database, slots, system): the median of each column over its repeats (``runs``: all)."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["database"], r["slots"], r["system"]), []).append(r)
    merged = []
    for (dbk, slots, system), runs in groups.items():
        row: dict[str, Any] = {"database": dbk, "slots": slots, "system": system, "runs": runs,
                               "order": runs[0].get("order", 0)}
        for _, key, _ in COLUMNS:
            values = [v for v in (_value(r, key) for r in runs) if v is not None]
            if values:
                if key in ("p50_ms", "p99_ms"):
                    row.setdefault("latency", {})[key] = statistics.median(values)
                else:
                    row[key] = statistics.median(values)
        merged.append(row)
    merged.sort(key=lambda r: (r["database"], r["slots"], r["order"]))
    return merged


def ranges(rows: list[dict]) -> str:
    """The spread behind each median of the table (min-max over the repeats)."""
    lines = ["ranges over the repeats (min-max):"]
    for r in rows:
        cells = []
        for label, key, _ in COLUMNS[:3]:
            values = sorted(v for v in (_value(x, key) for x in r["runs"]) if v is not None)
            if values:
                cells.append(f"{label} {_fmt(values[0])}-{_fmt(values[-1])}")
        lines.append(f"  {r['database']:9}{r['slots']:>2}  {r['system']:40} " + "; ".join(cells))
    return "\n".join(lines)


def per_job_us(r: dict) -> float | None:
    """Drain time per job without the process start-up (launch to exit on an empty queue, same run)."""
    spans = [(d["seconds"] - r.get("startup_s", 0.0)) / d["jobs"] for d in (r.get("drain_after_tx"), r.get("drain_after_bulk"))
             if d and d.get("jobs")]
    return 1e6 * statistics.fmean(spans) if spans else None


def tasks_summary(results: list[dict]) -> str:
    """The issue's Tasks-API targets, per database: ratios taken within each repeat, then median and range.

    - drain via @task / django-tasks-db (launch to exit, start-up included; target >= 6x, goal 10x);
    - per-job cost of @task / native handler (drain time minus start-up, per job; target <= 1.15);
    - enqueue via task.enqueue() / django-tasks-db (the interleaved rounds are the fairer number).
    """
    lines = ["Tasks API (ratios within each repeat; median and range over the repeats):"]
    plain = [r for r in results if not r.get("target") and not r.get("interleaved_run") and not r.get("concurrent_run")]
    keys = sorted({(r["database"], r["slots"]) for r in plain})
    for dbk, slots in keys:
        rows = [r for r in plain if (r["database"], r["slots"]) == (dbk, slots)]
        reps = sorted({r.get("repeat", 0) for r in rows})
        for suffix in ("", " (baseline)"):
            task_name, native_name = OURS_TASK_NAME + suffix, OURS + suffix
            if not any(r["system"] == task_name for r in rows):
                continue
            drain, cost, enq, start = [], [], [], []
            for rep in reps:
                at = {r["system"]: r for r in rows if r.get("repeat", 0) == rep}
                mine, peer, native = at.get(task_name), at.get(TASKS_PEER), at.get(native_name)
                if mine is None:
                    continue
                start.append(mine.get("startup_s", 0.0))
                if peer:
                    drain.append(mine["drain_per_s"] / peer["drain_per_s"])
                    enq.append(mine["enqueue_tx_per_s"] / peer["enqueue_tx_per_s"])
                if native and per_job_us(native) and per_job_us(mine):
                    cost.append(per_job_us(mine) / per_job_us(native))

            def show(values: list[float], unit: str = "x") -> str:
                if not values:
                    return "-"
                v = sorted(values)
                return f"{statistics.median(v):.2f}{unit} ({v[0]:.2f}-{v[-1]:.2f})"

            lines.append(f"  {dbk:9}{slots:>2}  {task_name:32} drain / {TASKS_PEER} {show(drain)}; per-job cost / "
                         f"native {show(cost)}; enqueue 1/tx / {TASKS_PEER} {show(enq)}; start-up {show(start, ' s')}")
    return "\n".join(lines)


def tasks_drain_rows(results: list[dict]) -> str:
    """Issue 30, item 3: drain via ``@task`` against django-tasks-db, launch to exit (start-up included),
    over the ``--repeat`` interleaved repeats: min and median of each system's drain rate and of the
    ratio taken within each repeat (the two systems of one repeat ran back to back)."""
    lines = ["drain via @task vs django-tasks-db (launch to exit, start-up included; min / median over the repeats):"]
    plain = [r for r in results if not r.get("target") and not r.get("interleaved_run") and not r.get("concurrent_run")]
    for dbk, slots in sorted({(r["database"], r["slots"]) for r in plain}):
        at: dict[int, dict[str, dict]] = {}
        for r in plain:
            if (r["database"], r["slots"]) == (dbk, slots):
                at.setdefault(r.get("repeat", 0), {})[r["system"]] = r
        for suffix in ("", " (baseline)"):
            mine_name = OURS_TASK_NAME + suffix
            pairs = [(rep[mine_name], rep[TASKS_PEER]) for rep in at.values() if mine_name in rep and TASKS_PEER in rep]
            if not pairs:
                continue
            mine = sorted(m["drain_per_s"] for m, _ in pairs)
            peer = sorted(p["drain_per_s"] for _, p in pairs)
            ratio = sorted(m["drain_per_s"] / p["drain_per_s"] for m, p in pairs)
            jobs = pairs[0][0]["drain_after_tx"]["jobs"]
            lines.append(f"  {dbk:9}{slots:>2}  {mine_name:32} {jobs:,} tasks, {len(pairs)} repeats: ours min "
                         f"{mine[0]:,.0f} median {statistics.median(mine):,.0f} /s; {TASKS_PEER} min {peer[0]:,.0f} "
                         f"median {statistics.median(peer):,.0f} /s; ratio min {ratio[0]:.1f}x median "
                         f"{statistics.median(ratio):.1f}x")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = open("/proc/meminfo").readline().split(":", 1)[1].strip()
    except OSError:
        pass
    import importlib.metadata as md

    versions = {"python": platform.python_version()}
    for dist in ("Django", "psycopg", "django-tasks-db", "procrastinate", "django-sqlqueue"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = "not installed"
    return {"cpu": cpu, "cpus": os.cpu_count(), "memory": mem, "kernel": platform.release(), "versions": versions}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--slots", default="1,4", help="worker slots to measure (default 1,4)")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per workload (default 20,000)")
    p.add_argument("--ours", default="auto", help="our --batch values, comma-separated (default auto, "
                                                  "the production default)")
    p.add_argument("--systems", default="", help="only these systems (comma-separated names)")
    p.add_argument("--latency-jobs", type=int, default=30, help="latency probes per row (0: skip)")
    p.add_argument("--settle", type=float, default=4.0, help="seconds idle before the latency probes")
    p.add_argument("--gap-min", type=float, default=0.3)
    p.add_argument("--gap-max", type=float, default=1.5)
    p.add_argument("--peer-interval", type=float, default=0.0,
                   help="peers' poll interval (default 0, the smallest db_worker accepts; procrastinate gets 0.001)")
    p.add_argument("--targets", action="store_true", help="also run the single-system targets (100,000 jobs)")
    p.add_argument("--target-jobs", type=int, default=100_000)
    p.add_argument("--target-batch", default="auto", help="our --batch for the 100,000-job drain (default auto)")
    p.add_argument("--rounds", type=int, default=10,
                   help="interleaved one-per-transaction enqueue: rounds per database (0: skip; default 10)")
    p.add_argument("--round-jobs", type=int, default=500, help="enqueues per system per round (default 500)")
    p.add_argument("--concurrent", default="1,4,16",
                   help="concurrent enqueue: writer process counts (default 1,4,16; 0: skip); it runs with "
                        "--interleaved-only too")
    p.add_argument("--concurrent-jobs", type=int, default=3200,
                   help="jobs per concurrent measurement, shared by its writers (default 3,200)")
    p.add_argument("--concurrent-rounds", type=int, default=3,
                   help="rounds of the concurrent enqueue, every system in each (default 3; 0: skip)")
    p.add_argument("--concurrent-only", action="store_true",
                   help="only the concurrent enqueue (no table rows, no drains, no interleaved rounds)")
    p.add_argument("--interleaved-only", action="store_true",
                   help="only the interleaved enqueue rounds (no table rows, no drains)")
    p.add_argument("--baseline", metavar="TREE",
                   help="also run django-sqlqueue from this source tree (e.g. `git archive` of an older "
                        "commit), side by side with the working tree's")
    p.add_argument("--tasks", action="store_true",
                   help="also run the Tasks API: our @task backend (django-sqlqueue @task) on the same no-op @task "
                        "django-tasks-db runs; adds its rows, the Tasks summary and its interleaved enqueue")
    p.add_argument("--repeat", type=int, default=1,
                   help="measure every system N times, interleaved (the order rotating), and report medians and "
                        "ranges (default 1)")
    p.add_argument("--skip-bulk", action="store_true",
                   help="only the one-per-transaction enqueue and its drain (no bulk enqueue, no second drain)")
    p.add_argument("--baseline-tasks-only", action="store_true",
                   help="with --baseline and --tasks: run only the @task system from the baseline tree")
    p.add_argument("--quiet-tasks-log", action="store_true",
                   help="leave Django's per-task INFO log lines unprinted in every system (bench/peers/settings.py)")
    p.add_argument("--output", help="JSON file (default bench/results/compare-<time>.json)")
    # inner (one measurement, in its own process)
    p.add_argument("--inner-url", help=argparse.SUPPRESS)
    p.add_argument("--system", help=argparse.SUPPRESS)
    p.add_argument("--slots-one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="compare", help=argparse.SUPPRESS)
    p.add_argument("--logdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner_url:
        print(json.dumps(inner(args)))
        return 0

    dbs = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    slots_list = [int(s) for s in args.slots.split(",")]
    ours = [OURS if b == "auto" else f"{OURS}:{b}" for b in args.ours.split(",")]
    if args.tasks:
        ours.append(OURS_TASK)
    if args.baseline:
        args.baseline = str(Path(args.baseline).resolve())
        ours = [x for o in ours for x in (
            (o + "@baseline", o) if o == OURS_TASK or not (args.tasks and args.baseline_tasks_only) else (o,))]
    only = set(filter(None, args.systems.split(",")))
    if args.quiet_tasks_log:
        os.environ["BENCH_QUIET_TASK_LOGS"] = "1"  # inherited by every process the bench starts
    quiet_tasks_log = os.environ.get("BENCH_QUIET_TASK_LOGS") == "1"  # the flag, or the caller's environment
    _site_dir()  # before any process starts: PYTHONPATH, not an editable install, picks the code
    # Bytecode cached as an installed package has it (pip compiles at install): without this, a
    # PYTHONDONTWRITEBYTECODE environment recompiles the source trees in every process start, which
    # costs a two-process worker twice and a package loaded from a source tree more than an installed one.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", tempfile.mkdtemp(prefix="bench-pycache-"))
    info = machine()
    print(f"machine: {info['cpu']} x{info['cpus']}, {info['memory']}, Linux {info['kernel']}", file=sys.stderr)
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()), file=sys.stderr)
    results: list[dict] = []
    durable: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="sqlqueue-compare-") as tmp:
        for kind in dbs:
            db = Database(kind, Path(tmp))
            db.setup(args.baseline or "")
            try:
                for slots in ([] if args.interleaved_only or args.concurrent_only else slots_list):
                    systems = ours + PEERS_ON[kind] + (["procrastinate-procs"] if kind == "postgres" and slots > 1 else [])
                    systems = [n for n in systems
                               if not only or n.split(":")[0].split("@")[0] in only or n in only]
                    for rep in range(args.repeat):  # rotating order: each system early and late in turn
                        k = rep % len(systems)
                        for name in systems[k:] + systems[:k]:
                            r = run_inner(db, name, slots, args)
                            durable[kind] = r.pop("durability")
                            results.append({**r, "repeat": rep, "order": systems.index(name)})
                peers = [n for n in PEERS_ON[kind] if not only or n in only]
                if args.rounds and peers and (not only or OURS in only) and not args.concurrent_only:
                    mine = [OURS, OURS_TASK]  # the Tasks API's enqueue is in the rounds, always (issue 30)
                    r = run_inner(db, ",".join([*mine, *peers]), 1, args, mode="interleaved")
                    r.pop("durability", None)
                    results.append({**r, "interleaved_run": True})
                if _writers(args) and args.concurrent_rounds:
                    names = [OURS, *(["django-sqlqueue@baseline"] if args.baseline else []), *PEERS_ON[kind]]
                    names = [n for n in names if not only or n.split("@")[0] in only]
                    results.append(concurrent_rounds(db, names, args))
                if args.targets and (not only or OURS in only):
                    tgt = run_inner(db, OURS, 1, args, mode="targets")
                    tgt.pop("durability", None)
                    results.append({**tgt, "target": True})
            finally:
                db.teardown()
    compare_rows = merge_repeats([r for r in results if not r.get("target") and not r.get("interleaved_run")
                                  and not r.get("concurrent_run")])
    text = table(compare_rows) if compare_rows else ""
    if args.repeat > 1:
        text += "\n" + ranges(compare_rows)
    if args.tasks:
        text += "\n" + tasks_summary(results)
        text += "\n" + tasks_drain_rows(results)
    print()
    print(text)
    for kind, d in durable.items():
        print(f"durability ({kind}): " + ", ".join(f"{k}={v}" for k, v in d.items()))
    print(f"workload: {args.jobs:,} no-op jobs per enqueue; drain = launch to exit of the workers (mean of the "
          f"drain after the one-per-transaction and the bulk enqueue); latency: {args.latency_jobs} jobs, one "
          f"every {args.gap_min}-{args.gap_max} s to idle forever-mode workers; peers' poll interval "
          f"{args.peer_interval} s (procrastinate >= 0.001 s, LISTEN/NOTIFY on); ours: production defaults; "
          f"Django's per-task INFO log lines {'not printed (--quiet-tasks-log)' if quiet_tasks_log else 'printed'}.")
    for r in results:
        if r.get("interleaved_run"):
            iv = r["interleaved"]
            rates = ", ".join(f"{k} {v:,.0f}/s" for k, v in iv["median_per_s"].items())
            ratios = sorted(iv["ratio_per_round"])
            print(f"interleaved enqueue 1/tx ({r['database']}, {len(ratios)} rounds of {iv['round_jobs']} per system, "
                  f"one process): median {rates}; ours / best peer per round: median {iv['ratio_median']:.2f}x "
                  f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}x)")
            for name, x in iv.get("ratios", {}).items():
                if name.startswith(OURS_TASK_NAME):
                    per = sorted(x["per_round"])
                    print(f"  {name} / {', '.join(x['against'])} per round: median {x['median']:.2f}x "
                          f"(range {per[0]:.2f}-{per[-1]:.2f}x)")
    for r in results:
        if r.get("concurrent_run"):
            print(concurrent_summary(r))
    for r in results:
        if r.get("target"):
            print(f"targets ({r['database']}): bulk enqueue of {r['target_jobs']:,} jobs: "
                  f"{r['enqueue_bulk_per_s']:,.0f} jobs/s; 1 slot (--batch {args.target_batch}) drained them at "
                  f"{r['drain']['jobs_per_s']:,.0f} "
                  f"jobs/s, peak RSS {r['drain']['peak_rss_mb']:.1f} MB per process")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = Path(args.output) if args.output else RESULTS / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"machine": info, "durability": durable, "args": vars(args), "results": results,
                                "table": text}, indent=2))
    print(f"raw numbers: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
