"""Workflows (issue 17): dependencies (``after=``) and batches with callbacks, on real databases.

Transactional tests: the release runs when the finish has committed (transaction.on_commit), so these
tests commit for real instead of running inside a rolled-back test transaction.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from django_sqlqueue import JobNotFound, JobSpec, Status, enqueue
from django_sqlqueue.models import Batch, Job, JobDependency
from django_sqlqueue.workflows import (
    BatchClosed,
    DependencyError,
    backstop,
    batch,
    batch_counts,
    close_batch,
    open_batch,
)

pytestmark = pytest.mark.django_db(transaction=True)


def claim_one(job: Job) -> Job:
    """Claim exactly ``job`` (the only claimable one in these tests, or the first by id)."""
    got = Job.objects.claim("w", 1, types=[job.job_type.name])
    assert got and got[0].pk == job.pk, (got, job.pk)
    return got[0]


def finish(job: Job, status: Status = Status.COMPLETED) -> Job:
    claimed = claim_one(job)
    if status is Status.COMPLETED:
        return Job.objects.complete_many([(claimed, None)])[0]
    return Job.objects.modify(claimed, claimed.version, status, error="boom")


def state(job: Job | int) -> Status:
    return Job.objects.get(pk=getattr(job, "pk", job)).state


def test_a_dependent_waits_then_is_released_when_its_dependency_completes(noop_type) -> None:
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    assert b.state is Status.WAITING and state(b) is Status.WAITING
    assert Job.objects.get(pk=a.pk).has_dependents is True
    assert [j.pk for j in Job.objects.claim("w", 10)] == [a.pk]  # b is not claimable
    done = Job.objects.complete_many([(Job.objects.get(pk=a.pk), None)])
    assert done and done[0].has_dependents is True
    assert state(b) is Status.PENDING
    assert [j.pk for j in Job.objects.claim("w", 10)] == [b.pk]


def test_plain_jobs_carry_no_marker(noop_type) -> None:
    a = enqueue("Noop")
    row = Job.objects.get(pk=a.pk)
    assert row.has_dependents is None and row.batch_id is None
    assert not JobDependency.objects.exists()


def test_all_dependencies_must_finish(noop_type) -> None:
    a, b = enqueue("Noop"), enqueue("Noop")
    c = enqueue("Noop", after=[a, b.pk])
    finish(a)
    assert state(c) is Status.WAITING
    finish(b)
    assert state(c) is Status.PENDING


def test_a_failed_dependency_cancels_the_dependent_by_default_and_the_cancel_propagates(noop_type) -> None:
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    c = enqueue("Noop", after=[b])
    finish(a, Status.FAILED)
    b_row = Job.objects.get(pk=b.pk)
    assert b_row.state is Status.CANCELLED and f"job {a.pk}" in b_row.error and "Failed" in b_row.error
    assert b_row.finished_at is not None
    assert state(c) is Status.CANCELLED  # b's cancellation is itself a finish: c follows


def test_run_anyway_policy_releases_after_a_failure(noop_type) -> None:
    a, b = enqueue("Noop"), enqueue("Noop")
    c = enqueue("Noop", after=[(a, "run"), b])
    d = enqueue("Noop", after=[a], on_dependency_failure="run")
    finish(a, Status.CANCELLED)
    assert state(d) is Status.PENDING
    assert state(c) is Status.WAITING  # b still unfinished
    Job.objects.modify(b.pk, None, Status.CANCELLED)  # an operator's cancel of a Pending dependency
    assert state(c) is Status.CANCELLED  # b is under the default policy


def test_a_dependency_on_a_finished_job_resolves_at_enqueue(noop_type) -> None:
    ok = finish(enqueue("Noop"))
    bad = finish(enqueue("Noop"), Status.FAILED)
    assert enqueue("Noop", after=[ok]).state is Status.PENDING
    cancelled = enqueue("Noop", after=[bad])
    assert cancelled.state is Status.CANCELLED and state(cancelled) is Status.CANCELLED
    assert enqueue("Noop", after=[(bad, "run")]).state is Status.PENDING


def test_a_missing_dependency_is_refused_and_nothing_is_written(noop_type) -> None:
    a = enqueue("Noop")
    with pytest.raises(JobNotFound, match="999999"):
        enqueue("Noop", after=[a, 999999])
    assert Job.objects.count() == 1 and not JobDependency.objects.exists()
    assert Job.objects.get(pk=a.pk).has_dependents is None


def test_a_cycle_among_specs_is_refused_and_nothing_is_written(noop_type) -> None:
    x, y, z = JobSpec("Noop"), JobSpec("Noop"), JobSpec("Noop")
    x.after = (y,)
    y.after = (z,)
    z.after = (x,)
    x.__post_init__(), y.__post_init__(), z.__post_init__()
    with pytest.raises(DependencyError, match="cycle"):
        Job.objects.enqueue_many([x, y, z])
    selfish = JobSpec("Noop")
    selfish.after = (selfish,)
    selfish.__post_init__()
    with pytest.raises(DependencyError, match="cycle"):
        Job.objects.enqueue_many([selfish])
    assert not Job.objects.exists()


def test_bad_after_values_are_refused(noop_type) -> None:
    a = enqueue("Noop")
    for bad in ([("x", "cancel")], [(a, "maybe")], a, ["1"], [True]):
        with pytest.raises(DependencyError):
            enqueue("Noop", after=bad)
    with pytest.raises(DependencyError, match="dedupe_key"):
        enqueue("Noop", after=[a], dedupe_key="k")
    with pytest.raises(DependencyError, match="same enqueue_many"):
        Job.objects.enqueue_many([JobSpec("Noop", after=[JobSpec("Noop")])])
    assert Job.objects.count() == 1


def test_enqueue_many_chains_specs_of_the_same_call(noop_type) -> None:
    first = JobSpec("Noop", {"n": 1})
    second = JobSpec("Noop", {"n": 2}, after=[first])
    third = JobSpec("Noop", {"n": 3}, after=[second])
    jobs = Job.objects.enqueue_many([third, first, second])
    assert [j.state for j in jobs] == [Status.WAITING, Status.PENDING, Status.WAITING]
    order = []
    while len(order) < 3:
        (job,) = Job.objects.claim("w", 5)
        order.append(job.payload["n"])
        Job.objects.complete_many([(job, None)])
    assert order == [1, 2, 3]


def test_a_rollback_leaves_no_half_built_workflow(noop_type) -> None:
    a = enqueue("Noop")
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("Noop", after=[a])
        with batch(on_success="Noop") as b:
            b.enqueue("Noop")
        raise RuntimeError("rolled back")
    assert list(Job.objects.values_list("pk", flat=True)) == [a.pk]
    assert not JobDependency.objects.exists() and not Batch.objects.exists()
    assert Job.objects.get(pk=a.pk).has_dependents is None


def test_a_batch_fires_on_success_and_on_finish_once_when_every_member_completed(noop_type) -> None:
    with batch(on_success=("Noop", {"what": "summary"}), on_failure="Noop", on_finish="Noop",
               description="invoices") as b:
        members = [b.enqueue("Noop", {"i": i}) for i in range(3)]
    row = Batch.objects.get(pk=b.pk)
    assert row.closed_at is not None and row.finished_at is None
    assert batch_counts(b.pk) == {Status.PENDING: 3}
    for m in members:
        finish(m)
    row.refresh_from_db()
    assert row.finished_at is not None and row.succeeded is True and len(row.callback_ids) == 2
    callbacks = list(Job.objects.filter(pk__in=row.callback_ids).order_by("pk"))
    assert callbacks[0].payload == {"batch_id": b.pk, "what": "summary"}
    assert callbacks[1].payload == {"batch_id": b.pk}
    assert all(c.batch_id is None for c in callbacks)
    assert backstop() == (0, 0)  # nothing missed, nothing fired twice
    assert Job.objects.count() == 5


def test_a_batch_with_a_failed_member_fires_on_failure(noop_type, make_type) -> None:
    make_type("Callback")
    with batch(on_success="Callback", on_failure=("Callback", {"f": 1})) as b:
        m1, m2 = b.enqueue("Noop"), b.enqueue("Noop")
    finish(m1, Status.FAILED)
    assert Batch.objects.get(pk=b.pk).finished_at is None
    finish(m2)
    row = Batch.objects.get(pk=b.pk)
    assert row.succeeded is False and len(row.callback_ids) == 1
    assert Job.objects.get(pk=row.callback_ids[0]).payload == {"batch_id": b.pk, "f": 1}
    # An operator's retry of the failed member runs it again; the batch has fired and does not again.
    Job.objects.modify(m1.pk, None, Status.PENDING)
    finish(m1)
    assert Batch.objects.get(pk=b.pk).callback_ids == row.callback_ids


def test_an_open_batch_takes_members_later_and_fires_only_when_closed(noop_type) -> None:
    with batch(on_finish="Noop", close=False) as b:
        first = b.enqueue("Noop")
    finish(first)
    assert Batch.objects.get(pk=b.pk).finished_at is None  # still open
    handle = open_batch(b.pk)
    later = handle.enqueue_many([JobSpec("Noop")])[0]
    handle.close()
    assert Batch.objects.get(pk=b.pk).finished_at is None
    with pytest.raises(BatchClosed):
        handle.enqueue("Noop")
    finish(later)
    assert len(Batch.objects.get(pk=b.pk).callback_ids) == 1


def test_a_batch_with_an_unknown_callback_type_is_refused_at_once(noop_type) -> None:
    from django_sqlqueue import InvalidArgument, InvalidPayload, UnknownJobType

    with pytest.raises(UnknownJobType):
        with batch(on_success="NoSuchType") as b:
            b.enqueue("Noop")
    with pytest.raises(InvalidPayload, match="on_finish"):
        batch(on_finish=("Noop", {"x": object()})).__enter__()
    with pytest.raises(InvalidArgument, match="unknown keys"):
        batch(on_finish={"job_type": "Noop", "when": 1}).__enter__()
    assert not Batch.objects.exists() and not Job.objects.exists()


def test_closing_a_batch_whose_members_all_finished_fires_at_once(noop_type) -> None:
    with batch(on_success="Noop", close=False) as b:
        m = b.enqueue("Noop")
    finish(m)
    close_batch(b.pk)
    assert len(Batch.objects.get(pk=b.pk).callback_ids) == 1


def test_the_backstop_releases_what_a_dead_worker_left(noop_type) -> None:
    """The release after the commit never ran (the worker died between): the periodic look does it."""
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    with batch(on_success="Noop") as bt:
        m = bt.enqueue("Noop")
    # Finish both as a worker that dies right after its commit would: the rows move, nothing else runs.
    for job in (a, m):
        claimed = claim_one(job)
        Job.objects.filter(pk=job.pk).update(status_id=Status.COMPLETED, version=claimed.version + 1)
    assert state(b) is Status.WAITING and Batch.objects.get(pk=bt.pk).finished_at is None
    assert backstop() == (1, 1)
    assert state(b) is Status.PENDING and len(Batch.objects.get(pk=bt.pk).callback_ids) == 1
    assert backstop() == (0, 0)


def test_an_operator_can_cancel_a_waiting_job_and_its_dependents_follow(noop_type) -> None:
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    c = enqueue("Noop", after=[b])
    Job.objects.modify(b.pk, None, Status.CANCELLED)
    assert state(c) is Status.CANCELLED
    finish(a)
    assert state(b) is Status.CANCELLED  # a finished later: b stays as the operator left it


def test_tasks_enqueued_inside_task_options_wait_and_join_a_batch(settings, noop_type) -> None:
    """The Tasks backend: ``task_options(after=[a TaskResult], batch=...)`` around ``Task.enqueue``."""
    from django.tasks import TaskResultStatus

    from django_sqlqueue.workflows import task_options
    from testproject.testjobs.tasks import tick

    from .test_tasks_defs import run_one

    settings.TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend", "QUEUES": []}}
    first = tick.enqueue("first")
    with batch(on_finish="Noop") as b, task_options(after=[first], batch=b):
        second = tick.enqueue("second")
    assert second.status == TaskResultStatus.READY
    row = Job.objects.get(pk=int(second.id))
    assert row.state is Status.WAITING and row.batch_id == b.pk
    assert list(JobDependency.objects.filter(job_id=row.pk).values_list("depends_on_id", flat=True)) == [int(first.id)]
    assert tick.enqueue("outside").id and Job.objects.filter(status_id=Status.WAITING).count() == 1
    assert run_one().pk == int(first.id)  # completes: releases the second
    assert Job.objects.get(pk=row.pk).state is Status.PENDING
    with pytest.raises(DependencyError):
        with task_options(after=["not a result"]):
            pass


def test_purging_a_finished_dependency_removes_its_rows_and_terminating_a_waiting_job_cascades(noop_type) -> None:
    from datetime import timedelta

    from django.utils import timezone

    a = finish(enqueue("Noop"))
    b = enqueue("Noop", after=[(a, "run")])  # resolved at enqueue: Pending
    c = enqueue("Noop")
    d = enqueue("Noop", after=[c])
    e = enqueue("Noop", after=[d])
    assert JobDependency.objects.count() == 3
    assert Job.objects.purge([a.pk], statuses=[Status.COMPLETED], cutoff=timezone.now() + timedelta(seconds=5)) == 1
    assert list(JobDependency.objects.values_list("job_id", flat=True).order_by("job_id")) == [d.pk, e.pk]
    assert state(b) is Status.PENDING
    Job.objects.modify(d.pk, None, Status.TERMINATED)
    assert state(e) is Status.CANCELLED and "Terminated" in Job.objects.get(pk=e.pk).error


def test_finishing_jobs_without_markers_sends_no_workflow_statement(noop_type) -> None:
    """The cost promise: the finish path of a plain job never touches the workflow tables."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    plain = [enqueue("Noop") for _ in range(4)]
    a = enqueue("Noop")
    enqueue("Noop", after=[a])  # a workflow exists in the table: plain jobs still pay nothing
    claimed = {j.pk: j for j in Job.objects.claim("w", 10)}
    with CaptureQueriesContext(connection) as queries:
        Job.objects.complete_many([(claimed[j.pk], None) for j in plain[:3]])
        Job.objects.modify(claimed[plain[3].pk], claimed[plain[3].pk].version, Status.FAILED, error="x")
    sent = " ".join(q["sql"] for q in queries.captured_queries).lower()
    assert queries.captured_queries and "jobdependency" not in sent and "sqlqueue_batch" not in sent
    with CaptureQueriesContext(connection) as queries:
        Job.objects.complete_many([(claimed[a.pk], None)])
    assert "jobdependency" in " ".join(q["sql"] for q in queries.captured_queries).lower()  # the test can see it


def test_a_chain_in_one_call_after_a_failed_job_is_cancelled_whole_and_returned_so(noop_type) -> None:
    bad = finish(enqueue("Noop"), Status.FAILED)
    first = JobSpec("Noop", after=[bad])
    second = JobSpec("Noop", after=[first])
    third = JobSpec("Noop", after=[(second, "run")])
    jobs = Job.objects.enqueue_many([first, second, third])
    assert [j.state for j in jobs] == [Status.CANCELLED, Status.CANCELLED, Status.PENDING]
    assert [state(j) for j in jobs] == [j.state for j in jobs]


def test_the_cancel_api_on_a_dependency_cancels_its_dependents(noop_type) -> None:
    # Job.objects.cancel (issue 16's API) on a Pending dependency, and on a Waiting one: the dependents
    # follow under the default policy, as with any other end that is not Completed.
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    c = enqueue("Noop", after=[b])
    Job.objects.cancel(a, by="ops", reason="not needed")
    assert [state(j) for j in (a, b, c)] == [Status.CANCELLED] * 3
    d = enqueue("Noop")
    e = enqueue("Noop", after=[d])
    f = enqueue("Noop", after=[(e, "run")])
    Job.objects.cancel(e, by="ops")
    assert [state(j) for j in (d, e, f)] == [Status.PENDING, Status.CANCELLED, Status.PENDING]


def test_a_cancel_request_for_a_running_dependency_waits_for_its_worker(noop_type) -> None:
    # A running dependency is only asked to stop; its dependent keeps waiting until the worker's end of
    # that attempt, and follows that end (here the worker records the cancel as its slot would).
    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    running = claim_one(a)
    asked = Job.objects.cancel(a, by="ops")
    assert asked.state is Status.PROCESSING and asked.cancel_request is not None
    assert state(b) is Status.WAITING
    Job.objects.modify(running, running.version, Status.CANCELLED, error=asked.cancel_request.describe())
    assert state(b) is Status.CANCELLED


@pytest.mark.parametrize("parked", [Status.WAITING, Status.PAUSED])
def test_a_job_waiting_or_paused_when_its_type_gets_a_limit_is_held_by_it_once_released(noop_type, make_type,
                                                                                         parked) -> None:
    # The limit is set while the job waits (or is paused): released later, it must be claimed through
    # the limit's permits like every other job of the type, not by the ordinary claim past the limit.
    from django_sqlqueue import jobtypes

    row = make_type("Export", concurrency_limit=None, rate_limit="")
    jobtypes.clear_cache()
    a = enqueue("Noop")
    parked_job = enqueue("Export", {"i": 0}, after=[a]) if parked is Status.WAITING else enqueue("Export", {"i": 0})
    if parked is Status.PAUSED:
        Job.objects.modify(parked_job, parked_job.version, Status.PAUSED)
    row.concurrency_limit = 1
    row.save()  # the admin's save: permits.sync_type
    jobtypes.clear_cache()
    running = enqueue("Export", {"i": 1})
    assert [j.pk for j in Job.objects.claim("w", 1, types=["Export"])] == [running.pk]
    if parked is Status.WAITING:
        finish(a)
    else:
        Job.objects.modify(Job.objects.get(pk=parked_job.pk), None, Status.PENDING)
    assert state(parked_job) is Status.PENDING
    assert Job.objects.claim("w", 10, types=["Export"]) == [], "1 of 1 running: the released job must wait"
    Job.objects.complete(Job.objects.get(pk=running.pk))
    assert [j.pk for j in Job.objects.claim("w", 10, types=["Export"])] == [parked_job.pk]


def test_a_job_waiting_when_its_types_limit_is_removed_is_claimed_at_once_when_released(noop_type, make_type) -> None:
    from django_sqlqueue import jobtypes

    row = make_type("Export", concurrency_limit=1, rate_limit="")
    jobtypes.clear_cache()
    a = enqueue("Noop")
    waiting = enqueue("Export", after=[a])
    row.concurrency_limit = None
    row.save()
    jobtypes.clear_cache()
    finish(a)
    assert [j.pk for j in Job.objects.claim("w", 10, types=["Export"])] == [waiting.pk]


def test_an_operator_retry_of_a_cancelled_dependent_is_refused_while_its_dependencies_are_unfinished(
        noop_type) -> None:
    # Cancelled while it waited, then retried: it must not run before the job it waits for has finished.
    from django_sqlqueue.exceptions import IllegalTransition

    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    Job.objects.cancel(b, by="ops")
    with pytest.raises(IllegalTransition, match=f"waits for job {a.pk}"):
        Job.objects.modify(b.pk, None, Status.PENDING)
    assert state(b) is Status.CANCELLED
    assert [j.pk for j in Job.objects.claim("w", 10)] == [a.pk]
    Job.objects.complete_many([(Job.objects.get(pk=a.pk), None)])
    Job.objects.modify(b.pk, None, Status.PENDING)  # its dependency has finished: the retry is allowed
    assert [j.pk for j in Job.objects.claim("w", 10)] == [b.pk]


def test_the_backstop_fires_the_other_batches_when_one_callback_cannot_be_enqueued(noop_type) -> None:
    # A batch whose callback cannot be enqueued (its type is gone) must not stop the backstop from
    # finishing every batch after it, on every pass.
    from django.utils import timezone

    bad = Batch.objects.create(closed_at=timezone.now(), on_success={"job_type": "NoSuchTypeAnyMore"})
    good = Batch.objects.create(closed_at=timezone.now(), on_success={"job_type": "Noop"})
    backstop()
    assert Batch.objects.get(pk=good.pk).finished_at is not None
    assert len(Batch.objects.get(pk=good.pk).callback_ids) == 1
    assert Batch.objects.get(pk=bad.pk).finished_at is None  # left for a later pass, the failure logged


def test_a_job_claimed_in_a_transaction_begun_before_its_dependency_finished_starts_after_that_finish(
        noop_type) -> None:
    """Recorded times follow the order of events (issue 31, item 10). A claim runs in a transaction that
    began earlier (completions ride in the next claim's transaction); the dependency finishes on another
    connection meanwhile. With PostgreSQL's now() (the transaction's start) the dependent's started_at
    came out before its dependency's finished_at; each vendor must stamp the statement's own time."""
    import threading

    from django.db import connection, connections

    if connection.vendor == "sqlite":  # (and 'now' is per statement there: see dialects/sqlite.py)
        pytest.skip("SQLite has no row locks: it serialises writers (BEGIN IMMEDIATE) instead")

    def finish_elsewhere() -> None:
        try:
            done.append(finish(a))
        finally:
            connections.close_all()  # this thread's own connection

    a = enqueue("Noop")
    b = enqueue("Noop", after=[a])
    done: list[Job] = []
    with transaction.atomic():
        with connection.cursor() as cursor:  # the transaction has begun (PostgreSQL's now() is fixed from here)
            cursor.execute("SELECT 1")  # (no table read: SQLite takes no lock, the other connection may write)
        finisher = threading.Thread(target=finish_elsewhere)
        finisher.start()
        finisher.join()
        assert done, "the dependency was not finished"
        assert [j.pk for j in Job.objects.claim("w", 10)] == [b.pk]
    a_row, b_row = Job.objects.get(pk=a.pk), Job.objects.get(pk=b.pk)
    assert a_row.finished_at <= b_row.started_at, (a_row.finished_at, b_row.started_at)
