"""A fleet on one database: W worker processes (distinct host names) against one throwaway PostgreSQL.

    python bench/fleet.py                                # W = 1 and 40, 2 slots each; pickup 4 vs 1 slot
    python bench/fleet.py --workers 1,10 --slots 2 --idle-seconds 20 --pickup-jobs 40
    python bench/fleet.py --before /work/main            # the same measurements with another checkout's
                                                         #  workers, side by side (before/after a change)

For each fleet it reports, while the fleet is idle: the connections the fleet holds (pg_stat_activity,
by the application_name its URL sets), the statements per second it sends (pg_stat_statements calls)
and the database's CPU (utime + stime of every server process, from /proc, as a share of one core);
then, for a trickle of jobs (one at a time, a random 0.2-0.6 s apart, so every slot is idle and waits
again), the pickup time (the job's started_at - enqueued_at, both from the database clock) p50 and p99;
and the fleet's resident memory (RSS of every worker process). Then the pickup of one worker with 4
slots against one with 1 slot (a notification wakes one idle slot, not all of them).

Each worker runs in a UTS namespace of its own (``unshare --uts``, root only) with its own host name, as
a fleet of hosts would: a worker sweeps the rows of ITS host for processes that are gone, so 40 workers
on one host name would each look at all 40 x S rows. Without ``unshare`` they share the host name
(printed). The cluster is tests/pgcluster.py (fsync off), max_connections raised to 1000 so that a
fleet that needs more connections than its budget shows its count instead of failing.

The measurements are functions (``measure_idle``, ``measure_pickup``, ``fleet_memory``) that take a
running :class:`Fleet`; a new one (maintenance statements per minute, a backlog) is one more function
and one more column. Not run in CI: it prints numbers for docs/scaling.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# ----- the fleet ------------------------------------------------------------------------------------------
@dataclass
class Fleet:
    """W ``run_queue_worker`` processes of one checkout (``repo``), each on its own host name."""

    url: str
    workers: int
    slots: int
    repo: Path = REPO
    label: str = "fleet"
    procs: list[subprocess.Popen] = field(default_factory=list)
    app: str = ""
    logs: list[Path] = field(default_factory=list)

    def start(self, tmp: Path) -> Fleet:
        self.app = f"{self.label}-{uuid.uuid4().hex[:6]}"
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "SQLQUEUE_LOG_LEVEL": "WARNING",
               "SQLQUEUE_DATABASE_URL": f"{self.url}?application_name={self.app}", "PYTHONDONTWRITEBYTECODE": "1"}
        unshare = shutil.which("unshare") if os.geteuid() == 0 else None
        for i in range(self.workers):
            host = f"{self.label}-host{i}"
            cmd = [sys.executable, str(self.repo / "manage.py"), "run_queue_worker", "--no-progress",
                   "--concurrency", str(self.slots), "--worker-name", f"{host}:w"]
            if unshare:
                cmd = [unshare, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
            log = tmp / f"{host}.log"
            self.logs.append(log)
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=self.repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        return self

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Every slot of every worker has registered (a live worker row)."""
        from django_sqlqueue.models import Worker

        want = self.workers * self.slots
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            live = Worker.objects.filter(stopped_at=None, name__startswith=f"{self.label}-host").count()
            if live >= want:
                time.sleep(3.0)  # a few beats: every connection a worker keeps is open now
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a worker exited: see {self.logs}")
            time.sleep(0.5)
        raise RuntimeError(f"only {live} of {want} slots registered after {timeout} s")

    def stop(self) -> None:
        import signal

        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        from django_sqlqueue.models import Worker

        Worker.objects.all().delete()


# ----- measurements: each takes a running fleet, returns {column: value} ----------------------------------
def measure_idle(fleet: Fleet, cluster, seconds: float) -> dict[str, float]:
    """Connections held, statements/s and database CPU while nothing is enqueued."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [fleet.app])
        conns = cursor.fetchone()[0]
        cursor.execute("SELECT pg_stat_statements_reset()")
    cpu0, t0 = server_cpu_seconds(cluster), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = server_cpu_seconds(cluster), time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                       "ON d.oid = s.dbid WHERE d.datname = current_database() AND s.query NOT LIKE %s "
                       "AND s.query NOT LIKE %s", ["%pg_stat_statements%", "%pg_stat_activity%"])
        calls = float(cursor.fetchone()[0])
        if os.environ.get("FLEET_BREAKDOWN"):  # which statements the idle fleet sends, most frequent first
            cursor.execute("SELECT calls, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) FROM "
                           "pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = "
                           "current_database() ORDER BY calls DESC LIMIT 25")
            for n, q in cursor.fetchall():
                print(f"    {n / (t1 - t0):6.2f}/s  {q}", flush=True)
    return {"conns": conns, "conns/worker": conns / fleet.workers, "stmts/s": calls / (t1 - t0),
            "db cpu %": 100.0 * (cpu1 - cpu0) / (t1 - t0)}


def measure_pickup(fleet: Fleet, jobs: int) -> dict[str, float]:
    """A trickle of jobs, one at a time: started_at - enqueued_at, p50 and p99 (ms)."""
    from django_sqlqueue.models import Job
    from django_sqlqueue.states import Status

    out = []
    for _ in range(jobs):
        time.sleep(random.uniform(0.2, 0.6))  # every slot idle and waiting again
        job = Job.objects.enqueue("test.Noop")
        end = time.monotonic() + 60
        while Job.objects.filter(pk=job.pk, status_id=Status.COMPLETED).count() == 0:
            if time.monotonic() > end:
                raise RuntimeError(f"job {job.pk} not done in 60 s")
            time.sleep(0.01)
        job.refresh_from_db()
        out.append((job.started_at - job.enqueued_at).total_seconds() * 1000)
    out.sort()
    return {"pickup p50 ms": statistics.median(out), "pickup p99 ms": out[min(len(out) - 1, int(len(out) * 0.99))]}


def fleet_memory(fleet: Fleet) -> dict[str, float]:
    """Resident memory of every process of the fleet (supervisors and slots), GiB."""
    total = 0
    for p in fleet.procs:
        for pid in _tree(p.pid):
            total += _status_kib(pid, "VmRSS")
    return {"rss GiB": total / 1024 / 1024}


# ----- helpers --------------------------------------------------------------------------------------------
def server_cpu_seconds(cluster) -> float:
    """utime + stime of the postmaster and every server process (its children), in seconds."""
    with open(os.path.join(cluster.data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in [postmaster, *_children(postmaster)]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / ticks


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += _children(pid)
    return out


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_cluster():
    from tests.pgcluster import PgCluster

    cluster = PgCluster().start()
    import psycopg

    with psycopg.connect(cluster.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 1000")
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    cluster.restart()
    with psycopg.connect(cluster.url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return cluster


def print_table(rows: list[dict[str, object]]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    widths = {c: max(len(c), *(len(_fmt(r.get(c, ""))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c, "")).rjust(widths[c]) for c in columns), flush=True)


def _fmt(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


# ----- main -----------------------------------------------------------------------------------------------
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,40", help="comma-separated fleet sizes (default 1,40)")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--idle-seconds", type=float, default=20.0)
    p.add_argument("--pickup-jobs", type=int, default=40)
    p.add_argument("--before", type=Path, help="also run every fleet with this checkout's workers")
    p.add_argument("--no-slot-compare", action="store_true", help="skip the 4-slot vs 1-slot pickup")
    args = p.parse_args()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the fleet and the cluster (finally blocks)
    cluster = start_cluster()
    try:
        os.environ.update(SQLQUEUE_DATABASE_URL=cluster.url, DJANGO_SETTINGS_MODULE="testproject.settings",
                          SQLQUEUE_LOG_LEVEL="WARNING")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        repos = [("after", REPO)] + ([("before", args.before.resolve())] if args.before else [])
        print(f"cpu count {os.cpu_count()}; host names per worker: "
              f"{'yes (unshare --uts)' if os.geteuid() == 0 and shutil.which('unshare') else 'no (shared)'}")
        rows: list[dict[str, object]] = []
        runs = [(w, args.slots) for w in map(int, args.workers.split(","))]
        if not args.no_slot_compare:
            runs += [(1, 4), (1, 1)]
        with tempfile.TemporaryDirectory(prefix="sqlqueue-fleet-") as tmp:
            for workers, slots in runs:
                for label, repo in repos:
                    fleet = Fleet(cluster.url, workers, slots, repo, label=f"f{label}").start(Path(tmp))
                    try:
                        fleet.wait_ready()
                        row: dict[str, object] = {"code": label, "W": workers, "S": slots}
                        row.update(measure_idle(fleet, cluster, args.idle_seconds))
                        row.update(measure_pickup(fleet, args.pickup_jobs))
                        row.update(fleet_memory(fleet))
                        rows.append(row)
                        print_table([row])
                    finally:
                        fleet.stop()
        print()
        print_table(rows)
    finally:
        cluster.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
