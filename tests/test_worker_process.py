"""``manage.py run_queue_worker`` as real processes against the test database.

Burst and forever modes, SIGTERM and a second signal, kill -9 of a slot and of the whole worker,
timeouts, lease renewal of a long job, --max-jobs / --max-seconds. Short per-type leases and timeouts
are set on the JobType rows (the operator's knobs), which the worker processes read.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

from django_sqlqueue import jobtypes
from django_sqlqueue.models import Job, JobAttempt, JobType, Worker
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
worker_procs = wu.worker_procs
job_log = wu.job_log


def set_type(name: str, **settings: object) -> None:
    JobType.objects.update_or_create(name=name, defaults=settings)
    jobtypes.clear_cache()


def state(job: Job) -> Status:
    return Job.objects.get(pk=job.pk).state


def history(job: Job) -> list[tuple[int, str | None, str]]:
    return [(a.attempt_num, a.outcome.name if a.outcome else None, a.worker)
            for a in JobAttempt.objects.filter(job=job).select_related("outcome").order_by("attempt_num")]


def test_burst_drains_and_exits_0(worker_procs) -> None:
    Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(40)])
    Job.objects.enqueue("test.Echo", {"n": 1})
    w = worker_procs("--burst", "--concurrency", "2", "--batch", "5", "--worker-name", "burst")
    assert w.wait(60) == 0, w.output()
    assert Job.objects.filter(status_id=Status.COMPLETED).count() == 41
    assert "processed=41 succeeded=41 retried=0 failed=0" in w.stdout()
    rows = Worker.objects.filter(name__startswith="burst/")
    assert sorted(r.name for r in rows) == ["burst/0", "burst/1"]
    assert all(r.stopped_at is not None for r in rows)
    assert sum(r.jobs_done for r in rows) == 41


def test_forever_mode_picks_up_a_job_enqueued_while_idle(worker_procs) -> None:
    w = worker_procs("--worker-name", "idle")
    wu.wait_until(lambda: Worker.objects.filter(name="idle/0").exists(), 30, what="the slot to register")
    time.sleep(1.0)  # idle: the poll interval has grown
    job = Job.objects.enqueue("test.Noop")
    wu.wait_until(lambda: state(job) == Status.COMPLETED, 10, what="the job to complete")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert Worker.objects.get(name="idle/0").stopped_at is not None
    assert "processed=1 succeeded=1" in w.stdout()


def test_sigterm_finishes_running_job_and_releases_unstarted_ones(worker_procs, job_log, tmp_path) -> None:
    """SIGTERM while the first of a claimed batch of 3 runs: that job completes, the other two are handed
    back unstarted. The first job runs until a gate file exists, and the test opens the gate only once
    the supervisor has logged "worker_stopping" and the job's own ``should_stop()`` has said so (by order,
    not by a sleep: on a loaded machine a 1.5-s job could end before the signal arrived)."""
    gate = tmp_path / "gate"
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 300, "until": str(gate), "note_stop": True,
                                               "log": str(job_log.path)}) for _ in range(3)]
    w = worker_procs("--batch", "3", "--grace-seconds", "300", "--worker-name", "term")
    job_log.wait_for(jobs[0].pk, "start")
    w.signal(signal.SIGTERM)
    wu.wait_until(lambda: "worker_stopping" in w.stderr(), 60, what="the worker to log worker_stopping")
    job_log.wait_for(jobs[0].pk, "should_stop", 60)
    gate.touch()
    assert w.wait(60) == 0, w.output()
    first = Job.objects.get(pk=jobs[0].pk)
    assert first.state == Status.COMPLETED and first.attempt_num == 1
    assert [e for _, e in job_log.events(first.pk)] == ["start", "should_stop", "end"]
    for job in jobs[1:]:
        job = Job.objects.get(pk=job.pk)
        assert job.state == Status.PENDING and job.attempt_num == 0 and job.worker == ""
        assert history(job) == []
        assert job_log.events(job.pk) == []
    assert Worker.objects.get(name="term/0").stopped_at is not None


def test_second_signal_stops_at_once_and_the_job_is_reclaimed(worker_procs, job_log) -> None:
    set_type("test.Sleep", lease_seconds=60)
    job = Job.objects.enqueue("test.Sleep", {"seconds": 60, "then": 0, "log": str(job_log.path)})
    w = worker_procs("--worker-name", "twice")
    _, _, _, slot_pid = job_log.wait_for(job.pk, "start")
    w.signal(signal.SIGTERM)
    # The first signal handled (a graceful stop begun) before the second: order, not a pause.
    wu.wait_until(lambda: "worker_stopping" in w.stderr(), 60, what="the worker to log worker_stopping")
    w.signal(signal.SIGTERM)
    assert w.wait(10) != 0
    wu.wait_until(lambda: not wu.pid_alive(slot_pid), 10, what="the slot to die")
    assert state(job) == Status.PROCESSING
    # A worker of the same name takes it back at once (the lease still has a minute to run).
    again = worker_procs("--burst", "--worker-name", "twice")
    assert again.wait(60) == 0, again.output()
    assert state(job) == Status.COMPLETED
    assert history(job) == [(1, None, "twice/0"), (2, "Completed", "twice/0")]


def test_kill_9_of_a_slot_restarts_it_and_it_reclaims_its_job_at_once(worker_procs, job_log) -> None:
    set_type("test.Sleep", lease_seconds=60)
    job = Job.objects.enqueue("test.Sleep", {"seconds": 60, "then": 0, "log": str(job_log.path)})
    w = worker_procs("--worker-name", "k9slot")
    _, _, _, slot_pid = job_log.wait_for(job.pk, "start")
    os.kill(slot_pid, signal.SIGKILL)
    wu.wait_until(lambda: state(job) == Status.COMPLETED, 30, what="the restarted slot to finish the job")
    assert history(job) == [(1, None, "k9slot/0"), (2, "Completed", "k9slot/0")]
    assert [e for e in job_log.events(job.pk)] == [(1, "start"), (2, "start"), (2, "end")]
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()


def test_kill_9_of_the_worker_same_name_at_once_other_name_after_lease(worker_procs, job_log) -> None:
    set_type("test.Sleep", lease_seconds=60)
    first = Job.objects.enqueue("test.Sleep", {"seconds": 60, "then": 0, "log": str(job_log.path)})
    w = worker_procs("--worker-name", "k9")
    _, _, _, slot_pid = job_log.wait_for(first.pk, "start")
    w.proc.kill()  # the supervisor only: its slot must die with it
    w.proc.wait(10)
    wu.wait_until(lambda: not wu.pid_alive(slot_pid), 10, what="the slot to die with its supervisor")
    again = worker_procs("--burst", "--worker-name", "k9")
    assert again.wait(60) == 0, again.output()
    assert history(Job.objects.get(pk=first.pk)) == [(1, None, "k9/0"), (2, "Completed", "k9/0")]

    # Another worker name must wait for the lease (2 s here) of a killed worker's job.
    set_type("test.Sleep", lease_seconds=2)
    second = Job.objects.enqueue("test.Sleep", {"seconds": 60, "then": 0, "log": str(job_log.path)})
    w = worker_procs("--worker-name", "k9b")
    _, _, _, slot_pid = job_log.wait_for(second.pk, "start")
    w.proc.kill()
    w.proc.wait(10)
    killed_at = time.monotonic()
    other = worker_procs("--worker-name", "rescuer")
    wu.wait_until(lambda: state(second) == Status.COMPLETED, 30, what="another worker to reclaim the job")
    assert time.monotonic() - killed_at >= 1.0
    assert history(Job.objects.get(pk=second.pk)) == [(1, None, "k9b/0"), (2, "Completed", "rescuer/0")]
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0, other.output()


def test_timeout_kills_the_slot_marks_the_job_and_the_worker_goes_on(worker_procs, job_log) -> None:
    set_type("test.SleepForever", timeout_seconds=2, max_attempts=1)
    stuck = Job.objects.enqueue("test.SleepForever", {"log": str(job_log.path)}, priority=10)
    rest = [Job.objects.enqueue("test.Noop") for _ in range(5)]
    w = worker_procs("--burst", "--worker-name", "tmo")
    assert w.wait(60) == 0, w.output()
    stuck = Job.objects.get(pk=stuck.pk)
    assert stuck.state == Status.FAILED
    assert "timed out after 2 s" in stuck.error
    assert history(stuck) == [(1, "Failed", "tmo/0")]
    assert all(state(j) == Status.COMPLETED for j in rest)
    (_, _, _, slot_pid), = [e for e in job_log.lines() if e[0] == stuck.pk]
    assert not wu.pid_alive(slot_pid)
    assert "failed=1" in w.stdout() and "succeeded=5" in w.stdout()


def test_long_job_keeps_its_lease_while_alive(worker_procs, job_log, tmp_path) -> None:
    """A 10-s lease and a job that runs until the database shows its lease renewed past two leases from
    its start and past a lease from the moment a second worker (which would steal it if the lease lapsed)
    registered: it completes in its first attempt, on the first worker. The job ends by a gate opened on
    that order, not after a fixed time. (Was: a 2-s lease over a 6-s job, at risk on a loaded machine:
    the supervisor kills a slot whose lease has gone unrenewed for 80 % of its length, 1.6 s there.)"""
    lease = 10
    set_type("test.Sleep", lease_seconds=lease)
    gate = tmp_path / "gate"
    job = Job.objects.enqueue("test.Sleep", {"seconds": 300, "until": str(gate), "log": str(job_log.path)})
    a = worker_procs("--worker-name", "lease-a")
    job_log.wait_for(job.pk, "start")
    b = worker_procs("--worker-name", "lease-b")  # would steal the job if its lease lapsed
    b_up = wu.wait_until(lambda: Worker.objects.filter(name="lease-b/0").values_list("started_at", flat=True)
                         .first(), 60, what="the second worker's slot to register")
    started = Job.objects.get(pk=job.pk).started_at
    renewed_past = max(started + timedelta(seconds=2 * lease), b_up + timedelta(seconds=lease))
    wu.wait_until(lambda: Job.objects.filter(pk=job.pk, worker="lease-a/0", lease_expires_at__gt=renewed_past)
                  .exists(), 60, what="the job's lease to be renewed past two leases and the second worker's start")
    gate.touch()
    wu.wait_until(lambda: state(job) == Status.COMPLETED, 30, what="the long job to complete")
    assert [e for _, e in job_log.events(job.pk)] == ["start", "end"]
    assert history(job) == [(1, "Completed", "lease-a/0")]
    for w in (a, b):
        w.signal(signal.SIGTERM)
    for w in (a, b):
        assert w.wait(30) == 0, w.output()


def test_max_jobs_and_max_seconds(worker_procs) -> None:
    for _ in range(10):
        Job.objects.enqueue("test.Noop")
    w = worker_procs("--max-jobs", "4", "--concurrency", "2", "--batch", "3")
    assert w.wait(60) == 0, w.output()
    assert Job.objects.filter(status_id=Status.COMPLETED).count() == 4
    assert Job.objects.filter(status_id=Status.PENDING, attempt_num=0).count() == 6

    Job.objects.all().delete()
    started = time.monotonic()
    w = worker_procs("--max-seconds", "1")
    assert w.wait(30) == 0, w.output()
    assert time.monotonic() - started >= 1.0
