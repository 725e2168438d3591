"""Exactly-once claims under contention: threads with their own connections, and separate processes.

On PostgreSQL the thread tests also show that claimers do not wait for each other (``SKIP LOCKED``):
plain ``FOR UPDATE`` hands out every job once as well, by making each claimer queue behind the rows
another one holds.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections

from django_sqlqueue import Status
from django_sqlqueue.models import Job, JobAttempt, JobType
from django_sqlqueue.queue import JobSpec

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


@contextmanager
def a_claimer_holding_its_transaction(limit: int) -> Iterator[list[int]]:
    """A claimer that claims ``limit`` jobs and keeps its transaction open (the rows locked) until the
    block ends, then completes them and commits; yields the ids it holds, available from the start.

    Only where claims skip locked rows (PostgreSQL here); SQLite's claims are serialised by its write
    lock, so there it yields an empty list and holds nothing.
    """
    held: list[int] = []
    if connection.vendor != "postgresql":
        yield held
        return
    ready, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                jobs = Job.objects.claim("holder", limit)
                held.extend(j.pk for j in jobs)
                ready.set()
                release.wait(600)
                for job in jobs:
                    job.complete()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            ready.set()
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert ready.wait(60) and len(held) == limit, errors
        yield held
    finally:
        release.set()
        holder.join()
    assert not errors, errors


def _join_while_progressing(threads: list[threading.Thread], done: Callable[[], int], stall: float = 30.0) -> bool:
    """Wait for ``threads``; False as soon as ``done()`` stops growing for ``stall`` seconds (they are
    stuck waiting), True when they all ended."""
    last, since = -1, time.monotonic()
    while any(t.is_alive() for t in threads):
        if (count := done()) != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since > stall:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("batch", [1, 25])
def test_threads_claim_every_job_exactly_once(batch: int) -> None:
    """Eight claimers drain the queue, each job claimed once. On PostgreSQL a ninth claimer holds the
    first jobs in an open transaction all along: the eight must not wait for it (SKIP LOCKED; with plain
    FOR UPDATE they would queue behind its rows until it commits)."""
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
    with a_claimer_holding_its_transaction(5) as held:
        for t in threads:
            t.start()
        drained = _join_while_progressing(threads, lambda: sum(len(r) for r in results))
    for t in threads:
        t.join()
    assert drained, "the claimers stopped while another claimer's transaction was open: they waited for its locks"
    results.append(held)
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
    results: list[list[int]] = []
    try:
        deadline = time.monotonic() + 300
        while len(results) < procs_n:
            try:
                report = out.get(timeout=1)
            except queue.Empty:
                # a child that died without reporting fails the test now, not after the deadline
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a claiming child exited with {dead} without reporting"
                assert time.monotonic() < deadline, f"{procs_n - len(results)} children never reported"
                continue
            assert not isinstance(report, str), f"a claiming child failed:\n{report}"
            results.append(report)
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
            release.wait(600)  # a bound: the test's finally releases it as soon as its claim is done
        connections.close_all()

    t = threading.Thread(target=hold)
    t.start()
    assert holder_ready.wait(60)
    try:
        got = [j.pk for j in Job.objects.claim("w", 1)]
    finally:
        release.set()
        t.join()
    assert got == [second]


@pytest.mark.django_db(transaction=True)
def test_a_claimer_holding_its_transaction_open_does_not_delay_another() -> None:
    """PostgreSQL: a claim whose transaction is still open (its rows locked) does not make the next
    claimer wait: that one gets other jobs at once. With plain FOR UPDATE it would wait for the commit."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's SKIP LOCKED (SQLite serialises writers; SQL Server: tests/test_mssql_live.py)")
    _fill(4)
    held: list[int] = []
    holder_ready, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                held.extend(j.pk for j in Job.objects.claim("holder", 2))
                holder_ready.set()
                release.wait(600)  # a bound: the test's finally releases it
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            holder_ready.set()
            connections.close_all()

    got: list[int] = []
    claimed = threading.Event()

    def claim() -> None:
        try:
            got.extend(j.pk for j in Job.objects.claim("other", 2))
        except BaseException as exc:
            errors.append(exc)
        finally:
            claimed.set()
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    second = threading.Thread(target=claim)
    try:
        assert holder_ready.wait(60) and len(held) == 2, errors
        second.start()
        # A claim takes milliseconds; the bound is for a loaded 2-CPU machine. Without SKIP LOCKED the
        # claim would still be waiting here, for as long as the holder keeps its transaction open.
        in_time = claimed.wait(60)
        holder_still_open = not release.is_set() and holder.is_alive()
    finally:
        release.set()
        holder.join()
        if second.ident is not None:
            second.join()
    assert not errors, errors
    assert in_time and holder_still_open, "the second claim waited for the first claimer's transaction"
    assert len(got) == 2 and not set(got) & set(held), (held, got)
