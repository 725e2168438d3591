"""How many connections a worker holds, and what it does with fewer (issue 28), in real worker processes.

A worker of S slots holds S + 1 connections: one per slot (its claims and jobs) and one for its
supervisor (the heartbeat of all slots, the LISTEN, the schedule looks and its other work). Counted by
the server (pg_stat_activity, by the application_name the worker's URL sets; over TDS, Babelfish's
sys.dm_exec_sessions, by the client process ids), never by the worker.

With fewer connections than that (a role's CONNECTION LIMIT), the worker runs the slots it could
connect, says so once at WARNING, and every job still runs exactly once.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

from django_sqlqueue.models import Job
from django_sqlqueue.states import Status
from tests import workerutil as wu
from tests.procutil import database_url, test_db_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(480)]
worker_procs = wu.worker_procs
job_log = wu.job_log


def _pg_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: pg_stat_activity and roles with a connection limit")


def _sessions(application_name: str, root: int) -> int:
    """The server's count of the worker's sessions: PostgreSQL by the application_name its URL sets,
    SQL Server (Babelfish here) by the client process ids of the worker's process tree."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name])
        else:
            pids = _tree(root)
            marks = ", ".join(["%s"] * len(pids))
            cursor.execute(f"SELECT count(*) FROM sys.dm_exec_sessions WHERE host_process_id IN ({marks})", pids)
        return int(cursor.fetchone()[0])


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _idle_and_settled(w: wu.WorkerProcess, slots: int) -> None:
    wu.wait_until(lambda: w.stderr().count("worker_started") == slots, 240, what=f"{slots} slots to start\n{w.output()}")
    time.sleep(2.0)  # a few beats and idle polls: every connection the worker keeps is open by now


@pytest.mark.parametrize("concurrency", [4, 1])
def test_a_worker_holds_one_connection_per_slot_and_one_for_its_supervisor(worker_procs, job_log,
                                                                          concurrency) -> None:
    if connection.vendor not in ("postgresql", "microsoft"):
        pytest.skip("a server that lists its sessions (pg_stat_activity, sys.dm_exec_sessions)")
    name = f"sqlqueue-conn-{uuid.uuid4().hex[:8]}"
    env = {}
    if connection.vendor == "postgresql":
        env["SQLQUEUE_DATABASE_URL"] = database_url(connection.settings_dict) + f"?application_name={name}"
    w = worker_procs("--worker-name", "counted", "--concurrency", str(concurrency), env=env)
    _idle_and_settled(w, concurrency)
    if connection.vendor == "postgresql":
        assert "wakeup=listen" in w.stderr(), w.output()  # the LISTEN is one of them
    idle = _sessions(name, w.pid)
    assert idle == concurrency + 1, (idle, w.output())
    # Busy: every slot runs a job (and the supervisor renews their leases, looks for cancels).
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 2, "log": str(job_log.path)}) for _ in range(concurrency)]
    wu.wait_until(lambda: all(job_log.events(j.pk) for j in jobs), 60, what=f"every job to start\n{w.output()}")
    busy = _sessions(name, w.pid)
    wu.wait_until(lambda: Job.objects.filter(pk__in=[j.pk for j in jobs], status_id=Status.COMPLETED).count()
                  == concurrency, 60, what=f"the jobs to complete\n{w.output()}")
    assert busy <= concurrency + 1, (busy, w.output())
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()


def test_with_a_listen_alias_a_worker_holds_one_more_connection_for_its_listen(worker_procs) -> None:
    _pg_only()
    name = f"sqlqueue-conn-{uuid.uuid4().hex[:8]}"
    url = database_url(connection.settings_dict)
    w = worker_procs("--worker-name", "aliased", "--concurrency", "2",
                     env={"SQLQUEUE_DATABASE_URL": f"{url}?application_name={name}",
                          "SQLQUEUE_LISTEN_DATABASE_URL": f"{url}?application_name={name}-listen"})
    _idle_and_settled(w, 2)
    assert w.stderr().count("wakeup=listen") == 2, w.output()
    assert (_sessions(name, w.pid), _sessions(f"{name}-listen", w.pid)) == (3, 1), w.output()
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()


@pytest.fixture
def limited_role(pg_cluster):
    """A login role with every privilege on the test database's tables, its connections limited."""
    role = f"sqlqueue_starved_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 3")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    yield role
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


def _role_url(role: str) -> str:
    parts = urlsplit(test_db_env()["SQLQUEUE_DATABASE_URL"])
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def _starts(job_log: wu.JobLog, job_id: int) -> int:
    return sum(1 for _a, event in job_log.events(job_id) if event == "start")


@pytest.mark.parametrize("limit, running", [(3, 2), (2, 1)])
def test_a_worker_short_of_connections_runs_the_slots_it_can_and_every_job_once(worker_procs, job_log,
                                                                               limited_role, limit,
                                                                               running) -> None:
    """Issue 28's held-out case (limit 3, 2 slots: 4 short jobs) and a starved one (limit 2: one slot
    runs, the other retries with backoff, one WARNING says so). Every job runs exactly once."""
    _pg_only()
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {limited_role} CONNECTION LIMIT {int(limit)}")
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 1, "log": str(job_log.path)}) for _ in range(4)]
    w = worker_procs("--worker-name", "starved", "--concurrency", "2",
                     env={"SQLQUEUE_DATABASE_URL": _role_url(limited_role)})
    wu.wait_until(lambda: Job.objects.filter(pk__in=[j.pk for j in jobs], status_id=Status.COMPLETED).count() == 4,
                  120, interval=0.2, what=f"the four jobs to complete\n{w.output()}")
    assert [_starts(job_log, j.pk) for j in jobs] == [1, 1, 1, 1], w.output()
    assert {Job.objects.get(pk=j.pk).attempt_num for j in jobs} == {1}
    workers = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("worker", flat=True))
    assert len(workers) <= running, (workers, w.output())
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    warnings = [line for line in w.stderr().splitlines() if " WARNING " in line]
    starved = [line for line in warnings if "worker_starved" in line]
    if running == 2:
        assert not starved and not warnings, w.output()  # 2 slots + 1 supervisor: it fits
    else:
        assert len(starved) == 1, w.output()  # once, not a flood
        assert "slots_connected=1 of 2" in starved[0], starved[0]
        # Nothing else at WARNING about it: the other slot's retries are INFO.
        assert not [line for line in warnings if "worker_starved" not in line], w.output()
