"""The operator's admin in a real headless Chromium (Debian's ``chromium`` driven by Playwright).

Log in, filter Failed jobs with the status dropdown, select them all, run "Retry now" and see them
Pending; open a job and see its attempt history; open the dashboard from the admin index and see the
chart; open a job whose payload holds ``<script>`` and see it as text. A screenshot of each page goes
to ``test-artifacts/`` (git-ignored).

One Chromium serves a whole test module (tests/conftest.py ``chromium``), so Playwright's sync API
runs an event loop in this thread from the module's first browser test to its end, and Django would
refuse ORM calls from a thread with a running loop: DJANGO_ALLOW_ASYNC_UNSAFE is set, which is sound
here because the calls are plain synchronous code. The connections made meanwhile are the loop's own,
which pytest-django's per-test transaction never wraps: every browser test is therefore transactional
(``transaction=True``, rows flushed after each test; the ``browser`` fixture refuses any other), and
those connections are closed after each test.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.states import Status
from tests.test_admin_support import fast_password_hasher, fresh_admin_caches, make_job, make_worker  # noqa: F401

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("SQLQUEUE_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
XSS = "<script>window.__pwned = 1; alert('pwned')</script>"

playwright_sync = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
                       reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
]


@pytest.fixture
def operator_data(transactional_db):
    """A superuser, failed and other jobs, a job with two attempts, workers and an hour of throughput."""
    User.objects.create_superuser("ops", "ops@example.com", "ops-password")
    failed = [make_job(Status.FAILED, queue="emails", error=f"Traceback\nSMTPError: try {i}") for i in range(3)]
    others = [make_job(Status.COMPLETED), make_job(Status.CANCELLED), make_job(queue="emails")]
    JobType.objects.create(name="Flaky", max_attempts=3)
    history = Job.objects.enqueue("Flaky", {"to": "a@example.com"}, queue="flaky")
    first = Job.objects.claim("worker-a", 1, queues=["flaky"])[0]
    Job.objects.fail(first, "Traceback (most recent call last):\n  File \"send.py\"\nTimeoutError: smtp", retry_in=0)
    second = Job.objects.claim("worker-b", 1, queues=["flaky"])[0]
    Job.objects.complete(second, {"sent": True})
    now = timezone.now()
    for minutes_ago in range(1, 58, 2):  # something to draw
        for status in (Status.COMPLETED, Status.ERROR, Status.COMPLETED, Status.COMPLETED)[: 1 + minutes_ago % 4]:
            job = make_job(status, queue="chart")
            Job.objects.filter(pk=job.pk).update(finished_at=now - timedelta(minutes=minutes_ago))
    xss = make_job(Status.FAILED, payload={"html": XSS}, error=f"ValueError: {XSS}", queue="xss")
    make_worker("worker-a")
    make_worker("worker-b", heartbeat_age=900)
    return {"failed": failed, "others": others, "history": history, "xss": xss}


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1800, "height": 1000})
    context.set_default_timeout(60_000)  # a bound for a loaded CI machine, not a speed
    pg = context.new_page()
    pg.dialogs = []  # any alert() would mean a payload ran
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    return pg


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"admin-{name}.png"), full_page=True)


def login(page, live_server) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


def test_retry_failed_jobs_from_the_filtered_list(page, live_server, operator_data) -> None:
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/")
    shot(page, "1-job-list")
    # the status filter is a dropdown: pick Failed
    status_select = page.locator("#changelist-filter select").first
    status_select.select_option(label="Failed")
    page.wait_for_url("**/job/?status=4")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 4  # three SMTP failures and the <script> one
    assert page.locator("#result_list .sqlqueue-failed").count() == 4
    shot(page, "2-failed-filtered")
    # select them all, Retry now
    page.check("#action-toggle")
    page.select_option("select[name=action]", "retry_now")
    page.click("button[name=index]")
    page.wait_for_load_state()
    messages = page.locator("ul.messagelist").inner_text()
    assert "Retry now: 4 jobs changed." in messages
    shot(page, "3-after-retry")
    # they are Pending now
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/?status=1&queue=emails")
    assert page.locator("#result_list .sqlqueue-pending").count() == 4  # 3 retried + 1 that was Pending
    ids = {int(t) for t in page.locator("#result_list tbody th a").all_inner_texts()}
    assert {j.pk for j in operator_data["failed"]} <= ids
    shot(page, "4-now-pending")
    assert Job.objects.filter(pk__in=[j.pk for j in operator_data["failed"]], status_id=Status.PENDING).count() == 3
    assert page.dialogs == []


def test_job_page_shows_attempt_history(page, live_server, operator_data) -> None:
    login(page, live_server)
    job = operator_data["history"]
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/?queue=flaky")
    page.click(f"#result_list a[href*='/job/{job.pk}/change/']")
    page.wait_for_url(re.compile(rf"/job/{job.pk}/change/"))
    history = page.locator(".sqlqueue-attempts")
    assert history.locator("tbody tr.has_original, tbody tr.form-row").count() >= 2
    text = history.inner_text()
    assert "worker-a" in text and "worker-b" in text
    assert history.locator(".sqlqueue-error").count() >= 1 and history.locator(".sqlqueue-completed").count() == 1
    assert "a@example.com" in page.locator("pre.sqlqueue-json").first.inner_text()
    shot(page, "5-job-attempts")


def test_dashboard_from_the_admin_index_draws_the_chart(page, live_server, operator_data) -> None:
    login(page, live_server)
    page.click("#sqlqueue-dashboard-link a.section")
    page.wait_for_url("**/job/dashboard/")
    chart = page.locator("svg#sqlqueue-chart")
    assert chart.is_visible()
    assert chart.locator("rect").count() == 120
    box = chart.bounding_box()
    assert box and box["width"] > 300 and box["height"] > 80
    assert page.locator("svg#sqlqueue-chart rect.done[height]:not([height='0.0'])").count() > 5
    assert "emails" in page.locator("#sqlqueue-by-queue").inner_text()
    assert "stale" in page.locator("#sqlqueue-workers").inner_text()
    shot(page, "6-dashboard")
    # a count opens the list pre-filtered
    page.locator("#sqlqueue-by-queue a", has_text="emails").first.click()
    page.wait_for_url("**/job/?queue=emails")
    assert page.locator("#result_list tbody tr").count() == 4


def test_script_payload_renders_as_text(page, live_server, operator_data) -> None:
    login(page, live_server)
    job = operator_data["xss"]
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/{job.pk}/change/")
    assert "<script>window.__pwned = 1" in page.locator("pre.sqlqueue-json").inner_text()
    assert "ValueError: <script>" in page.locator("pre.sqlqueue-traceback").inner_text()
    assert page.evaluate("window.__pwned") is None
    shot(page, "7-script-payload")
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/?queue=xss")
    assert "<script>" in page.locator("#result_list .sqlqueue-error-excerpt").inner_text()
    assert page.evaluate("window.__pwned") is None and page.dialogs == []


def test_retry_at_form_job_types_and_workers(page, live_server, operator_data) -> None:
    login(page, live_server)
    job = operator_data["xss"]
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/{job.pk}/change/")
    page.click("#sqlqueue-job-actions button[value=retry_at]")
    page.wait_for_selector("#sqlqueue-retry-at-form")
    page.fill("#id_delay", "15")
    shot(page, "8-retry-at-form")
    page.click("#sqlqueue-retry-at-form input[type=submit]")
    page.wait_for_url(re.compile(rf"/job/{job.pk}/change/"))
    assert "Retry at: 1 job changed." in page.locator("ul.messagelist").inner_text()
    assert "Scheduled: due in 14" in page.locator(".field-diagnosis").inner_text()
    page.goto(f"{live_server.url}/admin/django_sqlqueue/jobtype/")
    assert "Failed" in page.locator("#result_list").inner_text()
    shot(page, "9-job-types")
    # worker-a's heartbeat is as fresh as a live worker's (a slow run outlasted the dead-after time since
    # the fixture wrote it: CI on Babelfish saw two stale badges); worker-b's is 15 minutes old.
    Worker.objects.filter(name="worker-a").update(last_heartbeat=timezone.now())
    page.goto(f"{live_server.url}/admin/django_sqlqueue/worker/")
    assert page.locator("#result_list .sqlqueue-stale").count() == 1
    shot(page, "10-workers")
