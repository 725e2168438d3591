"""The claim is an index walk over claimable rows, never a table scan (PostgreSQL and SQLite)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connection

from django_sqlqueue.explain import explain_claim
from django_sqlqueue.managers import JobSpec
from django_sqlqueue.models import Job, JobType

pytestmark = pytest.mark.django_db


def _fill() -> None:
    JobType.objects.get_or_create(name="Noop")
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, priority=i % 3) for i in range(5000))
    # many finished rows: a scan would have to pass over them
    done = list(Job.objects.values_list("pk", flat=True)[:4000])
    Job.objects.filter(pk__in=done).update(status_id=5)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def test_claim_plan_uses_the_claim_index() -> None:
    _fill()
    report = explain_claim(limit=10)
    assert report.uses_claim_index, report.plan
    assert not report.scans_job_table, report.plan


def test_queue_explain_command_prints_the_plan(capsys) -> None:
    _fill()
    call_command("queue_explain", "--limit", "5")
    out = capsys.readouterr().out
    assert "sqlqueue_job_claim" in out and out.strip().endswith("OK: the claim walks the claim index")
