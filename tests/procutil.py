"""Run code in separate processes against the test database (no model imports at module level).

Child processes are started with the ``spawn`` method, so they set Django up from scratch; the
environment variable ``SQLQUEUE_DATABASE_URL`` tells them which database the test session uses.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any


def database_url(settings_dict: dict[str, Any]) -> str:
    """A URL testproject.settings understands, for the database described by ``settings_dict``."""
    engine = settings_dict["ENGINE"]
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    if engine.endswith("postgresql"):
        user = settings_dict.get("USER") or "postgres"
        return f"postgres://{user}@{settings_dict['HOST']}:{settings_dict['PORT']}/{settings_dict['NAME']}"
    if engine in ("mssql", "testproject.babelfish"):  # the engine itself comes from SQLQUEUE_MSSQL_ENGINE
        from urllib.parse import quote

        user, password = quote(settings_dict["USER"], safe=""), quote(settings_dict["PASSWORD"], safe="")
        return f"mssql://{user}:{password}@{settings_dict['HOST']}:{settings_dict['PORT']}/{settings_dict['NAME']}"
    raise ValueError(f"no URL form for {engine}")


def test_db_env() -> dict[str, str]:
    """os.environ plus the URL of the test database (call inside a test, after the DB exists)."""
    from django.db import connection

    env = dict(os.environ)
    env["SQLQUEUE_DATABASE_URL"] = database_url(connection.settings_dict)
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    return env


test_db_env.__test__ = False  # type: ignore[attr-defined]  # a helper: a module importing it is not a test of it


@contextmanager
def child_env():
    """Point spawned children at the test database for the duration of the block."""
    saved = dict(os.environ)
    os.environ.update(test_db_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def setup_django() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    django.setup()


def enqueue_with_key(barrier: Any, out: Any, key: str) -> None:
    """Child: wait for the others, then enqueue a Noop job with dedupe key ``key``."""
    setup_django()
    from django_sqlqueue.models import Job

    barrier.wait()
    out.put(Job.objects.enqueue("Noop", dedupe_key=key).pk)


def claim_until_empty(barrier: Any, out: Any, worker: str, batch: int) -> None:
    """Child: claim and complete jobs until none are left; report the ids claimed, or the traceback
    (a str) of what failed, at once (the others are released from the barrier, and report too)."""
    import traceback

    try:
        setup_django()
        from django_sqlqueue.models import Job

        barrier.wait()
        seen: list[int] = []
        while True:
            jobs = Job.objects.claim(worker, batch)
            if not jobs:
                break
            for job in jobs:
                job.complete()
                seen.append(job.pk)
    except BaseException:
        barrier.abort()
        out.put(f"{worker}: {traceback.format_exc()}")
        raise
    out.put(seen)


def board_waiter(board: Any, index: int, seconds: float, out: Any) -> None:
    """A stand-in slot idling on a WakeBoard (contract.py) in a process of its own; puts (index, woken)."""
    out.put((index, board.wait(index, seconds, lambda: False)))


def hold_board_lock(board: Any, ready: Any) -> None:
    """A stand-in slot that takes the WakeBoard's lock and stays inside (to be killed there)."""
    board.idle.get_lock().acquire()
    ready.set()
    time.sleep(300)


@contextmanager
def listening(channel: str) -> Any:
    """A raw psycopg connection (the test database's, autocommit) LISTENing on ``channel``."""
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    conn = psycopg.connect(**{k: v for k, v in params.items() if k not in ("cursor_factory", "context")},
                           autocommit=True)
    try:
        conn.execute(f'LISTEN "{channel}"')
        yield conn
    finally:
        conn.close()
