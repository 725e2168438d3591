"""Workers under pauses, partitions and hostile handlers (issue 21 and 22's process-level findings).

Real ``run_queue_worker`` processes against the test database, with the liveness timings shortened
through ``SQLQUEUE_TEST_DEAD_AFTER`` (testproject/settings.py). A paused process is a SIGSTOPped
process group (what a VM pause, a container freeze or a long GC looks like from the database).

"Ran at the same time" is judged from the ``test.Ticker`` handler's lines: each process appends
``<pid> <wall time> <event> <attempt>`` while it runs the job; two processes ran the job at once when
one logged while the other's run was open (started and not yet ended, stopped or killed).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from django.db import connection

from bench.faultproxy import CuttingProxy
from django_sqlqueue.models import Job, JobAttempt
from django_sqlqueue.models import Worker as WorkerRow
from django_sqlqueue.states import Status
from tests import workerutil as wu

pytestmark = [pytest.mark.django_db(transaction=True)]
worker_procs = wu.worker_procs
job_log = wu.job_log

#: Shortened liveness timings (production: 60 s, 10 s), as bench/soak.py sets them: a slot's job is at
#: risk after 80 % of the dead-after time without a beat (4.8 s), so a loaded machine's scheduling
#: stalls (seconds) do not pass for the pauses and partitions these tests make on purpose.
DEAD_AFTER = 6.0
FAST = {"SQLQUEUE_TEST_DEAD_AFTER": str(DEAD_AFTER), "SQLQUEUE_TEST_HEARTBEAT": "0.5"}


def ticks(path: Path) -> list[tuple[int, float, str, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, when, event, attempt = line.split()
        out.append((int(pid), float(when), event, int(attempt)))
    return out


def runs_by_pid(lines: list[tuple[int, float, str, int]]) -> dict[int, tuple[float, float]]:
    """(first, last) wall times of each process's work on the job ("stopped" is not work: it is the
    handler noticing, first thing after a resume, that it must not go on)."""
    spans: dict[int, tuple[float, float]] = {}
    for pid, when, event, _attempt in lines:
        if event == "stopped":
            continue
        first, _last = spans.get(pid, (when, when))
        spans[pid] = (first, when)
    return spans


def overlaps(lines: list[tuple[int, float, str, int]]) -> list[tuple[int, int]]:
    spans = sorted(runs_by_pid(lines).items(), key=lambda kv: kv[1][0])
    return [(a, b) for (a, (_, a_end)), (b, (b_start, _)) in zip(spans, spans[1:], strict=False)
            if b_start < a_end]


def pause_group(proc: wu.WorkerProcess) -> None:
    os.killpg(proc.pid, signal.SIGSTOP)


def resume_group(proc: wu.WorkerProcess) -> None:
    os.killpg(proc.pid, signal.SIGCONT)


@pytest.mark.timeout(360)  # a bound for a hang: the waits below add up to more under load
def test_a_paused_worker_and_its_same_name_twin_never_run_one_job_at_once(worker_procs, tmp_path) -> None:
    """Finding 21.1: pause past the dead-after time, a twin starts under the name, the first resumes."""
    path = tmp_path / "ticks.log"
    job = Job.objects.enqueue("test.Ticker", {"ticks": str(path), "seconds": 120})
    first = worker_procs("--worker-name", "dup", "--concurrency", "1", env=FAST)
    wu.wait_until(lambda: ticks(path), what="the first worker to start the job")
    pause_group(first)
    # Long enough that it still runs when paused, however slow the test is to pause it; short on retake.
    Job.objects.filter(pk=job.pk).update(payload={"ticks": str(path), "seconds": 6})
    try:
        time.sleep(DEAD_AFTER + 1.0)  # its heartbeat is now older than the dead-after time
        twin = worker_procs("--worker-name", "dup", "--concurrency", "1", env=FAST)
        wu.wait_until(lambda: any(p != first_pid(path) and e == "start" for p, _w, e, _a in ticks(path)),
                      what="the twin to take the job over")
    finally:
        resume_group(first)
    # The first process finds its registration replaced and stops (exit 1, never claiming again): its
    # heartbeat sees the row under another incarnation, or its supervisor, seeing the slot's standing
    # gone, kills the slot first and the restarted slot is refused the name.
    assert first.wait(timeout=60) == 1, first.output()
    assert "worker_replaced" in first.stderr() or "is in use by a live worker" in first.stderr(), first.output()
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).status_id == Status.COMPLETED, timeout=60,
                  what="the twin to complete the job")
    lines = ticks(path)
    assert not overlaps(lines), (overlaps(lines), lines[-20:])
    # Attempt 1 (the paused process) and attempt 2 (the twin), each by its own process.
    assert sorted({(pid, attempt) for pid, _w, _e, attempt in lines})[-1][1] == 2
    # The twin is healthy: more work is done by it, once.
    later = Job.objects.enqueue("test.Echo", {"n": 1})
    wu.wait_until(lambda: Job.objects.get(pk=later.pk).status_id == Status.COMPLETED, timeout=30,
                  what="the twin to run a later job")
    assert Job.objects.get(pk=later.pk).attempt_num == 1
    twin.signal(signal.SIGTERM)
    assert twin.wait(timeout=60) == 0, twin.output()


def first_pid(path: Path) -> int:
    return ticks(path)[0][0]


@pytest.mark.timeout(300)  # a bound for a hang: the waits below add up to more under load
def test_a_slot_paused_past_its_lease_never_runs_alongside_the_new_owner(worker_procs, tmp_path) -> None:
    """Finding 21.6: only the slot is paused (its supervisor is not); another worker takes the job.

    The handler ignores ``should_stop()``: the supervisor sees the slot's heartbeat go stale and kills
    it before its jobs may be taken over, so it never wakes up to run alongside the new owner.
    """
    path = tmp_path / "ticks.log"
    job = Job.objects.enqueue("test.Ticker", {"ticks": str(path), "seconds": 120, "cooperative": False})
    a = worker_procs("--worker-name", "a", "--concurrency", "1", env=FAST)
    wu.wait_until(lambda: ticks(path), what="worker a to start the job")
    slot = wu.wait_until(lambda: WorkerRow.objects.filter(name="a/0").values_list("pid", flat=True).first(),
                         what="a's slot row")
    os.kill(slot, signal.SIGSTOP)
    # Long enough that it still runs when paused, however slow the test is to pause it; short on retake.
    Job.objects.filter(pk=job.pk).update(payload={"ticks": str(path), "seconds": 5, "cooperative": False})
    b = worker_procs("--worker-name", "b", "--concurrency", "1", env=FAST)
    wu.wait_until(lambda: Job.objects.get(pk=job.pk).status_id == Status.COMPLETED, timeout=60,
                  what="worker b to take over and complete the job")
    assert "slot_killed worker=a/0 reason=lease-at-risk" in a.stderr(), a.output()
    lines = ticks(path)
    assert not overlaps(lines), (overlaps(lines), lines[-20:])
    assert slot in runs_by_pid(lines) and len(runs_by_pid(lines)) == 2
    for proc in (a, b):
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.output()


@pytest.mark.timeout(120)
def test_a_handler_that_leaves_atomic_open_is_an_error_and_the_slot_carries_on(worker_procs, job_log) -> None:
    """Finding 21.5: the abandoned block is rolled back, the attempt is an error naming the cause."""
    bad = Job.objects.enqueue("test.LeaveAtomic", {"log": str(job_log.path)}, max_attempts=1)
    good = Job.objects.enqueue("test.Echo", {"log": str(job_log.path)})
    worker = worker_procs("--burst", "--concurrency", "1")
    assert worker.wait(timeout=60) == 0, worker.output()
    bad.refresh_from_db()
    assert bad.status_id == Status.FAILED, (bad.status_id, bad.error)
    assert "transaction.atomic() still open" in bad.error
    assert [e for _a, e in job_log.events(bad.pk)] == ["run"]  # ran once, not once per slot restart
    assert Job.objects.get(pk=good.pk).status_id == Status.COMPLETED
    assert "slot_died" not in worker.stderr(), worker.output()


@pytest.mark.timeout(120)
def test_a_handler_exit_code_is_a_slot_death_not_a_worker_verdict(worker_procs, job_log) -> None:
    """Finding 21.10: ``os._exit(3)`` in a handler used to stop the whole worker as a fatal error."""
    dying = Job.objects.enqueue("test.Exit", {"log": str(job_log.path), "code": 3}, max_attempts=1)
    worker = worker_procs("--concurrency", "1")
    wu.wait_until(lambda: job_log.events(dying.pk), what="the handler to run")
    wu.wait_until(lambda: "slot_died" in worker.stderr(), what="the supervisor to see the slot die")
    later = Job.objects.enqueue("test.Echo", {"log": str(job_log.path)})
    wu.wait_until(lambda: Job.objects.get(pk=later.pk).status_id == Status.COMPLETED, timeout=30,
                  what="the restarted slot to run the next job")
    assert worker.proc.poll() is None, worker.output()  # still running: not stopped as "fatal"
    assert "exit=3 (undeclared)" in worker.stderr(), worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, worker.output()


@pytest.mark.timeout(360)  # a bound for a hang: the waits below add up to more under load
def test_a_handler_exiting_0_under_burst_is_a_death_and_the_worker_row_is_stopped(worker_procs, job_log) -> None:
    """Finding 21.10: ``os._exit(0)`` under --burst used to look like a drained slot."""
    dying = Job.objects.enqueue("test.Exit", {"log": str(job_log.path), "code": 0}, max_attempts=1)
    worker = worker_procs("--burst", "--concurrency", "1", "--worker-name", "exit0")
    # Issue 32 item 13: a burst run that leaves a job it claimed unfinished does not report success.
    assert worker.wait(timeout=300) == 1, worker.output()
    assert "slot_died worker=exit0/0 exit=0 (undeclared)" in worker.stderr(), worker.output()
    assert f"a worker slot died while running job(s) {dying.pk}" in worker.stderr(), worker.output()
    assert [e for _a, e in job_log.events(dying.pk)] == ["run"]
    row = WorkerRow.objects.get(name="exit0/0")
    assert row.stopped_at is not None
    # Its attempt is spent (it ran: not handed back as unstarted), and its state says what happened: the
    # attempt failed with the slot's death, Failed with no attempts left (the reaper's "lease expired"
    # when the lease ran out first).
    job = Job.objects.get(pk=dying.pk)
    assert job.status_id == Status.FAILED and job.attempt_num == 1, (job.state, job.error)
    assert "the worker slot running it died (exit 0" in job.error or "lease expired" in job.error, job.error
    assert JobAttempt.objects.filter(job=job).count() == 1


def _pg_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL: a TCP connection to cut")


@pytest.mark.timeout(120)
def test_a_claim_whose_reply_is_lost_costs_no_attempt(worker_procs, job_log) -> None:
    """Finding 22.2: the claim commits, its reply never arrives; with max_attempts=1 the jobs used to end
    Failed ("lease expired with no attempts left") without ever running."""
    _pg_only()
    jobs = [Job.objects.enqueue("test.Echo", {"log": str(job_log.path), "n": i}, max_attempts=1) for i in range(5)]
    proxy = CuttingProxy(int(connection.settings_dict["PORT"]))
    proxy.arm()
    try:
        from tests.procutil import test_db_env

        url = test_db_env()["SQLQUEUE_DATABASE_URL"].replace(f":{connection.settings_dict['PORT']}/", f":{proxy.port}/")
        worker = worker_procs("--burst", "--concurrency", "1", "--worker-name", "cut",
                              env={"SQLQUEUE_DATABASE_URL": url})
        assert worker.wait(timeout=90) == 0, worker.output()
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the proxy never saw a claim to cut"
    assert "claim_reply_lost worker=cut/0" in worker.stderr(), worker.output()
    for job in jobs:
        job.refresh_from_db()
        assert job.status_id == Status.COMPLETED, (job.pk, job.status_id, job.error)
        assert job.attempt_num == 1
        assert [e for _a, e in job_log.events(job.pk)] == ["echo"]
    lost = JobAttempt.objects.filter(job__in=jobs, error__startswith="claim reply lost")
    assert lost.exists() and all(a.outcome_id == Status.PENDING and a.finished_at for a in lost)


@pytest.mark.timeout(300)  # a bound for a hang: the waits below add up to more under load
def test_a_slot_whose_heartbeat_cannot_connect_stops_claiming(worker_procs, tmp_path) -> None:
    """Finding 22.1: a role at its connection limit lets the job connection work while every heartbeat
    fails; the slot used to go on claiming, and others took its jobs as a dead worker's: double runs."""
    _pg_only()
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from tests.procutil import test_db_env

    with connection.cursor() as cursor:
        cursor.execute("DROP ROLE IF EXISTS starved")
        cursor.execute("CREATE ROLE starved LOGIN NOSUPERUSER")
        cursor.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO starved")
        cursor.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO starved")
    base = test_db_env()["SQLQUEUE_DATABASE_URL"]
    parts = urlsplit(base)
    starved_url = urlunsplit(parts._replace(netloc=f"starved@{parts.hostname}:{parts.port}"))
    admin = psycopg.connect(f"host={parts.hostname} port={parts.port} user=postgres dbname={parts.path[1:]}",
                            autocommit=True)
    try:
        a = worker_procs("--worker-name", "starved", "--concurrency", "1", env={**FAST, "SQLQUEUE_DATABASE_URL": starved_url})
        wu.wait_until(lambda: WorkerRow.objects.filter(name="starved/0", stopped_at=None).exists(), 90,
                      what="a to register")
        time.sleep(1.0)  # a has both its connections open: the slot's (claims) and the supervisor's (heartbeat)
        # No new connection for the role from now on; the ones open stay. Then cut the heartbeat's: the
        # supervisor's connection, the one whose last statement is not the slot's claim.
        admin.execute("ALTER ROLE starved CONNECTION LIMIT 0")
        wu.wait_until(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'starved' AND "
                                            "query LIKE %s", ["%SKIP LOCKED%"]).fetchone()[0] == 1,
                      what="the slot to claim")
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'starved' "
            "AND query NOT LIKE %s", ["%SKIP LOCKED%"]).fetchall()
        assert len(killed) == 1, f"not one heartbeat connection: {killed}"
        wu.wait_until(lambda: "heartbeat_failed worker=starved " in a.stderr(), what="a's heartbeat to fail")
        assert " WARNING " in next(line for line in a.stderr().splitlines() if "heartbeat_failed" in line)
        time.sleep(DEAD_AFTER + 0.5)  # a's row is stale: other workers now take a's jobs as a dead worker's
        path = tmp_path / "ticks.log"
        jobs = [Job.objects.enqueue("test.Ticker", {"ticks": str(path), "seconds": 0.5, "cooperative": False})
                for _ in range(6)]
        b = worker_procs("--worker-name", "healthy", "--concurrency", "1", env=FAST)
        wu.wait_until(lambda: all(j.status_id == Status.COMPLETED for j in Job.objects.filter(pk__in=[j.pk for j in jobs])),
                      timeout=60, what="the jobs to complete")
        assert not JobAttempt.objects.filter(job__in=jobs, worker__startswith="starved").exists(), \
            list(JobAttempt.objects.filter(job__in=jobs).values_list("job_id", "worker"))
        assert all(j.attempt_num == 1 for j in Job.objects.filter(pk__in=[j.pk for j in jobs]))
        assert "worker_not_claiming worker=starved/0 reason=heartbeat_stale" in a.stderr(), a.output()
        for proc in (a, b):
            proc.kill_group()
    finally:
        admin.execute("ALTER ROLE starved CONNECTION LIMIT -1")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'starved'")
        admin.close()


@pytest.mark.timeout(300)
def test_an_outcome_that_cannot_be_stored_fails_the_job_with_the_reason() -> None:
    """Finding 21.3, the worker's side: values are bounded where they enter (Retry, the type's backoff:
    tests/test_limits.py), and an outcome the queue still refuses (here a retry 10^12 s away, as a
    backoff row written before the bounds existed produced) is recorded as Failed with the reason,
    not a slot crash that re-runs the handler on every restart."""
    from django_sqlqueue.worker import runner
    from django_sqlqueue.worker.loop import Worker, WorkerConfig

    job = Job.objects.enqueue("test.AlwaysFail", {}, max_attempts=5)
    [claimed] = Job.objects.claim("unstorable/0", 1)
    worker = Worker(WorkerConfig(name="unstorable/0"))
    worker._record(runner.Outcome(runner.Kind.ERROR, claimed, error="boom", retry_in=1e12))
    job.refresh_from_db()
    assert job.status_id == Status.FAILED, (job.status_id, job.error)
    assert "could not be stored" in job.error and "run_in" in job.error


@pytest.mark.timeout(120)
def test_a_worker_whose_sqlite_file_is_deleted_stops_and_says_so(worker_procs, tmp_path) -> None:
    """Finding 21.12: a deleted SQLite file was written to without a word (its results lost)."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite: a database file to delete")
    import subprocess
    import sys

    from tests.procutil import test_db_env

    path = tmp_path / "doomed.sqlite3"
    env = {**test_db_env(), "SQLQUEUE_DATABASE_URL": f"sqlite:///{path}"}
    subprocess.run([sys.executable, str(wu.REPO / "manage.py"), "migrate", "-v0"], cwd=wu.REPO, env=env, check=True,
                   timeout=120)
    w = worker_procs("--worker-name", "doomed", "--concurrency", "1", env={**FAST, "SQLQUEUE_DATABASE_URL": f"sqlite:///{path}"})
    wu.wait_until(lambda: "worker_started" in w.stderr(), what="the worker to start")
    path.unlink()
    assert w.wait(timeout=60) == 1, w.output()
    assert "database_file_gone worker=doomed " in w.stderr() and str(path) in w.stderr(), w.output()
    assert "reason=fatal-error" in w.stderr()
