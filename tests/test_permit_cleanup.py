"""Issue 29.2 and 29.3: idle key permits are removed; a type's limit flag is written in batches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue import limits as permits
from django_sqlqueue.models import Job, JobType, LimitPermit

pytestmark = pytest.mark.django_db(transaction=True)


def limited(name: str, **limits) -> JobType:
    row, _ = JobType.objects.update_or_create(name=name, defaults={"concurrency_limit": None, "rate_limit": "",
                                                                   **limits})
    jobtypes.clear_cache()
    return row


def keys(row: JobType) -> set[str]:
    return set(LimitPermit.objects.filter(job_type_id=row.pk).values_list("key", flat=True))


def test_idle_key_permits_go_and_busy_held_and_shared_ones_stay() -> None:
    row = limited("Sync", concurrency_limit=1)
    busy = Job.objects.enqueue("Sync", {}, concurrency_key="busy")
    done = Job.objects.enqueue("Sync", {}, concurrency_key="done")
    Job.objects.filter(pk=done.pk).update(status_id=5)  # finished: its key has nothing left to run
    Job.objects.enqueue("Sync", {}, concurrency_key="held")
    Job.objects.filter(concurrency_key="held").update(status_id=6)
    LimitPermit.objects.filter(job_type_id=row.pk, key="held").update(held_until=timezone.now() + timedelta(hours=1))
    assert keys(row) == {"", "busy", "done", "held"}
    # the key with no unfinished job and no permit held goes; a held permit (a rate period still
    # running, a concurrency lease) keeps its scope; the type's shared scope is never removed
    assert permits.remove_idle_key_permits("default") == 1
    assert keys(row) == {"", "busy", "held"}
    assert Job.objects.get(pk=busy.pk).concurrency_key == "busy"
    # the supervisor's permit repair runs it on every pass
    LimitPermit.objects.filter(job_type_id=row.pk, key="held").update(held_until=None)
    permits.heal("default")
    assert keys(row) == {"", "busy"}
    # an enqueue of the key makes its permits again
    Job.objects.enqueue("Sync", {}, concurrency_key="done")
    assert keys(row) == {"", "busy", "done"}


def test_a_limit_set_or_removed_flags_the_types_jobs_in_batches(monkeypatch) -> None:
    limited("Bulk")
    jobs = [Job.objects.enqueue("Bulk", {"i": i}) for i in range(5)]
    monkeypatch.setattr(permits, "FLAG_BATCH", 2)
    row = limited("Bulk", concurrency_limit=2)  # post_save: sync_type
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("limited", flat=True)) == {True}
    row.concurrency_limit = None
    row.save()
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("limited", flat=True)) == {False}
    # batches of 2: 5 jobs in 3 UPDATEs, each only of jobs still to change
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert permits.flag_jobs("default", Job.objects.filter(job_type_id=row.pk), True) == 5
    # (mssql-django prefixes its UPDATE with SET NOCOUNT OFF)
    updates = [q["sql"] for q in queries.captured_queries if "UPDATE " in q["sql"].upper()]
    assert len(updates) == 3
