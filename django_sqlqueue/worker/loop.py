"""One worker slot: claim -> run -> record, with a heartbeat thread renewing its leases.

A :class:`Worker` runs in one OS process (a slot started by :mod:`django_sqlqueue.supervisor`, or
in-process, e.g. from a test or a custom command, where job timeouts are not enforced). Each start
registers a new *incarnation* of its name (a random id on the worker row, stamped on every job it
claims): a Processing row held by its name under another incarnation is a leftover of a previous
process of the same slot and is reclaimed by the claim at once, while a replaced process (paused past
the dead-after time while another took its name) finds out at its next beat and stops.

Threads: the main thread claims, runs handlers and records outcomes (the slot's one connection); the
heartbeat thread keeps the slot's *standing*: no claim without a recent beat, and a running job whose
lease may be gone is told to stop (and killed by the supervisor). Under a supervisor that thread does
no database work: it reports to the supervisor, whose one connection beats for every slot (beats.py);
in-process, it stamps the ``Worker`` row and renews the leases on a connection of its own. The
recorder's watchdog thread (see recorder.py).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DataError, IntegrityError, connections
from django.db.models import Q
from django.utils import timezone

from .. import jobtypes, signals
from ..conf import get_settings
from ..exceptions import IllegalTransition, InvalidArgument, JobNotFound, StaleJob, UnknownJobType
from ..handlers import registry
from ..queue.wakeups import wake_on_commit
from ..states import CLAIMABLE, Status
from . import runner, serving, wakeup
from .batch_size import BatchSizer
from .contract import (
    CANCELLED,
    EXIT_DB_GONE,
    EXIT_FATAL,
    EXIT_FORCED,
    EXIT_OK,
    EXIT_REPLACED,
    FAILED,
    N_COUNTERS,
    RELEASED,
    RETRIED,
    SUCCEEDED,
    SlotChannel,
    WorkerConfig,
    default_worker_name,
)
from .heartbeat import STOP_SHARE, Heartbeat, mark_stopped, register
from .recorder import Recorder
from .support import DB_DOWN_ERRORS, close_connection, configure_logging, one_line, send, tidy_connections

if TYPE_CHECKING:
    from ..models import Job

log = logging.getLogger("django_sqlqueue.worker")
T = TypeVar("T")

DB_RETRY_MIN, DB_RETRY_MAX = 0.5, 30.0


class DatabaseUnreachable(Exception):
    """A --burst worker waited ``db_wait`` seconds for the database: it stops (exit EXIT_DB_GONE)."""


class Worker:
    """Claims and runs jobs until told to stop (signal, supervisor, burst drained, max jobs)."""

    def __init__(self, config: WorkerConfig, channel: SlotChannel | None = None) -> None:
        self.config = config
        self.name = config.name
        self.channel = channel
        self.settings = get_settings()
        self.using = config.using or self.settings.DATABASE
        self.counters: Any = channel.counters if channel is not None else [0] * N_COUNTERS
        self._budget = config.max_jobs  # in-process budget (a supervisor shares one across slots)
        self._signals = 0
        from ..queue import new_incarnation

        self.incarnation = config.incarnation or new_incarnation()
        self.heartbeat = Heartbeat(self.name, self.using, self.settings.HEARTBEAT_SECONDS,
                                   exit_with_parent=channel is not None, incarnation=self.incarnation,
                                   dead_after=self.settings.WORKER_DEAD_AFTER_SECONDS,
                                   on_beat=self._on_beat if channel is not None else None,
                                   cancel_check=self.settings.CANCEL_CHECK_SECONDS, on_cancel=self._on_cancel,
                                   link=channel.link if channel is not None else None)
        self._running_id: int | None = None
        #: The grace period of the running job's handler (seconds to stop by itself once cancelled).
        self._cancel_grace = self.settings.CANCEL_GRACE_SECONDS
        #: Successes recorded together (with the next claim when the batch is done): see recorder.py.
        self.recorder = Recorder(self, sender=Worker)
        self.sizer = BatchSizer(config.batch, self.settings.BATCH_MAX, self.settings.BATCH_SECONDS)
        self._asked = 0
        #: When the next claim must also look for stuck Processing jobs (0: the first claim does).
        self._reclaim_at = 0.0
        self._listener: wakeup.Waker | None = None
        self._db_down_since: float | None = None
        #: The outage's first report was a WARNING (its end is one too); a starved slot's was INFO.
        self._db_down_warned = False
        #: A claim failed after it was sent: it may have committed with its reply lost (see _claim).
        self._claim_in_doubt = False
        self._standing_lost_since: float | None = None
        self._exit_code = EXIT_OK
        #: The job types it claims (worker/serving.py): read at start, again when they may have changed.
        self.serving = serving.Serving(config.types, config.types, ())
        self._serving_at = 0.0
        self._started = time.monotonic()
        self._gave_up = False
        self._registered = False
        self._waited = False  # logged slot_waiting (DEBUG) once

    # ----- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; return the process exit code (0 for a clean stop)."""
        saved = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                saved[signum] = signal.signal(signum, self._on_signal)
        try:
            return self._run()
        except DatabaseUnreachable:
            return EXIT_DB_GONE
        finally:
            for signum, previous in saved.items():
                signal.signal(signum, previous)

    def _run(self) -> int:
        found = self._db(serving.resolve, self.using, self.config.types)
        if found is None:
            return EXIT_OK  # told to stop before the database was reachable
        self.serving, self._serving_at = found, time.monotonic() + serving.REFRESH_SECONDS
        if self._db(register, self.name, self.using, self.incarnation, self.config.queues,
                    self.serving.row_types) is None:
            return EXIT_OK
        self._registered = True
        self.heartbeat.tell_connect(None)
        self.heartbeat.start()  # its first beat at once: nothing is claimed before one gets through
        self._listener, wake = self._waker()
        log.info("worker_started worker=%s pid=%s queues=%s types=%s batch=%s burst=%s wakeup=%s", self.name,
                 os.getpid(), ",".join(self.config.queues) or "*",
                 ",".join(self.serving.claim_types) or ("(none)" if self.serving.nothing else "*"),
                 self.config.batch or f"auto(max {self.sizer.max_size})", self.config.burst, wake)
        try:
            self._loop()
        finally:
            self._shutdown()
        if self.heartbeat.replaced:
            return EXIT_REPLACED
        return EXIT_FATAL if self.heartbeat.fatal else self._exit_code

    def _waker(self) -> tuple[wakeup.Waker | None, str]:
        """How this slot waits while idle. Under a supervisor it opens no LISTEN of its own: the
        supervisor's one LISTEN wakes one idle slot per notification (or, if it has none, the slot polls;
        SQLite's data_version needs no connection of its own)."""
        channel = self.channel
        if channel is None or channel.link is None:
            return wakeup.for_worker(self.using, self.config.queues, self.stop_requested, self.name)
        if channel.board is not None:  # the supervisor LISTENs (or will, once its connection is back)
            # A --burst or --max-jobs run ends when its slots find nothing (or the budget spent) at their
            # next claim: each looks on its own interval there, not after the idle backstop.
            alone = self.config.burst or bool(self.config.max_jobs)
            return (wakeup.BoardWaker(channel.board, channel.index, alone=alone),
                    "listen" if channel.board.listening.value else "poll")
        watcher = wakeup.SqliteWatcher.for_alias(self.using)
        return (watcher, "data_version") if watcher is not None else (None, "poll")

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only set flags here: logging or database work inside a signal handler can deadlock.
        self._signals += 1
        if self._signals > 1:
            os._exit(EXIT_FORCED)  # second signal: stop at once; running work is reclaimed by lease

    def stop_requested(self) -> bool:
        return (self._signals > 0 or self._gave_up or self.heartbeat.replaced or self.heartbeat.fatal is not None
                or (self.channel is not None and self.channel.stop.is_set()))

    def _on_beat(self, heartbeat: Heartbeat) -> None:
        """Tell the supervisor until when the running job is safe to keep running (called from the
        heartbeat thread after each beat, and from the main thread when a job starts). The job id goes
        with it: the supervisor ignores a value published for another job than the current one."""
        assert self.channel is not None
        running = self._running_id
        if running is None:
            return
        lost = heartbeat.replaced or running in heartbeat.lost
        self.channel.set_safe_until(running, 0.0 if lost else heartbeat.job_deadline(running, STOP_SHARE),
                                    heartbeat.ok_at is not None or heartbeat.replaced)

    def _on_cancel(self, job_id: int, request: Any) -> None:
        """The heartbeat found a cancel request for the running job (its thread): the handler sees it
        (``ctx.cancelled``, ``should_stop()``) and, under a supervisor, has the grace period to stop before
        its slot is killed. An in-process worker cannot kill its own thread: it relies on the handler."""
        if self.channel is not None:
            self.channel.request_cancel(job_id, self._cancel_grace)

    def _loop(self) -> None:
        s = self.settings
        idle = s.POLL_MIN_SECONDS
        while not self.stop_requested():
            if not self.heartbeat.may_claim():
                self._wait_for_standing()
                continue
            try:
                jobs = self._claim()
            except DB_DOWN_ERRORS as exc:
                self._db_trouble(exc)
                continue
            self._db_ok()
            if jobs is None:
                log.info("worker_budget_spent worker=%s max_jobs=%s", self.name, self.config.max_jobs)
                return
            if not jobs:
                if self.config.burst and not self._db(self._due_soon):
                    log.info("worker_drained worker=%s", self.name)
                    return
                self.idle_wait(idle * random.uniform(0.75, 1.25))
                idle = min(idle * 2, s.POLL_MAX_SECONDS)
                continue
            idle = s.POLL_MIN_SECONDS
            board = self.channel.board if self.channel is not None else None
            if board is not None:
                board.pass_poll(self.channel.index)  # busy now: another idle slot keeps looking
                if len(jobs) >= self._asked > 1:
                    board.wake_one(keep=False)  # a full batch: more may wait, for another idle slot
            started, ran = time.monotonic(), 0
            for job in jobs:
                if self.stop_requested():
                    self._release(jobs[ran:])
                    return
                if not self.heartbeat.may_start(job.pk):
                    # Beats are not getting through (or it was taken over): others may soon take these.
                    self._give_back(self._release(jobs[ran:], reason="heartbeat_stale"))
                    break
                if ran and self.sizer.over_budget(started):
                    # A slow job in a batch of short ones: let other slots have the jobs not started.
                    self._give_back(self._release(jobs[ran:], reason="batch_over_time"))
                    break
                # Sent at its turn, not with the claim: a batch's jobs handed back before their turn (a
                # slow job before them, a stop) are claimed again later, and would have been sent twice.
                send(signals.job_claimed, Worker, job=job, worker=self.name)
                self._run_one(job)
                ran += 1
            self.sizer.record(self._asked, len(jobs), ran, time.monotonic() - started)
            tidy_connections()
        if self.heartbeat.replaced:
            log.error("worker_stopping worker=%s reason=replaced", self.name)
        elif self.heartbeat.fatal:
            log.error("worker_stopping worker=%s reason=fatal error=%s", self.name, self.heartbeat.fatal)
        else:
            log.info("worker_stopping worker=%s reason=signal", self.name)

    def _wait_for_standing(self) -> None:
        """No beat got through lately (or none yet): claim nothing, record what ran, hand back what a
        claim with a lost reply took, and wait for a beat."""
        if not self.heartbeat.alive() and not self.heartbeat.replaced:
            raise RuntimeError("the heartbeat thread is gone: this slot cannot keep its jobs (its supervisor "
                               "restarts it)")
        now = time.monotonic()
        if self.config.burst and now - (self.heartbeat.ok_at or self._started) >= self.config.db_wait:
            self._give_up(f"no heartbeat got through for {self.config.db_wait:.0f} s")
        if self._standing_lost_since is None:
            self._standing_lost_since = now
        elif now - self._standing_lost_since >= 1.0 and self.heartbeat.ok_at is not None:
            log.warning("worker_not_claiming worker=%s reason=heartbeat_stale last_ok=%.1fs ago", self.name,
                        now - self.heartbeat.ok_at)
            self._standing_lost_since = now + 30.0  # say it again every 30 s, not every poll
        try:
            self.recorder.flush()  # complete only (nothing to do when no success is pending)
            if self._claim_in_doubt:
                self._hand_back_unreceived()
        except DB_DOWN_ERRORS as exc:
            self._db_trouble(exc)
            return
        self._sleep(0.05)

    def idle_wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for work to appear; returns early when a stop is requested.

        On PostgreSQL (with ``SQLQUEUE['NOTIFY_CHANNEL']`` set) it also returns as soon as an enqueue
        for one of this worker's queues commits (LISTEN/NOTIFY); on SQLite as soon as any other
        connection commits (``PRAGMA data_version``, see wakeup.py); on SQL Server it simply sleeps.
        """
        if self._listener is not None:
            if not self._waited:
                self._waited = True  # its first claim is done: from now on it waits for work
                log.debug("slot_waiting worker=%s", self.name)
            if self._listener.wait(seconds, self.stop_requested) and isinstance(self._listener, wakeup.BoardWaker):
                log.debug("slot_woken worker=%s", self.name)
            return
        self._sleep(seconds)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stop_requested():
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    # ----- claim, run, record ---------------------------------------------------------------------
    def _hand_back_unreceived(self) -> None:
        """Hand back jobs a claim took for this process whose reply never arrived (attempt refunded).

        A claim can commit on the server and lose its reply (a pooler restart, a connection cut): its
        jobs are Processing under this name and incarnation, but this process never saw them. They
        are exactly this incarnation's Processing jobs that it neither holds nor has run.
        """
        from ..models import Job

        known = set(self.heartbeat.held()) | set(self.recorder.pending_ids())
        rows = [job for job in Job.objects.using(self.using).filter(
            worker=self.name, incarnation=self.incarnation, status_id=Status.PROCESSING) if job.pk not in known]
        handed = 0
        for job in rows:
            try:
                Job.objects.release(job, using=self.using,
                                    note=f"claim reply lost: the claim by {self.name} committed but its reply "
                                         f"never arrived; handed back unstarted, attempt refunded")
                handed += 1
            except (StaleJob, IllegalTransition, JobNotFound):
                pass
        self._claim_in_doubt = False
        if handed:
            self.counters[RELEASED] += handed
            log.warning("claim_reply_lost worker=%s jobs=%s (handed back unstarted, attempts refunded)",
                        self.name, handed)

    def _claim(self) -> list[Job] | None:
        from ..models import Job

        if self._claim_in_doubt:
            self._hand_back_unreceived()
        self._standing_lost_since = None
        self._refresh_serving()
        if self.serving.nothing:
            return []  # no type it can run: claim nothing (the start line said so)
        want = self._reserve(self.sizer.next_size())
        if want == 0:
            return None
        self._asked = want
        # Stuck Processing jobs (own leftovers, expired leases, dead workers) are looked for on the first
        # claim, every RECLAIM_SECONDS, and whenever no due job was found (so an idle slot's polls are
        # full claims); the claims in between take only due jobs, a cheaper statement.
        now = time.monotonic()
        reclaim = now >= self._reclaim_at
        sent = now

        def claim(done: list[Any], reclaim: bool) -> Any:
            nonlocal sent
            sent = time.monotonic()  # the leases run from (after) this moment
            self._claim_in_doubt = True  # until its reply is in hand
            got = Job.objects.complete_and_claim(done, self.name, want, queues=self.config.queues,
                                                 types=self.serving.claim_types, using=self.using, reclaim=reclaim,
                                                 incarnation=self.incarnation)
            self._claim_in_doubt = False
            return got

        try:
            # The batch's successes are committed with this claim: one transaction, not two.
            jobs = self.recorder.flush(lambda done: claim(done, reclaim))
            if not jobs and not reclaim:
                jobs, reclaim = claim([], True)[1], True
        except BaseException:
            self._give_back(want)
            raise
        if not jobs:  # idle: the next claim is a full one again
            self._reclaim_at = 0.0
        elif reclaim:
            self._reclaim_at = now + self.settings.RECLAIM_SECONDS
        self._give_back(want - len(jobs))
        if len(jobs) > 1:
            jobs = self._limited_first(jobs)
        if jobs:
            # The lease each claim wrote (both stamps from the database clock): renewed with that length.
            self.heartbeat.hold({job.pk: max(1.0, (job.lease_expires_at - job.started_at).total_seconds())
                                 for job in jobs}, claimed_at=sent)
        return jobs

    def _limited_first(self, jobs: list[Job]) -> list[Job]:
        """The batch in run order: a job of a limited type (a claim takes at most one) first, the rest in
        claim order.

        Its permit was taken with the claim: waiting behind the batch's other jobs, it would hold a
        concurrency permit without running (a limit of 1 blocked for the whole batch while idle workers
        could run the next job of its scope), and a rate permit's period would run from a claim long
        before the start, so starts could bunch up past the limit (issue 31). Run first, it starts right
        after its claim. The type ids come from the cache the claim itself uses (no query).
        """
        limited = jobtypes.limited_type_ids(self.using)
        if not limited:
            return jobs
        return sorted(jobs, key=lambda job: job.job_type_id not in limited)  # stable: claim order otherwise

    def _type(self, job: Job) -> jobtypes.TypeInfo:
        """The job's type settings (cached; a cache miss reads the database, retried if it is down)."""
        info = self._db(jobtypes.get_type_by_id, job.job_type_id, using=self.using)
        if info is None:  # stopping while the database is down: the claim's lease settings will do
            return jobtypes.TypeInfo(job.job_type_id, "", 1, 0, 0, self.settings.TIMEOUT_SECONDS,
                                     self.settings.LEASE_SECONDS, False)
        return info

    def _run_one(self, job: Job) -> None:
        info = self._type(job)
        self._running_id = job.pk
        outcome: runner.Outcome | None
        try:
            handler = registry.get(info.name)
        except UnknownJobType:
            self._no_handler(job, info.name)
            return
        else:
            outcome = self._asked_to_stop_before(job)
        if outcome is None:
            if self.channel is not None:
                self.channel.set_current(job.pk, info.timeout_seconds)
                self._on_beat(self.heartbeat)
            job_id, beat = job.pk, self.heartbeat
            grace = handler.cancel_grace_seconds
            self._cancel_grace = self.settings.CANCEL_GRACE_SECONDS if grace is None else grace
            beat.start_running(job_id, job.attempt_num)
            try:
                outcome = runner.run(runner.JobContext(
                    job, handler, self.name,
                    lambda: self.stop_requested() or beat.at_risk(job_id) or job_id in beat.cancels,
                    lambda: beat.cancels.get(job_id)))
            finally:
                if self.channel is not None:
                    self.channel.handler_returned()
                request = beat.stop_running(job_id)
            if request is not None:
                outcome = self._cancelled(outcome, request)
        if outcome.kind is runner.Kind.SUCCESS:
            self.recorder.add(outcome)  # published to the supervisor as run-but-unrecorded first
        else:
            self._db(self._record, outcome, retry_while_stopping=3)
        if self.channel is not None:  # only now: a slot killed before this point ran the job
            self.channel.clear_current()
        if outcome.kind is not runner.Kind.SUCCESS:
            self.heartbeat.drop(job.pk, finished=True)  # the recorder drops a success once recorded
        self._running_id = None

    # ----- the types it serves (worker/serving.py) --------------------------------------------------
    def _refresh_serving(self) -> None:
        """Re-read the types it can run when they may have changed: a filtered worker every
        REFRESH_SECONDS (a new task it can run), any worker after a job of a type it cannot run."""
        forced = self._serving_at == 0.0
        if not forced and (time.monotonic() < self._serving_at or not self.serving.filtered or self.config.types):
            return  # an unfiltered worker reads nothing here until a job of a type it cannot run comes
        from ..models import Worker as WorkerRow

        found = serving.resolve(self.using, self.config.types)
        self._serving_at = time.monotonic() + serving.REFRESH_SECONDS
        if found != self.serving:
            WorkerRow.objects.using(self.using).filter(name=self.name, incarnation=self.incarnation).update(
                types=found.row_types)
            log.info("worker_serving worker=%s types=%s not_served=%s", self.name,
                     ",".join(found.claim_types) or ("(none)" if found.nothing else "*"),
                     ",".join(found.unhandled) or "-")
            self.serving = found

    def _no_handler(self, job: Job, type_name: str) -> None:
        """A job of a type this code cannot run (a type created after the worker read them): hand it back
        unstarted, its attempt refunded (a worker with the handler runs it), and stop claiming the type."""
        from ..models import Job

        note = (f"worker {self.name} has no handler for job type {type_name!r}: handed back unstarted, attempt "
                f"refunded (a worker whose code has the handler runs it)")
        try:
            if self._db(Job.objects.release, job, using=self.using, note=note, retry_while_stopping=3) is not None:
                self.counters[RELEASED] += 1
        except (StaleJob, IllegalTransition, JobNotFound):
            pass
        self.heartbeat.drop(job.pk, finished=False)
        self._running_id = None
        self._serving_at = 0.0  # read the types again before the next claim
        log.warning("job_unknown_type worker=%s job=%s type=%s (handed back unstarted, attempt refunded; this "
                    "worker no longer claims the type)", self.name, job.pk, type_name)

    def _asked_to_stop_before(self, job: Job) -> runner.Outcome | None:
        """A Cancelled outcome, without running the handler, for a later attempt of a job whose cancel
        request came in during an earlier one that ended before its worker acted on it (the worker died,
        or was killed, and the job was taken over); None: run it.

        Only a job's second and later attempts are looked at (one seek on the requests' unique index):
        an attempt that failed or was handed back under a request is Cancelled by that write already
        (modify.py), so a takeover is what is left; a first attempt pays nothing.
        """
        from ..models import Job
        from ..queue import cancel_text

        if job.attempt_num <= 1:
            return None
        request = self._db(Job.objects.cancel_request_for, job.pk, job.attempt_num, using=self.using)
        if request is None:
            return None
        log.warning("cancel_before_start worker=%s job=%s attempt=%s by=%r (requested during attempt %s)",
                    self.name, job.pk, job.attempt_num, request.requested_by, request.attempt_num)
        return runner.Outcome(runner.Kind.CANCEL, job, error=(
            f"{cancel_text(request.requested_by, request.reason)} (requested during attempt {request.attempt_num}, "
            f"which ended before its worker acted on it: attempt {job.attempt_num} was not started)"))

    def _cancelled(self, outcome: runner.Outcome, request: Any) -> runner.Outcome:
        """The outcome of a run that was asked to stop: a handler that returned successfully wins (its
        work is done: the cancel came too late); any other end (Cancel, Retry, an exception raised on
        the way out) is Cancelled with the request's who and why, never retried."""
        from ..queue import cancel_text

        if outcome.kind is runner.Kind.SUCCESS:
            log.warning("cancel_too_late worker=%s job=%s by=%r (the handler returned successfully first: the "
                        "job completes)", self.name, outcome.job.pk, request.requested_by)
            return outcome
        text = (f"{cancel_text(request.requested_by, request.reason)} (the handler stopped after "
                f"{outcome.duration:.1f} s; its own outcome was: {outcome.kind.value}"
                + (f": {(outcome.error.strip().splitlines() or [''])[-1][:200]}" if outcome.error else "") + ")")
        return runner.Outcome(runner.Kind.CANCEL, outcome.job, error=text, duration=outcome.duration)

    def _record(self, outcome: runner.Outcome) -> None:
        """Record an attempt that did not succeed, at once (successes go to the recorder, batched)."""
        from ..models import Job

        M, job, kind = Job.objects, outcome.job, outcome.kind
        K = runner.Kind
        try:
            ran = outcome.duration  # the handler's own time, not the time since the claim
            if kind in (K.ERROR, K.RETRY):
                new = M.fail(job, outcome.error, retry_in=outcome.retry_in, duration=ran, using=self.using)
            elif kind is K.CANCEL:
                new = M.modify(job, job.version, Status.CANCELLED, error=outcome.error, duration=ran,
                               using=self.using)
            else:
                new = M.modify(job, job.version, Status.FAILED, error=outcome.error, duration=ran,
                               using=self.using)
        except (StaleJob, IllegalTransition, JobNotFound) as exc:
            # Fencing: our lease was lost (reclaimed after a stall) or an operator changed the job.
            log.warning("job_result_refused worker=%s job=%s outcome=%s reason=%s", self.name, job.pk,
                        kind.value, exc)
            return
        except (DataError, IntegrityError, InvalidArgument, OverflowError, ValueError) as exc:
            # The outcome cannot be stored (a value the database refuses, a retry time out of range):
            # retrying the same write cannot help, and crashing would re-run the job in a loop. Park the
            # job as Failed with the reason.
            log.error("job_outcome_unstorable worker=%s job=%s outcome=%s error=%s", self.name, job.pk,
                      kind.value, one_line(exc))
            try:
                new = M.modify(job, job.version, Status.FAILED, using=self.using,
                               error=f"the outcome ({kind.value}) could not be stored: {one_line(exc)}")
            except (StaleJob, IllegalTransition, JobNotFound):
                return
        common = {"job": new, "worker": self.name, "duration": outcome.duration}
        if new.state == Status.ERROR:
            self.counters[RETRIED] += 1
            send(signals.job_retried, Worker, error=outcome.error, **common)
        elif new.state == Status.CANCELLED:
            self.counters[CANCELLED] += 1
            # the handler's own failure may have become a cancel (a request it ended before): say the job's
            send(signals.job_cancelled, Worker, reason=new.error or outcome.error, **common)
        else:
            self.counters[FAILED] += 1
            send(signals.job_failed, Worker, error=outcome.error, **common)
        last = (outcome.error.strip().splitlines() or [""])[-1][:200]
        log.warning("job_finished worker=%s job=%s attempt=%s status=%s seconds=%.3f error=%r", self.name,
                    job.pk, job.attempt_num, new.state.label, outcome.duration, last)

    def _release(self, jobs: list[Job], reason: str = "stopping") -> int:
        """Hand claimed-but-unstarted jobs back to Pending, their attempt not spent; return how many."""
        from ..models import Job

        released = 0
        for job in jobs:
            try:
                if self._db(Job.objects.release, job, using=self.using, wake=False,
                            retry_while_stopping=3) is not None:
                    released += 1
                    self.counters[RELEASED] += 1
            except (StaleJob, IllegalTransition, JobNotFound):
                pass
            self.heartbeat.drop(job.pk, finished=False)
        if released:  # one wake-up for the batch, not one per job
            self._db(wake_on_commit, self.using, {job.queue for job in jobs}, retry_while_stopping=1)
        if jobs:
            log.info("worker_released worker=%s jobs=%s reason=%s", self.name, released, reason)
        return released

    def _due_soon(self) -> bool:
        """Burst mode: is a matching job due now or within ``wait_due`` seconds (so worth waiting)?"""
        from ..models import Job, QueuePause

        horizon = timezone.now() + timedelta(seconds=self.config.wait_due)
        due = Q(status_id__in=CLAIMABLE, scheduled_for__lte=horizon)
        if self.config.wait_due:  # a dead worker's job whose lease runs out soon is work too
            due |= Q(status_id=Status.PROCESSING, lease_expires_at__lte=horizon)
        if self.serving.nothing:
            return False
        qs = (Job.objects.using(self.using).filter(due).exclude(job_type__paused=True)
              .exclude(queue__in=QueuePause.objects.using(self.using).values("queue")))
        if self.config.queues:
            qs = qs.filter(queue__in=self.config.queues)
        if self.serving.claim_types:
            qs = qs.filter(job_type__name__in=self.serving.claim_types)
        return qs.exists()

    # ----- budget (max jobs) -----------------------------------------------------------------------
    def _reserve(self, n: int) -> int:
        if self.channel is not None and self.channel.budget is not None:
            return self.channel.reserve(n)
        if self._budget is None:
            return n
        n = min(n, self._budget)
        self._budget -= n
        return n

    def _give_back(self, n: int) -> None:
        if n <= 0:
            return
        if self.channel is not None and self.channel.budget is not None:
            self.channel.give_back(n)
        elif self._budget is not None:
            self._budget += n

    # ----- database trouble -----------------------------------------------------------------------
    def _db(self, fn: Callable[..., T], *args: Any, retry_while_stopping: int = 0, **kwargs: Any) -> T | None:
        """Call ``fn``, retrying while the database is unreachable; None when stopping gives up."""
        tries = 0
        while True:
            try:
                result = fn(*args, **kwargs)
                self._db_ok()
                return result
            except DB_DOWN_ERRORS as exc:
                if self.stop_requested():
                    tries += 1
                    if tries > retry_while_stopping:
                        # A slot that never connected has nothing to hand back: no warning for that.
                        starved = self.channel is not None and self.channel.link is not None and not self._registered
                        (log.info if starved else log.warning)("worker_gave_up worker=%s call=%s error=%s", self.name,
                                    getattr(fn, "__name__", fn), one_line(exc))
                        return None
                self._db_trouble(exc)

    def _db_trouble(self, exc: BaseException) -> None:
        now = time.monotonic()
        first = self._db_down_since is None
        if first:
            self._db_down_since = now
        down_for = now - (self._db_down_since or now)
        if self.config.burst and not self._gave_up and down_for >= self.config.db_wait:
            self._give_up(f"the database was unreachable for {down_for:.0f} s: {one_line(exc)}")
        delay = min(DB_RETRY_MAX, DB_RETRY_MIN * 2 ** min(10, int(down_for).bit_length())) * random.uniform(0.8, 1.2)
        starved = self.channel is not None and self.channel.link is not None and not self._registered
        if starved:
            # Not connected yet (a role's connection limit, the server's max_connections): the supervisor
            # says once how many of its slots run; this slot retries with backoff.
            self.heartbeat.tell_connect(one_line(exc))
        if first:
            self._db_down_warned = not starved
        (log.warning if first and not starved else log.info)(
            "database_unavailable worker=%s error=%s retry_in=%.1f", self.name, one_line(exc), delay)
        close_connection(self.using)
        self._sleep(delay)

    def _give_up(self, why: str) -> None:
        """A --burst run (cron, CI) does not wait for the database for ever: after --db-wait it stops,
        non-zero (EXIT_DB_GONE), what it holds reclaimed by lease or by the next run of its name."""
        self._gave_up = True
        log.error("worker_gave_up worker=%s reason=database_unreachable db_wait=%.0f detail=%s", self.name,
                  self.config.db_wait, why)
        raise DatabaseUnreachable(why)

    def _db_ok(self) -> None:
        if self._db_down_since is not None:
            # At the level its start was reported: a starved slot that finally connects (another slot's
            # connection freed) is not a database coming back.
            (log.warning if self._db_down_warned else log.info)(
                "database_back worker=%s after=%.1fs", self.name, time.monotonic() - self._db_down_since)
            self._db_down_since = None

    def _shutdown(self) -> None:
        from ..models import Job

        self.recorder.close()  # record pending successes first: they ran, they are not "unstarted"
        unrecorded = set(self.recorder.pending_ids())  # the database is down: reclaimed later, as run
        leftover = [job_id for job_id in self.heartbeat.held()
                    if job_id != self._running_id and job_id not in unrecorded]
        if leftover and not self.heartbeat.replaced:  # after an unexpected error, or a stale heartbeat
            rows = self._db(lambda: list(Job.objects.using(self.using).filter(
                pk__in=leftover, worker=self.name, incarnation=self.incarnation, status_id=Status.PROCESSING)),
                retry_while_stopping=2)
            self._release(rows or [])
        if self._claim_in_doubt and not self.heartbeat.replaced:
            self._db(self._hand_back_unreceived, retry_while_stopping=2)
        self.heartbeat.stop()
        if self.channel is not None and self.channel.board is not None:
            self.channel.board.pass_poll(self.channel.index)  # a slot leaving stops polling
            if self.config.burst or self.config.max_jobs:
                self.channel.board.wake_idle()  # drained or budget spent: the others find out at once
        if self._listener is not None:
            self._listener.close()
        self._db(mark_stopped, self.name, self.using, self.heartbeat.take_done(), self.incarnation,
                 retry_while_stopping=2)
        counts = self.counters
        log.info("worker_stopped worker=%s succeeded=%s retried=%s failed=%s cancelled=%s released=%s", self.name,
                 counts[SUCCEEDED], counts[RETRIED], counts[FAILED], counts[CANCELLED], counts[RELEASED])
        connections.close_all()


# The worker's contract (worker_contract.py) stays importable from here, as it always was.
__all__ = ["CANCELLED", "DB_DOWN_ERRORS", "EXIT_FATAL", "EXIT_FORCED", "EXIT_OK", "EXIT_REPLACED", "FAILED",
           "N_COUNTERS", "RELEASED", "RETRIED", "SUCCEEDED", "SlotChannel",
           "Worker", "WorkerConfig", "configure_logging", "default_worker_name"]
