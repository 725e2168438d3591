"""Workflows under real concurrency (issue 17): worker processes running a chain and a fan-in with kill -9,
and two dependencies (two batch members) finishing at the same moment in two sessions.

SQLite and PostgreSQL; not over TDS (Babelfish drops the table hints that keep two claimers apart:
tests/conftest.py TDS_SKIPS).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from django.db import connections

from django_sqlqueue import JobSpec, Status
from django_sqlqueue.models import Batch, Job
from django_sqlqueue.workflows import batch
from tests import workerutil as wu

worker_procs = wu.worker_procs
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.timeout(120)
def test_chains_run_in_order_on_two_workers_of_four_slots(worker_procs) -> None:
    """Four chains A -> B -> C: each link starts (database clock) after the one before it finished."""
    chains = []
    for n in range(4):
        a = JobSpec("test.Sleep", {"seconds": 0.2, "chain": n})
        b = JobSpec("test.Sleep", {"seconds": 0.2, "chain": n}, after=[a])
        c = JobSpec("test.Sleep", {"seconds": 0.2, "chain": n}, after=[b])
        chains.append(Job.objects.enqueue_many([c, b, a])[::-1])  # enqueued last-first: the order is the links'
    filler = Job.objects.enqueue_many([JobSpec("test.Sleep", {"seconds": 0.1}) for _ in range(16)])
    procs = [worker_procs("--worker-name", f"chain{i}", "--concurrency", "4", "--burst") for i in range(2)]
    for p in procs:
        assert p.wait(90) == 0, p.output()
    for a, b, c in chains:
        a, b, c = (Job.objects.get(pk=j.pk) for j in (a, b, c))
        assert [j.state for j in (a, b, c)] == [Status.COMPLETED] * 3
        assert a.finished_at <= b.started_at and b.finished_at <= c.started_at, (a, b, c)
    assert all(Job.objects.get(pk=j.pk).state is Status.COMPLETED for j in filler)
    # Which worker took which link is up to the claims (one worker may take a whole chain); the order is
    # what is asserted, and each link is released by the slot that finished the one before it.


@pytest.mark.timeout(420)  # a bound for a hang: the waits below add up to more under load
def test_a_fan_in_of_100_fires_its_callback_once_with_workers_killed(worker_procs, make_type) -> None:
    """100 jobs -> a batch callback and a job waiting for all 100. Two workers of four slots; one is
    killed (kill -9, the whole process group) mid-way and replaced: jobs it held are reclaimed, and a
    release it had not made yet is made by the finish of another dependency or the backstop."""
    make_type("test.Echo")
    with batch(on_success=("test.Echo", {"callback": True}), on_failure="test.Echo") as b:
        members = b.enqueue_many([JobSpec("test.Sleep", {"seconds": 0.15, "i": i}) for i in range(100)])
    summary = Job.objects.enqueue("test.Echo", {"summary": True}, after=members)
    assert summary.state is Status.WAITING
    victim = worker_procs("--worker-name", "victim", "--concurrency", "4")
    other = worker_procs("--worker-name", "steady", "--concurrency", "4")
    done = lambda: Job.objects.filter(batch_id=b.pk, status_id=Status.COMPLETED).count()  # noqa: E731
    wu.wait_until(lambda: done() >= 25, timeout=60, what="a quarter of the fan-in")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=30)
    assert done() < 100, "the fan-in finished before the kill: nothing was proved"
    replacement = worker_procs("--worker-name", "replacement", "--concurrency", "4")
    wu.wait_until(lambda: Batch.objects.get(pk=b.pk).finished_at is not None, timeout=90,
                  what="the batch to finish")
    row = Batch.objects.get(pk=b.pk)
    wu.wait_until(lambda: Job.objects.get(pk=summary.pk).state is Status.COMPLETED, timeout=60,
                  what="the job waiting for all 100 to run")
    callbacks = Job.objects.filter(job_type__name="test.Echo", payload__callback=True)
    wu.wait_until(lambda: callbacks.filter(status_id=Status.COMPLETED).exists(), timeout=60,
                  what="the callback to run")
    assert row.succeeded is True and len(row.callback_ids) == 1
    assert callbacks.count() == 1 and callbacks.get().pk == row.callback_ids[0]
    assert Job.objects.filter(job_type__name="test.Echo").count() == 2  # the callback and the summary
    summary = Job.objects.get(pk=summary.pk)
    assert summary.started_at >= max(Job.objects.filter(batch_id=b.pk).values_list("finished_at", flat=True))
    for p in (other, replacement):
        p.signal(signal.SIGTERM)
        assert p.wait(60) == 0, p.output()


def _race(finishers: list[Job]) -> None:
    """Complete each of ``finishers`` (claimed) in its own thread and session, all at one barrier."""
    barrier = threading.Barrier(len(finishers))
    errors: list[BaseException] = []

    def run(job: Job) -> None:
        try:
            barrier.wait(timeout=60)  # threads start slowly on a loaded machine
            Job.objects.complete_many([(job, None)])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(j,)) for j in finishers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_two_last_dependencies_finishing_at_once_release_once_and_fire_once(make_type) -> None:
    """Without the backstop: whichever finish commits last sees both finished, so the dependent is
    released and the batch fires, each exactly once, in every round."""
    make_type("Race")
    make_type("RaceCallback")
    for _ in range(15):
        with batch(on_finish="RaceCallback") as b:
            x, y = b.enqueue("Race"), b.enqueue("Race")
        waiting = Job.objects.enqueue("Race", after=[x, y])
        claimed = Job.objects.claim("racer", 2, types=["Race"])
        assert {j.pk for j in claimed} == {x.pk, y.pk}
        _race(claimed)
        assert Job.objects.get(pk=waiting.pk).state is Status.PENDING
        row = Batch.objects.get(pk=b.pk)
        assert row.finished_at is not None and len(row.callback_ids) == 1
        Job.objects.filter(pk=waiting.pk).update(status_id=Status.CANCELLED)  # out of the next round's claim
    assert Job.objects.filter(job_type__name="RaceCallback").count() == 15
