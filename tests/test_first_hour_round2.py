"""The first hour, round 2 (issue 32): each mistake a newcomer made is named once, truly, with a hint.

Items 6, 8, 9 and 10 here; the diagnosis (1, 7, 8's queue_why) in test_diagnose.py; the worker's start
line, unknown types, burst exits (2, 3, 13) in test_worker_serving.py; the process-level walk through
in test_newcomer_walkthrough.py.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

import django_sqlqueue as sqlqueue
from django_sqlqueue import InvalidArgument, UnknownJobType, handler, registry
from django_sqlqueue.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def welcome(db):
    handler("WelcomeEmail")(lambda job: None)
    yield
    registry.unregister("WelcomeEmail")


# ----- 6: every settings mistake at once (test_checks.py), "did you mean" for a job type ----------------
def test_an_enqueue_of_a_misspelt_type_suggests_the_registered_one(welcome) -> None:
    with pytest.raises(UnknownJobType, match=r"unknown job type 'WelcomEmail' \(did you mean 'WelcomeEmail'\?\)"):
        sqlqueue.enqueue("WelcomEmail", {"to": "a@example.com"})
    with pytest.raises(UnknownJobType) as caught:
        sqlqueue.enqueue("SomethingElseEntirely")
    assert "did you mean" not in str(caught.value)


# ----- 8: contradictions -------------------------------------------------------------------------------------
def test_purge_offers_only_finished_statuses() -> None:
    with pytest.raises(CommandError) as caught:
        call_command("purge_queue", "--older-than", "1d", "--status", "Done")
    text = str(caught.value)
    assert "Completed" in text and "Pending" not in text and "Waiting" not in text
    with pytest.raises(CommandError, match="--status Pending is not a finished status"):
        call_command("purge_queue", "--older-than", "1d", "--status", "Pending")


def test_a_bad_dependency_policy_names_the_option_the_caller_used(welcome) -> None:
    first = sqlqueue.enqueue("WelcomeEmail")
    with pytest.raises(InvalidArgument) as caught:
        sqlqueue.enqueue("WelcomeEmail", after=[(first, "skip")])
    assert "on_dependency_failure" in str(caught.value) and "on_failure must" not in str(caught.value)
    with pytest.raises(InvalidArgument, match="on_dependency_failure"):
        sqlqueue.enqueue("WelcomeEmail", after=[first], on_dependency_failure="skip")


# ----- 9: small API gaps -------------------------------------------------------------------------------------
def test_a_batch_handle_has_an_id_and_says_what_it_is(welcome) -> None:
    from django_sqlqueue.workflows.batches import batch, open_batch

    with batch(description="invoices", close=False) as b:
        b.enqueue("WelcomeEmail")
    assert b.id == b.pk and isinstance(b.id, int)
    assert repr(b) == f"<BatchHandle id={b.id} 'invoices' open on 'default'>"
    again = open_batch(b.id)
    again.close()
    assert repr(open_batch(b.id)).endswith("closed on 'default'>")


def test_dir_lists_the_lazy_names() -> None:
    names = dir(sqlqueue)
    assert {"Retry", "Cancel", "Fail", "JobSpec", "JobContext", "enqueue", "handler"} <= set(names)


def test_enqueue_spells_out_its_options() -> None:
    import inspect

    params = inspect.signature(sqlqueue.enqueue).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    manager = inspect.signature(Job.objects.enqueue).parameters
    assert list(params) == list(manager)  # the same options as Job.objects.enqueue, in its order


def test_enqueue_and_the_manager_take_the_same_options_with_the_same_defaults() -> None:
    """``django_sqlqueue.enqueue`` copies the manager's options by hand (issue 32: explicit keywords, not
    ``**kwargs``), so nothing but this test stops the two from drifting apart: an option added to one
    only, a default changed in one only, or a keyword-only option turned positional."""
    import inspect

    def options(func: object) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]  # type: ignore[arg-type]

    shortcut, manager = options(sqlqueue.enqueue), options(Job.objects.enqueue)
    assert shortcut == manager
    keyword_only = [name for name, kind, _default in manager if kind is inspect.Parameter.KEYWORD_ONLY]
    assert {"queue", "delay", "using", "concurrency_key"} <= set(keyword_only)  # the options are all there


def test_a_handler_that_takes_no_argument_is_refused_at_registration() -> None:
    with pytest.raises(InvalidArgument, match=r"must take job \(def f\(job\)\)"):
        handler("NoArgs")(lambda: None)
    with pytest.raises(InvalidArgument, match=r"must take job and step"):
        handler("OneStepArg", steps=["a", "b"])(lambda job: None)
    assert not registry.is_registered("NoArgs") and not registry.is_registered("OneStepArg")
    handler("Flexible")(lambda *args, **kwargs: None)  # a callable that takes the job is fine
    registry.unregister("Flexible")


def test_a_concurrency_key_without_a_limit_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="concurrency_key but no concurrency_limit"):
        handler("KeyNoLimit", concurrency_key="account")(lambda job: None)
    handler("KeyWithLimit", concurrency_key="account", concurrency_limit=2)(lambda job: None)
    registry.unregister("KeyWithLimit")


# ----- 9 (Tasks on ImmediateBackend) and 10 (a @task outside an installed app) ---------------------------------
@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    """A task module on sys.path that is no installed app's, with a second task on another queue."""
    pytest.importorskip("django.tasks")
    (tmp_path / "outside_tasks.py").write_text(textwrap.dedent("""
        from django.tasks import task

        @task
        def nightly(n=1):
            return n

        @task(queue_name="emails")
        def mail():
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "outside_tasks"
    sys.modules.pop("outside_tasks", None)


def test_a_task_outside_installed_apps_may_be_scheduled_from_settings(outside_module, settings) -> None:
    from django_sqlqueue.schedules import ScheduleError, check_target

    path = f"{outside_module}.nightly"
    # Typed into the admin: refused, with the real rule and its reason (not "not a @task").
    with pytest.raises(ScheduleError) as caught:
        check_target("", path, {"args": [], "kwargs": {}}, "default", 0)
    assert "not in an installed app" in str(caught.value) and "not the import path" not in str(caught.value)
    # Declared in settings: the developer's own code, allowed; its tick enqueues and runs.
    settings.SQLQUEUE = {**settings.SQLQUEUE, "SCHEDULES": {"nightly": {"task": path, "every": 60}}}
    check_target("", path, {"args": [], "kwargs": {}}, "default", 0)
    from django_sqlqueue.schedules import declared_errors

    assert declared_errors() == []


def test_a_schedule_check_on_immediate_backend_names_the_backend(outside_module) -> None:
    from django_sqlqueue.schedules import ScheduleError, check_target

    with override_settings(TASKS={"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}):
        with pytest.raises(ScheduleError) as caught:
            check_target("", f"{outside_module}.nightly", {"args": [], "kwargs": {}}, "default", 0)
    text = str(caught.value)
    assert "ImmediateBackend" in text and "SqlQueueBackend" in text and "emails" not in text


# ----- 12: times in one format, with their zone; a hint before the first sync ---------------------------------
def test_the_job_page_shows_started_and_finished_alike(admin_client, welcome) -> None:
    from django.urls import reverse

    from django_sqlqueue.ops.timefmt import stamp

    job = sqlqueue.enqueue("WelcomeEmail")
    claimed = Job.objects.claim("w", 1)[0]
    done = Job.objects.complete(claimed)
    html = admin_client.get(reverse("admin:django_sqlqueue_job_change", args=[job.pk])).content.decode()
    started = html[html.index("field-started_full"):][:400]
    finished = html[html.index("field-finished"):][:400]
    assert stamp(done.started_at) in started and stamp(done.finished_at) in finished
    assert stamp(done.started_at)[:10] == done.started_at.strftime("%Y-%m-%d")  # the date, not the time alone


def test_queue_schedules_hints_before_the_first_sync_and_prints_one_time_format(settings) -> None:
    from io import StringIO

    from django_sqlqueue import schedules

    settings.SQLQUEUE = {**settings.SQLQUEUE,
                         "SCHEDULES": {"digest": {"type": "test.Noop", "cron": "0 7 * * *", "timezone": "Europe/Paris"}}}
    out = StringIO()
    call_command("queue_schedules", stdout=out)
    assert "no schedules in the table yet; SQLQUEUE['SCHEDULES'] declares 1 (digest)" in out.getvalue()
    assert "queue_schedules --sync" in out.getvalue()
    schedules.sync_schedules()
    out = StringIO()
    call_command("queue_schedules", "--next", "2", stdout=out)
    nexts = [line for line in out.getvalue().splitlines() if line.strip().startswith("next:")]
    assert len(nexts) == 2
    for line in nexts:  # "next: 2026-11-27 06:00:00 UTC (Europe/Paris: 2026-11-27 07:00:00 CET)"
        assert line.strip()[6:].count(":") == 5 and " UTC (Europe/Paris: " in line and line.endswith(("CET)", "CEST)"))


def test_relative_times_agree_in_number() -> None:
    """"1 second", "in 1 second" (the job list showed "running 1 seconds"); never "0 minutes"."""
    from datetime import timedelta

    from django.utils import timezone

    from django_sqlqueue.ops.timefmt import ago, until

    now = timezone.now()
    assert ago(now - timedelta(seconds=1.5), now) == "1 second"
    assert ago(now - timedelta(seconds=12), now) == "12 seconds"
    assert ago(now, now) == "0 seconds"
    assert until(now + timedelta(seconds=1), now) == "in 1 second"
    assert until(now + timedelta(seconds=42), now) == "in 42 seconds"
    assert until(now + timedelta(minutes=3, seconds=1), now) == "in 3\xa0minutes"
