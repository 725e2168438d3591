"""The soak in short (bench/soak.py with SoakConfig.ci), and what the soak found, pinned down as tests.

The short soak runs real ``run_queue_worker`` and producer processes against the test database:
about 5,000 enqueue calls from 4 producers (1,500 from 2 on SQLite), one ``kill -9`` of a whole
worker (restarted under the same or a new name), one SIGTERM that must exit 0, one PostgreSQL restart
(PostgreSQL only), then every check of bench/soak_verify.py. The full run is ``python bench/soak.py``
(docs/soak.md).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection, transaction

from bench.soak import Soak, SoakConfig, slot_pids
from django_sqlqueue import jobtypes
from django_sqlqueue.models import Job, JobAttempt, JobType, Worker
from django_sqlqueue.states import Status
from testproject.soakjobs.jobs import TYPE_OPTIONS
from testproject.soakjobs.models import SideEffect
from tests import workerutil as wu
from tests.procutil import database_url
from tests.sessiondb import get_cluster

pytestmark = [pytest.mark.django_db(transaction=True)]
worker_procs = wu.worker_procs


def _vendor() -> str:
    if connection.vendor not in ("postgresql", "sqlite"):
        pytest.skip("the soak runs on PostgreSQL and SQLite")
    return "postgres" if connection.vendor == "postgresql" else "sqlite"


@pytest.mark.timeout(600)  # a bound for a hang: the pause + twin step alone may wait minutes under load
def test_short_soak_loses_nothing_and_runs_nothing_twice(tmp_path) -> None:
    db = _vendor()
    config = SoakConfig.ci(db)
    cluster = get_cluster()
    restart = cluster.restart if db == "postgres" and cluster is not None else None
    config.db_restart = restart is not None
    report = Soak(config, database_url(connection.settings_dict), tmp_path, restart_db=restart,
                  log=lambda line: None).run()
    print(report.text())
    assert report.ok, report.text()
    assert report.chaos["kills"] == 1 and report.chaos["sigterm"]["exit"] == 0
    assert ("db_restart" in report.chaos) == (restart is not None)
    assert report.numbers["jobs"] == config.expected_jobs()


def _hold(job: Job) -> None:
    """Inside the caller's transaction: hold the job's row (PostgreSQL) or the database's write lock
    (SQLite, an IMMEDIATE transaction), so that whoever writes the job next waits for the caller."""
    if connection.vendor == "postgresql":
        Job.objects.select_for_update().get(pk=job.pk)
    else:
        Job.objects.filter(pk=job.pk).update(priority=0)


def _others_wait_for_us(query_like: str) -> bool:
    """PostgreSQL: another session's statement (``query_like``) waits for a lock of ours."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND wait_event_type = 'Lock' AND query LIKE %s", [query_like])
        return cursor.fetchone()[0] > 0


@pytest.mark.timeout(420)  # a bound for a hang: its waits add up to minutes on a loaded machine
def test_slot_killed_while_recording_its_result_does_not_get_its_attempt_back(worker_procs, tmp_path) -> None:
    """A slot killed after its handler ran, before the outcome committed: the run must stay in the history.

    Found by the soak (a non-transactional side effect recorded twice under the same attempt number).
    The worker cleared the supervisor's "current job" slot as soon as the handler returned, before it
    recorded the outcome; when the slot died in between, the supervisor took the job for a
    claimed-but-unstarted one and handed it back to Pending "without spending an attempt": the attempt
    number was given back and the history row of a run that did happen deleted. The job then ran
    again under the same attempt number, and a job could be re-run that way without ever using up its
    attempts. Here the test holds the job (its row, or SQLite's write lock) from the handler's side
    effect on, waits for the handler to return and the slot to wait to record the outcome, and kills it.
    """
    _vendor()
    JobType.objects.update_or_create(name="soak.NonTx", defaults={**TYPE_OPTIONS, "lease_seconds": 60})
    jobtypes.clear_cache()
    returned = tmp_path / "returned"
    job = Job.objects.enqueue("soak.NonTx", {"sleep_after": 1500, "returned_marker": str(returned)})
    w = worker_procs("--worker-name", "race")
    effect = wu.wait_until(lambda: SideEffect.objects.filter(job_id=job.pk).first(), 30,
                           what="the handler's side effect")
    with transaction.atomic():
        _hold(job)  # the slot's recording waits for this transaction from now on
        assert Job.objects.get(pk=job.pk).state == Status.PROCESSING, (
            "the slot recorded its outcome before the test held the job: sleep_after is too short here")
        wu.wait_until(returned.exists, 30, what="the handler to return")
        if connection.vendor == "postgresql":
            # The slot's completion (its data-modifying CTE) is seen waiting for the row we hold.
            wu.wait_until(lambda: _others_wait_for_us("WITH done AS%"), 30,
                          what="the slot's completion to wait for the job's row")
        else:
            # SQLite shows no lock waiters. After the marker the slot runs a few lines of Python (the
            # handler's return, the outcome kept for recording) before it asks for the write lock: a
            # second is ample, and is not raced against another sleep.
            time.sleep(1.0)
        os.kill(effect.pid, signal.SIGKILL)
        wu.wait_until(lambda: not wu.pid_alive(effect.pid), 10, what="the slot to die")
        # The supervisor has seen the death (its clean-up, submitted now, waits for us or not: either
        # way the slot restarts only after it).
        wu.wait_until(lambda: "slot_died" in w.stderr(), 10, what="the supervisor to see the slot die")
    # Up to its 60 s lease and a claim after it on a loaded machine: a bound for a hang, not a speed.
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 180, what="the job to complete")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    runs = sorted(SideEffect.objects.filter(job_id=job.pk).values_list("attempt_num", flat=True))
    history = [(a.attempt_num, a.finished_at is not None) for a in JobAttempt.objects.filter(job_id=job.pk)]
    # The handler ran twice: both runs are attempts, and the first one is in the history, never closed.
    assert runs == [1, 2], (runs, history)
    assert history == [(1, False), (2, True)]
    assert Job.objects.get(pk=job.pk).attempt_num == 2


@pytest.mark.timeout(420)  # a bound for a hang: two worker start-ups, a 60 s lease and a reclaim under load
def test_a_restarted_slot_that_dies_does_not_hand_back_its_predecessors_job(worker_procs) -> None:
    """A job still held under a slot's name by an EARLIER process (a worker killed -9 and restarted under
    the same name) ran in that process: the new slot dying must not hand it back as unstarted.

    Found by the soak (seed 391666473: a non-transactional job whose side effect was recorded twice under
    attempt 1, with one history row). When a slot died, the supervisor released every Processing job
    carrying the slot's name except the ones that slot process reported as started, which included jobs
    the previous incarnation of the worker claimed and ran before it was killed, if the new slot had not
    reclaimed them yet. Here the test holds the job's row so that the new slot cannot reclaim it before
    it is killed.
    """
    _vendor()
    JobType.objects.update_or_create(name="soak.NonTx", defaults={**TYPE_OPTIONS, "lease_seconds": 60})
    jobtypes.clear_cache()
    job = Job.objects.enqueue("soak.NonTx", {"sleep_after": 3000})
    first = worker_procs("--worker-name", "gen")
    wu.wait_until(lambda: SideEffect.objects.filter(job_id=job.pk).exists(), 30, what="the first run's effect")
    first.kill_group()  # the whole worker, kill -9, while the handler still runs: attempt 1 is lost
    held = Job.objects.get(pk=job.pk)
    assert held.state == Status.PROCESSING and held.attempt_num == 1
    with transaction.atomic():
        # Hold the job so that the restarted slot cannot take it back (PostgreSQL: its claim skips the
        # locked row; SQLite: it waits for the write lock).
        _hold(job)
        second = worker_procs("--worker-name", "gen")
        try:
            slots = wu.wait_until(lambda: slot_pids(second.pid), 90, what="the new slot")
        except AssertionError as exc:  # what the worker was doing meanwhile
            raise AssertionError(f"{exc}\n{second.output()}") from None
        if connection.vendor == "postgresql":
            # The new slot is set up: it registered the name under its own incarnation (its claims
            # then skip the held row). Its row names its process: that one is killed. (The first pid
            # seen above may have been a short-lived child of the supervisor, caught between its fork
            # and its exec while it still had the supervisor's command line.)
            registered = wu.wait_until(lambda: Worker.objects.filter(name=held.worker)
                                       .exclude(incarnation=held.incarnation).first(), 60,
                                       what="the new slot to register")
            victim = registered.pid
        else:
            # (SQLite: the new slot waits for the write lock from its first write on; what is tested is
            # the supervisor's clean-up after its death, whatever it had got to.)
            victim = wu.wait_until(lambda: slot_pids(second.pid), 30, what="the new slot, still there")[0]
        os.kill(victim, signal.SIGKILL)
        try:
            wu.wait_until(lambda: "slot_died" in second.stderr(), 10, what="the supervisor to see the slot die")
        except AssertionError as exc:  # which process was killed, and what the worker said meanwhile
            raise AssertionError(f"{exc}\nkilled {victim} (first seen: {slots}); slots now "
                                 f"{slot_pids(second.pid)}\n{second.output()}") from None
    # Up to its 60 s lease and a claim after it on a loaded machine: a bound for a hang, not a speed.
    try:
        wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 180, what="the job to complete")
    except AssertionError as exc:  # what the worker was doing meanwhile
        raise AssertionError(f"{exc}\n{second.output()}") from None
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()
    runs = sorted(SideEffect.objects.filter(job_id=job.pk).values_list("attempt_num", flat=True))
    history = [(a.attempt_num, a.finished_at is not None) for a in JobAttempt.objects.filter(job_id=job.pk)]
    assert runs == [1, 2], (runs, history)
    assert history == [(1, False), (2, True)]
