"""Issue 27 (the operator's view, round 3), Django's test client: no secret leaks, no silent unfiltered
list, a walk past page 100, Discard all and batches, crafted ids, and the wording.

The same security findings are checked in a real Chromium in tests/test_browser_safety.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import sensitive
from django_sqlqueue.admin.filters import CheapPaginator
from django_sqlqueue.admin.site import JobAdmin
from django_sqlqueue.models import Batch, Job, JobType, Schedule
from django_sqlqueue.states import Status
from django_sqlqueue.workflows import batch
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    TYPE_NAME,
    change_url,
    changelist_url,
    fast_password_hasher,
    fresh_admin_caches,
    ids_in,
    make_job,
    make_worker,
    messages_of,
    post_action,
    user_with,
)

pytestmark = pytest.mark.django_db

SECRET = "sk_live_CALLBACK"
VIEW_ONLY = ("view_job", "view_jobtype", "view_worker", "view_schedule", "view_batch", "view_queuepause")
FAILURES = "admin:django_sqlqueue_failures"


@pytest.fixture
def marked(monkeypatch):
    """``api_key`` marked sensitive for the schedules' type and the batch callback's (registry restored)."""
    monkeypatch.setattr(sensitive, "_keys", {})
    sensitive.mark_sensitive("CrmSync", "api_key")
    sensitive.mark_sensitive("Notify", "api_key")


@pytest.fixture
def viewer(client):
    client.force_login(user_with(*VIEW_ONLY, username="viewonly"))
    return client


def crm_schedule(**fields) -> Schedule:
    JobType.objects.get_or_create(name="CrmSync")
    return Schedule.objects.create(**{"name": "crm-sync-unserved", "job_type": "CrmSync", "every_seconds": 60,
                                      "payload": {"api_key": SECRET, "account": "acme"}, "queue": "crm",
                                      "next_run_at": timezone.now() + timedelta(minutes=1), **fields})


# ----- 1: the schedule pages mask sensitive payload keys ---------------------------------------------------
def test_schedule_pages_mask_sensitive_keys_for_a_view_only_user(viewer, marked) -> None:
    schedule = crm_schedule()
    page = viewer.get(reverse("admin:django_sqlqueue_schedule_change", args=[schedule.pk])).content.decode()
    assert SECRET not in page
    assert "acme" in page and sensitive.MASK in page  # the rest shows; the key is masked
    listing = viewer.get(reverse("admin:django_sqlqueue_schedule_changelist")).content.decode()
    assert "crm-sync-unserved" in listing and SECRET not in listing
    history = viewer.get(reverse("admin:django_sqlqueue_schedule_history", args=[schedule.pk]))
    assert SECRET not in history.content.decode()


def test_the_permission_shows_the_schedule_payload(client, marked) -> None:
    schedule = crm_schedule()
    client.force_login(user_with("view_schedule", "view_sensitive_job", username="trusted"))
    page = client.get(reverse("admin:django_sqlqueue_schedule_change", args=[schedule.pk])).content.decode()
    assert SECRET in page


def test_an_editor_without_the_permission_cannot_overwrite_the_masked_payload(client, marked) -> None:
    """The masked payload is not a form field for that user: saving the form keeps the stored payload."""
    schedule = crm_schedule()
    client.force_login(user_with("view_schedule", "change_schedule", username="editor"))
    url = reverse("admin:django_sqlqueue_schedule_change", args=[schedule.pk])
    page = client.get(url)
    assert SECRET not in page.content.decode() and "payload" not in page.context["adminform"].form.fields
    data = {"name": schedule.name, "enabled": "on", "job_type": "CrmSync", "task": "", "queue": "crm",
            "priority": "5", "cron": "", "timezone": "UTC", "every_seconds": "60", "misfire": "run_once",
            "misfire_limit": "10", "misfire_grace_seconds": "60", "expires_after_seconds": "",
            "payload": '{"api_key": "stolen"}'}
    assert client.post(url, data).status_code == 302
    saved = Schedule.objects.get(pk=schedule.pk)
    assert saved.priority == 5 and saved.payload == {"api_key": SECRET, "account": "acme"}


# ----- 2: every changelist takes only its declared filters ----------------------------------------------
def our_admins() -> list[tuple[type, admin.ModelAdmin]]:
    return [(model, model_admin) for model, model_admin in admin.site._registry.items()
            if model._meta.app_label == "django_sqlqueue"]


def test_every_admin_of_the_app_is_guarded() -> None:
    from django_sqlqueue.admin.guard import GuardedChangelist

    admins = our_admins()
    assert {m.__name__ for m, _a in admins} >= {"Job", "JobType", "Worker", "Schedule", "Batch"}
    assert all(isinstance(a, GuardedChangelist) for _m, a in admins), [type(a) for _m, a in admins]


def test_no_changelist_of_the_app_takes_a_lookup_it_does_not_declare(viewer) -> None:
    """Every field of every registered model, with ``icontains``, ``regex`` and bare: refused (400)
    unless it is one of that list's declared filters, for a view-only user."""
    request = RequestFactory().get("/")
    request.user = user_with(*VIEW_ONLY, username="probe")
    tried = 0
    for model, model_admin in our_admins():
        declared = model_admin.declared_lookups(request)
        url = reverse(f"admin:django_sqlqueue_{model._meta.model_name}_changelist")
        for field in model._meta.concrete_fields:
            for lookup in (f"{field.name}__icontains", f"{field.name}__regex", field.name, f"{field.attname}__gt"):
                if lookup in declared:
                    continue
                response = viewer.get(url, {lookup: "x"})
                tried += 1
                body = response.content.decode()
                assert response.status_code == 400, (model.__name__, lookup, response.status_code)
                assert "not a filter of this list" in body and 'class="action-select"' not in body, lookup
    assert tried > 100


def test_the_batch_list_answers_no_question_about_a_hidden_callback(viewer, marked) -> None:
    JobType.objects.get_or_create(name="Notify")
    with batch(on_success=("Notify", {"api_key": SECRET}), description="invoices"):
        pass
    url = reverse("admin:django_sqlqueue_batch_changelist")
    right = viewer.get(url, {"on_success__icontains": SECRET})
    wrong = viewer.get(url, {"on_success__icontains": "sk_live_WRONG"})
    regex = viewer.get(url, {"on_success__regex": "sk_live_.*"})
    assert right.status_code == wrong.status_code == regex.status_code == 400
    for response in (right, wrong, regex):
        body = response.content.decode()
        assert "is not a filter of this list" in body and "invoices" not in body
    assert "invoices" in viewer.get(url).content.decode()


# ----- 3: a refused filter, a deep page, ?e=1: an error and no rows --------------------------------------
@pytest.mark.parametrize("params", [{"status": "Error"}, {"overdue": "2"}, {"e": "1"}, {"p": "101"},
                                    {"before": "abc"}, {"before": "5", "after": "3"}])
def test_a_refused_request_shows_the_error_and_no_rows(viewer, params) -> None:
    for _i in range(3):
        make_job()
    response = viewer.get(changelist_url(**params))
    body = response.content.decode()
    assert response.status_code == 400, params
    assert 'id="sqlqueue-refused"' in body and "No jobs are listed" in body
    assert 'id="result_list"' not in body and "action-select" not in body and "select_across" not in body


def test_the_refusal_names_the_page_past_the_last(viewer) -> None:
    make_job()
    body = viewer.get(changelist_url(p="101")).content.decode()
    assert "Page 101 does not exist" in body and "older" in body


def test_select_all_and_cancel_under_a_refused_filter_changes_nothing(admin_client) -> None:
    jobs = [make_job(), make_job(Status.ERROR)]
    response = admin_client.post(changelist_url(status="Error"), {
        "action": "cancel", "index": "0", "select_across": "1", "confirm": "yes",
        "_selected_action": [str(j.pk) for j in jobs]})
    assert response.status_code == 400
    assert [Job.objects.get(pk=j.pk).state for j in jobs] == [Status.PENDING, Status.ERROR]


# ----- 4: walk any filtered result past the numbered pages -----------------------------------------------
@pytest.fixture
def small_pages(monkeypatch):
    """Pages of 3 and a count capped at 5: two numbered pages, as 100 pages of 100 are at 10,000 jobs."""
    monkeypatch.setattr(JobAdmin, "list_per_page", 3)
    monkeypatch.setattr(CheapPaginator, "count_cap", 5)


def walk(client, url: str, link: str) -> list[list[int]]:
    pages = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, url
        pages.append(ids_in(response))
        url = getattr(response.context["cl"], link)
        if url:
            url = changelist_url() + url
        assert len(pages) < 50
    return pages


def test_older_links_walk_every_job_of_a_filter_past_the_numbered_pages(viewer, small_pages) -> None:
    errors = [make_job(Status.ERROR) for _i in range(11)]
    for _i in range(4):
        make_job()
    assert viewer.get(changelist_url(status=int(Status.ERROR), p="3")).status_code == 400  # past the cap
    pages = walk(viewer, changelist_url(status=int(Status.ERROR)), "older_url")
    walked = [pk for page in pages for pk in page]
    assert walked == sorted((j.pk for j in errors), reverse=True)  # every one, once, newest first
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    back = walk(viewer, changelist_url(status=int(Status.ERROR), before=pages[-1][0] + 1), "newer_url")
    assert [pk for page in reversed(back) for pk in page] == walked
    html = viewer.get(changelist_url(status=int(Status.ERROR), before=pages[1][-1])).content.decode()
    assert 'class="sqlqueue-older"' in html and 'class="sqlqueue-newer"' in html and "newest" in html


def test_the_walk_follows_an_ascending_order_too(admin_client, small_pages) -> None:
    jobs = [make_job() for _i in range(7)]
    pages = walk(admin_client, changelist_url(o="1"), "newer_url")  # o=1: the id column (after the checkbox)
    assert [pk for page in pages for pk in page] == [j.pk for j in jobs]


def test_select_all_on_a_walked_page_means_every_matching_job(admin_client, small_pages) -> None:
    jobs = [make_job(Status.ERROR) for _i in range(8)]
    url = changelist_url(status=int(Status.ERROR), before=jobs[4].pk)
    admin_client.post(url, {"action": "pause", "index": "0", "select_across": "1",
                            "_selected_action": [str(jobs[0].pk)]})
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {Status.PAUSED}


# ----- 6: Discard all and batches ---------------------------------------------------------------------------
def test_discard_all_keeps_a_batchs_failed_member_and_the_batch_names_its_callback(
        admin_client, make_type, django_capture_on_commit_callbacks) -> None:
    make_type("Member")
    make_type("Notify")
    with django_capture_on_commit_callbacks(execute=True), batch(
            on_success="Notify", on_failure="Notify", on_finish="Notify", description="invoices") as b:
        members = [b.enqueue("Member") for _i in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        for job in members:
            claimed = next(j for j in Job.objects.claim("w/0", 10) if j.pk == job.pk)
            status = Status.FAILED if job is members[0] else Status.COMPLETED
            Job.objects.modify(claimed, claimed.version, status,
                               error="Traceback\nsmtplib.SMTPError: 554" if status == Status.FAILED else None)
    loose = make_job(Status.FAILED, error="Traceback\nsmtplib.SMTPError: 554")
    Job.objects.filter(pk=loose.pk).update(job_type=JobType.objects.get(name="Member"))
    key = next(g.key for g in admin_client.get(reverse(FAILURES)).context["groups"] if g.type_name == "Member")
    confirm = admin_client.post(reverse(FAILURES), {"group": key, "op": "discard"}).content.decode()
    assert "1 Failed job is kept: it belongs to a batch" in confirm
    assert "1 Failed job is deleted" in confirm and "Error job" not in confirm
    done = admin_client.post(reverse(FAILURES), {"group": key, "op": "discard", "confirm": "yes"}, follow=True)
    said = " ".join(messages_of(done))
    assert "1 Failed job kept: it belongs to a batch" in said and "0 jobs changed" not in said
    assert Job.objects.get(pk=members[0].pk).state is Status.FAILED  # kept, with its batch
    assert not Job.objects.filter(pk=loose.pk).exists()  # not a member: deleted
    row = Batch.objects.get(pk=b.pk)
    page = admin_client.get(reverse("admin:django_sqlqueue_batch_change", args=[b.pk])).content.decode()
    assert "sqlqueue-badge sqlqueue-failed" in page and "some member did not complete" in page
    failure_cb, finish_cb = row.callback_ids
    part = page[page.index("field-callbacks"):]
    assert f"Notify #{failure_cb}</a>" in part and f"Notify #{finish_cb}</a>" in part
    assert part.index("on_failure") < part.index("on_finish") and "on_success" not in part[:part.index("on_finish")]


# ----- 7: crafted ids in an action POST -----------------------------------------------------------------
@pytest.mark.parametrize("bad", ["abc", "99999999999999999999999", "-1", "²", ""])
@pytest.mark.parametrize(("model", "action", "extra"), [
    ("job", "cancel", {"confirm": "yes"}), ("jobtype", "pause_types", {}), ("schedule", "disable_schedules", {}),
])
def test_an_action_post_with_a_selection_that_is_no_id_changes_nothing(admin_client, bad, model, action,
                                                                         extra) -> None:
    job = make_job()
    schedule = crm_schedule()
    url = reverse(f"admin:django_sqlqueue_{model}_changelist")
    ours = {"job": job, "jobtype": job.job_type, "schedule": schedule}[model]
    response = admin_client.post(url, {"action": action, "index": "0", "_selected_action": [str(ours.pk), bad],
                                       **extra}, follow=True)
    assert response.status_code == 200
    assert any("Nothing was changed" in m for m in messages_of(response)), messages_of(response)
    assert Job.objects.get(pk=job.pk).state is Status.PENDING
    assert not JobType.objects.get(pk=job.job_type_id).paused and Schedule.objects.get(pk=schedule.pk).enabled


# ----- looks and words -------------------------------------------------------------------------------------
def test_a_schedules_name_keeps_its_case_and_an_unserved_queue_is_said(admin_client, settings) -> None:
    schedule = crm_schedule()
    make_worker("w-default", queues=["default"])
    done = admin_client.post(reverse("admin:django_sqlqueue_schedule_changelist"), {
        "action": "run_schedules_now", "index": "0", "_selected_action": [str(schedule.pk)]}, follow=True)
    html = done.content.decode()
    assert "Schedule crm-sync-unserved: <a" in html and "Crm-sync" not in html
    data = {"name": "crm-two", "enabled": "on", "job_type": "CrmSync", "task": "", "payload": "{}", "queue": "crm",
            "priority": "0", "cron": "", "timezone": "UTC", "every_seconds": "60", "misfire": "run_once",
            "misfire_limit": "10", "misfire_grace_seconds": "60", "expires_after_seconds": ""}
    saved = admin_client.post(reverse("admin:django_sqlqueue_schedule_add"), data, follow=True)
    assert Schedule.objects.filter(name="crm-two").exists()
    assert any("No live worker serves queue crm and type CrmSync" in m for m in messages_of(saved))
    data.update(name="default-one", queue="default")
    served = admin_client.post(reverse("admin:django_sqlqueue_schedule_add"), data, follow=True)
    assert not any("No live worker" in m for m in messages_of(served))


def test_one_date_format_with_its_zone_on_every_page_of_the_app(admin_client, make_type) -> None:
    schedule = crm_schedule(last_run_at=timezone.now())
    make_worker("w-1")
    with batch(description="dates"):
        pass
    pages = [reverse("admin:django_sqlqueue_schedule_changelist"),
             reverse("admin:django_sqlqueue_schedule_change", args=[schedule.pk]),
             reverse("admin:django_sqlqueue_jobtype_changelist"),
             reverse("admin:django_sqlqueue_jobtype_change", args=[JobType.objects.get(name="CrmSync").pk]),
             reverse("admin:django_sqlqueue_worker_changelist"),
             reverse("admin:django_sqlqueue_worker_change", args=[make_worker("w-2").pk]),
             reverse("admin:django_sqlqueue_batch_changelist"),
             reverse("admin:django_sqlqueue_batch_change", args=[Batch.objects.get().pk]),
             reverse("admin:django_sqlqueue_dashboard")]
    stamp = timezone.localtime().strftime("%Y-%m-%d")
    for url in pages:
        html = admin_client.get(url).content.decode()
        assert "a.m." not in html and "p.m." not in html, url
        assert stamp in html and timezone.localtime().strftime("%Z") in html, url
        assert not re.search(r"\b0 minutes", html), url
    declared = admin_client.get(reverse("admin:django_sqlqueue_schedule_changelist")).content.decode()
    assert "icon-no.svg" not in declared and "made in the admin" in declared


def test_plurals_and_the_history_name(admin_client) -> None:
    job = make_job(Status.FAILED, error="Traceback\nsmtplib.SMTPError: 554")
    key = next(g.key for g in admin_client.get(reverse(FAILURES)).context["groups"])
    confirm = admin_client.post(reverse(FAILURES), {"group": key, "op": "retry"}).content.decode()
    assert "Retry all: 1 job of" in confirm and "1 jobs" not in confirm
    assert "1 Failed job and 0 Error jobs" in confirm
    admin_client.post(reverse(FAILURES), {"group": key, "op": "retry", "confirm": "yes"})
    assert LogEntry.objects.get(object_id=str(job.pk)).object_repr == f"{TYPE_NAME} #{job.pk}"


def test_the_charts_gridline_is_a_whole_number(admin_client) -> None:
    from django_sqlqueue.admin.views import throughput_chart

    now = timezone.now()
    for _i in range(7):
        job = make_job(Status.COMPLETED)
        Job.objects.filter(pk=job.pk).update(finished_at=now - timedelta(minutes=2))
    chart = throughput_chart(Job, now)
    assert chart["peak"] == 7 and chart["mid"] == 3 and isinstance(chart["mid"], int)
    html = admin_client.get(reverse("admin:django_sqlqueue_dashboard")).content.decode()
    assert 'id="sqlqueue-chart-mid">3<' in html
