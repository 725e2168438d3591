"""Issue 27: the job list sorts by priority, attempts, scheduled time and finish time.

Id and finish time are orders an index of the whole table serves (the primary key, the (finished_at,
status) index): sorted in full. Priority, attempts and scheduled time have no index of their own (each
would cost every enqueue, claim and finish a write): the list sorts the newest ``SORT_WINDOW`` jobs
the filters match, and says so.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_sqlqueue.admin import site as admin_site
from django_sqlqueue.models import Job
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    changelist_url,
    fast_password_hasher,
    fresh_admin_caches,
    ids_in,
    make_job,
)

pytestmark = pytest.mark.django_db

#: Column numbers in ``?o=`` (Django counts the action checkbox as column 0).
COLUMN = {name: i for i, name in enumerate(("action_checkbox", *admin_site.JobAdmin.list_display))}


def o(name: str, descending: bool = False) -> str:
    return f"{'-' if descending else ''}{COLUMN[name]}"


def test_the_sortable_columns_sort_the_list(admin_client) -> None:
    now = timezone.now()
    jobs = [make_job(Status.COMPLETED) for _ in range(4)]
    for job, (priority, attempts, due, finished) in zip(jobs, [(5, 2, 3, 1), (1, 4, 1, 4), (9, 1, 4, 2),
                                                               (3, 3, 2, 3)], strict=True):
        Job.objects.filter(pk=job.pk).update(priority=priority, attempt_num=attempts,
                                             scheduled_for=now - timedelta(minutes=10 - due),
                                             finished_at=now - timedelta(minutes=10 - finished))
    for job, worker in zip(jobs, ["w-b", "w-d", "w-a", "w-c"], strict=True):
        Job.objects.filter(pk=job.pk).update(worker=worker)
    a, b, c, d = (j.pk for j in jobs)
    expected = {"priority_col": [b, d, a, c], "attempts_col": [c, a, d, b], "scheduled": [b, d, a, c],
                "finished_col": [a, c, d, b]}
    for column, order in expected.items():
        assert ids_in(admin_client.get(changelist_url(o=o(column)))) == order, column
        assert ids_in(admin_client.get(changelist_url(o=o(column, True)))) == order[::-1], column
    # A column that is not sortable is not: its ?o= leaves the list in its own order (newest first),
    # though the workers' names would sort it c, a, d, b.
    assert ids_in(admin_client.get(changelist_url(o=o("worker")))) == [d, c, b, a]
    # By finish time, only finished jobs (an unfinished one has none), and the page says so.
    waiting = make_job(Status.PENDING)
    response = admin_client.get(changelist_url(o=o("finished_col", True)))
    assert ids_in(response) == [b, d, c, a] and waiting.pk not in ids_in(response)
    assert 'id="sqlqueue-finished-only"' in response.content.decode()
    assert response.context["cl"].older_url is None  # the walk by id has no place in this order


def test_an_order_without_an_index_sorts_the_newest_matches_and_says_so(admin_client, monkeypatch) -> None:
    monkeypatch.setattr(admin_site, "SORT_WINDOW", 3)
    jobs = [make_job(Status.ERROR) for _ in range(5)]
    other = make_job(Status.COMPLETED)  # the newest job, but not a match of the filter
    for job, priority in zip(jobs, [9, 8, 1, 2, 3], strict=True):
        Job.objects.filter(pk=job.pk).update(priority=priority, finished_at=timezone.now())
    response = admin_client.get(changelist_url(status=int(Status.ERROR), o=o("priority_col", True)))
    # The newest 3 Error jobs (priorities 1, 2, 3), highest first; the older 9 and 8 are outside the window.
    assert ids_in(response) == [jobs[4].pk, jobs[3].pk, jobs[2].pk]
    html = response.content.decode()
    assert 'id="sqlqueue-sort-window"' in html and "newest 3 jobs that match the filters" in html
    assert response.context["cl"].older_url is None  # the walk by id has no place in this order
    assert other.pk not in ids_in(response)
    # Sorted by finish time (an index order), the whole list and no note.
    response = admin_client.get(changelist_url(status=int(Status.ERROR), o=o("finished_col")))
    assert len(ids_in(response)) == 5 and 'id="sqlqueue-sort-window"' not in response.content.decode()
    # The window is the page's: "select all" in that order still means every job the filters match.
    url = changelist_url(status=int(Status.ERROR), o=o("priority_col", True))
    admin_client.post(url, {"action": "pause", "index": "0", "select_across": "1",
                            "_selected_action": [str(jobs[4].pk)]})
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {Status.PAUSED}


def test_the_finish_time_order_reads_its_index() -> None:
    """On PostgreSQL and SQLite the list's query sorted by finish time walks the finished_at index and
    stops at the page (no sort of every job, the unfinished ones included): the planner's own EXPLAIN."""
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip("no plan to read over TDS (Babelfish)")
    for _ in range(30):
        make_job(Status.COMPLETED)
    Job.objects.enqueue_many([JobSpec("AdminTest", {"i": i}) for i in range(500)])  # unfinished: no finish time
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    # The admin's query in that order: the finished jobs, newest finish first, id breaking ties.
    sql, params = (Job.objects.filter(finished_at__isnull=False).order_by("-finished_at", "-pk")[:100]
                   .query.sql_with_params())
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A small table: the planner would sort 30 rows rather than walk an index. Ask whether an
            # index serves the order at all: with sorts and bitmap scans priced out, a Sort node left
            # in the plan means none does.
            cursor.execute("SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_sort = off")
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = " ".join(r[0] for r in cursor.fetchall())
            cursor.execute("RESET enable_seqscan; RESET enable_bitmapscan; RESET enable_sort")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            plan = " ".join(r[-1] for r in cursor.fetchall())
    assert "sqlqueue_job_finished" in plan, plan
    # No sort of every row: at most the ties of one finish time (PostgreSQL's incremental sort,
    # SQLite's "RIGHT PART OF ORDER BY").
    assert not re.search(r"(?<!Incremental )Sort  \(cost", plan) and "TEMP B-TREE FOR ORDER BY" not in plan, plan
