"""Batched completion: many jobs completed (and their history closed) in one statement, token-checked."""

from __future__ import annotations

import pytest

from django_sqlqueue import InvalidArgument, Status, enqueue
from django_sqlqueue.conf import SqlQueueConfigError, get_settings
from django_sqlqueue.models import Job, JobAttempt, JobType
from django_sqlqueue.queue import JobSpec

pytestmark = pytest.mark.django_db


def test_complete_many_completes_and_closes_history(noop_type: JobType) -> None:
    Job.objects.enqueue_many([JobSpec("Noop", {"i": i}) for i in range(5)])
    claimed = Job.objects.claim("w", 5)
    done = Job.objects.complete_many([(job, {"i": job.payload["i"]}) for job in claimed])
    assert sorted(j.pk for j in done) == sorted(j.pk for j in claimed)
    for job in done:
        assert job.state is Status.COMPLETED and job.response == job.payload
        assert job.finished_at is not None and job.duration_ms is not None and job.lease_expires_at is None
        assert job.version == next(c.version for c in claimed if c.pk == job.pk) + 1
    attempts = JobAttempt.objects.filter(job__in=[j.pk for j in claimed])
    assert attempts.count() == 5
    for attempt in attempts:
        assert attempt.outcome_id == Status.COMPLETED and attempt.finished_at is not None
        assert attempt.duration_ms == Job.objects.get(pk=attempt.job_id).duration_ms and attempt.error == ""


def test_a_measured_run_time_is_the_duration(noop_type: JobType) -> None:
    # A job that waited its turn in a batch did not run all the time since its claim: the worker
    # passes the handler's own run time, and that is what the job and its history row show.
    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(2)])
    measured, unmeasured = Job.objects.claim("w", 2)
    done = {j.pk: j for j in Job.objects.complete_many([(measured, None, 1.2345), (unmeasured, None)])}
    assert done[measured.pk].duration_ms == 1234 or done[measured.pk].duration_ms == 1235
    assert JobAttempt.objects.get(job=measured.pk).duration_ms == done[measured.pk].duration_ms
    assert 0 <= done[unmeasured.pk].duration_ms < 60_000  # claim to completion, by the database clock


def test_a_bad_run_time_is_refused_before_anything_is_written(noop_type: JobType) -> None:
    enqueue("Noop")
    [job] = Job.objects.claim("w", 1)
    for bad in (-1, float("nan"), "3"):
        with pytest.raises(InvalidArgument):
            Job.objects.complete_many([(job, None, bad)])
    assert Job.objects.get(pk=job.pk).state is Status.PROCESSING  # still claimed, token unchanged
    [done] = Job.objects.complete_many([(job, None, 0.5)])
    assert done.duration_ms == 500


def test_stale_token_is_left_alone(noop_type: JobType) -> None:
    enqueue("Noop")
    enqueue("Noop")
    first, second = Job.objects.claim("w", 2)
    Job.objects.modify(first, first.version, Status.TERMINATED)  # an operator got there first
    done = Job.objects.complete_many([(first, "late"), (second, None)])
    assert [j.pk for j in done] == [second.pk]
    first.refresh_from_db()
    assert first.state is Status.TERMINATED and first.response is None
    [open_attempt] = JobAttempt.objects.filter(job=second.pk).values_list("outcome_id", flat=True)
    assert open_attempt == Status.COMPLETED
    assert Job.objects.get(pk=second.pk).response is None  # None stays SQL NULL, as complete() stores it


def test_complete_and_claim_is_one_transaction(noop_type: JobType) -> None:
    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(3)])
    [a] = Job.objects.claim("w", 1)
    done, claimed = Job.objects.complete_and_claim([(a, {"ok": True})], "w", 5)
    assert [j.pk for j in done] == [a.pk] and done[0].state is Status.COMPLETED
    assert len(claimed) == 2 and all(j.state is Status.PROCESSING for j in claimed)
    assert a.pk not in {j.pk for j in claimed}
    # limit 0: complete only
    done, claimed = Job.objects.complete_and_claim([(j, None) for j in claimed], "w", 0)
    assert len(done) == 2 and claimed == []
    assert Job.objects.filter(status_id=Status.COMPLETED).count() == 3


def test_many_chunks(noop_type: JobType) -> None:
    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(1200)])
    claimed = Job.objects.claim("w", 1200)
    assert len(Job.objects.complete_many([(j, None) for j in claimed])) == 1200
    assert not JobAttempt.objects.filter(job__in=[j.pk for j in claimed], finished_at__isnull=True).exists()


def test_settings_cache_follows_changes(settings) -> None:
    settings.SQLQUEUE = {"MAX_ATTEMPTS": 7}
    assert get_settings().MAX_ATTEMPTS == 7
    settings.SQLQUEUE = {"MAX_ATTEMPTS": 9}
    assert get_settings().MAX_ATTEMPTS == 9
    assert get_settings() is get_settings()
    # A nested value edited in place is seen too (the cache compares a copy of the items, not them).
    settings.SQLQUEUE = {"SCHEDULES": {"tick": {"task": "Noop", "every": 60}}}
    first = get_settings()
    assert get_settings() is first
    settings.SQLQUEUE["SCHEDULES"]["tick"]["every"] = 120
    assert get_settings() is not first
    assert get_settings() is get_settings()
    # Not a dict: a clear error, not an AttributeError from reading it.
    settings.SQLQUEUE = ["MAX_ATTEMPTS", 3]
    with pytest.raises(SqlQueueConfigError, match="must be a dict"):
        get_settings()


def test_a_late_completion_after_a_reclaim_changes_nothing(noop_type: JobType) -> None:
    """The token decides, not only the status: a worker whose lease expired and whose job another worker
    took over (still Processing) cannot complete it; the new attempt stays open."""
    from datetime import timedelta

    from django.utils import timezone

    Job.objects.enqueue("Noop")
    [late] = Job.objects.claim("w-late", 1)
    Job.objects.filter(pk=late.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    [taken] = Job.objects.claim("w-new", 1)
    assert taken.pk == late.pk and taken.state is Status.PROCESSING and taken.version > late.version
    assert Job.objects.complete_many([(late, {"late": True})]) == []
    current = Job.objects.get(pk=late.pk)
    assert current.state is Status.PROCESSING and current.worker == "w-new" and current.response is None
    assert JobAttempt.objects.get(job=late.pk, attempt_num=taken.attempt_num).finished_at is None


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_fails_after_the_completions_rolls_them_back(noop_type: JobType, monkeypatch) -> None:
    """Completions and the next claim are one transaction: a failure in the claim (injected after the
    completions were sent) leaves the completed job Processing under its old token, history open."""
    from django.db import DatabaseError, connection

    from django_sqlqueue.dialects import get_dialect

    Job.objects.enqueue_many([JobSpec("Noop") for _ in range(3)])
    [job] = Job.objects.claim("w", 1)
    dialect = get_dialect(connection)
    if connection.vendor == "microsoft":  # one batch: its claim part fails after the completion ran
        from django_sqlqueue.dialects.mssql import Batch

        monkeypatch.setattr(dialect, "claim_batch", lambda req: Batch(body=["SELECT 1 / 0"]))
    else:
        def failing_claim(cursor, req):
            raise DatabaseError("injected: the claim fails after the completions")

        monkeypatch.setattr(dialect, "claim", failing_claim)
    with pytest.raises(DatabaseError):
        Job.objects.complete_and_claim([(job, {"ok": 1})], "w", 2)
    current = Job.objects.get(pk=job.pk)
    assert current.state is Status.PROCESSING and current.version == job.version and current.response is None
    assert JobAttempt.objects.get(job=job.pk).finished_at is None
    assert Job.objects.with_status(Status.PENDING).count() == 2
