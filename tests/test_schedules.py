"""Recurring schedules (issue 15): tick arithmetic with a controllable clock (DST, misfire), the look
against the real database (exactly once, backstop, expiry, tasks through the backend), sync from
settings, bad input refused by the system check and the admin form."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import connection
from django.test import override_settings

from django_sqlqueue import schedules
from django_sqlqueue.models import Job, Schedule, ScheduleRun
from django_sqlqueue.ops.checks import check_schedules
from django_sqlqueue.schedules import (
    ScheduleDef,
    ScheduleError,
    parse_entry,
    plan_ticks,
    run_due,
    sync_schedules,
)
from django_sqlqueue.states import Status
from tests import test_tsql

PARIS = ZoneInfo("Europe/Paris")
TASK = "testproject.testjobs.tasks.tick"
tsql_dialect = test_tsql.dialect  # fixture: a T-SQL rendering dialect that never connects


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def simulate(defn: ScheduleDef, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Looks every ``step`` from ``start`` to ``end`` with a moving clock: the ticks enqueued."""
    next_run = schedules.first_run(defn, start)
    ran: list[datetime] = []
    now = start
    while now <= end:
        plan = plan_ticks(defn, next_run, now)
        ran.extend(plan.ticks)
        next_run = plan.next_run_at
        now += step
    return ran


# ----- DST ----------------------------------------------------------------------------------------------
def test_fixed_time_on_a_spring_forward_day_runs_once():
    # Europe/Paris, 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    defn = ScheduleDef("night", job_type="test.Noop", cron="30 2 * * *", timezone="Europe/Paris")
    ran = simulate(defn, utc(2026, 3, 27, 12), utc(2026, 3, 31, 12), timedelta(minutes=5))
    local = [t.astimezone(PARIS) for t in ran]
    assert [t.date().isoformat() for t in local] == ["2026-03-28", "2026-03-29", "2026-03-30", "2026-03-31"]
    assert local[0].strftime("%H:%M %Z") == "02:30 CET"
    assert local[1].strftime("%H:%M %Z") == "03:00 CEST"  # once, at the first minute after the gap
    assert local[2].strftime("%H:%M %Z") == "02:30 CEST"


def test_fixed_time_on_a_fall_back_day_runs_once():
    # Europe/Paris, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice.
    defn = ScheduleDef("night", job_type="test.Noop", cron="30 2 * * *", timezone="Europe/Paris")
    ran = simulate(defn, utc(2026, 10, 23, 12), utc(2026, 10, 27, 12), timedelta(minutes=5))
    local = [t.astimezone(PARIS) for t in ran]
    assert [t.date().isoformat() for t in local] == ["2026-10-24", "2026-10-25", "2026-10-26", "2026-10-27"]
    assert [t.strftime("%H:%M %Z") for t in local] == ["02:30 CEST", "02:30 CEST", "02:30 CET", "02:30 CET"]


def test_frequent_cron_follows_real_time_through_the_repeated_hour():
    defn = ScheduleDef("often", job_type="test.Noop", cron="*/30 * * * *", timezone="Europe/Paris")
    ran = simulate(defn, utc(2026, 10, 24, 22, 10), utc(2026, 10, 25, 3, 10), timedelta(minutes=1))
    # 22:30 UTC to 03:00 UTC every 30 minutes of real time: both passes of 02:00-03:00 local run.
    assert ran == [utc(2026, 10, 24, 22, 30) + timedelta(minutes=30) * i for i in range(10)]
    assert len(set(ran)) == len(ran)


def test_next_tick_is_strictly_after_a_moment_inside_the_repeated_hour():
    defn = ScheduleDef("night", job_type="test.Noop", cron="30 2 * * *", timezone="Europe/Paris")
    # 01:15 UTC is 02:15 CET, the second pass; the first 02:30 (00:30 UTC) is already behind.
    assert schedules.next_tick(defn, utc(2026, 10, 25, 1, 15)) == utc(2026, 10, 26, 1, 30)


# ----- misfire policies -----------------------------------------------------------------------------------
def hourly(misfire: str, **kw) -> ScheduleDef:
    return ScheduleDef("h", job_type="test.Noop", every_seconds=3600, misfire=misfire, **kw)


def test_on_time_tick_runs_under_every_policy():
    for policy in ("run_once", "skip", "run_all"):
        plan = plan_ticks(hourly(policy), utc(2026, 1, 1, 7), utc(2026, 1, 1, 7, 0, 1))
        assert plan.ticks == (utc(2026, 1, 1, 7),) and plan.next_run_at == utc(2026, 1, 1, 8), policy


def test_run_once_after_downtime_runs_the_latest_tick_once():
    plan = plan_ticks(hourly("run_once"), utc(2026, 1, 1, 7), utc(2026, 1, 1, 12, 30))
    assert plan.ticks == (utc(2026, 1, 1, 12),)
    assert plan.next_run_at == utc(2026, 1, 1, 13) and plan.due == 6


def test_skip_after_downtime_runs_nothing_and_waits_for_the_next_tick():
    plan = plan_ticks(hourly("skip", misfire_grace_seconds=60), utc(2026, 1, 1, 7), utc(2026, 1, 1, 12, 30))
    assert plan.ticks == () and plan.next_run_at == utc(2026, 1, 1, 13)
    # Within the grace the tick is not missed: it runs.
    plan = plan_ticks(hourly("skip", misfire_grace_seconds=60), utc(2026, 1, 1, 7), utc(2026, 1, 1, 7, 0, 59))
    assert plan.ticks == (utc(2026, 1, 1, 7),)


def test_run_all_runs_every_missed_tick_up_to_the_limit():
    plan = plan_ticks(hourly("run_all", misfire_limit=3), utc(2026, 1, 1, 7), utc(2026, 1, 1, 12, 30))
    assert plan.ticks == (utc(2026, 1, 1, 10), utc(2026, 1, 1, 11), utc(2026, 1, 1, 12))
    plan = plan_ticks(hourly("run_all", misfire_limit=10), utc(2026, 1, 1, 7), utc(2026, 1, 1, 9, 30))
    assert plan.ticks == (utc(2026, 1, 1, 7), utc(2026, 1, 1, 8), utc(2026, 1, 1, 9))


def test_run_all_on_cron_after_a_long_outage_is_bounded():
    defn = ScheduleDef("m", job_type="test.Noop", cron="*/5 * * * *", timezone="UTC", misfire="run_all",
                       misfire_limit=4)
    plan = plan_ticks(defn, utc(2026, 1, 1, 0, 5), utc(2026, 2, 1, 0, 7))  # a month away
    assert plan.ticks == tuple(utc(2026, 1, 31, 23, 50) + timedelta(minutes=5) * i for i in range(4))
    assert plan.next_run_at == utc(2026, 2, 1, 0, 10)
    once = plan_ticks(ScheduleDef("m", job_type="test.Noop", cron="*/5 * * * *", timezone="UTC"),
                      utc(2026, 1, 1, 0, 5), utc(2026, 2, 1, 0, 7))
    assert once.ticks == (utc(2026, 2, 1, 0, 5),) and once.due > 1  # the misfire is seen (and logged)


# ----- bad input ------------------------------------------------------------------------------------------
BAD_ENTRIES = {
    "bad-cron": ({"type": "test.Noop", "cron": "61 * * * *"}, "invalid cron expression"),
    "six-fields": ({"type": "test.Noop", "cron": "0 0 7 * * *"}, "5 fields"),
    "never": ({"type": "test.Noop", "cron": "0 0 30 2 *"}, "cron expression"),
    "bad-zone": ({"type": "test.Noop", "cron": "0 7 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
    "bad-type": ({"type": "no.such.Type", "every": 60}, "unknown job type"),
    "bad-task": ({"task": "testproject.testjobs.tasks.nope", "every": 60}, "unknown task"),
    "both": ({"type": "test.Noop", "cron": "0 7 * * *", "every": 60}, "not both"),
    "neither": ({"type": "test.Noop"}, "not both and not neither"),
    "no-target": ({"every": 60}, "job type ('type') or a Django task"),
    "too-fast": ({"type": "test.Noop", "every": 0.5}, "whole number of seconds"),
    "zero": ({"type": "test.Noop", "every": 0}, "at least 1 s"),
    "typo": ({"type": "test.Noop", "every": 60, "evry": 5}, "unknown key(s) evry"),
    "bad-misfire": ({"type": "test.Noop", "every": 60, "misfire": "sometimes"}, "misfire must be one of"),
    "bad-payload": ({"type": "test.Noop", "every": 60, "payload": {"x": {1, 2}}}, "must be JSON"),
}


@pytest.mark.django_db  # deciding "unknown type or task" may read the task flag of a type row
@pytest.mark.parametrize("name", sorted(BAD_ENTRIES))
def test_bad_entries_get_a_clear_error(name):
    entry, message = BAD_ENTRIES[name]
    with pytest.raises(ScheduleError) as info:
        parse_entry(name, entry)
    assert message in str(info.value)


@pytest.mark.django_db  # deciding "unknown type or task" may read the task flag of a type row
def test_system_check_names_every_bad_entry():
    good = {"ok": {"type": "test.Noop", "every": 60}, "ok-task": {"task": TASK, "cron": "0 7 * * *",
                                                                  "timezone": "Europe/Paris"}}
    with override_settings(SQLQUEUE={"SCHEDULES": good}):
        assert check_schedules() == []
    with override_settings(SQLQUEUE={"SCHEDULES": {**good, **{k: v[0] for k, v in BAD_ENTRIES.items()}}}):
        errors = check_schedules()
        assert sorted(e.msg.split("'")[1] for e in errors) == sorted(BAD_ENTRIES)
        assert {e.id for e in errors} == {"sqlqueue.E201"}
        with pytest.raises(SystemCheckError, match="sqlqueue.E201"):
            call_command("check", tags=["compatibility"])


@pytest.mark.django_db
@pytest.mark.parametrize("malformed", [["digest"], "digest", 7], ids=["list", "string", "int"])
def test_a_malformed_schedules_setting_is_a_check_error_and_syncs_nothing(malformed):
    """Not a dict (issue 31, item 9): check reports E202 (and not E001: the rest of the queue's settings
    load, so enqueue and the workers keep going); a sync writes nothing, and above all does not read it
    as "no schedules" (which would undeclare every declared row)."""
    from django_sqlqueue.ops.checks import check_queue_database

    declare({"digest": {"type": "test.Noop", "every": 60}})
    with override_settings(SQLQUEUE={"SCHEDULES": malformed}):
        assert check_queue_database() == []
        errors = check_schedules()
        assert [e.id for e in errors] == ["sqlqueue.E202"] and "must be a dict" in errors[0].msg
        with pytest.raises(SystemCheckError, match="sqlqueue.E202"):
            call_command("check", tags=["compatibility"])
        result = sync_schedules()
        assert "must be a dict" in result.skipped and not result.undeclared
        with pytest.raises(CommandError, match="not synced"):
            call_command("queue_schedules", "--sync")
    row = Schedule.objects.get(name="digest")
    assert row.declared and row.enabled and row.next_run_at is not None


@pytest.mark.django_db  # deciding "unknown type or task" may read the task flag of a type row
def test_a_task_on_another_backend_is_refused():
    with override_settings(TASKS={"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}):
        with pytest.raises(ScheduleError, match="SqlQueueBackend"):
            parse_entry("t", {"task": TASK, "every": 60})


# ----- the look against the database ------------------------------------------------------------------------
T0 = utc(2026, 6, 1, 7, 0)


@pytest.fixture(autouse=True)
def _no_recorded_settings_versions(request, _django_db_helper):
    """Start from no recorded SCHEDULES version: the one ``migrate`` recorded at the real time would be
    newer than the moved clocks (T0) these tests sync with, and every such sync would defer to it."""
    if request.node.get_closest_marker("django_db"):
        from django_sqlqueue.models import ScheduleDeploy

        ScheduleDeploy.objects.all().delete()


def declare(entries: dict, now: datetime = T0) -> schedules.SyncResult:
    return sync_schedules(entries=entries, now=now)


@pytest.mark.django_db
def test_a_due_tick_is_enqueued_once_and_the_schedule_moves_on():
    declare({"digest": {"type": "test.Echo", "cron": "0 7 * * *", "timezone": "UTC", "payload": {"x": 1},
                        "queue": "mail", "priority": 5}}, now=T0 - timedelta(hours=1))
    s = Schedule.objects.get(name="digest")
    assert s.declared and s.enabled and s.next_run_at == T0
    assert run_due(now=T0 - timedelta(seconds=1)).enqueued == 0
    first = run_due(now=T0 + timedelta(seconds=1))
    assert first.enqueued == 1
    again = run_due(now=T0 + timedelta(seconds=2))  # the same tick, looked at again: nothing
    assert again.enqueued == 0
    job = Job.objects.get(pk=first.job_ids[0])
    assert (job.job_type.name, job.payload, job.queue, job.priority) == ("test.Echo", {"x": 1}, "mail", 5)
    s.refresh_from_db()
    assert (s.next_run_at, s.last_run_at, s.last_job_id) == (T0 + timedelta(days=1), T0, job.pk)
    assert list(ScheduleRun.objects.values_list("tick_at", "job_id")) == [(T0, job.pk)]


@pytest.mark.django_db
def test_all_workers_down_for_an_hour_the_policy_decides_once():
    declare({"once": {"type": "test.Noop", "every": 60},
             "all": {"type": "test.Noop", "every": 60, "misfire": "run_all", "misfire_limit": 5},
             "skip": {"type": "test.Noop", "every": 600, "misfire": "skip", "misfire_grace": 60}})
    back = T0 + timedelta(hours=1, minutes=2, seconds=30)  # skip's latest tick (T0 + 1 h) is 150 s old
    result = run_due(now=back)
    counts = {s.name: s.runs.count() for s in Schedule.objects.all()}
    assert counts == {"once": 1, "all": 5, "skip": 0}
    assert result.enqueued == 6
    assert run_due(now=back + timedelta(seconds=1)).enqueued == 0
    nxt = dict(Schedule.objects.values_list("name", "next_run_at"))
    assert nxt["once"] == nxt["all"] == T0 + timedelta(hours=1, minutes=3)
    assert nxt["skip"] == T0 + timedelta(hours=1, minutes=10)


@pytest.mark.django_db
def test_the_unique_tick_key_is_the_backstop(caplog):
    declare({"b": {"type": "test.Noop", "every": 60}})
    s = Schedule.objects.get(name="b")
    tick = s.next_run_at
    assert run_due(now=tick + timedelta(seconds=1)).enqueued == 1
    # A stale writer puts next_run_at back to the tick that already has its job.
    Schedule.objects.filter(pk=s.pk).update(next_run_at=tick)
    with caplog.at_level(logging.WARNING, logger="django_sqlqueue.schedules"):
        result = run_due(now=tick + timedelta(seconds=2))
    assert result.enqueued == 0 and Job.objects.count() == 1  # the second job went with the refused run row
    assert "schedule_tick_already_enqueued" in caplog.text
    s.refresh_from_db()
    assert s.next_run_at == tick + timedelta(seconds=60)


@pytest.mark.django_db
def test_a_tick_job_not_started_by_its_expiry_is_cancelled():
    declare({"digest": {"type": "test.Noop", "cron": "0 7 * * *", "timezone": "UTC", "expires": 7200},
             "other": {"type": "test.Noop", "cron": "0 7 * * *", "timezone": "UTC", "expires": 7200}},
            now=T0 - timedelta(hours=1))
    result = run_due(now=T0 + timedelta(seconds=5))
    digest, other = (Job.objects.get(pk=i) for i in result.job_ids)
    started = Job.objects.claim("w", 1, using="default")  # one of them starts in time
    started_id = started[0].pk
    waiting_id = ({digest.pk, other.pk} - {started_id}).pop()
    assert run_due(now=T0 + timedelta(hours=1, minutes=59)).expired == 0
    assert run_due(now=T0 + timedelta(hours=2, seconds=1)).expired == 1
    waiting, running = Job.objects.get(pk=waiting_id), Job.objects.get(pk=started_id)
    assert waiting.state == Status.CANCELLED and "expired" in waiting.error
    assert running.state == Status.PROCESSING
    assert not ScheduleRun.objects.filter(expires_at__isnull=False).exists()  # handled, not looked at again


@pytest.mark.django_db
def test_a_task_schedule_enqueues_through_the_backend_and_get_result_reads_it():
    from testproject.testjobs.tasks import tick

    declare({"t": {"task": TASK, "every": 30, "kwargs": {"label": "hello"}}})
    result = run_due(now=T0 + timedelta(seconds=31))
    assert result.enqueued == 1
    task_result = tick.get_result(str(result.job_ids[0]))
    assert task_result.kwargs == {"label": "hello"} and task_result.status.name == "READY"


@pytest.mark.django_db
def test_sync_keeps_an_operators_disable_moves_on_timing_change_and_parks_removed_entries():
    entries = {"a": {"type": "test.Noop", "every": 60}, "b": {"type": "test.Noop", "every": 60}}
    assert sorted(declare(entries).created) == ["a", "b"]
    Schedule.objects.filter(name="a").update(enabled=False)  # the operator's edit
    later = T0 + timedelta(minutes=10)
    result = declare({"a": {"type": "test.Noop", "every": 120}}, now=later)
    a, b = Schedule.objects.get(name="a"), Schedule.objects.get(name="b")
    assert result.updated == ["a"] and result.undeclared == ["b"]
    assert (a.enabled, a.every_seconds, a.next_run_at) == (False, 120, later + timedelta(seconds=120))
    assert (b.enabled, b.declared, b.next_run_at) == (True, False, None) and "parked" in b.last_error
    assert run_due(now=later + timedelta(days=1)).enqueued == 0  # a parked row never runs
    assert declare({"a": {"type": "test.Noop", "every": 120}}, now=later).updated == []  # idempotent


@pytest.mark.django_db
def test_a_rolling_deploy_never_lets_the_old_settings_undo_the_new():
    """Issue 31, item 1. Old settings declare a; the new ones add b. During the rollout an old worker
    restarts and syncs the old settings: that must change nothing (before: b was disabled and
    undeclared, and once declared again stayed disabled for good, enabled being the operator's). An
    operator's disable survives deploys; a schedule removed and later added back runs again."""
    a = {"type": "test.Noop", "every": 60}
    b = {"type": "test.Echo", "every": 60}
    old, new = {"a": a}, {"a": a, "b": b}
    minute = timedelta(minutes=1)
    declare(old, now=T0)  # the old deploy's workers
    assert declare(new, now=T0 + minute).created == ["b"]  # the first new worker
    restarted = declare(old, now=T0 + 2 * minute)  # an old worker restarts during the rollout
    assert restarted.deferred == schedules.settings_fingerprint(new) and not restarted.undeclared
    row = Schedule.objects.get(name="b")
    assert (row.declared, row.enabled) == (True, True) and row.next_run_at == T0 + 2 * minute
    assert run_due(now=T0 + 3 * minute).enqueued == 2  # a and b tick
    # The rollout ends; the new workers keep syncing (RESYNC_SECONDS). Nothing changes.
    later = T0 + 20 * minute
    assert declare(new, now=later).undeclared == [] and Schedule.objects.get(name="b").enabled
    # An operator's disable survives deploys.
    Schedule.objects.filter(name="a").update(enabled=False)
    assert declare(new, now=later + minute).updated == [] and not Schedule.objects.get(name="a").enabled
    # b removed in code (the same settings as the old deploy's, gone for longer than LIVE_SECONDS: a new
    # deploy, not a stale worker), then added back: it is parked, then runs again.
    removed = declare(old, now=later + 10 * minute)
    assert removed.undeclared == ["b"] and not removed.deferred
    assert Schedule.objects.get(name="b").next_run_at is None
    back = later + 20 * minute
    assert declare(new, now=back).updated == ["b"]
    row = Schedule.objects.get(name="b")
    assert (row.declared, row.enabled, row.last_error) == (True, True, "") and row.next_run_at == back + minute
    # A rollback (an older version, once the newer one is no longer seen) applies too.
    assert declare(old, now=back + 10 * minute).undeclared == ["b"]


@pytest.mark.django_db
def test_sync_skips_a_bad_entry_and_keeps_the_good_ones():
    result = declare({"good": {"type": "test.Noop", "every": 60}, "bad": {"type": "test.Noop", "cron": "nope"}})
    assert result.created == ["good"] and [n for n, _ in result.invalid] == ["bad"]


@pytest.mark.django_db
def test_a_broken_row_is_parked_with_its_error_not_a_crash():
    declare({"x": {"type": "test.Noop", "every": 60}})
    Schedule.objects.filter(name="x").update(every_seconds=None, cron="99 * * * *")  # a direct SQL write
    assert run_due(now=T0 + timedelta(minutes=5)).enqueued == 0
    s = Schedule.objects.get(name="x")
    assert s.next_run_at is None and "invalid cron" in s.last_error


@pytest.mark.django_db
def test_run_now_enqueues_an_extra_job_and_does_not_move_the_schedule():
    declare({"n": {"type": "test.Noop", "every": 3600}})
    s = Schedule.objects.get(name="n")
    job_id = schedules.run_now(s)
    s2 = Schedule.objects.get(name="n")
    assert Job.objects.filter(pk=job_id).exists() and s2.last_job_id == job_id
    assert (s2.next_run_at, s2.last_run_at) == (s.next_run_at, None)
    assert not ScheduleRun.objects.exists()


@pytest.mark.django_db
def test_the_database_clock_decides_what_is_due():
    declare({"c": {"type": "test.Noop", "every": 1}}, now=schedules.db_clock("default") - timedelta(seconds=5))
    assert run_due().enqueued == 1  # no clock given: the database's


@pytest.mark.django_db(transaction=True)
def test_a_locked_schedule_is_skipped_by_a_second_looker():
    """PostgreSQL: while one look holds a due row, another look's claim skips it (SKIP LOCKED)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks between two sessions: PostgreSQL here (SQLite serialises whole transactions)")
    import threading

    from django.db import connections

    from django_sqlqueue.dialects import get_dialect

    declare({"l": {"type": "test.Noop", "every": 60}})
    holding, release, seen = threading.Event(), threading.Event(), []

    def hold() -> None:
        conn = connections["default"]
        dialect = get_dialect(conn)
        with dialect.schedules_transaction(), conn.cursor() as cursor:
            sql, params = dialect.claim_schedules_sql(10, T0 + timedelta(minutes=5))
            cursor.execute(sql, params)
            seen.append(len(cursor.fetchall()))
            holding.set()
            release.wait(600)  # a bound: the test's finally releases it as soon as its look is done
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(60)
    try:
        assert run_due(now=T0 + timedelta(minutes=5)).enqueued == 0  # skipped, not waited for
    finally:
        release.set()
        thread.join()
    assert seen == [1]
    assert run_due(now=T0 + timedelta(minutes=5)).enqueued == 1


# ----- the SQL Server statements, parsed as T-SQL (run over TDS in the tds stage) --------------------------
def test_sql_server_schedule_statements_parse_and_lock_only_what_they_claim(tsql_dialect):
    from sqlglot import exp

    hints, parse = test_tsql.hints, test_tsql.parse

    dialect = tsql_dialect
    for now in (None, T0):
        probe, probe_params = dialect.schedules_probe_sql(now)
        [select] = parse(probe, probe_params)
        assert isinstance(select, exp.Select)
        assert all(not hints(t) for t in select.find_all(exp.Table))  # the look takes no locks
        claim, claim_params = dialect.claim_schedules_sql(100, now)
        [select] = parse(claim, claim_params)
        [table] = list(select.find_all(exp.Table))
        assert hints(table) == {"UPDLOCK", "ROWLOCK", "READPAST"}
        assert claim_params[0] == 100 and "TOP (" in claim and "ORDER BY" in claim


@pytest.mark.django_db
def test_migrate_syncs_the_declared_schedules():
    from django.core.management.sql import emit_post_migrate_signal

    with override_settings(SQLQUEUE={"SCHEDULES": {"m": {"type": "test.Noop", "every": 60}}}):
        emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
    s = Schedule.objects.get(name="m")
    assert s.declared and s.every_seconds == 60 and s.next_run_at is not None


@pytest.mark.django_db
def test_a_worker_that_does_not_hold_the_lease_keeps_its_version_live_with_one_statement():
    """A full sync is seven statements; an idle fleet's workers each sent one a minute (issue 28). A worker
    that does not hold the maintenance lease, once synced, only marks its settings version seen, with
    one UPDATE every RESYNC_OTHERS_SECONDS; the holder syncs in full (it puts schedules back). A version
    not live any more (not seen for most of LIVE_SECONDS) is not kept alive that way: the worker syncs
    in full, which decides whether it counts as new again."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.models import ScheduleDeploy
    from django_sqlqueue.worker.maintenance import Maintenance

    fingerprint = schedules.settings_fingerprint(get_settings().SCHEDULES)
    worker = Maintenance("default", "not-the-holder")
    worker._sync_schedules()  # its start: a full sync records the version
    seen = ScheduleDeploy.objects.get(fingerprint=fingerprint).seen_at
    worker._resync_at = 0.0  # RESYNC_OTHERS_SECONDS later
    with CaptureQueriesContext(connection) as queries:
        worker._sync_schedules()
    assert len(queries) == 1 and "UPDATE" in queries[0]["sql"].upper(), [q["sql"] for q in queries]
    assert ScheduleDeploy.objects.get(fingerprint=fingerprint).seen_at >= seen
    assert schedules.RESYNC_OTHERS_SECONDS + 60.0 < schedules.LIVE_SECONDS - 60.0  # (room for the turn's wait)

    # Not seen for most of LIVE_SECONDS: one UPDATE that matches nothing, then the full sync.
    ScheduleDeploy.objects.update(seen_at=timezone.now() - timedelta(seconds=schedules.LIVE_SECONDS - 30))
    worker._resync_at = 0.0
    with CaptureQueriesContext(connection) as queries:
        worker._sync_schedules()
    assert len(queries) > 3
    assert ScheduleDeploy.objects.get(fingerprint=fingerprint).seen_at > timezone.now() - timedelta(seconds=60)

    # The holder syncs in full every time.
    worker.holding, worker._resync_at = True, 0.0
    with CaptureQueriesContext(connection) as queries:
        worker._sync_schedules()
    assert len(queries) > 3
