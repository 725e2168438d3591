"""enqueue / enqueue_many: options, dedupe, subtypes in one transaction, bad input."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from django_sqlqueue import (
    InvalidArgument,
    InvalidPayload,
    Status,
    SubtypeMismatch,
    UnknownJobType,
    enqueue,
    schedules,
)
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.queue import JobSpec
from testproject.notifications.models import EmailChannel, ResetPassword, SmsChannel

from . import procutil

pytestmark = pytest.mark.django_db


def test_enqueue_defaults(noop_type: JobType) -> None:
    # The database's clock, read before (PostgreSQL's now() in a test's transaction is its start, which a
    # loaded machine can leave seconds behind this process's clock).
    before = schedules.db_clock("default")
    job = enqueue("Noop", {"to": "a@example.com", "n": [1, 2]})
    job.refresh_from_db()
    assert job.state is Status.PENDING
    assert job.payload == {"to": "a@example.com", "n": [1, 2]}
    assert job.queue == "default" and job.priority == 0 and job.attempt_num == 0 and job.version == 1
    assert job.scheduled_for >= before and job.enqueued_at >= before
    assert job.job_type_id == noop_type.id


def test_enqueue_options(noop_type: JobType) -> None:
    when = timezone.now() + timedelta(hours=1)
    job = enqueue("Noop", queue="emails", priority=7, scheduled_for=when, max_attempts=5)
    job.refresh_from_db()
    assert (job.queue, job.priority, job.max_attempts) == ("emails", 7, 5)
    assert abs((job.scheduled_for - when).total_seconds()) < 0.001
    before = timezone.now()
    delayed = Job.objects.enqueue("Noop", delay=30)
    # By order, not by a margin a stalled enqueue could eat: due 30 s after a moment within the call.
    # (1 s of slack: the database clock's precision, e.g. SQLite's milliseconds.)
    assert before + timedelta(seconds=29) <= delayed.scheduled_for <= timezone.now() + timedelta(seconds=31)


def test_bulk_enqueue_keeps_input_order(noop_type: JobType) -> None:
    jobs = Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, priority=i % 3) for i in range(2500))
    assert [j.payload["i"] for j in jobs] == list(range(2500))
    assert Job.objects.count() == 2500


def test_dedupe_returns_existing_unfinished_job(noop_type: JobType) -> None:
    first = enqueue("Noop", {"v": 1}, dedupe_key="user-42")
    second = enqueue("Noop", {"v": 2}, dedupe_key="user-42")
    assert second.pk == first.pk and second.payload == {"v": 1}
    assert second.deduplicated and not first.deduplicated  # the caller can tell, without a second read
    assert Job.objects.filter(dedupe_key="user-42").count() == 1
    # once finished, the key is free again
    claimed = Job.objects.claim("w", 1)[0]
    claimed.complete()
    third = enqueue("Noop", {"v": 3}, dedupe_key="user-42")
    assert third.pk != first.pk and not third.deduplicated
    # duplicates inside one bulk call collapse too
    jobs = Job.objects.enqueue_many([JobSpec("Noop", dedupe_key="k"), JobSpec("Noop", dedupe_key="k"),
                                     JobSpec("Noop")])
    assert jobs[0].pk == jobs[1].pk != jobs[2].pk
    assert [j.deduplicated for j in jobs] == [False, True, False]


@pytest.mark.django_db(transaction=True)
def test_dedupe_under_a_race_of_two_processes() -> None:
    JobType.objects.get_or_create(name="Noop")
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=procutil.enqueue_with_key, args=(barrier, out, "race")) for _ in range(2)]
    with procutil.child_env():
        for p in procs:
            p.start()
    ids = {out.get(timeout=240), out.get(timeout=60)}  # two spawned Django processes: slow to start under load
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert len(ids) == 1
    assert Job.objects.filter(dedupe_key="race").count() == 1


def test_subtypes_are_written_with_the_job(make_type) -> None:
    make_type("ResetPassword")
    job = enqueue("ResetPassword", {}, subtypes=[
        ResetPassword(user_id=1, username="ann", otp="123456"),
        EmailChannel(email_to="ann@example.com"),
        SmsChannel(phone="+15550100"),
    ])
    assert ResetPassword.objects.get(job=job).username == "ann"
    assert EmailChannel.objects.filter(job=job).count() == 1 and SmsChannel.objects.filter(job=job).count() == 1


def test_invalid_subtype_rolls_back_everything(make_type) -> None:
    make_type("ResetPassword")
    with pytest.raises(ValidationError):
        enqueue("ResetPassword", {}, subtypes=[
            ResetPassword(user_id=1, username="ann", otp="123456"),
            EmailChannel(email_to="not-an-email"),
        ])
    assert Job.objects.count() == 0 and ResetPassword.objects.count() == 0


def test_exclusive_subtype_must_match_the_type(noop_type: JobType) -> None:
    with pytest.raises(SubtypeMismatch, match="belongs to job type 'ResetPassword'"):
        enqueue("Noop", {}, subtypes=[ResetPassword(user_id=1, username="x", otp="123456")])
    assert Job.objects.count() == 0


def test_enqueue_commits_and_rolls_back_with_the_caller(noop_type: JobType) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("Noop")
        raise RuntimeError("caller fails after enqueue")
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"job_type": "Nope"}, UnknownJobType, "unknown job type 'Nope'"),
        ({"job_type": ""}, InvalidArgument, "job type name"),
        ({"payload": {"when": object()}}, InvalidPayload, "JSON-serialisable"),
        ({"payload": {"x": float("nan")}}, InvalidPayload, "JSON-serialisable"),
        ({"delay": -1}, InvalidArgument, "non-negative"),
        ({"priority": 10**6}, InvalidArgument, "priority"),
        ({"queue": ""}, InvalidArgument, "queue"),
        ({"max_attempts": 0}, InvalidArgument, "max_attempts"),
        ({"dedupe_key": "x" * 201}, InvalidArgument, "dedupe_key"),
        ({"scheduled_for": timezone.now().replace(tzinfo=None)}, InvalidArgument, "timezone-aware"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(noop_type: JobType, kwargs, error, match) -> None:
    args = {"job_type": "Noop", "payload": {}, **kwargs}
    with pytest.raises(error, match=match):
        Job.objects.enqueue(args.pop("job_type"), args.pop("payload"), **args)
    assert Job.objects.count() == 0


def test_payload_size_limit(noop_type: JobType, settings) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 1000}
    with pytest.raises(InvalidPayload, match="limit is 1000"):
        enqueue("Noop", {"blob": "x" * 2000})
    assert Job.objects.count() == 0


def test_hostile_queue_name_is_data(noop_type: JobType) -> None:
    name = "q'); DROP TABLE django_sqlqueue_job; --"
    job = enqueue("Noop", queue=name)
    assert Job.objects.claim("w", 5, queues=[name])[0].pk == job.pk


def test_a_delay_counts_from_the_database_clock_not_the_hosts(noop_type: JobType, monkeypatch) -> None:
    """Issue 31, item 8: with the enqueuing host's clock an hour behind the database's, delay=3600 made
    the job due at once. The delay now counts from the database clock (like every due test), so the
    host's clock does not matter: the job is due an hour from the database's now."""
    from django_sqlqueue.schedules import db_clock

    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(hours=1))  # this host is 1 h behind
    job = enqueue("Noop", delay=3600)
    many = Job.objects.enqueue_many([JobSpec("Noop", {}, delay=3600), JobSpec("Noop", {}, delay=0)])
    monkeypatch.undo()
    db_now = db_clock("default")
    for j in (job, many[0]):
        ahead = (Job.objects.get(pk=j.pk).scheduled_for - db_now).total_seconds()
        assert 3500 < ahead <= 3600, ahead
    assert [j.pk for j in Job.objects.claim("w", 10)] == [many[1].pk]  # only the delay=0 one is due
