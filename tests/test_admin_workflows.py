"""Admin for workflows: the job page's waits-for / waited-by / batch, the batch pages, the retry of a
failed member, queue_why on a waiting job."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_sqlqueue import Status, enqueue
from django_sqlqueue.models import Batch, Job
from django_sqlqueue.workflows import batch
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    change_url,
    fast_password_hasher,
    fresh_admin_caches,
    messages_of,
    post_action,
    user_with,
)

pytestmark = pytest.mark.django_db


def run(job: Job, status: Status = Status.COMPLETED) -> Job:
    claimed = next(j for j in Job.objects.claim("w/0", 10) if j.pk == job.pk)
    return Job.objects.modify(claimed, claimed.version, status, error="boom" if status != Status.COMPLETED else None)


def test_the_job_page_shows_what_a_job_waits_for_and_what_waits_for_it(admin_client, noop_type,
                                                                         django_capture_on_commit_callbacks) -> None:
    a, b = enqueue("Noop"), enqueue("Noop")
    c = enqueue("Noop", after=[a, (b, "run")])
    page = admin_client.get(change_url(c)).content.decode()
    assert f'href="{change_url(a)}"' in page and f'href="{change_url(b)}"' in page
    assert "runs anyway if it fails" in page
    assert f"waits for job {a.pk} (Pending)" in page  # the diagnosis
    page_a = admin_client.get(change_url(a)).content.decode()
    assert f'href="{change_url(c)}"' in page_a and "Waited for by" in page_a
    # A Waiting job is not offered Retry (its dependencies release it), but Cancel.
    assert 'id="sqlqueue-job-actions"' in page
    assert 'value="retry_now"' not in page and 'value="cancel"' in page
    with django_capture_on_commit_callbacks(execute=True):
        run(a)
    assert Job.objects.get(pk=c.pk).state is Status.WAITING  # b (claimed with a) is still running
    page = admin_client.get(change_url(c)).content.decode()
    assert f"waits for job {b.pk} (Processing on w/0)" in page and f"waits for job {a.pk}" not in page


def test_retry_of_a_waiting_job_is_refused_with_the_reason(admin_client, noop_type) -> None:
    a = enqueue("Noop")
    c = enqueue("Noop", after=[a])
    response = post_action(admin_client, "retry_now", [c])
    assert Job.objects.get(pk=c.pk).state is Status.WAITING
    assert "waiting for other jobs" in " ".join(messages_of(response))
    post_action(admin_client, "cancel", [c], confirm="yes")
    assert Job.objects.get(pk=c.pk).state is Status.CANCELLED


def test_the_batch_pages_show_members_counts_and_callbacks_and_a_failed_member_can_be_retried(
        admin_client, make_type, django_capture_on_commit_callbacks) -> None:
    make_type("Member")
    make_type("Callback")
    with django_capture_on_commit_callbacks(execute=True), batch(
            on_success="Callback", on_failure="Callback", description="invoices") as b:
        m1, m2 = b.enqueue("Member"), b.enqueue("Member")
    listing = admin_client.get(reverse("admin:django_sqlqueue_batch_changelist")).content.decode()
    assert "invoices" in listing and "sqlqueue-badge sqlqueue-pending" in listing
    with django_capture_on_commit_callbacks(execute=True):
        run(m1, Status.FAILED)
        run(m2)
    row = Batch.objects.get(pk=b.pk)
    assert row.finished_at is not None and row.succeeded is False and len(row.callback_ids) == 1
    page = admin_client.get(reverse("admin:django_sqlqueue_batch_change", args=[b.pk])).content.decode()
    for job_id in (m1.pk, m2.pk, row.callback_ids[0]):
        assert f'href="{change_url(Job.objects.get(pk=job_id))}"' in page
    assert "sqlqueue-badge sqlqueue-failed" in page and "some member did not complete" in page
    member_page = admin_client.get(change_url(m1)).content.decode()
    assert reverse("admin:django_sqlqueue_batch_change", args=[b.pk]) in member_page
    # Retrying the failed member works: it runs again; the batch, already finished, does not fire again.
    post_action(admin_client, "retry_now", [Job.objects.get(pk=m1.pk)])
    assert Job.objects.get(pk=m1.pk).state is Status.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        run(m1)
    assert Job.objects.get(pk=m1.pk).state is Status.COMPLETED
    assert Batch.objects.get(pk=b.pk).callback_ids == row.callback_ids


def test_the_batch_page_shows_progress_and_leads_to_its_failed_members_for_a_retry(
        admin_client, make_type, django_capture_on_commit_callbacks) -> None:
    make_type("Member")
    with django_capture_on_commit_callbacks(execute=True), batch(description="exports") as b:
        members = [b.enqueue("Member") for _ in range(4)]
    with django_capture_on_commit_callbacks(execute=True):
        run(members[0], Status.FAILED)
        run(members[1], Status.FAILED)
        run(members[2])
    outside = enqueue("Member")  # not a member: never listed with them
    url = reverse("admin:django_sqlqueue_batch_change", args=[b.pk])
    page = admin_client.get(url).content.decode()
    assert '<progress class="sqlqueue-progress" max="4" value="3">' in page
    assert "3 of 4 members finished (75%)" in page
    link = f"{reverse('admin:django_sqlqueue_job_changelist')}?batch={b.pk}&amp;status={int(Status.FAILED)}"
    assert f'href="{link}"' in page and "2 Failed members" in page
    listing = admin_client.get(link.replace("&amp;", "&"))
    assert sorted(j.pk for j in listing.context["cl"].result_list) == [members[0].pk, members[1].pk]
    assert f"Batch #{b.pk}" in listing.content.decode()  # the filter shows what it is filtered on
    failed = [Job.objects.get(pk=m.pk) for m in members[:2]]  # their tokens as the list shows them
    post_action(admin_client, "retry_now", failed, url=link.replace("&amp;", "&"))
    assert {Job.objects.get(pk=m.pk).state for m in members[:2]} == {Status.PENDING}
    assert Job.objects.get(pk=outside.pk).state is Status.PENDING and outside.attempt_num == 0
    page = admin_client.get(url).content.decode()
    assert "1 of 4 members finished (25%)" in page and "sqlqueue-retry-failed" not in page
    assert admin_client.get(reverse("admin:django_sqlqueue_job_changelist"), {"batch": "abc"}).status_code == 400


def test_batches_are_read_only_in_the_admin(client, make_type) -> None:
    viewer = user_with("view_batch")
    client.force_login(viewer)
    with batch() as b:
        pass
    assert client.get(reverse("admin:django_sqlqueue_batch_change", args=[b.pk])).status_code == 200
    assert client.post(reverse("admin:django_sqlqueue_batch_delete", args=[b.pk])).status_code == 403
    assert client.get(reverse("admin:django_sqlqueue_batch_add")).status_code == 403


def test_queue_why_explains_a_waiting_job(noop_type) -> None:
    a, b = enqueue("Noop"), enqueue("Noop")
    (claimed,) = [j for j in Job.objects.claim("host-a/2", 1) if j.pk == a.pk]
    c = enqueue("Noop", after=[a, b])
    out = StringIO()
    call_command("queue_why", str(c.pk), stdout=out)
    text = out.getvalue()
    assert f"waits for job {a.pk} (Processing on host-a/2)" in text
    assert f"waits for job {b.pk} (Pending)" in text


# ----- a one-off job from the admin (issue 27) ---------------------------------------------------------------
def test_an_operator_with_the_permission_enqueues_a_one_off_job_and_it_is_logged(client, make_type) -> None:
    from django.contrib.admin.models import ADDITION, LogEntry

    make_type("Export")
    url = reverse("admin:django_sqlqueue_enqueue")
    client.force_login(user_with("view_job", username="viewer"))
    assert client.get(url).status_code == 403
    assert client.post(url, {"job_type": "Export", "queue": "default", "priority": "0", "payload": "{}"}).status_code == 403
    assert 'href="' + url not in client.get(reverse("admin:django_sqlqueue_job_changelist")).content.decode()
    assert not Job.objects.exists()
    client.force_login(user_with("view_job", "enqueue_job", username="oncall"))
    assert 'href="' + url in client.get(reverse("admin:django_sqlqueue_job_changelist")).content.decode()
    response = client.post(url, {"job_type": "Export", "queue": "exports", "priority": "5", "delay": "60",
                                 "dedupe_key": "acme-2026-11", "payload": '{"customer": "acme", "n": 3}'},
                           follow=True)
    job = Job.objects.get()
    assert (job.job_type.name, job.queue, job.priority, job.payload, job.dedupe_key) == (
        "Export", "exports", 5, {"customer": "acme", "n": 3}, "acme-2026-11")
    assert job.state is Status.PENDING and job.scheduled_for > job.enqueued_at
    assert response.redirect_chain[-1][0] == change_url(job)
    entry = LogEntry.objects.get(object_id=str(job.pk), action_flag=ADDITION)
    assert entry.user.username == "oncall" and entry.change_message == "Enqueued from the admin"
    # The same key again: the unfinished job is kept and nothing new is written.
    response = client.post(url, {"job_type": "Export", "queue": "exports", "priority": "0",
                                 "dedupe_key": "acme-2026-11", "payload": "{}"}, follow=True)
    assert Job.objects.count() == 1 and any("Nothing enqueued" in m for m in messages_of(response))


@pytest.mark.parametrize("payload, error", [
    ("{not json", "Not JSON"),
    ('{"n": NaN}', "payload"),
    ('{"a": "\\u0000"}', "payload"),
])
def test_a_bad_payload_or_queue_is_refused_with_the_reason_and_writes_nothing(client, make_type, payload,
                                                                              error) -> None:
    make_type("Export")
    client.force_login(user_with("view_job", "enqueue_job", username="oncall"))
    response = client.post(reverse("admin:django_sqlqueue_enqueue"),
                           {"job_type": "Export", "queue": "default", "priority": "0", "payload": payload})
    assert response.status_code == 200 and error in response.content.decode()
    response = client.post(reverse("admin:django_sqlqueue_enqueue"),
                           {"job_type": "Nope", "queue": "default", "priority": "0", "payload": "{}"})
    assert "Nope is not one of the available choices" in response.content.decode()
    assert not Job.objects.exists()


# ----- retry with an edited payload (issue 27) ------------------------------------------------------------
def failed_job(type_name: str = "Export", payload: Any = None) -> Job:
    job = enqueue(type_name, payload if payload is not None else {"to": "a@exampel.com", "n": 1})
    return run(job, Status.FAILED)


def test_retry_with_an_edited_payload_from_the_job_page(client, make_type) -> None:
    from django.contrib.admin.models import CHANGE, LogEntry

    make_type("Export")
    job = failed_job()
    client.force_login(user_with("view_job", "retry_job", username="fixer"))
    page = client.get(change_url(job)).content.decode()
    url = reverse("admin:django_sqlqueue_job_edited_retry", args=[job.pk])
    assert f'href="{url}"' in page
    form = client.get(url).content.decode()
    assert "a@exampel.com" in form and f'name="token" value="{job.version}"' in form
    response = client.post(url, {"payload": '{"to": "a@example.com", "n": 1}', "token": str(job.version)},
                           follow=True)
    fresh = Job.objects.get(pk=job.pk)
    assert fresh.state is Status.PENDING and fresh.payload == {"to": "a@example.com", "n": 1}
    assert response.redirect_chain[-1][0] == change_url(job)
    entry = LogEntry.objects.get(object_id=str(job.pk), action_flag=CHANGE)
    assert entry.user.username == "fixer" and entry.change_message == "Retried with an edited payload (changed: to)"
    assert "Retried with an edited payload (changed: to)" in response.content.decode()  # the job's history
    # The form read at the old token: refused now, nothing written.
    response = client.post(url, {"payload": '{"to": "b@example.com"}', "token": str(job.version)})
    assert Job.objects.get(pk=job.pk).payload == {"to": "a@example.com", "n": 1}
    assert response.status_code in (200, 302)


def test_an_edited_retry_refuses_bad_input_stale_tokens_and_users_without_the_permissions(client, make_type,
                                                                                           monkeypatch) -> None:
    from django_sqlqueue import sensitive

    make_type("Export")
    job = failed_job()
    url = reverse("admin:django_sqlqueue_job_edited_retry", args=[job.pk])
    client.force_login(user_with("view_job", username="viewer"))
    assert client.get(url).status_code == 403
    assert client.post(url, {"payload": "{}", "token": str(job.version)}).status_code == 403
    client.force_login(user_with("view_job", "retry_job", username="fixer"))
    for payload, error in (("{oops", "Not JSON"), ('{"a": "\\u0000"}', "payload cannot be stored")):
        response = client.post(url, {"payload": payload, "token": str(job.version)})
        assert response.status_code == 200 and error in response.content.decode(), payload
    response = client.post(url, {"payload": "{}", "token": str(job.version + 5)})
    assert "stale" in response.content.decode()
    assert Job.objects.get(pk=job.pk).state is Status.FAILED  # nothing was written
    # A type with keys marked sensitive: the form would show them in clear; refused without the permission.
    monkeypatch.setattr(sensitive, "_keys", {})
    sensitive.mark_sensitive("Export", "to")
    assert client.get(url).status_code == 403
    assert f'href="{url}"' not in client.get(change_url(job)).content.decode()
    client.force_login(user_with("view_job", "retry_job", "view_sensitive_job", username="trusted"))
    assert client.get(url).status_code == 200


def test_retry_with_payload_derives_the_concurrency_key_again(make_type) -> None:
    job = failed_job("test.LimitedKeyed", {"customer": "acme", "seconds": 0})
    assert Job.objects.get(pk=job.pk).concurrency_key == "acme"
    retried = Job.objects.retry_with_payload(job.pk, None, {"customer": "globex", "seconds": 0})
    fresh = Job.objects.get(pk=job.pk)
    assert (fresh.state, fresh.concurrency_key, fresh.payload["customer"]) == (Status.PENDING, "globex", "globex")
    assert retried.concurrency_key == "globex" and retried.version == fresh.version
