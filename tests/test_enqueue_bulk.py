"""Bulk enqueue paths (PostgreSQL: COPY, or unnest with dedupe keys) and the one-statement single enqueue:
what they return must be exactly what was stored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqlqueue.dialects.base import JOB_COLUMNS
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.queue import JobSpec

pytestmark = pytest.mark.django_db


def _same(a: Job, b: Job) -> None:
    for name in JOB_COLUMNS:
        assert getattr(a, name) == getattr(b, name), name


def test_bulk_returns_what_was_stored_in_order(noop_type: JobType) -> None:
    later = timezone.now() + timedelta(hours=1)
    specs = [JobSpec("Noop", {"i": i, "s": "é" * (i % 3)}, queue=f"q{i % 2}", priority=i % 5,
                     scheduled_for=later if i % 7 == 0 else None, max_attempts=(i % 4) or None)
             for i in range(450)]
    jobs = Job.objects.enqueue_many(specs)
    assert [j.payload["i"] for j in jobs] == list(range(450))
    assert all(a.pk < b.pk for a, b in zip(jobs, jobs[1:], strict=False))
    stored = {j.pk: j for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    for job in jobs:
        _same(job, stored[job.pk])
        assert job._state.adding is False and job._state.db == "default"
    if connection.vendor == "microsoft":  # SYSUTCDATETIME() is read per statement: one per chunk of rows
        assert jobs[0].enqueued_at <= jobs[-1].enqueued_at
    else:
        assert jobs[0].enqueued_at == jobs[-1].enqueued_at  # one transaction, one database clock
    assert jobs[7].scheduled_for == later and jobs[1].scheduled_for == jobs[1].enqueued_at


def test_bulk_with_dedupe_keys(noop_type: JobType) -> None:
    first = Job.objects.enqueue("Noop", dedupe_key="k5")
    specs = [JobSpec("Noop", {"i": i}, dedupe_key=f"k{i}" if i % 2 else None) for i in range(300)]
    jobs = Job.objects.enqueue_many(specs)
    assert jobs[5].pk == first.pk  # the existing unfinished job, not a new row
    assert [j.payload.get("i") for j in jobs if j.pk != first.pk] == [i for i in range(300) if i != 5]
    assert Job.objects.count() == 300


def test_single_enqueue_inside_a_transaction(noop_type: JobType) -> None:
    assert connection.in_atomic_block  # pytest-django's transaction: the multi-statement path
    job = Job.objects.enqueue("Noop", {"x": 1}, priority=3)
    _same(job, Job.objects.get(pk=job.pk))


@pytest.mark.django_db(transaction=True)
def test_single_enqueue_in_autocommit_is_stored_and_notifies(noop_type: JobType) -> None:
    assert not connection.in_atomic_block
    if connection.vendor != "postgresql":
        job = Job.objects.enqueue("Noop", {"x": 2})
        _same(job, Job.objects.get(pk=job.pk))
        return
    import psycopg

    from django_sqlqueue.conf import get_settings

    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True) as listener:
        listener.execute(f"LISTEN {get_settings().NOTIFY_CHANNEL}")
        job = Job.objects.enqueue("Noop", {"x": 2}, queue="mail")
        got = [n.payload for n in listener.notifies(timeout=60, stop_after=1)]
    assert got == ["mail"]
    _same(job, Job.objects.get(pk=job.pk))


@pytest.mark.django_db(transaction=True)
def test_one_statement_enqueue_returns_what_a_read_returns(noop_type: JobType) -> None:
    """Only the id and the clock stamps come back from the database; the rest of the returned job is
    built from what was sent. It must still equal a fresh read, field by field, for every option."""
    from zoneinfo import ZoneInfo

    assert not connection.in_atomic_block
    paris = (timezone.now() + timedelta(hours=2)).astimezone(ZoneInfo("Europe/Paris"))
    payload = {"s": "é✓", "n": [1, 2.5, None, True], "d": {"k": {}}}
    jobs = [
        Job.objects.enqueue("Noop", payload, queue="q1", priority=-4, max_attempts=9),
        Job.objects.enqueue("Noop", scheduled_for=paris),
        Job.objects.enqueue("Noop", [1, "two"], delay=90),
        *Job.objects.enqueue_many([JobSpec("Noop", {"i": i}, scheduled_for=paris if i == 1 else None)
                                   for i in range(3)]),
    ]
    for job in jobs:
        stored = Job.objects.get(pk=job.pk)
        _same(job, stored)
        assert job._state.adding is False and job._state.db == "default"
        for name in ("enqueued_at", "scheduled_for", "updated_at"):
            assert getattr(job, name).utcoffset() == timedelta(0), name  # as a read returns it: UTC
    assert jobs[0].payload == payload and jobs[2].payload == [1, "two"]
    assert jobs[1].scheduled_for == paris and jobs[4].scheduled_for == paris
    assert jobs[0].enqueued_at == jobs[0].updated_at == jobs[0].scheduled_for
    assert [j.payload["i"] for j in jobs[3:]] == [0, 1, 2] and jobs[3].pk < jobs[4].pk < jobs[5].pk


def test_the_session_uses_the_binding_it_was_asked_for() -> None:
    """scripts/test.sh runs these tests once more with SQLQUEUE_PG_OPTIONS=server_side_binding=true:
    make sure that stage really binds parameters on the server (and the default one does not)."""
    import os

    if connection.vendor != "postgresql":
        pytest.skip("server-side binding is a PostgreSQL (psycopg 3) option")
    wanted = "server_side_binding=true" in os.environ.get("SQLQUEUE_PG_OPTIONS", "")
    with connection.cursor() as cursor:
        cursor_class = type(cursor.cursor).__name__
    assert (cursor_class == "ServerBindingCursor") is wanted, cursor_class


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("empty", [[], (), iter(())], ids=["list", "tuple", "iterator"])
def test_enqueue_many_of_nothing_returns_nothing(empty) -> None:
    """Nothing to insert is not an error (in autocommit it sent "INSERT ... VALUES RETURNING" and failed)."""
    assert not connection.in_atomic_block  # the one-statement path first
    before = Job.objects.count()
    assert Job.objects.enqueue_many(empty) == []
    from django.db import transaction

    with transaction.atomic():  # the multi-statement path too: nothing inserted, the transaction still usable
        assert Job.objects.enqueue_many([]) == []
        assert Job.objects.count() == before
    assert Job.objects.count() == before


# ----- large bulk calls: PostgreSQL's COPY path (issue 30, item 4); the multi-row INSERT elsewhere ----------
#: Enough specs for the COPY path on PostgreSQL (copy_stamped_min_rows) and for the once-per-options
#: validation on every vendor (BULK_ROWS_MIN).
MANY = 260


def test_large_bulk_returns_what_was_stored_with_every_option_and_text_copy_must_escape(noop_type: JobType) -> None:
    from zoneinfo import ZoneInfo

    later = (timezone.now() + timedelta(hours=3)).astimezone(ZoneInfo("Asia/Tokyo"))
    odd = "tab\there, back\\slash, new\nline, cr\r, quote\" é✓"
    specs = [JobSpec("Noop", None if i % 5 == 0 else {"i": i, "text": odd, "n": [1, 2.5, None, True]},
                     queue=("q\t\\x" if i % 3 == 0 else "default"), priority=(i % 4) - 2,
                     scheduled_for=later if i % 7 == 0 else None, delay=90 if i % 11 == 0 and i % 7 else None,
                     max_attempts=(i % 3) or None, concurrency_key=("k\\" if i % 13 == 0 else None))
             for i in range(MANY)]
    from django_sqlqueue.schedules import db_clock

    before = db_clock("default")  # the database's clock before the call: the delay's lower bound
    jobs = Job.objects.enqueue_many(specs)
    assert len(jobs) == MANY and all(a.pk < b.pk for a, b in zip(jobs, jobs[1:], strict=False))
    stored = {j.pk: j for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    for i, job in enumerate(jobs):
        _same(job, stored[job.pk])
        assert job._state.adding is False and job._state.db == "default"
        assert job.payload == ({} if i % 5 == 0 else {"i": i, "text": odd, "n": [1, 2.5, None, True]})
        row = stored[job.pk]
        assert (row.queue, row.priority, row.max_attempts) == (specs[i].queue, specs[i].priority, specs[i].max_attempts)
        assert row.concurrency_key == (specs[i].concurrency_key or "")
    assert jobs[7].scheduled_for == later and jobs[1].scheduled_for == jobs[1].enqueued_at
    # the database's clock, read during the call before the insert, plus the delay: by order, no duration
    clock_read = jobs[11].scheduled_for - timedelta(seconds=90)
    assert before <= clock_read <= jobs[11].enqueued_at
    if connection.vendor != "microsoft":  # one transaction, one database clock
        assert len({j.enqueued_at for j in jobs}) == 1
    jobs[0].payload["x"] = 1  # every job has its own payload object, as a read returns them
    assert jobs[5].payload == {}


@pytest.mark.parametrize("bad", ["priority", "dedupe_key", "payload", "queue", "max_attempts"])
def test_a_bad_spec_late_in_a_large_bulk_call_inserts_nothing(noop_type: JobType, bad: str) -> None:
    from django_sqlqueue.exceptions import InvalidArgument, InvalidPayload

    specs = [JobSpec("Noop", {"i": i}) for i in range(MANY)]
    wrong = {"priority": {"priority": 40000}, "dedupe_key": {"dedupe_key": "k" * 201},
             "payload": {"payload": {"s": {1, 2}}}, "queue": {"queue": ""}, "max_attempts": {"max_attempts": 0}}[bad]
    specs[MANY - 3] = JobSpec("Noop", **{"payload": {"i": 0}, **wrong})  # options the earlier specs share, but one
    before = Job.objects.count()
    with pytest.raises((InvalidArgument, InvalidPayload)):
        Job.objects.enqueue_many(specs)
    assert Job.objects.count() == before


def test_large_bulk_of_a_limited_type_stores_keys_and_flags_and_makes_permits(make_type) -> None:
    from django_sqlqueue.models import LimitPermit

    make_type("test.LimitedKeyed", concurrency_limit=2)
    jobs = Job.objects.enqueue_many([JobSpec("test.LimitedKeyed", {"customer": f"c{i % 3}", "seconds": 0})
                                     for i in range(MANY)])
    rows = {j.pk: j for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert [rows[j.pk].concurrency_key for j in jobs] == [f"c{i % 3}" for i in range(MANY)]
    assert all(r.limited for r in rows.values())
    keys = set(LimitPermit.objects.filter(job_type__name="test.LimitedKeyed").values_list("key", flat=True))
    assert {"c0", "c1", "c2"} <= keys


def test_large_bulk_with_dependencies_and_subtypes(make_type, noop_type: JobType) -> None:
    from django_sqlqueue.models import JobDependency
    from django_sqlqueue.states import Status

    specs = [JobSpec("Noop", {"i": i}) for i in range(MANY)]
    for i in range(1, MANY, 2):
        specs[i].after = [specs[i - 1]]
        specs[i].__post_init__()
    jobs = Job.objects.enqueue_many(specs)
    states = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status_id"))
    assert [states[j.pk] for j in jobs] == [int(Status.WAITING if i % 2 else Status.PENDING) for i in range(MANY)]
    pairs = set(JobDependency.objects.values_list("job_id", "depends_on_id"))
    assert pairs == {(jobs[i].pk, jobs[i - 1].pk) for i in range(1, MANY, 2)}


def test_large_bulk_with_keys_and_without_mixes_both_paths(noop_type: JobType) -> None:
    first = Job.objects.enqueue("Noop", dedupe_key="m7")
    specs = [JobSpec("Noop", {"i": i}, dedupe_key="m7" if i in (7, 9) else None) for i in range(MANY)]
    jobs = Job.objects.enqueue_many(specs)
    assert jobs[7].pk == jobs[9].pk == first.pk and jobs[9].deduplicated
    assert Job.objects.count() == MANY - 1


@pytest.mark.django_db(transaction=True)
def test_large_bulk_notifies_once_after_commit(noop_type: JobType) -> None:
    if connection.vendor != "postgresql":
        assert len(Job.objects.enqueue_many([JobSpec("Noop") for _ in range(MANY)])) == MANY
        return
    import psycopg

    from django_sqlqueue.conf import get_settings

    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True) as listener:
        listener.execute(f"LISTEN {get_settings().NOTIFY_CHANNEL}")
        Job.objects.enqueue_many([JobSpec("Noop", queue="mail" if i % 2 else "default") for i in range(MANY)])
        got = [n.payload for n in listener.notifies(timeout=3)]
    assert got == ["default,mail"]  # one per transaction, naming its queues
