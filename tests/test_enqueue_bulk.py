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
