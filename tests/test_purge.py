"""``manage.py purge_queue``: retention of finished jobs, in batches, with history and subtypes."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue.exceptions import InvalidArgument
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


# ----- issue 21 finding 7: the DELETE re-checks, and no row is ever loaded -------------------------------------
def _retry_in_another_thread(job_id: int) -> None:
    """Move a Failed job back to Pending from a thread of its own (its own database connection)."""
    errors: list[BaseException] = []

    def retry() -> None:
        try:
            Job.objects.modify(job_id, None, Status.PENDING)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=retry)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and not errors, errors


@pytest.mark.django_db(transaction=True)
def test_a_job_retried_between_the_id_read_and_the_delete_is_kept_with_its_rows(noop_type) -> None:
    """The purge reads ids first, then deletes: a job retried in between is no longer purgeable and must
    survive, with its history and subtype rows (which its next run needs)."""
    kept = finished(Status.FAILED, 10, subtypes=[EmailChannel(email_to="kept@example.com")])
    gone = finished(Status.FAILED, 10, subtypes=[EmailChannel(email_to="gone@example.com")])
    job_table = Job._meta.db_table
    fired: list[str] = []

    def after_the_id_read(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not fired and sql.lstrip().upper().startswith("SELECT") and job_table in sql:
            fired.append(sql)  # the batch's ids are read: now an operator retries one of them
            _retry_in_another_thread(kept.pk)
        return result

    with connection.execute_wrapper(after_the_id_read):
        out = purge("--older-than", "7d", "--status", "Failed")
    assert fired
    assert "purged 1 job(s) (Failed)" in out
    job = Job.objects.get(pk=kept.pk)
    assert job.state == Status.PENDING
    assert JobAttempt.objects.filter(job_id=kept.pk).count() == 1
    assert list(EmailChannel.objects.values_list("email_to", flat=True)) == ["kept@example.com"]
    assert not Job.objects.filter(pk=gone.pk).exists()
    assert not JobAttempt.objects.filter(job_id=gone.pk).exists()


def test_purge_reads_ids_only_never_a_payload(noop_type) -> None:
    """Django's delete collector loads every row it deletes (payloads of a megabyte each, 500 a batch);
    the purge must delete by id without reading any job column but the id."""
    big = "x" * 200_000
    jobs = [finished(Status.COMPLETED, 10, payload={"blob": big},
                     subtypes=[EmailChannel(email_to=f"{i}@example.com")]) for i in range(3)]
    payload_column = connection.ops.quote_name(Job._meta.get_field("payload").column)
    with CaptureQueriesContext(connection) as queries:
        out = purge("--older-than", "7d", "--batch-size", "2")
    assert "purged 3 job(s)" in out
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs]).exists()
    assert not EmailChannel.objects.exists()
    statements = [q["sql"] for q in queries.captured_queries]
    reading_payloads = [sql for sql in statements if payload_column in sql or "payload" in sql.lower()]
    assert reading_payloads == []
    # Every read of the job table selects the id alone.
    reads = [sql for sql in statements if sql.lstrip().upper().startswith("SELECT") and Job._meta.db_table in sql]
    selected = [re.match(r"(?is)\s*SELECT\s+(?:TOP\s*\(?\s*\d+\s*\)?\s+)?(.*?)\s+FROM\s", sql).group(1)
                for sql in reads]
    assert selected and all("," not in cols and re.search(r"\bid\W*$", cols) for cols in selected), selected


def test_purge_refuses_unfinished_statuses_through_the_api(noop_type) -> None:
    pending = Job.objects.enqueue("Noop")
    Job.objects.filter(pk=pending.pk).update(updated_at=timezone.now() - timedelta(days=30))
    with pytest.raises(InvalidArgument, match="only finished jobs may be purged"):
        Job.objects.purge([pending.pk], statuses=[Status.PENDING], cutoff=timezone.now())
    with pytest.raises(InvalidArgument, match="only finished jobs may be purged"):
        Job.objects.purgeable([Status.COMPLETED, Status.PROCESSING], timezone.now())
    assert Job.objects.filter(pk=pending.pk).exists()
    # A Completed status asked for, a Pending job named: the DELETE's own conditions keep it.
    assert Job.objects.purge([pending.pk], statuses=[Status.COMPLETED], cutoff=timezone.now()) == 0
    assert Job.objects.filter(pk=pending.pk).exists()


def test_finished_batches_go_once_no_member_is_left(noop_type) -> None:
    # A workflow batch (docs/workflows.md) finished before the cutoff goes when its last member has
    # been purged; one with a member still kept, a younger one, and an unfinished one stay.
    from django_sqlqueue.models import Batch

    old = timezone.now() - timedelta(days=10)
    emptied, kept_member, young, open_ = (Batch.objects.create(description=d) for d in ("a", "b", "c", "d"))
    Batch.objects.filter(pk__in=[emptied.pk, kept_member.pk]).update(finished_at=old, closed_at=old)
    Batch.objects.filter(pk=young.pk).update(finished_at=timezone.now() - timedelta(days=1))
    done = finished(Status.COMPLETED, days_ago=10)
    failed = finished(Status.FAILED, days_ago=10)
    Job.objects.filter(pk=done.pk).update(batch=emptied)
    Job.objects.filter(pk=failed.pk).update(batch=kept_member)
    assert "would purge 1 job(s) (Completed)" in purge("--older-than", "7d", "--dry-run")
    assert purge("--older-than", "7d", "--dry-run").rstrip().endswith("and 1 finished batch(es)")  # a only
    out = purge("--older-than", "7d")
    assert "purged 1 job(s)" in out and "and 1 finished batch(es) without members" in out
    assert sorted(Batch.objects.values_list("description", flat=True)) == ["b", "c", "d"]
    assert Job.objects.get(pk=failed.pk).batch_id == kept_member.pk
