"""Recurring schedules across worker processes: each tick becomes exactly one job, whoever is alive."""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime, timedelta

import pytest

from django_sqlqueue import schedules
from django_sqlqueue.models import Job, Schedule, ScheduleRun, Worker
from django_sqlqueue.states import Status
from tests import workerutil as wu

worker_procs = wu.worker_procs

TASK = "testproject.testjobs.tasks.tick"


def _env(entries: dict) -> dict[str, str]:
    # Looks every 0.5 s; the schedule is declared in settings, so the workers sync it at start.
    return {"SQLQUEUE_TEST_SCHEDULES": json.dumps(entries), "SQLQUEUE_TEST_SCHEDULES_CHECK": "0.5"}


def _run_for(procs: list[wu.WorkerProcess], seconds: float) -> tuple[Schedule, list[tuple], datetime, datetime]:
    """Wait for the declared schedule row, let the workers run until ``seconds`` after it was created
    (by the database clock), stop them; return the row, its runs (tick, job), the database time the
    workers were told to stop and the database time once they had all exited (a loaded machine takes a
    while to stop them, and they may still enqueue ticks that fall due meanwhile)."""
    schedule = wu.wait_until(lambda: Schedule.objects.filter(name="tick").first(), 60, what="the synced schedule")
    # An interval's grid starts one interval after the sync. The row's next_run_at has moved on already if
    # the holder's first look came before this read (a loaded machine reads late): the creation stamp has not.
    created = min(schedule.created_at, schedule.next_run_at - timedelta(seconds=2))
    wu.wait_until(lambda: schedules.db_clock("default") >= created + timedelta(seconds=seconds), 60,
                  interval=0.05, what="the run time")
    # And two ticks in, whatever the time: the looks' cadence is what load stretches (a bound for a hang).
    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name="tick").count() >= 2, 120, what="two ticks")
    stop_at = schedules.db_clock("default")
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(60) == 0, proc.output()
    exited_at = schedules.db_clock("default")
    runs = list(ScheduleRun.objects.filter(schedule__name="tick").order_by("tick_at").values_list("tick_at", "job_id"))
    return Schedule.objects.get(name="tick"), runs, stop_at, exited_at


def _assert_one_job_per_tick(schedule: Schedule, runs: list[tuple], stop_at: datetime, exited_at: datetime,
                             procs: list[wu.WorkerProcess]) -> None:
    ticks = [t for t, _ in runs]
    job_ids = [j for _, j in runs]
    first = schedule.created_at.replace(microsecond=0)
    # On the 2 s grid, consecutive from the first tick (no gap, none twice), each with its own job, and
    # no other job of the task.
    assert ticks and ticks[0] >= first, runs
    assert ticks[0] <= schedule.created_at + timedelta(seconds=3), runs  # the grid starts one interval in
    assert all((b - a) == timedelta(seconds=2) for a, b in zip(ticks, ticks[1:], strict=False)), ticks
    # 11 s of run: 5 or 6 ticks were due when the workers were told to stop. Stopping takes a while on
    # a loaded machine, and a tick that falls due meanwhile is enqueued too (once): none later than the
    # last worker's exit.
    # By the database time the workers were told to stop, not by the 11 s asked for: on a loaded machine
    # the wait that decides to stop them returns late (stopped 15 s in: 8 ticks, rightly).
    # How many of them are in by the stop is the looks' cadence, which load stretches (over TDS a look in
    # a new Babelfish session compiles for seconds: 3 of 5 once): at least two, none after the stop's
    # grid point that was not due; the grid and uniqueness checks above are the exactly-once.
    due = int((stop_at - ticks[0]).total_seconds() // 2) + 1  # grid points from the first tick to stop_at
    in_by_stop = len([t for t in ticks if t <= stop_at])
    print(f"ticks in by the stop: {in_by_stop} of {due} due")
    assert 2 <= in_by_stop <= due, (runs, stop_at, due)
    assert ticks[-1] <= exited_at, (ticks, exited_at)
    assert len(set(job_ids)) == len(job_ids) and None not in job_ids
    assert sorted(Job.objects.filter(job_type__name=TASK).values_list("id", flat=True)) == sorted(job_ids)
    for proc in procs:  # the claim alone kept it exactly once: the unique-key backstop was never needed
        assert "schedule_tick_already_enqueued" not in proc.stderr(), proc.output()
        assert "schedule_look_failed" not in proc.stderr(), proc.output()


@pytest.mark.django_db(transaction=True)
def test_two_workers_for_11_seconds_make_one_job_per_tick(worker_procs):
    # run_all: a look that comes late on this busy 2-CPU machine still enqueues each due tick (once).
    env = _env({"tick": {"task": TASK, "every": 2, "misfire": "run_all"}})
    procs = [worker_procs("--worker-name", f"sched{i}", env=env) for i in range(2)]
    wu.wait_until(lambda: Worker.objects.filter(name__startswith="sched").count() == 2, 60, what="two workers")
    schedule, runs, stop_at, exited_at = _run_for(procs, 11)
    _assert_one_job_per_tick(schedule, runs, stop_at, exited_at, procs)
    # The workers ran the tick jobs too (they are ordinary task jobs).
    assert Job.objects.filter(job_type__name=TASK, status_id=Status.COMPLETED).exists()


@pytest.mark.django_db(transaction=True)
def test_one_worker_for_11_seconds_makes_one_job_per_tick(worker_procs):
    env = _env({"tick": {"task": TASK, "every": 2, "misfire": "run_all"}})
    procs = [worker_procs("--worker-name", "sched-solo", env=env)]
    schedule, runs, stop_at, exited_at = _run_for(procs, 11)
    _assert_one_job_per_tick(schedule, runs, stop_at, exited_at, procs)


@pytest.mark.django_db(transaction=True)
def test_a_bad_declared_schedule_does_not_stop_the_worker(worker_procs):
    env = _env({"tick": {"task": TASK, "every": 2}, "broken": {"type": "test.Noop", "cron": "not a cron"}})
    proc = worker_procs("--worker-name", "sched-bad", env=env)
    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name="tick").exists(), 60, what="a tick's job")
    assert proc.proc.poll() is None  # still running
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert "schedule_invalid name=broken" in proc.stderr()
    assert not Schedule.objects.filter(name="broken").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("malformed", [["tick"], "tick"], ids=["list", "string"])
def test_a_malformed_schedules_setting_stops_no_worker(worker_procs, malformed):
    """SQLQUEUE["SCHEDULES"] that is not a dict (issue 31, item 9): the worker runs jobs and the schedules
    the table already has, logs an ERROR, and syncs nothing (a declared row is not undeclared)."""
    Schedule.objects.create(name="kept", job_type="test.Noop", every_seconds=60, timezone="UTC", declared=True,
                            next_run_at=schedules.db_clock("default") - timedelta(minutes=2))
    job = Job.objects.enqueue("test.Noop", {})
    proc = worker_procs("--worker-name", "sched-malformed",
                        env={"SQLQUEUE_TEST_SCHEDULES": json.dumps(malformed), "SQLQUEUE_TEST_SCHEDULES_CHECK": "0.2"})
    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name="kept").exists(), 60, what="the kept tick")
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state is Status.COMPLETED, 60, what="the job")
    assert proc.proc.poll() is None, proc.output()  # still running
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()
    assert "schedules_setting_invalid" in proc.stderr() and "must be a dict" in proc.stderr(), proc.output()
    kept = Schedule.objects.get(name="kept")
    assert kept.declared and kept.enabled


@pytest.mark.timeout(540)  # a bound for a hang: the waits below add up to more under load
@pytest.mark.django_db(transaction=True)
def test_a_worker_frozen_inside_a_look_does_not_stop_the_fleets_ticks(worker_procs):
    """Issue 31, item 2: a supervisor SIGSTOPped while its look's transaction holds the claimed schedule
    rows (FOR UPDATE). The other worker's SKIP LOCKED reads pass those rows over; without a bound on the
    frozen session they were passed over for as long as the freeze lasted. The look's transaction sets
    idle_in_transaction_session_timeout locally: the server ends the frozen session, its look rolls back,
    and the other worker enqueues the ticks while the first is still frozen. Once thawed, the first worker
    reconnects and goes on."""
    import os

    from django.db import connection, transaction

    if connection.vendor == "microsoft":
        pytest.skip("PostgreSQL's idle_in_transaction_session_timeout: SQL Server has no setting that ends a "
                    "frozen holder's open transaction (docs/schedules.md)")
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's idle_in_transaction_session_timeout: SQLite has no server to end a frozen "
                    "holder's transaction (docs/schedules.md)")
    names = [f"frozen{i}" for i in range(5)]
    Schedule.objects.bulk_create(
        Schedule(name=n, job_type="test.Noop", every_seconds=1, timezone="UTC", queue="not-served",
                 next_run_at=schedules.db_clock("default")) for n in names)
    runs, table = ScheduleRun._meta.db_table, Schedule._meta.db_table
    env = {"SQLQUEUE_TEST_SCHEDULES_CHECK": "0.2", "SQLQUEUE_TEST_MAINTENANCE_LEASE": "3"}
    frozen = worker_procs("--worker-name", "sched-frozen", "--queue", "default", env=env)

    def activity(where: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # (else a transaction reads one snapshot)
            cursor.execute(f"SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND {where}")
            return cursor.fetchone()[0]

    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name__in=names).exists(), 90, what="a first look")
    # Catch the look inside its transaction, deterministically: the run rows' table is locked, so the
    # look waits at its first ScheduleRun insert, holding the claimed schedule rows. Freeze it there.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {connection.ops.quote_name(runs)} IN EXCLUSIVE MODE")
        wu.wait_until(lambda: activity(f"wait_event_type = 'Lock' AND query LIKE '%%{runs}%%'"), 60,
                      what="the look to wait inside its transaction")
        os.killpg(frozen.pid, signal.SIGSTOP)
    try:
        # Lock gone: the server finishes the insert; the frozen client leaves its session idle in transaction.
        wu.wait_until(lambda: activity("state = 'idle in transaction'"), 30, what="the frozen look's session")
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                           "WHERE a.state = 'idle in transaction' AND l.relation = to_regclass(%s)",
                           [connection.ops.quote_name(table)])
            assert cursor.fetchone()[0] >= 1, "the frozen look holds no schedule rows: nothing was proved"
        since = schedules.db_clock("default")
        other = worker_procs("--worker-name", "sched-thawed", "--queue", "default", env=env)
        # Every schedule, those the frozen look held included, gets a new tick from the other worker while
        # the first is still frozen (the bound is 10 s; a loaded machine is given more).
        wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name__in=names, enqueued_at__gt=since)
                      .values("schedule_id").distinct().count() == len(names), 90,
                      what="new ticks of every schedule, the frozen look's included")
        assert frozen.proc.poll() is None
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    # Thawed: its connection was ended under it; the look fails once, reconnects and the worker goes on.
    wu.wait_until(lambda: "schedule_look_failed" in frozen.stderr(), 60, what="the thawed look's error")
    other.signal(signal.SIGTERM)
    assert other.wait(60) == 0, other.output()
    job = Job.objects.enqueue("test.Noop", {})  # only the thawed worker is left to run it
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state is Status.COMPLETED, 60, what="the thawed worker's job")
    frozen.signal(signal.SIGTERM)
    assert frozen.wait(60) == 0, frozen.output()
    counts = ScheduleRun.objects.values_list("schedule_id", "tick_at")
    assert len(set(counts)) == len(counts)  # (the unique key says so too: no tick twice)


@pytest.mark.timeout(300)  # a bound for a hang: the waits below add up to more under load
@pytest.mark.django_db(transaction=True)
def test_a_look_waiting_on_a_lock_does_not_hold_up_the_supervisor(worker_procs):
    """The looks run in a thread of their own: while the schedule table is locked (SQLite: another
    writer holds the write lock; PostgreSQL: LOCK TABLE) and a schedule is due, the supervisor still
    sees a slot die at once."""
    import os

    from django.db import connection, transaction

    from bench.soak import slot_pids

    Schedule.objects.create(name="due", job_type="test.Noop", every_seconds=60, timezone="UTC",
                            next_run_at=schedules.db_clock("default") - timedelta(minutes=2))
    proc = worker_procs("--worker-name", "sched-lock", env={"SQLQUEUE_TEST_SCHEDULES_CHECK": "0.2"})
    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name="due").exists(), 60, what="a first look")
    Schedule.objects.filter(name="due").update(next_run_at=schedules.db_clock("default") - timedelta(minutes=1))
    [slot] = wu.wait_until(lambda: slot_pids(proc.pid), 60, what="the slot")
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Schedule._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        else:
            Job.objects.filter(pk=0).update(priority=0)  # takes SQLite's write lock
        time.sleep(1.0)  # the looker is now waiting for the lock
        os.kill(slot, signal.SIGKILL)
        wu.wait_until(lambda: "slot_died" in proc.stderr(), 10, what="the supervisor to see the slot die")
        # (Its restart waits for the hand-back of the dead slot's jobs, on the supervisor's database
        # thread, which this lock holds up too: that is the database thread's business, not the looks'.)
    # Once the lock is gone the waiting look goes on: the due tick is enqueued, once.
    wu.wait_until(lambda: ScheduleRun.objects.filter(schedule__name="due").count() == 2, 30, what="the second tick")
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.output()
