"""Adaptive claim batches (batching.py): grow while the queue is deep and jobs are short, shrink for
slow jobs, and hand a batch's unstarted jobs back when it runs over its time."""

from __future__ import annotations

import logging
import time

import pytest

from django_sqlqueue import signals
from django_sqlqueue.models import Job, JobAttempt
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from django_sqlqueue.worker.batch_size import BatchSizer
from django_sqlqueue.worker.loop import RELEASED, SUCCEEDED, Worker, WorkerConfig

# ----- the sizing rule, without a database ---------------------------------------------------------------


def test_size_doubles_while_claims_come_back_full_up_to_the_maximum() -> None:
    sizer = BatchSizer(None, max_size=50, budget_seconds=0.5)
    sizes = []
    for _ in range(8):
        asked = sizer.next_size()
        sizes.append(asked)
        sizer.record(asked, asked, asked, 0.0001 * asked)  # full claims of 0.1 ms jobs
    assert sizes == [1, 2, 4, 8, 16, 32, 50, 50]


def test_a_short_claim_takes_what_was_there_and_an_empty_one_goes_back_to_one() -> None:
    sizer = BatchSizer(None, max_size=50, budget_seconds=0.5)
    sizer.size = 32
    sizer.record(32, 5, 5, 0.001)
    assert sizer.next_size() == 5
    sizer.record(5, 0, 0, 0.0)
    assert sizer.next_size() == 1


def test_slow_jobs_cap_the_size_by_the_time_budget() -> None:
    sizer = BatchSizer(None, max_size=50, budget_seconds=0.5)
    sizer.size = 16
    sizer.record(16, 16, 16, 16 * 0.1)  # 100 ms per job: five fit in half a second
    assert sizer.next_size() == 5
    sizer.record(5, 5, 5, 5 * 2.0)  # now 2 s per job: one at a time
    assert sizer.next_size() == 1


def test_a_batch_over_time_resizes_by_the_new_pace() -> None:
    sizer = BatchSizer(None, max_size=50, budget_seconds=0.5)
    sizer.size = 20
    assert not sizer.over_budget(100.0, now=100.4)
    assert sizer.over_budget(100.0, now=100.6)
    sizer.record(20, 20, 1, 3.0)  # the first job took 3 s; 19 were handed back
    assert sizer.next_size() == 1


def test_a_fixed_size_never_changes_and_never_runs_over() -> None:
    sizer = BatchSizer(7, max_size=50, budget_seconds=0.5)
    for claimed in (7, 0, 3):
        sizer.record(7, claimed, claimed, 100.0)
        assert sizer.next_size() == 7
    assert not sizer.over_budget(0.0, now=1e9)
    with pytest.raises(ValueError, match="at least 1"):
        BatchSizer(0, max_size=50, budget_seconds=0.5)


# ----- a worker on the real database ---------------------------------------------------------------------


class Recording:
    """Wraps the worker's sizer to see every batch it learns from: (asked, claimed, ran)."""

    def __init__(self, worker: Worker) -> None:
        self.batches: list[tuple[int, int, int]] = []
        real = worker.sizer.record

        def record(asked: int, claimed: int, ran: int, seconds: float) -> None:
            self.batches.append((asked, claimed, ran))
            real(asked, claimed, ran, seconds)

        worker.sizer.record = record  # type: ignore[method-assign]


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_auto_batches_drain_a_deep_queue_in_few_claims(settings) -> None:
    # The growth rule alone: a time budget no pace reaches (on a loaded machine even a no-op job's pace
    # would cap the size below BATCH_MAX, rightly; that bound has its own tests below).
    settings.SQLQUEUE = {"BATCH_MAX": 40, "BATCH_SECONDS": 600}
    Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(300)])
    worker = Worker(WorkerConfig(name="auto", burst=True))
    seen = Recording(worker)
    assert worker.run() == 0
    assert worker.counters[SUCCEEDED] == 300
    claimed = [c for _, c, _ in seen.batches]
    assert sum(claimed) == 300
    assert claimed[:3] == [1, 2, 4]  # starts small...
    assert max(claimed) == 40  # ...grows to BATCH_MAX...
    assert len(seen.batches) < 20  # ...so 300 jobs take a handful of claims, not 300
    assert Job.objects.filter(status_id=Status.COMPLETED, attempt_num=1).count() == 300


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_batch_over_time_hands_its_unstarted_jobs_back(settings, caplog) -> None:
    settings.SQLQUEUE = {"BATCH_SECONDS": 0.3}
    slow = Job.objects.enqueue("test.Sleep", {"seconds": 0.8}, priority=10)
    quick = Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(9)])
    worker = Worker(WorkerConfig(name="overrun", burst=True))
    worker.sizer.size = 10  # as if the slot had ramped up on short jobs before this one
    seen = Recording(worker)
    claimed: list[int] = []

    def on_claimed(job: Job, **kwargs: object) -> None:
        claimed.append(job.pk)

    signals.job_claimed.connect(on_claimed, weak=False)
    try:
        with caplog.at_level(logging.INFO, logger="django_sqlqueue.worker"):
            assert worker.run() == 0
    finally:
        signals.job_claimed.disconnect(on_claimed)
    assert seen.batches[0] == (10, 10, 1)  # the slow job ran, the other nine went back
    # job_claimed at each job's turn: the nine handed back are sent once, when claimed again and run
    assert sorted(claimed) == sorted([slow.pk, *(j.pk for j in quick)])
    assert worker.counters[RELEASED] == 9
    assert "reason=batch_over_time" in caplog.text
    assert seen.batches[1][0] == 1  # 0.8 s per job: the next claim takes one job
    assert worker.counters[SUCCEEDED] == 10
    # Handed back without spending an attempt: each quick job ran once, with one history row.
    for job in quick:
        row = Job.objects.get(pk=job.pk)
        assert (row.state, row.attempt_num) == (Status.COMPLETED, 1)
        assert list(JobAttempt.objects.filter(job_id=job.pk).values_list("attempt_num", "outcome_id")) == [
            (1, Status.COMPLETED)]
    assert Job.objects.get(pk=slow.pk).state == Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_fixed_batch_runs_every_job_it_claimed(settings) -> None:
    settings.SQLQUEUE = {"BATCH_SECONDS": 0.3}
    Job.objects.enqueue("test.Sleep", {"seconds": 0.8}, priority=10)
    Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(9)])
    worker = Worker(WorkerConfig(name="fixed", burst=True, batch=10))
    seen = Recording(worker)
    assert worker.run() == 0
    assert seen.batches[0] == (10, 10, 10)
    assert worker.counters[RELEASED] == 0 and worker.counters[SUCCEEDED] == 10


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_busy_slot_still_looks_for_stuck_jobs_every_reclaim_seconds(settings, monkeypatch) -> None:
    settings.SQLQUEUE = {"RECLAIM_SECONDS": 0.2}
    # one job per claim, 20 ms each: claims come far more often than RECLAIM_SECONDS
    Job.objects.enqueue_many([JobSpec("test.Sleep", {"seconds": 0.02}) for _ in range(50)])
    full: list[bool] = []
    at: list[float] = []
    real = Job.objects.complete_and_claim

    def watched(*args, reclaim: bool = True, **kwargs):  # the real claim, noting which kind it was, and when
        full.append(reclaim)
        at.append(time.monotonic())
        return real(*args, reclaim=reclaim, **kwargs)

    monkeypatch.setattr(Job.objects, "complete_and_claim", watched)
    worker = Worker(WorkerConfig(name="busy", burst=True, batch=1))
    assert worker.run() == 0
    assert worker.counters[SUCCEEDED] == 50
    busy = full[1:-2]  # the first claim is full; the last ones find nothing and go full again
    assert full[0] is True
    assert busy.count(True) >= 2  # the drain takes 1 s at least (50 x 20 ms): a full look every 0.2 s
    # Between looks, due-only claims: a claim that follows a full one within half of RECLAIM_SECONDS is
    # due-only. By the claims' own times, not by their count: on a loaded machine the claims may all
    # come more than 0.2 s apart, and then every one is rightly a full look.
    soon = [i for i in range(1, len(full) - 2) if full[i - 1] and at[i] - at[i - 1] < 0.1]
    assert all(full[i] is False for i in soon), [(full[i], round(at[i] - at[i - 1], 3)) for i in soon]
    print(f"{len(full)} claims, {busy.count(False)} due-only, {len(soon)} within 0.1 s of a full one")
