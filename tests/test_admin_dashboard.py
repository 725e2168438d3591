"""Dashboard, admin index link, job type admin (settings, pause/resume, counts) and worker admin."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    TYPE_NAME,
    fast_password_hasher,
    fresh_admin_caches,
    make_job,
    make_worker,
    messages_of,
    user_with,
)

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_sqlqueue_dashboard"


def test_dashboard_counts_chart_and_workers(admin_client) -> None:
    for _ in range(3):
        make_job(queue="emails")
    make_job(Status.FAILED, queue="emails")
    make_job(Status.COMPLETED, queue="reports")
    make_job(Status.PROCESSING, queue="reports", worker="w-live")
    old = make_job(queue="reports")
    Job.objects.filter(pk=old.pk).update(scheduled_for=timezone.now() - timedelta(minutes=12))
    make_worker("w-live")
    make_worker("w-dead", heartbeat_age=3600)
    make_worker("w-stopped", stopped=True)
    response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    ctx = response.context
    emails = next(r for r in ctx["queue_rows"] if r["label"] == "emails")
    assert emails["total"] == 4
    assert [c["n"] for c in emails["cells"]][:4] == [3, 0, 0, 1]  # Pending, Processing, Error, Failed
    assert emails["cells"][0]["url"].endswith("?queue=emails&status=1")
    by_type = next(r for r in ctx["type_rows"] if r["label"] == TYPE_NAME)
    assert by_type["total"] == 7
    assert ctx["grand_total"] == 7 and ctx["unfinished"] == 5
    assert 12 * 60 - 5 < ctx["oldest_due_age"].total_seconds() < 12 * 60 + 60
    assert ctx["overdue"] >= 4 and ctx["lease_expired"] == 0
    assert ctx["active_workers"] == 1 and ctx["stale_workers"] == 1
    assert ctx["chart"]["total_done"] == 1 and ctx["chart"]["total_failed"] == 1
    assert len(ctx["chart"]["bars"]) == 60
    html = response.content.decode()
    assert '<svg class="sqlqueue-chart" id="sqlqueue-chart"' in html and html.count("<rect") == 120
    assert "<script" not in html.split('id="content-main"')[1]  # no JavaScript in the dashboard itself
    assert "w-live" in html and "w-dead" in html and "w-stopped" not in html
    assert 'sqlqueue-badge sqlqueue-stale">stale<' in html
    assert "?status=1&amp;overdue=1" in html  # links open the list pre-filtered


def test_dashboard_chart_buckets_by_minute(admin_client) -> None:
    now = timezone.now()
    for minutes_ago, status in [(1, Status.COMPLETED), (1, Status.COMPLETED), (5, Status.FAILED),
                                (30, Status.ERROR), (90, Status.COMPLETED)]:
        job = make_job(status)
        Job.objects.filter(pk=job.pk).update(finished_at=now - timedelta(minutes=minutes_ago))
    chart = admin_client.get(reverse(DASHBOARD)).context["chart"]
    done = [b["done"] for b in chart["bars"]]
    failed = [b["failed"] for b in chart["bars"]]
    assert sum(done) == 2 and sum(failed) == 2  # 90 minutes ago is outside the hour
    assert done[-2] == 2 or done[-3] == 2
    assert chart["peak"] == 2
    tallest = max(chart["bars"], key=lambda b: b["h_done"])
    assert tallest["h_done"] == chart["plot_h"]


def test_dashboard_uses_a_fixed_number_of_queries(admin_client) -> None:
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            admin_client.get(reverse(DASHBOARD))
        return len(ctx.captured_queries)

    make_job()
    few = count()
    for i in range(30):
        make_job(Status.FAILED if i % 3 else Status.COMPLETED, queue=f"q{i % 4}")
    assert count() == few


def test_dashboard_needs_view_permission(client) -> None:
    client.force_login(user_with("retry_job", username="noview"))
    assert client.get(reverse(DASHBOARD)).status_code == 403
    client.force_login(user_with("view_job", username="viewer"))
    assert client.get(reverse(DASHBOARD)).status_code == 200
    client.logout()
    assert client.get(reverse(DASHBOARD)).status_code == 302  # to the login page


def test_admin_index_and_app_index_link_to_the_dashboard(admin_client, client) -> None:
    url = reverse(DASHBOARD)
    assert f'href="{url}"' in admin_client.get(reverse("admin:index")).content.decode()
    app = admin_client.get(reverse("admin:app_list", args=["django_sqlqueue"])).content.decode()
    assert f'href="{url}"' in app
    client.force_login(user_with("view_worker", username="workersonly"))
    assert f'href="{url}"' not in client.get(reverse("admin:index")).content.decode()


# ----- job types ------------------------------------------------------------------------------------
def test_job_type_list_shows_counts_and_effective_settings(admin_client) -> None:
    make_job()
    make_job(Status.FAILED)
    JobType.objects.filter(name=TYPE_NAME).update(lease_seconds=90)
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse("admin:django_sqlqueue_jobtype_changelist"))
    html = response.content.decode()
    type_id = JobType.objects.get(name=TYPE_NAME).pk
    assert f"?type={type_id}&amp;status=4" in html and "Failed&nbsp;1" in html and "Pending&nbsp;1" in html
    assert "90 s" in html and "3 (default)" in html
    grouped = [q for q in ctx.captured_queries if "GROUP BY" in q["sql"].upper()]
    assert len(grouped) == 1  # one query for every type on the page


def test_job_type_settings_are_editable(admin_client) -> None:
    jt = JobType.objects.create(name="Editable")
    jobtypes.get_type("Editable", using="default")  # cached by a worker
    url = reverse("admin:django_sqlqueue_jobtype_change", args=[jt.pk])
    page = admin_client.get(url).content.decode()
    assert 'name="max_attempts"' in page and 'name="name"' not in page  # the name is fixed
    response = admin_client.post(url, {"description": "d", "max_attempts": "7", "backoff_base_seconds": "2",
                                       "backoff_max_seconds": "30", "timeout_seconds": "60",
                                       "lease_seconds": "15", "paused": "on"})
    assert response.status_code == 302
    jt.refresh_from_db()
    assert (jt.max_attempts, jt.timeout_seconds, jt.lease_seconds, jt.paused) == (7, 60, 15, True)
    assert jobtypes.get_type("Editable", using="default").max_attempts == 7  # the cache was cleared


def test_pause_and_resume_job_types(admin_client) -> None:
    jt = JobType.objects.create(name="Pausable")
    url = reverse("admin:django_sqlqueue_jobtype_changelist")
    response = admin_client.post(url, {"action": "pause_types", "index": "0", "_selected_action": [jt.pk]},
                                 follow=True)
    jt.refresh_from_db()
    assert jt.paused and "1 job type paused." in messages_of(response)
    job = Job.objects.enqueue("Pausable", {}, queue="pausable")
    assert Job.objects.claim("w", 1, queues=["pausable"]) == []  # paused types are not claimed
    admin_client.post(url, {"action": "resume_types", "index": "0", "_selected_action": [jt.pk]})
    jt.refresh_from_db()
    assert not jt.paused
    jobtypes.clear_cache()
    assert [j.pk for j in Job.objects.claim("w", 1, queues=["pausable"])] == [job.pk]
    assert list(LogEntry.objects.filter(object_id=str(jt.pk)).values_list("change_message", flat=True)) == [
        "Resumed", "Paused"]


def test_pausing_a_type_needs_pause_job(client) -> None:
    jt = JobType.objects.create(name="Guarded")
    client.force_login(user_with("view_jobtype", "change_jobtype", username="typeeditor"))
    url = reverse("admin:django_sqlqueue_jobtype_changelist")
    client.post(url, {"action": "pause_types", "index": "0", "_selected_action": [jt.pk]})
    jt.refresh_from_db()
    assert not jt.paused
    page = client.get(reverse("admin:django_sqlqueue_jobtype_change", args=[jt.pk])).content.decode()
    assert 'name="paused"' not in page  # read-only without pause_job


# ----- workers ----------------------------------------------------------------------------------------
def test_worker_list_flags_stale_heartbeats(admin_client) -> None:
    make_worker("w-fresh")
    make_worker("w-stale", heartbeat_age=600)
    make_worker("w-gone", stopped=True)
    make_job(Status.PROCESSING, worker="w-fresh")
    url = reverse("admin:django_sqlqueue_worker_changelist")
    html = admin_client.get(url).content.decode()
    for name, state in [("w-fresh", "alive"), ("w-stale", "stale"), ("w-gone", "stopped")]:
        row = re.search(rf"<tr.*?{name}.*?</tr>", html, re.S)
        assert row and f'sqlqueue-{state}"' in row.group(0), name
    fresh_row = re.search(r"<tr.*?w-fresh.*?</tr>", html, re.S).group(0)
    assert "worker=w-fresh&amp;status=2" in fresh_row and ">1</a>" in fresh_row
    stale = admin_client.get(url + "?state=stale")
    assert [w.name for w in stale.context["cl"].result_list] == ["w-stale"]
    alive = admin_client.get(url + "?state=alive")
    assert [w.name for w in alive.context["cl"].result_list] == ["w-fresh"]
    assert admin_client.get(reverse("admin:django_sqlqueue_worker_add")).status_code == 403


def test_the_dashboard_json_gives_every_number_the_page_marks(admin_client, client) -> None:
    """The auto-refresh writes these values into the marked elements: each key the page marks is in the
    JSON with the text the page shows, and the shape changes when a row appears."""
    import html
    import re

    from django_sqlqueue.models import Job
    from tests.test_admin_support import make_job, make_worker

    due = make_job(queue="emails")
    make_job(Status.FAILED, queue="reports")
    # Ages in hours, not seconds: the page and the JSON are two requests, a second or more apart on a
    # busy machine ("0 seconds" then "1 second" is no drift between them).
    Job.objects.filter(pk=due.pk).update(scheduled_for=timezone.now() - timedelta(hours=2))
    make_worker("w-1", queues=["emails"], heartbeat_age=2 * 3600 + 30)
    page = admin_client.get(reverse("admin:django_sqlqueue_dashboard")).content.decode()
    marked = dict(re.findall(r'data-sqlqueue-value="([^"]+)"[^>]*>([^<]*)<', page))
    data = admin_client.get(reverse("admin:django_sqlqueue_dashboard_json")).json()
    assert len(marked) > 20
    for key, text in marked.items():
        assert data["values"][html.unescape(key)] == html.unescape(text).strip(), key
    shape = re.search(r'data-shape="([0-9a-f]+)"', page).group(1)
    assert data["shape"] == shape
    make_job(queue="emails")  # a number changes, not the rows
    again = admin_client.get(reverse("admin:django_sqlqueue_dashboard_json")).json()
    assert again["shape"] == shape and again["values"]["queue:emails:total"] == "2"
    make_job(queue="sms")  # a new row: the page must reload
    assert admin_client.get(reverse("admin:django_sqlqueue_dashboard_json")).json()["shape"] != shape
    assert Job.objects.count() == 4
    assert client.get(reverse("admin:django_sqlqueue_dashboard_json")).status_code == 302  # to the login
