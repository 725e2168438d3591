"""Soak and chaos test: many jobs, real workers killed at random, a database restart; nothing lost, nothing doubled.

Usage (from the repository root)::

    python bench/soak.py                              # PostgreSQL (throwaway cluster), 50,000 enqueues
    python bench/soak.py --db sqlite                  # SQLite: fewer workers, no database restart
    python bench/soak.py --jobs 5000 --seconds 120    # smaller and shorter
    python bench/soak.py --json report.json           # also write the report as JSON

What one run does (details and the meaning of every check in docs/soak.md):

- ``--producers`` processes (4) enqueue ``--jobs`` jobs between them (enqueue calls, dedupe included):
  transactional and non-transactional handlers, a share with dedupe keys every producer enqueues at
  the same moment, a share due a few seconds later, a share that fails once or twice first, a share of
  an always-failing type;
- ``--workers`` ``run_queue_worker`` processes (4) of ``--concurrency`` slots (2), with different names
  and batch sizes, drain the queue;
- chaos: every ``--kill-every`` seconds, ``kill -9`` of a random worker (its whole process group) and a
  new one started under the same or a new name, or of a single slot; once, a restart of the PostgreSQL
  server; once, SIGTERM to a worker, which must exit 0;
- then every worker gets SIGTERM (each must exit 0) and the database is checked (``bench/soak_verify.py``).

Exit status 0 only if every check passed. The run is bounded by ``--seconds``, talks to loopback only,
and removes its processes, its temporary directory and its PostgreSQL cluster when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
BATCHES = ("auto", 1, "auto", 20)  # worker i runs with --batch BATCHES[i % 4] (auto: the default)
GRACE_SECONDS = 10
#: Liveness timings of the soak's workers (testproject/settings.py reads them): short, so that a worker
#: paused past its dead-after time is replaced within the run.
DEAD_AFTER_SECONDS, HEARTBEAT_SECONDS = 6.0, 0.5


@dataclass
class SoakConfig:
    db: str = "postgres"
    jobs: int = 50_000  # enqueue calls in all (dedupe calls included)
    seconds: float = 600.0  # hard bound of the whole run
    producers: int = 4
    workers: int = 4
    concurrency: int = 2
    kill_every: float = 4.0  # seconds between kills (jittered)
    max_kills: int | None = None  # None: keep killing until the work is done
    slot_kill_share: float = 0.35  # share of kills that hit one slot instead of a whole worker
    db_restart: bool = True  # PostgreSQL only, and only with a restart function
    sigterm: bool = True
    #: Pause a busy worker's process group past its dead-after time, start a same-name twin, resume.
    pause_twin: bool = True
    #: PostgreSQL only. Workers connect through bench/faultproxy.py, which loses the replies of a few
    #: committed claims; and once, the workers' role may open no new connection while every heartbeat
    #: connection is cut (connection starvation: the job connections keep working).
    reply_cuts: bool = True
    starve: bool = True
    #: The workers' WORKER_DEAD_AFTER_SECONDS (short, so that the pause outlasts it within the run).
    dead_after: float = DEAD_AFTER_SECONDS
    #: The soak types' lease_seconds (short: a killed worker's jobs come back within seconds by lease).
    lease: int = 5
    dedupe_share: float = 0.08
    delayed_share: float = 0.10
    delay_max: float = 15.0
    flaky_share: float = 0.08
    fail_share: float = 0.02
    slow_share: float = 0.05
    pause_ms: float = 0.0
    max_backlog: int = 3000  # producers wait while more jobs than this are Pending
    seed: str = ""

    @classmethod
    def ci(cls, db: str) -> SoakConfig:
        """The short run of the test suite: about 5,000 jobs on PostgreSQL (long enough for every fault:
        the starvation and the pause each take the dead-after time and more, one after the other), one
        kill, one restart; 1,500 on SQLite (fewer faults there). ``seconds`` bounds a hang, not the
        speed: a quiet machine finishes in about a minute, but CI's loaded one took 130 s to enqueue the
        PostgreSQL run's jobs (the stages share two cores), and a run cut by its bound fails."""
        if db == "sqlite":
            # No pause + twin step in the suite's SQLite run: on CI's loaded machine the resumed worker was
            # still running 90 s after its resume in 1 run of 4 (exit None; every correctness check
            # passed, no double run), not diagnosed yet. tests/test_hostile_worker.py holds the same
            # property on SQLite in a test of its own (the first process exits 1, the two never overlap);
            # the PostgreSQL run and `bench/soak.py --db sqlite` keep the step.
            return cls(db=db, jobs=1500, seconds=300, producers=2, workers=2, concurrency=1, kill_every=2.0,
                       max_kills=1, slot_kill_share=0.0, db_restart=False, delay_max=4.0, max_backlog=300,
                       pause_twin=False)
        return cls(db=db, jobs=5000, seconds=360, producers=4, workers=2, concurrency=2, kill_every=2.0,
                   max_kills=1, slot_kill_share=0.0, delay_max=4.0, max_backlog=600)

    def keys(self) -> int:
        """Dedupe keys; every producer enqueues every key."""
        return max(1, round(self.jobs * self.dedupe_share / self.producers))

    def calls_per_producer(self) -> list[int]:
        rest = self.jobs - self.keys() * self.producers
        return [rest // self.producers + (1 if i < rest % self.producers else 0) for i in range(self.producers)]

    def expected_jobs(self) -> int:
        return sum(self.calls_per_producer()) + self.keys()


@dataclass
class WorkerProc:
    name: str
    batch: int | str
    proc: subprocess.Popen
    log: Path
    started: float
    leaving: bool = False  # we are stopping or killing it: its exit is not a crash


@dataclass
class Report:
    config: dict[str, Any]
    run: str
    ok: bool = False
    checks: list[Any] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    chaos: dict[str, Any] = field(default_factory=dict)
    timeline: list[str] = field(default_factory=list)

    def text(self) -> str:
        n, c = self.numbers, self.config
        lines = [
            f"soak run {self.run} on {c['db']} (seed {c['seed']}): {'OK' if self.ok else 'FAILED'}",
            f"  {c['producers']} producers, {n.get('enqueue_calls')} enqueue calls -> {n.get('jobs')} jobs "
            f"{n.get('jobs_by_type')}",
            f"  {n.get('dedupe_calls')} dedupe enqueues of {n.get('dedupe_keys')} keys; "
            f"{n.get('delayed_jobs')} delayed up to {c['delay_max']} s; {n.get('flaky_jobs')} flaky; "
            f"producer retries {n.get('producer_retries')} (ambiguous commits {n.get('producer_ambiguous_commits')}), "
            f"throttled {n.get('producer_throttled_seconds')} s",
            f"  {n.get('worker_processes')} worker processes started ({c['workers']} at a time x {c['concurrency']} "
            f"slots), {n.get('attempt_rows')} attempts, {n.get('side_effects')} side effects",
            f"  final: {n.get('final_status')}",
            f"  killed/lost attempts: {n.get('killed_attempts')} on {n.get('jobs_with_killed_attempts')} jobs; "
            f"non-transactional re-runs: {n.get('nontx_reruns')} (each explained by a never-closed attempt)",
            f"  recovery after kill -9 (next attempt's claim - the kill): {n.get('recovery')}",
            f"  unplanned errors (attempts retried): {n.get('unplanned_errors')}",
            f"  worker logs: {n.get('worker_log')}",
            f"  time: enqueue {n.get('producer_seconds')} s, all finished after {n.get('drain_seconds')} s, "
            f"{n.get('jobs_per_second')} jobs/s; whole run {n.get('run_seconds')} s",
            "  checks:",
            *[ch.line() for ch in self.checks],
        ]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"run": self.run, "ok": self.ok, "config": self.config, "numbers": self.numbers, "chaos": self.chaos,
                "checks": [asdict(ch) for ch in self.checks], "timeline": self.timeline}


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgrp) of a live, non-zombie process, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[2])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def group_alive(pgid: int) -> bool:
    return any((st := _stat(pid)) is not None and st[1] == pgid for pid in _pids())


def slot_pids(supervisor: int) -> list[int]:
    """The supervisor's slot processes: spawned ones run ``spawn_main``; forked ones (a slot's first
    process) have the supervisor's own command line."""
    try:
        with open(f"/proc/{supervisor}/cmdline", "rb") as f:
            own = f.read()
    except OSError:
        own = b""
    out = []
    for pid in _pids():
        st = _stat(pid)
        if st is None or st[0] != supervisor:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"spawn_main" in cmd or (own and cmd == own):
            out.append(pid)
    return out


class Soak:
    """One soak run against a migrated database that Django in this process is set up for."""

    def __init__(self, config: SoakConfig, url: str, workdir: Path,
                 restart_db: Callable[[], None] | None = None, log: Callable[[str], None] | None = None) -> None:
        self.c = config
        self.url = url
        self.workdir = Path(workdir)
        self.restart_db = restart_db
        self.print = log or (lambda s: print(s, flush=True))
        self.run_id = secrets.token_hex(3)
        if not config.seed:
            config.seed = str(random.SystemRandom().randrange(10**9))
        self.rng = random.Random(f"{config.seed}:chaos")
        self.env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings",
                    "SQLQUEUE_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
                    "SQLQUEUE_TEST_DEAD_AFTER": str(config.dead_after),
                    "SQLQUEUE_TEST_HEARTBEAT": str(HEARTBEAT_SECONDS)}
        self.proxy: Any = None
        self.kill_times: list[float] = []  # wall clock of each kill -9, for the recovery times
        self.workers: list[WorkerProc] = []
        self.all_workers: list[WorkerProc] = []
        self.producers: list[subprocess.Popen] = []
        self.next_name = 0
        self.chaos: dict[str, Any] = {"kills": 0, "worker_kills": 0, "slot_kills": 0, "same_name": 0, "new_name": 0}
        self.worker_events: dict[str, Any] = {"crashed": [], "bad_final_exit": [], "final_stopped": 0}
        self.timeline: list[str] = []
        self.t0 = time.monotonic()

    # ----- small helpers -------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {text}"
        self.timeline.append(line)
        self.print(line)

    def _db(self, fn: Callable[[], Any]) -> Any:
        """Run a query of ours; None while the database is down (we reconnect next time)."""
        from django.db import DatabaseError, connection

        try:
            return fn()
        except DatabaseError:
            try:
                connection.close()
            except Exception:
                pass
            return None

    # ----- setup ---------------------------------------------------------------------------------------
    def prepare(self) -> list[int]:
        from django_sqlqueue import jobtypes
        from django_sqlqueue.models import Job, JobType, Worker
        from testproject.soakjobs.jobs import ALL_TYPES, ALWAYS_FAIL_OPTIONS, TYPE_OPTIONS
        from testproject.soakjobs.models import SideEffect

        ids = []
        for name in ALL_TYPES:
            opts = {**(ALWAYS_FAIL_OPTIONS if name == "soak.AlwaysFail" else TYPE_OPTIONS), "lease_seconds": self.c.lease}
            row, _ = JobType.objects.update_or_create(name=name, defaults={**opts, "paused": name == "soak.Dedupe"})
            ids.append(row.pk)
        # Leftovers of an earlier run in the same database would confuse the checks.
        Job.objects.filter(job_type_id__in=ids).delete()
        SideEffect.objects.all().delete()
        Worker.objects.filter(name__startswith="soak-").delete()
        jobtypes.clear_cache()
        return ids

    # ----- processes -----------------------------------------------------------------------------------
    def start_worker(self, name: str | None = None) -> WorkerProc:
        if name is None:
            name = f"soak-{self.run_id}-w{self.next_name}"
            self.next_name += 1
        batch = BATCHES[len(self.all_workers) % len(BATCHES)]
        log = self.workdir / "logs" / f"{name}.{len(self.all_workers)}.log"
        out = open(log, "w", encoding="utf-8")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_queue_worker", "--no-progress", "--worker-name", name,
             "--concurrency", str(self.c.concurrency), "--batch", str(batch), "--grace-seconds", str(GRACE_SECONDS),
             "--log-level", "WARNING"],
            cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        w = WorkerProc(name, batch, proc, log, time.monotonic())
        self.workers.append(w)
        self.all_workers.append(w)
        return w

    def start_producers(self) -> None:
        keys = self.c.keys()
        for i, calls in enumerate(self.c.calls_per_producer()):
            args = [sys.executable, "-m", "bench.soak_produce", "--workdir", str(self.workdir), "--run", self.run_id,
                    "--index", str(i), "--seed", self.c.seed, "--calls", str(calls), "--keys", str(keys),
                    "--fail-share", str(self.c.fail_share), "--flaky-share", str(self.c.flaky_share),
                    "--slow-share", str(self.c.slow_share), "--delayed-share", str(self.c.delayed_share),
                    "--delay-max", str(self.c.delay_max), "--pause-ms", str(self.c.pause_ms),
                    "--max-backlog", str(self.c.max_backlog)]
            out = open(self.workdir / "logs" / f"producer-{i}.log", "w", encoding="utf-8")  # noqa: SIM115
            self.producers.append(subprocess.Popen(args, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL,
                                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            out.close()

    def kill_group(self, w: WorkerProc) -> None:
        w.leaving = True
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        w.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while group_alive(w.proc.pid) and time.monotonic() < deadline:  # slots die with their group
            time.sleep(0.02)
        if w in self.workers:
            self.workers.remove(w)

    # ----- chaos ---------------------------------------------------------------------------------------
    def holders(self) -> set[str]:
        """Names of workers holding a Processing job now (so that a kill hits work in flight)."""
        from django_sqlqueue.models import Job
        from django_sqlqueue.states import Status

        names = self._db(lambda: set(Job.objects.filter(status_id=Status.PROCESSING)
                                     .values_list("worker", flat=True).distinct()))
        return {n.rsplit("/", 1)[0] for n in names or ()}

    def kill_one(self) -> bool:
        """kill -9 a worker (or one slot) that holds jobs; False when none does right now."""
        busy = self.holders()
        live = [w for w in self.workers if w.proc.poll() is None and w.name in busy]
        if not live:
            return False
        w = self.rng.choice(live)
        slots = slot_pids(w.proc.pid)
        self.chaos["kills"] += 1
        self.kill_times.append(time.time())
        if slots and self.rng.random() < self.c.slot_kill_share:
            pid = self.rng.choice(slots)
            os.kill(pid, signal.SIGKILL)
            self.chaos["slot_kills"] += 1
            self.note(f"kill -9 slot pid {pid} of {w.name} (its supervisor restarts it under the same name)")
            return True
        self.kill_group(w)
        self.chaos["worker_kills"] += 1
        same = self.rng.random() < 0.5
        self.chaos["same_name" if same else "new_name"] += 1
        new = self.start_worker(w.name if same else None)
        self.note(f"kill -9 worker {w.name} (pid {w.proc.pid} and its {len(slots)} slots); started "
                  f"{new.name} ({'same' if same else 'new'} name)")
        return True

    def do_pause_twin(self) -> bool:
        """SIGSTOP a busy worker's whole group past its dead-after time, start a twin under its name, SIGCONT.

        What a VM pause or a partition does. The twin takes the paused worker's jobs; the paused one,
        resumed, must find itself replaced and exit 1 without running any of them alongside the twin
        (the no_live_double_runs check).
        """
        from django_sqlqueue.models import Worker

        busy = self.holders()
        live = [w for w in self.workers if w.proc.poll() is None and w.name in busy]
        if not live:
            return False
        w = self.rng.choice(live)
        w.leaving = True
        self.workers.remove(w)
        started = time.monotonic()
        self._stop_outside_write_lock(w)
        self.note(f"SIGSTOP worker {w.name} (pid {w.proc.pid} and its slots) for {self.c.dead_after + 1.5} s")
        try:
            time.sleep(self.c.dead_after + 1.5)
            twin = self.start_worker(w.name)
            # Every slot of the twin registered under the name before the paused one resumes: otherwise
            # nothing replaced it, and it rightly goes on. A bound for a hang (a loaded machine takes tens
            # of seconds to boot a worker), not a speed.
            deadline = time.monotonic() + 150
            registered = False
            while not registered and time.monotonic() < deadline:
                pids = slot_pids(twin.proc.pid)
                registered = len(pids) == self.c.concurrency and self._db(lambda p=pids: Worker.objects.filter(
                    name__startswith=f"{w.name}/", pid__in=p).count()) == self.c.concurrency
                time.sleep(0.1)
            if not registered:
                self.note(f"the twin of {w.name} did not register its slots within 150 s")
        finally:
            os.killpg(w.proc.pid, signal.SIGCONT)
        try:
            code = w.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            code = None
            self.kill_group(w)
        self.chaos["pause_twin"] = {"worker": w.name, "exit": code, "seconds": round(time.monotonic() - started, 1)}
        self.note(f"{w.name} resumed next to its twin and exited with {code}")
        return True

    def _stop_outside_write_lock(self, w: WorkerProc) -> None:
        """SIGSTOP the worker's group; on SQLite, at a moment when it does not hold the write lock.

        SQLite has one writer: a process paused inside a write transaction stops every other writer,
        the twin included, until it resumes (which no queue can change). Such a pause would test nothing
        but the busy timeout, so the group is resumed and paused again until the lock is free.
        """
        import sqlite3

        path = self.c.db == "sqlite" and urlparse(self.url).path
        for _ in range(50):
            os.killpg(w.proc.pid, signal.SIGSTOP)
            if not path:
                return
            probe = sqlite3.connect(path, timeout=0.2, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:  # "database is locked": the paused worker holds it
                os.killpg(w.proc.pid, signal.SIGCONT)
                time.sleep(0.1)
            finally:
                probe.close()
        os.killpg(w.proc.pid, signal.SIGSTOP)
        self.note(f"{w.name} held SQLite's write lock at each of 50 tries: paused with it")

    # ----- PostgreSQL connection faults --------------------------------------------------------------------
    WORKER_ROLE = "soak_worker"

    def route_workers(self) -> None:
        """PostgreSQL: workers log in as a role of their own (so its connections can be limited) through
        the fault proxy (so claim replies can be lost); producers and this process connect directly."""
        from urllib.parse import urlsplit, urlunsplit

        from django.db import connection

        from bench.faultproxy import CuttingProxy

        role = self.WORKER_ROLE
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if not cursor.fetchone():
                cursor.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER")
            cursor.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
            cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
            cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        parts = urlsplit(self.url)
        netloc = f"{role}@{parts.hostname}:{parts.port}"
        if self.c.reply_cuts:
            self.proxy = CuttingProxy(parts.port or 5432, host=parts.hostname or "127.0.0.1")
            netloc = f"{role}@{parts.hostname}:{self.proxy.port}"
        self.env["SQLQUEUE_DATABASE_URL"] = urlunsplit(parts._replace(netloc=netloc))

    def do_reply_cuts(self) -> None:
        self.proxy.arm(3)
        self.chaos["reply_cuts"] = {"armed": 3}
        self.note("fault proxy armed: the replies of the next 3 committed claims are lost")

    def do_starve(self) -> None:
        """The workers' role may open no new connection; every heartbeat connection is cut; after
        DEAD_AFTER_SECONDS + 2 s the limit is lifted. Slots must stop claiming, and running jobs must be
        stopped before others may take them (no_live_double_runs)."""
        from django.db import connection

        role = self.WORKER_ROLE
        started = time.monotonic()
        cut = 0
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER ROLE {role} CONNECTION LIMIT 0")
            # The heartbeat is the supervisor's: its one connection also asks for cancel requests and
            # holds the maintenance lease, so its last statement is any of those (a slot's is a claim, a
            # finish or a handler's). The lease holder's also runs the maintenance passes, so at one look
            # its last statement may be another: look again for a few seconds (a cut connection cannot
            # come back meanwhile: the role may not connect).
            deadline = time.monotonic() + 10.0
            while cut == 0 and time.monotonic() < deadline:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s "
                               "AND (query LIKE %s OR query LIKE %s OR query LIKE %s)",
                               [role, '%"django_sqlqueue_worker"%', '%"django_sqlqueue_cancelrequest"%',
                                '%"django_sqlqueue_maintenancelease"%'])
                cut += len(cursor.fetchall())
                if not cut:
                    time.sleep(0.2)
        self.note(f"connection starvation: {role} may not connect, {cut} heartbeat connections cut")
        try:
            time.sleep(self.c.dead_after + 2.0)
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER ROLE {role} CONNECTION LIMIT -1")
        self.chaos["starve"] = {"heartbeats_cut": cut, "seconds": round(time.monotonic() - started, 1)}
        self.note("connection starvation over")

    def do_restart(self) -> None:
        from django.db import connection

        assert self.restart_db is not None
        self.note("restarting PostgreSQL (pg_ctl stop -m fast; start)")
        started = time.monotonic()
        self.restart_db()
        seconds = round(time.monotonic() - started, 2)
        connection.close()
        self.chaos["db_restart"] = {"seconds": seconds, "at": round(started - self.t0, 1)}
        self.note(f"PostgreSQL back after {seconds} s")

    def wait_started(self, w: WorkerProc, timeout: float = 20.0) -> None:
        """Until the worker's supervisor has started its slots: its SIGTERM handler exists by then. A
        worker still starting (Django's set-up) dies of the signal, as any process would, holding
        nothing; not what the SIGTERM faults test."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and w.proc.poll() is None and len(slot_pids(w.proc.pid)) < self.c.concurrency:
            time.sleep(0.05)

    def do_sigterm(self) -> None:
        live = [w for w in self.workers if w.proc.poll() is None]
        if not live:
            return
        settled = [w for w in live if time.monotonic() - w.started > 5.0]
        w = self.rng.choice(settled) if settled else min(live, key=lambda w: w.started)
        self.wait_started(w)
        w.leaving = True
        started = time.monotonic()
        self.note(f"SIGTERM to worker {w.name} (pid {w.proc.pid})")
        w.proc.send_signal(signal.SIGTERM)
        try:
            code = w.proc.wait(timeout=GRACE_SECONDS + 20)
        except subprocess.TimeoutExpired:
            code = None
            self.kill_group(w)
        seconds = round(time.monotonic() - started, 2)
        self.chaos["sigterm"] = {"worker": w.name, "exit": code, "seconds": seconds}
        if w in self.workers:
            self.workers.remove(w)
        self.note(f"{w.name} exited with {code} after {seconds} s; starting a replacement")
        self.start_worker()

    # ----- the run ---------------------------------------------------------------------------------------
    def progress(self, type_ids: list[int]) -> tuple[int, int] | None:
        """(jobs in the table, jobs finished) for this run's types."""
        from django.db.models import Count

        from django_sqlqueue.models import Job
        from django_sqlqueue.states import FINISHED

        rows = self._db(lambda: list(Job.objects.filter(job_type_id__in=type_ids).values("status_id")
                                     .annotate(n=Count("id")).values_list("status_id", "n")))
        if rows is None:
            return None
        return sum(n for _, n in rows), sum(n for s, n in rows if s in FINISHED)

    def run(self) -> Report:
        from bench.soak_verify import verify

        c = self.c
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        report = Report(config=asdict(c), run=self.run_id)
        type_ids = self.prepare()
        if c.db == "postgres" and (c.reply_cuts or c.starve):
            self.route_workers()
        expected = c.expected_jobs()
        restart_wanted = c.db == "postgres" and c.db_restart and self.restart_db is not None
        self.note(f"run {self.run_id}: {c.jobs} enqueue calls ({expected} distinct jobs) by {c.producers} producers, "
                  f"{c.workers} workers x {c.concurrency} slots, seed {c.seed}")
        try:
            for _ in range(c.workers):
                self.start_worker()
            self.start_producers()
            (self.workdir / "go").touch()
            deadline = self.t0 + c.seconds
            next_kill = time.monotonic() + c.kill_every * self.rng.uniform(0.5, 1.5)
            dedupe_open = False
            finished_at = None
            last_poll = 0.0
            done = finished = 0
            while time.monotonic() < deadline:
                now = time.monotonic()
                for w in list(self.workers):
                    if w.proc.poll() is not None and not w.leaving:
                        self.worker_events["crashed"].append((w.name, w.proc.returncode))
                        self.note(f"worker {w.name} exited on its own with {w.proc.returncode}: starting another")
                        self.workers.remove(w)
                        self.start_worker()
                producers_done = all(p.poll() is not None for p in self.producers)
                if not dedupe_open and all((self.workdir / f"dedupe-done-{i}").exists() or p.poll() is not None
                                           for i, p in enumerate(self.producers)):
                    dedupe_open = self._db(self._open_dedupe) is not None
                    if dedupe_open:
                        self.note("every producer enqueued every dedupe key: soak.Dedupe unpaused")
                if now - last_poll >= 1.0:
                    last_poll = now
                    got = self.progress(type_ids)
                    if got is not None:
                        done, finished = got
                if producers_done and dedupe_open and done >= expected and finished >= done:
                    finished_at = time.monotonic()
                    break
                share = finished / expected
                if restart_wanted and "db_restart" not in self.chaos and share >= 0.3:
                    self.do_restart()
                elif c.sigterm and "sigterm" not in self.chaos and share >= 0.5:
                    self.do_sigterm()
                elif (self.proxy is not None and "reply_cuts" not in self.chaos and share >= 0.2):
                    self.do_reply_cuts()
                elif c.db == "postgres" and c.starve and "starve" not in self.chaos and share >= 0.4:
                    self.do_starve()
                elif c.pause_twin and "pause_twin" not in self.chaos and share >= 0.6 and share < 0.95:
                    if not self.do_pause_twin():
                        time.sleep(0.05)
                elif (c.kill_every > 0 and now >= next_kill and share < 0.97
                      and (c.max_kills is None or self.chaos["kills"] < c.max_kills)):
                    if self.kill_one():
                        next_kill = time.monotonic() + c.kill_every * self.rng.uniform(0.5, 1.5)
                time.sleep(0.2)
            if finished_at is None:
                self.note(f"time is up ({c.seconds} s): {finished} of {expected} jobs finished")
            else:
                self.note(f"all {finished} jobs finished")
            self.stop_workers()
            codes = [p.poll() for p in self.producers]
        finally:
            self.cleanup()
            if self.proxy is not None:
                self.chaos.setdefault("reply_cuts", {})["cut"] = self.proxy.cuts
                self.proxy.close()
        run_seconds = round(time.monotonic() - self.t0, 1)
        numbers: dict[str, Any] = {"worker_log": self.log_stats()}
        checks = verify(run=self.run_id, workdir=self.workdir, producers=c.producers, planned_calls=c.jobs,
                        producer_codes=codes, worker_events=self.worker_events, chaos=self.chaos,
                        chaos_wanted={"min_kills": 1 if c.kill_every > 0 else 0, "db_restart": restart_wanted,
                                      "sigterm": c.sigterm, "pause_twin": c.pause_twin,
                                      "reply_cuts": c.db == "postgres" and c.reply_cuts,
                                      "starve": c.db == "postgres" and c.starve}, numbers=numbers)
        numbers["recovery"] = self.recovery()
        drain = round(finished_at - self.t0, 1) if finished_at else None
        numbers.update(
            run_seconds=run_seconds, drain_seconds=drain,
            jobs_per_second=round(numbers.get("jobs", 0) / drain, 1) if drain else None,
            worker_processes=len(self.all_workers),
            **self.plan_numbers(),
        )
        report.checks, report.numbers, report.chaos = checks, numbers, self.chaos
        report.timeline = self.timeline
        report.ok = all(ch.ok for ch in checks) and finished_at is not None
        return report

    def recovery(self) -> dict[str, Any]:
        """How long jobs interrupted by a kill -9 waited to be claimed again.

        For each attempt that never finished and has a next attempt: the next attempt's claim time minus
        the last kill between the two claims (attempts interrupted by other chaos are not counted).
        """
        import statistics

        from django_sqlqueue.models import JobAttempt

        rows = self._db(lambda: list(JobAttempt.objects.filter(job__job_type__name__startswith="soak.")
                                     .order_by("job_id", "attempt_num", "id")
                                     .values_list("job_id", "attempt_num", "claimed_at", "finished_at")))
        waits = []
        for (job, _num, claimed, finished), (job2, _num2, claimed2, _f2) in zip(rows or [], (rows or [])[1:], strict=False):
            if job != job2 or finished is not None:
                continue
            start, end = claimed.timestamp(), claimed2.timestamp()
            kills = [t for t in self.kill_times if start <= t <= end]
            if kills:
                waits.append(end - max(kills))
        if not waits:
            return {"interrupted": 0}
        return {"interrupted": len(waits), "median_s": round(statistics.median(waits), 1),
                "max_s": round(max(waits), 1)}

    def _open_dedupe(self) -> bool:
        from django_sqlqueue.models import JobType

        JobType.objects.filter(name="soak.Dedupe").update(paused=False)
        return True

    def stop_workers(self) -> None:
        """SIGTERM every worker at once; each must exit 0 within the grace period."""
        for w in self.workers:
            self.wait_started(w)
        for w in self.workers:
            w.leaving = True
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        for w in list(self.workers):
            try:
                code = w.proc.wait(timeout=GRACE_SECONDS + 20)
            except subprocess.TimeoutExpired:
                code = None
                self.kill_group(w)
            if code == 0:
                self.worker_events["final_stopped"] += 1
            else:
                self.worker_events["bad_final_exit"].append((w.name, code))
        self.note(f"workers stopped: {self.worker_events['final_stopped']} exited 0, "
                  f"{len(self.worker_events['bad_final_exit'])} did not")

    def cleanup(self) -> None:
        """Kill whatever is left of our processes (a failed or interrupted run)."""
        for w in self.all_workers:
            if w.proc.poll() is None or group_alive(w.proc.pid):
                self.kill_group(w)
        for p in self.producers:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)

    def plan_numbers(self) -> dict[str, Any]:
        from bench.soak_produce import parse, plan

        delayed = flaky = 0
        for i, calls in enumerate(self.c.calls_per_producer()):
            args = parse(["--workdir", ".", "--run", self.run_id, "--index", str(i), "--seed", self.c.seed,
                          "--calls", str(calls), "--keys", "0", "--fail-share", str(self.c.fail_share),
                          "--flaky-share", str(self.c.flaky_share), "--slow-share", str(self.c.slow_share),
                          "--delayed-share", str(self.c.delayed_share), "--delay-max", str(self.c.delay_max)])
            for spec in plan(args):
                delayed += "delay" in spec
                flaky += "fail" in spec
        return {"delayed_jobs": delayed, "flaky_jobs": flaky}

    def log_stats(self) -> dict[str, int]:
        patterns = {"database_unavailable": "database_unavailable", "database_back": "database_back",
                    "slot_died": "slot_died", "results_refused": "job_result_refused",
                    "lease_lost": "lease_lost", "tracebacks": "Traceback (most recent call last)"}
        counts = dict.fromkeys(patterns, 0)
        crashes: dict[str, int] = {}
        for path in (self.workdir / "logs").glob("soak-*.log"):
            text = path.read_text(encoding="utf-8", errors="replace")
            for key, pattern in patterns.items():
                counts[key] += text.count(pattern)
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if "slot_died" in line or "slot_killed" in line:  # shown when no_crashes fails
                    self.worker_events.setdefault("slot_lines", []).append(f"{path.name}: {line[:300]}")
                if line.startswith("Traceback (most recent call last)"):
                    # The exception line: the first one after the frames that is not indented.
                    last = next((x for x in lines[i + 1:] if x and not x[0].isspace()), "?")[:160]
                    crashes[last] = crashes.get(last, 0) + 1
        self.worker_events["crashes"] = crashes
        self.worker_events["slot_died"] = counts["slot_died"]
        return counts


# ----- command line ----------------------------------------------------------------------------------------
def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--jobs", type=int, default=None, help="enqueue calls in all (default 50000; SQLite 10000)")
    p.add_argument("--seconds", type=float, default=None, help="hard bound of the run (default 600)")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--workers", type=int, default=None, help="worker processes (default 4; SQLite 2)")
    p.add_argument("--concurrency", type=int, default=2, help="slots per worker (default 2)")
    p.add_argument("--kill-every", type=float, default=4.0, help="seconds between kills (0: no kills)")
    p.add_argument("--max-kills", type=int, default=None)
    p.add_argument("--no-db-restart", action="store_true")
    p.add_argument("--no-sigterm", action="store_true")
    p.add_argument("--no-pause", action="store_true", help="no pause + same-name twin")
    p.add_argument("--no-connection-faults", action="store_true",
                   help="PostgreSQL: no lost claim replies, no connection starvation")
    p.add_argument("--lease", type=int, default=5, help="the soak types' lease_seconds (default 5; production: 60)")
    p.add_argument("--dead-after", type=float, default=DEAD_AFTER_SECONDS,
                   help=f"the workers' WORKER_DEAD_AFTER_SECONDS (default {DEAD_AFTER_SECONDS:g}; production: 60)")
    p.add_argument("--seed", default="")
    p.add_argument("--database-url", default="",
                   help="use this (loopback, migrated or empty) database instead of a throwaway one; "
                        "no database restart then")
    p.add_argument("--json", default="", help="also write the report to this file")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, manifests)")
    a = p.parse_args(argv)
    for name, low in (("jobs", 10), ("seconds", 10), ("producers", 1), ("workers", 2), ("concurrency", 1)):
        value = getattr(a, name)
        if value is not None and value < low:
            p.error(f"--{name} must be at least {low}")
    if a.max_kills is not None and a.max_kills < 0:
        p.error("--max-kills must be >= 0")
    if a.kill_every < 0:
        p.error("--kill-every must be >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sqlite = a.db == "sqlite"
    config = SoakConfig(
        db=a.db, jobs=a.jobs or (10_000 if sqlite else 50_000), seconds=a.seconds or 600.0, producers=a.producers,
        workers=a.workers or (2 if sqlite else 4), concurrency=a.concurrency, kill_every=a.kill_every,
        max_kills=a.max_kills, db_restart=not a.no_db_restart and not sqlite, sigterm=not a.no_sigterm, seed=a.seed,
        slot_kill_share=0.35, pause_twin=not a.no_pause, reply_cuts=not a.no_connection_faults,
        starve=not a.no_connection_faults, dead_after=a.dead_after, lease=a.lease,
    )
    workdir = Path(tempfile.mkdtemp(prefix="sqlqueue-soak-"))
    cluster = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))  # unwind through the cleanup below
    try:
        if a.database_url:
            host = urlparse(a.database_url).hostname
            if not a.database_url.startswith("sqlite:") and host not in LOOPBACK:
                print(f"refusing {host!r}: the soak talks to loopback only", file=sys.stderr)
                return 2
            url = a.database_url
        elif sqlite:
            url = f"sqlite:///{workdir}/soak.sqlite3"
        else:
            from tests.pgcluster import PgCluster

            cluster = PgCluster().start()
            url = cluster.url
        os.environ["SQLQUEUE_DATABASE_URL"] = url
        os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        restart = cluster.restart if cluster is not None else None
        report = Soak(config, url, workdir, restart_db=restart).run()
        print()
        print(report.text())
        if a.json:
            Path(a.json).write_text(json.dumps(report.as_json(), indent=2, default=str), encoding="utf-8")
        if a.keep:
            print(f"logs and manifests kept in {workdir}")
        return 0 if report.ok else 1
    finally:
        from django.db import connections

        try:
            connections.close_all()
        except Exception:
            pass
        if cluster is not None:
            cluster.destroy()
        if not a.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
