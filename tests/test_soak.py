"""The soak in short (bench/soak.py with SoakConfig.ci), and what the soak found, pinned down as tests.

The short soak runs real ``run_queue_worker`` and producer processes against the test database:
about 3,000 enqueue calls from 4 producers (1,500 from 2 on SQLite), one ``kill -9`` of a whole
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
from django_sqlqueue.models import Job, JobAttempt, JobType
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


@pytest.mark.timeout(240)
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


@pytest.mark.timeout(120)
def test_slot_killed_while_recording_its_result_does_not_get_its_attempt_back(worker_procs) -> None:
    """A slot killed after its handler ran, before the outcome committed: the run must stay in the history.

    Found by the soak (a non-transactional side effect recorded twice under the same attempt number).
    The worker clears the supervisor's "current job" slot as soon as the handler returns, before it
    records the outcome; when the slot dies in between, the supervisor takes the job for a
    claimed-but-unstarted one and hands it back to Pending "without spending an attempt": the attempt
    number is given back and the history row of a run that did happen is deleted. The job then runs
    again under the same attempt number, and a job could be re-run that way without ever using up its
    attempts. Here the test holds the job's row so that the slot is caught in that window every time.
    """
    _vendor()
    JobType.objects.update_or_create(name="soak.NonTx", defaults={**TYPE_OPTIONS, "lease_seconds": 60})
    jobtypes.clear_cache()
    job = Job.objects.enqueue("soak.NonTx", {"sleep_after": 1500})
    w = worker_procs("--worker-name", "race")
    effect = wu.wait_until(lambda: SideEffect.objects.filter(job_id=job.pk).first(), 30,
                           what="the handler's side effect")
    with transaction.atomic():
        # Hold the job row while the handler finishes: the slot's completion waits on it (and so will
        # the supervisor's clean-up after the kill).
        if connection.vendor == "postgresql":
            Job.objects.select_for_update().get(pk=job.pk)
        else:  # SQLite: an IMMEDIATE transaction holds the database's write lock
            Job.objects.filter(pk=job.pk).update(priority=0)
        time.sleep(2.0)  # the handler has returned; the slot is waiting to record its outcome
        os.kill(effect.pid, signal.SIGKILL)
        wu.wait_until(lambda: not wu.pid_alive(effect.pid), 10, what="the slot to die")
        time.sleep(0.5)  # the supervisor notices and cleans up after the slot
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 60, what="the job to complete")
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    runs = sorted(SideEffect.objects.filter(job_id=job.pk).values_list("attempt_num", flat=True))
    history = [(a.attempt_num, a.finished_at is not None) for a in JobAttempt.objects.filter(job_id=job.pk)]
    # The handler ran twice: both runs are attempts, and the first one is in the history, never closed.
    assert runs == [1, 2], (runs, history)
    assert history == [(1, False), (2, True)]
    assert Job.objects.get(pk=job.pk).attempt_num == 2


@pytest.mark.timeout(120)
def test_a_restarted_slot_that_dies_does_not_hand_back_its_predecessors_job(worker_procs) -> None:
    """A job still held under a slot's name by an EARLIER process (a worker killed -9 and restarted under
    the same name) ran in that process: the new slot dying must not hand it back as unstarted.

    Found by the soak (seed 391666473: a non-transactional job whose side effect was recorded twice under
    attempt 1, with one history row). When a slot dies, the supervisor releases every Processing job
    carrying the slot's name except the ones that slot process reported as started, which includes jobs
    the previous incarnation of the worker claimed and ran before it was killed, if the new slot has not
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
    with transaction.atomic():
        # Hold the job so that the restarted slot cannot take it back (PostgreSQL: its claim skips the
        # locked row; SQLite: it waits for the write lock).
        if connection.vendor == "postgresql":
            Job.objects.select_for_update().get(pk=job.pk)
        else:
            Job.objects.filter(pk=job.pk).update(priority=0)
        second = worker_procs("--worker-name", "gen")
        slots = wu.wait_until(lambda: slot_pids(second.pid), 90, what="the new slot")
        time.sleep(2.5)  # set up, registered (PostgreSQL) and claiming
        os.kill(slots[0], signal.SIGKILL)
        wu.wait_until(lambda: "slot_died" in second.stderr(), 10, what="the supervisor to see the slot die")
        time.sleep(0.5)
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 60, what="the job to complete")
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()
    runs = sorted(SideEffect.objects.filter(job_id=job.pk).values_list("attempt_num", flat=True))
    history = [(a.attempt_num, a.finished_at is not None) for a in JobAttempt.objects.filter(job_id=job.pk)]
    assert runs == [1, 2], (runs, history)
    assert history == [(1, False), (2, True)]
