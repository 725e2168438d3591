"""Session liveness (issue 28): an idle PostgreSQL worker sends no heartbeat; the fleet's look stamps its rows.

A supervisor that LISTENs on its own connection holds a session-level advisory lock on each of its slots'
worker rows there; the maintenance holder's look stamps, in its one statement, every live row whose lock
is held, and says in its header when it began. While its slots hold no job the worker answers them from
that stamp instead of beating (worker/beats.py).

Which statement wrote a worker row's heartbeat is read by a trigger the test installs on the worker
table (``current_query()`` of each update that moved ``last_heartbeat``): the look's statement calls
``pg_notify``, a beat's does not. Real worker processes, a real server; order and counts, no timings.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test import override_settings

from django_sqlqueue.dialects import get_dialect, wake
from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
worker_procs = wu.worker_procs

# Beats every 2 s (HEARTBEAT_SECONDS), so that a window of a few looks would hold several beats.
FAST_BEATS = {"SQLQUEUE_TEST_DEAD_AFTER": "60", "SQLQUEUE_TEST_HEARTBEAT": "2", "SQLQUEUE_TEST_SESSION_LIVENESS": "1"}


@pytest.fixture
def stamp_log() -> Iterator[None]:
    """A trigger that logs (row name, statement) for each update that moves a worker row's heartbeat."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")  # and its advisory locks: session liveness
    table = connection.ops.quote_name(Worker._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE sq_test_stamps (name text, query text, n bigserial)")
        cursor.execute(
            "CREATE FUNCTION sq_test_stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.last_heartbeat IS DISTINCT FROM OLD.last_heartbeat THEN "
            "INSERT INTO sq_test_stamps (name, query) VALUES (NEW.name, current_query()); END IF; "
            "RETURN NEW; END $$")
        cursor.execute(f"CREATE TRIGGER sq_test_stamp AFTER UPDATE ON {table} FOR EACH ROW "
                       f"EXECUTE FUNCTION sq_test_stamp()")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS sq_test_stamp ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS sq_test_stamp()")
            cursor.execute("DROP TABLE IF EXISTS sq_test_stamps")


def _stamps(name_prefix: str, after: int = 0) -> tuple[int, int, int]:
    """(looks, beats, last log position) among the heartbeat updates of rows named ``name_prefix*``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT query LIKE %s, count(*), max(n) FROM sq_test_stamps WHERE name LIKE %s AND n > %s "
                       "GROUP BY 1", ["%pg_notify%", name_prefix + "%", after])
        rows = cursor.fetchall()
    looks = sum(n for by_look, n, _ in rows if by_look)
    beats = sum(n for by_look, n, _ in rows if not by_look)
    return looks, beats, max([after, *(last for *_, last in rows)])


def _locks_held(name_prefix: str) -> int:
    """How many rows named ``name_prefix*`` have their session lock held (by any session)."""
    table = connection.ops.quote_name(Worker._meta.db_table)
    key = get_dialect(connection).liveness_key_sql()  # from the worker table's oid (param: its name)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table} w WHERE w.name LIKE %s AND w.id IN (SELECT l.objid::int8 "
                       f"FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.classid::int8 = {key})",
                       [name_prefix + "%", table])
        return cursor.fetchone()[0]


def test_an_idle_worker_sends_no_beat_while_the_look_stamps_its_rows(worker_procs, stamp_log: None,
                                                                    listener: Any, tmp_path) -> None:
    """Worker ``holder`` (1 slot) starts first and sends the looks; worker ``idle`` (2 slots) hears them.

    1. Once a look has stamped ``idle``'s two rows, the next stretch of five looks holds no beat of
       ``idle``'s (at a beat every 2 s, about five would have gone), and its rows are stamped by the
       looks alone.
    2. A job in its queue: its slot claims it, and real beats come again while it runs (they clear its
       rows' ``stamp_until``: a process frozen now must be judged gone at the dead-after time) and after
       it finishes (the finished job is counted on the row: ``jobs_done``; ``stamp_until`` set again).
    3. ``kill -9`` of the idle worker: its session ends, its locks go with it, and the looks stamp its
       rows no more (the sweep of a gone process stamps them stopped).
    """
    JobType.objects.get_or_create(name="test.Sleep")
    holder = worker_procs("--worker-name", "holder", "--concurrency", "1", "--queue", "elsewhere", env=FAST_BEATS)
    wu.wait_until(lambda: wake.look_stamp(next(iter(_payloads(listener)), "")) is not None, 120,
                  what=f"the holder's first look\n{holder.output()}")
    idle = worker_procs("--worker-name", "idle", "--concurrency", "2", "--queue", "idle", env=FAST_BEATS)
    wu.wait_until(lambda: _locks_held("idle/") == 2, 120,
                  what=f"the idle worker's two row locks\n{idle.output()}\n{holder.output()}")
    wu.wait_until(lambda: _stamps("idle/")[0] >= 2, 120, what=f"a look stamping both rows\n{idle.output()}")

    # 1. Five looks (about 10 s): the idle worker's rows are stamped by looks, not by its beats.
    _, _, mark = _stamps("idle/")
    for _ in range(5):
        wu.wait_until(lambda: _payloads(listener), 60, what="a look")
    time.sleep(0.5)  # a beat on its way as the last look arrived
    looks, beats, mark = _stamps("idle/", mark)
    assert beats == 0, (looks, beats, idle.output())
    assert looks >= 2, (looks, beats)
    fresh = Worker.objects.filter(name__startswith="idle/", stopped_at__isnull=True).count()
    assert fresh == 2

    # 2. Work: the slot that claims gets real beats (its lease), and the finish is counted on its row.
    gate = tmp_path / "finish"
    rows = Worker.objects.filter(name__startswith="idle/", stopped_at__isnull=True)
    assert rows.filter(stamp_until__isnull=False).count() == 2  # idle: the looks may stamp them
    job = Job.objects.enqueue("test.Sleep", {"seconds": 240, "until": str(gate)}, queue="idle")
    wu.wait_until(lambda: rows.filter(stamp_until__isnull=True).count() == 2, 120,
                  what=f"a beat for the running job clearing stamp_until\n{idle.output()}")
    assert Job.objects.get(pk=job.pk).state == Status.PROCESSING
    gate.touch()
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 120,
                  what=f"the job to complete\n{idle.output()}")
    worker_name = Job.objects.get(pk=job.pk).worker
    wu.wait_until(lambda: Worker.objects.get(name=worker_name).jobs_done == 1, 60,
                  what=f"the finish counted on the row\n{idle.output()}")
    assert _stamps("idle/", mark)[1] >= 2, idle.output()  # beats renewed the running job's lease
    wu.wait_until(lambda: rows.filter(stamp_until__isnull=False).count() == 2, 60,
                  what=f"the beat after the finish setting stamp_until again\n{idle.output()}")

    # 3. kill -9: the locks go with the session; no look stamps its rows after that.
    idle.kill_group()
    wu.wait_until(lambda: _locks_held("idle/") == 0, 60, what="the killed worker's locks released")
    _, _, mark = _stamps("idle/")
    for _ in range(4):
        wu.wait_until(lambda: _payloads(listener), 60, what="a look")
    assert _stamps("idle/", mark)[0] == 0
    holder.signal(signal.SIGTERM)
    assert holder.wait(60) == 0, holder.output()


def _payloads(conn: Any) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=3.0, stop_after=1) if wake.is_look(n.payload)]


def _beat_and_answer(beats: Any, members: list[Any], slot_ends: list[Any]) -> None:
    """One beat on this thread, its result taken in by ``Beats._answer`` as the supervisor's loop does
    (the answers it sends the slots are read from ``slot_ends``)."""
    from types import SimpleNamespace

    outcome: dict[str, Any] = {}
    beats._beat_now(members, outcome)
    assert outcome.get("ok"), outcome
    beats._beat, beats._outcome = (list(beats.slots.values()), members), outcome
    beats._call = SimpleNamespace(finished=True)
    beats._answer()
    assert beats._call is None
    for end in slot_ends:
        assert end.recv().ok


def _next_look(conn: Any) -> str:
    """The next look's payload (other notifications, the workers' hellos, passed over)."""
    for n in conn.notifies(timeout=10.0):
        if wake.is_look(n.payload):
            return n.payload
    raise AssertionError("no look within 10 s")


def test_the_supervisor_locks_each_slots_row_of_its_incarnation_and_lets_go_of_the_others(stamp_log: None,
                                                                                         listener: Any) -> None:
    """In process, on the test's own connection (standing in for the supervisor's, which LISTENs): a beat
    locks the rows of the slots it beat, by incarnation; a row deleted and registered again (a new row)
    has its lock moved to the new row at the next beat, and until then the slots are not answered from a
    look; with no slot left to beat for, every lock goes. The look stamps locked rows whose heartbeat is
    older than 5 s and whose ``stamp_until`` has not passed, and no other; a beat for a slot holding a
    job clears ``stamp_until``, and then no look stands for a beat."""
    from datetime import timedelta
    from types import SimpleNamespace

    from django.utils import timezone

    from django_sqlqueue.worker.beats import Beats, SlotBeat, _Member
    from django_sqlqueue.worker.heartbeat import register
    from django_sqlqueue.worker.maintenance import Maintenance

    assert register("u/0", "default", incarnation="a") and register("u/1", "default", incarnation="b")
    connection.ensure_connection()
    session = SimpleNamespace(connection=connection.connection, stamp=None)
    beats = Beats("default", "u", heartbeat_seconds=10.0, dead_after=60.0, cancel_check=1.0, session=session)
    members = [_Member("u/0", "a", {}, 0, 0), _Member("u/1", "b", {}, 0, 0)]
    outcome: dict[str, Any] = {}
    beats._beat_now(members, outcome)
    assert outcome["ok"] and _locks_held("u/") == 2
    old_id = Worker.objects.get(name="u/0").pk

    # The look stamps the locked rows older than 5 s, not a fresh one nor an unlocked one.
    Worker.objects.create(name="v/0", incarnation="x", started_at=timezone.now(), last_heartbeat=timezone.now())
    Worker.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=30))
    Worker.objects.filter(name="u/1").update(last_heartbeat=timezone.now())
    _, _, mark = _stamps("")
    holder = Maintenance("default", "u-holder")
    with override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "SESSION_LIVENESS": False}):
        holder._look()  # SESSION_LIVENESS off: the look stamps nothing, and its header has no clock
    assert _stamps("u/", mark)[0] == 0
    assert wake.look_stamp(_next_look(listener)) is None
    holder._look()
    assert wake.look_stamp(_next_look(listener)) is not None
    assert _stamps("u/0", mark)[0] == 1 and _stamps("u/1", mark)[0] == 0 and _stamps("v/", mark)[0] == 0
    # A locked row whose stamp_until has passed (its process frozen, idle, for minutes) is not stamped.
    Worker.objects.filter(name="u/0").update(last_heartbeat=timezone.now() - timedelta(seconds=30),
                                             stamp_until=timezone.now() - timedelta(seconds=1))
    _, _, mark = _stamps("")
    holder._look()
    assert _stamps("u/", mark)[0] == 0

    # u/0's row deleted and registered again: a new row, a new incarnation.
    Worker.objects.filter(name="u/0").delete()
    assert register("u/0", "default", incarnation="c")
    assert Worker.objects.get(name="u/0").pk != old_id
    renewed = [_Member("u/0", "c", {}, 0, 0), members[1]]
    beats._last_sent = time.monotonic()
    session.stamp = (time.time() + beats._clock_offset + 1.0, time.monotonic())  # a look after the locks
    pipes = [multiprocessing.Pipe() for _ in range(2)]
    beats.slots = {i: SlotBeat(m.name, m.incarnation, pipes[i][0]) for i, m in enumerate(renewed)}
    assert not beats._stamped(renewed, time.monotonic())  # the new row is not locked yet: a real beat
    _beat_and_answer(beats, renewed, [child for _, child in pipes])
    assert beats._stamping
    assert set(beats._locks) == {("u/0", "c"), ("u/1", "b")} and _locks_held("u/") == 2
    # Locked: a look that began after the locks stands for the beat, no statement; each slot is answered
    # as of the look's start less the 5 s a row it leaves alone may be older.
    session.stamp = (time.time() + beats._clock_offset, time.monotonic())
    now = time.monotonic()
    assert beats._stamped(renewed, now) and beats.stamped_beats == 1
    answers = [child.recv() for _, child in pipes]
    assert all(a.ok and now - 7.0 < a.sent <= now - 4.0 for a in answers), answers
    assert not beats._stamped([_Member("u/0", "c", {5: 60.0}, 0, 0), renewed[1]], time.monotonic())  # holds a job
    assert not beats._stamped([_Member("u/0", "c", {}, 1, 1), renewed[1]], time.monotonic())  # finished one
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid::int8 = %s", [old_id])
        assert cursor.fetchone()[0] == 0  # the deleted row's lock let go

    # A beat for a slot that holds a job clears both rows' stamp_until: no look stamps them, and no look
    # stands for the next beat, even once the slot holds nothing (its process may have frozen meanwhile).
    busy = [_Member("u/0", "c", {2**40: 60.0}, 0, 0), renewed[1]]
    _beat_and_answer(beats, busy, [child for _, child in pipes])
    assert beats._last_sent is not None and not beats._stamping
    assert Worker.objects.filter(name__startswith="u/", stamp_until__isnull=True).count() == 2
    Worker.objects.filter(name__startswith="u/").update(last_heartbeat=timezone.now() - timedelta(seconds=30))
    _, _, mark = _stamps("")
    holder._look()
    assert _stamps("u/", mark)[0] == 0
    session.stamp = (time.time() + beats._clock_offset, time.monotonic())
    assert not beats._stamped(renewed, time.monotonic())

    # Idle again (stamp_until set), then a slot reports a job it claimed: the loop's next turn beats at
    # once (the beat that clears stamp_until), not a heartbeat interval later.
    from django_sqlqueue.worker.contract import SlotReport

    _beat_and_answer(beats, renewed, [child for _, child in pipes])
    assert beats._stamping and Worker.objects.filter(name__startswith="u/", stamp_until__isnull=False).count() == 2
    now = time.monotonic()
    for slot in beats.slots.values():
        slot.report, slot.reported_at = SlotReport(held={}, done=0), now
    beats.slots[0].report = SlotReport(held={2**40: 60.0}, done=0)
    beats._next_beat = now + 60.0
    submitted: list[str] = []
    beats.tick(SimpleNamespace(submit=lambda what, *args: submitted.append(what)), now, stopping=True)
    assert submitted == ["heartbeat"]

    beats._unlock_all()  # no slot left to beat for
    assert beats._locks == {} and _locks_held("u/") == 0


def test_a_dead_after_too_short_for_a_stamp_takes_no_locks_and_sets_no_stamp_until(worker_procs,
                                                                                  stamp_log: None) -> None:
    """WORKER_DEAD_AFTER_SECONDS 30: a look's stamp, 5 to 15 s old when trusted, would be more than the
    quarter of it a stamp may stand for, so the worker beats as without session liveness: after three of
    its beats it holds no lock and its rows carry no ``stamp_until`` (a frozen process is judged gone at
    the dead-after time)."""
    short = {**FAST_BEATS, "SQLQUEUE_TEST_DEAD_AFTER": "30"}
    w = worker_procs("--worker-name", "short", "--concurrency", "2", "--queue", "short", env=short)
    wu.wait_until(lambda: _stamps("short/")[1] >= 6, 120, what=f"three beats of both rows\n{w.output()}")
    assert _locks_held("short/") == 0
    rows = Worker.objects.filter(name__startswith="short/", stopped_at__isnull=True)
    assert rows.count() == 2 and rows.filter(stamp_until__isnull=True).count() == 2
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
