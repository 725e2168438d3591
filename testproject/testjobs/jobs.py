"""Handlers for the worker tests and benchmarks (autodiscovered: this is the app's ``jobs`` module).

Names start with ``test.`` so they never collide with the job types the core tests create by hand.
Behaviour is driven by the payload; ``log`` (a file path) makes a handler append one line per call,
so a test in another process can see what ran, in which attempt and step.
"""

from __future__ import annotations

import os
import time
from typing import Any

import django_sqlqueue as sqlqueue
from django_sqlqueue.worker.runner import Cancel, JobContext, Retry


def _log(job: JobContext, text: str) -> None:
    path = job.payload.get("log") if isinstance(job.payload, dict) else None
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{job.pk} {job.attempt_num} {text} {os.getpid()}\n")


@sqlqueue.handler("test.Noop")
def noop(job: JobContext) -> Any:
    return None


@sqlqueue.handler("test.Echo")
def echo(job: JobContext) -> Any:
    _log(job, "echo")
    return {"payload": job.payload, "attempt": job.attempt_num, "subtypes": len(job.subtypes)}


@sqlqueue.handler("test.FailTimes")
def fail_times(job: JobContext) -> Any:
    """Raise in the first ``times`` attempts, then succeed."""
    _log(job, "run")
    if job.attempt_num <= job.payload.get("times", 1):
        raise RuntimeError(f"planned failure in attempt {job.attempt_num}")
    return {"succeeded_in_attempt": job.attempt_num}


@sqlqueue.handler("test.AlwaysFail")
def always_fail(job: JobContext) -> Any:
    _log(job, "run")
    raise ValueError("this job always fails")


@sqlqueue.handler("test.Sleep")
def sleep(job: JobContext) -> Any:
    """Sleep ``seconds`` (``then`` seconds in later attempts), logging "start" first and "end" last.

    ``until`` (a file path): end as soon as that file exists, ``seconds`` being then only the bound, so a
    test can order "the job still runs" against what it watches without guessing a duration. With it,
    ``note_stop`` (true) logs "should_stop" once, as soon as ``job.should_stop()`` says so while waiting:
    the slot itself has seen its worker's stop request.
    """
    _log(job, "start")
    seconds = float(job.payload.get("seconds", 1))
    if job.attempt_num > 1 and "then" in job.payload:
        seconds = float(job.payload["then"])
    gate = job.payload.get("until")
    if gate is None:
        time.sleep(seconds)
    else:
        note_stop = bool(job.payload.get("note_stop"))
        end = time.monotonic() + seconds
        while time.monotonic() < end and not os.path.exists(gate):
            if note_stop and job.should_stop():
                _log(job, "should_stop")
                note_stop = False
            time.sleep(0.02)
    _log(job, "end")
    return {"slept": seconds}


@sqlqueue.handler("test.SleepForever")
def sleep_forever(job: JobContext) -> Any:
    _log(job, "start")
    while True:
        time.sleep(3600)


@sqlqueue.handler("test.Steps", steps=["Render", "Send", "Confirm"])
def steps(job: JobContext, step: str) -> Any:
    """Log each step; fail at ``fail_at`` in the first ``fail_times`` attempts."""
    _log(job, step)
    if step == job.payload.get("fail_at") and job.attempt_num <= job.payload.get("fail_times", 1):
        raise RuntimeError(f"planned failure at step {step}")
    return f"{step} done in attempt {job.attempt_num} (before: {','.join(job.results)})"


@sqlqueue.handler("test.RetryLater")
def retry_later(job: JobContext) -> Any:
    """First attempt asks for a retry ``delay`` seconds later; the next one succeeds."""
    _log(job, "run")
    if job.attempt_num == 1:
        raise Retry("come back later", delay=float(job.payload.get("delay", 1)))
    return "done"


@sqlqueue.handler("test.Cancel")
def cancel(job: JobContext) -> Any:
    _log(job, "run")
    raise Cancel("nothing to do for this one")


@sqlqueue.handler("test.FailNow", max_attempts=5)
def fail_now(job: JobContext) -> Any:
    _log(job, "run")
    job.fail(job.payload.get("reason", "the record is gone for good"))


@sqlqueue.handler("test.BadReturn")
def bad_return(job: JobContext) -> Any:
    _log(job, "run")
    return {"when": object()}


@sqlqueue.handler("test.Ticker")
def ticker(job: JobContext) -> Any:
    """Tick for ``seconds``, appending ``<pid> <wall time> <event>`` lines to ``ticks`` (a file path).

    ``cooperative`` (default true): stop early, logging "stopped", once ``job.should_stop()`` says so.
    A test compares the lines of two processes to see whether they ever ran the job at the same time.
    """
    path, seconds = job.payload["ticks"], float(job.payload.get("seconds", 30))
    cooperative = job.payload.get("cooperative", True)

    def tick(event: str) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {time.time():.6f} {event} {job.attempt_num}\n")

    tick("start")
    end = time.monotonic() + seconds
    while True:
        # The check comes before every unit of work, the last ("end") included: a process resumed from a
        # pause past its lease finds its time up and must still not log work the twin now owns.
        if cooperative and job.should_stop():
            tick("stopped")
            raise Retry("told to stop")
        if time.monotonic() >= end:
            break
        tick("tick")
        time.sleep(0.02)
    tick("end")
    return {"ticked": seconds}


@sqlqueue.handler("test.LeaveAtomic")
def leave_atomic(job: JobContext) -> Any:
    """Enter transaction.atomic() and return without leaving it (a handler bug the worker must survive)."""
    from django.db import transaction

    from django_sqlqueue.models import QueueStatus

    _log(job, "run")
    transaction.atomic().__enter__()
    QueueStatus.objects.filter(pk=-1).update(name="never")  # some work inside the abandoned block
    return {"left": "open"}


@sqlqueue.handler("test.Exit", lease_seconds=5)
def exit_now(job: JobContext) -> Any:
    """Exit the slot process at once with the payload's ``code`` (a handler calling os._exit)."""
    _log(job, "run")
    os._exit(int(job.payload.get("code", 3)))


@sqlqueue.handler("test.TraceIds")
def trace_ids(job: JobContext) -> Any:
    """The ids of the span current while the handler runs (hex; zeros without OpenTelemetry's SDK)."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


@sqlqueue.handler("test.CancelAware", cancel_grace_seconds=10)
def cancel_aware(job: JobContext) -> Any:
    """Work in 50 ms units for ``seconds``; once ``job.cancelled`` says so, log "stopped" and cancel.

    Its grace period is long (10 s) so that a test can tell a cooperative stop from a kill.
    """
    _log(job, "start")
    end = time.monotonic() + float(job.payload.get("seconds", 30))
    while time.monotonic() < end:
        if job.cancelled:
            _log(job, "stopped")
            job.cancel(f"stopped at the request of {job.cancel_request.requested_by}")
        time.sleep(0.05)
    _log(job, "end")
    return {"done": True}


@sqlqueue.handler("test.CancelSelf")
def cancel_self(job: JobContext) -> Any:
    """Ask for its own cancel (as an operator would), wait until ``job.cancelled`` says it arrived, then
    ``then``: "return" (success: the cancel came too late) or "raise" (any other end: Cancelled)."""
    from django_sqlqueue.models import Job

    Job.objects.cancel(job.pk, by="itself", reason="testing")
    deadline = time.monotonic() + 60  # a bound (it ends as the cancel arrives): a loaded machine is slow
    while not job.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    if not job.should_stop():
        raise AssertionError("should_stop() is false after a cancel")
    if job.payload.get("then") == "return":
        return {"finished": "anyway"}
    raise Retry("the handler's own retry, overridden by the cancel")


def _timeline(job: JobContext, event: str) -> None:
    path = job.payload.get("timeline") if isinstance(job.payload, dict) else None
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{job.pk} {job.job_type_id} {job.concurrency_key or '-'} {event} {time.time():.6f}\n")


def _running_of_my_type(job: JobContext) -> int:
    """How many jobs of this job's type the timeline shows started and not yet ended."""
    running: set[str] = set()
    with open(job.payload["timeline"], encoding="utf-8") as f:
        for line in f:
            pk, type_id, _key, event, _at = line.split()
            if int(type_id) == job.job_type_id:
                (running.add if event == "start" else running.discard)(pk)
    return len(running)


def _others_waiting(job: JobContext) -> bool:
    from django_sqlqueue.models import Job
    from django_sqlqueue.states import Status

    return Job.objects.filter(job_type_id=job.job_type_id, status_id=Status.PENDING).exists()


def limited_sleep(job: JobContext) -> Any:
    """Sleep ``seconds``, appending "start" and "end" with the wall time to ``timeline`` (limits tests:
    the limits themselves are set on the job type rows by the test, so no other test's claim carries
    the limited branch).

    With ``peers`` N, a job first waits (at most ``peer_wait`` s, 10 by default) until the timeline shows
    N jobs of its type running at once: that a limit *can* be reached is then a matter of order, not of
    how fast a loaded machine claims (a limit that wrongly serialised them would still show 1, after
    the waits).
    """
    _timeline(job, "start")
    peers = int(job.payload.get("peers", 0))
    deadline = time.monotonic() + float(job.payload.get("peer_wait", 10))
    while peers and _running_of_my_type(job) < peers and time.monotonic() < deadline:
        if not _others_waiting(job):
            break  # the type's last jobs: no peer is coming
        time.sleep(0.02)
    time.sleep(float(job.payload.get("seconds", 0.3)))
    _timeline(job, "end")
    return None


sqlqueue.handler("test.Limited")(limited_sleep)
sqlqueue.handler("test.LimitedKeyed", concurrency_key="customer", concurrency_limit=None)(limited_sleep)
sqlqueue.handler("test.LimitedRate")(limited_sleep)


@sqlqueue.handler("test.CancelThenFail")
def cancel_then_fail(job: JobContext) -> Any:
    """Attempt 1 asks for its own cancel (as an operator would) and fails at once, long before its slot
    looks for a request (issue 31: the cancel must still stop the job); a later attempt logs and succeeds."""
    from django_sqlqueue.models import Job

    _log(job, "run")
    if job.attempt_num == 1 and job.payload.get("cancel", True):
        Job.objects.cancel(job.pk, by="operator", reason="testing")
        raise RuntimeError("failed right after the cancel request")
    return {"ran_in_attempt": job.attempt_num}


@sqlqueue.handler("test.ProcessInfo")
def process_info(job: JobContext) -> Any:
    """How the slot process running it was started: its command line ("spawn_main" for a spawned slot,
    the supervisor's own for a forked one) and its parent's pid."""
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode()
    return {"cmdline": cmdline, "pid": os.getpid(), "ppid": os.getppid()}
