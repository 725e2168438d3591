"""Pause and resume a queue fleet-wide (issue 27): the claim, the worker, the diagnosis, the commands,
the admin (with its permissions), the dashboard and the metrics. Every claim here is a real claim on the
stage's database (SQLite, PostgreSQL, T-SQL over TDS)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue.exceptions import InvalidArgument
from django_sqlqueue.models import Job, JobType, QueuePause
from django_sqlqueue.ops.diagnose import diagnose, unserved_due_work
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    fast_password_hasher,
    fresh_admin_caches,
    make_worker,
    messages_of,
    user_with,
)

pytestmark = pytest.mark.django_db

ADD = "admin:django_sqlqueue_queuepause_add"
LIST = "admin:django_sqlqueue_queuepause_changelist"


def claimed_ids(worker: str = "w", n: int = 10, **kw) -> list[int]:
    return [j.pk for j in Job.objects.claim(worker, n, **kw)]


# ----- the claim ---------------------------------------------------------------------------------------------
def test_the_claim_passes_over_a_paused_queue_and_takes_it_again_in_order_after_resume(noop_type) -> None:
    emails = [Job.objects.enqueue("Noop", queue="emails", priority=p) for p in (5, 1)]
    other = Job.objects.enqueue("Noop", queue="reports")
    assert Job.objects.pause_queue("emails", by="alice", reason="provider down") is True
    # Higher priority, yet passed over; a worker naming the queue gets nothing either.
    assert claimed_ids("w1") == [other.pk]
    assert claimed_ids("w2", queues=["emails"]) == []
    assert [Job.objects.get(pk=j.pk).state for j in emails] == [Status.PENDING, Status.PENDING]
    assert [Job.objects.get(pk=j.pk).attempt_num for j in emails] == [0, 0]
    assert Job.objects.resume_queue("emails") is True
    assert claimed_ids("w3", 1) == [emails[0].pk]  # the order kept: priority 5 first
    assert claimed_ids("w4", queues=["emails"]) == [emails[1].pk]


def test_a_paused_queue_holds_limited_jobs_and_expired_leases_too(make_type) -> None:
    JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": 2})
    jobtypes.clear_cache()
    limited = Job.objects.enqueue("Export", queue="emails")
    make_type("Noop")
    dead = Job.objects.enqueue("Noop", queue="emails")
    [taken] = Job.objects.claim("gone", 1, types=["Noop"])
    assert taken.pk == dead.pk
    Job.objects.filter(pk=dead.pk).update(lease_expires_at=timezone.now() - timedelta(hours=1))
    Job.objects.pause_queue("emails")
    assert claimed_ids("w1") == []  # neither the limited branch nor the reclaim of an expired lease
    assert Job.objects.get(pk=limited.pk).state is Status.PENDING
    assert Job.objects.get(pk=dead.pk).worker == "gone"
    Job.objects.resume_queue("emails")
    # (a claim takes at most one job of the limited branch: two claims take both)
    assert sorted(claimed_ids("w2") + claimed_ids("w3")) == sorted([limited.pk, dead.pk])


def test_pause_and_resume_say_what_they_changed_and_refuse_bad_names(noop_type) -> None:
    assert Job.objects.pause_queue("emails", by="alice", reason="first") is True
    assert Job.objects.pause_queue("emails", by="bob", reason="second") is False
    kept = Job.objects.paused_queues()["emails"]
    assert (kept.paused_by, kept.reason) == ("alice", "first")  # the first pause is kept
    assert Job.objects.resume_queue("emails") is True
    assert Job.objects.resume_queue("emails") is False
    assert Job.objects.paused_queues() == {}
    for bad in ("", "x" * 101, None, 3, "a\x00b"):
        with pytest.raises(InvalidArgument):
            Job.objects.pause_queue(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            Job.objects.resume_queue(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="reason"):
        Job.objects.pause_queue("emails", reason="r" * 501)
    with pytest.raises(InvalidArgument, match="at most 200 characters"):  # refused, not cut to fit
        Job.objects.pause_queue("emails", by="b" * 201)
    assert not QueuePause.objects.exists()
    assert Job.objects.pause_queue("emails", by="b" * 200) and QueuePause.objects.get().paused_by == "b" * 200


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_leaves_a_paused_queue_pending_and_ends() -> None:
    from tests import workerutil as wu

    held = Job.objects.enqueue("test.Noop", queue="emails")
    done = Job.objects.enqueue("test.Noop", queue="default")
    Job.objects.pause_queue("emails")
    counters = wu.run_worker("pauser", queues=["emails", "default"], wait_due=30)
    assert counters[0] == 1  # it ended (burst) without waiting 30 s for a job it may not take
    assert Job.objects.get(pk=done.pk).state is Status.COMPLETED
    assert Job.objects.get(pk=held.pk).state is Status.PENDING
    Job.objects.resume_queue("emails")
    wu.run_worker("pauser", queues=["emails"])
    assert Job.objects.get(pk=held.pk).state is Status.COMPLETED


# ----- the diagnosis -----------------------------------------------------------------------------------------
def test_the_diagnosis_names_the_pause_with_who_and_why(noop_type) -> None:
    make_worker("w-live", queues=["emails"])
    job = Job.objects.enqueue("Noop", queue="emails")
    assert diagnose(job).runs_now
    Job.objects.pause_queue("emails", by="alice", reason="provider down")
    found = diagnose(Job.objects.get(pk=job.pk))
    assert not found.runs_now
    assert "queue emails is paused by alice" in found.text and "provider down" in found.text
    out = StringIO()
    call_command("queue_why", str(job.pk), stdout=out)
    assert "is paused by alice" in out.getvalue() and "nothing stops it" not in out.getvalue()


def test_paused_queues_are_not_reported_as_unserved(noop_type) -> None:
    make_worker("w-emails", queues=["emails"])
    Job.objects.enqueue("Noop", queue="billing")
    now = timezone.now() + timedelta(seconds=1)
    assert [u.queue for u in unserved_due_work(Job, now)] == ["billing"]
    Job.objects.pause_queue("billing")
    assert unserved_due_work(Job, now) == []


# ----- the commands ------------------------------------------------------------------------------------------
def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_the_commands_pause_list_and_resume() -> None:
    assert run("queue_pause") == "no queue is paused\n"
    assert run("queue_pause", "emails", "sms", "--reason", "provider down", "--by", "oncall") == (
        "emails: paused\nsms: paused\n")
    assert run("queue_pause", "emails") == "emails: was already paused (kept as it was)\n"
    listing = run("queue_pause")
    assert "emails: paused by oncall at " in listing and listing.count("provider down") == 2
    assert run("queue_resume", "emails", "nope") == "emails: resumed\nnope: was not paused\n"
    assert set(Job.objects.paused_queues()) == {"sms"}
    with pytest.raises(CommandError, match="at most 100"):
        run("queue_pause", "x" * 101)
    by = Job.objects.paused_queues()["sms"].paused_by
    assert by == "oncall"
    run("queue_pause", "mail")
    assert "@" in Job.objects.paused_queues()["mail"].paused_by  # user@host by default


# ----- the admin ---------------------------------------------------------------------------------------------
def test_the_admin_pauses_with_add_permission_and_records_who(client, noop_type) -> None:
    Job.objects.enqueue("Noop", queue="emails")
    client.force_login(user_with("add_queuepause", "view_queuepause", username="pauser"))
    response = client.post(reverse(ADD), {"queue": "emails", "reason": "provider down"}, follow=True)
    assert response.status_code == 200
    pause = QueuePause.objects.get(pk="emails")
    assert (pause.paused_by, pause.reason) == ("pauser", "provider down")
    assert any("stop claiming" in m or "stops claiming" in m for m in messages_of(response))
    # A queue no job and no worker names is refused by the form: a typo would pause nothing.
    response = client.post(reverse(ADD), {"queue": "emials", "reason": ""})
    assert response.status_code == 200 and b"check the spelling" in response.content
    assert not QueuePause.objects.filter(pk="emials").exists()


def test_resuming_needs_the_delete_permission_and_is_logged(client, noop_type) -> None:
    Job.objects.pause_queue("emails", by="alice")
    data = {"action": "resume_queues", "index": "0", "_selected_action": ["emails"]}
    client.force_login(user_with("view_queuepause", username="viewer"))
    assert client.get(reverse(LIST)).status_code == 200
    assert client.post(reverse(ADD), {"queue": "emails2"}).status_code == 403
    client.post(reverse(LIST), data, follow=True)  # a forged POST of a view-only user
    assert QueuePause.objects.filter(pk="emails").exists()
    client.force_login(user_with("view_queuepause", "delete_queuepause", username="resumer"))
    response = client.post(reverse(LIST), data, follow=True)
    assert "1 queue resumed." in messages_of(response)
    assert not QueuePause.objects.exists()
    assert LogEntry.objects.filter(action_flag=DELETION, object_id="emails", change_message="Resumed").exists()


def test_the_dashboard_marks_a_paused_queue(admin_client, noop_type) -> None:
    Job.objects.enqueue("Noop", queue="emails")
    Job.objects.enqueue("Noop", queue="reports")
    Job.objects.pause_queue("emails")
    html = admin_client.get(reverse("admin:django_sqlqueue_dashboard")).content.decode()
    change = reverse("admin:django_sqlqueue_queuepause_change", args=["emails"])
    assert html.count("queue paused") == 1 and f'href="{change}"' in html


def test_the_metrics_list_paused_queues(admin_client) -> None:
    pytest.importorskip("prometheus_client")
    from tests.test_metrics import URL, sample

    Job.objects.pause_queue("emails")
    text = admin_client.get(reverse(URL)).content.decode()
    assert sample(text, "sqlqueue_queue_paused", queue="emails") == 1.0
    assert sample(text, "sqlqueue_queue_paused", queue="default") is None


# ----- per-queue latency: oldest due job and wait percentiles (issue 27) -----------------------------------
def _latency_data() -> None:
    from tests.test_admin_support import make_job

    now = timezone.now()
    old = make_job(queue="emails")
    Job.objects.filter(pk=old.pk).update(scheduled_for=now - timedelta(minutes=10))
    make_job(queue="emails")  # due now: younger than the oldest
    future = make_job(queue="reports")  # nothing due in reports
    Job.objects.filter(pk=future.pk).update(scheduled_for=now + timedelta(hours=1))
    for wait_s, queue in ((2, "emails"), (4, "emails"), (30, "emails"), (1, "reports")):
        done = make_job(Status.COMPLETED, queue=queue)
        Job.objects.filter(pk=done.pk).update(scheduled_for=now - timedelta(seconds=60 + wait_s),
                                              started_at=now - timedelta(seconds=60),
                                              finished_at=now - timedelta(seconds=30))


def test_the_dashboard_shows_each_queues_oldest_due_job_and_its_wait(admin_client) -> None:
    _latency_data()
    response = admin_client.get(reverse("admin:django_sqlqueue_dashboard"))
    rows = {r["label"]: r for r in response.context["queue_rows"]}
    assert rows["emails"]["oldest_due"] == "10\xa0minutes"
    assert rows["reports"]["oldest_due"] == ""  # its one job is due in an hour
    assert rows["emails"]["wait"] == "4.0 s / 30.0 s"  # nearest rank of (2, 4, 30)
    assert rows["reports"]["wait"] == "1.0 s / 1.0 s"


def test_the_metrics_give_each_queues_oldest_due_age_and_wait_histogram(admin_client) -> None:
    pytest.importorskip("prometheus_client")
    from tests.test_metrics import URL, sample

    _latency_data()
    text = admin_client.get(reverse(URL)).content.decode()
    age = sample(text, "sqlqueue_queue_oldest_due_age_seconds", queue="emails")
    assert age is not None and 600 <= age < 900
    assert sample(text, "sqlqueue_queue_oldest_due_age_seconds", queue="reports") is None
    assert sample(text, "sqlqueue_job_wait_seconds_bucket", queue="emails", le="5.0") == 2.0
    assert sample(text, "sqlqueue_job_wait_seconds_gcount", queue="emails") == 3.0
    assert sample(text, "sqlqueue_job_wait_seconds_gcount", queue="reports") == 1.0


def test_the_throughput_page_gives_wait_per_queue(admin_client) -> None:
    _latency_data()
    response = admin_client.get(reverse("admin:django_sqlqueue_throughput") + "?window=1h")
    by_queue = {r["queue"]: r for r in response.context["wait_by_queue"]}
    assert (by_queue["emails"]["n"], by_queue["emails"]["p50"], by_queue["emails"]["max"]) == (3, 4.0, 30.0)
    assert by_queue["reports"]["p95"] == 1.0
    assert response.context["wait_n"] == 4
