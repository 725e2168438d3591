"""The worker's contract with what starts it: its config, counters, exit codes and slot channel.

Everything here is shared by the worker (:mod:`django_sqlqueue.worker`), its parts (the recorder, the
slot process in :mod:`django_sqlqueue.slots`) and the supervisor, so that none of them imports the
module above it. This module imports nothing of the package.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("django_sqlqueue.worker")

#: Counter slots (shared with the supervisor when there is one).
SUCCEEDED, RETRIED, FAILED, CANCELLED, RELEASED = range(5)
N_COUNTERS = 5
#: Seconds an idle slot that is not its worker's poller waits for a bell before it looks by itself (a
#: backstop: the poller, a notification or a busy slot's hand-over wakes it first).
IDLE_BACKSTOP_SECONDS = 30.0
#: Longest wait for the wake-up board's lock. The board lives as long as the worker, and a slot killed
#: inside one of its few short critical sections (SIGKILL, the kernel's OOM killer) leaves that lock held
#: for ever: past this wait, the caller goes on without the board (see WakeBoard._locked).
BOARD_LOCK_SECONDS = 1.0
#: The fleet's look (PostgreSQL: the maintenance holder's notification every FLEET_LOOK_SECONDS) counts as
#: running while one arrived this many look intervals ago or less; otherwise the worker's poller polls.
LOOK_FRESH_INTERVALS = 3.0
#: The backstop of every idle slot while the fleet's look runs: the look names each job that comes within
#: a claim's reach (due, taken back, a permit freed) and the changes that make older jobs claimable wake
#: their queues themselves, so a look-time backstop is a last resort, not a routine: an idle fleet's
#: claims then stop growing with its slots (issue 28).
LOOKED_BACKSTOP_SECONDS = 300.0
#: Exit codes of a slot process (a supervisor believes one only if the slot also declared it, see
#: slots.py: a handler's own ``os._exit(3)`` is a death, not a fatal error).
EXIT_OK, EXIT_FORCED, EXIT_FATAL, EXIT_REPLACED = 0, 1, 3, 4
#: A slot that found its supervisor gone before it started (slots.py): no supervisor reads it.
EXIT_ORPHANED = 6
#: A --burst slot gave up on an unreachable database after WorkerConfig.db_wait seconds.
EXIT_DB_GONE = 5


def default_worker_name() -> str:
    """``host:pid-xxxxxx``: the host, the pid, and a random id drawn once per call (a process calls it
    once, at start).

    The host and pid alone are not unique: workers in PID namespaces that share a host name (containers,
    ``unshare --pid``) all run as pid 1 or so, and two live workers under one name would take each
    other's running jobs as their own leftovers (issue 31). A restarted worker gets a new name either
    way (its pid changed), so the random part costs nothing: its predecessor's jobs are taken over by
    the sweep of gone processes, or once its heartbeat is stale.
    """
    return f"{socket.gethostname()}:{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker claims and when it stops. Validated by the management command."""

    name: str
    queues: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    #: Jobs per claim: None adapts it to the queue and the jobs' pace (see batching.py); N fixes it.
    batch: int | None = None
    burst: bool = False
    #: Burst mode: keep going while a matching job becomes due within this many seconds.
    wait_due: float = 0.0
    #: Burst mode: seconds to wait for an unreachable database before giving up (exit non-zero).
    db_wait: float = 60.0
    #: Stop after this many jobs (None: no limit). Under a supervisor the budget is shared by slots.
    max_jobs: int | None = None
    using: str | None = None
    #: This process's registration id (a supervisor picks it, to know which jobs a dead slot held).
    incarnation: str = ""


@dataclass(frozen=True)
class SlotReport:
    """What a slot tells its supervisor, whose one connection beats for all its slots (beats.py)."""

    #: Jobs the slot holds: id -> lease seconds (the leases the supervisor renews).
    held: dict[int, float]
    #: Jobs finished since the slot started (the supervisor adds the difference to the row's jobs_done).
    done: int
    #: The job whose handler runs: (id, attempt, monotonic time to first look for a cancel request).
    running: tuple[int, int, float] | None = None
    #: Set when the slot could not connect at its start: why (None: connected).
    connect_error: str | None = None


@dataclass(frozen=True)
class BeatResult:
    """The supervisor's answer to a slot after a beat (or a look for cancel requests)."""

    #: Monotonic time (system-wide clock: comparable across the worker's processes) at which the beat
    #: was sent; meaningful only when ``ok``.
    sent: float = 0.0
    ok: bool = False
    #: Held jobs whose lease this beat renewed, and held jobs another worker or incarnation holds now.
    renewed: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    #: The slot's worker row belongs to another incarnation now, or was stamped stopped.
    replaced: bool = False
    #: Why the slot must stop although its row is its own (the SQLite file was replaced).
    fatal: str | None = None
    #: The slot's finished-job count the worker row's jobs_done includes now.
    done: int = 0
    #: Cancel requests found for the running attempt: (job id, attempt) -> request.
    cancels: dict[tuple[int, int], Any] = field(default_factory=dict)


class WakeBoard:
    """The idle slots of one worker and a wake-up for each (picklable into spawned slots).

    The supervisor's one LISTEN wakes ONE idle slot per notification (:meth:`wake_one`), not all of
    them: the others stay asleep instead of racing to claim the same job. A notification that finds no
    slot idle is kept (``pending``, at most one per slot) so a slot that was between an empty claim and
    its wait does not sleep through it.

    Only ONE idle slot polls (the *poller*, the first to idle when none is): the others wait for a bell,
    with :data:`IDLE_BACKSTOP_SECONDS` as a backstop. So an idle worker sends one claim per poll interval
    whatever its slots (issue 28: four idle slots sent four). A poller whose claim found work passes the
    role on (:meth:`pass_poll`): it wakes one idle slot, which polls from then on; a notification wakes an
    idle slot that is not the poller first. Without LISTEN (SQL Server) the board is the same, without
    the notifications: the poller finds new jobs within the poll interval, as every slot did before.
    """

    def __init__(self, ctx: Any, slots: int) -> None:
        self.idle = ctx.Array("b", slots)  # its lock guards idle, pending and poller
        self.pending = ctx.Value("i", 0, lock=False)
        #: The slot that polls while idle, or -1 (the next slot to idle takes the role).
        self.poller = ctx.Value("i", -1, lock=False)
        # A semaphore per slot, not an Event: its release is one sem_post (an Event's set waits for the
        # woken process to acknowledge, a round trip between processes on the pickup path).
        self.bells = [ctx.Semaphore(0) for _ in range(slots)]
        self.slots = slots
        #: 1 while the supervisor's LISTEN is in place (what a slot's worker_started line says).
        self.listening = ctx.Value("b", 0, lock=False)
        #: When (time.monotonic(), one clock for the host's processes) the fleet's look last arrived, and
        #: until when (seconds after it) that counts as the look running.
        self.looked_at = ctx.Value("d", 0.0, lock=False)
        self.look_fresh = ctx.Value("d", 0.0, lock=False)
        self._lock_lost = False

    @contextmanager
    def _locked(self) -> Iterator[bool]:
        """The board's lock, waited for at most :data:`BOARD_LOCK_SECONDS`: yields whether it is held.

        Not held means a process died holding it (nothing else holds it for more than a few stores), and
        it will not be released. Each caller then does what is safe without the board: a waiting slot
        polls on its own interval, a wake-up is not counted on (the slots' polls find the job), a dead
        slot's idle mark stays. The worker degrades to polling instead of hanging."""
        lock = self.idle.get_lock()
        # Once lost, for good (a dead process holds it): not waited for again, which would stall every
        # later call of this process (the supervisor's wake-ups, each slot's waits) by the full wait.
        held = lock.acquire(False) if self._lock_lost else lock.acquire(timeout=BOARD_LOCK_SECONDS)
        if not held and not self._lock_lost:
            self._lock_lost = True  # said once per process: every wait would say it again
            log.warning("wake_board_lock_timeout pid=%s (a slot died holding the wake-up board's lock: its "
                        "slots poll on their own interval from now on)", os.getpid())
        try:
            yield held
        finally:
            if held:
                lock.release()

    def looked(self, interval: float) -> None:
        """The fleet's look arrived (the supervisor's listener): while it keeps arriving about every
        ``interval`` seconds, the poller waits like the other idle slots, for a bell or its backstop."""
        self.look_fresh.value = max(interval, 0.1) * LOOK_FRESH_INTERVALS
        self.looked_at.value = time.monotonic()

    def look_runs(self, now: float) -> bool:
        """Whether the fleet's look runs, as this worker hears it: it LISTENs, and a look came lately."""
        return bool(self.listening.value) and now - self.looked_at.value <= self.look_fresh.value

    def wake_one(self, *, keep: bool = True) -> bool:
        """Wake one idle slot; True if one was. Else, with ``keep``, remember it for the next to idle."""
        with self._locked() as held:
            if not held:
                return False
            poller = self.poller.value
            # The poller last: it looks on its own timer anyway, and woken it would hand its role on.
            for index in [i for i in range(len(self.bells)) if i != poller] + ([poller] if poller >= 0 else []):
                if self.idle[index]:
                    self.idle[index] = 0
                    self.bells[index].release()
                    return True
            if keep:
                self.pending.value = min(len(self.bells), self.pending.value + 1)
            return False

    def wake_some(self, jobs: int) -> int:
        """The fleet's look asks this worker to wake ``jobs`` idle slots (its share of the jobs named in
        its queues: a burst that came due spreads over the slots at once, as the poller's hand-over
        did); the first is kept for the next slot to idle if none is. Returns how many were woken."""
        woken = 0
        while woken < jobs and self.wake_one(keep=woken == 0):
            woken += 1
        return woken

    def ring_all(self) -> None:
        """Wake every slot (the worker is stopping: they see it at once)."""
        for bell in self.bells:
            bell.release()

    def pass_poll(self, index: int) -> None:
        """Slot ``index`` claimed work: if it was the poller, the role goes to an idle slot, woken to take
        it, so that the worker keeps looking while this one runs its jobs. The woken slot is the poller
        from then on: if its claim gets work too, it hands the role on in turn, so a backlog wakes the
        idle slots one after the other (a batch of one per claim included)."""
        with self._locked() as held:
            if not held or self.poller.value != index:
                return
            self.poller.value = -1
            for other in range(len(self.bells)):
                if other != index and self.idle[other]:
                    self.idle[other] = 0
                    self.poller.value = other
                    self.bells[other].release()
                    return

    def wake_idle(self) -> None:
        """Wake every idle slot (one leaves for good: a --burst run drained, a --max-jobs budget spent;
        the others find out at their next claim, not at their backstop)."""
        with self._locked() as held:
            if not held:
                self.ring_all()  # every slot claims once more: as safe as waking only the idle ones
                return
            for index in range(len(self.bells)):
                if self.idle[index]:
                    self.idle[index] = 0
                    self.bells[index].release()

    def slot_gone(self, index: int) -> None:
        """Slot ``index``'s process is gone (it died, or was killed while idle): it is no longer idle, and
        if it was the poller another idle slot takes the role."""
        with self._locked() as held:
            if not held:
                return
            self.idle[index] = 0
            while self.bells[index].acquire(False):  # a wake-up rung for the dead process: not lost
                self.pending.value = min(len(self.bells), self.pending.value + 1)
        self.pass_poll(index)

    def wait(self, index: int, seconds: float, stop: Any, *, alone: bool = False) -> bool:
        """Slot ``index`` idles up to ``seconds`` if it is the poller (or ``alone``: a --burst or
        --max-jobs run, where every slot looks on its own interval), else up to
        :data:`IDLE_BACKSTOP_SECONDS` (at least ``seconds``): True when woken (or a wake-up was pending).

        While the fleet's look runs (:meth:`look_runs`), every idle slot, the poller too, waits up to
        :data:`LOOKED_BACKSTOP_SECONDS` instead: the look names its queues when due work appears, and a
        poll would only repeat it. From the first second in which the look has stopped arriving, the
        poller polls on its interval again and the others wait out their usual backstop (one that has
        waited longer ends at a random point of the backstop after the last look)."""
        bell = self.bells[index]
        with self._locked() as held:
            if not held:  # no board any more: wait for a bell on this slot's own interval, like a poller
                return bell.acquire(timeout=max(seconds, 0.0))
            if self.pending.value > 0:
                self.pending.value -= 1
                return True
            if self.poller.value < 0:
                self.poller.value = index
            polls = self.poller.value == index or alone
            self.idle[index] = 1
        try:
            began = time.monotonic()
            backstop = began + max(seconds, IDLE_BACKSTOP_SECONDS)
            looked_backstop = began + max(seconds, LOOKED_BACKSTOP_SECONDS)
            # When the looks stop, a slot that has waited past its backstop claims within a backstop of the
            # last look, at a point of its own: a fleet's idle slots do not all claim in the same second.
            spread = random.uniform(0.0, IDLE_BACKSTOP_SECONDS)
            end = began + seconds if polls else backstop
            while not stop():
                now = time.monotonic()
                if not alone:  # the poller's own interval, and every slot's backstop, only while no look arrives
                    if self.look_runs(now):
                        end = looked_backstop
                    elif polls:
                        end = began + seconds
                    else:
                        end = max(backstop, self.looked_at.value + self.look_fresh.value + spread)
                left = end - now
                if left <= 0:
                    return False
                # Long waits (an idle worker's slots wake rarely): a stop from the supervisor rings the
                # bell (ring_all); a signal sent to the slot alone is seen within a second.
                if bell.acquire(timeout=min(left, 1.0)):
                    return True
            return False
        finally:
            with self._locked() as held:
                if held:
                    self.idle[index] = 0
            while bell.acquire(False):  # a wake-up that came after the wait ended: the claim that follows
                pass  # serves it


class SlotChannel:
    """What a slot process shares with the supervisor (picklable into a spawned child)."""

    def __init__(self, ctx: Any, stop: Any, counters: Any, budget: Any, *, link: Any = None,
                 board: WakeBoard | None = None, index: int = 0) -> None:
        self.stop = stop  # a Flag (below): "stop after the current job"
        #: The supervisor's pid: a slot whose parent is another process by the time it asked to die with
        #: its parent was orphaned before it could ask (slots.py).
        self.supervisor_pid = os.getpid()
        #: The slot's end of a pipe to the supervisor: SlotReports go up, BeatResults come back.
        self.link = link
        #: Idle slots wait here for the supervisor's LISTEN (None: the slot waits its own way).
        self.board = board
        self.index = index
        self.counters = counters  # RawArray of N_COUNTERS, written by the slot only
        self.budget = budget  # shared Value of jobs left to claim (--max-jobs), or None
        # [job id, monotonic deadline, timeout seconds, 1 once the job was cancelled (the deadline is then
        # the end of the cancel's grace period, if sooner)]; a fresh array per incarnation, so a lock
        # left held by a killed process is never waited for again.
        self.current = ctx.Array("d", 4)
        # Jobs whose handler returned success but whose outcome the slot has not recorded yet (it
        # records successes in batches, see recorder.py): [count, id, id, ...]. If the slot dies,
        # these ran: they must not be handed back as unstarted.
        self.unrecorded = ctx.Array("q", 1 + self.unrecorded_capacity)
        # [job id, monotonic time until which that job is safe to keep running, 1 once the slot's
        # heartbeat has reported]: past it, its lease may be (or soon be) someone else's (heartbeat.py).
        self.safe = ctx.Array("d", 3)
        # The exit code the slot itself chose (-1: none): any other exit is a death, whatever its code.
        self.declared = ctx.Value("i", -1)

    #: Most run-but-unrecorded jobs a slot keeps (it records at once when this is reached).
    unrecorded_capacity = 1000

    # The per-job writes below go through the raw array under its lock, taken once: a synchronized
    # array's item assignment takes the (recursive) lock again for every item, twelve times a job.
    def set_unrecorded(self, job_ids: list[int]) -> None:
        with self.unrecorded.get_lock():
            raw = self.unrecorded.get_obj()
            n = min(len(job_ids), self.unrecorded_capacity)
            raw[1:1 + n] = job_ids[:n]
            raw[0] = n

    def add_unrecorded(self, job_id: int) -> None:
        """One more run-but-unrecorded job (the recorder's ``add``): appended, not the list rewritten.

        The array holds the first ``unrecorded_capacity`` of the recorder's pending successes, as
        :meth:`set_unrecorded` writes them; the recorder records at once when it reaches that many, so
        an id is dropped here only after such a recording failed (and the job is also ``current``'s
        until the next one starts)."""
        with self.unrecorded.get_lock():
            raw = self.unrecorded.get_obj()
            n = int(raw[0])
            if n < self.unrecorded_capacity:
                raw[1 + n] = job_id
                raw[0] = n + 1

    def unrecorded_ids(self) -> list[int]:
        """Read by the supervisor after the slot died (a lock it held then is not waited for long)."""
        lock = self.unrecorded.get_lock()
        got = lock.acquire(timeout=1)
        try:
            raw = self.unrecorded.get_obj()
            return list(raw[1:1 + max(0, min(raw[0], self.unrecorded_capacity))])
        finally:
            if got:
                lock.release()

    def set_safe_until(self, job_id: int, when: float, known: bool) -> None:
        with self.safe.get_lock():
            self.safe.get_obj()[:] = (job_id, when, float(known))

    def running_job_at_risk(self, job_id: int) -> bool:
        """Read by the supervisor (holding ``current``'s lock): the slot's heartbeat says its running job
        ``job_id`` may be someone else's now. A value published for another job is not believed."""
        lock = self.safe.get_lock()
        if not lock.acquire(timeout=0.05):  # the slot died holding it: its death is seen next round
            return False
        try:
            published, when, known = self.safe.get_obj()[:]
        finally:
            lock.release()
        return int(published) == job_id and bool(known) and time.monotonic() >= when

    def set_current(self, job_id: int, timeout: float) -> None:
        with self.current.get_lock():
            self.current.get_obj()[:] = (job_id, time.monotonic() + timeout, timeout, 0)

    def request_cancel(self, job_id: int, grace: float) -> bool:
        """The running job ``job_id`` was cancelled: the supervisor kills the slot ``grace`` seconds from
        now (or at its timeout, if sooner) unless the handler returns first. False (nothing changed) when
        the slot has moved on, or the handler has returned already (deadline inf: its outcome stands)."""
        with self.current.get_lock():
            raw = self.current.get_obj()
            if int(raw[0]) != job_id or raw[1] == float("inf"):
                return False
            raw[1] = min(raw[1], time.monotonic() + grace)
            raw[3] = 1
            return True

    def job_of_dead_slot(self) -> int:
        """The job a slot that has exited (or was killed) was running, 0 if none. Read without the
        array's lock: a slot killed inside :meth:`set_current` or :meth:`clear_current` died holding it,
        and would never release it; with the writer gone, nothing can change the value."""
        return int(self.current.get_obj()[0])

    def handler_returned(self) -> None:
        """The handler is done (no deadline any more), but its outcome is not recorded yet: if the slot
        dies now, the job was started and must not be handed back as unstarted."""
        with self.current.get_lock():
            self.current.get_obj()[1] = float("inf")

    def clear_current(self) -> None:
        with self.current.get_lock():
            self.current.get_obj()[:] = (0, 0, 0, 0)

    def reserve(self, n: int) -> int:
        lock = self.budget.get_lock()
        if not lock.acquire(timeout=5):
            return 0  # a slot died holding the lock: stop claiming rather than overshoot
        try:
            n = max(0, min(n, self.budget.value))
            self.budget.value -= n
            return n
        finally:
            lock.release()

    def give_back(self, n: int) -> None:
        lock = self.budget.get_lock()
        if lock.acquire(timeout=5):
            try:
                self.budget.value += n
            finally:
                lock.release()


# ----- flags shared with the slots: lock-free ---------------------------------------------------------
class Flag:
    """A boolean shared between the supervisor and its slots: ``set()`` and ``is_set()``, a shared byte.

    Not a ``multiprocessing.Event``, on purpose. An Event's ``wait`` counts its caller as a sleeper of the
    Event's condition, and a waiter killed in its wait (kill -9, a timeout's kill, the OOM killer) is never
    woken, so ``set()`` waited for it forever; its ``is_set`` holds the condition's lock, which a process
    killed inside it never gives back. Slots are killed as a matter of course, and the supervisor's
    ``set()`` must not hang on one: with the start gate (set once the supervisor's first connect attempt
    is over; slots.wait_for_go) an Event, the supervisor's database thread hung (no heartbeat, no slot
    restarted; test_soak, twice in CI)."""

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)


__all__ = ["BeatResult", "CANCELLED", "EXIT_FATAL", "EXIT_FORCED", "EXIT_OK", "EXIT_REPLACED", "FAILED", "N_COUNTERS",
           "RELEASED", "RETRIED", "SUCCEEDED", "SlotChannel", "SlotReport", "WakeBoard", "WorkerConfig",
           "default_worker_name", "Flag"]
