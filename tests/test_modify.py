"""modify(): the transition table applied to real rows, the concurrency token, attempt bookkeeping."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqlqueue import (
    IllegalTransition,
    InvalidArgument,
    InvalidPayload,
    JobNotFound,
    StaleJob,
    Status,
    enqueue,
)
from django_sqlqueue.models import Job, JobAttempt, JobType
from django_sqlqueue.queue import CLAIM_ONLY
from django_sqlqueue.states import TRANSITIONS

pytestmark = pytest.mark.django_db


def job_in(status: Status) -> Job:
    """A job in ``status``, reached through claim/modify where possible."""
    job = enqueue("Noop")
    if status is Status.PENDING:
        return job
    if status is Status.PAUSED:
        return Job.objects.modify(job.pk, None, Status.PAUSED)
    if status is Status.WAITING:
        return enqueue("Noop", after=[job])
    claimed = Job.objects.claim(f"w-{job.pk}", 1)[0]
    if status is Status.PROCESSING:
        return claimed
    return Job.objects.modify(claimed, claimed.version, status, error="x" if status is Status.ERROR else None)


@pytest.mark.parametrize(("current", "new"), list(itertools.product(Status, Status)))
def test_modify_applies_the_table_to_every_pair(noop_type: JobType, current: Status, new: Status) -> None:
    job = job_in(current)
    assert job.state is current
    allowed = new in TRANSITIONS[current] and (current, new) not in CLAIM_ONLY
    if not allowed:
        with pytest.raises(IllegalTransition, match=f"{current.label} -> {new.label}"):
            Job.objects.modify(job, job.version, new)
        again = Job.objects.get(pk=job.pk)
        assert (again.status_id, again.version) == (job.status_id, job.version)
        return
    after = Job.objects.modify(job, job.version, new)
    assert after.state is new and after.version == job.version + 1
    assert Job.objects.get(pk=job.pk).version == after.version


def test_stale_token_is_refused_and_nothing_changes(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    moved = Job.objects.advance_step(job, "Send")
    with pytest.raises(StaleJob):
        Job.objects.modify(job, job.version, Status.COMPLETED, response={"late": True})
    with pytest.raises(StaleJob):
        Job.objects.modify(job.pk, job.version, Status.COMPLETED)
    now = Job.objects.get(pk=job.pk)
    assert now.state is Status.PROCESSING and now.response is None and now.version == moved.version
    with pytest.raises(JobNotFound):
        Job.objects.modify(10**9, 1, Status.COMPLETED)


def test_complete_stores_response_duration_and_closes_history(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    done = job.complete({"message_id": "abc"})
    assert done.state is Status.COMPLETED and done.response == {"message_id": "abc"}
    assert done.finished_at is not None and done.duration_ms is not None and done.duration_ms >= 0
    assert done.lease_expires_at is None
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.outcome_id == Status.COMPLETED and attempt.finished_at is not None


def test_error_becomes_failed_when_attempts_are_exhausted(noop_type: JobType) -> None:
    enqueue("Noop", max_attempts=2)
    outcomes = []
    for _ in range(2):
        job = Job.objects.claim("w", 1)[0]
        outcomes.append(Job.objects.fail(job, f"boom {job.attempt_num}", retry_in=0).state)
    assert outcomes == [Status.ERROR, Status.FAILED]
    history = list(JobAttempt.objects.filter(job=job).values_list("attempt_num", "outcome_id", "error"))
    assert history == [(1, Status.ERROR, "boom 1"), (2, Status.FAILED, "boom 2")]


def test_steps_advance_and_are_kept(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    job = job.advance_step("Render")
    job = job.advance_step("Send")
    failed = job.fail("smtp down", retry_in=0)
    assert failed.step == "Send"
    again = Job.objects.claim("w", 1)[0]
    assert again.step == "Send" and again.attempt_num == 2


def test_release_gives_the_attempt_back(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    back = Job.objects.release(job)
    assert back.state is Status.PENDING and back.attempt_num == 0 and back.worker == ""
    assert not JobAttempt.objects.filter(job=job).exists()


def test_operator_retry_of_failed_job_grants_one_more_attempt(noop_type: JobType) -> None:
    enqueue("Noop", max_attempts=1)
    job = Job.objects.claim("w", 1)[0]
    failed = job.fail("boom", retry_in=0)
    assert failed.state is Status.FAILED
    retried = Job.objects.modify(failed.pk, failed.version, Status.PENDING)
    assert retried.state is Status.PENDING and retried.max_attempts == 2
    assert retried.scheduled_for <= timezone.now() + timedelta(seconds=1)
    second = Job.objects.claim("w", 1)[0]
    assert second.attempt_num == 2
    failed_again = Job.objects.modify(second, second.version, Status.FAILED, error="still broken")
    fresh = Job.objects.modify(failed_again.pk, None, Status.PENDING, reset_attempts=True)
    assert fresh.attempt_num == 0 and fresh.state is Status.PENDING


def test_non_json_response_is_refused(noop_type: JobType) -> None:
    enqueue("Noop")
    job = Job.objects.claim("w", 1)[0]
    with pytest.raises(InvalidPayload, match="response"):
        job.complete({"obj": object()})
    assert Job.objects.get(pk=job.pk).state is Status.PROCESSING


def test_a_measured_duration_is_stored_for_every_finish(noop_type: JobType) -> None:
    enqueue("Noop", max_attempts=1)
    job = Job.objects.claim("w", 1)[0]
    with pytest.raises(InvalidArgument):
        Job.objects.fail(job, "boom", duration=-1)
    with pytest.raises(InvalidArgument):
        Job.objects.fail(job, "boom", duration=float("nan"))
    failed = Job.objects.fail(job, "boom", retry_in=0, duration=1.2344)
    assert failed.state is Status.FAILED and failed.duration_ms == 1234
    assert JobAttempt.objects.get(job=job).duration_ms == 1234
    enqueue("Noop")
    other = Job.objects.claim("w", 1)[0]
    cancelled = Job.objects.modify(other, other.version, Status.CANCELLED, duration=0.002)
    assert cancelled.duration_ms == 2 and JobAttempt.objects.get(job=other).duration_ms == 2
