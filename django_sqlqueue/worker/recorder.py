"""Batched recording of successful jobs: one statement for many completions, bounded delay.

A slot that runs short jobs spends most of its time committing: one transaction to claim, one per
job to record its outcome. The :class:`Recorder` keeps the successes of the batch being run and
records them together, in ONE transaction with the next claim when the batch is done
(:meth:`~django_sqlqueue.queue.JobManager.complete_and_claim`), so a slot commits once per batch
instead of once per job plus once per claim.

What stays true (at-least-once, and honest history):

- A success waits at most ``RECORD_DELAY_SECONDS`` (plus one statement) before it is committed: when
  the main thread is busy in a long handler, a watchdog thread records it (on a connection of its own,
  closed again at once: a slot holds one connection, not two).
- Until it is recorded the job stays Processing under this slot's name, token and lease (the
  heartbeat keeps renewing it), and the supervisor is told it has run (``SlotChannel.unrecorded``),
  so a slot that dies before recording does NOT hand it back as unstarted: it is reclaimed, run
  again as a new attempt, and its history shows the lost attempt. A job is never lost, and never
  recorded Completed before its handler returned.
- Each completion is token-checked like :meth:`JobManager.complete`; a job whose token moved on
  (an operator's change, a reclaim after a stall) is left alone and logged as refused.
- Errors, retries, cancellations and failures are not batched: the worker records them at once.

``job_succeeded`` is sent once the success is committed (not when the handler returns), from the
slot's main thread or, for a success the watchdog recorded, from the watchdog thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import signals
from .contract import SUCCEEDED
from .support import DB_DOWN_ERRORS, close_connection, one_line, send

if TYPE_CHECKING:
    from ..models import Job
    from .contract import SlotChannel
    from .heartbeat import Heartbeat
    from .runner import Outcome

log = logging.getLogger("django_sqlqueue.worker")

#: The longest a success waits to be recorded (the watchdog's deadline).
RECORD_DELAY_SECONDS = 0.2

ClaimFn = Callable[[list[tuple["Job", Any, float]]], tuple[list["Job"], list["Job"]]]


class Owner(Protocol):
    """What the recorder uses of the :class:`~django_sqlqueue.worker.Worker` that owns it."""

    name: str
    using: str
    channel: SlotChannel | None
    counters: Any
    heartbeat: Heartbeat

    def _db(self, fn: Callable[..., Any], *args: Any, retry_while_stopping: int = 0, **kwargs: Any) -> Any: ...


class Recorder:
    """Successes waiting to be recorded, and the watchdog thread that bounds their wait."""

    def __init__(self, worker: Owner, delay: float = RECORD_DELAY_SECONDS, *, sender: type | None = None) -> None:
        self.worker = worker
        self.delay = delay
        #: The sender of ``job_succeeded``: the Worker class (signals.py), passed in by the worker.
        self.sender = sender if sender is not None else type(worker)
        self._pending: list[Outcome] = []
        self._since = 0.0
        # Held across the database write: the main thread and the watchdog never record the same job.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    # ----- main thread ------------------------------------------------------------------------------
    def add(self, outcome: Outcome) -> None:
        """Keep a success for the next recording (the handler has returned; nothing is written yet)."""
        with self._lock:
            first = not self._pending
            if first:
                self._since = time.monotonic()
            self._pending.append(outcome)
            if self.worker.channel is not None:
                self.worker.channel.add_unrecorded(outcome.job.pk)
            full = len(self._pending) >= self._capacity()
        if full:
            self.flush()
        elif self._thread is None:
            self._thread = threading.Thread(target=self._watch, name=f"sqlqueue-recorder-{self.worker.name}",
                                            daemon=True)
            self._thread.start()
        elif first:
            # Only the first pending success moves the watchdog's deadline (``_since``); waking it for
            # every later one made it recompute the same deadline, a thread switch per job.
            self._wake.set()

    def pending_ids(self) -> list[int]:
        with self._lock:
            return [o.job.pk for o in self._pending]

    def flush(self, claim: ClaimFn | None = None) -> list[Job]:
        """Record every pending success; with ``claim``, in the same transaction as the next claim.

        ``claim(done)`` gets the (job, response, seconds the handler ran) triples and returns (completed
        rows, claimed jobs).
        Returns the claimed jobs. Database errors propagate with the successes still pending.
        """
        from ..models import Job

        with self._lock:
            items = list(self._pending)
            done = [(o.job, o.response, o.duration) for o in items]
            if claim is not None:
                completed, claimed = claim(done)
            elif done:
                completed, claimed = Job.objects.complete_many(done, using=self.worker.using), []
            else:
                return []
            del self._pending[:len(items)]
            self._publish()
        self._report(items, completed)
        return claimed

    def close(self) -> None:
        """Record what is pending (retrying a few times if the database is down); stop the watchdog."""
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.worker._db(self.flush, retry_while_stopping=3)
        except Exception:  # e.g. a receiver of job_succeeded: the outcomes are committed already
            log.exception("record_error worker=%s", self.worker.name)

    # ----- helpers ----------------------------------------------------------------------------------
    def _capacity(self) -> int:
        channel = self.worker.channel
        return channel.unrecorded_capacity if channel is not None else 1000

    def _publish(self) -> None:
        channel = self.worker.channel
        if channel is not None:
            channel.set_unrecorded([o.job.pk for o in self._pending])

    def _report(self, items: list[Outcome], completed: list[Job]) -> None:
        w = self.worker
        by_pk = {job.pk: job for job in completed}
        for outcome in items:
            job = outcome.job
            new = by_pk.get(job.pk)
            w.heartbeat.drop(job.pk, finished=True)
            if new is None:
                # Fencing: our lease was lost (reclaimed after a stall) or an operator changed the job.
                log.warning("job_result_refused worker=%s job=%s outcome=success reason=token %s is stale",
                            w.name, job.pk, job.version)
                continue
            w.counters[SUCCEEDED] += 1
            send(signals.job_succeeded, self.sender, job=new, worker=w.name, duration=outcome.duration,
                 response=outcome.response)
            log.debug("job_finished worker=%s job=%s attempt=%s status=Completed seconds=%.3f", w.name, job.pk,
                      job.attempt_num, outcome.duration)

    def _watch(self) -> None:
        """Watchdog: record successes that waited ``delay`` (the main thread is in a long handler)."""
        from django.db import connections

        try:
            while not self._closed:
                with self._lock:
                    due = self._since + self.delay if self._pending else None
                now = time.monotonic()
                if due is None or now < due:
                    self._wake.wait(None if due is None else due - now)
                    self._wake.clear()
                    continue
                try:
                    self.flush()
                    # Rare (a success behind a long handler): a connection for it now and then, rather
                    # than one more held by every slot (a worker holds one per slot plus one).
                    connections[self.worker.using].close()
                except DB_DOWN_ERRORS as exc:  # the main thread deals with outages; try again later
                    log.info("record_deferred worker=%s error=%s", self.worker.name, one_line(exc))
                    close_connection(self.worker.using)
                    self._wake.wait(self.delay)
                except Exception:
                    log.exception("record_error worker=%s", self.worker.name)
                    self._wake.wait(self.delay)
        finally:
            connections.close_all()  # this thread's connections only
