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


def row(name: str, host: str, pid: int, *, beat_age: float = 1.0, stopped: bool = False,
        process: str = "") -> WorkerRow:
    now = timezone.now()
    beat = now - timedelta(seconds=beat_age)
    return WorkerRow.objects.create(name=name, host=host, pid=pid, started_at=beat, last_heartbeat=beat,
                                    stopped_at=now if stopped else None, process=process)


def key_of(pid: int, ticks: str = "1") -> str:
    """A process key (support.process_key) of ``pid`` in this boot and PID namespace."""
    from django_sqlqueue.worker.support import _namespace

    return f"{_namespace()}:{pid}:{ticks}"


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
    row("w/0", HOST, dead_pid, process=key_of(dead_pid))
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


# ----- issue 31, item 6: PID namespaces sharing the host's /proc ----------------------------------------------
def test_default_names_are_unique_per_process() -> None:
    from django_sqlqueue.worker.contract import default_worker_name

    names = {default_worker_name() for _ in range(20)}
    assert len(names) == 20, "a random id in every default name"
    assert all(n.startswith(f"{HOST}:{os.getpid()}-") for n in names), names


def test_a_row_without_a_process_key_is_never_judged_by_its_pid(dead_pid: int) -> None:
    # A pid alone proves nothing where PID namespaces share the host's /proc: the name waits for the
    # heartbeat (a row of an older version, or of a worker that could not read its own key).
    row("w/0", HOST, dead_pid)
    with pytest.raises(WorkerNameInUse, match="cannot prove that one is gone"):
        register("w/0", "default")
    WorkerRow.objects.filter(name="w/0").delete()
    row("w/0", HOST, os.getpid())  # "this very pid": every supervisor in such a namespace is pid 1
    with pytest.raises(WorkerNameInUse, match="cannot prove that one is gone"):
        register("w/0", "default")


def test_without_a_key_of_its_own_a_worker_never_assumes_the_holder_gone(monkeypatch, dead_pid: int) -> None:
    from django_sqlqueue.worker import heartbeat

    row("w/0", HOST, dead_pid, process=key_of(dead_pid))
    monkeypatch.setattr(heartbeat, "process_key", lambda pid=None: "")  # no /proc of its own namespace
    with pytest.raises(WorkerNameInUse, match="cannot prove that one is gone"):
        register("w/0", "default")
    monkeypatch.undo()
    assert register("w/0", "default")  # with its key, the dead holder is proved gone at once


def _unshare_refusal() -> str | None:
    """Why ``unshare --pid --fork`` cannot run here (None: it can)."""
    import shutil

    if shutil.which("unshare") is None:
        return "no unshare command"
    done = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare --pid is not permitted here: {done.stderr.strip()}"


UNSHARE = ("unshare", "--pid", "--fork")  # a new PID namespace, the host's /proc (no --mount-proc)


@pytest.mark.skipif(_unshare_refusal() is not None, reason=str(_unshare_refusal()))
def test_two_default_named_workers_in_pid_namespaces_each_run_their_own_jobs(worker_procs, tmp_path) -> None:
    """Two supervisors under ``unshare --pid --fork``, both pid 1 with slots of equal pids, and no process
    key: was ``<host>:1`` for both, one job ran in both at once and they killed each other's slots."""
    log = wu.JobLog(tmp_path)
    workers = [worker_procs("--concurrency", "2", prefix=UNSHARE) for _ in range(2)]
    live = wu.wait_until(lambda: (lambda rows: rows if len(rows) == 4 else None)(
        list(WorkerRow.objects.filter(stopped_at__isnull=True).values_list("name", "pid", "process"))), 60,
        what="both workers' slots to register")
    assert len({name for name, _, _ in live}) == 4, live
    assert all(process == "" for _, _, process in live), "no process key in such a namespace"
    assert len({name.split("/")[0] for name, _, _ in live}) == 2, live
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 1.5, "log": str(log.path)}) for _ in range(6)]
    wu.wait_until(lambda: Job.objects.filter(status_id=Status.COMPLETED).count() == 6, 60,
                  what="every job to complete")
    for w in workers:
        assert w.proc.poll() is None, w.output()
    assert all(Job.objects.get(pk=j.pk).attempt_num == 1 for j in jobs)
    starts = sorted(job for job, _, event, _ in log.lines() if event == "start")
    assert starts == sorted(j.pk for j in jobs), "each job started once"


@pytest.mark.skipif(_unshare_refusal() is not None, reason=str(_unshare_refusal()))
def test_a_second_worker_in_a_pid_namespace_never_takes_a_live_name(worker_procs) -> None:
    """Same explicit name, both under ``unshare --pid --fork``: the second cannot prove the first gone
    (equal pids, no process key) and is refused; was: it took the name."""
    first = worker_procs("--worker-name", "nsname", prefix=UNSHARE)
    wu.wait_until(lambda: WorkerRow.objects.filter(name="nsname/0", stopped_at__isnull=True).exists(), 60,
                  what="the first worker to register")
    held = WorkerRow.objects.get(name="nsname/0")
    second = worker_procs("--worker-name", "nsname", "--burst", prefix=UNSHARE)
    assert second.wait(timeout=60) == 1, second.output()
    assert "WorkerNameInUse: worker name" in second.stderr()
    assert first.proc.poll() is None
    assert WorkerRow.objects.get(name="nsname/0").incarnation == held.incarnation
