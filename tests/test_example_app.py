"""The notifications example: enqueue with subtype rows in one transaction, Render -> Send -> Confirm."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.tasks import TaskResultStatus, task_backends

from django_sqlqueue import Status
from django_sqlqueue.models import Job, JobAttempt, JobType
from testproject.notifications import jobs
from testproject.notifications.models import EmailChannel, Outbox, ResetPassword, SmsChannel
from testproject.notifications.services import request_password_reset
from testproject.notifications.tasks import send_welcome_email

from .test_tasks_defs import run_one

pytestmark = pytest.mark.django_db


def reset(**kwargs):
    options = {"user_id": 7, "username": "alice", "email": "alice@example.com", "phone": "+44 20 7946 0000"}
    return request_password_reset(**{**options, **kwargs})


def test_reset_enqueues_the_job_and_its_subtype_rows() -> None:
    job = reset()
    assert job.job_type.name == "ResetPassword" and job.queue == "notifications" and job.state is Status.PENDING
    data = ResetPassword.objects.get(job=job)
    assert (data.user_id, data.username, len(data.otp)) == (7, "alice", 6)
    assert EmailChannel.objects.get(job=job).email_to == "alice@example.com"
    assert SmsChannel.objects.get(job=job).phone == "+44 20 7946 0000"


def test_an_invalid_subtype_row_rolls_the_whole_enqueue_back() -> None:
    with pytest.raises(ValidationError):
        reset(phone="not a phone")
    assert not Job.objects.exists()
    assert not ResetPassword.objects.exists() and not EmailChannel.objects.exists()


def test_one_pending_reset_per_user() -> None:
    first = reset()
    again = reset(email="other@example.com")
    assert again.pk == first.pk
    assert EmailChannel.objects.get().email_to == "alice@example.com"


def test_reset_needs_a_channel() -> None:
    with pytest.raises(ValueError, match="needs an e-mail address, a phone number, or both"):
        reset(email=None, phone=None)


def test_render_send_confirm() -> None:
    job = reset()
    done = run_one()
    assert done.pk == job.pk and done.state is Status.COMPLETED and done.step == "Confirm"
    assert set(done.response) == {"Render", "Send", "Confirm"}
    assert done.response["Confirm"] == {"delivered": ["email", "sms"]}
    otp = ResetPassword.objects.get(job=job).otp
    outbox = {o.channel: o for o in Outbox.objects.filter(job_id=job.pk)}
    assert otp in outbox["email"].body and otp in outbox["sms"].body
    assert EmailChannel.objects.get(job=job).response["outbox_id"] == outbox["email"].pk
    assert SmsChannel.objects.get(job=job).response["outbox_id"] == outbox["sms"].pk


def test_a_transient_send_failure_resumes_at_send(monkeypatch) -> None:
    renders = []
    original = jobs.render_reset
    monkeypatch.setattr(jobs, "render_reset", lambda *a: renders.append(1) or original(*a))
    job = reset(fail_send_attempts=1)

    first = run_one("w1")
    assert first.state is Status.ERROR and first.step == "Send" and "SMS gateway unavailable" in first.error
    assert list(Outbox.objects.filter(job_id=job.pk).values_list("channel", flat=True)) == ["email"]
    assert "planned failure 1 of 1" in SmsChannel.objects.get(job=job).error

    second = run_one("w2")
    assert second.state is Status.COMPLETED and second.attempt_num == 2
    assert renders == [1]  # Render ran once: the retry resumed at Send
    assert sorted(Outbox.objects.filter(job_id=job.pk).values_list("channel", flat=True)) == ["email", "sms"]
    assert SmsChannel.objects.get(job=job).error == ""
    assert list(JobAttempt.objects.filter(job=job).values_list("worker", "outcome_id")) == [
        ("w1", Status.ERROR), ("w2", Status.COMPLETED)]


def test_email_only_reset_fails_at_the_mail_relay_then_succeeds() -> None:
    job = reset(phone=None, fail_send_attempts=1)
    assert run_one().state is Status.ERROR
    assert run_one().state is Status.COMPLETED
    assert Outbox.objects.filter(job_id=job.pk).count() == 1


def test_handler_options_reach_the_job_type_rows() -> None:
    # migrate created the rows from the @handler options (an operator may change them later)
    row = JobType.objects.get(name="DeliverWebhook")
    assert row.max_attempts == 2 and row.backoff_base_seconds == 0.5
    assert JobType.objects.get(name="ResetPassword").max_attempts == 4


def test_digest_fails_once_then_succeeds_and_webhook_always_fails() -> None:
    digest = Job.objects.enqueue("SendDigest", {"email": "bob@example.com", "items": 3, "fail_attempts": 1})
    hook = Job.objects.enqueue("DeliverWebhook", {"url": "https://hooks.example.invalid/x"}, priority=-1)
    assert run_one().pk == digest.pk
    assert run_one().pk == digest.pk  # retried at once (retry_in=0 here), before the lower priority hook
    assert Job.objects.get(pk=digest.pk).state is Status.COMPLETED
    run_one()
    last = run_one()
    assert last.pk == hook.pk and last.state is Status.FAILED and "always fails" in last.error
    assert run_one() is None


def test_reset_password_command(capsys) -> None:
    call_command("reset_password", "--user-id", "9", "--username", "carol", "--email", "c@example.com",
                 "--fail-send", "1")
    job = Job.objects.get()
    assert f"enqueued ResetPassword job {job.pk}" in capsys.readouterr().out
    assert job.payload == {"fail_send_attempts": 1}
    with pytest.raises(CommandError, match="needs an e-mail address"):
        call_command("reset_password", "--user-id", "10", "--username", "dan")


def test_welcome_task_runs_on_the_queue(settings) -> None:
    settings.TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend"}}
    result = send_welcome_email.enqueue(5, "eve@example.com")
    run_one()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    outbox = Outbox.objects.get(job_id=int(result.id))
    assert result.return_value == {"outbox_id": outbox.pk, "attempt": 1}
    assert task_backends["default"].get_result(result.id).worker_ids == ["w1"]


def test_outbox_is_in_the_admin() -> None:
    assert Outbox in admin.site._registry
