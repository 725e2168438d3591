"""Issue 29.1: a by-id write that loses a deadlock is run again, not failed.

On SQL Server the claim (U lock on an index entry, then the clustered row) and a by-id write (the row,
then its index entries) lock in opposite orders; the claim runs at low deadlock priority, and every write
path that can meet it retries a deadlock victim in its own transaction (``dialects.retrying``). The
deadlock itself cannot be made on Babelfish (it drops table hints) and no SQL Server runs here, so it is
made on PostgreSQL, which reports a deadlock victim as 40P01, a transient error its dialect retries too:
a real deadlock between ``modify`` (the job row, then the history row) and another session (the history
row, then the job row). PostgreSQL aborts the session whose ``deadlock_timeout`` runs out first and finds
the cycle. On a busy machine the one that waited first is not sure to check first, so the other session
raises its own ``deadlock_timeout`` to a minute: only ``modify`` looks for the cycle, and it is the victim.
PostgreSQL looks once per lock wait, when the timeout runs out, so ``modify``'s is 3 s: by then the other
session's second UPDATE has closed the cycle, however slow the machine.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now

from django_sqlqueue import Status, enqueue
from django_sqlqueue.dialects import get_dialect
from django_sqlqueue.models import Job, JobAttempt, JobType

pytestmark = pytest.mark.django_db(transaction=True)


def blocked_sessions() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return cursor.fetchone()[0]


def test_a_modify_that_loses_a_deadlock_is_run_again(noop_type: JobType, monkeypatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks between two sessions: PostgreSQL here (SQLite serialises writers; Babelfish "
                    "drops table hints; SQL Server: tests/test_mssql_live.py)")
    enqueue("Noop", {})
    [job] = Job.objects.claim("w", 1)
    attempt = JobAttempt.objects.get(job=job)

    sent: list[str] = []
    dialect = get_dialect(connection)
    real = dialect.execute

    def counting(cursor, sql, params):  # how often modify's UPDATE of the job is sent
        if sql.startswith(f"UPDATE {dialect.n.job} SET"):
            sent.append(sql)
        return real(cursor, sql, params)

    monkeypatch.setattr(dialect, "execute", counting)
    locked, errors = threading.Event(), []

    def other_session() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:  # only modify's session checks for the deadlock
                    cursor.execute("SET LOCAL deadlock_timeout = '60s'")
                JobAttempt.objects.filter(pk=attempt.pk).update(worker="other")  # the history row first
                locked.set()
                deadline = time.monotonic() + 60
                while not blocked_sessions() and time.monotonic() < deadline:  # modify waits for it now
                    time.sleep(0.01)
                Job.objects.filter(pk=job.pk).update(updated_at=Now())  # then the job row: a deadlock
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_session)
    thread.start()
    assert locked.wait(30)
    with connection.cursor() as cursor:  # PostgreSQL looks for a deadlock once per wait: after the cycle
        cursor.execute("SET deadlock_timeout = '3s'")
    try:
        done = Job.objects.complete(job, {"ok": True})  # the job row, then the history row
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET deadlock_timeout")
    thread.join(60)
    assert errors == []  # the other session won
    assert len(sent) == 2, "modify lost the deadlock once and was run again"
    assert done.state == Status.COMPLETED and done.version == job.version + 1
    attempt.refresh_from_db()
    assert attempt.outcome_id == Status.COMPLETED and attempt.worker == "other"
