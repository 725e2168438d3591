"""The schedules admin: bad input refused by the form, next runs shown, enable / disable, run now (with
its permission), and the ``queue_schedules`` command."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.urls import reverse

from django_sqlqueue import schedules
from django_sqlqueue.models import Job, Schedule

ADD = reverse("admin:django_sqlqueue_schedule_add")
LIST = reverse("admin:django_sqlqueue_schedule_changelist")
TASK = "testproject.testjobs.tasks.tick"


def form(**overrides: object) -> dict[str, object]:
    data = {"name": "digest", "enabled": "on", "job_type": "test.Noop", "task": "", "payload": "{}",
            "queue": "default", "priority": "0", "cron": "0 7 * * *", "timezone": "Europe/Paris",
            "every_seconds": "", "misfire": "run_once", "misfire_limit": "10", "misfire_grace_seconds": "60",
            "expires_after_seconds": ""}
    data.update(overrides)
    return data


BAD_FORMS = {
    "invalid cron": form(cron="0 25 * * *"),
    "6 fields": form(cron="0 0 7 * * *"),
    "unknown time zone": form(timezone="Europe/Atlantis"),
    "unknown job type": form(job_type="no.such.Type"),
    "unknown task": form(job_type="", task="testproject.testjobs.tasks.missing"),
    "both": form(every_seconds="60"),
    "neither": form(cron=""),
    "both targets": form(task=TASK),
    "interval below 1 s": form(cron="", every_seconds="0"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted(BAD_FORMS))
def test_the_form_refuses_what_a_worker_could_not_run(admin_client, case):
    response = admin_client.post(ADD, BAD_FORMS[case])
    assert response.status_code == 200  # the form again, with its errors
    assert response.context["adminform"].form.errors or response.context["errors"]
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_a_good_form_creates_a_schedule_with_its_next_run_and_the_page_shows_five(admin_client):
    response = admin_client.post(ADD, form())
    assert response.status_code == 302, response.content.decode()[:2000]
    s = Schedule.objects.get(name="digest")
    now = schedules.db_clock("default")
    assert now < s.next_run_at <= now + timedelta(days=1) and not s.declared
    page = admin_client.get(reverse("admin:django_sqlqueue_schedule_change", args=[s.pk])).content.decode()
    assert page.count("Europe/Paris)</li>") == 5 and "07:00 CE" in page
    assert "digest" in admin_client.get(LIST).content.decode()


@pytest.mark.django_db
def test_an_edit_that_changes_the_timing_moves_next_run_and_keeps_what_workers_wrote(admin_client):
    admin_client.post(ADD, form())
    s = Schedule.objects.get(name="digest")
    Schedule.objects.filter(pk=s.pk).update(last_run_at=s.next_run_at - timedelta(days=1))  # a worker's write
    url = reverse("admin:django_sqlqueue_schedule_change", args=[s.pk])
    assert admin_client.post(url, form(cron="", every_seconds="30")).status_code == 302
    s2 = Schedule.objects.get(pk=s.pk)
    assert s2.every_seconds == 30 and s2.next_run_at < s.next_run_at
    assert s2.last_run_at == s.next_run_at - timedelta(days=1)


@pytest.mark.django_db
def test_disable_and_enable_actions(admin_client):
    schedules.sync_schedules(entries={"a": {"type": "test.Noop", "every": 60}},
                             now=schedules.db_clock("default") - timedelta(days=7))
    s = Schedule.objects.get(name="a")
    admin_client.post(LIST, {"action": "disable_schedules", "_selected_action": [s.pk]})
    assert not Schedule.objects.get(pk=s.pk).enabled
    admin_client.post(LIST, {"action": "enable_schedules", "_selected_action": [s.pk]})
    s2 = Schedule.objects.get(pk=s.pk)
    # Enabled again from now: the week it was off does not count as missed ticks.
    assert s2.enabled and s2.next_run_at > schedules.db_clock("default")


@pytest.mark.django_db
def test_run_now_needs_its_permission(client):
    schedules.sync_schedules(entries={"a": {"type": "test.Noop", "every": 3600}})
    s = Schedule.objects.get(name="a")
    user = User.objects.create_user("op", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=["view_schedule", "change_schedule"]))
    client.login(username="op", password="pw")
    client.post(LIST, {"action": "run_schedules_now", "_selected_action": [s.pk]})
    assert not Job.objects.exists()  # not offered to this user: nothing enqueued
    user.user_permissions.add(Permission.objects.get(codename="run_schedule"))
    user = User.objects.get(pk=user.pk)
    client.force_login(user)
    response = client.post(LIST, {"action": "run_schedules_now", "_selected_action": [s.pk]}, follow=True)
    job = Job.objects.get()
    assert f"job {job.pk}" in response.content.decode()
    s2 = Schedule.objects.get(pk=s.pk)
    assert s2.last_job_id == job.pk and s2.next_run_at == s.next_run_at


@pytest.mark.django_db
@pytest.mark.parametrize(("params", "status"), [
    ({"last_error__regex": "(a+)+$"}, 400),  # exponential backtracking, in the web process on SQLite
    ({"payload__icontains": "x"}, 400),  # a scan of every payload
    ({"name__startswith": "a"}, 400),
    ({"enabled": "1", "task__iregex": "x"}, 400),  # a declared filter does not carry another along
    ({"enabled__exact": "1"}, 200),
    ({"misfire__exact": "skip"}, 200),
])
def test_a_view_only_user_filters_schedules_by_the_declared_filters_only(client, params, status):
    schedules.sync_schedules(entries={"a": {"type": "test.Noop", "every": 3600}})
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_schedule"))
    client.force_login(user)
    assert client.get(LIST, params).status_code == status


@pytest.mark.django_db
def test_queue_schedules_command_prints_next_runs_and_last_job_status():
    schedules.sync_schedules(entries={"digest": {"type": "test.Noop", "cron": "0 7 * * *", "timezone": "UTC"},
                                      "tick": {"task": TASK, "every": 30}})
    job_id = schedules.run_now(Schedule.objects.get(name="tick"))
    out = StringIO()
    call_command("queue_schedules", "--next", "3", stdout=out)
    text = out.getvalue()
    assert "digest" in text and text.count("07:00:00") == 3
    assert f"job {job_id} Pending" in text


@pytest.mark.django_db
def test_the_list_shows_last_jobs_in_one_query_and_a_purged_one_as_gone(admin_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def page_queries(n: int) -> tuple[int, str]:
        schedules.sync_schedules(entries={f"s{i}": {"type": "test.Noop", "every": 60} for i in range(n)})
        for s in Schedule.objects.all():
            schedules.run_now(s)
        with CaptureQueriesContext(connection) as ctx:
            html = admin_client.get(LIST).content.decode()
        return len(ctx.captured_queries), html

    few, _ = page_queries(2)
    many, html = page_queries(6)
    assert many == few  # no query per row
    assert html.count("sqlqueue-pending") == 6
    Job.objects.filter(pk=Schedule.objects.get(name="s0").last_job_id).delete()
    assert "purged" in admin_client.get(LIST).content.decode()
