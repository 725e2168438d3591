"""Cancelling a running job under a real ``run_queue_worker`` (SQLite and PostgreSQL; default settings:
a look for requests every CANCEL_CHECK_SECONDS = 1 s while a job runs, CANCEL_GRACE_SECONDS = 2 s).

A handler that watches ``job.cancelled`` stops by itself and its slot goes on (same process); one that
ignores it is killed after the grace period and a new slot process runs the next job. Either way the
job ends Cancelled, not retried, with who cancelled it in the job and its attempt's history row.
"""

from __future__ import annotations

import signal
import time

import pytest

from django_sqlqueue.models import CancelRequest, Job, JobAttempt, Worker
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
worker_procs = wu.worker_procs
job_log = wu.job_log


def cancelled_within(job: Job, seconds: float, since: float) -> float:
    """Wait for ``job`` to be Cancelled (``seconds``: the expected time; the wait gives at least
    wu.WAIT_FLOOR_SECONDS); return how long it took from ``since`` (monotonic, taken before the cancel
    request was sent: the request commits, and its grace may start, before ``cancel()`` returns)."""
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.CANCELLED, seconds,
                  what=f"job {job.pk} to be Cancelled")
    return time.monotonic() - since


def test_a_cooperative_handler_stops_within_the_grace_and_its_slot_goes_on(worker_procs, job_log) -> None:
    job = Job.objects.enqueue("test.CancelAware", {"seconds": 30, "log": str(job_log.path)}, priority=10)
    w = worker_procs("--worker-name", "coop")
    _, _, _, pid = job_log.wait_for(job.pk, "start")
    time.sleep(1.5)  # past the first look: the request is found by a later one, as in real use
    asked_at = time.monotonic()
    asked = Job.objects.cancel(job.pk, by="operator tess", reason="wrong account")
    assert asked.state == Status.PROCESSING
    took = cancelled_within(job, 5, since=asked_at)
    job = Job.objects.get(pk=job.pk)
    assert job.error.startswith("cancelled by operator tess: wrong account (the handler stopped after")
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.outcome_id, attempt.worker) == (Status.CANCELLED, "coop/0")
    assert attempt.error == job.error
    assert [e for _, e in job_log.events(job.pk)] == ["start", "stopped"]  # it stopped itself: not killed
    print(f"cancelled {took:.2f} s after the request (a figure: the issue asks for 5 s on a quiet machine)")
    # The same slot process runs the next job.
    nxt = Job.objects.enqueue("test.Echo", {"log": str(job_log.path)})
    wu.wait_until(lambda: Job.objects.get(pk=nxt.pk).state == Status.COMPLETED, 10, what="the next job")
    assert job_log.wait_for(nxt.pk, "echo")[3] == pid
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert "cancelled=1" in w.stdout()


def test_a_handler_that_ignores_it_is_killed_after_the_grace_and_a_new_slot_goes_on(worker_procs, job_log) -> None:
    job = Job.objects.enqueue("test.Sleep", {"seconds": 30, "log": str(job_log.path)}, priority=10)
    w = worker_procs("--worker-name", "deaf")
    _, _, _, pid = job_log.wait_for(job.pk, "start")
    asked_at = time.monotonic()  # before the request: a descheduled test must not shorten the figure
    Job.objects.cancel(job.pk, by="operator tess", reason="stuck export")
    took = cancelled_within(job, 8, since=asked_at)
    job = Job.objects.get(pk=job.pk)
    assert job.error == ("cancelled by operator tess: stuck export (the handler did not stop within the grace "
                         "period: worker deaf/0 was killed)")
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.outcome_id, attempt.error) == (Status.CANCELLED, job.error)
    assert job.attempt_num == 1 and job.scheduled_for <= job.finished_at  # not retried
    assert not wu.pid_alive(pid)
    assert [e for _, e in job_log.events(job.pk)] == ["start"]
    print(f"cancelled {took:.2f} s after the request (grace 2 s; the issue asks for 5 s on a quiet machine)")
    assert 2.0 <= took  # not before the grace period (load only makes it later: no upper bound here)
    nxt = Job.objects.enqueue("test.Echo", {"log": str(job_log.path)})
    wu.wait_until(lambda: Job.objects.get(pk=nxt.pk).state == Status.COMPLETED, 15, what="the next job")
    assert job_log.wait_for(nxt.pk, "echo")[3] != pid  # a replacement slot process
    assert Worker.objects.filter(name="deaf/0").exists()
    assert "reason=cancelled" in w.stderr() + w.stdout()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert "cancelled=1" in w.stdout()
    assert CancelRequest.objects.filter(job=job, attempt_num=1).count() == 1
