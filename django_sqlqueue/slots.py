"""What runs inside a slot process, and the shared memory it uses to talk to the supervisor."""

from __future__ import annotations

import ctypes
import logging
import signal
import sys
import time
from typing import Any

from .support import one_line
from .worker import EXIT_FATAL, WorkerConfig


class SlotChannel:
    """What a slot process shares with the supervisor (picklable into a spawned child)."""

    def __init__(self, ctx: Any, stop: Any, counters: Any, budget: Any) -> None:
        self.stop = stop  # multiprocessing Event: "stop after the current job"
        self.counters = counters  # RawArray of N_COUNTERS, written by the slot only
        self.budget = budget  # shared Value of jobs left to claim (--max-jobs), or None
        # [job id, monotonic deadline, timeout seconds]; a fresh array per incarnation, so a lock
        # left held by a killed process is never waited for again.
        self.current = ctx.Array("d", 3)
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

    def set_unrecorded(self, job_ids: list[int]) -> None:
        with self.unrecorded.get_lock():
            raw = self.unrecorded.get_obj()
            n = min(len(job_ids), self.unrecorded_capacity)
            raw[1:1 + n] = job_ids[:n]
            raw[0] = n

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
            self.safe[0], self.safe[1], self.safe[2] = job_id, when, float(known)

    def running_job_at_risk(self, job_id: int) -> bool:
        """Read by the supervisor (holding ``current``'s lock): the slot's heartbeat says its running job
        ``job_id`` may be someone else's now. A value published for another job is not believed."""
        with self.safe.get_lock():
            published, when, known = int(self.safe[0]), self.safe[1], self.safe[2]
        return published == job_id and bool(known) and time.monotonic() >= when

    def set_current(self, job_id: int, timeout: float) -> None:
        with self.current.get_lock():
            self.current[0], self.current[1], self.current[2] = job_id, time.monotonic() + timeout, timeout

    def handler_returned(self) -> None:
        """The handler is done (no deadline any more), but its outcome is not recorded yet: if the slot
        dies now, the job was started and must not be handed back as unstarted."""
        with self.current.get_lock():
            self.current[1] = float("inf")

    def clear_current(self) -> None:
        with self.current.get_lock():
            self.current[0] = self.current[1] = self.current[2] = 0

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


def slot_main(config: WorkerConfig, channel: SlotChannel, log_level: str | None) -> None:
    """Entry point of a slot process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the worker installs its own handlers
    _die_with_parent()
    import django

    django.setup()
    from .support import configure_logging
    from .worker import Worker

    configure_logging(log_level)
    try:
        code = Worker(config, channel).run()
    except Exception as exc:
        from django.core.exceptions import ImproperlyConfigured

        from .exceptions import UnknownJobType

        if isinstance(exc, ImproperlyConfigured | UnknownJobType):
            logging.getLogger("django_sqlqueue.worker").error("worker_fatal worker=%s error=%s", config.name,
                                                              one_line(exc))
            code = EXIT_FATAL
        else:
            raise
    channel.declared.value = code
    sys.exit(code)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the supervisor dies (kill -9 included)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the heartbeat thread notices the parent is gone within a beat
