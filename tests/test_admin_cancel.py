"""The admin's Cancel on a running job: it asks the worker (a CancelRequest), needs its permission, and the
job page shows the request and what became of it."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory

from django_sqlqueue.admin import actions as admin_actions
from django_sqlqueue.models import CancelRequest, Job
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    change_url,
    fast_password_hasher,
    fresh_admin_caches,
    make_job,
    messages_of,
    post_action,
    user_with,
)

pytestmark = pytest.mark.django_db


def test_cancel_of_a_running_job_asks_its_worker_and_the_page_follows_it(admin_client, admin_user) -> None:
    running, pending = make_job(Status.PROCESSING), make_job()
    page = admin_client.get(change_url(running)).content.decode()
    assert 'value="cancel"' in page  # the job page offers Cancel for a running job
    response = post_action(admin_client, "cancel", [running, pending], confirm="yes")
    fresh = Job.objects.get(pk=running.pk)
    assert (fresh.state, fresh.version) == (Status.PROCESSING, running.version)  # the worker's token holds
    request = CancelRequest.objects.get(job=running)
    assert (request.attempt_num, request.requested_by, request.reason) == (
        1, f"operator {admin_user.username}", "cancelled in the admin")
    assert Job.objects.get(pk=pending.pk).state == Status.CANCELLED
    text = " ".join(messages_of(response))
    assert "Cancel: 1 running job: its worker was asked to stop it" in text
    assert "Cancel: 1 job changed." in text
    page = admin_client.get(change_url(running)).content.decode()
    assert "cancelled in the admin" in page and "waiting for its worker to stop it" in page
    # The handler returned first: the job completes, and the page says the cancel came too late.
    Job.objects.complete(fresh)
    page = admin_client.get(change_url(running)).content.decode()
    assert "too late: the attempt ended Completed first" in page
    # A cancel of the finished job is refused with the reason.
    response = post_action(admin_client, "cancel", [Job.objects.get(pk=running.pk)], confirm="yes")
    assert "Completed → Cancelled is not allowed" in " ".join(messages_of(response))


def test_cancel_of_a_running_job_needs_the_cancel_permission(client, rf: RequestFactory) -> None:
    running = make_job(Status.PROCESSING)
    client.force_login(user_with("view_job", "retry_job", "pause_job"))
    response = post_action(client, "cancel", [running], confirm="yes")
    assert "No action selected." in messages_of(response)
    assert not CancelRequest.objects.exists()
    # Called directly (a crafted request past the action list), the action refuses too.
    from django.contrib import admin

    request = rf.post("/", {"confirm": "yes"})
    request.user = user_with("view_job", username="direct")
    with pytest.raises(PermissionDenied):
        admin_actions.cancel(admin.site._registry[Job], request, Job.objects.filter(pk=running.pk))
    assert not CancelRequest.objects.exists()
    assert Job.objects.get(pk=running.pk).state == Status.PROCESSING
    # With it, the same POST asks the worker.
    client.force_login(user_with("view_job", "cancel_job", username="canceller"))
    post_action(client, "cancel", [running], confirm="yes")
    assert CancelRequest.objects.get(job=running).requested_by == "operator canceller"


def test_a_stale_token_is_refused_for_a_running_job_too(admin_client) -> None:
    running = make_job(Status.PROCESSING)
    response = post_action(admin_client, "cancel", [running], tokens={running.pk: running.version - 1},
                           confirm="yes")
    assert "concurrency token is stale" in " ".join(messages_of(response))
    assert not CancelRequest.objects.exists()


def test_the_job_page_says_a_request_the_attempt_failed_under_cancelled_the_job(admin_client) -> None:
    # The handler failed before its worker acted on the request: the failure's write cancels the job
    # instead of retrying it (issue 31, queue/modify.py); the page says the request was done, not "too late".
    running = make_job(Status.PROCESSING)
    post_action(admin_client, "cancel", [running], confirm="yes")
    failed = Job.objects.fail(Job.objects.get(pk=running.pk), "boom", retry_in=0)
    assert failed.state == Status.CANCELLED
    page = admin_client.get(change_url(running)).content.decode()
    assert "done: the attempt was cancelled" in page
    assert "too late" not in page
