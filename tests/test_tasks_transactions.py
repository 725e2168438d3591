"""Enqueueing a task inside ``transaction.atomic()`` commits or rolls back with the caller's data."""

from __future__ import annotations

import threading
from functools import partial

import pytest
from django.db import connection, transaction
from django.tasks import default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist

from django_sqlqueue.models import Job
from testproject.notifications.models import Outbox

from . import test_tasks_defs as defs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def tasks_backend(settings):
    settings.TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend"}}


def seen_by_another_connection(job_id: int) -> bool:
    """Does a second connection (a worker's view) see the job row?"""
    found: list[bool] = []

    def look() -> None:
        try:
            found.append(Job.objects.filter(pk=job_id).exists())
        finally:
            connection.close()

    t = threading.Thread(target=look)
    t.start()
    t.join(30)
    return found[0]


class Boom(Exception):
    pass


def test_rollback_takes_the_task_with_it() -> None:
    with pytest.raises(Boom):
        with transaction.atomic():
            Outbox.objects.create(job_id=0, channel="email", recipient="a@example.com", body="hi")
            result = defs.noop_task.enqueue()
            assert Job.objects.filter(pk=int(result.id)).exists()  # visible to the caller...
            assert not seen_by_another_connection(int(result.id))  # ...not to a worker yet
            raise Boom
    assert not Job.objects.exists() and not Outbox.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)


def test_commit_makes_data_and_task_visible_together() -> None:
    with transaction.atomic():
        Outbox.objects.create(job_id=0, channel="email", recipient="a@example.com", body="hi")
        result = defs.noop_task.enqueue()
    assert seen_by_another_connection(int(result.id))
    assert Outbox.objects.count() == 1
    assert default_task_backend.get_result(result.id).id == result.id


def test_savepoint_rollback_drops_only_the_inner_enqueue() -> None:
    with transaction.atomic():
        kept = defs.noop_task.enqueue()
        try:
            with transaction.atomic():
                defs.noop_task.enqueue()
                raise Boom
        except Boom:
            pass
    assert list(Job.objects.values_list("pk", flat=True)) == [int(kept.id)]


def test_on_commit_pattern_for_data_in_another_database() -> None:
    with transaction.atomic():
        transaction.on_commit(partial(defs.noop_task.enqueue, 7))
        assert not Job.objects.exists()
    assert Job.objects.get().payload["args"] == [7]
