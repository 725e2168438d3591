"""Workers behind a real PgBouncer (Debian's package) in transaction mode, in front of the test PostgreSQL.

* With ``SQLQUEUE["LISTEN_DATABASE"]`` on a direct connection: jobs drain through the pooler and idle
  slots wake by LISTEN/NOTIFY (``wakeup=listen``).
* Without it: the slots' LISTEN check fails (WARNING, ``wakeup=poll``), work is still picked up, and no
  queue notification strays to another client of the pool (a web process's psycopg kept them all).
* With psycopg prepared statements (``prepare_threshold``) through PgBouncer 1.18, which cannot share
  them: the supervisor survives the errors, logs the hint, and stops cleanly.

Skipped when pgbouncer is not installed (``apt-get install -y pgbouncer``; scripts/bootstrap.sh does).
Pickup latencies are printed (``-s``), never asserted: this machine is too noisy for timed assertions.
"""

from __future__ import annotations

import random
import re
import signal
import statistics
import time

import pytest
from django.db import connection

from django_sqlqueue.models import Job
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from tests import workerutil as wu
from tests.pgbouncer import PgBouncer, find_pgbouncer
from tests.procutil import database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(find_pgbouncer() is None, reason="pgbouncer is not installed (apt-get install -y pgbouncer)"),
]
worker_procs = wu.worker_procs


@pytest.fixture
def bouncer(pg_cluster, request):
    """PgBouncer in transaction mode in front of the session's cluster; ``pool_size`` via indirect params."""
    pool_size = getattr(request, "param", 2)
    with PgBouncer(pg_cluster.port, pool_mode="transaction", pool_size=pool_size) as b:
        yield b


def through(bouncer: PgBouncer, query: str = "") -> str:
    """The test database's URL through PgBouncer."""
    return bouncer.url(connection.settings_dict["NAME"], query=query)


def completed() -> int:
    return Job.objects.filter(status_id=Status.COMPLETED).count()


def pickup_ms(w: wu.WorkerProcess, n: int) -> list[float]:
    """Enqueue ``n`` jobs one at a time into idle workers; each job's claim time minus its enqueue time."""
    out = []
    for _ in range(n):
        time.sleep(random.uniform(0.3, 1.0))  # idle again (a polling slot's interval has grown)
        job = Job.objects.enqueue("test.Noop")
        wu.wait_until(lambda job=job: Job.objects.get(pk=job.pk).state == Status.COMPLETED, 30,
                      what=f"job {job.pk} to complete\n{w.output()}")
        job.refresh_from_db()
        out.append((job.started_at - job.enqueued_at).total_seconds() * 1000)
    return out


def report(label: str, ms: list[float]) -> None:
    print(f"\npickup behind pgbouncer ({label}): median {statistics.median(ms):.1f} ms, "
          f"min {min(ms):.1f}, max {max(ms):.1f}, n={len(ms)}")


def test_transaction_pooling_with_a_direct_listen_alias_drains_and_wakes(worker_procs, bouncer) -> None:
    Job.objects.enqueue_many([JobSpec("test.Noop", {"i": i}) for i in range(300)])
    w = worker_procs("--worker-name", "pooled", "--concurrency", "2", env={
        "SQLQUEUE_DATABASE_URL": through(bouncer),
        "SQLQUEUE_LISTEN_DATABASE_URL": database_url(connection.settings_dict),
    })
    wu.wait_until(lambda: completed() == 300, 120, interval=0.2, what=f"the drain\n{w.output()}")
    # Both slots listen (the drain may end before the second slot has logged its start: wait for it).
    wu.wait_until(lambda: w.stderr().count("wakeup=listen") == 2, 60, what=f"both slots' start\n{w.output()}")
    assert "listen_check_failed" not in w.stderr()
    report("LISTEN alias, direct", pickup_ms(w, 6))
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    assert "processed=306 succeeded=306" in w.stdout(), w.output()


@pytest.mark.parametrize("bouncer", [1], indirect=True)  # one server connection: every client shares it
def test_transaction_pooling_without_a_listen_alias_polls_and_strands_no_notification(worker_procs, bouncer) -> None:
    import psycopg

    from django_sqlqueue.conf import get_settings

    w = worker_procs("--worker-name", "deaf", env={"SQLQUEUE_DATABASE_URL": through(bouncer)})
    line = wu.wait_until(lambda: next((x for x in w.stderr().splitlines() if "worker_started" in x), None), 60,
                         what=f"worker_started\n{w.output()}")
    assert re.search(r"\bwakeup=poll\b", line), line
    warning = next(x for x in w.stderr().splitlines() if "listen_check_failed" in x)
    assert " WARNING " in warning and "LISTEN_DATABASE" in warning, warning
    # A web process's connection through the same pool, enqueueing (what an enqueue's statement sends):
    # a worker's LISTEN left on the shared server connection would hand it the queue's notifications.
    channel = get_settings().NOTIFY_CHANNEL
    got: list[str] = []
    with psycopg.connect(through(bouncer).replace("postgres://", "postgresql://"), autocommit=True) as web:
        web.add_notify_handler(lambda note: got.append(note.channel))
        for _ in range(20):
            web.execute("SELECT pg_notify(%s, %s)", [channel, "default"])
            web.execute("SELECT 1")
    assert channel not in got, got
    report("no LISTEN alias: polling", pickup_ms(w, 6))
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()


@pytest.mark.parametrize("bouncer", [1], indirect=True)
def test_prepared_statements_through_pgbouncer_1_18_the_supervisor_survives(worker_procs, bouncer) -> None:
    Job.objects.enqueue_many([JobSpec("test.Noop", {"i": i}) for i in range(20)])
    prepared = through(bouncer, "server_side_binding=true&prepare_threshold=0")
    w = worker_procs("--worker-name", "prepared", "--concurrency", "2", env={"SQLQUEUE_DATABASE_URL": prepared})
    wu.wait_until(lambda: "hint: prepared statements through a transaction pooler" in w.stderr(), 90,
                  what=f"the supervisor's hint\n{w.output()}")
    assert w.proc.poll() is None, w.output()
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    assert "supervisor_db_error" not in w.stderr(), w.output()
    # The queue is intact: the same worker name drains it with Django's default prepare_threshold (None),
    # server-side binding still on (its unnamed statements are fine through any PgBouncer).
    again = worker_procs("--worker-name", "prepared", "--burst", "--concurrency", "2",
                         env={"SQLQUEUE_DATABASE_URL": through(bouncer, "server_side_binding=true")})
    assert again.wait(120) == 0, again.output()
    assert completed() == 20 and not Job.objects.exclude(status_id=Status.COMPLETED).exists()
