"""The worker row and the heartbeat thread that keeps it fresh and renews the leases of held jobs.

The thread uses its own database connection (Django connections are per thread) and closes it when
it ends. It beats every ``HEARTBEAT_SECONDS``, or every quarter of the *window* when that is sooner:
the window is the shortest of ``WORKER_DEAD_AFTER_SECONDS`` and the leases of the jobs the slot holds,
the time after which other workers may take its jobs if no beat gets through.

Standing. A slot whose beats do not get through (no connection slot left for its heartbeat, a network
partition, a process paused by SIGSTOP or a VM freeze) will have its jobs taken by others once the
window has passed, while it may still be running them. So the heartbeat keeps the time of the last
beat that got through (``ok_at``, measured before the beat was sent) and the slot acts on it:

- past :data:`CLAIM_SHARE` of the window it claims nothing and hands back its unstarted jobs;
- past :data:`STOP_SHARE` of the window its running job is *at risk*: ``should_stop()`` says so, and a
  supervisor kills the slot (before the window ends, so that others never run the job alongside it);
- a beat that finds the worker row under another incarnation (the name was taken over while this
  process was paused) marks the slot *replaced*: it stops at once and exits.

Under a supervisor the slot's thread does no database work (``link``): it reports what the slot holds
and runs to the supervisor (a :class:`~django_sqlqueue.worker.contract.SlotReport` on a pipe, at once
after a claim and every ``REPORT_SECONDS``), whose one connection beats for all its slots in one
statement per table (beats.py), and applies the answers (:class:`BeatResult`). The standing rules
above are the same; only the clocks come from the supervisor's beats. The supervisor renews a slot's
leases only while that slot keeps reporting: a stuck or stopped slot process lets its leases lapse,
exactly as its own heartbeat thread would have.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as wait_for
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import DateTimeField, F, Q
from django.db.models.expressions import RawSQL

from ..conf import get_settings
from ..dialects import get_dialect, hello_payload
from ..exceptions import WorkerNameInUse
from .contract import BeatResult, SlotReport
from .support import (
    DB_DOWN_ERRORS,
    close_connection,
    db_now,
    lease_ran_out,
    one_line,
    process_gone,
    process_key,
)

log = logging.getLogger("django_sqlqueue.worker")
#: The line a slot logs when a beat finds some of its jobs lost (the supervisor's beat or its own).
LEASE_LOST = ("lease_lost worker=%s jobs=%s (taken over by another worker, or the lease ran out and a claim gave "
              "the job's concurrency permit to another job)")

#: Shares of the window (see the module docstring): stop claiming, then treat the running job as lost.
CLAIM_SHARE = 0.5
STOP_SHARE = 0.8
#: After a failed beat, the next try comes this soon (or at the normal interval, if sooner).
RETRY_SECONDS = 1.0
#: Under a supervisor: a slot reports at least this often (its liveness: see beats.py).
REPORT_SECONDS = 1.0


def register(name: str, using: str, incarnation: str = "", queues: Sequence[str] = (),
             types: Sequence[str] = ()) -> bool:
    """Take the worker row at start (host, pid, started now, heartbeat now, not stopped), if it is free.

    A claim treats Processing jobs held by its own name as its own leftovers and takes them back at
    once, so two live workers under one name would run each other's jobs twice. The name is free
    when its row is missing, stopped, or its heartbeat is older than ``WORKER_DEAD_AFTER_SECONDS``,
    or when the row was written from this host by a process that no longer exists (a restart) or by
    this very process. Otherwise :class:`WorkerNameInUse` is raised and nothing is written.

    The test and the write are one conditional UPDATE (or an INSERT that the unique name decides), so
    two workers starting at the same moment under one name cannot both get it. The row gets this
    process's ``incarnation``: a process the name was taken from learns it at its next beat, and the
    ``queues`` and ``types`` it serves (empty: all), for the admin.
    """
    from ..models import Worker

    host, pid = socket.gethostname()[:200], os.getpid()
    now = db_now(using)
    values = {"host": host, "pid": pid, "started_at": now, "last_heartbeat": now, "stopped_at": None,
              "incarnation": incarnation, "queues": list(queues), "types": list(types), "process": process_key(),
              "stamp_until": None}
    rows = Worker.objects.using(using)
    dead_after = get_settings().WORKER_DEAD_AFTER_SECONDS
    stale = RawSQL(get_dialect(connections[using]).now_plus("%s"), [-float(dead_after)],
                   output_field=DateTimeField())
    free = Q(stopped_at__isnull=False) | Q(last_heartbeat__lt=stale)
    for _ in range(5):
        holder = rows.filter(name=name).exclude(free).values("host", "pid", "last_heartbeat", "process").first()
        mine = free
        if holder is not None:
            if not _holder_gone(holder, host, pid):
                unproved = holder["host"] == host and not (holder["process"] and process_key())
                raise WorkerNameInUse(
                    f"worker name {name!r} is in use by a live worker: host {holder['host']!r}, pid "
                    f"{holder['pid']}, last heartbeat {holder['last_heartbeat']:%Y-%m-%d %H:%M:%S} UTC. Two "
                    f"live workers under one name would run each other's jobs twice: stop that worker or "
                    f"give this one another --worker-name (a worker that died on another host frees its "
                    f"name once its heartbeat is WORKER_DEAD_AFTER_SECONDS={dead_after:g} s old)"
                    + (". This process cannot prove that one is gone (no process key: a PID namespace "
                       "without its own /proc, or a row of an older version), so it waits for that "
                       "heartbeat to go stale" if unproved else ""))
            mine = free | Q(host=host, pid=holder["pid"], process=holder["process"])
        if rows.filter(mine, name=name).update(**values):
            return _hello(using, host)
        if holder is None and not rows.filter(name=name).exists():
            try:
                with transaction.atomic(using=using):
                    rows.create(name=name, **values)
                return _hello(using, host)
            except IntegrityError:
                pass  # another worker created it just now: look again
    raise WorkerNameInUse(f"worker name {name!r} keeps changing hands; is another worker starting under it?")


def _hello(using: str, host: str) -> bool:
    """Tell the workers of this host that a row of it was registered (where workers LISTEN): they read
    their host's rows for the sweep of gone processes at once (:class:`HostSweep`), so an idle worker
    need not read them on a short timer. Never the registration's failure. Returns True."""
    channel = get_settings().NOTIFY_CHANNEL
    connection = connections[using]
    sql = get_dialect(connection).notify_sql() if channel else None
    if sql:
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, [channel, hello_payload(host)])
        except DatabaseError as exc:
            log.info("hello_failed host=%s error=%s", host, one_line(exc))
    return True


def _holder_gone(holder: dict[str, Any], host: str, pid: int) -> bool:
    """May a worker of this host take a name whose row looks live? Only when it can prove the row is
    this very process's, or that its process is gone: judged by the process key (boot, PID namespace,
    pid, start time), so a pid reused since, or a container that shares the hostname but not the PID
    namespace, never frees a live worker's name.

    Without a key on either side nothing is proved, and the name waits for the holder's heartbeat to go
    stale: a pid alone proves nothing where PID namespaces share a host's ``/proc`` (``unshare --pid``
    without ``--mount-proc``: every supervisor is pid 1, its slots 2, 3 ..., and ``process_key()`` is
    empty), and two live workers under one name would run one job twice at once (issue 31)."""
    if holder["host"] != host or not holder["process"]:
        return False
    own = process_key()
    if not own:
        return False
    return holder["process"] == own or process_gone(holder["process"])


def mark_stopped(name: str, using: str, jobs_done: int = 0, incarnation: str | None = None) -> int:
    """Stamp stopped_at: the claim then treats this worker as dead and takes its jobs at once.

    With ``incarnation``, only if the row is still that incarnation's (never stop a replacement's row).
    """
    from ..models import Worker

    rows = Worker.objects.using(using).filter(name=name)
    if incarnation is not None:
        rows = rows.filter(incarnation=incarnation)
    return rows.update(
        stopped_at=db_now(using), last_heartbeat=db_now(using), jobs_done=F("jobs_done") + jobs_done)


def sweep_gone_workers(using: str) -> list[str]:
    """Mark stopped the live-looking worker rows of THIS host whose process is gone; return their names.

    A worker killed with ``kill -9`` (its whole process group: no supervisor left to say so) keeps a
    fresh-looking heartbeat for up to ``WORKER_DEAD_AFTER_SECONDS``, and its running jobs wait that
    long. Any worker of the same host can tell at once that the process no longer exists (pid gone, or
    reused by a process that started at another time: support.process_key); stamping the row stopped
    lets the next claim take those jobs, exactly as after a clean stop. The update is conditional on
    the row still being that process's (name, incarnation, process), so a restart that took the name
    meanwhile is never stopped. A one-off sweep: the supervisor keeps a :class:`HostSweep`, which reads
    the rows seldom.
    """
    return HostSweep(using, reread_seconds=0.0).run(0.0)


HostRow = tuple[str, str, str]  # name, incarnation, process key


def _host_rows(using: str) -> list[HostRow]:
    """The live-looking worker rows of this host that carry a process key."""
    from ..models import Worker

    rows = Worker.objects.using(using).filter(host=socket.gethostname()[:200], stopped_at__isnull=True)
    return list(rows.exclude(process="").values_list("name", "incarnation", "process"))


def _stop_gone(using: str, rows: Sequence[HostRow]) -> list[str]:
    """Stamp stopped the rows of ``rows`` whose process is gone (each still that process's row)."""
    from ..models import Worker

    gone = []
    for name, incarnation, process in rows:
        if process_gone(process) and Worker.objects.using(using).filter(
                name=name, incarnation=incarnation, process=process, stopped_at__isnull=True).update(
                stopped_at=db_now(using)):
            gone.append(name)
    if gone:
        log.warning("workers_gone host=%s workers=%s (their processes no longer exist: their jobs are taken "
                    "at once)", socket.gethostname()[:200], ",".join(gone))
    return gone


class HostSweep:
    """The supervisor's sweep (:func:`sweep_gone_workers`), which reads the database seldom.

    The sweep runs every couple of seconds so that a worker killed with ``kill -9`` has its jobs taken
    at once. Whether a process is gone is a question for this host's ``/proc``, not for the database;
    only the list of this host's workers comes from there, and it changes when a worker starts. So the
    rows are read every ``reread_seconds`` and each run checks the processes of the rows last read: an
    idle fleet sent one read per worker every 2 s before, one per worker every ``reread_seconds`` now
    (a statement only when a process is gone). A worker that registered after the last read and dies
    before the next one is found at that read; the supervisor rereads at least three times within
    ``WORKER_DEAD_AFTER_SECONDS``, so that is still sooner than its heartbeat would go stale.

    Where the worker LISTENs (PostgreSQL), a newly registered row of the host says hello on the channel
    (:func:`register`) and the listener calls :meth:`reread`; the rows are then read on that hello, after
    each LISTEN (hellos sent meanwhile went unheard) and every ``listening_reread_seconds`` (300 s) as a
    backstop: an idle worker reads them about once in five minutes instead of three times a minute.
    """

    def __init__(self, using: str, reread_seconds: float, *, listening: Callable[[], bool] = lambda: False,
                 listening_reread_seconds: float = 300.0) -> None:
        self.using = using
        self.reread_seconds = reread_seconds
        #: While the worker LISTENs, a row registered on this host says hello (:meth:`reread` at once),
        #: so the rows are read on this longer backstop only.
        self.listening = listening
        self.listening_reread_seconds = listening_reread_seconds
        self.reads = 0
        self._rows: list[HostRow] | None = None
        self._read_at = 0.0
        self._stale = False

    def reread(self) -> None:
        """A worker of this host registered (its hello), or hellos may have gone unheard (LISTEN again):
        read the rows at the next run. Safe from any thread."""
        self._stale = True

    def run(self, now: float) -> list[str]:
        """One sweep at ``now`` (monotonic); returns the names stamped stopped."""
        every = self.listening_reread_seconds if self.listening() else self.reread_seconds
        if self._rows is None or self._stale or now - self._read_at >= every:
            self._stale = False
            self.reads += 1
            self._rows, self._read_at = _host_rows(self.using), now
        gone = [row for row in self._rows if process_gone(row[2])]
        if not gone:
            return []
        stopped = _stop_gone(self.using, gone)  # a database error leaves them listed: the next run retries
        self._rows = [row for row in self._rows if row not in gone]  # stamped now, or taken by another
        return stopped


_UNSET: Any = object()


class Heartbeat:
    """Jobs a slot holds (id -> lease seconds), the thread that renews them, and the slot's standing.

    Two clocks decide whether a job is safe to keep running, both measured from a moment before the
    database stamped them (monotonic, this process): the worker row's, ``ok_at`` (the last beat that
    got through) against ``WORKER_DEAD_AFTER_SECONDS``; and each held job's lease, renewed by its claim
    and by every good beat since, against its lease length.
    """

    def __init__(self, name: str, using: str, heartbeat_seconds: float, *, exit_with_parent: bool,
                 incarnation: str = "", dead_after: float = 60.0,
                 on_beat: Callable[[Heartbeat], None] | None = None, cancel_check: float = 1.0,
                 on_cancel: Callable[[int, Any], None] | None = None, link: Any = None) -> None:
        self.name = name
        self.using = using
        self.heartbeat_seconds = heartbeat_seconds
        self.incarnation = incarnation
        self.dead_after = dead_after
        self._held: dict[int, float] = {}  # job id -> lease seconds
        self._claimed: dict[int, float] = {}  # job id -> monotonic time its claim was sent
        self._done = 0  # jobs finished since the last beat (added to the row's jobs_done)
        self._done_total = 0  # jobs finished since the start; under a supervisor, those it stamped:
        self._done_acked = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._parent = os.getppid() if exit_with_parent else None
        #: Monotonic time at which the last beat that got through was sent (None: none yet).
        self.ok_at: float | None = None
        #: The worker row belongs to another incarnation now (or was stamped stopped): this process
        #: must stop.
        self.replaced = False
        #: Held jobs a renewal found under another worker or incarnation (taken over).
        self.lost: set[int] = set()
        self._failing = False
        self._on_beat = on_beat
        #: Why this process must stop although its row is its own (the database was swapped under it).
        self.fatal: str | None = None
        self._identity: Any = _UNSET
        #: Cancelling a running job: how often to look for a request, the job being run (id, attempt,
        #: monotonic time of the next look), and the requests found (job id -> CancelRequest).
        self.cancel_check = cancel_check
        self._running: tuple[int, int, float] | None = None
        self._next_check = 0.0  # the heartbeat thread's own: when it looks again
        self.cancels: dict[int, Any] = {}
        self._on_cancel = on_cancel
        #: Under a supervisor: the pipe to it, and when each held job's lease was last renewed (its
        #: beats may not cover a job claimed after the beat's snapshot, so each job has its own time).
        self._link = link
        self._send_lock = threading.Lock()
        self._renewed: dict[int, float] = {}
        self._connect_error: str | None = None
        #: A pipe whose write ends the linked loop's wait at once (a slot's stop waited up to REPORT_SECONDS).
        self._stop_pipe: tuple[int, int] | None = None

    # ----- called by the worker's main thread ----------------------------------------------------
    def hold(self, leases: dict[int, float], claimed_at: float | None = None) -> None:
        """Hold claimed jobs: ``leases`` (id -> the lease the claim gave, seconds), the claim sent at
        ``claimed_at`` (monotonic; now if None)."""
        at = time.monotonic() if claimed_at is None else claimed_at
        with self._lock:
            self._held.update(leases)
            for job_id in leases:
                self._claimed[job_id] = at
                self.lost.discard(job_id)
        if self._link is not None:
            self._report()  # the supervisor renews these from its next beat on
        self._wake.set()  # a short lease may need an earlier renewal than planned
        self._publish()

    def drop(self, job_id: int, *, finished: bool) -> None:
        with self._lock:
            self._held.pop(job_id, None)
            self._claimed.pop(job_id, None)
            self._renewed.pop(job_id, None)
            self.lost.discard(job_id)
            self._done += finished
            self._done_total += finished

    def start_running(self, job_id: int, attempt_num: int) -> None:
        """The handler of ``job_id`` starts: look for a cancel request once it has run ``cancel_check``
        seconds, then every ``cancel_check`` seconds. No wake-up, no query: a shorter job costs nothing."""
        if self.cancels:
            self.cancels.clear()  # one job at a time: a request found too late for the last one is moot
        # Written by this (the main) thread only, read by the heartbeat's: no lock on the hot path.
        self._running = (job_id, attempt_num, time.monotonic() + self.cancel_check)

    def stop_running(self, job_id: int) -> Any:
        """The handler returned: stop looking; return the cancel request found for it, if any."""
        self._running = None
        return self.cancels.pop(job_id, None) if self.cancels else None

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def take_done(self) -> int:
        """Jobs finished and not yet added to the worker row's jobs_done (and count them as added)."""
        with self._lock:
            if self._link is not None:
                done, self._done_acked = self._done_total - self._done_acked, self._done_total
                return done
            done, self._done = self._done, 0
            return done

    def start(self) -> None:
        loop = self._loop if self._link is None else self._linked_loop
        if self._link is not None and self._stop_pipe is None:
            self._stop_pipe = os.pipe()  # stop() wakes the linked loop out of its wait on the pipe to the supervisor
        self._thread = threading.Thread(target=loop, name=f"sqlqueue-heartbeat-{self.name}", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._stop_pipe is not None:
            try:
                os.write(self._stop_pipe[1], b"x")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._stop_pipe is not None and not self.alive():
            for fd in self._stop_pipe:
                os.close(fd)
            self._stop_pipe = None

    # ----- standing ------------------------------------------------------------------------------
    def window(self) -> float:
        """The shortest of the dead-after time and the held leases: the beat interval is a quarter."""
        with self._lock:
            shortest = min(self._held.values(), default=None)
        return self.dead_after if shortest is None else min(self.dead_after, shortest)

    def row_deadline(self, share: float) -> float:
        """Monotonic time at which ``share`` of the dead-after time since the last good beat has passed
        (0 before the first beat or once replaced)."""
        if self.replaced or self.ok_at is None:
            return 0.0
        return self.ok_at + share * self.dead_after

    def job_deadline(self, job_id: int, share: float) -> float:
        """Monotonic time past which ``share`` of what keeps ``job_id`` ours is used up: its lease since
        its last renewal (the claim, or a good beat after it), or the worker row's dead-after time."""
        row = self.row_deadline(share)
        with self._lock:
            lease, claimed = self._held.get(job_id), self._claimed.get(job_id)
        if not row or lease is None or claimed is None:
            return row
        if self._link is not None:
            renewed = max(claimed, self._renewed.get(job_id, claimed))
        else:
            renewed = max(claimed, self.ok_at or claimed)
        return min(row, renewed + share * lease)

    def may_claim(self) -> bool:
        """A beat got through recently enough that the worker row will not look dead under a claim."""
        return not self.replaced and time.monotonic() < self.row_deadline(CLAIM_SHARE)

    def may_start(self, job_id: int) -> bool:
        """A held, unstarted job is still safely ours (else it is handed back, not started)."""
        return (not self.replaced and job_id not in self.lost
                and time.monotonic() < self.job_deadline(job_id, CLAIM_SHARE))

    def at_risk(self, job_id: int) -> bool:
        """The job may be (or soon be) someone else's: replaced, taken over, or beats failing too long."""
        return self.replaced or job_id in self.lost or time.monotonic() >= self.job_deadline(job_id, STOP_SHARE)

    def _publish(self) -> None:
        if self._on_beat is not None:
            self._on_beat(self)

    # ----- the thread ----------------------------------------------------------------------------
    def interval(self) -> float:
        interval = min(self.heartbeat_seconds, self.window() / 4)
        if self._failing:
            interval = min(interval, RETRY_SECONDS)
        return max(0.05, interval)

    def _loop(self) -> None:
        next_beat = time.monotonic()  # the first beat at once: the slot claims nothing before it
        try:
            while not self._stop:
                # Never asleep longer than cancel_check: a job that started meanwhile is looked at in time.
                wake_at = min(next_beat, self._check_at())
                self._wake.wait(max(0.0, wake_at - time.monotonic()))
                self._wake.clear()
                if self._stop:
                    break
                if self._parent is not None and os.getppid() != self._parent:
                    os._exit(1)  # the supervisor is gone, so are we: our jobs are reclaimed by lease or name
                now = time.monotonic()
                running = self._running
                if running is not None and now >= max(running[2], self._next_check):
                    self._check_cancel(running)
                if now < next_beat:  # woken early by a claim: a shorter lease may need an earlier beat
                    next_beat = min(next_beat, (self.ok_at or now) + self.interval())
                    if now < next_beat:
                        continue
                self._beat_logged()
                if self.replaced:
                    return
                next_beat = time.monotonic() + self.interval()
        except Exception:  # never die silently: the slot sees the thread gone and restarts
            log.exception("heartbeat_thread_died worker=%s", self.name)
        finally:
            connections.close_all()  # this thread's connections only

    # ----- under a supervisor: no database work, a pipe to the supervisor --------------------------
    def tell_connect(self, error: str | None) -> None:
        """The slot could not connect at its start (``error``), or has now (None): the supervisor says
        once how many of its slots run, instead of every slot saying so (a role's connection limit)."""
        if self._link is not None and error != self._connect_error:
            self._connect_error = error
            self._report()

    def _report(self) -> None:
        with self._lock:
            held = dict(self._held)
            done = self._done_total
        report = SlotReport(held, done, self._running, self._connect_error)
        with self._send_lock:
            try:
                self._link.send(report)
            except (OSError, ValueError):
                pass  # the supervisor is gone: the thread sees it and exits

    def _linked_loop(self) -> None:
        link = self._link
        assert self._stop_pipe is not None
        stop = self._stop_pipe[0]
        try:
            while not self._stop:
                self._report()
                deadline = time.monotonic() + REPORT_SECONDS
                while not self._stop and (left := deadline - time.monotonic()) > 0:
                    if self._parent is not None and os.getppid() != self._parent:
                        os._exit(1)  # the supervisor is gone, so are we: our jobs are reclaimed by lease or name
                    if link in wait_for([link, stop], left):
                        self._apply(link.recv())
        except (EOFError, OSError):  # the supervisor's end is closed: it is gone
            if not self._stop:
                os._exit(1)
        except Exception:  # never die silently: the slot sees the thread gone and restarts
            log.exception("heartbeat_thread_died worker=%s", self.name)

    def _apply(self, result: BeatResult) -> None:
        """A beat (or a look for cancel requests) of the supervisor's, for this slot."""
        if result.ok:
            if result.replaced and not self.replaced:
                self.replaced = True
                log.error("worker_replaced worker=%s incarnation=%s: the worker row belongs to another process "
                          "now, or was stamped stopped (this one was paused or cut off past "
                          "WORKER_DEAD_AFTER_SECONDS, or judged gone); stopping without touching its jobs",
                          self.name, self.incarnation)
            if result.fatal and self.fatal is None:
                self.fatal = result.fatal
            with self._lock:
                self._done_acked = max(self._done_acked, result.done)
                for job_id in result.renewed:
                    if job_id in self._held:
                        self._renewed[job_id] = max(self._renewed.get(job_id, 0.0), result.sent)
                taken = set(result.lost) & set(self._held)
                self.lost |= taken
            if taken:
                log.warning(LEASE_LOST, self.name, ",".join(map(str, sorted(taken))))
            if not self.replaced and not self.fatal:
                self.ok_at = max(self.ok_at or 0.0, result.sent)
        running = self._running
        for (job_id, attempt), request in result.cancels.items():
            if running is not None and running[:2] == (job_id, attempt):
                self._found_cancel(job_id, attempt, request)
        self._publish()

    def _check_at(self) -> float:
        running = self._running
        idle = time.monotonic() + self.cancel_check
        return idle if running is None else min(idle, max(running[2], self._next_check))

    def _check_cancel(self, running: tuple[int, int, float]) -> None:
        """Look for a cancel request of the running attempt (a seek on a table of requests only); when
        there is one, keep it and tell the slot (``on_cancel``), which starts the grace period."""
        from ..models import Job

        job_id, attempt, _ = running
        self._next_check = time.monotonic() + self.cancel_check
        if job_id in self.cancels:
            return
        try:
            request = Job.objects.cancel_request_for(job_id, attempt, using=self.using)
        except DatabaseError as exc:  # down, or the table not migrated yet: never the heartbeat's death
            log.info("cancel_check_failed worker=%s job=%s error=%s", self.name, job_id, one_line(exc))
            close_connection(self.using)
            return
        if request is None or self._running is not running:
            return  # none, or the handler returned meanwhile (its outcome stands): the same tuple is the same run
        self._found_cancel(job_id, attempt, request)

    def _found_cancel(self, job_id: int, attempt: int, request: Any) -> None:
        if job_id in self.cancels:
            return
        self.cancels[job_id] = request
        log.warning("cancel_requested worker=%s job=%s attempt=%s by=%r reason=%r", self.name, job_id, attempt,
                    request.requested_by, request.reason)
        if self._on_cancel is not None:
            self._on_cancel(job_id, request)

    def _beat_logged(self) -> None:
        sent = time.monotonic()
        try:
            # Connecting is not part of the beat: the lease is measured from just before the statements.
            connections[self.using].ensure_connection()
            sent = time.monotonic()
            self.beat()
        except DB_DOWN_ERRORS as exc:
            # WARNING: a slot whose beats fail loses its jobs to other workers after the window.
            log.warning("heartbeat_failed worker=%s error=%s last_ok=%s", self.name, one_line(exc),
                        "never" if self.ok_at is None else f"{sent - self.ok_at:.1f}s ago")
            self._failing = True
            close_connection(self.using)
        except Exception:
            log.exception("heartbeat_error worker=%s", self.name)
            self._failing = True
        else:
            if self._failing and self.ok_at is not None:
                log.warning("heartbeat_back worker=%s after=%.1fs", self.name, sent - self.ok_at)
            self._failing = False
            self._check_identity()
            if not self.replaced and not self.fatal:
                self.ok_at = sent
        self._publish()

    def beat(self) -> None:
        """Renew the held jobs' leases (grouped by lease length) and stamp the worker row."""
        from ..models import Job, Worker

        with self._lock:
            held = dict(self._held)
        by_lease: dict[float, list[int]] = {}
        for job_id, lease in held.items():
            by_lease.setdefault(lease, []).append(job_id)
        for lease, ids in by_lease.items():
            kept = Job.objects.renew_leases(self.name, ids, max(1, round(lease)), using=self.using,
                                            incarnation=self.incarnation)
            if kept < len(ids):
                self._find_taken(ids)
        done = self.take_done()
        try:
            stamped = Worker.objects.using(self.using).filter(
                name=self.name, incarnation=self.incarnation, stopped_at__isnull=True).update(
                last_heartbeat=db_now(self.using), jobs_done=F("jobs_done") + done)
        except BaseException:
            with self._lock:
                self._done += done  # counted at the next beat instead
            raise
        if not stamped:
            self.replaced = True
            log.error("worker_replaced worker=%s incarnation=%s: the worker row belongs to another process now, "
                      "or was stamped stopped (this one was paused or cut off past WORKER_DEAD_AFTER_SECONDS, or "
                      "judged gone); stopping without touching its jobs", self.name, self.incarnation)

    def _check_identity(self) -> None:
        """SQLite: the database file deleted or replaced while this process runs (its connection would go
        on writing to the old file: results lost without a word). Stop instead, saying so."""
        identity = get_dialect(connections[self.using]).database_identity()
        if self._identity is _UNSET:
            self._identity = identity
        elif identity != self._identity and self.fatal is None:
            name = connections[self.using].settings_dict.get("NAME")
            self.fatal = f"the database file {name} was deleted or replaced under this worker"
            log.error("database_file_gone worker=%s path=%s: its open connection would write to a file nobody "
                      "reads; stopping", self.name, name)

    def _find_taken(self, ids: list[int]) -> None:
        """Some renewals found nothing: which of these jobs another worker or incarnation holds now.

        A job this slot finished meanwhile (still under its name and incarnation, no longer Processing)
        is not taken; nor is one it dropped since the renewal.
        """
        from ..models import Job

        taken = set(Job.objects.using(self.using).filter(pk__in=ids).annotate(ran_out=lease_ran_out(self.using)).filter(
            ~Q(worker=self.name, incarnation=self.incarnation) | Q(ran_out=1)).values_list("pk", flat=True))
        with self._lock:
            taken &= set(self._held)
            self.lost |= taken
        if taken:
            log.warning(LEASE_LOST, self.name, ",".join(map(str, sorted(taken))))
