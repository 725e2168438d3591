"""Exactly-once claims under contention: threads with their own connections, and separate processes."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter

import pytest
from django.db import connection, connections

from django_sqlqueue import Status
from django_sqlqueue.managers import JobSpec
from django_sqlqueue.models import Job, JobAttempt, JobType

from . import procutil

JOBS = 10_000
CLAIMERS = 8


def _fill(n: int) -> None:
    JobType.objects.get_or_create(name="Noop")
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, priority=i % 4) for i in range(n))


def _assert_each_claimed_once(claimed: list[int], n: int) -> None:
    counts = Counter(claimed)
    assert len(claimed) == n, f"{len(claimed)} claims for {n} jobs"
    assert not [k for k, c in counts.items() if c > 1], "a job was claimed twice"
    assert Job.objects.exclude(status_id=Status.COMPLETED).count() == 0, "jobs left unfinished"
    assert JobAttempt.objects.count() == n


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("batch", [1, 25])
def test_threads_claim_every_job_exactly_once(batch: int) -> None:
    n = JOBS if batch > 1 else JOBS // 5  # batch 1 is the slow path; fewer jobs keep it quick
    _fill(n)
    barrier = threading.Barrier(CLAIMERS)
    results: list[list[int]] = [[] for _ in range(CLAIMERS)]
    errors: list[BaseException] = []

    def claimer(slot: int) -> None:
        try:
            barrier.wait()
            while jobs := Job.objects.claim(f"thread/{slot}", batch):
                for job in jobs:
                    job.complete()
                    results[slot].append(job.pk)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    _assert_each_claimed_once([pk for r in results for pk in r], n)
    assert sum(1 for r in results if r) > 1, "only one claimer got work: no contention was tested"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_processes_claim_every_job_exactly_once() -> None:
    if connection.vendor == "sqlite":
        procs_n, n = 4, JOBS // 2
    else:
        procs_n, n = CLAIMERS, JOBS
    _fill(n)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(procs_n), ctx.Queue()
    procs = [ctx.Process(target=procutil.claim_until_empty, args=(barrier, out, f"proc/{i}", 20))
             for i in range(procs_n)]
    with procutil.child_env():
        for p in procs:
            p.start()
    try:
        results = [out.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    _assert_each_claimed_once([pk for r in results for pk in r], n)
    assert sum(1 for r in results if r) > 1


@pytest.mark.django_db(transaction=True)
def test_a_row_locked_by_another_transaction_is_skipped() -> None:
    """SKIP LOCKED (PostgreSQL) / READPAST (SQL Server) pass over a row another connection holds."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks: it serialises writers (BEGIN IMMEDIATE) instead")
    _fill(2)
    first, second = Job.objects.order_by("-priority", "scheduled_for", "id").values_list("pk", flat=True)[:2]
    holder_ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import transaction

        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=first))
            holder_ready.set()
            release.wait(30)
        connections.close_all()

    t = threading.Thread(target=hold)
    t.start()
    holder_ready.wait(30)
    try:
        got = [j.pk for j in Job.objects.claim("w", 1)]
    finally:
        release.set()
        t.join()
    assert got == [second]
