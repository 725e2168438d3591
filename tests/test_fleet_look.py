"""The fleet's look (issue 28): one statement from the maintenance holder names the queues with due work,
so a listening worker's idle slots need not poll.

- What the look names (PostgreSQL, its real notification read by a LISTEN of the test's own): the queues
  of due jobs, of Processing jobs a claim would take back, of limited jobs with a free permit; never a
  paused queue's or type's, nor jobs not yet due. With nothing due it still arrives, naming nothing.
- The board (every vendor, no database): while looks arrive the poller waits for a bell like the other
  idle slots; once they stop arriving it polls on its own interval again.
- A real worker: a delayed job whose enqueue woke nobody is picked up by a bell the look rang, not by
  a poll.
"""

from __future__ import annotations

import multiprocessing
import re
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import jobtypes
from django_sqlqueue.conf import get_settings
from django_sqlqueue.dialects import get_dialect, wake
from django_sqlqueue.models import Job, JobType, LimitPermit
from django_sqlqueue.states import Status
from django_sqlqueue.worker.contract import WakeBoard
from django_sqlqueue.worker.maintenance import Maintenance
from tests import workerutil as wu
from tests.procutil import listening

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
worker_procs = wu.worker_procs


def _named(payload: str) -> dict[str, str]:
    """What a look's payload names (after its mark, its interval and its mark): queue -> jobs."""
    items = [i for i in payload[len(wake.LOOK_MARK):].partition(wake.LOOK_MARK)[2].split(wake.LOOK_SEP) if i]
    return {i.rpartition(":")[0] or i: i.rpartition(":")[2] for i in items}


def _names(payload: str) -> list[str]:
    """The queues a look's payload names."""
    return sorted(_named(payload))


def _looks(conn: Any, timeout: float = 0.5) -> list[list[str]]:
    """The looks that arrived within ``timeout`` (the queues each names), enqueues' notifications left out."""
    return [_names(n.payload) for n in conn.notifies(timeout=timeout) if wake.is_look(n.payload)]


def _next_look(conn: Any) -> list[str]:
    """The queues named by the next look to arrive (waits for it: a bound, not a duration)."""
    for note in conn.notifies(timeout=60):
        if wake.is_look(note.payload):
            assert wake.look_interval(note.payload) == get_settings().FLEET_LOOK_SECONDS
            return _names(note.payload)
    raise AssertionError("no look arrived within 60 s")


def _wakes_for(conn: Any, queue: str) -> bool:
    """Whether a plain wake-up (an enqueue's, a modify's) that wakes the workers of ``queue`` arrives (waits
    up to 60 s). As a worker reads it: ``*`` wakes every queue's, and the queues a rolled-back transaction
    of an earlier test left pending on this connection widen the next wake-up (wakeups.notify_on_commit),
    up to ``*`` when they are many."""
    for note in conn.notifies(timeout=60):
        if not wake.is_look(note.payload) and wake.wakes(note.payload, [queue]):
            return True
    return False


def _look_with_rows(conn: Any, rows: int, *, read: bool = True) -> list[str]:
    """Send a look on the test's channel that reads at most ``rows`` per part, 60 s back; the queues it
    names (``read``), else nothing (the caller reads the notification)."""
    sql, args = get_dialect(connection).fleet_look_sql(
        "look_test", interval=2.0, since_seconds=60, default_max_attempts=3, worker_dead_after_seconds=60,
        rows=rows)
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
    return _next_look(conn) if read else []


def _look_once(conn: Any) -> list[str]:
    list(conn.notifies(timeout=0.2))  # what came before
    Maintenance("default", "test-holder")._look()
    return _next_look(conn)


def test_the_look_names_the_queues_with_work_a_claim_could_take(listener: Any) -> None:
    JobType.objects.get_or_create(name="Noop")
    assert _look_once(listener) == []  # nothing due: it arrives, naming nothing
    now = timezone.now()
    Job.objects.enqueue("Noop", queue="due")
    Job.objects.enqueue("Noop", queue="later", scheduled_for=now + timedelta(days=1))
    # Due long before the look's window: named by no look (a queue nobody serves wake.wakes nobody; a job
    # made claimable late wake.wakes its queue itself, see below)
    Job.objects.enqueue("Noop", queue="old", scheduled_for=now - timedelta(minutes=10))
    Job.objects.enqueue("Noop", queue="held")
    Job.objects.pause_queue("held")
    JobType.objects.get_or_create(name="Frozen")
    Job.objects.enqueue("Frozen", queue="frozen")
    JobType.objects.filter(name="Frozen").update(paused=True)
    jobtypes.clear_cache()
    taken = Job.objects.enqueue("Noop", queue="dead")  # its lease ran out within the look's window
    Job.objects.filter(pk=taken.pk).update(status_id=Status.PROCESSING, worker="gone:1",
                                           lease_expires_at=now - timedelta(seconds=20))
    long_gone = Job.objects.enqueue("Noop", queue="long-dead")  # ran out long ago: named by an earlier look
    Job.objects.filter(pk=long_gone.pk).update(status_id=Status.PROCESSING, worker="gone:1",
                                               lease_expires_at=now - timedelta(minutes=10))
    running = Job.objects.enqueue("Noop", queue="running")
    Job.objects.filter(pk=running.pk).update(status_id=Status.PROCESSING, worker="gone:1",
                                             lease_expires_at=now + timedelta(hours=1))
    assert _look_once(listener) == ["dead", "due"]

    # Limited types: each scope with a free permit names the queues of its due jobs; not while its one
    # permit is held.
    for name in ("Export", "Report"):
        JobType.objects.update_or_create(name=name, defaults={"concurrency_limit": 1})
    jobtypes.clear_cache()
    Job.objects.enqueue("Export", queue="exports")
    Job.objects.enqueue("Export", queue="exports-b")
    Job.objects.enqueue("Report", queue="reports")
    assert Job.objects.filter(queue="exports", limited=True).exists()
    named = _look_once(listener)
    assert {"exports", "exports-b", "reports"} <= set(named), named
    claimed = Job.objects.claim("w1", limit=1, queues=["exports"])
    assert [j.queue for j in claimed] == ["exports"]
    named = _look_once(listener)
    assert "exports-b" not in named and "reports" in named, named


def test_the_look_names_every_queue_when_its_taken_back_or_scope_part_is_full() -> None:
    """The jobs to take back and the limit scopes are read up to ``rows`` too: full, there may be more
    beyond (in queues it did not name), so the look says ``*``. Found by a review."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    JobType.objects.get_or_create(name="Noop")
    now = timezone.now()
    for i in range(3):  # three leases that ran out within the window, due long before it
        job = Job.objects.enqueue("Noop", queue=f"gone{i}", scheduled_for=now - timedelta(hours=1))
        Job.objects.filter(pk=job.pk).update(status_id=Status.PROCESSING, worker="gone:1",
                                             lease_expires_at=now - timedelta(seconds=10))
    with listening("look_test") as conn:
        assert _look_with_rows(conn, 2) == ["*"]
        assert _look_with_rows(conn, 10) == ["gone0", "gone1", "gone2"]


def test_the_look_names_every_queue_when_many_jobs_came_due() -> None:
    """Past ``rows`` jobs in its window the look says ``*`` (a busy fleet) rather than read further."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    JobType.objects.get_or_create(name="Noop")
    for i in range(4):
        Job.objects.enqueue("Noop", queue=f"q{i}")
    with listening("look_test") as conn:
        Job.objects.enqueue("Noop", queue="q0")
        assert _look_with_rows(conn, 3) == ["*"]
        assert _look_with_rows(conn, 10) == ["q0", "q1", "q2", "q3"]
        # each queue with the number of its jobs: a worker wake.wakes as many idle slots
        _look_with_rows(conn, 10, read=False)
        payload = next(n.payload for n in conn.notifies(timeout=60) if wake.is_look(n.payload))
        assert _named(payload) == {"q0": "2", "q1": "1", "q2": "1", "q3": "1"}
        assert wake.look_jobs(payload, ["q0", "q3"]) == 3 and wake.look_jobs(payload, ["x"]) == 0
        assert wake.look_jobs(payload, []) == 5


def test_a_job_made_claimable_again_wakes_its_queue(listener: Any) -> None:
    """A hand-back, a release from a workflow, a retry, a resume: claimable with a due time long past, so
    no look names them; the change itself wake.wakes the queue's workers."""
    JobType.objects.get_or_create(name="Noop")
    job = Job.objects.enqueue("Noop", queue="handed", scheduled_for=timezone.now() - timedelta(hours=1))
    (claimed,) = Job.objects.claim("w1", limit=1, queues=["handed"])
    list(listener.notifies(timeout=0.2))
    Job.objects.release(claimed)
    assert _wakes_for(listener, "handed")
    assert Job.objects.get(pk=job.pk).state == Status.PENDING
    Job.objects.pause_queue("paused-q")
    Job.objects.enqueue("Noop", queue="paused-q")
    list(listener.notifies(timeout=0.2))
    assert Job.objects.resume_queue("paused-q")
    assert _wakes_for(listener, "paused-q")
    # A job type resumed (here as the admin's change form saves it): every queue, its jobs may be in any.
    noop = JobType.objects.get(name="Noop")
    noop.paused = True
    noop.save()
    list(listener.notifies(timeout=0.2))
    noop.paused = False
    noop.save()
    assert _wakes_for(listener, wake.WAKE_ALL)


def test_the_look_is_one_statement_of_index_seeks() -> None:
    """The look's plan reads no job table whole, whatever the backlog (here 3,000 future jobs and 5,200
    due); on the other vendors there is no look (no notifications): the workers poll as before."""
    settings = get_settings()
    look = get_dialect(connection).fleet_look_sql(settings.NOTIFY_CHANNEL, interval=2.0, since_seconds=60,
                                                  default_max_attempts=3, worker_dead_after_seconds=60, rows=200)
    if connection.vendor != "postgresql":
        assert look is None
        return
    from django_sqlqueue.queue import JobSpec

    JobType.objects.get_or_create(name="Noop")
    later = timezone.now() + timedelta(days=1)
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, scheduled_for=later) for i in range(3000))
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, queue=f"q{i % 7}") for i in range(200))
    Job.objects.enqueue_many(JobSpec("Noop", {"i": i}, queue="deep") for i in range(5000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("EXPLAIN " + look[0], look[1])
        lines = [r[0] for r in cursor.fetchall()]
    table = Job._meta.db_table
    assert not any(re.search(rf"Seq Scan on {table}\s", line) for line in lines), lines
    # the due jobs newest first, from now backwards, stopped at its rows: not every due job read and sorted
    assert any("Index Scan Backward using sqlqueue_job_claim" in line for line in lines), lines


def test_a_look_payload_wakes_only_the_workers_of_the_queues_it_names() -> None:
    look = f"{wake.LOOK_MARK}2.5/8{wake.LOOK_MARK}"  # sent every 2.5 s; 8 live slots in the fleet
    assert wake.look_interval(look) == 2.5 and wake.look_interval("mail") is None
    assert not wake.wakes(look, [])  # naming nothing wake.wakes nobody, not even a worker of every queue
    assert not wake.wakes(look, ["mail"])
    both = look + f"mail:1{wake.LOOK_SEP}sms,eu:6"  # a queue name may hold a comma
    assert wake.wakes(both, ["sms,eu"]) and not wake.wakes(both, ["sms"]) and not wake.wakes(both, ["push"])
    assert wake.look_jobs(both, ["sms,eu", "mail"]) == 7 and wake.look_jobs("mail", ["mail"]) == 0
    # A worker wake.wakes its share: its slots among the fleet's (6 jobs, 2 of 8 slots: 2), one at least.
    assert wake.look_wakes(both, ["sms,eu"], 2) == 2 and wake.look_wakes(both, ["mail"], 2) == 1
    assert wake.look_wakes(both, ["sms,eu"], 8) == 6 and wake.look_wakes(both, ["push"], 2) == 0
    assert wake.wakes(look + "*", ["push"]) and wake.look_wakes(look + "*", ["push"], 4) == 4 and wake.wakes("mail", [])
    assert wake.wake_payload(["mail", wake.WAKE_ALL]) == wake.WAKE_ALL  # a resumed type: every queue, whatever else


def test_while_looks_arrive_the_poller_waits_for_a_bell_and_polls_again_when_they_stop(monkeypatch) -> None:
    """Which event ends each wait, never how long it took: the backstop is made an hour, and a wait that
    should end by the poller's own interval is given a stop that never fires (a wrong one would hang
    until the test's timeout), one that should not end by it, a stop that records that it fired."""
    from django_sqlqueue.worker import contract

    monkeypatch.setattr(contract, "IDLE_BACKSTOP_SECONDS", 3600.0)
    board = WakeBoard(multiprocessing.get_context("spawn"), 2)
    board.listening.value = 1
    never = lambda: False  # noqa: E731
    fired: list[bool] = []

    def stop_later():  # noqa: ANN202  (fires after the poller's interval has passed many times over)
        until = time.monotonic() + 1.5

        def stop() -> bool:
            if time.monotonic() >= until:
                fired.append(True)
            return bool(fired)
        return stop

    # No look yet: the first idle slot is the poller and its own interval ends its wait.
    assert board.wait(0, 0.05, never) is False and board.poller.value == 0
    # Looks arrive: the poller's interval no longer ends its wait; the stop (or a bell) does.
    board.looked(10.0)
    assert board.wait(0, 0.05, stop_later()) is False and fired
    # ... and a bell does.
    board.looked(10.0)
    board.idle[1] = 0
    woken: list[bool] = []
    import threading

    waiter = threading.Thread(target=lambda: woken.append(board.wait(0, 0.05, never)))
    waiter.start()
    wu.wait_until(lambda: board.idle[0] == 1, 30, what="the poller idle")
    assert board.wake_one()
    waiter.join(30)
    assert woken == [True]
    # The looks stop arriving (fresh for 3 intervals of 0.1 s): the poller polls again on its own
    # interval, not at its (hour-long) backstop.
    board.looked(0.1)
    assert board.wait(0, 0.05, never) is False
    # Not listening: a look is never heard, and the poller polls.
    board.listening.value = 0
    board.looked(10.0)
    assert board.wait(0, 0.05, never) is False


def test_a_delayed_job_nobody_was_told_of_is_picked_up_by_the_looks_bell(worker_procs, listener: Any) -> None:
    """One slot, DEBUG logs: a slot woken by a bell logs ``slot_woken``; one that polled does not. The job
    is enqueued with no notification of its own (NOTIFY_CHANNEL off in this process), due in 3 s, after
    the worker's looks arrive: only the look can ring for it."""
    JobType.objects.get_or_create(name="test.Noop")
    w = worker_procs("--worker-name", "looked", "--concurrency", "1", "--queue", "looked", "--log-level", "DEBUG")
    wu.wait_until(lambda: "worker_started" in w.stderr(), 90, what=f"worker_started\n{w.output()}")
    wu.wait_until(lambda: _looks(listener), 90, what=f"a look\n{w.output()}")
    woken_before = w.stderr().count("slot_woken")
    with override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "NOTIFY_CHANNEL": ""}):
        job = Job.objects.enqueue("test.Noop", queue="looked", scheduled_for=timezone.now() + timedelta(seconds=3))
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 90,
                  what=f"the delayed job to complete\n{w.output()}")
    named = wu.wait_until(lambda: any("looked" in names for names in _looks(listener)) or None, 30,
                          what="a look naming the queue")
    assert named
    assert w.stderr().count("slot_woken") > woken_before, w.output()
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()


def test_a_look_naming_several_jobs_wakes_as_many_idle_slots() -> None:
    board = WakeBoard(multiprocessing.get_context("spawn"), 3)
    board.idle[0] = board.idle[1] = board.idle[2] = 1
    assert board.wake_some(2) == 2 and sum(board.idle[:]) == 1
    assert board.wake_some(5) == 1 and sum(board.idle[:]) == 0
    assert board.wake_some(3) == 0 and board.pending.value == 1  # kept once for the next slot to idle
    assert board.wake_some(0) == 0 and board.pending.value == 1


def test_a_burst_the_look_names_wakes_every_idle_slot_one_after_the_other(worker_procs, listener: Any,
                                                                           tmp_path) -> None:
    """Four long jobs that no notification announced (NOTIFY off in this process): the look names their
    queue with their number, and the worker wake.wakes four idle slots at once. Woken one per look, the later
    ones would wait for a slot's 30 s backstop and take their jobs without a bell."""
    JobType.objects.get_or_create(name="test.Sleep")
    w = worker_procs("--worker-name", "burst", "--concurrency", "4", "--queue", "burst", "--log-level", "DEBUG")
    wu.wait_until(lambda: w.stderr().count("wakeup=listen") == 4, 90, what=f"four listening slots\n{w.output()}")
    # Every slot has made its first claim (after its first beat) and waits on the board.
    wu.wait_until(lambda: w.stderr().count("slot_waiting") == 4, 90, what=f"four waiting slots\n{w.output()}")
    list(listener.notifies(timeout=0.1))
    wu.wait_until(lambda: _looks(listener), 90, what=f"a look\n{w.output()}")
    woken_before = w.stderr().count("slot_woken")
    release = tmp_path / "release"
    from django_sqlqueue.queue import JobSpec

    with override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "NOTIFY_CHANNEL": ""}):
        jobs = Job.objects.enqueue_many(
            JobSpec("test.Sleep", {"seconds": 120, "until": str(release)}, queue="burst") for _ in range(4))
    ids = [j.pk for j in jobs]
    wu.wait_until(lambda: Job.objects.filter(pk__in=ids, status_id=Status.PROCESSING).count() == 4, 90,
                  what=f"the four jobs running\n{w.output()}")
    assert len(set(Job.objects.filter(pk__in=ids).values_list("worker", flat=True))) == 4  # one per slot
    assert w.stderr().count("slot_woken") - woken_before >= 4, w.output()
    release.write_text("go")
    wu.wait_until(lambda: Job.objects.filter(pk__in=ids, status_id=Status.COMPLETED).count() == 4, 90,
                  what=f"the four jobs done\n{w.output()}")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()


def test_a_permit_a_finish_releases_names_the_queues_of_its_scopes_waiting_jobs(listener: Any) -> None:
    """A limited job waiting in a queue the finishing worker does not serve: its scope's permit, freed by
    the finish, is named by the next look (PostgreSQL stamps the release), so no backstop claim is needed.
    Both jobs came due long before the look's window: only the release can name the scope."""
    JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": 1})
    jobtypes.clear_cache()
    long_ago = timezone.now() - timedelta(minutes=10)
    Job.objects.enqueue("Export", queue="exports", scheduled_for=long_ago)
    Job.objects.enqueue("Export", queue="exports-b", scheduled_for=long_ago)
    (running,) = Job.objects.claim("w1", limit=1, queues=["exports"])
    assert "exports-b" not in _look_once(listener)  # its permit is held
    Job.objects.complete(running)
    assert _look_once(listener) == ["exports-b"]


def test_while_looks_arrive_no_idle_slot_claims_at_its_backstop(monkeypatch) -> None:
    """A slot that is not the poller: while looks arrive its (short) backstop does not end its wait; once
    they stop, it does again. Which event ends each wait, not how long it took (see the test above)."""
    from django_sqlqueue.worker import contract

    monkeypatch.setattr(contract, "IDLE_BACKSTOP_SECONDS", 0.05)
    monkeypatch.setattr(contract, "LOOKED_BACKSTOP_SECONDS", 3600.0)
    board = WakeBoard(multiprocessing.get_context("spawn"), 2)
    board.listening.value = 1
    board.poller.value = 1  # slot 1 polls: slot 0 waits for a bell or its backstop
    fired: list[bool] = []
    until = time.monotonic() + 1.5

    def stop_later() -> bool:
        if time.monotonic() >= until:
            fired.append(True)
        return bool(fired)

    board.looked(10.0)
    assert board.wait(0, 0.01, stop_later) is False and fired
    board.looked(0.01)  # the looks stop: counted as running for 0.3 s only
    assert board.wait(0, 0.01, lambda: False) is False  # its backstop ends it (or the test times out)


def test_a_worker_that_hears_the_look_does_not_try_for_the_lease() -> None:
    """While the holder's looks arrive, the lease is alive: a worker that does not hold it tries once (its
    start), then sends no try (an UPDATE that would match nothing) but one every HEARD_TRY_SECONDS; once
    the looks stop, it tries at its next turn, and takes a free lease."""
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.models import MaintenanceLease
    from django_sqlqueue.worker import maintenance

    table = MaintenanceLease._meta.db_table
    holder = Maintenance("default", "holder")
    holder.run()
    assert holder.holding
    hearing = Maintenance("default", "hearing", look_heard=lambda: True)

    def tries() -> int:
        hearing.next_at = 0.0
        with CaptureQueriesContext(connection) as queries:
            hearing.run()
        return len([q for q in queries if table in q["sql"]])

    assert tries() >= 1 and not hearing.holding  # its first turn tries
    assert tries() == 0 and tries() == 0  # then, hearing looks, it does not
    hearing._try_anyway_at = time.monotonic() - 1  # HEARD_TRY_SECONDS later
    assert tries() >= 1 and tries() == 0 and maintenance.HEARD_TRY_SECONDS >= 60
    holder.release()
    hearing.look_heard = lambda: False  # the looks stop (the holder stopped)
    assert tries() >= 1 and hearing.holding
    hearing.release()


def test_a_listener_on_its_own_connection_wakes_every_idle_slot_when_it_listens_again() -> None:
    """``LISTEN_DATABASE``'s listener (a thread, a connection of its own): its connection is cut (the
    server ends its session), it LISTENs again, and every idle slot is woken once, since what was sent in
    between went unheard and no look names it again."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    from django_sqlqueue.worker.wakeup import ListenerThread, PgListener

    listener = PgListener.for_alias("default", get_settings().NOTIFY_CHANNEL, queues=("default",))
    assert listener is not None
    board = WakeBoard(multiprocessing.get_context("spawn"), 2)
    thread = ListenerThread(listener, board)
    try:
        assert thread.start()
        pid = listener._conn.pgconn.backend_pid
        board.idle[0] = board.idle[1] = 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        wu.wait_until(lambda: listener._conn is None and listener._broken_until > 0, 60,
                      what="the listener to notice its connection cut")
        listener._broken_until = 0.0  # (it waits 30 s before it connects again)
        wu.wait_until(lambda: listener.relistened == 1, 60, what="the listener to LISTEN again")
        wu.wait_until(lambda: sum(board.idle[:]) == 0, 60, what="both idle slots woken")
        assert board.bells[0].acquire(timeout=5) and board.bells[1].acquire(timeout=5)
    finally:
        thread.close()


def test_the_release_of_a_surplus_permit_names_the_scope_it_opens(listener: Any) -> None:
    """A limit lowered under running jobs admits again only once the surplus permit (the slot it took
    away) is released: that release, not the free slot's (long ago), is what the look must see. Found by
    a review."""
    row, _ = JobType.objects.update_or_create(name="Export", defaults={"concurrency_limit": 2})
    jobtypes.clear_cache()
    long_ago = timezone.now() - timedelta(minutes=10)
    Job.objects.enqueue("Export", queue="exports", scheduled_for=long_ago)
    Job.objects.enqueue("Export", queue="exports", scheduled_for=long_ago)
    (a,) = Job.objects.claim("w1", limit=1, queues=["exports"])
    (x,) = Job.objects.claim("w1", limit=1, queues=["exports"])
    row.concurrency_limit = 1
    row.save()
    jobtypes.clear_cache()
    assert LimitPermit.objects.get(job_type=row, hold_seconds__lt=0).job_id == x.pk  # the slot the limit lost
    Job.objects.complete(a)
    # the free slot was released long before the look's window; a job waits in a queue w1 does not serve
    LimitPermit.objects.filter(job_type=row, hold_seconds__isnull=True).update(held_until=long_ago)
    Job.objects.enqueue("Export", queue="exports-b", scheduled_for=long_ago)
    assert "exports-b" not in _look_once(listener)  # x's surplus permit is held: the scope admits nothing
    Job.objects.complete(x)
    assert _look_once(listener) == ["exports-b"]
