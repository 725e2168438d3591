"""Batched recording of successes (recorder.py): committed with the next claim, delay bounded,
token-checked, and a slot's run-but-unrecorded jobs are never handed back as unstarted."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from django_sqlqueue import signals
from django_sqlqueue.models import Job, JobAttempt, Worker
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
job_log = wu.job_log


@pytest.mark.parametrize("batch", [1, 7])
def test_batches_are_recorded_completed_with_history(batch: int) -> None:
    Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(20)])
    seen: list[int] = []

    def on_success(sender, job, **kwargs):
        assert job.state == Status.COMPLETED
        seen.append(job.pk)

    signals.job_succeeded.connect(on_success, dispatch_uid="test-recorder")
    try:
        counters = wu.run_worker("rec", batch=batch)
    finally:
        signals.job_succeeded.disconnect(dispatch_uid="test-recorder")
    assert counters[0] == 20 and len(seen) == 20
    assert Job.objects.filter(status_id=Status.COMPLETED).count() == 20
    assert not JobAttempt.objects.filter(finished_at__isnull=True).exists()
    assert set(JobAttempt.objects.values_list("outcome_id", flat=True)) == {Status.COMPLETED}
    assert Worker.objects.get(name="rec").jobs_done == 20


def test_a_success_is_recorded_while_the_next_job_runs_long(job_log, tmp_path) -> None:
    # The slow job runs until the watcher has seen the quick one Completed (at most 60 s): a slow first
    # statement (Babelfish compiles a new session's batches in seconds) cannot turn order into a race.
    gate = tmp_path / "seen"
    quick = Job.objects.enqueue("test.Noop", priority=5)
    slow = Job.objects.enqueue("test.Sleep", {"seconds": 60, "until": str(gate), "log": str(job_log.path)})
    seen: list[tuple[bool, list[str]]] = []

    def watch() -> None:  # the quick job must be Completed while the slow one still runs
        from django.db import connection

        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline:
                completed = Job.objects.get(pk=quick.pk).status_id == Status.COMPLETED
                slow_events = [event for _, event in job_log.events(slow.pk)]  # read after: no "end" yet
                if completed or "end" in slow_events:                          # means recorded before the end
                    seen.append((completed, slow_events))
                    break
                time.sleep(0.02)
        finally:
            gate.touch()
            connection.close()

    t = threading.Thread(target=watch)
    t.start()
    wu.run_worker("rec", batch=2)
    t.join()
    # Order, not time: without the recorder's own timer the success would wait for the next claim, after
    # the slow job's end.
    assert len(seen) == 1 and seen[0][0] and "end" not in seen[0][1], seen
    assert Job.objects.get(pk=slow.pk).state == Status.COMPLETED


def test_a_stale_success_is_refused_not_written() -> None:
    [job] = Job.objects.enqueue_many([JobSpec("test.Noop")])
    [claimed] = Job.objects.claim("rec", 1)
    Job.objects.modify(claimed, claimed.version, Status.TERMINATED)
    from django_sqlqueue.worker.loop import Worker as SlotWorker
    from django_sqlqueue.worker.loop import WorkerConfig
    from django_sqlqueue.worker.recorder import Recorder
    from django_sqlqueue.worker.runner import Kind, Outcome

    worker = SlotWorker(WorkerConfig(name="rec"))
    recorder = Recorder(worker)
    recorder.add(Outcome(Kind.SUCCESS, claimed, response={"late": True}))
    assert recorder.flush() == []
    assert recorder.pending_ids() == []
    assert Job.objects.get(pk=job.pk).state == Status.TERMINATED and worker.counters[0] == 0


def test_a_slots_recorder_publishes_each_success_until_it_is_recorded() -> None:
    """What the supervisor would hand back if the slot died: every success added and not yet recorded
    is published at once (one id appended per add), and none once they are recorded."""
    from django_sqlqueue.worker.loop import Worker as SlotWorker
    from django_sqlqueue.worker.loop import WorkerConfig
    from django_sqlqueue.worker.recorder import Recorder
    from django_sqlqueue.worker.runner import Kind, Outcome
    from django_sqlqueue.worker.slots import SlotChannel

    Job.objects.enqueue_many([JobSpec("test.Noop") for _ in range(3)])
    claimed = Job.objects.claim("rec", 3)
    ctx = multiprocessing.get_context("spawn")
    channel = SlotChannel(ctx, ctx.Event(), ctx.RawArray("q", 5), None)
    recorder = Recorder(SlotWorker(WorkerConfig(name="rec"), channel))
    for i, job in enumerate(claimed):
        recorder.add(Outcome(Kind.SUCCESS, job, response=None))
        assert channel.unrecorded_ids() == [j.pk for j in claimed[:i + 1]]
    assert recorder.flush() == []
    assert channel.unrecorded_ids() == []
    assert Job.objects.filter(pk__in=[j.pk for j in claimed], status_id=Status.COMPLETED).count() == 3


def test_a_dead_slots_job_is_read_without_waiting_for_its_lock() -> None:
    """A slot killed while it held the lock of the array naming its job (inside ``set_current``) never
    releases it: the supervisor reads the job of a dead slot without that lock (it hung before)."""
    from django_sqlqueue.worker.slots import SlotChannel

    ctx = multiprocessing.get_context("fork")
    channel = SlotChannel(ctx, ctx.Event(), ctx.RawArray("q", 5), None)
    channel.set_current(77, 30.0)
    held = ctx.Event()

    def die_holding_the_lock() -> None:
        channel.current.get_lock().acquire()
        channel.safe.get_lock().acquire()
        held.set()
        time.sleep(60)

    proc = ctx.Process(target=die_holding_the_lock)
    proc.start()
    assert held.wait(30)
    proc.kill()
    proc.join()
    assert channel.current.get_lock().acquire(timeout=0.1) is False  # still held by the dead process
    assert channel.job_of_dead_slot() == 77
    assert channel.running_job_at_risk(77) is False  # not known: the slot's death is seen next round


def test_slot_channel_keeps_unrecorded_ids() -> None:
    from django_sqlqueue.worker.slots import SlotChannel

    ctx = multiprocessing.get_context("spawn")
    channel = SlotChannel(ctx, ctx.Event(), ctx.RawArray("q", 5), None)
    assert channel.unrecorded_ids() == []
    channel.set_unrecorded([5, 9, 11])
    assert channel.unrecorded_ids() == [5, 9, 11]
    channel.set_unrecorded([9])
    assert channel.unrecorded_ids() == [9]
    # The recorder's add appends one id; a flush writes the rest whole.
    channel.add_unrecorded(12)
    channel.add_unrecorded(14)
    assert channel.unrecorded_ids() == [9, 12, 14]
    channel.set_unrecorded([])
    assert channel.unrecorded_ids() == []


def test_slot_channel_add_unrecorded_stops_at_capacity(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_sqlqueue.worker.slots import SlotChannel

    monkeypatch.setattr(SlotChannel, "unrecorded_capacity", 2)
    ctx = multiprocessing.get_context("spawn")
    channel = SlotChannel(ctx, ctx.Event(), ctx.RawArray("q", 5), None)
    for job_id in (3, 4, 5):
        channel.add_unrecorded(job_id)
    assert channel.unrecorded_ids() == [3, 4]


def test_slot_channel_current_and_safe_values() -> None:
    """What the supervisor reads: the running job, its deadline and timeout, the cancel mark, and until
    when the slot's heartbeat says the job is safe (written whole under each array's lock)."""
    from django_sqlqueue.worker.slots import SlotChannel

    ctx = multiprocessing.get_context("spawn")
    channel = SlotChannel(ctx, ctx.Event(), ctx.RawArray("q", 5), None)
    before = time.monotonic()
    channel.set_current(41, 30.0)
    job_id, deadline, timeout, cancelled = list(channel.current)
    assert (job_id, timeout, cancelled) == (41, 30.0, 0) and before + 30.0 <= deadline <= time.monotonic() + 30.0
    assert channel.request_cancel(41, 5.0) and channel.current[3] == 1 and channel.current[1] <= deadline
    channel.set_safe_until(41, time.monotonic() - 1, True)
    assert channel.running_job_at_risk(41) and not channel.running_job_at_risk(42)
    channel.set_safe_until(41, time.monotonic() + 60, True)
    assert not channel.running_job_at_risk(41)
    channel.handler_returned()
    assert channel.current[0] == 41 and channel.current[1] == float("inf")
    assert not channel.request_cancel(41, 5.0)  # returned already: its outcome stands
    channel.clear_current()
    assert list(channel.current) == [0, 0, 0, 0]
