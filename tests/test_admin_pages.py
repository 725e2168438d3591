"""Admin pages: job list (columns, filters, search, paging, date hierarchy), job page, escaping."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_sqlqueue.admin.filters import CheapPaginator, distinct_values
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status
from testproject.notifications.models import EmailChannel, ResetPassword
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    change_url,
    changelist_url,
    fast_password_hasher,
    fresh_admin_caches,
    ids_in,
    make_job,
    make_worker,
)

pytestmark = pytest.mark.django_db

XSS = "<script>alert('x')</script>"


def test_list_columns_and_newest_first(admin_client) -> None:
    old = make_job(Status.FAILED, queue="emails", step="Send", worker="w-1")
    soon = make_job(scheduled_for=timezone.now() + timedelta(minutes=5))
    late = make_job(scheduled_for=timezone.now() - timedelta(minutes=7))
    running = make_job(Status.PROCESSING, worker="w-2")
    response = admin_client.get(changelist_url())
    assert response.status_code == 200
    assert ids_in(response) == [running.pk, late.pk, soon.pk, old.pk]
    html = response.content.decode()
    assert 'class="sqlqueue-badge sqlqueue-failed">Failed<' in html
    assert 'class="sqlqueue-badge sqlqueue-processing">Processing<' in html
    assert "3 / 3" in html and "1 / 3" in html  # attempts n / max (the settings' default max)
    assert re.search(r'sqlqueue-hint">in 4.minutes', html)
    assert re.search(r'sqlqueue-overdue">overdue 7.minutes', html)
    assert "ValueError: boom" in html  # the error excerpt
    assert re.search(r"running \d+ seconds?", html)  # duration of a running job (never "0 minutes"; a busy machine: not always 0)
    assert "4 jobs" in html


@pytest.mark.parametrize(("param", "value", "expect"), [
    ("status", int(Status.FAILED), {"failed"}),
    ("queue", "emails", {"failed"}),
    ("step", "Send", {"failed"}),
    ("step", "-", {"pending", "overdue", "running", "expired", "completed"}),
    ("worker", "w-2", {"running"}),
    ("overdue", "1", {"overdue"}),
    ("lease_expired", "1", {"expired"}),
    ("has_error", "1", {"failed"}),
])
def test_filters(admin_client, param, value, expect) -> None:
    jobs = {
        "failed": make_job(Status.FAILED, queue="emails", step="Send", worker="w-1"),
        "pending": make_job(scheduled_for=timezone.now() + timedelta(hours=1)),
        "overdue": make_job(scheduled_for=timezone.now() - timedelta(minutes=3)),
        "running": make_job(Status.PROCESSING, worker="w-2"),
        "expired": make_job(Status.PROCESSING, worker="w-dead"),
        "completed": make_job(Status.COMPLETED),
    }
    Job.objects.filter(pk=jobs["expired"].pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    make_worker("w-2")
    response = admin_client.get(changelist_url(**{param: value}))
    assert response.status_code == 200
    assert set(ids_in(response)) == {jobs[k].pk for k in expect}


def test_type_filter_and_dropdowns(admin_client) -> None:
    other = JobType.objects.create(name="OtherType")
    a = make_job()
    b = Job.objects.enqueue("OtherType", {})
    response = admin_client.get(changelist_url(type=other.pk))
    assert ids_in(response) == [b.pk]
    html = admin_client.get(changelist_url()).content.decode()
    # status and type render as dropdowns (django-admin-list-filter-dropdown), with the code's labels
    assert html.count("<select") >= 2 and 'value="?status=4"' in html and ">Partially completed<" in html
    assert f'value="?type={other.pk}"' in html and a.pk


def test_queue_and_step_choices_come_from_a_loose_index_scan() -> None:
    for queue, step in [("b", "Send"), ("a", ""), ("c", "Render"), ("a", "Send")]:
        make_job(queue=queue, step=step)
    assert distinct_values(Job.objects.all(), "queue") == ["a", "b", "c"]
    assert distinct_values(Job.objects.filter(step__gt=""), "step") == ["Render", "Send"]
    assert distinct_values(Job.objects.all(), "queue", limit=2) == ["a", "b"]


def test_search_by_id_dedupe_key_and_error_text(admin_client) -> None:
    keyed = make_job(dedupe_key="order-77")
    failed = make_job(Status.FAILED, error="Traceback\nSMTPServerDisconnected: gone away")
    plain = make_job()
    assert ids_in(admin_client.get(changelist_url(q=str(plain.pk)))) == [plain.pk]
    assert ids_in(admin_client.get(changelist_url(q=f"#{plain.pk}"))) == [plain.pk]
    assert ids_in(admin_client.get(changelist_url(q="order-77"))) == [keyed.pk]
    assert ids_in(admin_client.get(changelist_url(q="smtpserverdisconnected"))) == [failed.pk]
    assert ids_in(admin_client.get(changelist_url(q="nothing-like-this"))) == []


def test_date_hierarchy_without_distinct_queries(admin_client) -> None:
    jobs = [make_job() for _ in range(3)]
    Job.objects.filter(pk=jobs[0].pk).update(enqueued_at=timezone.now().replace(year=2024, month=3, day=9))
    Job.objects.filter(pk=jobs[1].pk).update(enqueued_at=timezone.now().replace(year=2025, month=5, day=2))
    with CaptureQueriesContext(connection) as queries:
        html = admin_client.get(changelist_url()).content.decode()
    assert not [q for q in queries.captured_queries if "DISTINCT" in q["sql"].upper()]
    bounds = [q["sql"] for q in queries.captured_queries if re.search(r"\b(MIN|MAX)\(", q["sql"])]
    # one MIN and one MAX, apart: SQLite (and SQL Server) seek an index for a lone MIN or MAX only
    assert len(bounds) == 2 and all(not ("MIN(" in sql and "MAX(" in sql) for sql in bounds), bounds
    if connection.vendor == "sqlite":
        for sql in bounds:
            plan = sqlite_plan(sql)
            assert plan.startswith("SEARCH") and "sqlqueue_job_enqueued" in plan, (sql, plan)
    year = timezone.now().year
    assert 'href="?enqueued_at__year=2024"' in html and f'href="?enqueued_at__year={year}"' in html
    response = admin_client.get(changelist_url(enqueued_at__year=2025))
    assert ids_in(response) == [jobs[1].pk]
    assert 'enqueued_at__month=5' in response.content.decode()
    response = admin_client.get(changelist_url(enqueued_at__year=2025, enqueued_at__month=5))
    assert "enqueued_at__day=2" in response.content.decode()
    response = admin_client.get(changelist_url(enqueued_at__year=2025, enqueued_at__month=5, enqueued_at__day=2))
    assert ids_in(response) == [jobs[1].pk]


def test_paginator_caps_the_count(admin_client, monkeypatch) -> None:
    monkeypatch.setattr(CheapPaginator, "count_cap", 5)
    for _ in range(8):
        make_job()
    response = admin_client.get(changelist_url())
    cl = response.context["cl"]
    html = response.content.decode()
    if connection.vendor == "postgresql":
        assert cl.paginator.is_capped or cl.paginator.is_estimate
    else:
        assert cl.paginator.is_capped and "more than 5 jobs" in html
    # a filtered list is never estimated from the table's size
    response = admin_client.get(changelist_url(status=int(Status.PENDING)))
    assert response.context["cl"].paginator.is_capped and not response.context["cl"].paginator.is_estimate
    assert response.context["cl"].result_count == 5


@pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_class.reltuples is PostgreSQL's")
def test_paginator_estimates_the_unfiltered_list_on_postgresql(admin_client, monkeypatch) -> None:
    monkeypatch.setattr(CheapPaginator, "count_cap", 5)
    for _ in range(12):
        make_job()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Job._meta.db_table}")
    response = admin_client.get(changelist_url())
    assert response.context["cl"].paginator.is_estimate
    assert "(estimate)" in response.content.decode()


def test_the_list_costs_the_same_queries_for_5_or_50_jobs(admin_client) -> None:
    def queries_for_list() -> int:
        from django_sqlqueue.admin import filters as admin_filters

        admin_filters._choices_cache.clear()  # measure the choices' loose scans too
        with CaptureQueriesContext(connection) as ctx:
            assert admin_client.get(changelist_url()).status_code == 200
        return len(ctx.captured_queries)

    for i in range(5):
        make_job(Status.FAILED if i % 2 else Status.PENDING, queue=f"q{i % 2}")
    few = queries_for_list()
    for i in range(45):
        make_job(Status.FAILED if i % 2 else Status.PENDING, queue=f"q{i % 2}")
    assert queries_for_list() == few


def test_the_list_never_counts_the_whole_table(admin_client) -> None:
    make_job()
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(changelist_url())
    counts = [q["sql"].upper() for q in ctx.captured_queries if re.search(r"COUNT(_BIG)?\(", q["sql"].upper())]
    # capped: LIMIT on PostgreSQL and SQLite, TOP on SQL Server
    assert counts and all("LIMIT" in sql or re.search(r"\bTOP\b", sql) for sql in counts), counts


# ----- job page -------------------------------------------------------------------------------------
def test_job_page_lifecycle_payload_traceback_and_attempts(admin_client) -> None:
    JobType.objects.create(name="Flaky", max_attempts=2)
    job = Job.objects.enqueue("Flaky", {"to": "a@example.com", "n": [1, 2]}, queue="q-page")
    first = Job.objects.claim("w-one", 1, queues=["q-page"])[0].advance_step("Send")
    Job.objects.fail(first, "Traceback (most recent call last):\n  File x\nKeyError: 'to'", retry_in=0)
    second = Job.objects.claim("w-two", 1, queues=["q-page"])[0]
    Job.objects.complete(second, {"sent": True})
    response = admin_client.get(change_url(job))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="sqlqueue-badge sqlqueue-completed">Completed<' in html
    assert "2 / 2" in html
    assert '&quot;to&quot;: &quot;a@example.com&quot;' in html and "sqlqueue-json" in html
    assert "&quot;sent&quot;: true" in html
    assert "KeyError: &#x27;to&#x27;" in html  # the traceback, escaped
    # attempt history inline: both attempts, their workers and outcomes
    inline = html[html.index("sqlqueue-attempts"):]
    assert "w-one" in inline and "w-two" in inline
    assert "sqlqueue-error" in inline and "sqlqueue-completed" in inline
    # each attempt's step: the first failed at Send, the second resumed there
    assert re.findall(r'field-step_at">\s*<p>([^<]*)</p>', inline) == ["Send", "Send"]
    assert "Finished (Completed)" in html  # the diagnosis


def test_diagnosis_says_why_a_job_waits(admin_client) -> None:
    JobType.objects.create(name="Stopped", paused=True)
    job = Job.objects.enqueue("Stopped", {})
    assert "is paused" in admin_client.get(change_url(job)).content.decode()
    later = make_job(scheduled_for=timezone.now() + timedelta(minutes=30))
    assert "Scheduled: due in 29" in admin_client.get(change_url(later)).content.decode()
    due = make_job()
    assert "no worker is alive" in admin_client.get(change_url(due)).content.decode()
    make_worker("w-alive")
    assert "waiting for one of 1 live worker" in admin_client.get(change_url(due)).content.decode()
    expired = make_job(Status.PROCESSING, worker="w-gone")
    Job.objects.filter(pk=expired.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=2))
    assert "Lease expired" in admin_client.get(change_url(expired)).content.decode()


def test_script_payload_renders_as_text(admin_client) -> None:
    job = make_job(Status.FAILED, payload={"name": XSS, XSS: [XSS]}, error=f"ValueError: {XSS}",
                   queue="<b>q</b>", step="<i>s</i>", worker="<img src=x onerror=alert(1)>")
    for url in (change_url(job), changelist_url(), changelist_url(q="alert")):
        html = admin_client.get(url).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>q</b>" not in html
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    html = admin_client.get(change_url(job)).content.decode()
    assert "&lt;i&gt;s&lt;/i&gt;" in html


def test_subtype_rows_show_as_inlines(admin_client) -> None:
    JobType.objects.get_or_create(name="ResetPassword")
    reset = Job.objects.enqueue("ResetPassword", {}, subtypes=[
        ResetPassword(user_id=7, username="bob<script>", otp="123456"),
        EmailChannel(email_to="bob@example.com")])
    html = admin_client.get(change_url(reset)).content.decode()
    assert "reset password data" in html.lower() and "bob&lt;script&gt;" in html
    assert "email channel" in html.lower() and "bob@example.com" in html
    assert "sms channel" not in html.lower()  # no row in that inclusive table
    plain = make_job()
    html = admin_client.get(change_url(plain)).content.decode()
    assert "reset password data" not in html.lower() and "email channel" not in html.lower()


def test_subtype_inline_hook(admin_client) -> None:
    from django_sqlqueue.admin.subtypes import SubtypeInline, _custom, register_subtype_inline

    JobType.objects.get_or_create(name="ResetPassword")
    job = Job.objects.enqueue("ResetPassword", {}, subtypes=[
        ResetPassword(user_id=7, username="bob", otp="654321"), EmailChannel(email_to="bob@example.com")])
    try:
        @register_subtype_inline(ResetPassword)
        class NoOtp(SubtypeInline):
            model = ResetPassword
            exclude = ["otp"]

        register_subtype_inline(EmailChannel, None)
        html = admin_client.get(change_url(job)).content.decode()
        assert "bob" in html and "654321" not in html
        assert "bob@example.com" not in html
    finally:
        _custom.clear()
    assert "654321" in admin_client.get(change_url(job)).content.decode()


def test_queue_choices_are_cached_briefly(admin_client, monkeypatch) -> None:
    from django_sqlqueue.admin import filters as admin_filters

    make_job(queue="first")
    assert '?queue=first"' in admin_client.get(changelist_url()).content.decode()
    assert admin_filters._choices_cache
    make_job(queue="second")
    with CaptureQueriesContext(connection) as ctx:
        admin_client.get(changelist_url())
    assert not [q for q in ctx.captured_queries if '"queue" >' in q["sql"]]  # no loose scan: cached
    monkeypatch.setattr(admin_filters, "CHOICES_TTL_SECONDS", 0)
    assert '?queue=second"' in admin_client.get(changelist_url()).content.decode()


@pytest.mark.parametrize(("name", "literal"), [
    ("has_error", r"\.\W?error\W? > N?''"),
    ("overdue", r"\.\W?status_id\W? IN \(1, 3\)"),
    ("lease_expired", r"\.\W?status_id\W? = 2"),
])
def test_filters_on_filtered_indexes_send_their_predicate_as_a_literal(name, literal) -> None:
    """SQL Server matches a filtered index only on the same literal predicate: a parameter never does."""
    from django_sqlqueue.admin import filters as admin_filters

    condition = getattr(admin_filters, name)
    q = condition("default") if name == "has_error" else condition("default", timezone.now())
    sql, params = Job.objects.filter(q).query.sql_with_params()
    assert re.search(literal, sql), sql
    assert "" not in params and not set(params) & {1, 2, 3}, params  # no status id, no '' as a parameter


def test_the_dashboards_index_reads_send_their_predicate_as_a_literal() -> None:
    """The oldest due job and the jobs each worker holds are read through partial indexes: SQLite and
    SQL Server use one only when the query carries its predicate as a literal (at 1M jobs on SQLite a
    parameter made each of these a table scan: 0.3 s per priority, 1.1 s for the worker counts)."""
    from django_sqlqueue.admin.views import oldest_due, workers

    make_job(priority=1)
    make_job(Status.PROCESSING, worker="w-1")
    now = timezone.now()
    with CaptureQueriesContext(connection) as ctx:
        assert oldest_due(Job, now) is not None
        assert workers(now)["processing"] == 1
    job_table = Job._meta.db_table
    reads = [q["sql"] for q in ctx.captured_queries if job_table + '"' in q["sql"] or job_table + "]" in q["sql"]]
    assert reads
    for sql in reads:
        assert re.search(r"\.\W?status_id\W? (IN \(1, (2, )?3\)|= 2)", sql), sql


def test_the_oldest_due_job_is_found_in_the_claim_index_and_among_limited_jobs() -> None:
    """The priority walk reads sqlqueue_job_claim, whose predicate includes ``limited`` false (without it
    PostgreSQL walked every claimable row per priority: 0.3 s each at 100,000 due jobs); a limited
    type's jobs are not in that index, and its oldest due job still counts."""
    from django_sqlqueue.admin.views import oldest_due

    now = timezone.now()
    plain = make_job(priority=1)
    Job.objects.filter(pk=plain.pk).update(scheduled_for=now - timedelta(minutes=5))
    JobType.objects.get_or_create(name="LimitedOld", defaults={"concurrency_limit": 1})
    limited = Job.objects.enqueue("LimitedOld", {"n": 1})
    assert Job.objects.get(pk=limited.pk).limited
    Job.objects.filter(pk=limited.pk).update(scheduled_for=now - timedelta(minutes=30))
    with CaptureQueriesContext(connection) as ctx:
        assert oldest_due(Job, now) == now - timedelta(minutes=30)
    walks = [q["sql"] for q in ctx.captured_queries if "ORDER BY" in q["sql"]]
    assert walks and all(re.search(r"\.\W?limited\W? = (FALSE|0)", sql) for sql in walks), walks
    Job.objects.filter(pk=limited.pk).update(scheduled_for=now + timedelta(minutes=30))  # not due yet
    assert oldest_due(Job, now) == now - timedelta(minutes=5)


def _column(term: str, selected: list[str]) -> str:
    """A GROUP BY / ORDER BY term's column: named, or a position in the select list (Django's choice)."""
    name = re.sub(r"\W", "", term.split(".")[-1].replace(" ASC", ""))
    return selected[int(name) - 1] if name.isdigit() else name


def test_the_status_counts_group_and_order_by_the_status_index_in_its_order() -> None:
    """The dashboard's, the job types' and the metrics' status counts list the (status, type, queue)
    index's columns in its order in both GROUP BY and ORDER BY, so a planner streams the groups off the
    index. Without the ORDER BY PostgreSQL under Babelfish hashed every row's case-insensitive queue
    (0.9 s at 1M jobs, 0.26 s streamed). On SQLite the plan is the covering index with no sort."""
    from django_sqlqueue.admin.types import counts_by_status
    from django_sqlqueue.admin.views import status_tables
    from django_sqlqueue.ops.health import status_counts

    make_job(queue="b")
    make_job(Status.FAILED, queue="a")
    make_job(Status.FAILED, queue="a")
    with CaptureQueriesContext(connection) as ctx:
        tables = status_tables(Job)
        by_type = counts_by_status([JobType.objects.get(name="AdminTest").pk])
    assert {r["label"]: r["total"] for r in tables["queue_rows"]} == {"a": 2, "b": 1}
    assert list(by_type.values()) == [{int(Status.PENDING): 1, int(Status.FAILED): 2}]
    assert counts_by_status([]) == {}  # an empty page of types: no statement, no error (it was a 500)
    grouped = [q["sql"] for q in ctx.captured_queries if "GROUP BY" in q["sql"]]
    assert len(grouped) == 2, grouped
    for sql in grouped:
        select, group_by, order_by = re.search(r"SELECT (.*) FROM .* GROUP BY (.*) ORDER BY (.*?)( OFFSET.*)?$",
                                               sql).group(1, 2, 3)
        selected = re.findall(r"\.\W?(\w+)\W? AS", select)

        columns = [_column(c, selected) for c in order_by.split(",")]
        assert columns == ["status_id", "type_id", "queue"][:len(columns)], (sql, columns)
        assert [_column(c, selected) for c in group_by.split(",")] == columns, sql
        if connection.vendor == "sqlite":
            plan = sqlite_plan(sql)
            assert "COVERING INDEX sqlqueue_job_status_type" in plan and "TEMP B-TREE" not in plan, plan
            if " WHERE " in sql:  # the job types' counts: a seek per (status, type), not the whole index
                assert "status_id=? AND type_id=?" in plan, plan
    with pytest.raises(ValueError, match="lead the"):
        status_counts(Job.objects.all(), "queue", "status_id")


@pytest.mark.parametrize("page", ["admin:django_sqlqueue_dashboard", "sqlqueue-metrics"])
def test_the_claim_priorities_are_listed_once_per_page(admin_client, page) -> None:
    """The oldest due job and each queue's are both found per priority of the claim index: the dashboard
    and the metrics list those priorities once (one seek per priority, and one to find there is no
    other), not once for each."""
    from django.urls import reverse

    pytest.importorskip("prometheus_client")
    for priority in (0, 0, 5):
        make_job(priority=priority, queue=f"q{priority}")
    with CaptureQueriesContext(connection) as ctx:
        assert admin_client.get(reverse(page)).status_code == 200
    walks = [q["sql"] for q in ctx.captured_queries
             if re.match(r"SELECT (TOP 1 )?\W?django_sqlqueue_job\W?\.\W?priority\W? AS \W?priority\W? FROM", q["sql"])]
    assert len(walks) == 3, walks  # 5, 0, then none below 0


def test_the_overdue_count_reads_the_claim_index_and_the_limited_jobs(monkeypatch) -> None:
    """Overdue = claimable and due: the claim index's rows (types without a limit) plus the limited
    types' (sqlqueue_job_limited), each counted through its own index. With the status list alone no
    partial index matched and the planner walked the table until it had 10,001 due rows (60-130 ms at
    1M jobs over TDS on Babelfish, against 3 ms through the claim index)."""
    from django_sqlqueue.admin.views import backlog

    now = timezone.now()
    for minutes in (5, 10):
        job = make_job()
        Job.objects.filter(pk=job.pk).update(scheduled_for=now - timedelta(minutes=minutes))
    make_job(scheduled_for=now + timedelta(hours=1))  # not due
    make_job(Status.PROCESSING)
    make_job(Status.ERROR, scheduled_for=now - timedelta(minutes=1))
    JobType.objects.get_or_create(name="LimitedDue", defaults={"concurrency_limit": 1})
    limited = Job.objects.enqueue("LimitedDue", {"n": 1})
    Job.objects.filter(pk=limited.pk).update(scheduled_for=now - timedelta(minutes=2))
    running = Job.objects.enqueue("LimitedDue", {"n": 2})  # in the limited index too, but not waiting
    Job.objects.filter(pk=running.pk).update(status_id=Status.PROCESSING, worker="w-1",
                                             scheduled_for=now - timedelta(minutes=3))
    with CaptureQueriesContext(connection) as ctx:
        found = backlog(Job, now)
    assert (found["overdue"], found["overdue_capped"]) == (4, False)
    counts = [q["sql"] for q in ctx.captured_queries if re.search(r"scheduled_for\W? <=", q["sql"])
              and "COUNT" in q["sql"].upper()]
    assert len(counts) == 2, counts
    assert re.search(r"\.\W?limited\W? = (FALSE|0)", counts[0]) and re.search(r"\.\W?limited\W? = (TRUE|1)", counts[1])
    if connection.vendor == "sqlite":
        assert_read_through(counts[0], "sqlqueue_job_claim", never="sqlqueue_job_status_type")
        assert_read_through(counts[1], "sqlqueue_job_limited", never="sqlqueue_job_status_type")
    from django_sqlqueue.admin import views

    monkeypatch.setattr(views, "COUNT_CAP", 3)  # each count stops past the cap; their sum is capped too
    assert (backlog(Job, now)["overdue"], backlog(Job, now)["overdue_capped"]) == (3, True)


@pytest.mark.parametrize("walk", [(250, 2_000), (2, 4)], ids=["default-walk", "short-walk"])
def test_each_queues_oldest_due_job_walked_from_the_claim_index_matches_the_group_by(monkeypatch, walk) -> None:
    """The dashboard's per-queue oldest due job, found by walking the claim index per priority, equals
    the plain GROUP BY's answer: queues at several priorities, a queue whose jobs are all scheduled
    ahead, a rare queue behind a large one, Error jobs, a limited type's jobs (not in the claim index).
    The short walk (2 rows a step, 4 a priority) stops before it sees every queue, so the queues it
    could not settle are counted the other way."""
    from django_sqlqueue.ops import health

    monkeypatch.setattr(health, "QUEUE_WALK_STEP", walk[0])
    monkeypatch.setattr(health, "QUEUE_WALK_ROWS", walk[1])
    now = timezone.now()

    def job(queue: str, minutes_ago: int, priority: int = 0, status: Status = Status.PENDING) -> None:
        j = make_job(status, queue=queue)
        Job.objects.filter(pk=j.pk).update(scheduled_for=now - timedelta(minutes=minutes_ago), priority=priority)

    for i in range(12):
        job("big", 100 - i, priority=i % 2)
    job("rare", 50, priority=1)
    job("rare", 70, priority=0, status=Status.ERROR)
    job("ahead", -30)
    job("mixed", 200, priority=-1)
    job("mixed", 5, priority=1)
    JobType.objects.get_or_create(name="LimitedByQueue", defaults={"concurrency_limit": 1})
    limited = Job.objects.enqueue("LimitedByQueue", {"n": 1}, queue="mixed")
    assert Job.objects.get(pk=limited.pk).limited
    Job.objects.filter(pk=limited.pk).update(scheduled_for=now - timedelta(minutes=300))
    expected = health.oldest_due_by_queue(Job.objects.all(), now)
    assert set(expected) == {"big", "rare", "mixed"}
    assert (expected["rare"], expected["mixed"]) == (now - timedelta(minutes=70), now - timedelta(minutes=300))
    claimable_queues = {"big", "rare", "ahead", "mixed"}
    assert health.oldest_due_by_queue(Job.objects.all(), now, claimable_queues) == expected
    assert health.oldest_due_by_queue(Job.objects.all(), now, set()) == {}


def test_the_queue_walk_does_not_pass_over_rows_tied_on_a_time_the_database_clock_wrote(monkeypatch) -> None:
    """Six jobs share one due time written by the database's clock (a retry of many jobs in one
    statement sets them so); queue B's is the last of the tie, and B has a later due job too. The walk,
    two rows a step, must find B's tied job: a step that continued after the last row's time as Python
    read it back passed over the rest of the tie on SQLite (``...:58.684`` sorts before ``...:58.684000``)
    and reported B's later job."""
    from django.db.models.functions import Now

    from django_sqlqueue.ops import health

    monkeypatch.setattr(health, "QUEUE_WALK_STEP", 2)
    tied = [make_job(queue="a").pk for _ in range(5)] + [make_job(queue="b").pk]
    later = make_job(queue="b")
    Job.objects.filter(pk__in=tied).update(scheduled_for=Now(), priority=0)
    tie = Job.objects.get(pk=tied[-1]).scheduled_for
    Job.objects.filter(pk=later.pk).update(scheduled_for=tie + timedelta(hours=1), priority=0)
    now = tie + timedelta(hours=2)
    expected = health.oldest_due_by_queue(Job.objects.all(), now)
    assert expected == {"a": tie, "b": tie}
    assert health.oldest_due_by_queue(Job.objects.all(), now, {"a", "b"}) == expected


def sqlite_plan(sql: str) -> str:
    """SQLite's plan of a captured statement, its lines joined."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return " ".join(str(row[-1]) for row in cursor.fetchall())


def assert_read_through(sql: str, index: str, never: str) -> None:
    """The statement names ``index`` (INDEXED BY) and SQLite's plan reads it, never ``never``."""
    assert f'INDEXED BY "{index}"' in sql, sql
    plan = sqlite_plan(sql)
    assert index in plan and never not in plan, (sql, plan)


def test_the_claim_index_reads_of_the_oldest_due_jobs_are_pinned_to_it_on_sqlite() -> None:
    """The oldest due job and each queue's (the dashboard, the metrics) read the claim index: its
    distinct priorities, the first due row of each, the per-queue walk. On SQLite with no statistics
    (a new user's database) the planner took the (status, type, queue) index's range of every
    claimable job for each of them and sorted it (0.5 s a read at 1M jobs, 150,000 due: the dashboard
    took 3.9 s). Each read names the claim index (INDEXED BY), and its plan uses it."""
    from django_sqlqueue.ops.health import oldest_due, oldest_due_by_queue

    if connection.vendor != "sqlite":
        pytest.skip("INDEXED BY is SQLite's (PostgreSQL and SQL Server match the filtered index by cost)")
    now = timezone.now()
    for i in range(30):
        job = make_job(queue=f"q{i % 3}")
        Job.objects.filter(pk=job.pk).update(priority=i % 2, scheduled_for=now - timedelta(minutes=i))
    with CaptureQueriesContext(connection) as ctx:
        assert oldest_due(Job, now) == now - timedelta(minutes=29)
        assert oldest_due_by_queue(Job.objects.all(), now, {"q0", "q1", "q2"}) == {
            "q0": now - timedelta(minutes=27), "q1": now - timedelta(minutes=28), "q2": now - timedelta(minutes=29)}
    reads = [q["sql"] for q in ctx.captured_queries
             if re.search(r'"limited" = (0|FALSE)', q["sql"]) and "ORDER BY" in q["sql"]]
    assert len(reads) >= 6, reads  # priorities (3 looks) and firsts (2) of each; the walk's steps
    for sql in reads:
        assert_read_through(sql, "sqlqueue_job_claim", never="TEMP B-TREE")


def test_the_dashboards_processing_reads_are_pinned_to_the_processing_index_on_sqlite() -> None:
    """The dashboard's counts of expired leases and orphaned jobs and its jobs held per worker read the
    Processing index's rows. On SQLite with no statistics the planner took the status index's range and
    each job's table row (10,000 Processing jobs of 1M). Each names that index and its plan uses it."""
    from django_sqlqueue.admin.views import backlog, stuck_work, workers

    if connection.vendor != "sqlite":
        pytest.skip("INDEXED BY is SQLite's (PostgreSQL and SQL Server match the filtered index by cost)")
    now = timezone.now()
    for _ in range(3):
        job = make_job(Status.PROCESSING)
        Job.objects.filter(pk=job.pk).update(lease_expires_at=now - timedelta(minutes=1))
    with CaptureQueriesContext(connection) as ctx:
        assert backlog(Job, now)["lease_expired"] == 3
        assert stuck_work(Job, now)["orphaned"] == 3
        workers(now)
    reads = [q["sql"] for q in ctx.captured_queries if re.search(r'"status_id" = 2\b', q["sql"])
             and "UPDATE" not in q["sql"] and '"queue" AS "queue"' not in q["sql"]]  # not the unserved pairs' seeks
    assert len(reads) == 3, "\n".join(r[:200] for r in reads)
    for sql in reads:
        assert_read_through(sql, "sqlqueue_job_processing", never="sqlqueue_job_status_type")


def test_the_failure_triage_reads_the_error_index_newest_first_on_sqlite() -> None:
    """The failures page reads the newest failed jobs with error text. On SQLite with no statistics the
    planner took the status index's range of every failed job and sorted it (1.2 s at 1M jobs); the read
    names the error index, walked backwards with no sort."""
    from django_sqlqueue.admin.triage import failure_groups

    if connection.vendor != "sqlite":
        pytest.skip("INDEXED BY is SQLite's (PostgreSQL and SQL Server match the filtered index by cost)")
    for i in range(4):
        make_job(Status.FAILED, error=f"Traceback\nValueError: bad {i % 2}")
    with CaptureQueriesContext(connection) as ctx:
        groups, _capped = failure_groups(Job)
    assert sum(g.total for g in groups) == 4
    [read] = [q["sql"] for q in ctx.captured_queries if "ORDER BY" in q["sql"] and "error" in q["sql"]]
    assert_read_through(read, "sqlqueue_job_has_error", never="TEMP B-TREE")


def test_the_oldest_limited_due_job_is_read_from_the_limited_index_alone_on_sqlite() -> None:
    """On a fresh SQLite database (no ANALYZE statistics) the planner took the status index's range of
    every Pending job for the limited jobs' MIN: a read that grew with the whole backlog. The read names
    sqlqueue_job_limited, which holds limited jobs only."""
    from django_sqlqueue.dialects import get_dialect

    if connection.vendor != "sqlite":
        pytest.skip("INDEXED BY is SQLite's (PostgreSQL and SQL Server match the filtered index by cost)")
    for _ in range(30):
        make_job()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + get_dialect(connection).oldest_limited_due_sql(), [])
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "sqlqueue_job_limited" in plan and "sqlqueue_job_status_type" not in plan, plan


@pytest.mark.parametrize("key", ["1h", "24h", "7d", "30d"])
def test_throughput_buckets_are_counted_by_the_database_in_the_right_place(key) -> None:
    """Jobs near bucket edges land in the window's buckets, on every vendor (the database computes
    minutes or hours since 1970; Python adds them up into the window's buckets)."""
    from django_sqlqueue.admin.throughput import WINDOWS, rates

    window = WINDOWS[key]
    now = timezone.now().replace(microsecond=0)
    start = rates(Job, now, window)["start"]
    last = window.buckets - 1
    placed = {0: [timedelta(0), timedelta(seconds=1)], 1: [window.bucket + timedelta(seconds=59)],
              last: [window.span - timedelta(seconds=1)]}
    for offsets in placed.values():
        for offset in offsets:
            job = make_job(Status.COMPLETED)
            at = start + offset
            Job.objects.filter(pk=job.pk).update(enqueued_at=at, finished_at=at, started_at=at)
    for outside in (start - timedelta(seconds=1), start + window.span):  # just before and at the end
        job = make_job(Status.COMPLETED)
        Job.objects.filter(pk=job.pk).update(enqueued_at=outside, finished_at=outside, started_at=outside)
    got = rates(Job, now, window)
    expected = [0] * window.buckets
    for bucket, offsets in placed.items():
        expected[bucket] += len(offsets)
    assert got["finished"] == expected and got["enqueued"] == expected
