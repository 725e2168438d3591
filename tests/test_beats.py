"""The supervisor's heartbeat for all its slots (worker/beats.py), against the database: one statement
renews every slot's leases (each under the slot that claimed it), one stamps every slot's row; a taken
job is reported lost to its slot only; a replaced row, replaced; a slot that stopped reporting gets no
beat. And the slot's side (heartbeat.Heartbeat with a link): a beat that did not cover a job does not
count for it."""

from __future__ import annotations

import multiprocessing
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_sqlqueue.models import Job
from django_sqlqueue.models import Worker as WorkerRow
from django_sqlqueue.worker.beats import STALE_SECONDS, Beats
from django_sqlqueue.worker.contract import BeatResult, SlotReport
from django_sqlqueue.worker.heartbeat import CLAIM_SHARE, Heartbeat, register

pytestmark = pytest.mark.django_db


def _beats() -> Beats:
    return Beats("default", "w", 10.0, 60.0, 1.0)


def test_one_beat_renews_every_slots_leases_and_stamps_every_row_in_two_statements(noop_type) -> None:
    register("w/0", "default", "i0")
    register("w/1", "default", "i1")
    for _ in range(4):
        Job.objects.enqueue("Noop")
    a = Job.objects.claim("w/0", 2, incarnation="i0")
    b = Job.objects.claim("w/1", 2, incarnation="i1")
    Job.objects.filter(pk__in=[j.pk for j in a + b]).update(lease_expires_at=a[0].started_at)  # all due now
    taken = b[1]
    Job.objects.filter(pk=taken.pk).update(worker="other/0", incarnation="x")  # taken over meanwhile
    beats = _beats()
    from django_sqlqueue.worker.beats import _Member

    members = [_Member("w/0", "i0", {j.pk: 60.0 for j in a}, 3, 3), _Member("w/1", "i1", {j.pk: 60.0 for j in b}, 0, 0)]
    before = {row["name"]: row for row in WorkerRow.objects.values("name", "last_heartbeat", "jobs_done")}
    with CaptureQueriesContext(connection) as queries:
        results = beats._statements(members, time.monotonic())
    writes = [q["sql"] for q in queries.captured_queries if "UPDATE" in q["sql"].upper()]
    assert len(writes) == 2, writes  # one for every lease, one for every worker row
    assert set(results["w/0"].renewed) == {j.pk for j in a} and results["w/0"].lost == ()
    assert results["w/1"].renewed == (b[0].pk,) and results["w/1"].lost == (taken.pk,)
    for job in Job.objects.filter(pk__in=[j.pk for j in a] + [b[0].pk]):
        assert job.lease_expires_at > a[0].started_at  # renewed
    assert Job.objects.get(pk=taken.pk).lease_expires_at == a[0].started_at  # another's: untouched
    after = {row["name"]: row for row in WorkerRow.objects.values("name", "last_heartbeat", "jobs_done")}
    assert after["w/0"]["jobs_done"] == before["w/0"]["jobs_done"] + 3
    assert after["w/1"]["jobs_done"] == before["w/1"]["jobs_done"]
    assert all(after[n]["last_heartbeat"] >= before[n]["last_heartbeat"] for n in ("w/0", "w/1"))
    assert not results["w/0"].replaced and not results["w/1"].replaced


def test_a_slot_whose_row_was_taken_is_told_it_was_replaced(noop_type) -> None:
    register("r/0", "default", "old")
    register("r/1", "default", "r1")
    WorkerRow.objects.filter(name="r/0").update(incarnation="new")  # another process took the name
    from django_sqlqueue.worker.beats import _Member

    results = _beats()._statements([_Member("r/0", "old", {}, 0, 0), _Member("r/1", "r1", {}, 0, 0)], 1.0)
    assert results["r/0"].replaced and not results["r/1"].replaced


def test_a_slot_that_stopped_reporting_gets_no_beat() -> None:
    ours, theirs = multiprocessing.Pipe()
    beats = _beats()
    beats.attach(0, "s/0", "i", ours)
    theirs.send(SlotReport({1: 60.0}, 0))
    now = time.monotonic()
    beats._collect(now)
    assert [m.name for m in beats._members(now)] == ["s/0"]
    assert beats._members(now + STALE_SECONDS + 0.1) == []  # no report since: its leases lapse
    theirs.send(SlotReport({}, 0, connect_error="too many connections"))
    beats._collect(now)
    assert beats._members(now) == [] and beats.connect_errors() == (0, 1, "too many connections")


def test_a_beat_that_did_not_cover_a_job_does_not_count_for_it() -> None:
    """Under a supervisor, a job claimed after the beat's snapshot is safe by its own claim only."""
    ours, theirs = multiprocessing.Pipe()
    hb = Heartbeat("l/0", "default", 10.0, exit_with_parent=False, incarnation="i", link=theirs)
    claimed = time.monotonic() - 30.0
    hb.hold({7: 40.0, 8: 40.0}, claimed_at=claimed)
    assert isinstance(ours.recv(), SlotReport)  # reported at once
    sent = time.monotonic()
    hb._apply(BeatResult(sent=sent, ok=True, renewed=(7,), done=0))
    assert hb.ok_at == sent and hb.may_claim()
    assert hb.job_deadline(7, CLAIM_SHARE) == pytest.approx(sent + CLAIM_SHARE * 40.0)
    assert hb.job_deadline(8, CLAIM_SHARE) == pytest.approx(claimed + CLAIM_SHARE * 40.0)
    assert hb.may_start(7) and not hb.may_start(8)
    hb._apply(BeatResult(sent=time.monotonic(), ok=True, lost=(7,)))
    assert hb.at_risk(7)
    hb._apply(BeatResult(sent=time.monotonic(), ok=True, replaced=True))
    assert hb.replaced and not hb.may_claim()


def test_a_slot_that_reported_during_a_beat_gets_its_first_beat_at_once_not_an_interval_later() -> None:
    """A slot claims nothing before its first beat. Slots start a few ms apart: one whose first report
    came while the beat for the others was on its way waited a whole interval (10 s) to claim."""
    from types import SimpleNamespace

    from django_sqlqueue.worker.beats import _Member

    beats = _beats()
    pipes = [multiprocessing.Pipe() for _ in range(2)]
    for i, (ours, _) in enumerate(pipes):
        beats.attach(i, f"s/{i}", "i", ours)
    pipes[0][1].send(SlotReport({}, 0))
    now = time.monotonic()
    beats._collect(now)
    call = SimpleNamespace(finished=False)  # the beat for s/0 is on its way
    beats._call, beats._beat = call, ([beats.slots[0]], [_Member("s/0", "i", {}, 0, 0)])
    pipes[1][1].send(SlotReport({}, 0))  # s/1 reports meanwhile
    beats._collect(time.monotonic())
    call.finished = True
    beats._outcome = {"ok": True, "sent": now, "results": {"s/0": BeatResult(sent=now, ok=True)}}
    beats._answer()
    assert isinstance(pipes[0][1].recv(), BeatResult)
    assert beats._next_beat <= time.monotonic()  # s/1's first beat: at once
    assert [m.name for m in beats._members(time.monotonic())] == ["s/0", "s/1"]
    # Once every slot has had one, the next beat waits its interval.
    call = SimpleNamespace(finished=True)
    beats._call, beats._beat = call, (list(beats.slots.values()), beats._members(time.monotonic()))
    beats._outcome = {"ok": True, "sent": now, "results": {f"s/{i}": BeatResult(sent=now, ok=True) for i in (0, 1)}}
    beats._answer()
    assert beats._next_beat >= time.monotonic() + 5.0


def test_a_renewal_whose_parameters_pass_the_vendors_limit_is_sent_in_parts(noop_type, monkeypatch) -> None:
    """Each held id is sent twice and each holder's name and incarnation once: 150 slots holding 900 jobs
    passed SQL Server's 2,100 parameters in one statement. The renewal is cut into statements within
    the dialect's ``max_params`` (here lowered to 40, so 24 jobs of 6 holders take several), and every
    lease is renewed, each once."""
    from datetime import timedelta

    from django.db.models import Max
    from django.utils import timezone

    from django_sqlqueue.dialects import get_dialect
    from django_sqlqueue.queue import JobSpec
    from django_sqlqueue.queue.housekeeping import held_parts
    from django_sqlqueue.states import Status

    jobs = Job.objects.enqueue_many(JobSpec("Noop") for _ in range(24))
    holders = []
    for h in range(6):
        ids = [j.pk for j in jobs[h * 4:(h + 1) * 4]]
        Job.objects.filter(pk__in=ids).update(status_id=Status.PROCESSING, worker=f"w/{h}", incarnation="i",
                                              lease_expires_at=timezone.now() + timedelta(seconds=5))
        holders.append((f"w/{h}", "i", ids))
    dialect = get_dialect(connection)
    monkeypatch.setattr(dialect, "max_params", 40)
    budget = 40 - len(dialect.renewed_lease_params(300, False))
    parts = held_parts([(n, i, list(ids)) for n, i, ids in holders], budget)
    assert len(parts) > 1 and all(sum(2 * len(ids) + 2 for _n, _i, ids in part) <= budget for part in parts)
    assert sorted(i for part in parts for _n, _i, ids in part for i in ids) == sorted(j.pk for j in jobs)
    with CaptureQueriesContext(connection) as queries:
        assert Job.objects.renew_held(holders, 300) == 24
    assert len([q for q in queries if "UPDATE" in q["sql"].upper()]) == len(parts)
    soonest = timezone.now() + timedelta(seconds=250)
    assert Job.objects.filter(lease_expires_at__lt=soonest).count() == 0
    assert Job.objects.aggregate(m=Max("lease_expires_at"))["m"] < timezone.now() + timedelta(seconds=310)
