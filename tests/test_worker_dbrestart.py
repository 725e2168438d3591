"""A PostgreSQL restart while a worker runs: the worker survives and finishes the remaining jobs."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from django_sqlqueue.models import Job
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
worker_procs = wu.worker_procs
job_log = wu.job_log


def completed() -> int:
    try:
        return Job.objects.filter(status_id=Status.COMPLETED).count()
    except Exception:  # our own connection died with the server: reconnect on the next poll
        connection.close()
        return -1


def test_worker_survives_a_postgresql_restart(pg_cluster, worker_procs, job_log) -> None:
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 0.2, "log": str(job_log.path)}) for _ in range(20)]
    w = worker_procs("--worker-name", "pgr", "--concurrency", "2")
    wu.wait_until(lambda: completed() >= 4, 30, what="some jobs to complete")
    pg_cluster.stop()  # fast shutdown: every session is terminated mid-whatever
    connection.close()
    time.sleep(3)  # the worker retries with backoff meanwhile
    assert w.proc.poll() is None, w.output()
    pg_cluster.restart()
    wu.wait_until(lambda: completed() == len(jobs), 90, interval=0.2, what="every job to complete")
    assert w.proc.poll() is None, w.output()
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()
    assert "database_unavailable" in w.stderr() and "database_back" in w.stderr()
    assert "processed=20 succeeded=20" in w.stdout()
