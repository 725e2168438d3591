"""Dead workers replaced in seconds (issue 14): a worker of the same host sees at once that a worker's
process is gone, instead of waiting ``WORKER_DEAD_AFTER_SECONDS`` for its heartbeat to go stale."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from django.utils import timezone

from django_sqlqueue.models import Job, JobAttempt
from django_sqlqueue.models import Worker as WorkerRow
from django_sqlqueue.states import Status
from django_sqlqueue.worker.heartbeat import sweep_gone_workers
from django_sqlqueue.worker.support import process_gone, process_key
from tests import workerutil as wu

worker_procs = wu.worker_procs


def _exited_child_key() -> str:
    """The process key of a child process that has exited since."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    key = process_key(child.pid)
    child.communicate(b"")
    return key


def test_a_process_key_tells_a_gone_process_from_a_live_one() -> None:
    mine = process_key()
    assert mine and mine.endswith(f":{os.getpid()}:" + mine.rsplit(":", 1)[1])
    assert not process_gone(mine)
    assert process_gone(_exited_child_key())
    space, pid, start = mine.rsplit(":", 2)
    assert process_gone(f"{space}:{pid}:{int(start) + 1}")  # the pid reused by a process started later
    assert not process_gone(f"another-boot:{space.split(':')[-1]}:999999:1")  # not ours to judge
    assert not process_gone("") and not process_gone("garbage")


@pytest.mark.django_db
def test_the_sweep_stops_only_rows_of_this_host_whose_process_is_gone() -> None:
    now, host = timezone.now(), socket.gethostname()
    gone = _exited_child_key()
    rows = {
        "gone/0": {"host": host, "process": gone, "incarnation": "g"},
        "alive/0": {"host": host, "process": process_key(), "incarnation": "a"},
        "elsewhere/0": {"host": "another-host", "process": gone, "incarnation": "e"},
        "stopped/0": {"host": host, "process": gone, "incarnation": "s", "stopped_at": now},
    }
    for name, values in rows.items():
        WorkerRow.objects.create(name=name, started_at=now, last_heartbeat=now, **values)
    assert sweep_gone_workers("default") == ["gone/0"]
    stopped = set(WorkerRow.objects.filter(stopped_at__isnull=False).values_list("name", flat=True))
    assert stopped == {"gone/0", "stopped/0"}
    assert sweep_gone_workers("default") == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)  # a bound for a hang: the waits below add up to more under load
def test_a_worker_killed_with_its_group_has_its_job_taken_by_a_worker_of_its_host_at_once(worker_procs,
                                                                                          tmp_path) -> None:
    """kill -9 of a whole worker (no supervisor left): its heartbeat row looks fresh for 60 s and the job's
    lease runs 60 s, yet another worker of the host takes the job within seconds."""
    # The job runs until the gate opens, after the kill (a fixed 12 s once ran out on a loaded machine
    # while the rescuer was still starting: the victim completed it itself).
    gate = tmp_path / "gate"
    job = Job.objects.enqueue("test.Sleep", {"seconds": 600, "until": str(gate)})
    a = worker_procs("--worker-name", "victim", "--concurrency", "1")
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).status_id == Status.PROCESSING, what="the victim to start the job")
    b = worker_procs("--worker-name", "rescuer", "--concurrency", "1")
    wu.wait_until(lambda: WorkerRow.objects.filter(name="rescuer/0", stopped_at=None).exists(),
                  what="the rescuer to register")
    os.killpg(a.pid, signal.SIGKILL)
    a.proc.wait(timeout=30)
    gate.touch()
    # Well inside WORKER_DEAD_AFTER_SECONDS (60) and the job's lease (60 s): only the sweep can free it.
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).status_id == Status.COMPLETED, timeout=45,
                  what="the rescuer to take the job over and complete it")
    assert list(JobAttempt.objects.filter(job=job).values_list("attempt_num", "worker")) == [
        (1, "victim/0"), (2, "rescuer/0")]
    assert "workers_gone" in b.stderr() and "victim/0" in b.stderr(), b.output()
    assert WorkerRow.objects.get(name="victim/0").stopped_at is not None
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.output()


@pytest.mark.django_db
def test_the_supervisors_sweep_reads_its_hosts_rows_seldom_and_checks_their_processes_each_time() -> None:
    """HostSweep: the rows of this host come from the database every ``reread_seconds``; between reads a
    run asks only ``/proc`` (no statement), and a listed worker whose process has died since is stamped
    stopped at the next run, not at the next read."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_sqlqueue.worker.heartbeat import HostSweep

    now, host = timezone.now(), socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    WorkerRow.objects.create(name="dies-later/0", host=host, process=process_key(child.pid), incarnation="d",
                             started_at=now, last_heartbeat=now)
    sweep = HostSweep("default", reread_seconds=20.0)
    assert sweep.run(100.0) == []  # the first run reads the rows: the child lives

    WorkerRow.objects.create(name="came-later/0", host=host, process=_exited_child_key(), incarnation="c",
                             started_at=now, last_heartbeat=now)
    with CaptureQueriesContext(connection) as idle:
        assert sweep.run(102.0) == []  # not read yet: came-later is not known
    assert len(idle) == 0

    child.communicate(b"")  # dies-later's process exits
    assert sweep.run(104.0) == ["dies-later/0"]  # known: found at once, without a read
    assert sweep.run(119.0) == []
    assert sweep.run(120.0) == ["came-later/0"]  # the read 20 s after the last one finds it
    assert set(WorkerRow.objects.filter(stopped_at__isnull=False).values_list("name", flat=True)) == {
        "dies-later/0", "came-later/0"}


@pytest.mark.django_db(transaction=True)
def test_while_it_listens_the_sweep_reads_its_hosts_rows_when_a_worker_of_the_host_says_hello(listener) -> None:
    """PostgreSQL: registering a worker row notifies the channel with a hello naming the host, and a
    supervisor's sweep that LISTENs reads the host's rows on that hello (or after a LISTEN again), on a
    long backstop otherwise: an idle worker no longer reads them every 20 s."""
    from django_sqlqueue.dialects import hello_host
    from django_sqlqueue.worker.heartbeat import HostSweep, register

    now, host = timezone.now(), socket.gethostname()
    hearing = {"on": True}
    sweep = HostSweep("default", reread_seconds=20.0, listening=lambda: hearing["on"], listening_reread_seconds=300.0)
    sweep.run(100.0)
    assert sweep.reads == 1
    list(listener.notifies(timeout=0.1))
    assert register("hello-test/0", "default", incarnation="h")
    hellos = [n.payload for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert [hello_host(p) for p in hellos] == [host[:200]]
    WorkerRow.objects.create(name="came-later/0", host=host, process=_exited_child_key(), incarnation="c",
                             started_at=now, last_heartbeat=now)
    assert sweep.run(130.0) == [] and sweep.reads == 1  # 30 s on: the 20-s timer is off while it listens
    sweep.reread()  # what the listener does on that hello
    assert sweep.run(131.0) == ["came-later/0"] and sweep.reads == 2
    assert sweep.run(400.0) == [] and sweep.reads == 2
    assert sweep.run(431.0) == [] and sweep.reads == 3  # the 300-s backstop
    hearing["on"] = False  # not listening: the 20-s timer again
    assert sweep.run(452.0) == [] and sweep.reads == 4


@pytest.mark.django_db(transaction=True)
def test_the_shared_listener_passes_on_a_hello_of_its_host_and_its_own_listen(listener) -> None:
    """The supervisor's LISTEN (SharedListener, the database thread's idle hook): a hello naming this host
    calls ``on_hello``, one naming another host does not, and every LISTEN (the first, and after a drop)
    calls it too, since hellos sent meanwhile went unheard."""
    import multiprocessing

    from django.db import connections

    from django_sqlqueue.conf import get_settings
    from django_sqlqueue.dialects import hello_payload
    from django_sqlqueue.worker.contract import WakeBoard
    from django_sqlqueue.worker.wakeup import HOST, SharedListener

    channel = get_settings().NOTIFY_CHANNEL
    calls: list[str] = []
    shared = SharedListener("default", channel, (), WakeBoard(multiprocessing.get_context("spawn"), 1), "hello")
    shared.on_hello = lambda: calls.append("hello")
    poke_r, _poke_w = os.pipe()
    try:
        shared.idle(poke_r)  # connects and LISTENs
        assert shared.listening and calls == ["hello"]
        with listener.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s), pg_notify(%s, %s)",
                           [channel, hello_payload("another-host"), channel, hello_payload(HOST)])
        wu.wait_until(lambda: shared.idle(poke_r) or len(calls) == 2, 30, what="the hello passed on")
        assert calls == ["hello", "hello"]
    finally:
        os.close(poke_r)
        os.close(_poke_w)
        connections["default"].close()
