"""Push wake-ups for idle workers: PostgreSQL LISTEN/NOTIFY.

Enqueue runs ``pg_notify(SQLQUEUE['NOTIFY_CHANNEL'], '<queue>,<queue>')`` in its transaction, so the
notification is delivered when the jobs commit. An idle slot LISTENs on a dedicated connection (not
Django's: a listening connection must stay in autocommit and outside any transaction) and wakes as
soon as a notification names one of its queues, instead of sleeping out its poll interval. Polling
stays as the fallback: a lost notification costs at most ``POLL_MAX_SECONDS``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("django_sqlqueue.worker")


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
