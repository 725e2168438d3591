"""Bulk enqueue paths (PostgreSQL: COPY, or unnest with dedupe keys) and the one-statement single enqueue:
what they return must be exactly what was stored."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqlqueue.dialects.base import JOB_COLUMNS
from django_sqlqueue.managers import JobSpec
from django_sqlqueue.models import Job, JobType

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
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["mail"]
    _same(job, Job.objects.get(pk=job.pk))
