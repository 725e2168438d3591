"""Job.objects.cancel(): at once for a job not running, a request for a running one, and the races.

Real rows on every vendor (tds included): the request is a row of its own, the job's token is not
bumped by it, so the worker's own finish still goes through; a finish that came first makes the cancel
"too late", refused without writing anything.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections

from django_sqlqueue import IllegalTransition, InvalidArgument, StaleJob, Status, enqueue
from django_sqlqueue.exceptions import CancelTooLate
from django_sqlqueue.models import CancelRequest, Job, JobAttempt
from django_sqlqueue.worker.runner import JobContext

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("noop_type")]


def claimed(name: str = "w-cancel") -> Job:
    job = enqueue("Noop")
    got = Job.objects.claim(name, 1)
    assert [j.pk for j in got] == [job.pk]
    return got[0]


@pytest.mark.parametrize("status", [Status.PENDING, Status.ERROR, Status.PAUSED])
def test_a_job_not_running_is_cancelled_at_once_saying_who(status: Status) -> None:
    if status is Status.ERROR:
        job = Job.objects.fail(claimed(), "boom", retry_in=60)
        assert job.state == Status.ERROR
    else:
        job = enqueue("Noop")
    if status is Status.PAUSED:
        job = Job.objects.modify(job, job.version, Status.PAUSED)
    done = Job.objects.cancel(job.pk, by="alice", reason="duplicate order")
    assert done.state == Status.CANCELLED
    assert done.error == "cancelled by alice: duplicate order"
    assert not CancelRequest.objects.exists()


def test_a_running_job_gets_a_request_and_keeps_its_token() -> None:
    job = claimed()
    asked = Job.objects.cancel(job, by="bob", reason="wrong customer")
    assert asked.state == Status.PROCESSING
    assert asked.version == job.version  # not a state change: the worker's own writes still go through
    request = asked.cancel_request
    assert (request.job_id, request.attempt_num, request.requested_by, request.reason) == (
        job.pk, 1, "bob", "wrong customer")
    assert request.requested_at is not None
    assert Job.objects.cancel_request_for(job.pk, 1) == request
    # A later attempt (this one unfinished: taken over or retried) is cancelled by it too; one after a
    # finished attempt is not (test_a_request_does_not_outlive_a_finished_attempt).
    assert Job.objects.cancel_request_for(job.pk, 2) == request
    # Asking again keeps the first request.
    again = Job.objects.cancel(job.pk, by="carol", reason="me too")
    assert again.cancel_request.pk == request.pk and again.cancel_request.requested_by == "bob"
    assert CancelRequest.objects.count() == 1


def test_completed_wins_over_a_request_that_arrives_while_it_finishes() -> None:
    """The request got in, but the handler returned successfully first: the worker's finish (with the
    token it read at the claim) is not refused, and the request stays as the record of a late cancel."""
    job = claimed()
    Job.objects.cancel(job, by="bob")
    done = Job.objects.complete(job, {"ok": True})
    assert done.state == Status.COMPLETED
    assert CancelRequest.objects.filter(job=job).count() == 1
    assert JobAttempt.objects.get(job=job).outcome_id == Status.COMPLETED


def test_cancel_of_a_job_that_just_finished_is_refused_cleanly() -> None:
    job = claimed()
    done = Job.objects.complete(job)
    with pytest.raises(CancelTooLate, match="Completed already: the cancel came too late"):
        Job.objects.cancel(job.pk, by="bob")
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.version, after.error) == (Status.COMPLETED, done.version, "")
    assert not CancelRequest.objects.exists()
    assert issubclass(CancelTooLate, IllegalTransition)


def test_a_stale_token_is_refused() -> None:
    job = enqueue("Noop")
    with pytest.raises(StaleJob):
        Job.objects.cancel(job, token=job.version + 1)
    assert Job.objects.get(pk=job.pk).state == Status.PENDING


def test_bad_arguments_are_refused_before_anything_is_read() -> None:
    job = enqueue("Noop")
    with pytest.raises(InvalidArgument):
        Job.objects.cancel(job, reason="x" * 1001)
    with pytest.raises(InvalidArgument):
        Job.objects.cancel(job, by=7)  # type: ignore[arg-type]


def test_a_cancelled_attempt_keeps_who_cancelled_it_in_its_history_row() -> None:
    job = claimed()
    Job.objects.modify(job, job.version, Status.CANCELLED, error="cancelled by dave: no longer needed")
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.outcome_id, attempt.error) == (Status.CANCELLED, "cancelled by dave: no longer needed")


def test_the_handler_context_says_cancelled_only_for_its_own_request() -> None:
    job = claimed()
    found: dict[int, CancelRequest] = {}
    ctx = JobContext(job, None, "w", lambda: job.pk in found, lambda: found.get(job.pk))  # type: ignore[arg-type]
    assert not ctx.cancelled and not ctx.should_stop() and ctx.cancel_request is None
    found[job.pk] = Job.objects.cancel(job, by="erin").cancel_request
    assert ctx.cancelled and ctx.should_stop() and ctx.cancel_request.requested_by == "erin"


@pytest.mark.django_db(transaction=True)
def test_a_cancel_racing_the_finish_either_gets_in_first_or_is_too_late() -> None:
    """Two threads, many rounds: the finish and the cancel at the same moment. Every round ends in one of
    the two defined ways, never an error of the worker's finish: request in (and the job Completed,
    "too late") or CancelTooLate with nothing written."""
    outcomes = []
    for _ in range(10):
        job = claimed(f"w-race-{len(outcomes)}")
        start = threading.Barrier(2)
        result: dict[str, object] = {}

        def finish(job: Job, start: threading.Barrier, result: dict[str, object]) -> None:
            start.wait()
            try:
                result["finish"] = Job.objects.complete(job).state
            finally:
                connections.close_all()

        thread = threading.Thread(target=finish, args=(job, start, result))
        thread.start()
        start.wait()
        try:
            Job.objects.cancel(job.pk, by="racer")
            result["cancel"] = "requested"
        except CancelTooLate:
            result["cancel"] = "too late"
        thread.join(30)
        assert result["finish"] == Status.COMPLETED
        requests = CancelRequest.objects.filter(job_id=job.pk).count()
        assert requests == (1 if result["cancel"] == "requested" else 0)
        outcomes.append(result["cancel"])
    assert set(outcomes) <= {"requested", "too late"}


# ----- an in-process Worker (no supervisor: cooperative only) --------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)  # beyond test.CancelSelf's 60-s wait for its cancel
def test_in_process_a_handler_that_stops_after_the_cancel_ends_cancelled_with_the_signal(settings) -> None:
    from django_sqlqueue import signals
    from tests import workerutil as wu

    settings.SQLQUEUE = {**getattr(settings, "SQLQUEUE", {}), "CANCEL_CHECK_SECONDS": 0.05}
    seen: list[dict] = []

    def receiver(sender, **kwargs) -> None:
        seen.append(kwargs)

    signals.job_cancelled.connect(receiver)
    try:
        job = Job.objects.enqueue("test.CancelSelf", {"then": "raise"})
        counters = wu.run_worker("inproc-cancel")
    finally:
        signals.job_cancelled.disconnect(receiver)
    job = Job.objects.get(pk=job.pk)
    assert job.state == Status.CANCELLED and job.attempt_num == 1
    assert job.error.startswith("cancelled by itself: testing (the handler stopped after")
    assert "its own outcome was: retry" in job.error
    assert JobAttempt.objects.get(job=job).error == job.error
    assert [(s["job"].pk, s["reason"]) for s in seen] == [(job.pk, job.error)]
    assert counters[3] == 1  # CANCELLED


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)  # beyond test.CancelSelf's 60-s wait for its cancel
def test_in_process_a_handler_that_returns_successfully_after_the_cancel_completes(settings) -> None:
    from tests import workerutil as wu

    settings.SQLQUEUE = {**getattr(settings, "SQLQUEUE", {}), "CANCEL_CHECK_SECONDS": 0.05}
    job = Job.objects.enqueue("test.CancelSelf", {"then": "return"})
    wu.run_worker("inproc-late")
    job = Job.objects.get(pk=job.pk)
    assert (job.state, job.response) == (Status.COMPLETED, {"finished": "anyway"})
    assert CancelRequest.objects.filter(job=job, attempt_num=1).count() == 1  # the record of a late cancel


def test_queue_why_says_a_cancel_is_pending() -> None:
    from django_sqlqueue.ops.diagnose import why_not_running

    job = claimed()
    assert not any("cancel was requested" in r for r in why_not_running(Job.objects.get(pk=job.pk)))
    Job.objects.cancel(job, by="frank")
    reasons = why_not_running(Job.objects.get(pk=job.pk))
    assert any("A cancel was requested at" in r and "by frank" in r for r in reasons), reasons


def test_a_running_job_whose_lease_ran_out_is_cancelled_at_once() -> None:
    # Its worker is dead (or stalled past its lease): a request would wait for nobody and the next claim
    # would run the job again, so the cancel ends it now, closing its attempt with who and why.
    job = claimed("w-dead")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=job.lease_expires_at - timedelta(days=1))
    done = Job.objects.cancel(job.pk, by="alice", reason="worker is gone")
    assert done.state == Status.CANCELLED and not CancelRequest.objects.filter(job_id=job.pk).exists()
    assert Job.objects.claim("w-next", 1) == []  # nothing left to take over
    attempt = JobAttempt.objects.get(job_id=job.pk)
    assert attempt.finished_at is not None and "alice" in (attempt.error or "")
    with pytest.raises(StaleJob):  # the dead worker's late result is refused by the token
        Job.objects.complete(job, response=None)


def test_a_request_outlives_an_attempt_that_ended_before_its_worker_acted() -> None:
    # The operator asked for the job to stop: its worker died (the job is taken over) or its handler
    # failed (the job is retried) before the request was acted on; the next attempt is cancelled too.
    job = claimed("w-dies")
    asked = Job.objects.cancel(job.pk, by="alice")
    assert asked.cancel_request is not None and asked.cancel_request.attempt_num == 1
    Job.objects.filter(pk=job.pk).update(lease_expires_at=job.lease_expires_at - timedelta(days=1))
    taken = Job.objects.claim("w-next", 1)
    assert [(j.pk, j.attempt_num) for j in taken] == [(job.pk, 2)]
    found = Job.objects.cancel_request_for(job.pk, 2)
    assert found is not None and found.requested_by == "alice"
    # Its failure under the request is not retried: the job is Cancelled (test below).
    failed = Job.objects.fail(taken[0], "boom", retry_in=0)
    assert failed.state == Status.CANCELLED and Job.objects.claim("w-third", 1) == []


def test_an_attempt_that_fails_or_is_handed_back_under_a_request_cancels_the_job() -> None:
    # Issue 31: the request came in, then the handler failed (or the slot handed the job back unstarted)
    # before its slot looked for requests: the write that ends the attempt cancels the job instead of
    # making it due again, in the same transaction; history keeps who asked and what the attempt did.
    job = claimed("w-quick")
    Job.objects.cancel(job.pk, by="alice", reason="wrong order")
    failed = Job.objects.fail(job, "Traceback ...\nRuntimeError: boom", retry_in=0)
    assert failed.state == Status.CANCELLED and failed.attempt_num == 1
    assert failed.error == ("cancelled by alice: wrong order (attempt 1 failed before its worker acted on the "
                            "request (RuntimeError: boom): not retried)")
    attempt = JobAttempt.objects.get(job_id=job.pk)
    assert attempt.outcome_id == Status.CANCELLED and attempt.error == failed.error
    assert Job.objects.claim("w-next", 1) == []
    held = claimed("w-batch")  # claimed in a batch, asked to cancel, handed back unstarted
    Job.objects.cancel(held.pk, by="bob")
    back = Job.objects.release(held)
    assert back.state == Status.CANCELLED and back.error.startswith("cancelled by bob (attempt 1 was handed back")
    assert Job.objects.claim("w-next", 1) == []
    plain = Job.objects.fail(claimed("w-plain"), "boom", retry_in=0)  # no request: retried as before
    assert plain.state == Status.ERROR


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_handler_failing_right_after_the_cancel_is_not_run_again(settings, tmp_path) -> None:
    # Issue 31, item 3: cancel() while the attempt runs, and the handler raises within
    # CANCEL_CHECK_SECONDS (here 30 s: the slot never looks in time). Was: retried, attempt 2 ran and
    # the job ended Completed.
    from django_sqlqueue import jobtypes
    from django_sqlqueue.models import JobType
    from tests import workerutil as wu

    settings.SQLQUEUE = {**getattr(settings, "SQLQUEUE", {}), "CANCEL_CHECK_SECONDS": 30}
    JobType.objects.update_or_create(name="test.CancelThenFail", defaults={"backoff_base_seconds": 0})
    jobtypes.clear_cache()
    log = wu.JobLog(tmp_path)
    job = Job.objects.enqueue("test.CancelThenFail", {"log": str(log.path)})
    wu.run_worker("inproc-cancel-fail", wait_due=2)
    job = Job.objects.get(pk=job.pk)
    assert log.events(job.pk) == [(1, "run")], "no attempt ran after the cancel"
    assert (job.state, job.attempt_num) == (Status.CANCELLED, 1)
    assert job.error.startswith("cancelled by operator: testing (attempt 1 failed before its worker acted")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_job_taken_over_after_a_cancel_is_cancelled_before_its_handler_starts(tmp_path) -> None:
    # Issue 31, item 3: the request came in and the worker died before acting on it (its lease ran out):
    # the worker that takes the job over cancels it before calling the handler.
    from tests import workerutil as wu

    log = wu.JobLog(tmp_path)
    Job.objects.enqueue("test.CancelThenFail", {"log": str(log.path), "cancel": False})
    (job,) = Job.objects.claim("w-died", 1)
    Job.objects.cancel(job.pk, by="alice", reason="stop it")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=job.lease_expires_at - timedelta(days=1))
    counters = wu.run_worker("inproc-takeover")
    job = Job.objects.get(pk=job.pk)
    assert log.events(job.pk) == [], "the handler was never called"
    assert (job.state, job.attempt_num) == (Status.CANCELLED, 2)
    assert job.error == ("cancelled by alice: stop it (requested during attempt 1, which ended before its worker "
                         "acted on it: attempt 2 was not started)")
    assert counters[3] == 1  # CANCELLED


def test_a_request_does_not_outlive_a_finished_attempt() -> None:
    # Done (Cancelled), then retried by an operator: the retry is a new decision, not cancelled again.
    job = claimed("w-done")
    Job.objects.cancel(job.pk, by="bob")
    ended = Job.objects.modify(job, job.version, Status.CANCELLED, error="cancelled by bob")
    Job.objects.modify(ended, ended.version, Status.PENDING)  # the operator's retry
    again = Job.objects.claim("w-again", 1)[0]
    assert again.attempt_num == 2 and Job.objects.cancel_request_for(job.pk, 2) is None
    assert Job.objects.cancel_request_for(job.pk, 1) is not None  # its own attempt's record stays
