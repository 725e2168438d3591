"""``manage.py purge_queue``: retention of finished jobs, in batches, with history and subtypes."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_sqlqueue.models import Job, JobAttempt, Worker
from django_sqlqueue.states import Status
from testproject.notifications.models import EmailChannel

pytestmark = pytest.mark.django_db


def finished(status: Status, days_ago: float, queue: str = "default", **kwargs: object) -> Job:
    job = Job.objects.enqueue("Noop", queue=queue, **kwargs)
    claimed = Job.objects.claim("purger", types=["Noop"])[0]
    if status == Status.COMPLETED:
        claimed.complete()
    else:
        Job.objects.modify(claimed, claimed.version, status, error="x")
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days_ago))
    return job


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_queue", *args, stdout=out)
    return out.getvalue()


def test_purges_old_completed_jobs_with_history_and_subtypes_in_batches(noop_type) -> None:
    old = [finished(Status.COMPLETED, 10, subtypes=[EmailChannel(email_to=f"{i}@example.com")]) for i in range(5)]
    recent = finished(Status.COMPLETED, 1)
    old_failed = finished(Status.FAILED, 10)
    pending = Job.objects.enqueue("Noop")
    Job.objects.filter(pk=pending.pk).update(enqueued_at=timezone.now() - timedelta(days=30))

    assert "would purge 5 job(s)" in purge("--older-than", "7d", "--dry-run")
    assert Job.objects.count() == 8

    out = purge("--older-than", "7d", "--status", "Completed", "--batch-size", "2")
    assert "purged 5 job(s) (Completed)" in out
    assert not Job.objects.filter(pk__in=[j.pk for j in old]).exists()
    assert not JobAttempt.objects.filter(job_id__in=[j.pk for j in old]).exists()
    assert not EmailChannel.objects.exists()
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, old_failed.pk, pending.pk}

    assert "purged 1 job(s) (Failed)" in purge("--older-than", "168h", "--status", "failed")
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, pending.pk}


def test_queue_filter_and_several_statuses(noop_type) -> None:
    a = finished(Status.COMPLETED, 3, queue="a")
    b = finished(Status.COMPLETED, 3, queue="b")
    c = finished(Status.CANCELLED, 3, queue="a")
    out = purge("--older-than", "2d", "-q", "a", "--status", "Completed", "--status", "Cancelled")
    assert "purged 2 job(s) (Completed, Cancelled)" in out
    assert list(Job.objects.values_list("pk", flat=True)) == [b.pk]
    assert not Job.objects.filter(pk__in=[a.pk, c.pk]).exists()


def test_worker_rows(noop_type) -> None:
    now = timezone.now()
    Worker.objects.create(name="old", started_at=now - timedelta(days=9), last_heartbeat=now - timedelta(days=9))
    Worker.objects.create(name="live", started_at=now, last_heartbeat=now)
    assert "and 1 worker row(s)" in purge("--older-than", "7d", "--workers")
    assert list(Worker.objects.values_list("name", flat=True)) == ["live"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "--older-than must look like"),
        (["--older-than=-3d"], "--older-than must look like"),
        (["--older-than", "99999w"], "more than 100 years"),
        (["--older-than", "7d", "--status", "Pending"], "not a finished status"),
        (["--older-than", "7d", "--status", "Processing"], "not a finished status"),
        (["--older-than", "7d", "--status", "Bogus"], "unknown status"),
        (["--older-than", "7d", "--batch-size", "0"], "--batch-size must be"),
        (["--older-than", "7d", "--batch-size", "100000"], "--batch-size must be"),
        (["--older-than", "7d", "--pause", "-1"], "--pause must be"),
    ],
)
def test_bad_values_are_refused(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        purge(*args)
