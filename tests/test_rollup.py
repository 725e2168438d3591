"""Issue 27: throughput history in an hourly rollup that survives retention (ops/rollup.py), read by the
throughput page's 7-day and 30-day windows, and retention waiting for the rollup's cursor."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.admin.throughput import WINDOWS, rates
from django_sqlqueue.models import Job, ThroughputCursor, ThroughputHour
from django_sqlqueue.ops import rollup as rollup_module
from django_sqlqueue.ops.rollup import CURSOR, GRACE, HOUR, Rollup, floor_hour
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from django_sqlqueue.worker.maintenance import RETENTION_WAIT_WARN_SECONDS, ROLLUP_SECONDS, Maintenance

pytestmark = pytest.mark.django_db
DAY = timedelta(hours=24)


def place(type_name: str, n: int, status: Status, enqueued: datetime, finished: datetime | None = None) -> None:
    """``n`` jobs of ``type_name`` written as if enqueued (and finished) at those times."""
    jobs = Job.objects.enqueue_many([JobSpec(type_name, {"i": i}) for i in range(n)])
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        status_id=int(status), enqueued_at=enqueued, scheduled_for=enqueued, finished_at=finished,
        started_at=finished)


def rows() -> dict[tuple[datetime, str], tuple[int, int, int]]:
    return {(r.hour, r.job_type.name): (r.enqueued, r.finished, r.failed)
            for r in ThroughputHour.objects.select_related("job_type")}


def totals(now: datetime) -> dict[str, int]:
    got = rates(Job, now, WINDOWS["30d"])
    return {k: sum(got[k]) for k in ("enqueued", "finished", "failed")}


def test_each_minute_is_counted_once_it_is_old_enough_and_the_counts_outlive_the_jobs(make_type) -> None:
    make_type("RollA")
    make_type("RollB")
    now = floor_hour(timezone.now()) + timedelta(minutes=30)
    h = floor_hour(now)
    counted_until = now - GRACE  # a whole minute here
    place("RollA", 3, Status.COMPLETED, h - 3 * HOUR + timedelta(minutes=1), h - 3 * HOUR + timedelta(minutes=2))
    place("RollA", 1, Status.FAILED, h - 3 * HOUR + timedelta(minutes=5), h - 2 * HOUR + timedelta(minutes=1))
    place("RollB", 2, Status.PENDING, h - 3 * HOUR + timedelta(minutes=59, seconds=59))
    place("RollB", 4, Status.PARTIALLY_COMPLETED, h - HOUR, h - timedelta(seconds=1))
    place("RollA", 5, Status.COMPLETED, h + timedelta(minutes=1), h + timedelta(minutes=2))
    place("RollB", 1, Status.FAILED, counted_until - timedelta(seconds=1), counted_until)  # enqueued in, finished after
    before = totals(now)
    assert before == {"enqueued": 16, "finished": 12, "failed": 2}

    rollup = Rollup("default")
    while rollup.run(now):  # from the oldest job on (not 35 empty days), an hour or more a pass
        pass
    assert rollup.until == counted_until
    assert rows() == {
        (h - 3 * HOUR, "RollA"): (4, 3, 0),
        (h - 3 * HOUR, "RollB"): (2, 0, 0),
        (h - 2 * HOUR, "RollA"): (0, 0, 1),
        (h - HOUR, "RollB"): (4, 4, 0),
        (h, "RollA"): (5, 5, 0),
        (h, "RollB"): (1, 0, 0),  # its failure is after the cursor: not yet
    }
    assert totals(now) == before  # the rollup's counts up to the cursor plus the job table's after it

    # Retention's work: every job finished before the cursor is gone, their counts stay.
    Job.objects.filter(finished_at__lt=counted_until).delete()
    assert Job.objects.count() == 3  # the Pending two, the failure at the cursor
    assert totals(now) == before
    place("RollB", 1, Status.COMPLETED, now - timedelta(minutes=1), now)  # after the cursor: live at once
    assert totals(now) == {"enqueued": 17, "finished": 13, "failed": 2}

    # A new holder (a restart, another worker) counts nothing twice; the next minutes are added.
    written = rows()
    assert Rollup("default").run(now) is False and rows() == written
    later = Rollup("default")
    assert later.run(now + HOUR) is False and later.until == counted_until + HOUR
    assert rows() == {**written, (h, "RollB"): (2, 1, 1)}
    assert totals(now + HOUR) == {"enqueued": 17, "finished": 13, "failed": 2}


def _cursor_at(at: datetime) -> None:
    ThroughputCursor.objects.update_or_create(name=CURSOR, defaults={"counted_until": at})


def test_a_minute_waits_for_its_grace_and_a_pass_is_bounded(noop_type) -> None:
    """A minute is counted only ``GRACE`` after it ends (a late write of a finish still counts), and a
    pass counts at most its span, saying whether more waits."""
    h = floor_hour(timezone.now())
    place("Noop", 1, Status.COMPLETED, h - 25 * HOUR + timedelta(minutes=10), h - 25 * HOUR + timedelta(minutes=11))
    _cursor_at(h - 2 * HOUR)
    rollup = Rollup("default", span=timedelta(hours=24))
    assert rollup.run(h + GRACE - timedelta(seconds=1)) is False and rollup.until == h - timedelta(minutes=1)
    assert rollup.run(h + GRACE) is False and rollup.until == h
    _cursor_at(h - 25 * HOUR)
    assert rollup.run(h + GRACE) is True and rollup.until == h - HOUR
    assert rollup.run(h + GRACE) is False and rollup.until == h


def test_a_first_pass_starts_at_the_oldest_job_and_never_recounts_an_hour(noop_type) -> None:
    """No cursor row yet: the first pass starts at the oldest job's minute (not 35 empty days back); a
    cursor row lost while counts stayed starts after the newest counted hour (nothing counted twice)."""
    h = floor_hour(timezone.now())
    place("Noop", 2, Status.COMPLETED, h - 5 * HOUR + timedelta(minutes=7, seconds=30), h - 4 * HOUR)
    rollup = Rollup("default")
    assert rollup.run(h + GRACE) is True  # an hour from the oldest job's minute
    assert ThroughputCursor.objects.get().counted_until == h - 4 * HOUR + timedelta(minutes=7)
    while rollup.run(h + GRACE):
        pass
    assert rows() == {(h - 5 * HOUR, "Noop"): (2, 0, 0), (h - 4 * HOUR, "Noop"): (0, 2, 0)}
    ThroughputCursor.objects.all().delete()
    place("Noop", 1, Status.COMPLETED, h - 4 * HOUR + timedelta(minutes=30), h - 2 * HOUR)
    while Rollup("default").run(h + GRACE):
        pass
    # Counting restarted after 04:00's hour: the job enqueued in it is not counted (its hour was),
    # the finish two hours ago is.
    assert rows() == {(h - 5 * HOUR, "Noop"): (2, 0, 0), (h - 4 * HOUR, "Noop"): (0, 2, 0),
                      (h - 2 * HOUR, "Noop"): (0, 1, 0)}


def test_two_holders_at_once_count_a_minute_once(noop_type, monkeypatch) -> None:
    """A holder paused past its lease wakes and passes while another has moved the cursor since it read
    it: its conditional UPDATE matches nothing, it adds nothing, and the other's counts stand."""
    h = floor_hour(timezone.now())
    place("Noop", 3, Status.COMPLETED, h - 2 * HOUR + timedelta(minutes=10), h - 2 * HOUR + timedelta(minutes=11))
    _cursor_at(h - 3 * HOUR)
    real = rollup_module.hourly_counts
    other = Rollup("default", span=DAY)

    def counted_meanwhile(using: str, start: datetime, stop: datetime) -> dict:
        got = real(using, start, stop)  # the paused holder's read ...
        monkeypatch.setattr(rollup_module, "hourly_counts", real)
        assert other.run(h + GRACE) is False  # ... and meanwhile the new holder's whole pass
        return got

    monkeypatch.setattr(rollup_module, "hourly_counts", counted_meanwhile)
    paused = Rollup("default", span=DAY)
    assert paused.run(h + GRACE) is True and paused.until is None  # lost the cursor: counts nothing
    assert rows() == {(h - 2 * HOUR, "Noop"): (3, 3, 0)}
    assert paused.run(h + GRACE) is False and paused.until == h and rows() == {(h - 2 * HOUR, "Noop"): (3, 3, 0)}


def test_retention_deletes_only_jobs_the_rollup_has_counted(noop_type) -> None:
    now = timezone.now()
    place("Noop", 2, Status.COMPLETED, now - 3 * HOUR, now - 3 * HOUR)
    place("Noop", 1, Status.COMPLETED, now - timedelta(minutes=1), now - timedelta(seconds=30))
    maint = Maintenance("default", "me")
    with override_settings(SQLQUEUE={"RETENTION": {"Completed": "10s"}}):
        maint._retention()
        assert Job.objects.count() == 3  # the rollup has not run: nothing goes
        while maint._roll_up() != ROLLUP_SECONDS:
            pass
        maint._retention()
    # The jobs of 3 hours ago are counted and gone; the one finished 30 s ago waits for the cursor.
    assert list(Job.objects.values_list("finished_at", flat=True)) == [now - timedelta(seconds=30)]
    counted = {r.hour: r.finished for r in ThroughputHour.objects.all()}
    assert counted == {floor_hour(now - 3 * HOUR): 2}


def test_retention_that_waits_for_a_failing_rollup_says_so(caplog) -> None:
    """The rollup never succeeding (a table not migrated, a timeout) must not stop retention unseen: a
    WARNING after RETENTION_WAIT_WARN_SECONDS of waiting, and again as often, never at every turn."""
    maint = Maintenance("default", "me")
    with caplog.at_level("WARNING", logger="django_sqlqueue.maintenance"):
        maint._retention_waits(1000.0)
        maint._retention_waits(1000.0 + RETENTION_WAIT_WARN_SECONDS - 1)
        assert "retention_waiting_for_rollup" not in caplog.text
        maint._retention_waits(1000.0 + RETENTION_WAIT_WARN_SECONDS)
        maint._retention_waits(1000.0 + RETENTION_WAIT_WARN_SECONDS + 5)
    assert caplog.text.count("retention_waiting_for_rollup") == 1 and "migration 0019" in caplog.text


def test_an_empty_stretch_is_crossed_in_one_pass(noop_type) -> None:
    """A new database (no job at all) or a fleet stopped for days: a pass that counts nothing moves the
    cursor to the next job's minute (or as far as it may go) instead of walking the empty hours a span
    at a time, one pass each."""
    h = floor_hour(timezone.now())
    now = h + GRACE
    rollup = Rollup("default")
    assert rollup.run(now) is False and rollup.until == h  # no job: 35 days in one pass
    assert ThroughputCursor.objects.get().counted_until == h and rows() == {}

    _cursor_at(h - 20 * DAY)
    place("Noop", 2, Status.COMPLETED, h - 3 * HOUR + timedelta(minutes=12, seconds=5), h - 2 * HOUR)
    rollup = Rollup("default")
    assert rollup.run(now) is True and rollup.until == h - 3 * HOUR + timedelta(minutes=12)
    assert rows() == {}
    passes = 0
    while rollup.run(now):
        passes += 1
    assert passes <= 2 and rollup.until == h
    assert rows() == {(h - 3 * HOUR, "Noop"): (2, 0, 0), (h - 2 * HOUR, "Noop"): (0, 2, 0)}

    # A job enqueued before the cursor and finished in the stretch: the jump stops at its finish.
    _cursor_at(h - 10 * DAY)
    ThroughputHour.objects.all().delete()
    Job.objects.all().delete()
    place("Noop", 1, Status.COMPLETED, h - 12 * DAY, h - 5 * HOUR + timedelta(minutes=40, seconds=9))
    rollup = Rollup("default")
    assert rollup.run(now) is True and rollup.until == h - 5 * HOUR + timedelta(minutes=40)
    while rollup.run(now):
        pass
    assert rows() == {(h - 5 * HOUR, "Noop"): (0, 1, 0)}  # its enqueue was before the cursor: not counted
