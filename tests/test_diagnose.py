"""queue_why / the one diagnosis (ops/diagnose.py): each sentence matches what the claim actually does,
and queue_why, the admin's job page, the dashboard and the metrics give the same answer."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import Status, enqueue, handler, registry
from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.ops.diagnose import CHAIN_DEPTH, diagnose, why_not_running

pytestmark = pytest.mark.django_db


@pytest.fixture
def diag_type(db):
    handler("Diag")(lambda job: None)
    yield JobType.objects.get_or_create(name="Diag")[0]
    registry.unregister("Diag")


def live(name: str, **fields) -> Worker:
    now = timezone.now()
    return Worker.objects.create(name=name, started_at=now, last_heartbeat=now, **fields)


def why(job: Job) -> str:
    out = StringIO()
    call_command("queue_why", str(job.pk), stdout=out)
    return out.getvalue()


def test_claimable_job_served_by_a_live_worker_has_no_reason_and_is_claimed(diag_type) -> None:
    job = enqueue("Diag")
    live("w")
    assert why_not_running(job) == []
    assert "nothing stops it: Due" in why(job) and "one of 1 live worker(s)" in why(job)
    assert Job.objects.claim("w", 1)[0].pk == job.pk


def test_no_worker_alive_is_said_not_nothing_stops_it(diag_type) -> None:
    job = enqueue("Diag")
    assert why_not_running(job) == [why_not_running(job)[0]] and "no worker is alive" in why_not_running(job)[0]
    Worker.objects.create(name="gone", started_at=timezone.now(), last_heartbeat=timezone.now(),
                          stopped_at=timezone.now())
    assert "nothing stops it" not in why(job) and "no worker is alive" in why(job)


def test_a_queue_typo_is_named_by_queue_why_the_admin_the_dashboard_and_the_metrics(diag_type, admin_client) -> None:
    """Issue 32 item 1: enqueued to "emails", the worker started with -q email."""
    job = enqueue("Diag", queue="emails")
    live("w-typo", queues=["email"])
    text = why(job)
    assert "nothing stops it" not in text
    assert "none of the 1 live worker(s) serves queue emails and type Diag" in text
    page = admin_client.get(reverse("admin:django_sqlqueue_job_change", args=[job.pk])).content.decode()
    assert "none of the 1 live worker(s) serves queue emails and type Diag" in page
    dashboard = admin_client.get(reverse("admin:django_sqlqueue_dashboard")).context
    assert [(u["queue"], u["type"], u["jobs"]) for u in dashboard["unserved"]] == [("emails", "Diag", 1)]
    pytest.importorskip("prometheus_client")
    from django_sqlqueue.ops.metrics import QueueCollector

    unserved = {tuple(s.labels.values()): s.value for m in QueueCollector().collect()
                if m.name == "sqlqueue_unserved_due_jobs" for s in m.samples}
    assert unserved == {("emails", "Diag"): 1.0}
    # The claim agrees: the typo'd worker takes nothing, one serving "emails" takes it.
    assert Job.objects.claim("w-typo", 1, queues=["email"]) == []
    live("w-right", queues=["emails"])
    assert "nothing stops it" in why(job)
    assert Job.objects.claim("w-right", 1, queues=["emails"])[0].pk == job.pk


def test_scheduled_paused_type_and_paused_job(diag_type) -> None:
    live("w")
    later = enqueue("Diag", delay=600)
    reason = why_not_running(later)[0].replace("\xa0", " ")
    assert reason.startswith("Scheduled: due in 9 minutes") or reason.startswith("Scheduled: due in 10 minutes")
    assert " UTC)" in reason  # the time with its zone
    JobType.objects.filter(pk=diag_type.pk).update(paused=True)
    from django_sqlqueue import jobtypes

    jobtypes.clear_cache()
    now_job = enqueue("Diag")
    assert any("is paused" in r for r in why_not_running(now_job))
    assert Job.objects.claim("w", 1) == []  # and the claim agrees
    paused = Job.objects.modify(now_job.pk, None, Status.PAUSED)
    assert any("Paused by an operator" in r for r in why_not_running(paused))


def test_held_by_live_then_dead_worker(diag_type) -> None:
    enqueue("Diag")
    job = Job.objects.claim("box:1/0", 1)[0]
    now = timezone.now()
    Worker.objects.create(name="box:1/0", started_at=now, last_heartbeat=now)
    assert why_not_running(job)[0].startswith("Running on box:1/0 since")
    Worker.objects.filter(name="box:1/0").update(last_heartbeat=now - timedelta(hours=1))
    reasons = why_not_running(job)
    assert "has sent no heartbeat" in reasons[0]
    assert "No live worker serves queue default" in reasons[1]  # the only worker is the dead one
    live("other/0")
    assert "The next claim by one of 1 live worker(s)" in why_not_running(job)[1]
    assert Job.objects.claim("other/0", 1)[0].pk == job.pk  # the claim takes it over, as said


def test_out_of_attempts_and_unknown_handler(make_type) -> None:
    make_type("NoHandler")
    job = enqueue("NoHandler", max_attempts=1)
    claimed = Job.objects.claim("w", 1)[0]
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    reasons = why_not_running(Job.objects.get(pk=claimed.pk))
    assert any("all 1 used" in r for r in reasons)
    assert any("No handler for 'NoHandler'" in r for r in reasons)


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.TERMINATED])
def test_a_final_job_is_not_promised_a_retry(diag_type, status) -> None:
    """Issue 32 item 8: Completed has no way out (lifecycle.md, the admin's refusal): queue_why says so."""
    job = enqueue("Diag")
    Job.objects.filter(pk=job.pk).update(status_id=int(status))
    text = why(Job.objects.get(pk=job.pk))
    assert "for good" in text and "retry" not in text.lower()


def test_failed_job_is_promised_the_operators_retry(diag_type) -> None:
    job = enqueue("Diag")
    Job.objects.filter(pk=job.pk).update(status_id=int(Status.FAILED))
    assert "only an operator's retry runs it again" in why(Job.objects.get(pk=job.pk))


def test_a_waiting_job_is_followed_to_the_real_blocker(diag_type, admin_client) -> None:
    """Issue 27 item 5: "waits for job 3169 (Pending)" where 3169 sits in a queue nobody serves."""
    live("w", queues=["default"])
    root = enqueue("Diag", queue="nobody")
    middle = enqueue("Diag", after=[root])
    top = enqueue("Diag", after=[middle])
    text = why(top)
    assert (f"waits for job {middle.pk} (Waiting), which waits for job {root.pk} (Pending): Due" in text), text
    assert "none of the 1 live worker(s) serves queue nobody and type Diag" in text
    page = admin_client.get(reverse("admin:django_sqlqueue_job_change", args=[top.pk])).content.decode()
    assert "serves queue nobody and type Diag" in page
    # A dependency that is running: its worker is named.
    Job.objects.filter(pk=root.pk).update(queue="default")
    (claimed,) = Job.objects.claim("w", 1, queues=["default"])
    assert claimed.pk == root.pk
    assert f"waits for job {root.pk} (Processing on w): Running on w since" in why(middle)


def test_a_cycle_and_a_long_chain_end(diag_type) -> None:
    """Rows can be edited into a cycle (enqueue cannot make one): the diagnosis ends, and says so."""
    from django_sqlqueue.models import JobDependency

    live("w")
    a = enqueue("Diag")
    b = enqueue("Diag", after=[a])
    JobDependency.objects.create(job=a, depends_on=b)
    Job.objects.filter(pk=a.pk).update(status_id=int(Status.WAITING))
    assert "a cycle of dependencies leads back to it" in diagnose(Job.objects.get(pk=b.pk)).text
    chain = [enqueue("Diag")]
    for _ in range(CHAIN_DEPTH + 5):
        chain.append(enqueue("Diag", after=[chain[-1]]))
    text = diagnose(chain[-1]).text
    assert f"the chain is longer than {CHAIN_DEPTH} jobs" in text and text.count("which waits for") == CHAIN_DEPTH


def test_command(diag_type) -> None:
    job = enqueue("Diag", delay=60)
    text = why(job)
    assert f"job {job.pk} (Diag" in text and "- Scheduled: due in" in text
    with pytest.raises(CommandError, match="no job with id"):
        call_command("queue_why", "999999")


def test_queue_why_runs_no_system_checks() -> None:
    """Issue 32 item 7: a diagnostic tool runs when things are broken (an invalid schedule in settings is a
    check error; tests/test_newcomer_walkthrough.py runs ``manage.py queue_why`` with one)."""
    from django.core.management import get_commands, load_command_class

    assert load_command_class(get_commands()["queue_why"], "queue_why").requires_system_checks == []


def test_unserved_work_is_counted_pair_by_pair_not_over_the_lists_cross(db) -> None:
    """Two unserved pairs, (q1, B) and (q2, A), whose queues and types cross into two served pairs, (q1, A)
    and (q2, B). The counts are right, and the statement seeks each unserved pair alone: a filter on the
    queues {q1, q2} and the types {A, B} apart would also read the served pairs' jobs (the backlog that
    is being worked on). The plan is read on SQLite: every index search binds the status, the type and
    the queue."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.ops.diagnose import unserved_due_work

    for name in ("CrossA", "CrossB"):
        handler(name)(lambda job: None)
    try:
        a, b = (JobType.objects.get_or_create(name=name)[0] for name in ("CrossA", "CrossB"))
        live("w-q1-a", queues=["q1"], types=["CrossA"])
        live("w-q2-b", queues=["q2"], types=["CrossB"])
        for queue, job_type, n in (("q1", "CrossA", 5), ("q2", "CrossB", 5), ("q1", "CrossB", 2), ("q2", "CrossA", 3)):
            for _ in range(n):
                enqueue(job_type, {}, queue=queue)
        with CaptureQueriesContext(connection) as ctx:
            found = unserved_due_work(Job, timezone.now())
        assert [(u.queue, u.type_name, u.jobs) for u in found] == [("q2", "CrossA", 3), ("q1", "CrossB", 2)]
        counts = [q["sql"] for q in ctx.captured_queries if "GROUP BY" in q["sql"]]
        assert len(counts) == 2, counts
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN QUERY PLAN " + counts[0])
                searches = [str(row[-1]) for row in cursor.fetchall() if "sqlqueue_job_status_type" in str(row[-1])]
            assert searches and all("type_id=?" in s and "queue=?" in s for s in searches), searches
    finally:
        for name in ("CrossA", "CrossB"):
            registry.unregister(name)
    assert a.pk != b.pk


def test_unserved_due_work_counts_up_to_a_cap_in_one_statement_and_the_dashboard_says_more(db, admin_client,
                                                                                            monkeypatch) -> None:
    """The dashboard warns about due work nobody serves; it counts each pair's due jobs up to a cap (the
    count reads each due row's table row for its due time, 0.1 s for 28,000 of them over TDS), says
    "> cap" beyond it, and leaves a not-yet-due job out. Orphaned jobs are added whole, and never make
    an exact count a "more than". The metrics' call (no cap) counts them all."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.admin import views
    from django_sqlqueue.ops.diagnose import unserved_due_work

    handler("CapA")(lambda job: None)
    handler("CapB")(lambda job: None)
    try:
        live("w-elsewhere", queues=["elsewhere"])
        for _ in range(5):
            enqueue("CapA", {}, queue="nobody")
        for _ in range(2):
            enqueue("CapB", {}, queue="nobody")
        enqueue("CapB", {}, queue="nobody", delay=3600)  # not due: not counted
        orphan = enqueue("CapB", {}, queue="nobody")  # held by a worker that is gone
        Job.objects.filter(pk=orphan.pk).update(status_id=Status.PROCESSING, worker="w-gone",
                                                lease_expires_at=timezone.now() - timedelta(minutes=1))
        now = timezone.now()
        with CaptureQueriesContext(connection) as ctx:
            capped = unserved_due_work(Job, now, cap=3)
        assert [(u.type_name, u.jobs, u.capped) for u in capped] == [("CapA", 3, True), ("CapB", 3, False)]
        assert len([q for q in ctx.captured_queries if "COUNT" in q["sql"].upper() and "UNION ALL" in q["sql"]]) == 1
        assert [(u.type_name, u.jobs, u.capped) for u in unserved_due_work(Job, now)] == [
            ("CapA", 5, False), ("CapB", 3, False)]
        assert [(u.type_name, u.jobs, u.capped) for u in unserved_due_work(Job, now, cap=5)] == [
            ("CapA", 5, False), ("CapB", 3, False)]

        monkeypatch.setattr(views, "UNSERVED_CAP", 3)
        html = admin_client.get(reverse("admin:django_sqlqueue_dashboard")).content.decode()
        assert 'data-sqlqueue-value="unserved:nobody:CapA">&gt; 3</a>' in html, html
        assert 'data-sqlqueue-value="unserved:nobody:CapB">3</a>' in html
        values = admin_client.get(reverse("admin:django_sqlqueue_dashboard_json")).json()["values"]
        assert values["unserved:nobody:CapA"] == "> 3" and values["unserved:nobody:CapB"] == "3"
    finally:
        registry.unregister("CapA")
        registry.unregister("CapB")
