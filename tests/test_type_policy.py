"""A policy set in code holds: handler options reach job type rows, operators' changes win and show.

Issue 20 item 1: a row created by an enqueue before migrate's sync had the name only (the job was
retried 3 times although the handler said ``max_attempts=1``), and later code changes never reached
existing rows.
"""

from __future__ import annotations

import pytest
from django.core import checks
from django.core.management import call_command

from django_sqlqueue import jobtypes
from django_sqlqueue.handlers import registry, sync_job_types
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status

from .test_tasks_defs import run_one

pytestmark = pytest.mark.django_db

NAME = "policy.ChargeCard"


@pytest.fixture
def charge_card():
    """A handler declared with max_attempts=1 whose row does not exist yet (enqueue before migrate)."""
    calls: list[int] = []

    def charge(job) -> None:
        calls.append(job.pk)
        raise RuntimeError("card declined")

    registry.register(NAME, charge, max_attempts=1, timeout_seconds=30)
    JobType.objects.filter(name=NAME).delete()
    jobtypes.clear_cache()
    yield calls
    registry.unregister(NAME)


def reregister(**options) -> None:
    """The code changed: the same handler declared with other options (a deploy)."""
    old = registry.get(NAME)
    registry.unregister(NAME)
    registry.register(NAME, old.func, **options)


def test_an_enqueue_before_migrate_creates_the_row_with_the_handlers_options(charge_card) -> None:
    job = Job.objects.enqueue(NAME, {})
    row = JobType.objects.get(name=NAME)
    assert (row.max_attempts, row.timeout_seconds) == (1, 30)
    assert run_one().state is Status.FAILED  # never retried: the code says one attempt
    assert charge_card == [job.pk] and run_one() is None


def test_migrate_repairs_a_row_created_with_the_name_only(charge_card) -> None:
    JobType.objects.create(name=NAME)  # what an enqueue before this fix left behind
    call_command("migrate", verbosity=0)
    row = JobType.objects.get(name=NAME)
    assert (row.max_attempts, row.timeout_seconds) == (1, 30)


def test_a_code_change_reaches_rows_an_operator_has_not_edited(charge_card) -> None:
    sync_job_types()
    reregister(max_attempts=1, timeout_seconds=60)
    call_command("migrate", verbosity=0)
    assert JobType.objects.get(name=NAME).timeout_seconds == 60
    reregister(max_attempts=2)  # an option dropped from the code: the row goes back to the default
    sync_job_types()
    row = JobType.objects.get(name=NAME)
    assert (row.max_attempts, row.timeout_seconds) == (2, None)


def test_an_operators_change_wins_and_check_shows_the_disagreement(charge_card) -> None:
    sync_job_types()
    row = JobType.objects.get(name=NAME)
    row.max_attempts = 5  # the operator's run-time override (admin or shell)
    row.save()
    reregister(max_attempts=2, timeout_seconds=45)
    report = sync_job_types()
    row.refresh_from_db()
    assert (row.max_attempts, row.timeout_seconds) == (5, 45)  # kept; the untouched field followed the code
    assert report[NAME].operator == {"max_attempts": (5, 2)}
    found = [m for m in checks.run_checks(databases=["default"]) if m.obj == NAME]
    assert [(m.id, "max_attempts is 5 on its row, the handler says 2" in m.msg) for m in found] == [
        ("sqlqueue.W010", True)]
    row.max_attempts = None  # blanking hands the setting back to the code
    row.save()
    assert sync_job_types()[NAME].operator == {}
    row.refresh_from_db()
    assert row.max_attempts == 2


def test_check_reports_a_code_change_not_yet_written_to_the_row(charge_card) -> None:
    sync_job_types()
    reregister(max_attempts=3, timeout_seconds=30)
    found = [(m.id, m.msg) for m in checks.run_checks(databases=["default"]) if m.obj == NAME]
    assert found == [("sqlqueue.W011", f"job type {NAME!r}: the handler says max_attempts=3, its row still has 1")]


def test_handler_options_are_checked_when_declared() -> None:
    from django_sqlqueue import InvalidArgument

    for bad in ({"max_attempts": 0}, {"timeout_seconds": "60"}, {"backoff_base_seconds": -1},
                {"description": 5}):
        with pytest.raises(InvalidArgument, match="handler option"):
            registry.register("policy.Bad", lambda job: None, **bad)
    assert "policy.Bad" not in {h.name for h in registry.all()}


def test_the_admin_shows_where_a_row_and_its_handler_disagree(charge_card, admin_client) -> None:
    from django.urls import reverse

    sync_job_types()
    JobType.objects.filter(name=NAME).update(max_attempts=5)  # an operator's change
    row = JobType.objects.get(name=NAME)
    html = admin_client.get(reverse("admin:django_sqlqueue_jobtype_changelist")).content.decode()
    assert "max_attempts: 5 (code: 1)" in html
    html = admin_client.get(reverse("admin:django_sqlqueue_jobtype_change", args=[row.pk])).content.decode()
    assert "changed by an operator" in html
