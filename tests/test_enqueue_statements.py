"""What one enqueue sends to the database (issue 30, items 1-2), counted with CaptureQueriesContext, and
when the wake-up goes out.

- One job in autocommit, natively or through ``task.enqueue()``: ONE round trip, its type cached.
- One job inside the caller's ``atomic()``: the INSERT alone (no SAVEPOINT, no notify statement); on
  PostgreSQL ONE notification per committed transaction, after its commit, naming every queue it
  enqueued to; none for a transaction rolled back.
- On PostgreSQL the notification is sent in a transaction of its own, after the jobs' commit: the job is
  visible to a listener when it arrives, and the session's ``synchronous_commit`` is left as it was.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.models import Job, JobType
from django_sqlqueue.states import Status

pytestmark = pytest.mark.django_db(transaction=True)


def _notes(conn: Any, wait: float) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=wait)]


def _warm(name: str = "Noop") -> None:
    """The type row and its cache, the connection: what a running app has after its first enqueue."""
    Job.objects.enqueue(name)


def test_one_enqueue_in_autocommit_is_one_round_trip(noop_type: JobType) -> None:
    _warm()
    with CaptureQueriesContext(connection) as sent:
        job = Job.objects.enqueue("Noop", {"to": "a@example.com"}, queue="mail", priority=2)
    assert len(sent.captured_queries) == 1, [q["sql"] for q in sent.captured_queries]
    assert "INSERT" in sent.captured_queries[0]["sql"].upper()  # SQL Server: one batch around it
    assert Job.objects.get(pk=job.pk).payload == {"to": "a@example.com"}


def test_one_enqueue_inside_atomic_sends_the_insert_alone(noop_type: JobType) -> None:
    _warm()
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent:
            jobs = [Job.objects.enqueue("Noop", {"i": i}) for i in range(3)]
        assert len(sent.captured_queries) == 3, [q["sql"] for q in sent.captured_queries]
        assert all("INSERT" in q["sql"].upper() for q in sent.captured_queries)
    assert Job.objects.filter(pk__in=[j.pk for j in jobs]).count() == 3


def test_a_failed_enqueue_inside_atomic_is_still_refused_before_any_statement(noop_type: JobType) -> None:
    from django_sqlqueue.exceptions import InvalidArgument, UnknownJobType

    _warm()
    with transaction.atomic():
        with CaptureQueriesContext(connection) as sent:
            with pytest.raises(InvalidArgument):
                Job.objects.enqueue("Noop", priority=10**6)
        assert sent.captured_queries == []
        with pytest.raises(UnknownJobType):
            Job.objects.enqueue("NoSuchType")
        job = Job.objects.enqueue("Noop")  # the transaction is still usable
    assert Job.objects.filter(pk=job.pk).exists()


def test_task_enqueue_in_autocommit_is_one_round_trip(noop_type: JobType) -> None:
    from testproject.testjobs import tasks as test_tasks

    test_tasks.noop.enqueue()  # validation, the type row: once per process
    with CaptureQueriesContext(connection) as sent:
        result = test_tasks.noop.enqueue()
    assert len(sent.captured_queries) == 1, [q["sql"] for q in sent.captured_queries]
    assert Job.objects.filter(pk=int(result.id)).exists()


def test_autocommit_enqueue_notifies_after_the_job_is_visible(noop_type: JobType, listener: Any) -> None:
    _warm()
    _notes(listener, 0.2)  # the warm-up's
    with connection.cursor() as cursor:  # durable commits for this session (the test cluster's may not be)
        cursor.execute("SET synchronous_commit TO on")
    job = Job.objects.enqueue("Noop", queue="mail")
    got = [n for n in listener.notifies(timeout=30, stop_after=1)]
    assert [n.payload for n in got] == ["mail"]
    # The listener's own session sees the committed job as soon as the notification is in.
    table = connection.ops.quote_name(Job._meta.db_table)
    assert listener.execute(f"SELECT count(*) FROM {table} WHERE id = %s", [job.pk]).fetchone()[0] == 1
    with connection.cursor() as cursor:  # the non-durable notify transaction left the session as it was
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"
        cursor.execute("RESET synchronous_commit")


def test_an_autocommit_enqueue_leaves_no_server_notice(noop_type: JobType, listener: Any) -> None:
    """The jobs' own transaction is explicit (BEGIN ... COMMIT): a COMMIT in an implicit block made the
    server warn "there is no transaction in progress" once per enqueue."""
    _warm()
    _notes(listener, 0.2)  # the warm-up's
    connection.ensure_connection()
    notices: list[str] = []

    def handler(diag: Any) -> None:
        notices.append(f"{diag.severity}: {diag.message_primary}")

    connection.connection.add_notice_handler(handler)
    try:
        for queue in ("mail", "sms"):
            Job.objects.enqueue("Noop", queue=queue)
    finally:
        connection.connection.remove_notice_handler(handler)
    assert notices == []
    assert sorted(n.payload for n in listener.notifies(timeout=30, stop_after=2)) == ["mail", "sms"]


def test_with_autocommit_off_the_wake_up_rides_in_the_transaction(noop_type: JobType, listener: Any) -> None:
    """An atomic() entered with AUTOCOMMIT off never runs on_commit hooks (Django): the wake-up goes in
    the transaction itself, delivered at its commit, and no hook is left behind."""
    _warm()
    _notes(listener, 0.2)
    transaction.set_autocommit(False)
    try:
        with transaction.atomic():
            Job.objects.enqueue("Noop", queue="off")
        hooks_left = list(connection.run_on_commit)
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert hooks_left == []
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["off"]


def test_one_notification_per_committed_transaction(noop_type: JobType, listener: Any) -> None:
    _warm()
    _notes(listener, 0.2)
    with transaction.atomic():
        Job.objects.enqueue("Noop", queue="a")
        Job.objects.enqueue("Noop", queue="b")
        Job.objects.enqueue("Noop", queue="a")
        assert _notes(listener, 0.3) == []  # nothing before the commit
    got = [n.payload for n in listener.notifies(timeout=30, stop_after=1)]
    assert got == ["a,b"]
    assert _notes(listener, 0.5) == []  # and only one


def test_a_rolled_back_transaction_sends_no_notification(noop_type: JobType, listener: Any) -> None:
    _warm()
    _notes(listener, 0.2)
    with pytest.raises(RuntimeError), transaction.atomic():
        Job.objects.enqueue("Noop", queue="a")
        raise RuntimeError("roll back")
    assert _notes(listener, 0.5) == []
    # A savepoint rolled back inside a committed transaction: the transaction's jobs are still announced.
    with transaction.atomic():
        job = Job.objects.enqueue("Noop", queue="kept")
        with pytest.raises(RuntimeError), transaction.atomic():
            Job.objects.enqueue("Noop", queue="dropped")
            raise RuntimeError("roll back the savepoint")
    got = [n.payload for n in listener.notifies(timeout=30, stop_after=1)]
    assert len(got) == 1 and "kept" in got[0].split(",")
    assert list(Job.objects.filter(queue__in=["kept", "dropped"]).values_list("pk", flat=True)) == [job.pk]


def test_concurrent_transactions_each_announce_their_own_jobs(noop_type: JobType, listener: Any) -> None:
    """The pending wake-ups belong to a connection (one per thread): one thread's commit never announces,
    nor swallows, another thread's queues."""
    import threading

    from django.db import connections

    _warm()
    _notes(listener, 0.2)
    inside, go = threading.Event(), threading.Event()

    def other() -> None:
        try:
            with transaction.atomic():
                Job.objects.enqueue("Noop", queue="other")
                inside.set()
                go.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(30)
    with transaction.atomic():
        Job.objects.enqueue("Noop", queue="mine")
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["mine"]
    go.set()
    thread.join(30)
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["other"]


def test_the_enqueued_result_is_what_the_constructor_builds(noop_type: JobType) -> None:
    """task.enqueue()'s result is built without TaskResult's constructor: every field must be the same."""
    from dataclasses import fields

    from django.tasks import TaskResult

    from django_sqlqueue.tasks.backend import build_result, enqueued_result
    from testproject.testjobs import tasks as test_tasks

    result = test_tasks.tick.enqueue("a label")
    job = Job.objects.get(pk=int(result.id))
    expected = build_result(test_tasks.tick, job, backend_alias=result.backend, history=[])
    for f in fields(TaskResult):
        assert getattr(result, f.name) == getattr(expected, f.name), f.name
    again = enqueued_result(test_tasks.tick, job, result.backend)
    assert type(again) is TaskResult and again.args == ["a label"] and again.kwargs == {}
    assert again.args is not job.payload["args"]  # its own list, as the constructor's copy is
    assert again.attempts == 0 and again.is_finished is False


def test_task_enqueued_reaches_any_receiver_and_the_debug_log(noop_type: JobType, caplog: Any) -> None:
    """task_enqueued is skipped only when its one receiver is Django's DEBUG log line and nobody would see
    that line: a receiver of one's own gets every enqueue, and so does a DEBUG log."""
    import logging

    from django.tasks.signals import task_enqueued

    from testproject.testjobs import tasks as test_tasks

    got: list[str] = []

    def mine(sender: Any, task_result: Any, **kwargs: Any) -> None:
        got.append(task_result.id)

    task_enqueued.connect(mine)
    try:
        result = test_tasks.noop.enqueue()
    finally:
        task_enqueued.disconnect(mine)
    assert got == [result.id]
    with caplog.at_level(logging.DEBUG, logger="django.tasks"):
        result = test_tasks.noop.enqueue()
    assert any(f"id={result.id}" in r.getMessage() and "enqueued" in r.getMessage() for r in caplog.records)


def test_one_enqueue_with_a_dedupe_key_in_autocommit(noop_type: JobType) -> None:
    """INSERT ... ON CONFLICT DO NOTHING alone (no BEGIN/COMMIT); the wake-up (PostgreSQL) only when a row
    went in; a second enqueue of the key returns the unfinished job, marked deduplicated."""
    _warm()
    wakes = 1 if connection.vendor == "postgresql" else 0
    with CaptureQueriesContext(connection) as sent:
        first = Job.objects.enqueue("Noop", {"n": 1}, dedupe_key="welcome:1")
    sqls = [q["sql"].lstrip().upper() for q in sent.captured_queries]
    if connection.vendor == "microsoft":  # one statement per keyed row, in a transaction: the general path
        assert Job.objects.filter(dedupe_key="welcome:1").count() == 1
        return
    assert len(sqls) == 1 + wakes and sqls[0].startswith("INSERT"), sqls
    with CaptureQueriesContext(connection) as sent:
        again = Job.objects.enqueue("Noop", {"n": 2}, dedupe_key="welcome:1")
    sqls = [q["sql"].lstrip().upper() for q in sent.captured_queries]
    assert len(sqls) == 2 and sqls[0].startswith("INSERT") and sqls[1].startswith("SELECT"), sqls  # no wake-up
    assert again.pk == first.pk and again.deduplicated and again.payload == {"n": 1}
    assert not getattr(first, "deduplicated", False)
    assert Job.objects.filter(dedupe_key="welcome:1").count() == 1
    Job.objects.filter(pk=first.pk).update(status_id=Status.COMPLETED)  # finished: the key is free again
    third = Job.objects.enqueue("Noop", dedupe_key="welcome:1")
    assert third.pk != first.pk and not getattr(third, "deduplicated", False)


def test_a_keyed_enqueue_in_autocommit_wakes_workers(noop_type: JobType, listener: Any) -> None:
    _warm()
    _notes(listener, 0.2)
    Job.objects.enqueue("Noop", queue="keyed", dedupe_key="k1")
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == ["keyed"]
    Job.objects.enqueue("Noop", queue="keyed", dedupe_key="k1")  # deduplicated: nothing new to wake for
    assert _notes(listener, 0.5) == []


#: 90 queue names of 100 characters: their list (9,089 bytes) is longer than PostgreSQL takes in one
#: notification (under 8,000 bytes).
MANY_QUEUES = [f"{i:02d}-" + "q" * 97 for i in range(90)]


def test_an_enqueue_to_more_queues_than_one_notification_names_wakes_every_queue(
        noop_type: JobType, listener: Any) -> None:
    """Before, the bulk enqueue sent the whole list and PostgreSQL refused it ("payload string too
    long"): the enqueue failed. Now the jobs go in and the wake-up names every queue."""
    from django_sqlqueue.dialects import WAKE_ALL
    from django_sqlqueue.queue import JobSpec

    _warm()
    _notes(listener, 0.2)
    jobs = Job.objects.enqueue_many([JobSpec("Noop", queue=q) for q in MANY_QUEUES])
    assert Job.objects.filter(pk__in=[j.pk for j in jobs]).count() == len(MANY_QUEUES)
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == [WAKE_ALL]
    with transaction.atomic():  # one transaction's wake-up after its commit, the same way
        for queue in MANY_QUEUES:
            Job.objects.enqueue("Noop", queue=queue)
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == [WAKE_ALL]
    Job.objects.enqueue_many([JobSpec("Noop", queue=q) for q in MANY_QUEUES[:3]])  # a short list is named
    assert [n.payload for n in listener.notifies(timeout=30, stop_after=1)] == [",".join(sorted(MANY_QUEUES[:3]))]


def test_a_worker_wakes_for_its_queues_or_for_all() -> None:
    from django_sqlqueue.dialects import WAKE_ALL, wake_payload, wakes

    assert wake_payload(["b", "a", "b"]) == "a,b"
    assert wake_payload(MANY_QUEUES) == WAKE_ALL
    assert len(wake_payload(MANY_QUEUES[:70]).encode()) < 8000  # the longest list still named
    assert wakes("a,b", ["b"]) and wakes("a,b", []) and wakes(WAKE_ALL, ["x"])
    assert not wakes("a,b", ["c"]) and not wakes("ab", ["a"])
