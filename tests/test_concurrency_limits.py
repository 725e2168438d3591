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
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections
from django.db.models.functions import Now

from django_sqlqueue import jobtypes
from django_sqlqueue import limits as permits
from django_sqlqueue.bounds import parse_rate
from django_sqlqueue.exceptions import InvalidArgument
from django_sqlqueue.handlers import Registry
from django_sqlqueue.models import Job, JobType, LimitPermit
from django_sqlqueue.states import Status
from tests import workerutil as wu

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
    """3 starts an hour: the claims take 3 permits, each held one period from its job's start; once the
    period is over (the permits' ``held_until`` moved back by a period, as an hour's passing would: a
    short period here would race the statements of a loaded machine), 3 more start."""
    row = limited("Partner", rate_limit="3/h")
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
    assert permits.explain(held).startswith("held by the rate limit of Partner (3/h): 3 of 3 starts")
    rate_permits = list(LimitPermit.objects.filter(job_type=row, kind=LimitPermit.Kind.RATE))
    assert sorted(p.job_id for p in rate_permits) == sorted(j.pk for j in started)
    starts = {j.pk: Job.objects.get(pk=j.pk).started_at for j in started}
    for permit in rate_permits:
        # One period (an hour), not a lease or none: stamped by one claim, whatever the machine's load.
        assert 1800 < (permit.held_until - starts[permit.job_id]).total_seconds() < 5400, "one period"
        LimitPermit.objects.filter(pk=permit.pk).update(held_until=permit.held_until - timedelta(hours=1, seconds=1))
    # This process's claims leave the limited branch out for LIMITED_RECHECK_SECONDS (0.25 s) after one
    # found nothing, as for a permit freed elsewhere: forget that back-off instead of waiting it out.
    jobtypes.clear_cache()
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
    # slot 0, and the two slots taken away kept as held surplus rows until their jobs finish (issue 31)
    assert LimitPermit.objects.filter(job_type=row, hold_seconds__isnull=True).count() == 1
    assert LimitPermit.objects.filter(job_type=row, hold_seconds__lt=0, held_until__isnull=False).count() == 2
    running = first + more
    for job in running[1:]:  # the two that took the new slots finish: the first, on slot 0, still runs
        Job.objects.complete(job)
    held = Job.objects.get(pk=running[0].pk)
    assert held.state == Status.PROCESSING
    assert Job.objects.claim("w1", 1) == [], "lowered to 1 with one running: nothing more starts"
    Job.objects.complete(held)
    got = Job.objects.claim("w1", 1)
    assert len(got) == 1 and Job.objects.claim("w1", 1) == [] and processing("Export") == 1
    # Removing the limit: the type's jobs go through the ordinary claim again, all at once.
    row.concurrency_limit = None
    row.save()
    jobtypes.clear_cache()
    assert LimitPermit.objects.filter(job_type=row).count() == 0
    pending = Job.objects.filter(status_id=Status.PENDING).count()
    assert pending == 2 and len(Job.objects.claim("w9", 10)) == pending


def test_a_limit_lowered_and_raised_back_never_frees_a_running_jobs_permit() -> None:
    """Issue 31, item 4: limit 2 with 2 running, saved with 1 and then 2 again: still 2 running (was 3:
    the save deleted the permit row the second job held and created the slot again, free). And lowered
    to 1 with the job of slot 0 finishing first: the job above the limit still runs, so nothing starts
    until it has finished too."""
    row = limited("Export", concurrency_limit=2)
    for i in range(5):
        Job.objects.enqueue("Export", {"i": i})
    a, b = Job.objects.claim("w1", 1) + Job.objects.claim("w1", 1)
    for limit in (1, 2):
        row.concurrency_limit = limit
        row.save()
        jobtypes.clear_cache()
        assert Job.objects.claim("w1", 1) == [], f"limit {limit} with 2 running: nothing starts"
    assert processing("Export") == 2
    row.concurrency_limit = 1
    row.save()
    jobtypes.clear_cache()
    Job.objects.complete(a)  # it held slot 0; b holds the slot the limit took away
    assert Job.objects.claim("w1", 1) == [], "lowered to 1 with one running: nothing more starts"
    waiting = Job.objects.filter(status_id=Status.PENDING).first()
    assert permits.explain(waiting).startswith("held by the lowered limit of Export: 1 job(s) started under")
    Job.objects.complete(b)
    assert permits.explain(waiting) is None
    assert len(Job.objects.claim("w1", 1)) == 1 and Job.objects.claim("w1", 1) == []
    assert processing("Export") == 1
    row.save()  # a save drops surplus rows that are free
    assert not LimitPermit.objects.filter(job_type=row, hold_seconds__lt=0).exists()


def test_a_rate_lowered_and_raised_back_never_gives_a_period_its_starts_again() -> None:
    row = limited("CallPartner", rate_limit="3/m")
    for i in range(6):
        Job.objects.enqueue("CallPartner", {"i": i})
    started = [Job.objects.claim("w1", 1) for _ in range(3)]
    assert all(len(got) == 1 for got in started)
    for rate in ("1/m", "3/m"):
        row.rate_limit = rate
        row.save()
        jobtypes.clear_cache()
        assert Job.objects.claim("w1", 1) == [], f"{rate}: 3 starts in this minute already"
    assert Job.objects.filter(status_id=Status.PROCESSING).count() == 3


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_dead_workers_permit_frees_at_its_lease_expiry() -> None:
    """The claim holds the permit as long as the job's lease; the worker's last renewal (1 s) and then
    nothing: once that lease is past, the permit is free and another worker takes the stuck job over.
    The claim's lease is long (60 s): the "still held" check must not race it on a loaded machine."""
    limited("Export", concurrency_limit=1, lease_seconds=60)
    a = Job.objects.enqueue("Export", {"i": 0})
    b = Job.objects.enqueue("Export", {"i": 1})
    (got,) = Job.objects.claim("dead-worker", 1)
    assert got.pk == a.pk
    permit_until = LimitPermit.objects.get(job_type__name="Export").held_until
    # As long as the lease (60 s), not another length: both stamped by the one claim.
    assert abs((permit_until - Job.objects.get(pk=a.pk).lease_expires_at).total_seconds()) < 30, "held as the lease"
    assert Job.objects.claim("w2", 1) == []
    assert Job.objects.renew_leases("dead-worker", [a.pk], 1) == 1  # its last renewal, then it dies
    time.sleep(1.2)  # the lease (and so the permit) expires; the dead worker never renews it again
    taken = Job.objects.claim("w2", 1)
    assert len(taken) == 1, "the permit was freed by the lease's expiry"
    # The stuck job comes first (claim order) and is taken over under the permit: never both at once.
    assert taken[0].pk == a.pk and taken[0].attempt_num == 2 and taken[0].worker == "w2"
    assert processing("Export") == 1 and Job.objects.get(pk=b.pk).state == Status.PENDING
    assert LimitPermit.objects.get(job_type__name="Export").job_id == a.pk
    assert Job.objects.claim("w3", 1) == []


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
@pytest.mark.parametrize("batched", [False, True], ids=["slot", "supervisor"])
def test_a_late_renewal_does_not_revive_a_lease_whose_permit_another_job_took(batched: bool) -> None:
    """A worker alive but late: its job's lease (1 s) and so its permit run out, a claim gives the permit
    to a job that comes first, and then the late renewal arrives. It renews nothing (neither the lease
    nor the permit): the slot kills the job, and the limit of one is never two running. Found by a
    review (the renewal extended the lease whatever had become of the permit)."""
    limited("Export", concurrency_limit=1, lease_seconds=1)
    a = Job.objects.enqueue("Export", {"i": 0})
    (got,) = Job.objects.claim("slow", 1, incarnation="i1")
    assert got.pk == a.pk
    b = Job.objects.enqueue("Export", {"i": 1}, priority=10)  # comes first in claim order
    time.sleep(1.3)  # a's lease, and its permit with it, run out
    (taken,) = Job.objects.claim("w2", 1, incarnation="i2")
    assert taken.pk == b.pk and LimitPermit.objects.get(job_type__name="Export").job_id == b.pk
    assert Job.objects.renew_leases("w2", [b.pk], 60, incarnation="i2") == 1  # b runs on, whatever the load
    if batched:
        kept = Job.objects.renew_held([("slow", "i1", [a.pk])], 30)
    else:
        kept = Job.objects.renew_leases("slow", [a.pk], 30, incarnation="i1")
    assert kept == 0, "the late renewal revived a lease whose permit another job holds"
    # ... and the beat tells its slot the job is lost (the slot kills it), though it is still in its name.
    if batched:
        from django_sqlqueue.worker.beats import Beats

        assert Beats("default", "slow", 10.0, 60.0, 1.0)._find_taken([("slow", "i1", [a.pk])]) == {a.pk}
    else:
        from django_sqlqueue.worker.heartbeat import Heartbeat

        beat = Heartbeat("slow", "default", 10.0, exit_with_parent=False, incarnation="i1")
        beat.hold({a.pk: 1.0})
        beat._find_taken([a.pk])
        assert beat.lost == {a.pk} and beat.at_risk(a.pk)
    assert Job.objects.get(pk=a.pk).worker == "slow"
    assert LimitPermit.objects.get(job_type__name="Export").job_id == b.pk
    # a is a stuck job again: taken over once b's permit frees, never beside it.
    assert Job.objects.claim("w3", 1) == []
    Job.objects.complete(taken)
    (again,) = Job.objects.claim("w3", 1)
    assert again.pk == a.pk and again.attempt_num == 2 and processing("Export") == 1


def _until_permits_ran_out(type_name: str) -> None:
    """Wait until no concurrency permit of the type is held by the database clock (the event, through the
    suite's one waiting helper)."""
    wu.wait_until(lambda: not LimitPermit.objects.filter(job_type__name=type_name, kind=1, held_until__gte=Now()).exists(),
                  60, what="the permits to run out")


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_renewal_stalled_between_its_permit_and_its_lease_never_outlives_the_permit(monkeypatch) -> None:
    """The renewal's two statements have two clocks: stalled between them (a lock wait, a retry, a paused
    thread), the lease from the second would outlive the permit from the first, and a claim could take
    the permit while the lease still ran. The lease is capped at the permit: they run out together, and
    the next renewal is refused. Found by a review."""
    from django_sqlqueue.queue import housekeeping

    limited("Export", concurrency_limit=1, lease_seconds=60)
    Job.objects.enqueue("Export", {"i": 0})
    (x,) = Job.objects.claim("slow", 1, incarnation="i1")
    y = Job.objects.enqueue("Export", {"i": 1}, priority=10)
    renew = housekeeping.hooks.renew_permits

    def stalled(*args: Any, **kwargs: Any) -> None:
        renew(*args, **kwargs)
        time.sleep(2.0)

    monkeypatch.setattr(housekeeping.hooks, "renew_permits", stalled)
    assert Job.objects.renew_leases("slow", [x.pk], 10, incarnation="i1") == 1
    monkeypatch.setattr(housekeeping.hooks, "renew_permits", renew)
    held = Job.objects.get(pk=x.pk).lease_expires_at
    assert held == LimitPermit.objects.get(job_type__name="Export").held_until, "the lease outlives its permit"
    _until_permits_ran_out("Export")
    (taken,) = Job.objects.claim("w2", 1, incarnation="i2")
    assert taken.pk == y.pk
    assert Job.objects.renew_leases("slow", [x.pk], 60, incarnation="i1") == 0


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_late_renewal_does_not_revive_a_surplus_permit() -> None:
    """A limit lowered from 2 to 1 while two jobs run: the one on the slot the limit lost holds a surplus
    permit until it finishes. Late, its surplus permit runs out and the scope admits again under the
    lower limit: its renewal must not revive the surplus permit (two running under a limit of one).
    Found by a review."""
    row = limited("Export", concurrency_limit=2, lease_seconds=60)
    Job.objects.enqueue("Export", {"i": 0})
    Job.objects.enqueue("Export", {"i": 1})
    (a,) = Job.objects.claim("wa", 1, incarnation="ia")
    (x,) = Job.objects.claim("slow", 1, incarnation="i1")
    row.concurrency_limit = 1
    row.save()
    jobtypes.clear_cache()
    surplus = LimitPermit.objects.filter(job_type=row, hold_seconds__lt=0)
    assert [p.job_id for p in surplus] == [x.pk]  # the second slot, the one the limit lost
    Job.objects.complete(a)
    y = Job.objects.enqueue("Export", {"i": 2}, priority=10)
    assert Job.objects.claim("w2", 1) == []  # x's surplus permit is held: nothing is admitted beside it
    assert Job.objects.renew_leases("slow", [x.pk], 1, incarnation="i1") == 1  # then x falls silent
    _until_permits_ran_out("Export")
    (taken,) = Job.objects.claim("w2", 1, incarnation="i2")
    assert taken.pk == y.pk
    assert Job.objects.renew_leases("w2", [y.pk], 60, incarnation="i2") == 1
    assert Job.objects.renew_leases("slow", [x.pk], 60, incarnation="i1") == 0, "the surplus permit came back"
    assert not surplus.filter(held_until__gte=Now()).exists()


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_late_renewal_nobody_overtook_still_holds_its_lease_and_permit() -> None:
    """The late renewal of a job whose permit nobody took: the permit renewal gives it back, and the lease
    is extended as before (a slow machine does not lose its jobs for nothing). A rate-limited job needs
    no concurrency permit, and a job flagged limited after its claim holds none: both keep their leases."""
    limited("Export", concurrency_limit=1, lease_seconds=1)
    limited("Partner", rate_limit="100/s", lease_seconds=1)
    a = Job.objects.enqueue("Export", {"i": 0})
    r = Job.objects.enqueue("Partner", {"i": 0})
    ids = {j.pk for _ in range(2) for j in Job.objects.claim("slow", 1, incarnation="i1")}
    assert ids == {a.pk, r.pk}
    time.sleep(1.3)
    assert Job.objects.renew_leases("slow", [a.pk, r.pk], 30, incarnation="i1") == 2
    from django_sqlqueue.worker.beats import Beats

    assert Beats("default", "slow", 10.0, 60.0, 1.0)._find_taken([("slow", "i1", [a.pk, r.pk])]) == set()
    assert LimitPermit.objects.get(job_type__name="Export", kind=1).job_id == a.pk
    assert Job.objects.claim("w2", 2) == [], "the renewed permit stays held"
    # Flagged limited while it runs (its type got a limit after its claim): no permit, a live lease.
    limited("Late", lease_seconds=60)
    late = Job.objects.enqueue("Late", {})
    (running,) = Job.objects.claim("w4", 1, queues=["default"], incarnation="i4")
    assert running.pk == late.pk
    limited("Late", concurrency_limit=1, lease_seconds=60)
    Job.objects.filter(pk=late.pk).update(limited=True)  # what heal does for a type that got a limit
    assert Job.objects.renew_leases("w4", [late.pk], 30, incarnation="i4") == 1


@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_the_heartbeat_renews_the_permit_with_the_lease() -> None:
    limited("Export", concurrency_limit=1, lease_seconds=1)
    Job.objects.enqueue("Export", {"i": 0})
    Job.objects.enqueue("Export", {"i": 1})
    (got,) = Job.objects.claim("w1", 1, incarnation="i1")
    for _ in range(3):  # past the claim's 1 s lease
        time.sleep(0.5)
        # Renewed for 30 s: a loaded machine may stall between two statements longer than a short
        # renewal (a late renewal nobody took over still holds, so the 0.5 s gaps are not a race).
        assert Job.objects.renew_leases("w1", [got.pk], 30, incarnation="i1") == 1
    assert Job.objects.claim("w2", 1) == [], "a renewed permit stays held"


# ----- the SQL: T-SQL parses, permits read with READPAST, nothing counted ----------------------------------
@pytest.mark.parametrize("reclaim", [True, False])
def test_the_limited_tsql_claim_parses_and_skips_held_permits(reclaim: bool) -> None:
    from sqlglot import exp

    from django_sqlqueue.dialects import ClaimRequest
    from django_sqlqueue.dialects.mssql import batch

    from .test_tsql import dialect as make_dialect
    from .test_tsql import hints, index_hint, parse_batch

    dialect = make_dialect.__wrapped__()  # the module fixture's function: a never-connected mssql dialect
    req = ClaimRequest("host:1/0", 5, queues=("emails",), types=(3,), reclaim=reclaim, limited=True)
    parts = dialect.claim_batch(req)
    declares, body, results = parse_batch(parts)
    assert [type(s).__name__ for s in body] == ["Insert", "Update", "Insert", "Update"]
    pick, claim, _, hold = body
    permit_reads = [t for t in pick.find_all(exp.Table) if t.name == "django_sqlqueue_limitpermit"]
    # the permit taken, and the read of its scope's surplus rows (a limit lowered under running jobs)
    assert sorted(t.alias for t in permit_reads) == ["p", "sp"]
    permit_reads = [t for t in permit_reads if t.alias == "p"]
    job_reads = [t for t in pick.find_all(exp.Table) if t.name == "django_sqlqueue_job"]
    assert len(permit_reads) == 1 and len(job_reads) == 1
    assert hints(permit_reads[0]) == hints(job_reads[0]) == {"INDEX", "UPDLOCK", "ROWLOCK", "READPAST"}
    # pinned: the permits through their free-permit index (an ordered seek on held_until), the job
    # through the limited index (issue 29.2, 29.6)
    assert (index_hint(permit_reads[0]), index_hint(job_reads[0])) == ("sqlqueue_permit_free", "sqlqueue_job_limited")
    # Never a count (READPAST would make it low): the permit's own columns decide.
    assert not list(pick.find_all(exp.Count)) and "COUNT(" not in batch(parts).upper()
    assert hold.this.name == "hp" or "django_sqlqueue_limitpermit" in hold.sql("tsql")
    assert "[held_until] IS NULL OR p.[held_until] < SYSUTCDATETIME()" in parts.body[0]
    # The limited job joins the claim's candidates (its claim-order columns and token read with it, no
    # second read of its row), and only an unlimited type passes the due branch.
    assert "lp.jversion AS version FROM @permit AS lp" in parts.body[1]
    assert "pt.[concurrency_limit] IS NOT NULL OR pt.[rate_limit] <> N''" in parts.body[1]


def test_the_postgresql_limited_claim_locks_permits_and_jobs_skip_locked() -> None:
    from django.db.backends.postgresql.base import DatabaseWrapper

    from django_sqlqueue.dialects import ClaimRequest
    from django_sqlqueue.dialects.postgresql import PostgresDialect

    from .test_claim_docs import _SETTINGS

    dialect = PostgresDialect(DatabaseWrapper({**_SETTINGS, "ENGINE": "django.db.backends.postgresql"}, "pg-render"))
    sql, params = dialect.claim_sql(ClaimRequest("w", 5, queues=("q",), limited=True))
    assert sql.count("%s") == len(params)
    permit_cte = sql[sql.index("permit AS ("):sql.index("limited AS (")]
    assert permit_cte.endswith("FOR UPDATE OF p SKIP LOCKED), ")
    # The permit is free by its own columns (what FOR UPDATE re-checks after waiting), never a count.
    assert '(p."held_until" IS NULL OR p."held_until" < statement_timestamp())' in permit_cte and "count(" not in sql.lower()
    limited_cte = sql[sql.index("limited AS ("):sql.index("picked AS (")]
    assert limited_cte.endswith("FOR UPDATE OF j SKIP LOCKED) l), ") and "CROSS JOIN LATERAL" in limited_cte
    assert "held AS (UPDATE" in sql


# ----- concurrent claimers: threads with their own connections (SQLite, PostgreSQL) ------------------------
def _drain(claimers: int, batch: int, hold: float, until, record) -> list[BaseException]:
    """``claimers`` threads claim ``batch`` at a time, call ``record(job, +1)``, hold each job ``hold``
    seconds, ``record(job, -1)`` and complete it, until ``until()``; return the errors they hit."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(claimers)

    def claimer(slot: int) -> None:
        try:
            barrier.wait()
            deadline = time.monotonic() + 60
            while not until() and time.monotonic() < deadline:
                jobs = Job.objects.claim(f"thread/{slot}", batch)
                if not jobs:
                    time.sleep(0.005)
                    continue
                for job in jobs:
                    record(job, 1)
                time.sleep(hold)
                for job in jobs:
                    record(job, -1)
                Job.objects.complete_many([(job, None) for job in jobs])
        except BaseException as exc:  # surfaced by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


class Overlap:
    """Jobs running at once per scope, as the claimers saw them (inside the claim-to-completion span,
    so never more than the database's own count)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.max: dict[str, int] = {}
        self.done = 0

    def record(self, job: Job, delta: int) -> None:
        key = f"{job.job_type_id}/{job.concurrency_key}"
        with self.lock:
            self.now[key] = self.now.get(key, 0) + delta
            self.max[key] = max(self.max.get(key, 0), self.now[key])
            self.done += delta < 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_threads_never_run_more_than_the_limit_and_unlimited_jobs_flow() -> None:
    """6 claimers, batches of 3, 20 jobs of a type limited to 2 plus 40 unlimited ones: never more than
    2 of the limited type at once, the limit reached, everything done, every job claimed once."""
    export = limited("Export", concurrency_limit=2)
    JobType.objects.get_or_create(name="Noop")
    for i in range(20):
        Job.objects.enqueue("Export", {"i": i}, priority=5)
    for i in range(40):
        Job.objects.enqueue("Noop", {"i": i})
    seen = Overlap()
    errors = _drain(6, 3, 0.05, lambda: seen.done >= 60, seen.record)
    assert not errors, errors
    assert seen.done == 60 and Job.objects.exclude(status_id=Status.COMPLETED).count() == 0
    assert seen.max[f"{export.pk}/"] == 2, seen.max
    assert Job.objects.filter(attempt_num=1).count() == 60, "a job was claimed twice"
    assert not LimitPermit.objects.filter(job_id__isnull=False).exists(), "a permit was left held"


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_threads_respect_a_limit_per_key_each_key_independently() -> None:
    sync = limited("Sync", concurrency_limit=1)
    for i in range(24):
        Job.objects.enqueue("Sync", {"i": i}, concurrency_key="abc"[i % 3])
    seen = Overlap()
    errors = _drain(6, 2, 0.05, lambda: seen.done >= 24, seen.record)
    assert not errors, errors
    assert seen.done == 24
    assert {k: v for k, v in seen.max.items()} == {f"{sync.pk}/a": 1, f"{sync.pk}/b": 1, f"{sync.pk}/c": 1}


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_threads_respect_a_rate_limit_over_a_sliding_window() -> None:
    """5/s over 15 jobs with 6 claimers: never more than 5 starts (claims, by the database clock) in any
    1-s window, and so at least 2 s from the first start to the last."""
    limited("Partner", rate_limit="5/s")
    for i in range(15):
        Job.objects.enqueue("Partner", {"i": i})
    seen = Overlap()
    errors = _drain(6, 1, 0.0, lambda: seen.done >= 15, seen.record)
    assert not errors, errors
    starts = sorted(Job.objects.values_list("started_at", flat=True))
    assert len(starts) == 15
    for i in range(len(starts) - 5):
        assert starts[i + 5] - starts[i] > timedelta(seconds=1), f"6 starts within 1 s: {starts[i:i + 6]}"
    assert starts[-1] - starts[0] >= timedelta(seconds=2)


# ----- what operators see: queue_why, the admin's job list and job type page --------------------------------
def test_queue_why_and_the_admin_say_why_a_job_waits(admin_client) -> None:
    from io import StringIO

    from django.core.management import call_command

    export = limited("Export", concurrency_limit=1)
    running = Job.objects.enqueue("Export", {"i": 0})
    waiting = Job.objects.enqueue("Export", {"i": 1})
    Job.objects.claim("w1", 5)
    out = StringIO()
    call_command("queue_why", str(waiting.pk), stdout=out)
    assert "- Held by the concurrency limit of Export: 1 of 1 running." in out.getvalue()
    page = admin_client.get("/admin/django_sqlqueue/job/").content.decode()
    assert "held by limit" in page and "held by the concurrency limit of Export: 1 of 1 running" in page
    detail = admin_client.get(f"/admin/django_sqlqueue/job/{waiting.pk}/change/").content.decode()
    assert "Held by the concurrency limit of Export: 1 of 1 running." in detail
    type_page = admin_client.get(f"/admin/django_sqlqueue/jobtype/{export.pk}/change/").content.decode()
    assert 'name="concurrency_limit"' in type_page and 'name="rate_limit"' in type_page
    assert "(no key): 1 / 1" in type_page
    # Running it frees nothing for the waiting one until it finishes; then nothing is said.
    Job.objects.complete(Job.objects.get(pk=running.pk))
    out = StringIO()
    call_command("queue_why", str(waiting.pk), stdout=out)
    assert "held by" not in out.getvalue().lower()


def test_the_admin_changes_a_limit_at_run_time_and_refuses_bad_ones(admin_client) -> None:
    export = limited("Export", concurrency_limit=1)
    url = f"/admin/django_sqlqueue/jobtype/{export.pk}/change/"
    form = {"description": "", "max_attempts": "", "backoff_base_seconds": "", "backoff_max_seconds": "",
            "timeout_seconds": "", "lease_seconds": "", "paused": ""}
    response = admin_client.post(url, {**form, "concurrency_limit": "3", "rate_limit": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert LimitPermit.objects.filter(job_type=export).count() == 3
    for bad, message in (({"concurrency_limit": "0", "rate_limit": ""}, "greater than or equal to 1"),
                         ({"concurrency_limit": "", "rate_limit": "10 a second"}, "rate limit must look like"),
                         ({"concurrency_limit": "2", "rate_limit": "5/s"}, "not both")):
        page = admin_client.post(url, {**form, **bad}).content.decode()
        assert message in page, bad
    assert JobType.objects.get(pk=export.pk).concurrency_limit == 3
    assert admin_client.post(url, {**form, "concurrency_limit": "", "rate_limit": "5/s"}).status_code == 302
    assert set(LimitPermit.objects.filter(job_type=export).values_list("kind", "hold_seconds")) == {(2, 1.0)}


# ----- the claim still seeks with limits in use -------------------------------------------------------------
def test_the_limited_claim_seeks_its_indexes_with_a_deep_limited_backlog() -> None:
    """5,000 waiting jobs of a saturated limited type, 1,000 unlimited ones: the claim's plan walks the
    claim index and the limited index, never the whole job table (PostgreSQL, SQLite; SQL Server's plan
    is read where one runs: tests/test_mssql_live.py)."""
    from django_sqlqueue.ops.explain import explain_claim
    from django_sqlqueue.queue import JobSpec

    limited("Export", concurrency_limit=2)
    if connection.vendor == "microsoft":  # Babelfish returns no plan: it says so, and claims nothing
        Job.objects.enqueue("Export", {"i": 0})
        with pytest.raises(NotImplementedError, match="returned no plan"):
            explain_claim(limit=10)
        assert Job.objects.filter(status_id=Status.PENDING).count() == 1
        return
    JobType.objects.get_or_create(name="Noop")
    Job.objects.enqueue_many(JobSpec("Export", {"i": i}, concurrency_key=str(i % 50)) for i in range(5000))
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}) for i in range(1000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    report = explain_claim(limit=10)
    assert report.uses_claim_index and not report.scans_job_table, report.plan
    if connection.vendor == "postgresql":
        assert "sqlqueue_job_limited" in report.plan, report.plan
    else:  # SQLite picks the permit and its job in a statement of its own, first
        from django_sqlqueue.dialects import ClaimRequest, get_dialect

        dialect = get_dialect(connection)
        sql, params = dialect.limited_pick_sql(ClaimRequest("w", 10, limited=True))
        with connection.cursor() as cursor:
            lines, scans = dialect.claim_plan(cursor, sql, params, Job._meta.db_table)
        assert not scans and any("sqlqueue_job_limited" in line for line in lines), lines


def test_the_limited_flag_follows_the_type_and_heal_mends_stale_enqueues() -> None:
    """Limited jobs stay out of the claim index (a deep backlog costs the ordinary claim nothing): the
    flag is set at enqueue, flipped with the type's limit, and mended by the supervisor's heal when a
    process enqueued with a stale type cache."""
    JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": None})
    jobtypes.clear_cache()
    before = [Job.objects.enqueue("Export", {"i": i}) for i in range(3)]
    assert not Job.objects.filter(limited=True).exists()
    row = limited("Export", concurrency_limit=1)
    assert Job.objects.filter(pk__in=[j.pk for j in before], limited=True).count() == 3
    after = Job.objects.enqueue("Export", {"i": 3})
    assert Job.objects.get(pk=after.pk).limited
    # A stale enqueue: the flag and a new key's permits are missing until heal.
    stale = Job.objects.enqueue("Export", {"i": 4}, concurrency_key="k")
    Job.objects.filter(pk=stale.pk).update(limited=False)
    LimitPermit.objects.filter(key="k").delete()
    assert permits.explain(Job.objects.get(pk=stale.pk)).startswith("its limit's permits for Export for key 'k'")
    assert permits.heal("default") == 2
    assert Job.objects.get(pk=stale.pk).limited and LimitPermit.objects.filter(key="k").count() == 1
    assert permits.heal("default") == 0
    row.concurrency_limit = None
    row.save()
    assert not Job.objects.filter(limited=True).exists()


def test_claims_back_off_the_limited_branch_while_it_finds_nothing(monkeypatch) -> None:
    """A saturated limit would cost every claim the limited branch: after one that found nothing, this
    process's claims leave it out for LIMITED_RECHECK_SECONDS, unless a permit is freed here."""
    from django.test.utils import CaptureQueriesContext

    # A long back-off while the claims below must see it (0.25 s passes between two statements on a
    # loaded machine); its end is checked with the real one after a sleep, a bound load cannot trip.
    real_recheck = jobtypes.LIMITED_RECHECK_SECONDS
    monkeypatch.setattr(jobtypes, "LIMITED_RECHECK_SECONDS", 60.0)
    limited("Export", concurrency_limit=1)
    JobType.objects.get_or_create(name="Noop")
    for i in range(3):
        Job.objects.enqueue("Export", {"i": i})
        Job.objects.enqueue("Noop", {"i": i})

    names = iter(range(100))

    def claim_sql() -> tuple[list[Job], bool]:
        with CaptureQueriesContext(connection) as seen:  # a new worker name each time: no leftovers taken back
            got = Job.objects.claim(f"w{next(names)}", 1)
        return got, any("limitpermit" in q["sql"] for q in seen.captured_queries)

    (first,), looked = claim_sql()
    assert looked and first.job_type.name == "Export"
    got, looked = claim_sql()  # the limited branch finds nothing (1 of 1 running)
    assert looked and got[0].job_type.name == "Noop"
    got, looked = claim_sql()
    assert not looked and got[0].job_type.name == "Noop", "backed off"
    Job.objects.complete(first)  # a permit freed in this process: look again at once
    got, looked = claim_sql()
    assert looked and got[0].job_type.name == "Export"
    monkeypatch.setattr(jobtypes, "LIMITED_RECHECK_SECONDS", real_recheck)
    jobtypes.limited_branch_result("default", False)
    time.sleep(real_recheck + 0.05)
    assert claim_sql()[1], "the back-off ends"


@pytest.mark.django_db(transaction=True)  # the release of Waiting jobs runs on commit
def test_a_waiting_job_follows_its_types_limit_set_or_removed_while_it_waits() -> None:
    """A Waiting job (workflows) whose type gets a limit, or loses it, while it waits is claimable once its
    dependency is done: the type's save flips its flag and makes its key's permits, as for Pending jobs
    (the supervisor's heal, up to REAP_SECONDS later and only under run_queue_worker, is not needed)."""
    JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": None, "rate_limit": ""})
    JobType.objects.get_or_create(name="Noop")
    jobtypes.clear_cache()
    first = Job.objects.enqueue("Noop", {})
    waiting = Job.objects.enqueue("Export", {"i": 0}, after=[first], concurrency_key="k")
    assert waiting.state == Status.WAITING
    limited("Export", concurrency_limit=1)  # set while it waits
    (got,) = Job.objects.claim("w1", 1)
    Job.objects.complete(got)  # releases the Waiting job
    assert Job.objects.get(pk=waiting.pk).state == Status.PENDING
    jobtypes.permits_released("default")  # (the Noop claim found no limited job: no 0.25 s back-off here)
    (taken,) = Job.objects.claim("w1", 1)
    assert taken.pk == waiting.pk and LimitPermit.objects.get(key="k").job_id == waiting.pk

    # ... and removed while another waits.
    first = Job.objects.enqueue("Noop", {})
    waiting = Job.objects.enqueue("Export", {"i": 1}, after=[first])
    row = limited("Export", concurrency_limit=None)
    assert row.concurrency_limit is None
    (got,) = Job.objects.claim("w2", 1)
    Job.objects.complete(got)
    (taken,) = Job.objects.claim("w2", 1)
    assert taken.pk == waiting.pk



@pytest.mark.django_db(transaction=True)  # PostgreSQL's now() is the transaction's start
def test_a_job_taken_over_under_another_permit_holds_one_permit_not_two() -> None:
    """A dead worker's job retaken by the limited branch under another (free) permit: its old, expired
    permit still names the job, and the new holder's lease renewal must not revive it (the job would
    hold two permits of the limit to its end, and a limit of 2 would admit one job)."""
    limited("Export", concurrency_limit=2, lease_seconds=1)
    stuck = Job.objects.enqueue("Export", {"i": 0})
    (got,) = Job.objects.claim("dead-worker", 1)
    assert got.pk == stuck.pk
    time.sleep(1.2)  # its lease and its permit expire
    (again,) = Job.objects.claim("w2", 1, incarnation="i2")
    assert again.pk == stuck.pk
    # Renewed for 30 s, not 1: the next claim must not race the new holder's lease on a loaded machine.
    assert Job.objects.renew_leases("w2", [stuck.pk], 30, incarnation="i2") == 1
    other = Job.objects.enqueue("Export", {"i": 1})
    taken = Job.objects.claim("w3", 1)
    assert [j.pk for j in taken] == [other.pk], "1 of 2 running: a permit is free"
    # A late renewal of a lease nobody took over still holds its (expired) permit again.
    Job.objects.complete(again)
    Job.objects.complete(taken[0])
    late = Job.objects.enqueue("Export", {"i": 2})
    limited("Export", concurrency_limit=1, lease_seconds=1)
    (got,) = Job.objects.claim("slow", 1, incarnation="s")
    assert got.pk == late.pk
    time.sleep(1.2)
    assert Job.objects.renew_leases("slow", [late.pk], 60, incarnation="s") == 1
    Job.objects.enqueue("Export", {"i": 3})
    assert Job.objects.claim("w4", 1) == [], "the renewed job holds its permit again"


@pytest.mark.django_db(transaction=True)  # a type row read inside a transaction is not cached
def test_an_enqueue_with_a_stale_type_cache_makes_no_permits_beyond_the_limit() -> None:
    """Another process lowered the limit (its save's signal clears only its own cache): this process's
    enqueues of new keys, and of keys whose surplus slots that save removed, must not create permits from
    the cached, higher limit; the claim takes whatever permit rows exist, so they would over-admit."""
    row = limited("Sync", concurrency_limit=3)
    Job.objects.enqueue("Sync", {"i": 0}, concurrency_key="a")  # caches the type (limit 3); a's permits
    assert LimitPermit.objects.filter(job_type=row, key="a").count() == 3
    JobType.objects.filter(pk=row.pk).update(concurrency_limit=1)  # the other process's save ...
    permits.sync_type(JobType.objects.get(pk=row.pk), "default")  # ... and its sync of the permits
    assert LimitPermit.objects.filter(job_type=row, key="a").count() == 1
    assert jobtypes.get_type("Sync", using="default").concurrency_limit == 3, "this process's cache is stale"
    for key in "ab":
        for i in range(3):
            Job.objects.enqueue("Sync", {"i": i}, concurrency_key=key)
    for key in "ab":
        assert LimitPermit.objects.filter(job_type=row, key=key).count() == 1, key
    for _ in range(6):
        Job.objects.claim("w1", 1)
    assert processing("Sync", "a") == 1 and processing("Sync", "b") == 1


def test_a_finished_job_retried_after_its_types_limit_changed_follows_the_limit_now() -> None:
    # sync_type updates unfinished jobs only: a job that had finished when the limit was set (or
    # removed) comes back, through an operator's retry, flagged as its type is now.
    limited("Export")
    old = Job.objects.enqueue("Export", {"customer": "c1"}, concurrency_key="c1")
    got = Job.objects.claim("w1", 1)
    Job.objects.modify(got[0], got[0].version, Status.FAILED, error="boom")
    limited("Export", concurrency_limit=1)
    running = Job.objects.enqueue("Export", {"customer": "c1"}, concurrency_key="c1")
    assert [j.pk for j in Job.objects.claim("w1", 10)] == [running.pk]
    retried = Job.objects.modify(old.pk, None, Status.PENDING)
    assert Job.objects.get(pk=retried.pk).limited is True
    assert Job.objects.claim("w2", 10) == [], "1 of 1 running for key c1: the retried job waits"
    Job.objects.complete(Job.objects.get(pk=running.pk))
    assert [j.pk for j in Job.objects.claim("w2", 10)] == [old.pk]
    # And back: the limit removed while the job had failed again; retried, the ordinary claim takes it.
    again = Job.objects.get(pk=old.pk)
    Job.objects.modify(again, again.version, Status.FAILED, error="boom")
    limited("Export")
    Job.objects.modify(old.pk, None, Status.PENDING)
    assert Job.objects.get(pk=old.pk).limited is False
    assert [j.pk for j in Job.objects.claim("w3", 10)] == [old.pk]
