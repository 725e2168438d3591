"""Claim semantics: what is picked, in which order, and what it stamps."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqlqueue import InvalidArgument, Status, UnknownJobType, enqueue, jobtypes
from django_sqlqueue.models import Job, JobAttempt, JobType, Worker
from django_sqlqueue.queue import JobSpec

pytestmark = pytest.mark.django_db


def expire_lease(job: Job) -> None:
    # An hour back, not a second: inside a test's transaction PostgreSQL's now() is the transaction's
    # start, which a loaded machine can leave seconds behind this process's clock.
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))


def test_claim_marks_processing_and_writes_history(noop_type: JobType) -> None:
    job = enqueue("Noop", {"x": 1})
    [claimed] = Job.objects.claim("host:1/0", 10)
    assert claimed.pk == job.pk and claimed.state is Status.PROCESSING
    assert claimed.attempt_num == 1 and claimed.version == job.version + 1
    assert claimed.worker == "host:1/0" and claimed.payload == {"x": 1}
    lease_left = (claimed.lease_expires_at - claimed.started_at).total_seconds()
    assert 59 <= lease_left <= 61  # SQLQUEUE LEASE_SECONDS default, from the database clock
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.attempt_num, attempt.worker, attempt.finished_at) == (1, "host:1/0", None)
    assert Job.objects.claim("other", 10) == []


def test_priority_then_schedule_then_id(noop_type: JobType) -> None:
    now = timezone.now()
    a = enqueue("Noop", scheduled_for=now - timedelta(minutes=2))
    b = enqueue("Noop", priority=5)
    c = enqueue("Noop", scheduled_for=now - timedelta(minutes=5))
    d = enqueue("Noop", scheduled_for=now - timedelta(minutes=5))
    order = [j.pk for j in Job.objects.claim("w", 10)]
    assert order == [b.pk, c.pk, d.pk, a.pk]


def test_future_jobs_paused_types_and_filters(make_type) -> None:
    make_type("A")
    make_type("B", paused=True)
    future = enqueue("A", scheduled_for=timezone.now() + timedelta(minutes=10))
    enqueue("B")
    emails = enqueue("A", queue="emails")
    other = enqueue("A", queue="other")
    assert [j.pk for j in Job.objects.claim("w1", 10, queues=["emails"])] == [emails.pk]
    assert [j.pk for j in Job.objects.claim("w2", 10, types=["B"])] == []  # paused
    assert [j.pk for j in Job.objects.claim("w3", 10)] == [other.pk]
    assert Job.objects.get(pk=future.pk).state is Status.PENDING
    JobType.objects.filter(name="B").update(paused=False)
    assert len(Job.objects.claim("w4", 10, types=["B"])) == 1


def test_limit_and_bad_arguments(noop_type: JobType) -> None:
    Job.objects.enqueue_many([JobSpec("Noop")] * 5)
    assert len(Job.objects.claim("w", 2)) == 2
    assert len(Job.objects.claim("v", 2)) == 2
    for bad in (0, -1, "3", 10**6):
        with pytest.raises(InvalidArgument, match="limit"):
            Job.objects.claim("w", bad)
    with pytest.raises(InvalidArgument, match="worker"):
        Job.objects.claim("", 1)
    with pytest.raises(UnknownJobType):
        Job.objects.claim("w", 1, types=["Nope"])


def test_own_unfinished_work_is_reclaimed_at_once(noop_type: JobType) -> None:
    job = enqueue("Noop")
    first = Job.objects.claim("app1/0", 1)[0]
    assert Job.objects.claim("app2/0", 1) == []  # lease still valid: not someone else's
    again = Job.objects.claim("app1/0", 1)[0]  # same name: a restarted slot takes it back
    assert again.pk == job.pk and again.attempt_num == 2 and again.version > first.version
    assert list(JobAttempt.objects.filter(job=job).values_list("attempt_num", "worker")) == [
        (1, "app1/0"), (2, "app1/0")]


def test_incarnations_a_replaced_process_takes_nothing_back_and_its_twin_takes_its_jobs(noop_type: JobType) -> None:
    """Two processes under one name (one paused past the dead-after time, a same-name restart):
    leftovers are taken only from another incarnation, and only by the one that holds the name's row."""
    now = timezone.now()
    first = enqueue("Noop")
    Worker.objects.create(name="dup/0", started_at=now, last_heartbeat=now, incarnation="a")
    [mine] = Job.objects.claim("dup/0", 1, incarnation="a")
    assert Job.objects.filter(pk=first.pk, incarnation="a").exists()
    assert Job.objects.claim("dup/0", 1, incarnation="a") == []  # its own live job is not a leftover
    # The name changes hands (the twin registered): the twin takes "a"'s job as a leftover...
    Worker.objects.filter(name="dup/0").update(incarnation="b")
    [taken] = Job.objects.claim("dup/0", 1, incarnation="b")
    assert taken.pk == first.pk and taken.attempt_num == 2
    # ...and "a", resumed, takes nothing back, and can renew nothing.
    second = enqueue("Noop", priority=-1)
    Job.objects.filter(pk=second.pk).update(status_id=Status.PROCESSING, worker="dup/0", incarnation="b",
                                            attempt_num=1, lease_expires_at=now + timedelta(minutes=5))
    assert Job.objects.claim("dup/0", 5, incarnation="a") == []
    assert Job.objects.renew_leases("dup/0", [first.pk], 60, incarnation="a") == 0
    assert Job.objects.renew_leases("dup/0", [first.pk], 60, incarnation="b") == 1
    assert mine.version < taken.version


def test_expired_lease_is_reclaimed_by_another_worker(noop_type: JobType) -> None:
    job = enqueue("Noop")
    first = Job.objects.claim("dead/0", 1)[0]
    expire_lease(job)
    taken = Job.objects.claim("alive/0", 1)[0]
    assert taken.pk == job.pk and taken.worker == "alive/0" and taken.attempt_num == 2
    # the dead worker's late finish is fenced off by the token
    from django_sqlqueue import StaleJob

    with pytest.raises(StaleJob):
        first.complete()
    assert Job.objects.get(pk=job.pk).state is Status.PROCESSING


def test_a_due_only_claim_leaves_stuck_jobs_for_the_next_full_claim(noop_type: JobType) -> None:
    stuck = enqueue("Noop", priority=9)
    Job.objects.claim("dead/0", 1)
    expire_lease(stuck)
    due = enqueue("Noop")
    # reclaim=False (a busy worker between its periodic looks): due jobs only, the stuck one waits
    _, got = Job.objects.complete_and_claim((), "alive/0", 5, reclaim=False)
    assert [j.pk for j in got] == [due.pk]
    _, got = Job.objects.complete_and_claim((), "alive/0", 5, reclaim=False)
    assert got == []
    # the full claim (the default) takes it (another name: a claim also takes back its own leftovers)
    assert [j.pk for j in Job.objects.claim("other/0", 5)] == [stuck.pk]


def test_worker_with_stale_heartbeat_is_dead_at_once(noop_type: JobType) -> None:
    job = enqueue("Noop")
    Job.objects.claim("gone/0", 1)
    now = timezone.now()
    Worker.objects.create(name="gone/0", started_at=now, last_heartbeat=now)
    assert Job.objects.claim("alive/0", 1) == []  # heartbeat fresh, lease valid
    Worker.objects.filter(name="gone/0").update(last_heartbeat=now - timedelta(minutes=5))
    assert [j.pk for j in Job.objects.claim("alive/0", 1)] == [job.pk]


def test_stopped_worker_jobs_are_reclaimed(noop_type: JobType) -> None:
    job = enqueue("Noop")
    Job.objects.claim("stopped/0", 1)
    now = timezone.now()
    Worker.objects.create(name="stopped/0", started_at=now, last_heartbeat=now, stopped_at=now)
    assert [j.pk for j in Job.objects.claim("alive/0", 1)] == [job.pk]


def test_exhausted_attempts_are_not_claimed_and_reaped_to_failed(noop_type: JobType) -> None:
    job = enqueue("Noop", max_attempts=2)
    for _ in range(2):
        claimed = Job.objects.claim("w/0", 1)[0]
        expire_lease(claimed)
    assert claimed.attempt_num == 2
    assert Job.objects.claim("w2/0", 1) == []  # no attempts left
    assert Job.objects.claim("w/0", 1) == []  # not even for its own worker
    assert Job.objects.reap() == 1
    job.refresh_from_db()
    assert job.state is Status.FAILED and "no attempts left" in job.error
    last = JobAttempt.objects.get(job=job, attempt_num=2)
    assert last.outcome_id == Status.FAILED and last.finished_at is not None


def test_type_max_attempts_and_setting_default(make_type, settings) -> None:
    make_type("Twice", max_attempts=2)
    make_type("Default")
    settings.SQLQUEUE = {"MAX_ATTEMPTS": 1}
    a = enqueue("Twice")
    b = enqueue("Default")
    for job in Job.objects.claim("w", 10):
        job.fail("boom", retry_in=0)
    assert Job.objects.get(pk=a.pk).state is Status.ERROR
    assert Job.objects.get(pk=b.pk).state is Status.FAILED
    assert [j.pk for j in Job.objects.claim("w", 10)] == [a.pk]
    # a type's setting changed at run time applies to queued jobs at once
    JobType.objects.filter(name="Twice").update(max_attempts=1)
    Job.objects.get(pk=a.pk).fail("again", retry_in=0)
    assert Job.objects.get(pk=a.pk).state is Status.FAILED


def test_error_jobs_wait_for_their_backoff(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    job.fail("transient", retry_in=3600)
    assert Job.objects.claim("w", 1) == []
    Job.objects.filter(pk=job.pk).update(scheduled_for=timezone.now() - timedelta(hours=1))  # (see expire_lease)
    again = Job.objects.claim("w", 1)[0]
    assert again.attempt_num == 2 and again.error == "transient"


@pytest.mark.django_db(transaction=True)
def test_a_claim_alone_is_one_statement_without_begin_or_commit(noop_type: JobType) -> None:
    """PostgreSQL: a claim with nothing to complete (an idle slot's wake-up) is one data-modifying CTE,
    atomic by itself, sent in autocommit; with completions to commit it, it runs in a transaction."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("the one-statement claim is PostgreSQL's (SQLite: BEGIN IMMEDIATE, SQL Server: a batch)")
    enqueue("Noop")
    enqueue("Noop")
    # Which types have a limit (docs/limits.md) is read once per TYPE_CACHE_SECONDS: warm, as in a worker.
    jobtypes.limited_type_ids("default")
    with CaptureQueriesContext(connection) as alone:
        _, [first] = Job.objects.complete_and_claim([], "w", 1)
    assert [q["sql"].split()[0] for q in alone.captured_queries] == ["WITH"]
    assert JobAttempt.objects.filter(job=first, worker="w").count() == 1  # history in the same statement
    with CaptureQueriesContext(connection) as joined:
        [done], [second] = Job.objects.complete_and_claim([(first, {"ok": 1})], "w", 1)
    assert [q["sql"].split()[0] for q in joined.captured_queries] == ["BEGIN", "WITH", "WITH", "COMMIT"]
    assert done.state is Status.COMPLETED and second.state is Status.PROCESSING and second.pk != first.pk


def test_claimed_rows_convert_their_datetimes_as_django_does(noop_type: JobType) -> None:
    """The claim's rows skip Django's per-value datetime converter where the connection is UTC
    (queue/rows.py): the values must be what the ORM itself reads, on every vendor."""
    from datetime import UTC, datetime

    from django_sqlqueue.queue.rows import _faster, _utc_datetime_value

    job = Job.objects.enqueue("Noop", delay=60)
    Job.objects.filter(pk=job.pk).update(scheduled_for=timezone.now() - timedelta(hours=1))
    claimed = Job.objects.claim("w-conv", 1)[0]
    read = Job.objects.get(pk=job.pk)
    for name in ("enqueued_at", "scheduled_for", "started_at", "lease_expires_at", "updated_at"):
        assert getattr(claimed, name) == getattr(read, name) and getattr(claimed, name).utcoffset() == timedelta(0), name
    assert claimed.finished_at is None and read.finished_at is None
    backend = getattr(connection.ops, "convert_datetimefield_value", None)
    if backend is None:  # PostgreSQL: the driver returns aware values, there is nothing to convert
        return
    assert _faster(backend, connection) is _utc_datetime_value
    naive = datetime(2026, 11, 27, 21, 0, 0, 123456)
    samples = [None, naive, naive.replace(tzinfo=UTC)] + (["2026-11-27 21:00:00.123456"] if connection.vendor == "sqlite" else [])
    for value in samples:
        assert _utc_datetime_value(value, None, connection) == backend(value, None, connection), value
