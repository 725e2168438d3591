"""The claim is an index walk over claimable rows, never a table scan (PostgreSQL, SQLite, SQL Server).

On Babelfish (the tds stage) there is no SQL Server plan to read: queue_explain must say so, clearly.
"""

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
        if connection.vendor != "microsoft":
            cursor.execute("ANALYZE")
        elif not babelfish():  # Babelfish refuses UPDATE STATISTICS
            cursor.execute(f"UPDATE STATISTICS {connection.ops.quote_name(Job._meta.db_table)}")


def babelfish() -> bool:
    if connection.vendor != "microsoft":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT CAST(SERVERPROPERTY('Babelfish') AS nvarchar(10))")
        return cursor.fetchone()[0] is not None


def test_claim_plan_uses_the_claim_index() -> None:
    if babelfish():  # no plan to read: a few jobs show that it says so and claims none
        JobType.objects.get_or_create(name="Noop")
        Job.objects.enqueue("Noop")
        with pytest.raises(NotImplementedError, match="returned no plan"):
            explain_claim(limit=10)
        assert Job.objects.filter(status_id=1).count() == 1  # the rolled-back transaction claimed nothing
        return
    _fill()
    report = explain_claim(limit=10)
    assert report.uses_claim_index, report.plan
    assert not report.scans_job_table, report.plan


def test_queue_explain_command_prints_the_plan(capsys) -> None:
    if babelfish():
        from django.core.management.base import CommandError

        with pytest.raises(CommandError, match="returned no plan"):
            call_command("queue_explain", "--limit", "5")
        return
    _fill()
    call_command("queue_explain", "--limit", "5")
    out = capsys.readouterr().out
    assert "sqlqueue_job_claim" in out and out.strip().endswith("OK: the claim walks the claim index")
