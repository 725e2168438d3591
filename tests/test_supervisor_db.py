"""The supervisor's database work: any database error is survived, no database wait delays a stop.

Real failures, in real worker processes: privileges revoked under a running worker (a non-connection
error in the supervisor's hand-back), and a "server" that accepts TCP connections and never answers
(the supervisor's reaper stuck connecting, as behind a saturated PgBouncer session pool).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import uuid

import pytest
from django.db import connection

from django_sqlqueue import jobtypes
from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.states import Status
from tests import workerutil as wu
from tests.procutil import database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
worker_procs = wu.worker_procs
job_log = wu.job_log


# ----- privileges revoked: a ProgrammingError in the supervisor's own database work ----------------------
@pytest.fixture
def limited_role(pg_cluster):
    """A login role with every privilege on the test database's tables (no superuser): revocable."""
    role = f"sqlqueue_limited_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
    yield role
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


def test_the_supervisor_survives_a_database_error_in_its_hand_back(worker_procs, job_log, limited_role) -> None:
    JobType.objects.update_or_create(name="test.Sleep", defaults={"lease_seconds": 60})
    jobtypes.clear_cache()
    jobs = [Job.objects.enqueue("test.Sleep", {"seconds": 1, "log": str(job_log.path)}) for _ in range(3)]
    url = database_url(dict(connection.settings_dict, USER=limited_role))
    w = worker_procs("--worker-name", "revoked", env={"SQLQUEUE_DATABASE_URL": url})
    _, _, _, slot_pid = job_log.wait_for(jobs[0].pk, "start")
    table = connection.ops.quote_name(Worker._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"REVOKE ALL ON {table} FROM {limited_role}")
    try:
        os.kill(slot_pid, signal.SIGKILL)  # the supervisor now reads the worker table: permission denied
    except ProcessLookupError:
        pass  # the slot died of the revoked privilege by itself: the same hand-back follows
    wu.wait_until(lambda: "slot_cleanup_skipped" in w.stderr(), 60, what=f"the hand-back to fail\n{w.output()}")
    line = next(line for line in w.stderr().splitlines() if "slot_cleanup_skipped" in line)
    assert " WARNING " in line and "worker=revoked/0" in line and "ProgrammingError" in line, line
    assert w.proc.poll() is None, w.output()  # the supervisor goes on (it restarts the slot, with backoff)
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT ALL ON {table} TO {limited_role}")
    wu.wait_until(lambda: Job.objects.filter(status_id=Status.COMPLETED).count() == 3, 120, interval=0.2,
                  what=f"every job to complete once the privilege is back\n{w.output()}")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    assert "supervisor_db_error" not in w.stderr(), w.output()
    assert not Job.objects.filter(status_id=Status.PROCESSING).exists()


def test_a_prepared_statement_error_gets_a_hint(pg_cluster) -> None:
    """SQLSTATE 42P05/26000 (psycopg's prepared statements behind a transaction pooler): the log says what to do."""
    from django.db import DatabaseError

    from django_sqlqueue.dialects import get_dialect

    dialect = get_dialect(connection)
    caught = []
    for sql in ("PREPARE sqlqueue_hint_test AS SELECT 1", "PREPARE sqlqueue_hint_test AS SELECT 1",
                "EXECUTE sqlqueue_no_such_statement"):
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
        except DatabaseError as exc:
            caught.append(exc)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert [exc.__cause__.sqlstate for exc in caught] == ["42P05", "26000"]
    for exc in caught:
        assert "prepare_threshold" in dialect.error_hint(exc) and "max_prepared_statements" in dialect.error_hint(exc)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1/0")
    except DatabaseError as exc:
        assert dialect.error_hint(exc) == ""


# ----- a server that accepts connections and never answers -------------------------------------------------
class Blackhole:
    """A TCP listener that accepts connections and never sends a byte (counts them)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/sqlqueue"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def blackhole():
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL client against a silent server: runs in the postgres stage")
    hole = Blackhole()
    yield hole
    hole.close()


def test_sigterm_acts_within_the_grace_period_while_the_database_never_answers(worker_procs, blackhole) -> None:
    w = worker_procs("--worker-name", "hole", "--concurrency", "2", "--grace-seconds", "2",
                     env={"SQLQUEUE_DATABASE_URL": blackhole.url})
    # Both slots stuck registering, and the supervisor's first reap (5 s after the start) connecting.
    wu.wait_until(lambda: blackhole.accepted >= 3, 60, what=f"slots and reaper to connect\n{w.output()}")
    w.signal(signal.SIGTERM)
    assert w.wait(60) == 0, w.output()
    err = w.stderr()
    assert err.count("slot_killed") == 2 and "reason=grace-expired" in err, err
    # The hand-backs could not reach the database: given up after CLEANUP_SECONDS, and said so.
    assert "supervisor_cleanup_unfinished worker=hole" in err, err
    assert "worker_stopping" in err
