"""Issue 21 (findings 3, 4, 12): out-of-range values are refused where they enter, with a clear error.

A retry time no timestamp column holds, a job type with a lease of 0 s or a backoff of 1e10 s, a NUL in a
queue name, a newline in a type name, a response of 50 MB: each is refused at the call, the model, the
database or the admin form that brings it in, instead of failing later in a worker (see also
test_hostile_admin.py for the admin forms and pages).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue.conf import get_settings
from django_sqlqueue.exceptions import InvalidArgument, InvalidPayload, SqlQueueConfigError
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status

pytestmark = pytest.mark.django_db

CENTURY = 100 * 365 * 86400


def claimed(type_name: str = "Noop") -> Job:
    job = Job.objects.enqueue(type_name, queue="limits")
    (got,) = Job.objects.claim("w-limits", 1, queues=["limits"])
    assert got.pk == job.pk
    return got


# ----- finding 3, at the source: retry and schedule times within a century ----------------------------------
@pytest.mark.parametrize("delta", [timedelta(days=150 * 365), timedelta(days=-150 * 365)])
def test_a_schedule_beyond_a_century_is_refused_at_enqueue(noop_type, delta) -> None:
    with pytest.raises(InvalidArgument, match="within 100 years"):
        Job.objects.enqueue("Noop", scheduled_for=timezone.now() + delta)
    with pytest.raises(InvalidArgument, match="within 100 years"):
        Job.objects.enqueue("Noop", scheduled_for=datetime(9999, 12, 31, 23, 59, tzinfo=UTC))
    with pytest.raises(InvalidArgument, match="within 100 years"):
        Job.objects.enqueue_many([JobSpec("Noop", scheduled_for=datetime(1, 1, 1, tzinfo=UTC))])
    assert not Job.objects.exists()
    # Within the bound, far out, is fine.
    job = Job.objects.enqueue("Noop", scheduled_for=timezone.now() + timedelta(days=99 * 365))
    assert job.scheduled_for > timezone.now() + timedelta(days=98 * 365)


def test_a_retry_beyond_a_century_is_refused_with_the_bound_named(noop_type) -> None:
    job = claimed()
    with pytest.raises(InvalidArgument, match=r"up to 3153600000 \(100 years\), got 4730400000"):
        Job.objects.fail(job, "boom", retry_in=150 * 365 * 86400)
    with pytest.raises(InvalidArgument, match="within 100 years"):
        Job.objects.modify(job, job.version, Status.ERROR, scheduled_for=datetime(9999, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidArgument, match="run_in or scheduled_for"):
        Job.objects.modify(job, job.version, Status.ERROR, run_in=5, scheduled_for=timezone.now())
    assert Job.objects.get(pk=job.pk).state == Status.PROCESSING  # nothing was written
    # The largest retry is recorded.
    failed = Job.objects.fail(job, "boom", retry_in=CENTURY)
    assert failed.state == Status.ERROR
    assert failed.scheduled_for > timezone.now() + timedelta(days=99 * 365)


def test_retry_at_seconds_refuses_what_retry_at_must_refuse() -> None:
    """``Retry(at=...)`` goes through this (runner.py): a century at most, aware datetimes only."""
    from django_sqlqueue.bounds import retry_at_seconds

    assert retry_at_seconds(timezone.now() - timedelta(hours=1)) == 0.0
    assert 3590 < retry_at_seconds(timezone.now() + timedelta(hours=1)) <= 3600
    with pytest.raises(InvalidArgument, match="within 100 years"):
        retry_at_seconds(timezone.now() + timedelta(days=150 * 365))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        retry_at_seconds(datetime(2030, 1, 1))  # noqa: DTZ001 - the naive datetime is the point


# ----- findings 3 and 4: the job type's settings, in the model, the database and when read ------------------
@pytest.mark.parametrize(("field", "value"), [
    ("lease_seconds", 0), ("timeout_seconds", 0), ("max_attempts", 0),
    ("backoff_base_seconds", 1e10), ("backoff_max_seconds", 1e10), ("backoff_base_seconds", -1.0),
    ("backoff_max_seconds", float("nan")), ("backoff_base_seconds", float("inf")),
])
def test_the_model_refuses_type_settings_out_of_bounds(field, value) -> None:
    with pytest.raises(ValidationError) as info:
        JobType(name="Bounded", **{field: value}).full_clean()
    assert field in info.value.message_dict
    JobType(name="Bounded", lease_seconds=1, timeout_seconds=1, max_attempts=1, backoff_base_seconds=0,
            backoff_max_seconds=365 * 86400).full_clean()  # the bounds themselves are allowed


@pytest.mark.parametrize(("field", "value"), [
    ("lease_seconds", 0), ("timeout_seconds", 0), ("max_attempts", 0),
    ("backoff_base_seconds", 1e10), ("backoff_max_seconds", 1e10), ("backoff_max_seconds", -0.5),
])
def test_the_database_refuses_type_settings_out_of_bounds(field, value) -> None:
    """Check constraints: a row written without the model's validation (update(), a handler's options,
    raw SQL) is refused too, on every vendor."""
    jt = JobType.objects.create(name="Checked")
    with pytest.raises(IntegrityError), transaction.atomic():
        JobType.objects.filter(pk=jt.pk).update(**{field: value})
    with pytest.raises(IntegrityError), transaction.atomic():
        JobType.objects.create(name="Checked2", **{field: value})
    assert JobType.objects.filter(pk=jt.pk).values_list(field, flat=True).get() is None


def test_a_type_name_with_a_line_break_or_control_character_is_refused(noop_type) -> None:
    before = JobType.objects.count()
    for name in ("Forged\njob_finished worker=x status=Completed", "Tab\there", "Esc\x1b[31m", "Sep\u2028x"):
        with pytest.raises(InvalidArgument, match="control characters or line breaks"):
            Job.objects.enqueue(name)
        with pytest.raises(ValidationError) as info:
            JobType(name=name).full_clean()
        assert "name" in info.value.message_dict
    assert JobType.objects.count() == before
    import django_sqlqueue as sqlqueue

    with pytest.raises(InvalidArgument, match="control characters or line breaks"):
        sqlqueue.handler("Forged\nname")(lambda job: None)  # a handler declared under such a name
    JobType(name="Names may hold spaces, ünïcode, \u05e2\u05d1\u05e8\u05d9\u05ea and emoji \U0001f600").full_clean()


@pytest.mark.django_db(transaction=True)
def test_rows_out_of_bounds_are_clamped_when_read_and_by_the_migration(caplog) -> None:
    """A database holding such rows from before the bounds: workers read them clamped (with a warning),
    and migration 0006 brings them within bounds before adding the check constraints.

    The schema is migrated back to just before 0006; the model has columns of later migrations, so the
    row is read with only the columns that existed then (the clamp is the model's, whatever the query).
    """
    call_command("migrate", "django_sqlqueue", "0005", verbosity=0)
    try:
        qn = connection.ops.quote_name
        table = qn(JobType._meta.db_table)
        cols = ", ".join(qn(c) for c in ("name", "description", "max_attempts", "backoff_base_seconds",
                                         "backoff_max_seconds", "timeout_seconds", "lease_seconds", "paused",
                                         "created_at", "updated_at"))
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} ({cols}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                           ["Legacy", "", 0, 1e10, -5.0, 0, 0, False, now, now])
        jobtypes.clear_cache()
        with caplog.at_level(logging.WARNING, logger="django_sqlqueue"):
            info = JobType.objects.only("name", "max_attempts", "backoff_base_seconds", "backoff_max_seconds",
                                        "timeout_seconds", "lease_seconds").get(name="Legacy")
        assert (info.max_attempts, info.timeout_seconds, info.lease_seconds) == (1, 1, 1)
        assert (info.backoff_base_seconds, info.backoff_max_seconds) == (365 * 86400, 0.0)
        warned = [r.getMessage() for r in caplog.records if "job_type_setting_out_of_range" in r.getMessage()]
        assert len(warned) == 5 and any("field=lease_seconds stored=0 used=1" in w for w in warned), warned
    finally:
        call_command("migrate", "django_sqlqueue", verbosity=0)
    row = JobType.objects.filter(name="Legacy").values("max_attempts", "backoff_base_seconds", "backoff_max_seconds",
                                                       "timeout_seconds", "lease_seconds").get()
    assert row == {"max_attempts": 1, "backoff_base_seconds": 365 * 86400, "backoff_max_seconds": 0,
                   "timeout_seconds": 1, "lease_seconds": 1}
    with pytest.raises(IntegrityError), transaction.atomic():
        JobType.objects.filter(name="Legacy").update(lease_seconds=0)


@pytest.mark.parametrize(("key", "value"), [
    ("BACKOFF_MAX_SECONDS", 1e10), ("BACKOFF_BASE_SECONDS", 400 * 86400), ("HEARTBEAT_SECONDS", float("nan")),
    ("LEASE_SECONDS", float("inf")), ("MAX_RESPONSE_BYTES", 0),
])
def test_settings_out_of_bounds_are_refused(settings, key, value) -> None:
    settings.SQLQUEUE = {key: value}
    with pytest.raises(SqlQueueConfigError, match=rf"SQLQUEUE\['{key}'\] must be"):
        get_settings()


# ----- finding 12: what PostgreSQL cannot store is refused on every vendor ---------------------------------
def test_nul_in_a_queue_name_or_dedupe_key_is_refused_at_enqueue(noop_type) -> None:
    with pytest.raises(InvalidArgument, match="queue name cannot be stored: .*NUL"):
        Job.objects.enqueue("Noop", queue="a\x00b")
    with pytest.raises(InvalidArgument, match="dedupe_key cannot be stored: .*NUL"):
        Job.objects.enqueue("Noop", dedupe_key="k\x00")
    with pytest.raises(InvalidArgument, match="dedupe_key cannot be stored: .*surrogate"):
        Job.objects.enqueue_many([JobSpec("Noop"), JobSpec("Noop", dedupe_key="k\ud800")])
    assert not Job.objects.exists()


def test_a_response_over_the_size_limit_is_refused_naming_its_size(noop_type, settings) -> None:
    settings.SQLQUEUE = {**settings.SQLQUEUE, "MAX_RESPONSE_BYTES": 1000}
    job = claimed()
    big = {"blob": "x" * 2000}
    with pytest.raises(InvalidPayload, match=r"response cannot be stored: it is 2011 bytes; the limit is 1000 "
                                             r"\(SQLQUEUE\['MAX_RESPONSE_BYTES'\]\)"):
        Job.objects.complete(job, response=big)
    with pytest.raises(InvalidPayload, match="2011 bytes"):
        Job.objects.complete_many([(job, big)])
    with pytest.raises(InvalidPayload, match="2011 bytes"):
        Job.objects.advance_step(job, "next", response=big)
    assert Job.objects.get(pk=job.pk).response is None
    done = Job.objects.complete(job, response={"blob": "x" * 900})
    assert done.state == Status.COMPLETED


def test_response_problem_says_why_a_return_value_cannot_be_stored(settings) -> None:
    """What the worker asks before recording a success (runner.py), so an oversized return value fails
    its job with the reason instead of being stored or crashing the slot."""
    from django_sqlqueue.queue.values import response_problem

    settings.SQLQUEUE = {**settings.SQLQUEUE, "MAX_RESPONSE_BYTES": 100}
    assert response_problem({"ok": True}) is None
    assert response_problem("x" * 200) == "it is 202 bytes; the limit is 100 (SQLQUEUE['MAX_RESPONSE_BYTES'])"
    assert "NUL" in response_problem("a\x00")
    assert "not JSON-serialisable" in response_problem({1, 2})
    assert "not JSON-serialisable" in response_problem(float("nan"))
