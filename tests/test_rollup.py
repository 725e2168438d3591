"""Issue 27: throughput history in an hourly rollup that survives retention (ops/rollup.py), read by the
throughput page's 7-day and 30-day windows, and retention waiting for the rollup."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue.admin.throughput import WINDOWS, rates
from django_sqlqueue.models import Job, ThroughputHour
from django_sqlqueue.ops.rollup import GRACE, HOUR, MAX_HOURS_PER_PASS, Rollup, floor_hour
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from django_sqlqueue.worker.maintenance import ROLLUP_SECONDS, Maintenance

pytestmark = pytest.mark.django_db


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


def test_each_hour_is_counted_once_it_is_over_and_the_counts_outlive_the_jobs(make_type) -> None:
    make_type("RollA")
    make_type("RollB")
    now = floor_hour(timezone.now()) + timedelta(minutes=30)  # the current hour H is not over
    h = floor_hour(now)
    place("RollA", 3, Status.COMPLETED, h - 3 * HOUR + timedelta(minutes=1), h - 3 * HOUR + timedelta(minutes=2))
    place("RollA", 1, Status.FAILED, h - 3 * HOUR + timedelta(minutes=5), h - 2 * HOUR + timedelta(minutes=1))
    place("RollB", 2, Status.PENDING, h - 3 * HOUR + timedelta(minutes=59, seconds=59))
    place("RollB", 4, Status.PARTIALLY_COMPLETED, h - HOUR, h - timedelta(seconds=1))
    place("RollA", 5, Status.COMPLETED, h + timedelta(minutes=1), h + timedelta(minutes=2))  # hour H: not yet
    before = totals(now)
    assert before == {"enqueued": 15, "finished": 12, "failed": 1}

    rollup = Rollup("default")
    passes = 1
    while rollup.run(now):  # from 35 days back, a day a pass
        passes += 1
    assert passes >= 35 and rollup.until == h
    assert rows() == {
        (h - 3 * HOUR, "RollA"): (4, 3, 0),
        (h - 3 * HOUR, "RollB"): (2, 0, 0),
        (h - 2 * HOUR, "RollA"): (0, 0, 1),
        (h - HOUR, "RollB"): (4, 4, 0),
    }
    assert totals(now) == before  # the rollup's hours plus the job table's after them

    # Retention's work: every job finished before H is gone, their counts stay.
    Job.objects.filter(finished_at__lt=h).delete()
    assert Job.objects.count() == 7
    assert totals(now) == before
    # The job table's counts of hour H stay live: a job finished now shows at once.
    place("RollB", 1, Status.FAILED, now - timedelta(minutes=3), now - timedelta(minutes=2))
    assert totals(now) == {"enqueued": 16, "finished": 12, "failed": 2}

    # A new holder (a restart, another worker) counts nothing twice; an hour over is written once.
    written = rows()
    assert Rollup("default").run(now) is False and rows() == written
    later = Rollup("default")
    assert later.run(now + HOUR) is False and later.until == h + HOUR
    assert rows() == {**written, (h, "RollA"): (5, 5, 0), (h, "RollB"): (1, 0, 1)}
    assert totals(now + HOUR)["enqueued"] == 16


def test_an_hour_waits_for_its_grace_and_a_pass_is_bounded() -> None:
    """An hour is written only ``GRACE`` after it ends (a late recorder flush still counts), and a first
    pass catches up at most ``MAX_HOURS_PER_PASS`` hours, saying whether more wait."""
    h = floor_hour(timezone.now())
    rollup = Rollup("default", until=h - 2 * HOUR)
    assert rollup.run(h + GRACE - timedelta(seconds=1)) is False and rollup.until == h - HOUR
    assert rollup.run(h + GRACE) is False and rollup.until == h
    far = Rollup("default", until=h - (MAX_HOURS_PER_PASS + 1) * HOUR)
    assert far.run(h + GRACE) is True and far.until == h - HOUR
    assert far.run(h + GRACE) is False and far.until == h


def test_retention_deletes_only_jobs_of_hours_the_rollup_has_counted(noop_type) -> None:
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
    # The jobs of 3 hours ago are counted and gone; the one finished 30 s ago waits for its hour.
    assert list(Job.objects.values_list("finished_at", flat=True)) == [now - timedelta(seconds=30)]
    counted = {r.hour: r.finished for r in ThroughputHour.objects.all()}
    assert counted == {floor_hour(now - 3 * HOUR): 2}
