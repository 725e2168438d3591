"""Issue 21, the admin under crafted requests (findings 3, 4, 8, 9 and 12).

Bad filter values are refused (a page naming what was refused, HTTP 400, no rows: never "every job";
Django's own redirect to ``?e=1`` listed every job, issue 27); only the declared filters may be used through the URL; no crafted value is a 500; the job type and
"Retry at…" forms refuse values the queue cannot use.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_sqlqueue.admin.site import PRETTY_JSON_DEPTH
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status
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

def refused(response) -> bool:
    """The refusal page: HTTP 400, the reason, no rows and no checkboxes (admin/guard.py)."""
    body = response.content.decode()
    return response.status_code == 400 and 'id="sqlqueue-refused"' in body and "action-select" not in body


# ----- finding 8: a value no choice could hold is refused, not ignored ---------------------------------------
@pytest.mark.parametrize(("param", "value"), [
    ("status", "Error"),  # a label, not an id
    ("status", "99"),
    ("status", "0"),
    ("status", "²"),
    ("type", "abc"),
    ("type", str(2**63)),  # above int64: an OverflowError in the database driver
    ("type", "-1"),
    ("queue", "a\x00b"),  # PostgreSQL cannot even compare it
    ("queue", "q" * 101),
    ("step", "s" * 101),
    ("worker", "w" * 201),
    ("worker", "w\x00"),
    ("overdue", "0"),
    ("lease_expired", "yes"),
    ("has_error", "2"),
    ("enqueued_at__year", str(10**30)),  # OverflowError inside Django's date hierarchy
    ("enqueued_at__year", "0"),
])
def test_a_filter_value_no_choice_could_hold_is_refused(admin_client, param, value) -> None:
    make_job()
    make_job(Status.ERROR)
    response = admin_client.get(changelist_url(**{param: value}))
    assert refused(response), (param, value, response.status_code)


def test_select_all_and_cancel_under_a_bad_filter_changes_nothing(admin_client) -> None:
    """The incident: ``?status=Error`` (a label) listed every job; select all + Cancel cancelled them."""
    jobs = [make_job(), make_job(), make_job(Status.ERROR)]
    response = admin_client.post(changelist_url(status="Error"),
                                 {"action": "cancel", "index": "0", "select_across": "1", "confirm": "yes",
                                  "_selected_action": [str(j.pk) for j in jobs]})
    assert refused(response)
    assert [Job.objects.get(pk=j.pk).state for j in jobs] == [Status.PENDING, Status.PENDING, Status.ERROR]


def test_a_filter_with_nothing_to_list_still_applies_its_value(admin_client) -> None:
    """With no worker rows the worker filter has no choices, and Django drops such a filter with its
    value: ``?worker=w1`` listed every job."""
    held = make_job(Status.PROCESSING, worker="w1")
    other = make_job()
    response = admin_client.get(changelist_url(worker="w1"))
    assert response.status_code == 200
    assert ids_in(response) == [held.pk]
    assert other.pk not in ids_in(response)
    # And the valid values keep working.
    make_worker("w1")
    assert ids_in(admin_client.get(changelist_url(worker="w1", status=int(Status.PROCESSING)))) == [held.pk]
    assert ids_in(admin_client.get(changelist_url(overdue=1, queue="default"))) == [other.pk]


def test_worker_state_filter_refuses_unknown_states(admin_client) -> None:
    url = reverse("admin:django_sqlqueue_worker_changelist")
    make_worker("alive-1")
    assert admin_client.get(url, {"state": "alive"}).status_code == 200
    response = admin_client.get(url, {"state": "dead"})
    assert refused(response)


# ----- finding 9: only the declared filters, for everyone ----------------------------------------------------
@pytest.fixture
def viewer(client):
    """A staff user who may only view jobs, job types and workers."""
    client.force_login(user_with("view_job", "view_jobtype", "view_worker", username="viewer"))
    return client


@pytest.mark.parametrize("params", [
    {"error__regex": "(a+)+$"},  # exponential backtracking, in the web process on SQLite
    {"payload__icontains": "x"},  # a scan of every payload
    {"payload__contains": "x"},  # a 500 on SQLite
    {"response__isnull": "False"},
    {"id__gt": "0"},
    {"status__name": "Pending"},
    {"job_type__name__startswith": "A"},
    {"dedupe_key__regex": ".*"},
    {"status": "1", "error__iregex": "x"},  # a declared filter does not carry another along
])
def test_undeclared_lookups_on_the_job_list_are_refused(viewer, params) -> None:
    make_job(Status.FAILED)
    assert viewer.get(changelist_url(**params)).status_code == 400


def test_declared_filters_work_for_a_view_only_user(viewer) -> None:
    failed = make_job(Status.FAILED)
    type_id = JobType.objects.get(name=TYPE_NAME).pk
    for params in ({"status": int(Status.FAILED)}, {"type": type_id}, {"queue": "default"}, {"step": "-"},
                   {"has_error": 1}, {"enqueued_at__year": failed.enqueued_at.year}):
        response = viewer.get(changelist_url(**params))
        assert response.status_code == 200, params
        assert ids_in(response) == [failed.pk], params


@pytest.mark.parametrize(("url_name", "params", "status"), [
    ("admin:django_sqlqueue_jobtype_changelist", {"name__regex": "(a+)+$"}, 400),
    ("admin:django_sqlqueue_jobtype_changelist", {"description__icontains": "x"}, 400),
    ("admin:django_sqlqueue_jobtype_changelist", {"jobs__payload__icontains": "x"}, 400),
    ("admin:django_sqlqueue_jobtype_changelist", {"paused__exact": "1"}, 200),
    ("admin:django_sqlqueue_worker_changelist", {"host__regex": "(a+)+$"}, 400),
    ("admin:django_sqlqueue_worker_changelist", {"name__icontains": "w"}, 400),
    ("admin:django_sqlqueue_worker_changelist", {"state": "alive"}, 200),
])
def test_undeclared_lookups_on_the_type_and_worker_lists_are_refused(viewer, url_name, params, status) -> None:
    make_job()
    make_worker("w-1")
    assert viewer.get(reverse(url_name), params).status_code == status


# ----- finding 12: no 500 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("term", ["²", "#²", "٣", "#99999999999999999999", str(2**63), "0"])
def test_search_terms_that_look_like_ids_but_are_not(admin_client, term) -> None:
    job = make_job(Status.FAILED, error="boom ² ٣ 99999999999999999999")
    response = admin_client.get(changelist_url(q=term))
    assert response.status_code == 200
    # Not an id: searched as a dedupe key, then as error text.
    assert ids_in(response) == ([job.pk] if term in job.error else [])


def test_an_id_search_still_finds_the_job(admin_client) -> None:
    job, other = make_job(), make_job()
    assert ids_in(admin_client.get(changelist_url(q=str(job.pk)))) == [job.pk]
    assert ids_in(admin_client.get(changelist_url(q=f"#{other.pk}"))) == [other.pk]


def test_a_crafted_return_after_an_action_is_not_a_500(admin_client) -> None:
    """``_sqlqueue_return=²`` raised ValueError after the action had been applied."""
    job = make_job()
    response = post_action(admin_client, "cancel", [job], follow=False, _sqlqueue_return="²", confirm="yes")
    assert response.status_code == 302 and response.headers["Location"] == changelist_url()
    assert Job.objects.get(pk=job.pk).state == Status.CANCELLED
    response = post_action(admin_client, "retry_now", [make_job(Status.FAILED)], follow=False,
                           _sqlqueue_return=str(2**64))
    assert response.status_code == 302 and response.headers["Location"] == changelist_url()
    # A genuine job id still brings the operator back to the job.
    other = make_job()
    response = post_action(admin_client, "cancel", [other], follow=False, _sqlqueue_return=str(other.pk), confirm="yes")
    assert response.headers["Location"] == change_url(other)


@pytest.mark.parametrize(("fields", "error"), [
    ({"delay": "10000000", "unit": "days"}, "At most 100 years from now."),
    ({"delay": "5000000", "unit": "days"}, "At most 100 years from now."),
    ({"delay": str(10**30), "unit": "seconds"}, "less than or equal to"),
    ({"run_at": "9999-12-31T23:59:59", "unit": "minutes"}, "Give a time within 100 years of now."),
    ({"run_at": "0001-01-01T00:00:00", "unit": "minutes"}, "Give a time within 100 years of now."),
])
def test_retry_at_beyond_a_century_is_a_form_error(admin_client, fields, error) -> None:
    """Issue 18 / 21: Retry at 5,000,000 or 10,000,000 days was an OverflowError (a 500)."""
    failed = make_job(Status.FAILED)
    response = post_action(admin_client, "retry_at", [failed], follow=False, apply="1", **fields)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert Job.objects.get(pk=failed.pk).state == Status.FAILED


def test_retry_at_the_far_edge_is_accepted(admin_client) -> None:
    failed = make_job(Status.FAILED)
    post_action(admin_client, "retry_at", [failed], apply="1", delay=str(99 * 365), unit="days")
    fresh = Job.objects.get(pk=failed.pk)
    assert fresh.state == Status.PENDING
    assert fresh.scheduled_for.year >= fresh.updated_at.year + 98


def test_a_deeply_nested_response_renders_on_the_job_page(admin_client) -> None:
    """A response nested ~990 deep was stored, and its page raised RecursionError."""
    deep: object = "bottom"
    for _ in range(990):
        deep = [deep]
    job = make_job(Status.PROCESSING)
    Job.objects.complete(Job.objects.get(pk=job.pk), response=deep)
    response = admin_client.get(change_url(job))
    assert response.status_code == 200
    html = response.content.decode()
    # Indented to PRETTY_JSON_DEPTH levels, then written compactly on one line.
    assert "\n" + "  " * (PRETTY_JSON_DEPTH - 1) + "[" in html
    assert "[" * (990 - PRETTY_JSON_DEPTH) + "&quot;bottom&quot;" + "]" * (990 - PRETTY_JSON_DEPTH) in html


# ----- findings 3 and 4: the job type form --------------------------------------------------------------------
SETTINGS_FORM = {"description": "", "max_attempts": "3", "backoff_base_seconds": "2", "backoff_max_seconds": "30",
                 "timeout_seconds": "60", "lease_seconds": "15"}


@pytest.mark.parametrize(("field", "value"), [
    ("lease_seconds", "0"), ("timeout_seconds", "0"), ("max_attempts", "0"),
    ("backoff_base_seconds", "1e10"), ("backoff_max_seconds", "1e10"), ("backoff_max_seconds", "-1"),
    ("backoff_base_seconds", "nan"), ("backoff_max_seconds", "inf"),
])
def test_the_job_type_form_refuses_settings_out_of_bounds(admin_client, field, value) -> None:
    jt = JobType.objects.create(name="Bounded")
    url = reverse("admin:django_sqlqueue_jobtype_change", args=[jt.pk])
    response = admin_client.post(url, {**SETTINGS_FORM, field: value})
    assert response.status_code == 200  # the form again, with its errors
    assert field in response.context["adminform"].form.errors
    jt.refresh_from_db()
    assert getattr(jt, field) is None  # nothing was saved
    assert admin_client.post(url, SETTINGS_FORM).status_code == 302  # the same form, in bounds, saves


def test_the_job_type_add_form_refuses_a_name_with_a_line_break(admin_client) -> None:
    url = reverse("admin:django_sqlqueue_jobtype_add")
    response = admin_client.post(url, {**SETTINGS_FORM, "name": "Forged\njob_finished status=Completed"})
    assert response.status_code == 200
    assert "control characters or line breaks" in response.content.decode()
    assert not JobType.objects.filter(name__startswith="Forged").exists()
