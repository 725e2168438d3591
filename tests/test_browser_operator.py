"""Issue 18 in a real headless Chromium: auto-refresh (opt-in, paused while the operator works),
the job list fitting 1,400 px, error contrast in dark mode, and the screenshots in docs/admin.md.

The screenshots go to ``test-artifacts/``; with ``SQLQUEUE_DOC_SCREENSHOTS=1`` also to ``docs/img/``
(light and dark), which is how the pictures in docs/admin.md are made.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from django_sqlqueue.models import Job, Worker
from django_sqlqueue.states import Status
from tests.test_admin_support import make_job, make_worker
from tests.test_browser_admin import (  # noqa: F401  (fixtures)
    ARTIFACTS,
    fast_password_hasher,
    fresh_admin_caches,
    login,
    operator_data,
    playwright_sync,
    pytestmark,
)

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def open_page(browser, *, width: int = 1400, dark: bool = False):
    context = browser.new_context(viewport={"width": width, "height": 900},
                                  color_scheme="dark" if dark else "light")
    context.set_default_timeout(60_000)  # a bound for a loaded CI machine, not a speed
    return context.new_page()


def picture(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"operator-{name}.png"))
    if os.environ.get("SQLQUEUE_DOC_SCREENSHOTS"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"{name}.png"))


@pytest.fixture
def stuck_data(operator_data):  # noqa: F811  (the imported fixture)
    orphan = make_job(Status.PROCESSING, queue="emails", worker="web-1/6")
    make_worker("web-1/6", stopped=True)
    make_job(queue="reports")
    Job.objects.filter(queue="reports").update(scheduled_for=timezone.now() - timedelta(minutes=5))
    make_worker("w-emails", queues=["emails"])
    Worker.objects.filter(name="worker-a").update(queues=["emails", "flaky", "default"])  # nobody: reports
    return {**operator_data, "orphan": orphan}


def test_auto_refresh_is_opt_in_and_pauses_while_a_row_is_selected(browser, live_server, stuck_data) -> None:
    page = open_page(browser)
    login(page, live_server)
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/dashboard/")
    box = page.locator("#sqlqueue-autorefresh")
    assert box.get_attribute("data-state") == "off"
    page.evaluate("window.__marker = 1")
    before = int(page.locator("[data-sqlqueue-value='unfinished']").inner_text())
    page.select_option("#sqlqueue-autorefresh-every", "5")
    page.mouse.move(0, 0)
    make_job(queue="emails")  # a number changes, not the rows: written in place from the JSON
    page.wait_for_function("document.querySelector(\"[data-sqlqueue-value='unfinished']\").textContent === "
                           f"'{before + 1}'", timeout=60_000)
    assert page.evaluate("window.__marker") == 1  # no reload
    assert page.locator("[data-sqlqueue-value='queue:emails:total']").inner_text() == str(
        Job.objects.filter(queue="emails").count())
    make_job(queue="brand-new")  # a new row: the page reloads itself
    page.wait_for_function("window.__marker === undefined", timeout=60_000)
    page.wait_for_selector("#sqlqueue-autorefresh[data-state='on']")  # and stays on (kept per page)
    assert "brand-new" in page.locator("#sqlqueue-by-queue").inner_text()
    # Off again before leaving: a reload due while the next page loads aborted that navigation
    # (net::ERR_ABORTED) whenever the job list took longer than the seconds left, on a loaded machine.
    page.select_option("#sqlqueue-autorefresh-every", "0")
    # the job list: off there until chosen; a selected row pauses it
    page.goto(f"{live_server.url}/admin/django_sqlqueue/job/")
    assert page.locator("#sqlqueue-autorefresh").get_attribute("data-state") == "off"
    page.select_option("#sqlqueue-autorefresh-every", "5")
    page.evaluate("window.__marker = 2")
    page.locator("#result_list input.action-select").first.check()
    page.wait_for_selector("#sqlqueue-autorefresh[data-state='paused']")
    # The state may read "paused" already for the input just made ("you are using the page"); the reason
    # becomes "row selected" at the control's next tick (it failed read at once, over TDS under load).
    page.wait_for_function("document.querySelector('.sqlqueue-autorefresh-status').textContent"
                           ".includes('row selected')", timeout=60_000)
    page.wait_for_timeout(7_000)  # longer than the interval: still the same page, selection kept
    assert page.evaluate("window.__marker") == 2
    assert page.locator("#result_list input.action-select:checked").count() == 1
    page.locator("#result_list input.action-select").first.uncheck()
    page.mouse.move(0, 0)
    page.wait_for_function("window.__marker === undefined", timeout=60_000)


def test_job_list_fits_1400_px_and_error_text_is_readable_in_dark_mode(browser, live_server, stuck_data) -> None:
    """At 1,400 px with the admin's navigation sidebar folded (its « button; the admin remembers it),
    the filter column stays and every list column shows without scrolling sideways."""
    for dark in (False, True):
        page = open_page(browser, dark=dark)
        page.context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
        login(page, live_server)
        page.goto(f"{live_server.url}/admin/django_sqlqueue/job/")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        # and the table itself fits its box (Django scrolls a wider one inside .results)
        assert page.evaluate("(() => { const r = document.querySelector('.results');"
                             " return r.scrollWidth <= r.clientWidth; })()")
        color = page.evaluate("getComputedStyle(document.querySelector('.sqlqueue-error-excerpt')).color")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert contrast(color, background) >= 4.5, (dark, color, background)
        suffix = "dark" if dark else "light"
        picture(page, f"job-list-{suffix}")
        page.goto(f"{live_server.url}/admin/django_sqlqueue/job/dashboard/")
        assert "orphaned" in page.locator("#sqlqueue-workers").inner_text()
        assert "reports" in page.locator("#sqlqueue-unserved").inner_text()
        picture(page, f"dashboard-{suffix}")
        page.goto(f"{live_server.url}/admin/django_sqlqueue/job/failures/")
        assert "SMTPError" in page.locator("#sqlqueue-failure-groups").inner_text()
        picture(page, f"failures-{suffix}")
        page.goto(f"{live_server.url}/admin/django_sqlqueue/job/{stuck_data['orphan'].pk}/change/")
        assert "Orphaned: worker web-1/6 stopped" in page.locator(".field-diagnosis").inner_text()
        assert page.locator("#sqlqueue-job-actions button[value=requeue]").count() == 1
        picture(page, f"job-page-{suffix}")
        page.context.close()


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two ``rgb(...)`` / ``rgba(...)`` colours."""
    def lum(css: str) -> float:
        parts = [float(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
        lin = [(c / 255 / 12.92) if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in parts]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    a, b = sorted((lum(fg), lum(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)
