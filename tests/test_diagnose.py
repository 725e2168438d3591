"""queue_why / why_not_running: each reason matches what the claim actually does."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_sqlqueue import Status, enqueue, handler, registry
from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.ops.diagnose import why_not_running

pytestmark = pytest.mark.django_db


@pytest.fixture
def diag_type(db):
    handler("Diag")(lambda job: None)
    yield JobType.objects.get_or_create(name="Diag")[0]
    registry.unregister("Diag")


def test_claimable_job_has_no_reason_and_is_claimed(diag_type) -> None:
    job = enqueue("Diag")
    assert why_not_running(job) == []
    assert Job.objects.claim("w", 1)[0].pk == job.pk


def test_scheduled_paused_type_and_paused_job(diag_type) -> None:
    later = enqueue("Diag", delay=600)
    assert "scheduled for" in why_not_running(later)[0]
    JobType.objects.filter(pk=diag_type.pk).update(paused=True)
    from django_sqlqueue import jobtypes

    jobtypes.clear_cache()
    now_job = enqueue("Diag")
    assert any("is paused" in r for r in why_not_running(now_job))
    assert Job.objects.claim("w", 1) == []  # and the claim agrees
    paused = Job.objects.modify(now_job.pk, None, Status.PAUSED)
    assert any("it is Paused" in r for r in why_not_running(paused))


def test_held_by_live_then_dead_worker(diag_type) -> None:
    enqueue("Diag")
    job = Job.objects.claim("box:1/0", 1)[0]
    now = timezone.now()
    Worker.objects.create(name="box:1/0", started_at=now, last_heartbeat=now)
    assert "it is running" in why_not_running(job)[0]
    Worker.objects.filter(name="box:1/0").update(last_heartbeat=now - timedelta(hours=1))
    assert "which is gone" in why_not_running(job)[0]
    assert Job.objects.claim("other/0", 1)[0].pk == job.pk  # the claim takes it over, as said


def test_out_of_attempts_and_unknown_handler(make_type) -> None:
    make_type("NoHandler")
    job = enqueue("NoHandler", max_attempts=1)
    claimed = Job.objects.claim("w", 1)[0]
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    reasons = why_not_running(Job.objects.get(pk=claimed.pk))
    assert any("all 1 attempts" in r for r in reasons)
    assert any("no handler for 'NoHandler'" in r for r in reasons)


def test_command(diag_type) -> None:
    job = enqueue("Diag", delay=60)
    out = StringIO()
    call_command("queue_why", str(job.pk), stdout=out)
    assert f"job {job.pk} (Diag" in out.getvalue() and "scheduled for" in out.getvalue()
    with pytest.raises(CommandError, match="no job with id"):
        call_command("queue_why", "999999")
