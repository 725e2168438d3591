"""Wake-ups for idle workers: PostgreSQL LISTEN/NOTIFY, SQLite ``PRAGMA data_version``.

Enqueue runs ``pg_notify(SQLQUEUE['NOTIFY_CHANNEL'], '<queue>,<queue>')`` in its transaction, so the
notification is delivered when the jobs commit. An idle slot LISTENs on a dedicated connection (not
Django's: a listening connection must stay in autocommit and outside any transaction) and wakes as
soon as a notification names one of its queues, instead of sleeping out its poll interval. Polling
stays as the fallback: a lost notification costs at most ``POLL_MAX_SECONDS``.

SQLite has no notifications, but every connection can ask, for nothing (no disk read, no lock), whether
another connection committed since it last asked: ``PRAGMA data_version``. An idle slot asks every
``SqliteWatcher.interval`` seconds and claims as soon as something changed, instead of sleeping out a
poll interval that grows to ``POLL_MAX_SECONDS``. SQL Server workers poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("django_sqlqueue.worker")


class Waker(Protocol):
    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool: ...

    def close(self) -> None: ...


def for_alias(using: str, channel: str, queues: Sequence[str] = ()) -> Waker | None:
    """The wake-up source for Django database ``using``: LISTEN on PostgreSQL, data_version on SQLite."""
    return PgListener.for_alias(using, channel, queues) or SqliteWatcher.for_alias(using)


class PgListener:
    """LISTEN on one channel with a psycopg 3 connection of its own; reconnects lazily after errors."""

    def __init__(self, connection_params: dict[str, Any], channel: str, queues: Sequence[str] = ()) -> None:
        self.params = connection_params
        self.channel = channel
        self.queues = set(queues)
        self._conn: Any = None
        self._broken_until = 0.0

    @classmethod
    def for_alias(cls, using: str, channel: str, queues: Sequence[str] = ()) -> PgListener | None:
        """A listener for Django database ``using``, or None when it is not PostgreSQL with psycopg 3."""
        from django.db import connections

        wrapper = connections[using]
        if wrapper.vendor != "postgresql" or not channel:
            return None
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return None
        params = dict(wrapper.get_connection_params())
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        return cls(params, channel, queues)

    def _connect(self) -> Any:
        import psycopg
        from psycopg import sql

        conn = psycopg.connect(**self.params, autocommit=True)
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        return conn

    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool:
        """Wait up to ``seconds``; True as soon as a notification for our queues arrives.

        Returns early (False) when ``stop()`` becomes true. On a connection error it logs once, waits
        without listening, and tries to listen again on a later call (after 30 s).
        """
        end = time.monotonic() + seconds
        if self._conn is None and time.monotonic() >= self._broken_until:
            try:
                self._conn = self._connect()
            except Exception as exc:
                self._give_up(exc)
        while not stop():
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self._conn is None:
                time.sleep(min(left, 0.05))
                continue
            try:
                for note in self._conn.notifies(timeout=min(left, 0.25), stop_after=1):
                    if not self.queues or self.queues & set(note.payload.split(",")):
                        return True
            except Exception as exc:
                self._give_up(exc)
        return False

    def _give_up(self, exc: BaseException) -> None:
        log.info("listen_unavailable channel=%s error=%s (polling instead)", self.channel,
                 " ".join(str(exc).split())[:200])
        self.close()
        self._broken_until = time.monotonic() + 30.0

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


class SqliteWatcher:
    """Wake when another connection commits to the SQLite database (``PRAGMA data_version``).

    Uses the slot's own Django connection (the main thread's): the slot's own commits do not change
    what it reads, so only enqueues, other slots and heartbeats wake it. Any commit wakes it (SQLite
    cannot say which queue changed); a wake-up for nothing costs one claim that finds nothing.
    """

    #: Seconds between two looks while idle (a look costs a few microseconds, no I/O).
    interval = 0.01

    def __init__(self, using: str) -> None:
        self.using = using
        self._seen: int | None = None

    @classmethod
    def for_alias(cls, using: str) -> SqliteWatcher | None:
        from django.db import connections

        return cls(using) if connections[using].vendor == "sqlite" else None

    def _version(self) -> int | None:
        from django.db import connections

        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute("PRAGMA data_version")
                return int(cursor.fetchone()[0])
        except Exception:  # the database is away: sleep it out, the claim reports the trouble
            return None

    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool:
        """Wait up to ``seconds``; True as soon as another connection has committed.

        Compared with what the previous wait saw last, so a commit that landed while the slot was
        claiming (between two waits) wakes it at once instead of being missed.
        """
        end = time.monotonic() + seconds
        seen = self._seen if self._seen is not None else self._version()
        try:
            while not stop():
                now = self._version()
                if seen is None:
                    seen = now
                elif now is not None and now != seen:
                    seen = now
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                time.sleep(min(left, self.interval))
            return False
        finally:
            self._seen = seen

    def close(self) -> None:
        self._seen = None
