"""Process slots: start N worker processes, restart one that dies, kill one whose job overruns.

Each slot is an OS process (its first forked at the supervisor's start while the supervisor has no
thread and no connection, see :meth:`Supervisor._first_slots`; a restart ``multiprocessing`` "spawn": a
fresh interpreter that sets Django up; either way no database connection or lock is ever inherited)
running a :class:`~django_sqlqueue.worker.Worker`
named ``<worker-name>/<slot>``. A restarted slot keeps its name but gets a new incarnation (chosen
here, so the supervisor knows which jobs each process claimed), so its claim takes back at once the
Processing jobs its previous incarnation held.

A slot's own exit code is believed only if the slot declared it (``SlotChannel.declared``) and was
not running a job: a handler calling ``os._exit(3)`` kills the slot, it does not stop the worker. A
slot whose heartbeat says its running job may be someone else's now (beats failing for most of the
lease, or the lease found taken) is killed before the lease ends, so two workers never run one job
at the same time.

The supervisor itself holds no jobs. It watches each slot's "current job and deadline" (shared
memory written by the slot), SIGKILLs a slot whose job exceeds its type's timeout, marks that job
Error/Failed ("timed out after N s") with the job's current token, and restarts the slot. It also looks for the fleet's maintenance lease and, while it holds it, runs the
fleet's maintenance (reaper, heal, workflow backstop, schedule looks, retention: :mod:`.maintenance`),
and prints the progress bar in burst mode.

Signals: the first SIGTERM/SIGINT asks every slot to stop after its current job (unstarted claimed
jobs go back to Pending) and waits ``grace_seconds`` for them; slots still running then are killed
and their rows marked stopped, so other workers take their jobs at once. A second signal kills the
slots at once and exits 1; their jobs are reclaimed later by lease (or at once by a worker of the
same name).

Connections: each slot holds one (its claims and jobs); the supervisor holds ONE for everything else:
the heartbeat of all its slots (beats.py: one statement renews every slot's leases, one stamps every
slot's row), its LISTEN (wakeup.py: one per worker, waking one idle slot per notification), the
schedule looks and the rest of its database work. So a worker of S slots holds S + 1 connections (one
more when ``LISTEN_DATABASE`` names another alias). The supervisor connects before it starts its slots,
so that a role short of connections runs fewer slots rather than slots without a heartbeat; a slot that
cannot connect retries with backoff, and the supervisor says once, at WARNING, how many slots run.

The supervisor's database work runs on a thread of its own (:mod:`django_sqlqueue.dbthread`): no
database wait (a server that does not answer, a pooler's queue, a lock) delays a signal, a timeout kill
or the grace period. After the slots are gone it waits at most ``CLEANUP_SECONDS`` for that work, and
any database error there is logged, never fatal.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for
from typing import Any

from django.db import Error as DatabaseError

from .. import signals
from ..exceptions import IllegalTransition, JobNotFound, StaleJob
from ..ops import tracing
from ..queue.wakeups import wake_on_commit
from ..states import Status
from .beats import Beats, stamps_can_stand
from .contract import (
    CANCELLED,
    EXIT_DB_GONE,
    EXIT_FATAL,
    EXIT_FORCED,
    EXIT_OK,
    EXIT_REPLACED,
    FAILED,
    N_COUNTERS,
    RETRIED,
    SUCCEEDED,
    Flag,
    SlotChannel,
    WakeBoard,
    WorkerConfig,
)
from .dbthread import Call, DatabaseThread
from .heartbeat import HostSweep
from .loop import Worker  # the sender of the signals (signals.py)
from .maintenance import Maintenance, new_holder
from .slots import slot_main
from .support import DB_DOWN_ERRORS, close_connection, one_line, send

log = logging.getLogger("django_sqlqueue.supervisor")

#: How often the supervisor looks for workers of its host whose processes are gone (heartbeat.py), and
#: how often it reads the list of its host's workers from the database for that (heartbeat.HostSweep).
SWEEP_SECONDS = 2.0
SWEEP_REREAD_SECONDS = 20.0
TICK_SECONDS = 0.1
#: The loop's passes are at least this far apart, however often it is woken (see Supervisor._pause).
MIN_TICK_SECONDS = 0.01
#: A slot that ran at least this long before dying restarts at once (a crash loop backs off).
STABLE_SECONDS = 30.0
MAX_RESTART_DELAY = 60.0
#: Once the slots are gone, the most the supervisor waits for its database work (handing back jobs,
#: stamping rows stopped) before it exits anyway: what is left is reclaimed by name or lease.
CLEANUP_SECONDS = 5.0
#: How long the end of a --burst run waits to record the jobs its dead slots left Processing.
BURST_DEATHS_SECONDS = 60.0
#: Connect timeout of the supervisor's connection, when the database's OPTIONS set none.
CONNECT_TIMEOUT_SECONDS = 5.0
#: The first maintenance pass waits at most this long for the slots' first beat (see _maintain).
FIRST_MAINTENANCE_HOLD = 5.0


@dataclass
class Slot:
    index: int
    name: str
    stop: Any
    counters: Any
    proc: Any = None
    channel: SlotChannel | None = None
    started: float = 0.0
    restart_at: float = 0.0
    failures: int = 0
    done: bool = False
    pid: int = 0  # of the current (or last) process
    incarnation: str = ""  # of the current (or last) process: stamped on every job it claimed
    #: The database work after its last death (hand-back): the slot restarts only once it has finished,
    #: so that work can never touch jobs the next incarnation claims.
    cleanup: Call | None = None


@dataclass
class Summary:
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    seconds: float = 0.0
    exit_code: int = 0
    #: Why the exit code is not 0, in words (the command's error message).
    reason: str = ""

    @property
    def processed(self) -> int:
        return self.succeeded + self.retried + self.failed + self.cancelled

    def line(self) -> str:
        rate = self.processed / self.seconds if self.seconds > 0 else 0.0
        return (f"processed={self.processed} succeeded={self.succeeded} retried={self.retried} "
                f"failed={self.failed} cancelled={self.cancelled} seconds={self.seconds:.1f} jobs_per_s={rate:.1f}")


@dataclass
class Supervisor:
    config: WorkerConfig
    concurrency: int = 1
    grace_seconds: float = 30.0
    max_seconds: float | None = None
    log_level: str | None = None
    progress: bool = False
    _signals: int = 0
    _stopping: bool = False
    _stop_deadline: float = 0.0
    _started: float = 0.0
    _slots: list[Slot] = field(default_factory=list)
    _extra: list[int] = field(default_factory=lambda: [0] * N_COUNTERS)
    _exit_code: int = EXIT_OK
    _reason: str = ""
    #: --burst: (job id, slot incarnation, exit) of each slot that died running a job (see _burst_deaths).
    _died: list[tuple[int, str, str]] = field(default_factory=list)
    _maintaining: Call | None = None
    _sweeping: Call | None = None
    _starved_said: bool = False
    _starved_since: float | None = None

    def run(self) -> Summary:
        from django.db import connections

        from ..conf import get_settings

        settings = get_settings()
        self._using = self.config.using or settings.DATABASE
        started = self._started = time.monotonic()
        ctx = multiprocessing.get_context("spawn")
        self._ctx = ctx
        self._beats = Beats(self._using, self.config.name, settings.HEARTBEAT_SECONDS,
                            settings.WORKER_DEAD_AFTER_SECONDS, settings.CANCEL_CHECK_SECONDS)
        self._board: WakeBoard | None = None
        self._listen_thread: Any = None
        self._db = self._database_thread(ctx, settings)
        self._maintenance = Maintenance(self._using, new_holder(self.config.name))
        board = self._board
        if board is not None:  # a holder's look heard here: its lease is alive, no need to try for it
            self._maintenance.look_heard = lambda: board.look_runs(time.monotonic())
        self._host_sweep = HostSweep(self._using, min(SWEEP_REREAD_SECONDS, settings.WORKER_DEAD_AFTER_SECONDS / 3),
                                     listening=lambda: board is not None and bool(board.listening.value))
        for hears in (getattr(self, "_shared_listener", None), self._listen_thread):
            if hears is not None:  # a worker of this host registered: read the host's rows at the next sweep
                hears.on_hello = self._host_sweep.reread
        budget = ctx.Value("q", self.config.max_jobs) if self.config.max_jobs is not None else None
        self._budget = budget
        self._slots = [Slot(i, f"{self.config.name}/{i}", Flag(ctx), ctx.RawArray("q", N_COUNTERS))
                       for i in range(self.concurrency)]
        saved = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        bar = None
        next_sweep = started + SWEEP_SECONDS
        connections.close_all()  # nothing to inherit: the database thread holds the supervisor's connection
        self._go = Flag(ctx)  # the start gate: set once the first connect attempt is over (see _first_slots)
        try:
            forked = self._first_slots(budget)
            bar = self._progress_bar()  # after the fork: its monitor thread would rule forking out
            self._connect_first()
            self._db.submit("connected", self._connected)
            if not forked:
                for slot in self._slots:
                    self._start(slot, budget)
            while not all(s.done for s in self._slots):
                now = time.monotonic()
                if self._signals and not self._stopping:
                    self._begin_stop("signal")
                if self.max_seconds is not None and now - started >= self.max_seconds and not self._stopping:
                    self._begin_stop("max-seconds")
                for slot in self._slots:
                    self._watch(slot, now, budget)
                if self._stopping and now >= self._stop_deadline:
                    self._kill_remaining()
                if not self._stopping:
                    self._maintain(now)
                if now >= next_sweep and not self._stopping:
                    self._sweep()
                    next_sweep = now + SWEEP_SECONDS
                self._beats.tick(self._db, now, stopping=self._stopping)
                self._say_starved(now)
                if bar is not None:
                    bar.update(self._summary(0).processed - bar.n)
                self._pause(now)
            if self._died:
                self._burst_deaths()
        finally:
            for slot in self._slots:  # only after an unexpected error: never leave orphans
                if slot.proc is not None and slot.proc.is_alive():
                    slot.proc.kill()
                    slot.proc.join()
            if self._listen_thread is not None:
                self._listen_thread.close()
            self._finish_db()
            for signum, previous in saved.items():
                signal.signal(signum, previous)
            if bar is not None:
                bar.update(self._summary(0).processed - bar.n)
                bar.close()
            connections.close_all()
        return self._summary(time.monotonic() - started)

    def _burst_deaths(self) -> None:
        """A --burst run in which a slot died running a job (a handler that exits the process, raised
        KeyboardInterrupt past its runner, or was killed) does not report success: it exits non-zero,
        and a job the dead slot left Processing is recorded as failed with the death (an Error retried
        later, or Failed without attempts left), so its state says what happened instead of "running"."""
        self._exit_code = self._exit_code or 1
        ids = ", ".join(str(job_id) for job_id, _, _ in self._died)
        self._reason = self._reason or (f"a worker slot died while running job(s) {ids}: this --burst run did not "
                                        f"finish them (see the log above and the jobs' errors)")
        call = self._db.submit("burst_deaths", self._burst_deaths_now, list(self._died))
        if not call.wait(BURST_DEATHS_SECONDS):  # longer than CLEANUP_SECONDS: these rows must say it
            log.warning("burst_job_unfinished worker=%s jobs=%s (not recorded within %s s: the jobs stay "
                        "Processing until the reaper or a claim takes them)", self.config.name, ids,
                        BURST_DEATHS_SECONDS)

    def _burst_deaths_now(self, died: list[tuple[int, str, str]]) -> None:
        from ..models import Job

        for job_id, incarnation, code in died:
            job = Job.objects.using(self._using).filter(pk=job_id, incarnation=incarnation,
                                                        status_id=Status.PROCESSING).first()
            if job is None:  # finished, or taken over by another claim since: its state says so already
                continue
            try:
                new = Job.objects.fail(job, f"the worker slot running it died (exit {code}) and the --burst run "
                                            f"ended: the attempt did not finish", using=self._using)
            except (StaleJob, IllegalTransition, JobNotFound):
                continue
            log.warning("burst_job_unfinished worker=%s job=%s status=%s", self.config.name, job_id, new.state.label)

    def _database_thread(self, ctx: Any, settings: Any) -> DatabaseThread:
        """The supervisor's one connection, and how it wakes idle slots: LISTEN on that connection (its
        idle hook), or on LISTEN_DATABASE's (a thread of its own), or not at all (the slots poll)."""
        from django.db import connections

        from ..dialects import capabilities
        from . import wakeup

        vendor = connections[self._using].vendor
        listens = bool(settings.NOTIFY_CHANNEL) and capabilities(vendor).can_listen
        if not listens:
            if vendor != "sqlite":  # one idle slot polls, the others wait for its bell (WakeBoard)
                self._board = WakeBoard(ctx, self.concurrency)
            return DatabaseThread(self._using, CONNECT_TIMEOUT_SECONDS)
        self._board = WakeBoard(ctx, self.concurrency)
        listen_alias = settings.LISTEN_DATABASE or self._using
        if listen_alias != self._using:
            listener = wakeup.PgListener.for_alias(self._using, settings.NOTIFY_CHANNEL, self.config.queues,
                                                   listen_using=listen_alias)
            if listener is not None:
                listener.worker = self.config.name
                self._listen_thread = wakeup.ListenerThread(listener, self._board)
            return DatabaseThread(self._using, CONNECT_TIMEOUT_SECONDS)
        self._shared_listener = wakeup.SharedListener(self._using, settings.NOTIFY_CHANNEL, self.config.queues,
                                                      self._board, self.config.name)
        if (capabilities(vendor).session_liveness and settings.SESSION_LIVENESS
                and stamps_can_stand(settings.WORKER_DEAD_AFTER_SECONDS)):  # looks stamp idle slots' rows
            self._beats.session = self._shared_listener
        return DatabaseThread(self._using, CONNECT_TIMEOUT_SECONDS, idle=self._shared_listener.idle)

    def _connect_first(self) -> None:
        """Start connecting (and LISTENing) before the slots start: a slot takes a second or more to
        boot, so a role short of connections runs fewer slots, never slots that no heartbeat covers."""
        listener = getattr(self, "_shared_listener", None)
        listening = listener is not None
        if listener is not None:
            self._db.start()  # its idle hook connects and LISTENs at once
        else:
            self._db.submit("connect", self._connect_now)
            if self._listen_thread is not None and self._listen_thread.start():
                assert self._board is not None
                self._board.listening.value = 1
                listening = True
        # Only where it LISTENs: SQL Server (and PostgreSQL with NOTIFY_CHANNEL = "") has the board with
        # no notifications, and the slots' worker_started line says wakeup=poll there.
        if listening:
            log.info("worker_listening worker=%s slots=%s (one LISTEN for the worker: each notification wakes "
                     "one idle slot)", self.config.name, self.concurrency)

    def _first_slots(self, budget: Any) -> bool:
        """Fork the first process of every slot, when that is safe; True if it did.

        A spawned slot is a fresh interpreter that imports Django and every app again: a second or more
        of CPU before its first claim, most of a short --burst run's time. Forked, it starts with the
        supervisor's imports and set-up Django. Forking is safe only here, before the supervisor starts a
        thread or opens a connection: ``connections.close_all()`` has just run in the only thread, so no
        connection, lock or thread is inherited (the reason the slots are otherwise spawned). Linux only,
        and only while the process has no other thread (an app whose ``ready()`` started one gets
        spawned slots, as before); a restarted slot is always spawned (the supervisor has threads then).
        A forked slot waits for :attr:`_go` before it connects, so the supervisor still connects first.

        Never on SQL Server: its drivers pool connections in the process (mssql-python by default,
        pyodbc through the ODBC driver manager), so ``close_all()`` hands the supervisor's session back to
        the pool instead of closing it, and a forked slot's first connect would take that very session,
        which the supervisor's own connect takes too: two processes on one TDS stream (seen over TDS:
        every forked slot died and was respawned).
        """
        import threading

        from django.db import connections

        if (not sys.platform.startswith("linux") or threading.active_count() != 1
                or connections[self._using].vendor == "microsoft"):
            return False
        fork = multiprocessing.get_context("fork")
        for slot in self._slots:
            self._start(slot, budget, fork)
        return True

    def _connected(self) -> None:
        """On the database thread, after the first connect: let the slots connect (a role short of
        connections runs fewer slots, never slots without the supervisor's heartbeat)."""
        from django.db import connections

        try:
            connections[self._using].ensure_connection()
        except DatabaseError:
            pass  # reported by the connect itself; the slots retry on their own
        finally:
            self._go.set()

    def _connect_now(self) -> None:
        from django.db import connections

        try:
            connections[self._using].ensure_connection()
            self._beats.baseline()
        except DatabaseError as exc:
            self._db_failed("supervisor_connect_failed", exc, quiet=True)

    def _say_starved(self, now: float) -> None:
        """Once, at WARNING: the worker runs fewer slots than asked, because the others cannot connect."""
        connected, reported, error = self._beats.connect_errors()
        if error is None or connected == reported:
            if self._starved_since is not None and connected == self.concurrency:
                log.info("worker_slots_connected worker=%s slots=%s", self.config.name, connected)
            self._starved_since = None
            return
        if self._starved_since is None:
            self._starved_since = now
        # Give every slot its first try (or a few seconds) before counting.
        if reported < self.concurrency and now - self._starved_since < 5.0:
            return
        if not self._starved_said:
            self._starved_said = True
            log.warning("worker_starved worker=%s slots_connected=%s of %s error=%s (the database refuses more "
                        "connections: the worker runs the slots it could connect and retries the others with "
                        "backoff; it needs %s connections: one per slot and one for the supervisor, see "
                        "docs/scaling.md)", self.config.name, connected, self.concurrency, error,
                        self.concurrency + 1)

    def _finish_db(self) -> None:
        """Give the database work still queued (hand-backs, stopped stamps, giving the maintenance lease
        up) ``CLEANUP_SECONDS``, no more."""
        self._db.submit("release_maintenance", self._maintenance.release)
        left = self._db.close(CLEANUP_SECONDS)
        if left:
            log.warning("supervisor_cleanup_unfinished worker=%s calls=%s seconds=%s (the database did not "
                        "answer in time: jobs not handed back are reclaimed by a worker of the same name at "
                        "once, or by lease)", self.config.name, ",".join(c.name for c in left), CLEANUP_SECONDS)

    # ----- signals and stopping ------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:  # second signal: stop at once, no database work
            for slot in self._slots:
                if slot.proc is not None and slot.proc.pid is not None:
                    try:
                        os.kill(slot.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
            os._exit(EXIT_FORCED)

    def _begin_stop(self, reason: str) -> None:
        log.info("worker_stopping worker=%s reason=%s grace_seconds=%s", self.config.name, reason,
                 self.grace_seconds)
        self._stopping = True
        self._stop_deadline = time.monotonic() + self.grace_seconds
        for slot in self._slots:
            slot.stop.set()
            if slot.proc is None:
                slot.done = True
        if self._board is not None:
            self._board.ring_all()

    def _kill_remaining(self) -> None:
        for slot in self._slots:
            if slot.done or slot.proc is None:
                continue
            running = self._kill(slot)
            log.warning("slot_killed worker=%s reason=grace-expired job=%s", slot.name, running or "-")
            self._after_death(slot, running)
            slot.done = True

    # ----- slots -----------------------------------------------------------------------------------
    def _start(self, slot: Slot, budget: Any, start: Any = None) -> None:
        """Start a process for ``slot``: spawned, or through ``start`` (the fork context, see _first_slots)."""
        from ..queue import new_incarnation

        slot.incarnation = new_incarnation()
        ours, theirs = self._ctx.Pipe(duplex=True)
        slot.channel = SlotChannel(self._ctx, slot.stop, slot.counters, budget, link=theirs, board=self._board,
                                   index=slot.index)
        slot.proc = (start or self._ctx).Process(
            target=slot_main, args=(self._slot_config(slot), slot.channel, self.log_level, self._go),
            name=f"sqlqueue-slot-{slot.index}")
        slot.proc.start()
        theirs.close()  # the slot has its copy: its death closes the pipe
        self._beats.attach(slot.index, slot.name, slot.incarnation, ours)
        slot.pid = slot.proc.pid
        slot.started = time.monotonic()
        log.debug("slot_started worker=%s pid=%s", slot.name, slot.proc.pid)

    def _slot_config(self, slot: Slot) -> WorkerConfig:
        from dataclasses import replace

        return replace(self.config, name=slot.name, incarnation=slot.incarnation)

    def _watch(self, slot: Slot, now: float, budget: Any) -> None:
        if slot.done:
            return
        if slot.proc is None:
            if self._stopping:
                slot.done = True
            elif now >= slot.restart_at and (slot.cleanup is None or slot.cleanup.finished):
                self._start(slot, budget)
            return
        if slot.proc.is_alive():
            self._check_timeout(slot)
            return
        slot.proc.join()
        if self._board is not None:
            self._board.slot_gone(slot.index)  # not idle any more; its poller role goes to an idle slot
        code = slot.proc.exitcode
        running = slot.channel.job_of_dead_slot() if slot.channel is not None else 0
        declared = slot.channel.declared.value if slot.channel is not None else code
        slot.proc = None
        if running or code != declared:
            code = f"{code} (undeclared)"  # a death, whatever the code
        if code == EXIT_OK and (self._stopping or self.config.burst or self._budget_spent()):
            self._beats.detach(slot.index)
            slot.done = True
        elif code in (EXIT_FATAL, EXIT_REPLACED, EXIT_DB_GONE):
            self._beats.detach(slot.index)
            self._exit_code = 1
            if code == EXIT_DB_GONE:
                self._reason = (f"the database was unreachable for --db-wait {self.config.db_wait:g} s: this "
                                f"--burst run gave up (see the log above)")
            slot.done = True
            if not self._stopping:
                self._begin_stop("replaced" if code == EXIT_REPLACED else "fatal-error")
        else:
            log.warning("slot_died worker=%s exit=%s job=%s", slot.name, code, running or "-")
            if running and self.config.burst:
                self._died.append((running, slot.incarnation, str(code)))
            self._after_death(slot, running)
            if self._stopping:
                slot.done = True
                return
            stable = now - slot.started >= STABLE_SECONDS
            slot.failures = 0 if stable or code == EXIT_OK else slot.failures + 1
            delay = 0.0 if slot.failures <= 1 else min(MAX_RESTART_DELAY, 2.0 ** (slot.failures - 2))
            slot.restart_at = now + delay

    def _budget_spent(self) -> bool:
        return self._budget is not None and self._budget.value <= 0

    def _check_timeout(self, slot: Slot) -> None:
        assert slot.channel is not None
        current = slot.channel.current
        lock = current.get_lock()
        if not lock.acquire(timeout=0.05):
            return
        try:
            raw_id, deadline, timeout, raw_cancelled = current.get_obj()[:]  # under the lock taken above
            job_id, cancelled = int(raw_id), bool(raw_cancelled)
            if not job_id:
                return
            # Once its handler has returned (deadline inf) nothing can run twice any more: let it record.
            at_risk = deadline != float("inf") and slot.channel.running_job_at_risk(job_id)
            if not at_risk and time.monotonic() <= deadline:
                return
            # Killed while we hold the lock: the slot cannot have moved on to another job meanwhile.
            os.kill(slot.proc.pid, signal.SIGKILL)
        finally:
            lock.release()
        slot.proc.join()
        slot.proc = None
        if at_risk:
            # Its lease is (or is about to be) someone else's: running on would run the job twice at once.
            log.warning("slot_killed worker=%s reason=lease-at-risk job=%s (its heartbeat could not renew the "
                        "lease, or the job was taken over)", slot.name, job_id)
        elif cancelled:
            log.warning("slot_killed worker=%s reason=cancelled job=%s (its handler did not stop within the "
                        "cancel's grace period)", slot.name, job_id)
            self._mark_cancelled(slot, job_id)
        else:
            log.error("job_timed_out worker=%s job=%s timeout=%ss", slot.name, job_id, int(timeout))
            self._mark_timed_out(slot, job_id, timeout)
        self._after_death(slot, job_id)
        slot.restart_at = 0.0  # restart at once: the slot was healthy, its job was not

    def _kill(self, slot: Slot) -> int:
        """SIGKILL a slot; return the job it was running (0 if none)."""
        assert slot.proc is not None and slot.channel is not None
        slot.proc.kill()
        slot.proc.join()
        slot.proc = None
        return slot.channel.job_of_dead_slot()

    # ----- database work: on the database thread, every error logged, none fatal --------------------
    def _db_failed(self, event: str, exc: BaseException, *, quiet: bool = False, **fields: Any) -> None:
        """Log a database error of the supervisor's, with a hint when it is a known setup mistake.

        A WARNING, except with ``quiet`` for an unreachable database (the slots already say so).
        """
        from django.db import connections

        from ..dialects import dialect_class

        hint = dialect_class(connections[self._using].vendor).error_hint(exc)
        detail = "".join(f"{key}={value} " for key, value in fields.items())
        level = logging.INFO if quiet and isinstance(exc, DB_DOWN_ERRORS) else logging.WARNING
        log.log(level, "%s %serror=%s%s", event, detail, one_line(exc), f" hint: {hint}" if hint else "")
        close_connection(self._using)

    def _mark_timed_out(self, slot: Slot, job_id: int, timeout: float) -> Call:
        return self._db.submit(f"mark_timed_out:{job_id}", self._mark_timed_out_now, slot.name, job_id, timeout)

    def _mark_timed_out_now(self, name: str, job_id: int, timeout: float) -> None:
        from ..models import Job

        try:
            job = Job.objects.get_for_update(job_id, using=self._using)
            if job.state != Status.PROCESSING or job.worker != name:
                return  # finished just before the kill, or already someone else's
            new = Job.objects.fail(job, f"timed out after {int(timeout)} s (worker {name} was killed)",
                                   using=self._using)
        except (StaleJob, IllegalTransition, JobNotFound):
            return
        except DatabaseError as exc:
            self._db_failed("timeout_not_recorded", exc, job=job_id)  # reclaimed by lease
            return
        tracing.record_timeout(new, name, timeout, new.error)
        if new.state == Status.ERROR:
            self._extra[RETRIED] += 1
            send(signals.job_retried, Worker, job=new, worker=name, error=new.error, duration=timeout)
        else:
            self._extra[FAILED] += 1
            send(signals.job_failed, Worker, job=new, worker=name, error=new.error, duration=timeout)

    def _mark_cancelled(self, slot: Slot, job_id: int) -> Call:
        return self._db.submit(f"mark_cancelled:{job_id}", self._mark_cancelled_now, slot.name, job_id)

    def _mark_cancelled_now(self, name: str, job_id: int) -> None:
        """Record a killed cancelled job Cancelled, with who cancelled it and why (its request)."""
        from ..models import Job
        from ..queue import cancel_text

        try:
            job = Job.objects.get_for_update(job_id, using=self._using)
            if job.state != Status.PROCESSING or job.worker != name:
                return  # finished just before the kill, or already someone else's
            request = Job.objects.cancel_request_for(job_id, job.attempt_num, using=self._using)
            who = cancel_text(request.requested_by, request.reason) if request is not None else "cancelled"
            error = f"{who} (the handler did not stop within the grace period: worker {name} was killed)"
            new = Job.objects.modify(job, job.version, Status.CANCELLED, error=error, using=self._using)
        except (StaleJob, IllegalTransition, JobNotFound):
            return
        except DatabaseError as exc:
            self._db_failed("cancel_not_recorded", exc, job=job_id)  # reclaimed by lease, request kept
            return
        self._extra[CANCELLED] += 1
        send(signals.job_cancelled, Worker, job=new, worker=name, reason=error,
             duration=(new.duration_ms or 0) / 1000)

    def _after_death(self, slot: Slot, running: int) -> Call:
        """A slot died: hand back its claimed-but-unstarted jobs and mark its row stopped, so that its
        running job is free at once for any worker (its restart, or another one if the restart waits).

        Submitted to the database thread; the slot restarts only once this has finished.
        """
        self._beats.detach(slot.index)  # no more beats for its jobs: they are reclaimed at once
        # Its running job and the successes it had not recorded yet (batched, see recorder.py) were
        # started: they stay Processing and are reclaimed as a new attempt, not handed back.
        started = [running, *(slot.channel.unrecorded_ids() if slot.channel is not None else [])]
        slot.cleanup = self._db.submit(f"after_death:{slot.name}", self._after_death_now, slot.name,
                                       slot.incarnation, started)
        return slot.cleanup

    def _after_death_now(self, name: str, incarnation: str, started: list[int]) -> None:
        from ..models import Job
        from .heartbeat import mark_stopped

        using = self._using
        try:
            # Only jobs the dead PROCESS claimed (its incarnation): a job held under the same name since
            # an earlier process (a worker killed -9 and restarted under its name) may have run there;
            # it is reclaimed as a new attempt, never handed back.
            mine = Job.objects.using(using).filter(worker=name, incarnation=incarnation,
                                                   status_id=Status.PROCESSING)
            queues = set()
            for job in mine.exclude(pk__in=started):
                try:
                    Job.objects.release(job, using=using, wake=False)
                    queues.add(job.queue)
                except (StaleJob, IllegalTransition, JobNotFound):
                    pass
            wake_on_commit(using, queues)  # once for them all
            self._free_started(mine.filter(pk__in=started))
            mark_stopped(name, using, incarnation=incarnation)  # its running job is free for anyone at once
        except DatabaseError as exc:
            self._db_failed("slot_cleanup_skipped", exc, worker=name)

    def _free_started(self, jobs: Any) -> None:
        """The dead process's started jobs (its running one, its unrecorded successes) are free at once:
        their leases end now and their concurrency permits are released, each in one transaction.

        Marking the slot stopped frees an unlimited job for any claim, but a limited one is taken over
        only by the limited branch, with a free permit of its scope, and its permit was held until its
        lease ran out: a killed slot's limited job (and every job of its scope) waited the whole lease
        (issue 31). The process is gone, so nothing runs it. Each UPDATE names the dead incarnation and
        locks the row, so a job another worker has taken over meanwhile (and the permit it holds now)
        is never touched.
        """
        from django.db import connections, transaction
        from django.db.models import DateTimeField
        from django.db.models.expressions import RawSQL

        from ..dialects import get_dialect
        from ..limits import release

        dialect = get_dialect(connections[self._using])
        ended = RawSQL(dialect.now_plus("%s"), [-1.0], output_field=DateTimeField())
        for job_id in list(jobs.values_list("pk", flat=True)):
            with transaction.atomic(using=self._using):
                if jobs.filter(pk=job_id).update(lease_expires_at=ended):
                    with connections[self._using].cursor() as cursor:
                        release(cursor, dialect, [job_id])

    def _pause(self, began: float) -> None:
        """Wait for the next pass of the loop: :data:`TICK_SECONDS`, or less when something it acts on
        happens first (a slot process ends, a slot reports, a database call finishes), but never less
        than :data:`MIN_TICK_SECONDS` after the pass began.

        A fixed sleep made every hand-off wait for the next tick: a slot's first report for its first beat,
        the beat's answer that lets it claim, its exit, the end of a stop's database work. A worker that
        starts, drains a short backlog and exits (``--burst``) spent about 0.3 s of its 1.2 s in such
        waits. Only live processes and pipes are waited on (a dead one would be ready for ever): the
        loop's ``_watch`` detaches a dead slot in the pass the wait returns to.
        """
        if all(slot.done for slot in self._slots):
            return  # the loop ends now
        ready: list[Any] = [slot.proc.sentinel for slot in self._slots if slot.proc is not None and not slot.done]
        ready += self._beats.links()
        ready.append(self._db.finished_fd())
        wait_for(ready, TICK_SECONDS)
        self._db.clear_finished()
        rest = began + MIN_TICK_SECONDS - time.monotonic()
        if rest > 0:
            time.sleep(rest)  # a slot reporting after every claim must not spin the loop

    def _sweep(self) -> None:
        if self._sweeping is not None and not self._sweeping.finished:
            return
        self._sweeping = self._db.submit("sweep", self._sweep_now)

    def _sweep_now(self) -> None:
        try:
            self._host_sweep.run(time.monotonic())
        except DatabaseError as exc:
            self._db_failed("sweep_skipped", exc, quiet=True)

    def _maintain(self, now: float) -> None:
        """Submit the maintenance turn when it is due and the last one has finished (no pile-up behind a
        database that does not answer)."""
        if not self._maintenance.due(now) or (self._maintaining is not None and not self._maintaining.finished):
            return
        if self._maintaining is None and not self._beats.beaten and now - self._started < FIRST_MAINTENANCE_HOLD:
            # The first pass waits for the slots' first beat: on the one database thread, a pass (tenths
            # of a second) submitted before it held every slot's first claim back for as long.
            return
        self._maintaining = self._db.submit("maintenance", self._maintenance.run)

    # ----- reporting ------------------------------------------------------------------------------
    def _summary(self, seconds: float) -> Summary:
        totals = list(self._extra)
        for slot in self._slots:
            for i in range(N_COUNTERS):
                totals[i] += slot.counters[i]
        return Summary(totals[SUCCEEDED], totals[RETRIED], totals[FAILED], totals[CANCELLED], seconds,
                       self._exit_code, self._reason)

    def _progress_bar(self) -> Any:
        if not (self.progress and self.config.burst and sys.stderr.isatty()):
            return None
        from tqdm import tqdm

        from ..models import Job
        from ..states import CLAIMABLE

        counted: list[int] = []

        def count() -> None:
            qs = Job.objects.using(self._using).filter(status_id__in=CLAIMABLE)
            if self.config.queues:
                qs = qs.filter(queue__in=self.config.queues)
            if self.config.types:
                qs = qs.filter(job_type__name__in=self.config.types)
            try:
                counted.append(qs.count())
            except DatabaseError:
                close_connection(self._using)

        self._db.submit("count", count).wait(CLEANUP_SECONDS)  # a bar without a total rather than a wait
        total = counted[0] if counted else None
        return tqdm(total=total, unit="job", file=sys.stderr, dynamic_ncols=True, leave=True)
