"""The worker row and the heartbeat thread that keeps it fresh and renews the leases of held jobs.

The thread uses its own database connection (Django connections are per thread) and closes it when
it ends. It beats every ``HEARTBEAT_SECONDS``, or every third of the shortest lease among the jobs the
slot holds when that is sooner, so a job is never reclaimed while its worker is alive.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from django.db import IntegrityError, connections, transaction
from django.db.models import DateTimeField, F, Q
from django.db.models.expressions import RawSQL

from .conf import get_settings
from .dialects import get_dialect
from .exceptions import WorkerNameInUse
from .support import DB_DOWN_ERRORS, close_connection, db_now, one_line, pid_alive

log = logging.getLogger("django_sqlqueue.worker")


def register(name: str, using: str) -> bool:
    """Take the worker row at start (host, pid, started now, heartbeat now, not stopped), if it is free.

    A claim treats Processing jobs held by its own name as its own leftovers and takes them back at
    once, so two live workers under one name would run each other's jobs twice. The name is free
    when its row is missing, stopped, or its heartbeat is older than ``WORKER_DEAD_AFTER_SECONDS``,
    or when the row was written from this host by a process that no longer exists (a restart) or by
    this very process. Otherwise :class:`WorkerNameInUse` is raised and nothing is written.

    The test and the write are one conditional UPDATE (or an INSERT that the unique name decides), so
    two workers starting at the same moment under one name cannot both get it.
    """
    from .models import Worker

    host, pid = socket.gethostname()[:200], os.getpid()
    now = db_now(using)
    values = {"host": host, "pid": pid, "started_at": now, "last_heartbeat": now, "stopped_at": None}
    rows = Worker.objects.using(using)
    dead_after = get_settings().WORKER_DEAD_AFTER_SECONDS
    stale = RawSQL(get_dialect(connections[using]).now_plus("%s"), [-float(dead_after)],
                   output_field=DateTimeField())
    free = Q(stopped_at__isnull=False) | Q(last_heartbeat__lt=stale)
    for _ in range(5):
        holder = rows.filter(name=name).exclude(free).values("host", "pid", "last_heartbeat").first()
        mine = free
        if holder is not None:
            if holder["host"] != host or (holder["pid"] != pid and pid_alive(holder["pid"])):
                raise WorkerNameInUse(
                    f"worker name {name!r} is in use by a live worker: host {holder['host']!r}, pid "
                    f"{holder['pid']}, last heartbeat {holder['last_heartbeat']:%Y-%m-%d %H:%M:%S} UTC. Two "
                    f"live workers under one name would run each other's jobs twice: stop that worker or "
                    f"give this one another --worker-name (a worker that died on another host frees its "
                    f"name once its heartbeat is WORKER_DEAD_AFTER_SECONDS={dead_after:g} s old)")
            mine = free | Q(host=host, pid=holder["pid"])
        if rows.filter(mine, name=name).update(**values):
            return True
        if holder is None and not rows.filter(name=name).exists():
            try:
                with transaction.atomic(using=using):
                    rows.create(name=name, **values)
                return True
            except IntegrityError:
                pass  # another worker created it just now: look again
    raise WorkerNameInUse(f"worker name {name!r} keeps changing hands; is another worker starting under it?")


def mark_stopped(name: str, using: str, jobs_done: int = 0) -> int:
    """Stamp stopped_at: the claim then treats this worker as dead and takes its jobs at once."""
    from .models import Worker

    return Worker.objects.using(using).filter(name=name).update(
        stopped_at=db_now(using), last_heartbeat=db_now(using), jobs_done=F("jobs_done") + jobs_done)


class Heartbeat:
    """Jobs a slot holds (id -> lease seconds) and the thread that renews them."""

    def __init__(self, name: str, using: str, heartbeat_seconds: float, *, exit_with_parent: bool) -> None:
        self.name = name
        self.using = using
        self.heartbeat_seconds = heartbeat_seconds
        self._held: dict[int, int] = {}
        self._done = 0  # jobs finished since the last beat (added to the row's jobs_done)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._parent = os.getppid() if exit_with_parent else None

    # ----- called by the worker's main thread ----------------------------------------------------
    def hold(self, leases: dict[int, int]) -> None:
        with self._lock:
            self._held.update(leases)
        self._wake.set()  # a short lease may need an earlier renewal than planned

    def drop(self, job_id: int, *, finished: bool) -> None:
        with self._lock:
            self._held.pop(job_id, None)
            self._done += finished

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def take_done(self) -> int:
        with self._lock:
            done, self._done = self._done, 0
            return done

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"sqlqueue-heartbeat-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ----- the thread ----------------------------------------------------------------------------
    def interval(self) -> float:
        with self._lock:
            shortest = min(self._held.values(), default=None)
        interval = self.heartbeat_seconds
        if shortest is not None:
            interval = min(interval, shortest / 3)
        return max(0.05, interval)

    def _loop(self) -> None:
        next_beat = time.monotonic() + self.interval()
        try:
            while not self._stop:
                self._wake.wait(max(0.0, next_beat - time.monotonic()))
                self._wake.clear()
                if self._stop:
                    break
                if self._parent is not None and os.getppid() != self._parent:
                    os._exit(1)  # the supervisor is gone, so are we: our jobs are reclaimed by lease or name
                now = time.monotonic()
                if now < next_beat:  # woken early by a claim: a shorter lease may need an earlier beat
                    next_beat = min(next_beat, now + self.interval())
                    continue
                try:
                    self.beat()
                except DB_DOWN_ERRORS as exc:
                    log.info("heartbeat_failed worker=%s error=%s", self.name, one_line(exc))
                    close_connection(self.using)
                except Exception:
                    log.exception("heartbeat_error worker=%s", self.name)
                next_beat = time.monotonic() + self.interval()
        finally:
            connections.close_all()  # this thread's connections only

    def beat(self) -> None:
        """Renew the held jobs' leases (grouped by lease length) and stamp the worker row."""
        from .models import Job, Worker

        with self._lock:
            held = dict(self._held)
        by_lease: dict[int, list[int]] = {}
        for job_id, lease in held.items():
            by_lease.setdefault(lease, []).append(job_id)
        for lease, ids in by_lease.items():
            kept = Job.objects.renew_leases(self.name, ids, lease, using=self.using)
            if kept < len(ids):
                log.info("lease_lost worker=%s jobs=%s held=%s", self.name, len(ids) - kept, len(ids))
        done = self.take_done()
        try:
            Worker.objects.using(self.using).filter(name=self.name).update(
                last_heartbeat=db_now(self.using), jobs_done=F("jobs_done") + done)
        except BaseException:
            with self._lock:
                self._done += done  # counted at the next beat instead
            raise
