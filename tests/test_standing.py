"""The heartbeat's view of whether a slot's jobs are still its own (heartbeat.Heartbeat), against the
database: which jobs a failed renewal means are taken over, and how a fresh claim counts."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from django_sqlqueue.models import Job
from django_sqlqueue.models import Worker as WorkerRow
from django_sqlqueue.worker.heartbeat import CLAIM_SHARE, STOP_SHARE, Heartbeat, register

pytestmark = pytest.mark.django_db


def _heartbeat(name: str, incarnation: str, dead_after: float = 60.0) -> Heartbeat:
    return Heartbeat(name, "default", 10.0, exit_with_parent=False, incarnation=incarnation, dead_after=dead_after)


def test_a_job_this_slot_finished_is_not_taken_over_but_one_another_worker_took_is(noop_type) -> None:
    register("s/0", "default", "mine")
    hb = _heartbeat("s/0", "mine")
    done, taken = Job.objects.enqueue("Noop"), Job.objects.enqueue("Noop")
    claimed = Job.objects.claim("s/0", 2, incarnation="mine")
    hb.hold({job.pk: 60 for job in claimed})
    Job.objects.complete(next(j for j in claimed if j.pk == done.pk))  # recorded, not dropped yet
    Job.objects.filter(pk=taken.pk).update(worker="other/0", incarnation="theirs")  # a takeover
    hb._beat_logged()  # one beat, as the thread does it (it also sets the time of the last good beat)
    assert hb.lost == {taken.pk}
    assert hb.at_risk(taken.pk) and not hb.may_start(taken.pk)
    assert not hb.at_risk(done.pk)
    hb.drop(taken.pk, finished=False)
    assert hb.lost == set()  # nothing stays marked after the job is dropped


def test_a_fresh_claim_is_safe_by_its_own_lease_whatever_the_last_beat(noop_type) -> None:
    # Times far apart (a 60-s lease, a beat 50 s ago, a dead-after time of 600 s) so that every answer
    # holds for tens of seconds: a test stalled on a loaded machine between two lines still sees them.
    hb = _heartbeat("f/0", "inc", dead_after=600.0)
    hb.ok_at = time.monotonic() - 50.0  # the last beat got through 50 s ago (the row is far from dead)
    hb.hold({41: 60.0}, claimed_at=time.monotonic())  # a job with a 60 s lease, claimed just now
    # Counted from the last beat, half of that lease would be gone 20 s ago: counted from the claim.
    assert hb.may_claim() and hb.may_start(41) and not hb.at_risk(41)
    # A job held since 10 s before the last beat, never renewed since: its lease counts from that beat,
    # and more than 80 % of it is gone.
    hb.hold({42: 60.0}, claimed_at=time.monotonic() - 60.0)
    assert hb.job_deadline(42, CLAIM_SHARE) == pytest.approx(hb.ok_at + CLAIM_SHARE * 60.0)
    assert hb.job_deadline(42, STOP_SHARE) == pytest.approx(hb.ok_at + STOP_SHARE * 60.0)
    assert not hb.may_start(42) and hb.at_risk(42)


def test_a_row_stamped_stopped_while_alive_makes_the_process_stop(noop_type) -> None:
    """A row judged gone (or stopped by hand) must not go on beating as if live: its jobs are being taken."""
    register("z/0", "default", "zz")
    hb = _heartbeat("z/0", "zz")
    hb.beat()
    assert not hb.replaced
    WorkerRow.objects.filter(name="z/0").update(stopped_at=timezone.now())
    hb.beat()
    assert hb.replaced and not hb.may_claim()
