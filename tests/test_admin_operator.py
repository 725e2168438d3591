"""Issue 18, the operator's view round 2: true answers about stuck work, through the Django test client.

Each test here failed before its fix (bugs 1-9 of the issue) or covers a new screen (orphans, due
work nobody serves, failure triage, throughput, metrics).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    TYPE_NAME,
    change_url,
    changelist_url,
    fast_password_hasher,
    fresh_admin_caches,
    make_job,
    make_worker,
    messages_of,
    post_action,
    user_with,
)

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_sqlqueue_dashboard"


def diagnosis(client, job: Job) -> str:
    html = client.get(change_url(job)).content.decode()
    start = html.index("field-diagnosis")
    return html[start:start + 1200]


# ----- 1: which workers serve the job's queue and type ----------------------------------------------
def test_diagnosis_counts_only_workers_serving_the_queue_and_type(admin_client) -> None:
    job = make_job(queue="reports")
    make_worker("w-emails", queues=["emails"])
    make_worker("w-other-type", queues=["reports"], types=["SomethingElse"])
    text = diagnosis(admin_client, job)
    assert "none of the 2 live worker(s) serves queue reports" in text
    make_worker("w-all")  # empty lists: serves every queue and type
    make_worker("w-reports", queues=["reports"], types=[TYPE_NAME])
    assert "waiting for one of 2 live worker(s) serving queue reports" in diagnosis(admin_client, job)


def test_lease_expired_job_in_an_unserved_queue_is_not_promised_a_takeover(admin_client) -> None:
    job = make_job(Status.PROCESSING, queue="reports", worker="w-crashed")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=3))
    make_worker("w-emails", queues=["emails"])
    text = diagnosis(admin_client, job)
    assert "Lease expired" in text and "the next claim takes it over" not in text
    assert "No live worker serves queue reports" in text
    make_worker("w-reports", queues=["reports"])
    assert "The next claim by one of 1 live worker(s) serving queue reports takes it over" in diagnosis(
        admin_client, job)


# ----- 2: a stopped worker's job is not "Running on" ------------------------------------------------
def test_job_of_a_stopped_worker_is_said_orphaned(admin_client) -> None:
    job = make_job(Status.PROCESSING, worker="web-1/6")
    make_worker("web-1/6", stopped=True)
    text = diagnosis(admin_client, job)
    assert "Running on" not in text and "Orphaned: worker web-1/6 stopped" in text


def test_worker_list_warns_of_a_stopped_worker_holding_jobs(admin_client) -> None:
    make_job(Status.PROCESSING, worker="web-1/6")
    make_worker("web-1/6", stopped=True)
    html = admin_client.get(reverse("admin:django_sqlqueue_worker_changelist")).content.decode()
    assert "1 orphaned" in html and "sqlqueue-badge sqlqueue-failed" in html


# ----- 3: every worker counted, stale ones listed first ----------------------------------------------
def test_dashboard_counts_all_workers_and_lists_stale_ones_first(admin_client) -> None:
    for i in range(72):
        make_worker(f"live-{i:02d}")
    for i in range(3):
        make_worker(f"stale-{i}", heartbeat_age=3600)
    ctx = admin_client.get(reverse(DASHBOARD)).context
    assert ctx["active_workers"] == 72 and ctx["stale_workers"] == 3
    names = [w["worker"].name for w in ctx["workers"]]
    assert names[:3] == ["stale-0", "stale-1", "stale-2"]


# ----- 4: an absurd delay is a form error, not a 500 -------------------------------------------------
@pytest.mark.parametrize("delay", ["5000000", "99999999999999999999"])
def test_retry_at_with_a_huge_delay_is_a_form_error(admin_client, delay) -> None:
    job = make_job(Status.FAILED)
    response = post_action(admin_client, "retry_at", [job], follow=False, apply="1", delay=delay, unit="days")
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()
    assert Job.objects.get(pk=job.pk).state is Status.FAILED


# ----- 5: no promise of a retry the admin does not offer; confirm before cancelling or terminating ---
@pytest.mark.parametrize("status", [Status.COMPLETED, Status.TERMINATED])
def test_final_jobs_are_not_promised_a_retry(admin_client, status) -> None:
    text = diagnosis(admin_client, make_job(status))
    assert "retry" not in text.lower() and "for good" in text


def test_failed_job_is_promised_the_retry_it_is_offered(admin_client) -> None:
    job = make_job(Status.FAILED)
    html = admin_client.get(change_url(job)).content.decode()
    assert "only an operator&#x27;s retry runs it again" in html and 'value="retry_now"' in html


@pytest.mark.parametrize("action", ["cancel", "mark_terminated"])
def test_cancel_and_terminate_ask_for_confirmation(admin_client, action) -> None:
    job = make_job()
    page = post_action(admin_client, action, [job], follow=False)
    assert page.status_code == 200 and Job.objects.get(pk=job.pk).state is Status.PENDING
    html = page.content.decode()
    assert "1 job" in html and 'name="confirm"' in html
    if action == "mark_terminated":
        assert "cannot be undone" in html
    # the page's own form: the carried fields, no "index" (Django's intermediate-page branch)
    import re as _re

    form = html[html.index('id="sqlqueue-confirm-form"'):]
    fields: dict[str, list[str]] = {}
    for name, value in _re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form):
        fields.setdefault(name, []).append(value)
    assert "index" not in fields and fields["confirm"] == ["yes"] and fields["action"] == [action]
    admin_client.post(changelist_url(), fields)
    assert Job.objects.get(pk=job.pk).state in (Status.CANCELLED, Status.TERMINATED)


# ----- 6: a job is named by its type and id ----------------------------------------------------------
def test_job_is_named_by_type_and_id(admin_client) -> None:
    job = make_job(Status.FAILED)
    html = admin_client.get(change_url(job)).content.decode()
    assert f"{TYPE_NAME} #{job.pk}" in html and f"{job.job_type_id}#{job.pk}" not in html
    post_action(admin_client, "retry_now", [job])
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.object_repr in (f"{TYPE_NAME} #{job.pk}", f"Job #{job.pk}")


# ----- 7: Django 6 breadcrumbs on our own pages --------------------------------------------------------
def test_own_pages_use_the_current_breadcrumbs_markup(admin_client) -> None:
    job = make_job(Status.FAILED)
    pages = [admin_client.get(reverse(DASHBOARD)),
             post_action(admin_client, "retry_at", [job], follow=False)]
    for page in pages:
        html = page.content.decode()
        assert '<ol class="breadcrumbs">' in html and '<div class="breadcrumbs">' not in html


# ----- 8: sensitive payload keys and subtype fields are masked for who may not see them ---------------
def reset_job(client_code: str = "481516") -> Job:
    from testproject.notifications.models import EmailChannel, ResetPassword

    JobType.objects.get_or_create(name="ResetPassword")
    job = Job.objects.enqueue("ResetPassword", {"note": "hi"}, subtypes=[
        ResetPassword(user_id=7, username="bob", otp=client_code), EmailChannel(email_to="bob@example.com")])
    Job.objects.filter(pk=job.pk).update(response={"Render": {"email": {
        "to": "bob@example.com", "body": f"your code is {client_code}"}}})
    return job


def test_view_only_staff_do_not_see_the_reset_code(client) -> None:
    job = reset_job()
    client.force_login(user_with("view_job", username="viewer"))
    html = client.get(change_url(job)).content.decode()
    assert "481516" not in html
    assert "bob@example.com" in html and "••••••" in html  # the rest shows; the code is masked
    assert "otp" in html and "Can view sensitive job data" in html  # says what is withheld


def test_sensitive_permission_shows_the_data(client) -> None:
    job = reset_job()
    client.force_login(user_with("view_job", "view_sensitive_job", username="trusted"))
    html = client.get(change_url(job)).content.decode()
    assert html.count("481516") >= 2  # the subtype row and the response


def test_example_outbox_body_is_masked_too(client) -> None:
    from testproject.notifications.models import Outbox

    row = Outbox.objects.create(job_id=1, channel="sms", recipient="+4412345678", body="Code 271828")
    user = user_with("view_job", username="viewer2")
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_outbox"))
    client.force_login(user)
    html = client.get(reverse("admin:notifications_outbox_change", args=[row.pk])).content.decode()
    assert "+4412345678" in html and "271828" not in html


def test_mask_is_bounded_and_leaves_the_rest() -> None:
    from django_sqlqueue.sensitive import MASK, mask

    assert mask({"a": {"otp": 1, "b": [{"otp": 2}]}, "c": 3}, {"otp"}) == {
        "a": {"otp": MASK, "b": [{"otp": MASK}]}, "c": 3}
    deep: object = "x"
    for _ in range(2000):
        deep = {"k": deep}
    assert "otp" not in str(mask(deep, {"otp"}))[:50]  # no RecursionError


# ----- 9: deleting a job type with jobs is refused up front, with the real reason -------------------
def test_deleting_a_job_type_with_jobs_names_the_jobs_not_a_permission(admin_client) -> None:
    job = make_job()
    url = reverse("admin:django_sqlqueue_jobtype_delete", args=[job.job_type_id])
    html = admin_client.get(url).content.decode()
    assert "a job type with jobs cannot be deleted" in html and "1 job(s)" in html
    assert "permission to delete" not in html
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 200 and JobType.objects.filter(pk=job.job_type_id).exists()
    # the bulk action says the same
    html = admin_client.post(reverse("admin:django_sqlqueue_jobtype_changelist"), {
        "action": "delete_selected", "_selected_action": [str(job.job_type_id)]}).content.decode()
    assert "a job type with jobs cannot be deleted" in html and "permission to delete" not in html


def test_a_job_type_without_jobs_can_be_deleted(admin_client) -> None:
    jt = JobType.objects.create(name="Unused")
    admin_client.post(reverse("admin:django_sqlqueue_jobtype_delete", args=[jt.pk]), {"post": "yes"})
    assert not JobType.objects.filter(pk=jt.pk).exists()


# ----- 13: orphans flagged on the list and the dashboard; Requeue, permission-checked --------------
def orphan_set() -> tuple[Job, Job, Job]:
    stopped = make_job(Status.PROCESSING, worker="w-stopped")
    make_worker("w-stopped", stopped=True)
    expired = make_job(Status.PROCESSING, worker="w-nowhere")
    Job.objects.filter(pk=expired.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))
    healthy = make_job(Status.PROCESSING, worker="w-alive")
    make_worker("w-alive")
    return stopped, expired, healthy


def test_orphans_are_flagged_on_the_list_and_the_dashboard(admin_client) -> None:
    stopped, expired, healthy = orphan_set()
    listed = admin_client.get(changelist_url(orphaned=1))
    ids = {j.pk for j in listed.context["cl"].result_list}
    assert ids == {stopped.pk, expired.pk}
    html = admin_client.get(changelist_url()).content.decode()
    assert html.count(">orphaned</span>") == 2
    assert admin_client.get(reverse(DASHBOARD)).context["orphaned"] == 2


def test_requeue_hands_orphans_back_and_refuses_a_live_workers_job(admin_client) -> None:
    stopped, expired, healthy = orphan_set()
    response = post_action(admin_client, "requeue", [stopped, expired, healthy])
    assert Job.objects.get(pk=stopped.pk).state is Status.PENDING
    assert Job.objects.get(pk=expired.pk).state is Status.PENDING
    assert Job.objects.get(pk=healthy.pk).state is Status.PROCESSING
    text = " ".join(messages_of(response))
    assert "Requeue: 2 jobs changed." in text and "not orphaned" in text
    fresh = Job.objects.get(pk=stopped.pk)
    assert fresh.worker == "" and fresh.lease_expires_at is None
    # the history says who requeued it
    attempt = fresh.attempts.order_by("-id").first()
    assert "requeued by operator admin" in attempt.error
    # a worker can take it again
    assert stopped.pk in [j.pk for j in Job.objects.claim("w-new", 5, queues=["default"])]


def test_requeue_needs_the_retry_permission(client) -> None:
    stopped, _, _ = orphan_set()
    client.force_login(user_with("view_job", "cancel_job", username="no-retry"))
    response = post_action(client, "requeue", [stopped], follow=False)
    assert response.status_code in (200, 302, 403)
    assert Job.objects.get(pk=stopped.pk).state is Status.PROCESSING


def test_job_page_offers_requeue_only_to_an_orphan(admin_client) -> None:
    stopped, _, healthy = orphan_set()
    assert 'value="requeue"' in admin_client.get(change_url(stopped)).content.decode()
    assert 'value="requeue"' not in admin_client.get(change_url(healthy)).content.decode()


# ----- 14: due work no live worker serves, on the dashboard ------------------------------------------
def test_dashboard_lists_due_work_no_live_worker_serves(admin_client) -> None:
    JobType.objects.create(name="Other")
    make_job(queue="reports")
    make_job(queue="reports")
    make_job(queue="emails")
    Job.objects.enqueue("Other", {}, queue="emails")
    make_job(queue="later", scheduled_for=timezone.now() + timedelta(hours=1))  # not due: not listed
    JobType.objects.create(name="Held", paused=True)
    Job.objects.enqueue("Held", {}, queue="nobody")  # paused type: nobody is meant to run it
    make_worker("w-emails", queues=["emails"], types=[TYPE_NAME])
    make_worker("w-dead-reports", queues=["reports"], heartbeat_age=3600)  # stale: does not count
    response = admin_client.get(reverse(DASHBOARD))
    got = {(u["queue"], u["type"], u["jobs"]) for u in response.context["unserved"]}
    assert got == {("reports", TYPE_NAME, 2), ("emails", "Other", 1)}
    html = response.content.decode()
    assert 'id="sqlqueue-unserved"' in html and "sqlqueue-alert" in html
    make_worker("w-all")
    assert admin_client.get(reverse(DASHBOARD)).context["unserved"] == []


# ----- 12: failure triage ------------------------------------------------------------------------------
FAILURES = "admin:django_sqlqueue_failures"


def failing_jobs() -> dict[str, list[Job]]:
    smtp = [make_job(Status.FAILED, error=f"Traceback (most recent call last):\n  File \"x\"\n"
                                          f"smtplib.SMTPError: 554 rejected {i}") for i in range(3)]
    smtp.append(make_job(Status.ERROR, error="Traceback\nsmtplib.SMTPError: 421 try later"))
    timeout = [make_job(Status.FAILED, error="Traceback\nTimeoutError")]
    return {"smtp": smtp, "timeout": timeout}


def test_failures_are_grouped_by_type_and_exception_class(admin_client) -> None:
    failing_jobs()
    make_job(Status.COMPLETED)
    response = admin_client.get(reverse(FAILURES))
    groups = {(g.type_name, g.exc): (g.failed, g.error) for g in response.context["groups"]}
    assert groups == {(TYPE_NAME, "SMTPError"): (3, 1), (TYPE_NAME, "TimeoutError"): (1, 0)}
    html = response.content.decode()
    assert "SMTPError: 421 try later" in html and "smtplib.SMTPError" not in html  # newest example
    assert "Retry all" in html and "Discard all" in html


def test_retry_all_asks_with_the_count_then_retries_the_group_only(admin_client) -> None:
    jobs = failing_jobs()
    key = next(g.key for g in admin_client.get(reverse(FAILURES)).context["groups"] if g.exc == "SMTPError")
    page = admin_client.post(reverse(FAILURES), {"group": key, "op": "retry"})
    assert page.status_code == 200 and "4 jobs of AdminTest failing with SMTPError" in page.content.decode()
    assert all(Job.objects.get(pk=j.pk).state in (Status.FAILED, Status.ERROR) for j in jobs["smtp"])
    admin_client.post(reverse(FAILURES), {"group": key, "op": "retry", "confirm": "yes"})
    assert all(Job.objects.get(pk=j.pk).state is Status.PENDING for j in jobs["smtp"])
    assert Job.objects.get(pk=jobs["timeout"][0].pk).state is Status.FAILED


def test_discard_all_cancels_errors_and_deletes_failed_jobs(admin_client) -> None:
    jobs = failing_jobs()
    key = next(g.key for g in admin_client.get(reverse(FAILURES)).context["groups"] if g.exc == "SMTPError")
    html = admin_client.post(reverse(FAILURES), {"group": key, "op": "discard"}).content.decode()
    assert "cannot be undone" in html
    admin_client.post(reverse(FAILURES), {"group": key, "op": "discard", "confirm": "yes"})
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs["smtp"][:3]]).exists()
    assert Job.objects.get(pk=jobs["smtp"][3].pk).state is Status.CANCELLED
    assert Job.objects.filter(pk=jobs["timeout"][0].pk).exists()


def test_group_actions_need_their_permissions(client) -> None:
    failing_jobs()
    client.force_login(user_with("view_job", username="viewer3"))
    html = client.get(reverse(FAILURES)).content.decode()
    assert "SMTPError" in html and "Retry all" not in html
    from django_sqlqueue.admin.triage import failure_groups

    key = next(g.key for g in failure_groups(Job)[0] if g.exc == "SMTPError")
    assert client.post(reverse(FAILURES), {"group": key, "op": "retry", "confirm": "yes"}).status_code == 403
    assert Job.objects.filter(status_id=Status.PENDING).count() == 0


@pytest.mark.parametrize(("error", "cls", "message"), [
    ("Traceback\nsmtplib.SMTPError: 554 no", "SMTPError", "SMTPError: 554 no"),
    ("ValueError", "ValueError", "ValueError"),
    ("cannot reach host: name does not resolve", "", "cannot reach host: name does not resolve"),
    ("", "", ""),
])
def test_exception_class_and_message(error, cls, message) -> None:
    from django_sqlqueue.admin.triage import error_message, exception_class

    assert exception_class(error) == cls and error_message(error) == message


# ----- 16/17: the list and the wording -----------------------------------------------------------------
def test_list_shows_the_error_message_without_the_module_path(admin_client) -> None:
    make_job(Status.FAILED, error="Traceback (most recent call last):\n  File \"x\"\nsmtplib.SMTPError: 554 no")
    html = admin_client.get(changelist_url()).content.decode()
    assert ">SMTPError: 554 no<" in html


def test_times_carry_their_zone_and_one_format(admin_client) -> None:
    job = make_job(Status.FAILED)
    html = admin_client.get(change_url(job)).content.decode()
    local = timezone.localtime(job.finished_at)
    assert local.strftime("%Y-%m-%d %H:%M:%S %Z") in html
    listed = admin_client.get(changelist_url()).content.decode()
    assert local.strftime("%H:%M:%S %Z") in listed or local.strftime("%Y-%m-%d %H:%M:%S %Z") in listed


def test_operator_actions_show_on_the_job_page(admin_client) -> None:
    job = make_job(Status.FAILED)
    post_action(admin_client, "retry_now", [job])
    html = admin_client.get(change_url(job)).content.decode()
    part = html[html.index("field-operator_actions"):]
    assert "admin" in part[:600] and "Retry now: Failed → Pending" in part[:600]


def test_wording(admin_client) -> None:
    job = make_job(Status.FAILED)
    Job.objects.enqueue(TYPE_NAME, {})
    html = admin_client.get(change_url(job)).content.decode()
    assert "Attempt num" not in html
    soon = make_job(scheduled_for=timezone.now() + timedelta(seconds=20))
    listed = admin_client.get(changelist_url()).content.decode()
    assert "in 0 minutes" not in listed and "seconds" in listed
    assert "Partially completed" in admin_client.get(reverse(DASHBOARD)).content.decode()
    response = post_action(admin_client, "pause", [Job.objects.get(pk=soon.pk)])
    response = post_action(admin_client, "pause", [Job.objects.get(pk=soon.pk)])
    assert "already Paused" in " ".join(messages_of(response))
    types = admin_client.get(reverse("admin:django_sqlqueue_jobtype_changelist")).content.decode()
    assert "icon-no.svg" not in types  # a red x meant "not paused"
    from testproject.notifications.models import ResetPassword

    assert ResetPassword._meta.verbose_name_plural == "reset password data"


def test_attempt_error_is_cut_at_a_word_with_an_ellipsis() -> None:
    from django_sqlqueue.admin.site import ellipsize

    assert ellipsize("alpha beta gamma", 12) == "alpha beta…"
    assert ellipsize("short", 12) == "short"


# ----- 11: throughput ------------------------------------------------------------------------------
THROUGHPUT = "admin:django_sqlqueue_throughput"


def test_throughput_rates_wait_and_runtime(admin_client) -> None:
    now = timezone.now()
    for minutes_ago, wait_s, run_ms in [(2, 1, 100), (3, 3, 200), (4, 5, 300), (30, 10, 400)]:
        job = make_job(Status.COMPLETED)
        finished = now - timedelta(minutes=minutes_ago)
        Job.objects.filter(pk=job.pk).update(
            finished_at=finished, started_at=finished - timedelta(milliseconds=run_ms),
            scheduled_for=finished - timedelta(milliseconds=run_ms, seconds=wait_s), duration_ms=run_ms)
    failed = make_job(Status.FAILED)
    Job.objects.filter(pk=failed.pk).update(finished_at=now - timedelta(hours=5))
    ctx = admin_client.get(reverse(THROUGHPUT)).context
    assert ctx["chart"]["totals"] == {"enqueued": 5, "finished": 4, "failed": 0}
    assert ctx["wait_p50"] == pytest.approx(3, abs=0.01) and ctx["wait_p95"] == pytest.approx(10, abs=0.01)
    row = ctx["runtime"][0]
    assert row["type"] == TYPE_NAME and row["n"] == 4 and row["p50"] == pytest.approx(0.2)
    day = admin_client.get(reverse(THROUGHPUT) + "?window=24h").context
    assert day["chart"]["totals"]["failed"] == 1 and day["window"].key == "24h"
    week = admin_client.get(reverse(THROUGHPUT) + "?window=7d")
    assert week.status_code == 200 and 'id="sqlqueue-rates"' in week.content.decode()


def test_percentile_nearest_rank() -> None:
    from django_sqlqueue.ops.health import percentile

    assert percentile([], 50) is None
    assert percentile([5, 1, 3], 50) == 3 and percentile(list(range(1, 101)), 95) == 95


# ----- 15: payload search -----------------------------------------------------------------------------
def test_search_by_a_payload_value(admin_client) -> None:
    a = make_job(payload={"to": "alice@example.com", "user": {"id": 7}})
    b = make_job(payload={"to": "bob@example.com", "user": {"id": 8}})
    found = admin_client.get(changelist_url(q="to=alice@example.com")).context["cl"].result_list
    assert [j.pk for j in found] == [a.pk]
    found = admin_client.get(changelist_url(q="user.id=8")).context["cl"].result_list
    assert [j.pk for j in found] == [b.pk]
    assert list(admin_client.get(changelist_url(q="to=carol@example.com")).context["cl"].result_list) == []


def test_payload_search_uses_containment_on_postgresql(admin_client) -> None:
    from django.db import connection

    from django_sqlqueue.admin.site import payload_condition

    sql, _params = Job.objects.filter(payload_condition("to=a@example.com", None)).query.sql_with_params()
    if connection.vendor == "postgresql":
        assert "@>" in sql
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'sqlqueue_job_payload_gin'")
            assert "jsonb_path_ops" in cursor.fetchone()[0]
    else:
        assert "@>" not in sql


def test_sensitive_keys_cannot_be_probed_by_search(client) -> None:
    from django_sqlqueue.sensitive import _keys, mark_sensitive

    job = make_job(payload={"secret_code": "123456"})
    mark_sensitive(TYPE_NAME, "secret_code")
    try:
        client.force_login(user_with("view_job", username="prober"))
        assert list(client.get(changelist_url(q="secret_code=123456")).context["cl"].result_list) == []
        client.force_login(user_with("view_job", "view_sensitive_job", username="allowed"))
        found = client.get(changelist_url(q="secret_code=123456")).context["cl"].result_list
        assert [j.pk for j in found] == [job.pk]
    finally:
        _keys.pop(TYPE_NAME, None)
