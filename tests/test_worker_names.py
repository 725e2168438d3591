"""A worker name belongs to one live worker: a second live one under it is refused at start, a restart
of a dead one (same host, its process gone) takes it over at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from django_sqlqueue.exceptions import WorkerNameInUse
from django_sqlqueue.models import Job
from django_sqlqueue.models import Worker as WorkerRow
from django_sqlqueue.states import Status
from django_sqlqueue.worker.heartbeat import register
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
worker_procs = wu.worker_procs
HOST = socket.gethostname()


@pytest.fixture
def live_pid():
    """A live process of this host that is not this test (a sleeping child)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def row(name: str, host: str, pid: int, *, beat_age: float = 1.0, stopped: bool = False) -> WorkerRow:
    now = timezone.now()
    beat = now - timedelta(seconds=beat_age)
    return WorkerRow.objects.create(name=name, host=host, pid=pid, started_at=beat, last_heartbeat=beat,
                                    stopped_at=now if stopped else None)


def test_a_live_worker_on_this_host_keeps_its_name(live_pid: int) -> None:
    row("w/0", HOST, live_pid)
    with pytest.raises(WorkerNameInUse, match=rf"in use by a live worker: host '{HOST}', pid {live_pid}"):
        register("w/0", "default")
    assert WorkerRow.objects.get(name="w/0").pid == live_pid  # nothing written


def test_a_live_worker_on_another_host_keeps_its_name() -> None:
    row("w/0", "elsewhere", 4242)
    with pytest.raises(WorkerNameInUse, match="would run each other's jobs twice"):
        register("w/0", "default")


@pytest.mark.parametrize(("host", "beat_age", "stopped"), [
    ("elsewhere", 600, False),  # its heartbeat is older than WORKER_DEAD_AFTER_SECONDS: dead
    ("elsewhere", 1, True),  # it stopped cleanly
])
def test_a_dead_or_stopped_worker_frees_its_name(host: str, beat_age: float, stopped: bool) -> None:
    row("w/0", host, 4242, beat_age=beat_age, stopped=stopped)
    assert register("w/0", "default")
    taken = WorkerRow.objects.get(name="w/0")
    assert (taken.host, taken.pid, taken.stopped_at) == (HOST, os.getpid(), None)


def test_a_restart_on_the_same_host_takes_the_name_and_the_jobs_at_once(dead_pid: int) -> None:
    # the previous incarnation was kill -9'd a moment ago: fresh heartbeat, but its process is gone
    row("w/0", HOST, dead_pid)
    job = Job.objects.enqueue("test.Noop")
    [claimed] = Job.objects.claim("w/0", 1)
    counters = wu.run_worker("w/0")
    assert counters[0] == 1
    job.refresh()
    assert job.state == Status.COMPLETED and job.attempt_num == claimed.attempt_num + 1
    assert WorkerRow.objects.get(name="w/0").pid == os.getpid()


def test_a_second_worker_process_under_a_live_name_is_refused(worker_procs) -> None:
    first = worker_procs("--worker-name", "same")
    wu.wait_until(lambda: WorkerRow.objects.filter(name="same/0", stopped_at__isnull=True).exists(), 90,
                  what="the first worker to register")  # a slot's start takes 15 s on a busy 2-core machine
    pid = WorkerRow.objects.get(name="same/0").pid
    second = worker_procs("--worker-name", "same", "--burst")
    assert second.wait(timeout=60) == 1
    assert "worker name 'same/0' is in use by a live worker" in second.stderr()
    # the first one is untouched and still works
    assert first.proc.poll() is None
    assert WorkerRow.objects.get(name="same/0").pid == pid
    job = Job.objects.enqueue("test.Noop")
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, what="the first worker to run a job")


def test_the_worker_row_records_what_it_serves() -> None:
    """The admin tells due work nobody serves from work a live worker will take (issue 18)."""
    assert register("serves/0", "default", "i1", queues=("emails", "reports"), types=("SendEmail",))
    row = WorkerRow.objects.get(name="serves/0")
    assert (row.queues, row.types, row.incarnation) == (["emails", "reports"], ["SendEmail"], "i1")
    assert register("all/0", "default", "i2")
    row = WorkerRow.objects.get(name="all/0")
    assert (row.queues, row.types) == ([], [])
