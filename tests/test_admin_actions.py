"""Admin actions: every action, refusals with reasons, the stale-token case, LogEntry, permissions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.utils import timezone

from django_sqlqueue import StaleJob, schedules
from django_sqlqueue.admin.actions import run_transition
from django_sqlqueue.models import Job, JobAttempt
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    change_url,
    changelist_url,
    fast_password_hasher,
    fresh_admin_caches,
    make_job,
    messages_of,
    operator_client,
    post_action,
    token_in_page,
    user_with,
)

pytestmark = pytest.mark.django_db


def status_of(job: Job) -> Status:
    return Job.objects.get(pk=job.pk).state


def log_messages(job: Job) -> list[str]:
    ct = ContentType.objects.get_for_model(Job)
    return list(LogEntry.objects.filter(content_type=ct, object_id=str(job.pk), action_flag=CHANGE)
                .values_list("change_message", flat=True))


def test_retry_now_changes_retryable_jobs_and_refuses_the_rest(admin_client, admin_user) -> None:
    failed, cancelled, paused = make_job(Status.FAILED), make_job(Status.CANCELLED), make_job(Status.PAUSED)
    completed, running = make_job(Status.COMPLETED), make_job(Status.PROCESSING)
    # The database's clock, read before: "now" is the database's (on PostgreSQL the transaction's
    # start, which a loaded machine can leave seconds behind this process's clock).
    before = schedules.db_clock("default")
    response = post_action(admin_client, "retry_now", [failed, cancelled, paused, completed, running])
    assert response.status_code == 200 and response.redirect_chain[0][1] == 302
    for job in (failed, cancelled, paused):
        fresh = Job.objects.get(pk=job.pk)
        assert fresh.state is Status.PENDING
        assert fresh.scheduled_for >= before - timedelta(seconds=2)  # due now (database clock)
        assert fresh.attempt_num < (fresh.max_attempts or 3) or fresh.max_attempts > fresh.attempt_num
    assert status_of(completed) is Status.COMPLETED
    assert status_of(running) is Status.PROCESSING  # never taken from its worker
    text = " ".join(messages_of(response))
    assert "Retry now: 3 jobs changed." in text
    assert "2 refused" in text
    assert f"({completed.pk}): Completed → Pending is not allowed" in text
    assert f"({running.pk}): running" in text and "Mark terminated" in text
    # LogEntry per changed job, with the operator and the transition
    entry = LogEntry.objects.get(object_id=str(failed.pk))
    assert entry.user_id == admin_user.pk and entry.action_flag == CHANGE
    assert entry.change_message == "Retry now: Failed → Pending"
    assert log_messages(completed) == [] and log_messages(running) == []


def test_retry_now_gives_an_exhausted_job_one_more_attempt(admin_client) -> None:
    failed = make_job(Status.FAILED, attempt_num=3)
    post_action(admin_client, "retry_now", [failed])
    fresh = Job.objects.get(pk=failed.pk)
    assert fresh.state is Status.PENDING and fresh.attempt_num == 3 and fresh.max_attempts == 4
    # and a worker can take it
    claimed = Job.objects.claim("w-retry", 5, queues=["default"])
    assert fresh.pk in [j.pk for j in claimed]


def test_retry_at_asks_when_then_schedules(admin_client) -> None:
    error, done = make_job(Status.ERROR), make_job(Status.COMPLETED)
    page = post_action(admin_client, "retry_at", [error, done], follow=False)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="sqlqueue-retry-at-form"' in html and f'name="_token_{error.pk}"' in html
    assert status_of(error) is Status.ERROR  # nothing happens before the form is submitted
    # neither a time nor a delay: the form says so
    bad = post_action(admin_client, "retry_at", [error, done], follow=False, apply="1")
    assert bad.status_code == 200 and "Give either a date and time or a delay" in bad.content.decode()
    # a delay
    before = timezone.now()
    response = post_action(admin_client, "retry_at", [error, done], apply="1", delay="10", unit="minutes")
    fresh = Job.objects.get(pk=error.pk)
    assert fresh.state is Status.PENDING
    assert before + timedelta(minutes=9) < fresh.scheduled_for < before + timedelta(minutes=11)
    text = " ".join(messages_of(response))
    assert "Retry at: 1 job changed." in text and "Completed → Pending is not allowed" in text
    assert log_messages(error)[0].startswith("Retry at: Error → Pending (due ")


def test_retry_at_with_a_date_and_time(admin_client) -> None:
    failed = make_job(Status.FAILED)
    when = (timezone.localtime() + timedelta(days=2)).replace(microsecond=0)
    post_action(admin_client, "retry_at", [failed], apply="1", run_at=when.strftime("%Y-%m-%dT%H:%M:%S"),
                unit="minutes")
    fresh = Job.objects.get(pk=failed.pk)
    assert fresh.state is Status.PENDING and fresh.scheduled_for == when


def test_reset_attempts(admin_client) -> None:
    failed = make_job(Status.FAILED, attempt_num=3)
    later = timezone.now() + timedelta(hours=1)
    error = make_job(Status.ERROR, attempt_num=2, scheduled_for=later)
    pending = make_job(Status.PENDING)
    response = post_action(admin_client, "reset_attempts", [failed, error, pending])
    f, e = Job.objects.get(pk=failed.pk), Job.objects.get(pk=error.pk)
    assert (f.state, f.attempt_num) == (Status.PENDING, 0)
    assert (e.state, e.attempt_num) == (Status.PENDING, 0)
    assert abs((e.scheduled_for - later).total_seconds()) < 0.01  # an Error job keeps its retry time
    assert "already Pending" in " ".join(messages_of(response))  # not "Pending → Pending is not allowed"
    assert log_messages(failed) == ["Reset attempts: Failed → Pending (attempts reset to 0)"]


def test_cancel(admin_client) -> None:
    pending, error, paused = make_job(), make_job(Status.ERROR), make_job(Status.PAUSED)
    running, completed = make_job(Status.PROCESSING), make_job(Status.COMPLETED)
    response = post_action(admin_client, "cancel", [pending, error, paused, running, completed], confirm="yes")
    assert [status_of(j) for j in (pending, error, paused)] == [Status.CANCELLED] * 3
    assert Job.objects.get(pk=pending.pk).finished_at is not None
    assert status_of(running) is Status.PROCESSING and status_of(completed) is Status.COMPLETED
    text = " ".join(messages_of(response))
    assert "Cancel: 3 jobs changed." in text and "Completed → Cancelled is not allowed" in text


def test_pause_and_resume_keep_the_schedule(admin_client) -> None:
    later = timezone.now() + timedelta(hours=2)
    job = make_job(scheduled_for=later)
    completed = make_job(Status.COMPLETED)
    post_action(admin_client, "pause", [job, completed])
    assert status_of(job) is Status.PAUSED
    # a paused job is not claimed, even when due
    Job.objects.filter(pk=job.pk).update(scheduled_for=timezone.now() - timedelta(minutes=1))
    assert job.pk not in [j.pk for j in Job.objects.claim("w-pause", 10)]
    Job.objects.filter(pk=job.pk).update(scheduled_for=later)
    pending = make_job()
    response = post_action(admin_client, "resume", [Job.objects.get(pk=job.pk), pending])
    fresh = Job.objects.get(pk=job.pk)
    assert fresh.state is Status.PENDING and abs((fresh.scheduled_for - later).total_seconds()) < 0.01
    assert "not Paused (Pending)" in " ".join(messages_of(response))
    assert log_messages(job) == ["Resume: Paused → Pending", "Pause: Pending → Paused"]


def test_mark_terminated_stops_a_running_job_and_fences_its_worker(admin_client) -> None:
    running = make_job(Status.PROCESSING)
    pending, completed = make_job(), make_job(Status.COMPLETED)
    response = post_action(admin_client, "mark_terminated", [running, pending, completed], confirm="yes")
    assert status_of(running) is Status.TERMINATED and status_of(pending) is Status.TERMINATED
    assert "Completed → Terminated is not allowed" in " ".join(messages_of(response))
    attempt = JobAttempt.objects.get(job_id=running.pk)
    assert attempt.finished_at is not None and attempt.outcome_id == Status.TERMINATED
    with pytest.raises(StaleJob):  # the worker still holds the old token: its result is refused
        running.complete({"late": True})
    assert status_of(running) is Status.TERMINATED


def test_stale_token_a_worker_changed_the_job_after_the_list_was_shown(admin_client) -> None:
    job = make_job(Status.PENDING, queue="stale")
    page = admin_client.get(changelist_url(queue="stale"))
    seen = token_in_page(page.content.decode(), job)
    assert seen == job.version
    # meanwhile a worker claims it
    claimed = Job.objects.claim("w-meanwhile", 1, queues=["stale"])
    assert [j.pk for j in claimed] == [job.pk]
    response = post_action(admin_client, "cancel", [job], tokens={job.pk: seen}, confirm="yes")
    fresh = Job.objects.get(pk=job.pk)
    assert fresh.state is Status.PROCESSING and fresh.worker == "w-meanwhile"  # not clobbered
    text = " ".join(messages_of(response))
    assert "Cancel: 1 refused" in text and "changed by a worker or another operator" in text
    assert log_messages(job) == []


def test_stale_token_another_operator_retried_first(admin_client) -> None:
    failed = make_job(Status.FAILED)
    seen = failed.version
    Job.objects.modify(failed, seen, Status.PENDING)  # someone else, a moment earlier
    Job.objects.modify(failed.pk, None, Status.PAUSED)
    response = post_action(admin_client, "retry_now", [failed], tokens={failed.pk: seen})
    assert status_of(failed) is Status.PAUSED
    assert "concurrency token is stale" in " ".join(messages_of(response))


def test_select_across_applies_to_the_filtered_list(admin_client) -> None:
    failed = [make_job(Status.FAILED) for _ in range(3)]
    other = make_job(Status.CANCELLED)
    url = changelist_url(status=int(Status.FAILED))
    response = post_action(admin_client, "retry_now", failed[:1], url=url, select_across="1")
    assert all(status_of(j) is Status.PENDING for j in failed)
    assert status_of(other) is Status.CANCELLED
    assert "Retry now: 3 jobs changed." in messages_of(response)


def test_batch_limit_reports_truncation(admin_client, monkeypatch) -> None:
    from django.contrib import admin

    monkeypatch.setattr(admin.site._registry[Job], "action_batch_limit", 2)
    jobs = [make_job(Status.FAILED) for _ in range(3)]
    response = post_action(admin_client, "retry_now", jobs)
    assert sum(status_of(j) is Status.PENDING for j in jobs) == 2
    assert status_of(jobs[0]) is Status.FAILED  # newest first: the oldest waits for the next run
    assert any("stopped after 2 jobs" in m for m in messages_of(response))


def test_buttons_on_the_job_page_come_back_to_it(admin_client) -> None:
    failed = make_job(Status.FAILED)
    html = admin_client.get(change_url(failed)).content.decode()
    assert 'id="sqlqueue-job-actions"' in html
    assert 'value="retry_now"' in html and 'value="cancel"' not in html  # Failed -> Cancelled is not allowed
    response = post_action(admin_client, "retry_now", [failed], follow=False, _sqlqueue_return=str(failed.pk))
    assert response.status_code == 302 and response["Location"] == change_url(failed)
    assert status_of(failed) is Status.PENDING
    # Retry at… from the job page: the form, then back to the job
    error = make_job(Status.ERROR)
    post_action(admin_client, "retry_at", [error], follow=False, _sqlqueue_return=str(error.pk))
    done = post_action(admin_client, "retry_at", [error], follow=False, _sqlqueue_return=str(error.pk),
                       apply="1", delay="1", unit="hours")
    assert done.status_code == 302 and done["Location"] == change_url(error)
    assert status_of(error) is Status.PENDING


# ----- permissions ------------------------------------------------------------------------------------
ALL_ACTIONS = ["retry_now", "retry_at", "reset_attempts", "requeue", "cancel", "pause", "resume", "mark_terminated"]


def offered(client) -> set[str]:
    response = client.get(changelist_url())
    assert response.status_code == 200
    form = response.context["action_form"]
    if form is None:  # no action at all: Django renders no action form
        return set()
    return {name for name, _label in form.fields["action"].choices if name}


@pytest.mark.parametrize(("perms", "expected"), [
    ((), set()),
    (("retry_job",), {"retry_now", "requeue"}),
    (("reschedule_job",), {"retry_at", "reset_attempts"}),
    (("cancel_job",), {"cancel", "mark_terminated"}),
    (("pause_job",), {"pause", "resume"}),
])
def test_actions_are_offered_only_with_their_permission(client, perms, expected) -> None:
    client.force_login(user_with("view_job", *perms))
    assert offered(client) == expected


def test_superuser_sees_every_action_but_no_delete(admin_client) -> None:
    assert offered(admin_client) == set(ALL_ACTIONS)


@pytest.mark.parametrize("action", ALL_ACTIONS)
def test_a_crafted_post_without_the_permission_changes_nothing(client, action) -> None:
    client.force_login(user_with("view_job"))
    jobs = [make_job(s) for s in (Status.FAILED, Status.PENDING, Status.PAUSED, Status.ERROR)]
    before = {j.pk: (j.status_id, j.version) for j in jobs}
    response = post_action(client, action, jobs, apply="1", delay="0", unit="seconds")
    assert response.status_code == 200
    assert {j.pk: (j.status_id, j.version) for j in Job.objects.filter(pk__in=before)} == before
    assert LogEntry.objects.count() == 0
    assert not any("changed" in m for m in messages_of(response))


def test_a_crafted_post_for_another_permissions_action(client) -> None:
    client.force_login(user_with("view_job", "retry_job"))
    pending = make_job()
    response = post_action(client, "cancel", [pending], confirm="yes")
    assert status_of(pending) is Status.PENDING
    assert "No action selected." in messages_of(response)
    failed = make_job(Status.FAILED)
    post_action(client, "retry_now", [failed])
    assert status_of(failed) is Status.PENDING


def test_the_action_checks_the_permission_itself(rf: RequestFactory) -> None:
    """Defence in depth: called directly (not through get_actions), the action still refuses."""
    from django.contrib import admin

    request = rf.post("/")
    request.user = user_with("view_job", username="direct")
    job = make_job(Status.FAILED)
    with pytest.raises(PermissionDenied):
        run_transition(admin.site._registry[Job], request, Job.objects.filter(pk=job.pk), verb="Retry now",
                       permission="retry_job", target=Status.PENDING)
    assert status_of(job) is Status.FAILED


def test_no_edit_no_add_no_delete(admin_client) -> None:
    job = make_job(Status.FAILED, payload={"a": 1})
    html = admin_client.get(change_url(job)).content.decode()
    assert 'name="_save"' not in html  # view only
    response = admin_client.post(change_url(job), {"queue": "hacked", "payload": "{}"})
    assert response.status_code == 403
    fresh = Job.objects.get(pk=job.pk)
    assert fresh.queue == "default" and fresh.payload == {"a": 1}
    assert admin_client.get(changelist_url().replace("/job/", "/job/add/")).status_code == 403
    delete = admin_client.get(change_url(job) + "delete/")
    assert delete.status_code == 403


def test_a_user_without_view_permission_sees_nothing(client) -> None:
    client.force_login(user_with("retry_job", username="noview"))
    job = make_job(Status.FAILED)
    assert client.get(changelist_url()).status_code == 403
    response = post_action(client, "retry_now", [job], follow=False)
    assert response.status_code == 403
    assert status_of(job) is Status.FAILED
