"""Maintenance once per fleet: the lease (one holder, taken over when it runs out), retention, and the
maintenance passes' statements seeking indexes whatever the backlog (worker/maintenance.py)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.conf import get_settings
from django_sqlqueue.exceptions import SqlQueueConfigError
from django_sqlqueue.models import Job, JobAttempt, JobDependency, MaintenanceLease
from django_sqlqueue.queue.housekeeping import retention_batch
from django_sqlqueue.states import Status
from django_sqlqueue.worker.maintenance import (
    RETENTION_BUSY_SECONDS,
    RETENTION_IDLE_SECONDS,
    ROLLUP_SECONDS,
    Maintenance,
    release_lease,
    take_lease,
)
from testproject.notifications.models import EmailChannel
from tests import workerutil as wu

worker_procs = wu.worker_procs


# ----- the lease -----------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)  # each take its own transaction: PostgreSQL's now() moves
def test_the_lease_has_one_holder_until_it_runs_out_or_is_given_up() -> None:
    assert take_lease("default", "a", 60)  # the first take creates the row
    assert not take_lease("default", "b", 60)
    assert take_lease("default", "a", 60)  # renewed by its holder
    assert take_lease("default", "a", 1)
    time.sleep(1.5)  # a's lease has run out (the database's clock)
    assert take_lease("default", "b", 60)
    assert not take_lease("default", "a", 60)
    release_lease("default", "a")  # not a's any more: nothing happens
    assert not take_lease("default", "a", 60)
    release_lease("default", "b")
    assert take_lease("default", "a", 60)
    assert list(MaintenanceLease.objects.values_list("name", "holder")) == [("maintenance", "a")]


@pytest.mark.django_db
def test_only_the_holder_runs_the_passes() -> None:
    from django.test.utils import CaptureQueriesContext

    first, second = Maintenance("default", "first"), Maintenance("default", "second")
    first.run()
    second.run()  # its first turn also syncs the declared schedules and looks whether the lease row exists
    assert first.holding and not second.holding
    second.next_at = 0.0
    with CaptureQueriesContext(connection) as seen:
        second.run()
    # The one that does not hold it sends the lease's UPDATE, nothing else.
    assert len(seen.captured_queries) == 1 and "maintenancelease" in seen.captured_queries[0]["sql"], seen.captured_queries
    assert not second.holding
    assert second.next_at > time.monotonic() + get_settings().MAINTENANCE_LEASE_SECONDS * 0.6  # about once a lease


def _log_count(proc: wu.WorkerProcess, text: str) -> int:
    return proc.stderr().count(text)


@pytest.mark.timeout(420)  # a bound for a hang: the waits below add up to more under load
@pytest.mark.django_db(transaction=True)
def test_two_workers_one_runs_maintenance_and_the_other_takes_over_once_its_lease_ran_out(worker_procs) -> None:
    # A 12-s maintenance lease: a loaded machine's stall of a few seconds must not let the other worker
    # take a live holder's lease (with 4 s, a stall of under 3 s could); the takeover after the kill waits longer.
    lease_seconds = 12
    env = {"SQLQUEUE_TEST_MAINTENANCE_LEASE": str(lease_seconds), "SQLQUEUE_TEST_MAINTENANCE_DEBUG": "1",
           "SQLQUEUE_TEST_SCHEDULES_CHECK": "0.3"}
    procs = {name: worker_procs("--worker-name", name, env=env) for name in ("maint-a", "maint-b")}
    lease = wu.wait_until(lambda: MaintenanceLease.objects.filter(holder__startswith="maint-").first(), 60,
                          what="a holder")
    holder = lease.holder.split("#")[0]
    other = "maint-b" if holder == "maint-a" else "maint-a"
    wu.wait_until(lambda: _log_count(procs[holder], "maintenance_pass task=schedules") >= 5, 60,
                  what="the holder's schedule looks")
    assert _log_count(procs[other], "maintenance_pass") == 0, procs[other].output()
    assert "maintenance_lease_taken" not in procs[other].stderr()
    # The holder dies without a word (its whole process group): its lease runs out, then the other takes it.
    procs[holder].kill_group()
    last = MaintenanceLease.objects.get(name="maintenance")
    assert last.holder.startswith(holder)
    wu.wait_until(lambda: "maintenance_lease_taken" in procs[other].stderr(), 120, what="the takeover")
    taken = MaintenanceLease.objects.get(name="maintenance")
    assert taken.holder.startswith(other)
    # Taken (or since renewed) no earlier than the dead holder's lease ran out.
    assert taken.expires_at - timedelta(seconds=lease_seconds) >= last.expires_at, (taken.expires_at, last.expires_at)
    wu.wait_until(lambda: _log_count(procs[other], "maintenance_pass task=schedules") >= 3, 60,
                  what="the new holder's schedule looks")
    # A clean stop gives the lease up at once.
    procs[other].signal(signal.SIGTERM)
    assert procs[other].wait(60) == 0, procs[other].output()
    assert MaintenanceLease.objects.get(name="maintenance").expires_at < timezone.now()


# ----- retention -------------------------------------------------------------------------------------------
#: One clock for the finish times a test writes (creating a job can take a second on a slow server).
_NOW = timezone.now()


def _finished(status: Status, seconds_ago: float, **kwargs: object) -> Job:
    job = Job.objects.enqueue("Noop", **kwargs)
    [claimed] = Job.objects.claim("keeper", types=["Noop"])
    if status == Status.COMPLETED:
        claimed.complete()
    else:
        Job.objects.modify(claimed, claimed.version, status, error="x")
    Job.objects.filter(pk=job.pk).update(finished_at=_NOW - timedelta(seconds=seconds_ago))
    return job


@pytest.mark.django_db
def test_retention_deletes_what_is_due_with_its_rows_in_bounded_batches(noop_type) -> None:
    old = [_finished(Status.COMPLETED, 3 * 86400 + i, subtypes=[EmailChannel(email_to=f"{i}@example.com")])
           for i in range(5)]
    recent = _finished(Status.COMPLETED, 3600)
    old_failed = _finished(Status.FAILED, 3 * 86400)
    old_cancelled = _finished(Status.CANCELLED, 3 * 86400)  # not named: kept
    pending = Job.objects.enqueue("Noop")
    dependent = Job.objects.enqueue("Noop", after=[old[0]])  # a dependency row on a due job
    assert JobDependency.objects.filter(depends_on_id=old[0].pk).exists()
    due_ids = {j.pk for j in old}
    assert JobAttempt.objects.filter(job_id__in=due_ids).count() == 5 and EmailChannel.objects.count() == 5

    maint = Maintenance("default", "me")
    with override_settings(SQLQUEUE={"RETENTION": {"Completed": "2d", "Failed": "7d"}, "RETENTION_BATCH_SIZE": 2}):
        # Nothing before the throughput rollup has counted the jobs' hours (it catches up a day a pass).
        assert maint._retention() == RETENTION_IDLE_SECONDS
        assert Job.objects.filter(pk__in=due_ids).count() == 5
        passes = 1
        while maint._roll_up() != ROLLUP_SECONDS:
            passes += 1
        assert passes > 1  # three days from the oldest job, an hour (or a few) a pass
        # Oldest first, two per batch: 5 due Completed jobs take three turns; the third comes back short.
        assert maint._retention() == RETENTION_BUSY_SECONDS
        assert set(Job.objects.filter(pk__in=due_ids).values_list("pk", flat=True)) == due_ids - {old[4].pk, old[3].pk}
        assert maint._retention() == RETENTION_BUSY_SECONDS
        assert maint._retention() == RETENTION_IDLE_SECONDS
        assert maint._retention() == RETENTION_IDLE_SECONDS
    assert not Job.objects.filter(pk__in=due_ids).exists()
    assert not JobAttempt.objects.filter(job_id__in=due_ids).exists()
    assert not EmailChannel.objects.exists()
    assert not JobDependency.objects.filter(depends_on_id=old[0].pk).exists()
    assert set(Job.objects.values_list("pk", flat=True)) == {recent.pk, old_failed.pk, old_cancelled.pk, pending.pk,
                                                             dependent.pk}
    assert JobAttempt.objects.filter(job_id=recent.pk).count() == 1


@pytest.mark.django_db
def test_a_retention_batch_keeps_a_job_retried_since_its_id_was_read(noop_type) -> None:
    job = _finished(Status.FAILED, 86400)
    Job.objects.modify(job.pk, None, Status.PENDING)  # an operator's retry
    assert retention_batch(Status.FAILED, timezone.now(), None, 10, "default") == (0, 0, None)
    assert Job.objects.filter(pk=job.pk, status_id=Status.PENDING).exists()


@pytest.mark.parametrize("value, message", [
    ({"Pending": "1d"}, "'Pending' is not a finished status"),
    ({"Completed": "soon"}, "must look like 90s"),
    ({"Completed": 0}, "at least 1 second"),
    ({"Complete": "1d"}, "'Complete' is not a finished status"),
    (["Completed"], "must be a dict of status -> age"),
])
def test_retention_settings_are_checked_with_a_clear_error(value, message) -> None:
    with override_settings(SQLQUEUE={"RETENTION": value}), pytest.raises(SqlQueueConfigError, match=message):
        get_settings()
    with override_settings(SQLQUEUE={"RETENTION_BATCH_SIZE": 5000}), pytest.raises(SqlQueueConfigError,
                                                                                 match="from 1 to 2000"):
        get_settings()


# ----- heal, in the maintenance pass ------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_pass_heals_the_types_saved_lately_and_sends_nothing_for_the_others(noop_type) -> None:
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue import jobtypes
    from django_sqlqueue.models import JobType

    JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": 1})
    jobtypes.clear_cache()
    stale = Job.objects.enqueue("Export", {})
    Job.objects.filter(pk=stale.pk).update(limited=False)  # as a process whose type cache was stale enqueues it
    Maintenance("default", "me")._reap()
    assert Job.objects.get(pk=stale.pk).limited
    # No type saved in the last five minutes: heal reads the type table and sends no statement about jobs.
    JobType.objects.update(updated_at=timezone.now() - timedelta(hours=1))
    Job.objects.filter(pk=stale.pk).update(limited=False)
    with CaptureQueriesContext(connection) as seen:
        Maintenance("default", "me")._reap()
    assert not any('"limited"' in q["sql"].replace("[", '"').replace("]", '"') and "UPDATE" in q["sql"].upper()
                   for q in seen.captured_queries), seen.captured_queries
    assert not Job.objects.get(pk=stale.pk).limited
