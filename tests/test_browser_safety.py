"""Issue 27 in a real headless Chromium: what a view-only user can (not) learn, refusals with no rows,
crafted ids, the pages at 390 px, and the badges' contrast in light and dark.

The colours are checked twice: from ``admin.css`` itself (no browser needed) and as Chromium computes
them on the dashboard, light and dark.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from django_sqlqueue import sensitive
from django_sqlqueue.models import Job, JobType, Schedule
from django_sqlqueue.states import Status
from tests.test_admin_support import make_job
from tests.test_browser_admin import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    fast_password_hasher,
    fresh_admin_caches,
    login,
    operator_data,
    playwright_sync,
    pytestmark,
)
from tests.test_browser_operator import contrast, picture
from tests.test_browser_operator import open_page as _open_page

SECRET = "sk_live_CALLBACK"
CSS = Path(__file__).resolve().parent.parent / "django_sqlqueue" / "static" / "django_sqlqueue" / "admin.css"
#: Every badge class of the app: the statuses, and the workers' states.
BADGES = ["pending", "processing", "running", "error", "failed", "completed", "partiallycompleted", "cancelled",
          "paused", "waiting", "terminated", "alive", "stale", "stopped"]


@pytest.fixture
def secrets(operator_data, monkeypatch):  # noqa: F811  (the imported fixture)
    """A view-only staff user; a schedule and a batch callback whose payloads hold a key marked sensitive."""
    from django_sqlqueue.workflows import batch

    monkeypatch.setattr(sensitive, "_keys", {})
    sensitive.mark_sensitive("CrmSync", "api_key")
    sensitive.mark_sensitive("Notify", "api_key")
    viewer = User.objects.create_user("viewer", password="viewer-password", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(
        content_type__app_label="django_sqlqueue",
        codename__in=["view_job", "view_jobtype", "view_worker", "view_schedule", "view_batch", "view_queuepause"]))
    JobType.objects.get_or_create(name="CrmSync")
    JobType.objects.get_or_create(name="Notify")
    schedule = Schedule.objects.create(name="crm-sync", job_type="CrmSync", every_seconds=60, queue="crm",
                                       payload={"api_key": SECRET, "account": "acme"},
                                       next_run_at=timezone.now() + timedelta(minutes=1))
    with batch(on_success=("Notify", {"api_key": SECRET}), description="invoices") as b:
        pass
    return {**operator_data, "schedule": schedule, "batch": b}


def open_page(browser, **options):
    """A page with a minute for each step: the first request of a live server on a loaded 2-core machine
    took more than the 20 s the other browser tests allow."""
    page = _open_page(browser, **options)
    page.set_default_timeout(60_000)
    return page


def login_as(page, live_server, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")


def test_a_view_only_user_learns_no_secret_from_schedules_or_batches(browser, live_server, secrets) -> None:
    page = open_page(browser)
    login_as(page, live_server, "viewer", "viewer-password")
    base = f"{live_server.url}/admin/django_sqlqueue"
    page.goto(f"{base}/schedule/{secrets['schedule'].pk}/change/")
    assert "acme" in page.content() and SECRET not in page.content()
    assert sensitive.MASK in page.locator(".field-payload_masked").inner_text()
    page.screenshot(path=str(ARTIFACTS / "safety-schedule-masked.png"), full_page=True)
    page.goto(f"{base}/schedule/")
    assert "crm-sync" in page.locator("#result_list").inner_text() and SECRET not in page.content()
    # The batch list answers no yes/no question about the callback's payload: every probe is refused alike.
    answers = []
    for probe in (f"on_success__icontains={SECRET}", "on_success__icontains=sk_live_WRONG",
                  "on_success__regex=sk_live_.*"):
        response = page.goto(f"{base}/batch/?{probe}")
        assert response.status == 400
        assert page.locator("#result_list").count() == 0
        answers.append(page.locator("#sqlqueue-refused").inner_text().split(" is not")[1])
    assert len(set(answers)) == 1 and "filter of this list" in answers[0]
    page.goto(f"{base}/batch/")
    assert "invoices" in page.locator("#result_list").inner_text()
    page.context.close()


def test_a_refused_filter_shows_the_error_and_nothing_to_select(browser, live_server, secrets) -> None:
    page = open_page(browser)
    login_as(page, live_server, "viewer", "viewer-password")
    for query in ("status=Error", "overdue=2", "p=101", "e=1"):
        response = page.goto(f"{live_server.url}/admin/django_sqlqueue/job/?{query}")
        assert response.status == 400, query
        assert page.locator("#sqlqueue-refused").is_visible(), query
        assert page.locator("#result_list, input.action-select, #action-toggle").count() == 0, query
    page.screenshot(path=str(ARTIFACTS / "safety-refused.png"), full_page=True)
    page.context.close()


def test_crafted_selected_ids_are_refused_with_a_message(browser, live_server, secrets) -> None:
    page = open_page(browser)
    login(page, live_server)  # the superuser: every action is offered
    job = secrets["failed"][0]
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/?status=4")
    for bad in ("abc", "99999999999999999999999"):
        # The POST's answer is a new page: wait for it (wait_for_load_state alone may see the old one,
        # which is loaded already, and read it while the new one replaces it).
        with page.expect_navigation():
            page.evaluate("""bad => {
                const box = document.querySelector('#result_list input.action-select');
                box.checked = true; box.value = bad;
                document.querySelector('select[name=action]').value = 'retry_now';
                document.querySelector('button[name=index]').click();
            }""", bad)
        page.wait_for_load_state()
        assert "Nothing was changed" in page.locator("ul.messagelist").inner_text(), bad
        assert page.locator("#result_list").count() == 1  # back on the list, not a server error
    assert Job.objects.get(pk=job.pk).state is Status.FAILED
    page.context.close()


def test_walking_older_pages_past_the_numbered_ones(browser, live_server, secrets, monkeypatch) -> None:
    from django_sqlqueue.admin.filters import CheapPaginator
    from django_sqlqueue.admin.site import JobAdmin

    monkeypatch.setattr(JobAdmin, "list_per_page", 5)
    monkeypatch.setattr(CheapPaginator, "count_cap", 6)
    expected = list(Job.objects.order_by("-id").values_list("id", flat=True))
    page = open_page(browser)
    login_as(page, live_server, "viewer", "viewer-password")
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/")
    seen: list[int] = []
    while True:
        seen += [int(t) for t in page.locator("#result_list tbody th a").all_inner_texts()]
        older = page.locator("a.sqlqueue-older")
        if not older.count():
            break
        older.click()
        page.wait_for_url(re.compile(r"before=\d+"))
    assert seen == expected and len(expected) > 12  # past page 2, the last numbered one
    page.context.close()


# ----- 390 px ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_failures_dashboard_and_throughput_fit_390_px(browser, live_server, secrets, dark) -> None:
    page = open_page(browser, width=390, dark=dark)
    login(page, live_server)
    widths = {}
    for name in ("failures", "dashboard", "throughput"):
        page.goto(f"{live_server.url}/admin/django_sqlqueue/job/{name}/")
        widths[name] = page.evaluate("document.documentElement.scrollWidth")
        if name == "failures":
            for label in ("Retry all", "Discard all"):
                box = page.get_by_role("button", name=label).first.bounding_box()
                assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, (label, box)
        if name == "failures":  # docs/img/failures-390-*.png with SQLQUEUE_DOC_SCREENSHOTS=1
            picture(page, f"failures-390-{'dark' if dark else 'light'}")
    assert all(w <= 390 for w in widths.values()), widths


# ----- paused queues --------------------------------------------------------------------------------------
def superuser_page(browser, live_server, width: int) -> tuple[object, str]:
    """A page logged in as the superuser at ``width`` px, and the app's admin URL."""
    page = open_page(browser, width=width)
    login(page, live_server)
    return page, f"{live_server.url}/admin/django_sqlqueue"



@pytest.mark.parametrize("width", [1400, 390])
def test_pause_a_queue_see_it_on_the_dashboard_and_resume_it(browser, live_server, secrets, width) -> None:
    page, base = superuser_page(browser, live_server, width)
    page.goto(f"{base}/queuepause/add/")
    page.fill("#id_queue", "emails")
    page.fill("#id_reason", "provider down")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert "claiming its jobs at" in page.locator("ul.messagelist").inner_text()
    assert "provider down" in page.locator("#result_list").inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    if width == 1400:  # docs/img/paused-queues.png with SQLQUEUE_DOC_SCREENSHOTS=1
        picture(page, "paused-queues")
    assert Job.objects.claim("w-browser", 5, queues=["emails"]) == []  # the claim passes over it
    page.goto(f"{base}/job/dashboard/")
    badge = page.locator("#sqlqueue-by-queue a.sqlqueue-paused")
    assert badge.count() == 1 and badge.inner_text() == "queue paused"
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    badge.click()
    page.wait_for_url(re.compile(r"/queuepause/emails/change/"))
    assert "ops" in page.locator(".field-paused_by").inner_text()
    # The view-only user sees the pause, and no action to end it.
    viewer = open_page(browser, width=width)
    login_as(viewer, live_server, "viewer", "viewer-password")
    viewer.goto(f"{base}/queuepause/")
    assert "emails" in viewer.locator("#result_list").inner_text()
    assert viewer.locator("select[name=action]").count() == 0
    viewer.context.close()
    # The superuser resumes it with the action.
    page.goto(f"{base}/queuepause/")
    page.locator("#result_list input.action-select").first.check()
    page.select_option("select[name=action]", "resume_queues")
    with page.expect_navigation():
        page.locator("button[name=index]").click()
    assert "1 queue resumed." in page.locator("ul.messagelist").inner_text()
    assert not Job.objects.paused_queues()
    page.context.close()


# ----- enqueue a one-off job; a batch's progress ------------------------------------------------------------
@pytest.mark.parametrize("width", [1400, 390])
def test_enqueue_a_one_off_job_and_see_a_batchs_progress(browser, live_server, secrets, width) -> None:
    page, base = superuser_page(browser, live_server, width)
    page.goto(f"{base}/job/")
    with page.expect_navigation():
        page.get_by_role("link", name="Enqueue a job").click()
    page.select_option("#id_job_type", "CrmSync")
    page.fill("#id_queue", "crm")
    page.fill("#id_payload", "{not json")
    with page.expect_navigation():
        page.click("input[type=submit]")
    assert "Not JSON" in page.content() and not Job.objects.filter(queue="crm").exists()
    if width == 1400:  # docs/img/enqueue-form.png with SQLQUEUE_DOC_SCREENSHOTS=1
        picture(page, "enqueue-form")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.fill("#id_payload", '{"account": "acme"}')
    with page.expect_navigation():
        page.click("input[type=submit]")
    job = Job.objects.get(queue="crm")
    assert job.payload == {"account": "acme"} and page.url.endswith(f"/job/{job.pk}/change/")
    assert "enqueued in queue crm" in page.locator("ul.messagelist").inner_text()
    from django_sqlqueue.workflows import batch

    with batch(description="exports") as exports:
        exports.enqueue("CrmSync")
        exports.enqueue("CrmSync")
    page.goto(f"{base}/batch/{exports.pk}/change/")
    assert page.locator("progress.sqlqueue-progress").count() == 1
    assert "0 of 2 members finished (0%)" in page.content()
    if width == 1400:  # docs/img/batch-page.png with SQLQUEUE_DOC_SCREENSHOTS=1
        picture(page, "batch-page")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.context.close()


# ----- badge contrast -------------------------------------------------------------------------------------
def css_backgrounds() -> dict[str, str]:
    text = CSS.read_text(encoding="utf-8")
    found = {}
    for badge in BADGES:
        match = re.search(rf"\.sqlqueue-{badge}\b[^{{]*\{{\s*background:\s*(#[0-9a-fA-F]{{6}})", text)
        assert match, badge
        found[badge] = match.group(1)
    return found


def rgb(hex_colour: str) -> str:
    return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))


def test_every_badge_colour_in_the_css_has_4_5_to_1_with_white_text() -> None:
    ratios = {badge: round(contrast("rgb(255, 255, 255)", rgb(colour)), 2) for badge, colour in css_backgrounds().items()}
    assert all(r >= 4.5 for r in ratios.values()), ratios


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_badges_as_chromium_draws_them_have_4_5_to_1(browser, live_server, secrets, dark) -> None:
    for status in (Status.PAUSED, Status.PARTIALLY_COMPLETED, Status.TERMINATED):
        make_job(status)
    page = open_page(browser, dark=dark)
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/dashboard/")
    pairs = page.evaluate("""() => [...document.querySelectorAll('.sqlqueue-badge')].map(b => {
        const s = getComputedStyle(b);
        let bg = s.backgroundColor, node = b;
        while (/rgba\\(0, 0, 0, 0\\)|transparent/.test(bg) && node.parentElement) {
            node = node.parentElement; bg = getComputedStyle(node).backgroundColor; }
        return [b.className, s.color, bg, s.opacity];
    })""")
    assert len(pairs) > 10
    low = [(cls, fg, bg, round(contrast(fg, bg), 2)) for cls, fg, bg, opacity in pairs
           if contrast(fg, bg) < 4.5 or float(opacity) < 1]
    assert low == [], low
