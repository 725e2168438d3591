"""Wake-ups for idle workers: PostgreSQL LISTEN/NOTIFY, SQLite ``PRAGMA data_version``.

Enqueue sends ``pg_notify(SQLQUEUE['NOTIFY_CHANNEL'], '<queue>,<queue>')`` after the jobs commit, in a
transaction of its own (once per enqueuing transaction; docs/claim-sql.md says why), so a woken worker
always sees the jobs. An idle slot LISTENs on a dedicated connection (not
Django's: a listening connection must stay in autocommit and outside any transaction) and wakes as
soon as a notification names one of its queues, instead of sleeping out its poll interval. Polling
stays as the fallback: a lost notification costs at most ``POLL_MAX_SECONDS``.

A LISTEN only works on a connection that stays one server session: through PgBouncer in transaction
(or statement) mode it lands on whichever pooled server connection ran it and notifications go to
whichever client holds that server connection next (a web process's psycopg keeps them in a backlog
that never shrinks), never to the listener. So a listener proves itself when it connects: it LISTENs
on a channel of its own, sends a notification to it through the queue's connection (the path an
enqueue's notification takes), and only LISTENs on the real channel when that arrives within
``CHECK_SECONDS``. Otherwise it logs a WARNING and the worker polls. A check channel is used once, so
a LISTEN left behind on a pooled server connection by a failed check is never notified again.
``SQLQUEUE["LISTEN_DATABASE"]`` names the database alias to LISTEN through (a direct connection or a
session pool) when the queue's own alias goes through a transaction pooler.

Under a supervisor (``run_queue_worker``) the worker LISTENs ONCE, not once per slot: on the
supervisor's own connection (:class:`SharedListener`, run by its database thread between calls), or on
one connection to ``LISTEN_DATABASE`` when that is set (:class:`ListenerThread`). Each notification for
the worker's queues wakes exactly one idle slot (:class:`~django_sqlqueue.worker.contract.WakeBoard`);
a slot that claimed a full batch wakes the next idle one, so a burst of jobs spreads over the slots.
Because it is the connection that also sends, the check of the shared LISTEN also asks that its test
notification came from the very server session it listens on (its backend pid): through a pooler the
client's session is not one server session, the check fails and the worker polls, as above.

SQLite has no notifications, but every connection can ask, for nothing (no disk read, no lock), whether
another connection committed since it last asked: ``PRAGMA data_version``. An idle slot asks every
``SqliteWatcher.interval`` seconds and claims as soon as something changed, instead of sleeping out a
poll interval that grows to ``POLL_MAX_SECONDS``. SQL Server workers poll.
"""

from __future__ import annotations

import logging
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..dialects import hello_host, look_interval, look_stamp, look_wakes, wakes

log = logging.getLogger("django_sqlqueue.worker")
#: This host's name as worker rows carry it (heartbeat.register): a hello naming it is for this worker.
HOST = socket.gethostname()[:200]

#: Seconds a listener waits for its own test notification before it decides LISTEN does not work
#: here. A working connection gets it in milliseconds; only a broken setup waits this long (once).
CHECK_SECONDS = 3.0
#: Seconds a listener's connection attempt may take (when the alias's OPTIONS set no connect_timeout).
CONNECT_TIMEOUT = 10


class Waker(Protocol):
    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool: ...

    def close(self) -> None: ...


class ListenCheckFailed(Exception):
    """The listener's own test notification did not arrive: LISTEN does not work through this connection."""


def for_alias(using: str, channel: str, queues: Sequence[str] = (), *,
              listen_using: str | None = None) -> Waker | None:
    """The wake-up source for Django database ``using``: LISTEN on PostgreSQL, data_version on SQLite."""
    return (PgListener.for_alias(using, channel, queues, listen_using=listen_using)
            or SqliteWatcher.for_alias(using))


def for_worker(using: str, queues: Sequence[str], stop: Callable[[], bool], worker: str = "") -> tuple[Waker | None, str]:
    """The wake-up source a worker slot uses, checked, and its name for the ``worker_started`` line.

    ``listen`` (LISTEN/NOTIFY, its test notification arrived), ``data_version`` (SQLite) or ``poll``:
    no wake-ups (SQL Server, ``NOTIFY_CHANNEL = ""``, or LISTEN failed its check: logged as a WARNING).
    A listener that could not connect at all stays in place and retries (and checks) later.
    """
    from ..conf import get_settings

    settings = get_settings()
    waker = for_alias(using, settings.NOTIFY_CHANNEL, queues, listen_using=settings.LISTEN_DATABASE or None)
    if isinstance(waker, PgListener):
        waker.worker = worker
        try:
            waker.start(stop)
        except ListenCheckFailed:
            return None, "poll"
        return waker, "listen" if waker.listening else "poll"
    if waker is not None:
        return waker, "data_version"
    return None, "poll"


class PgListener:
    """LISTEN on one channel with a psycopg 3 connection of its own; reconnects lazily after errors.

    ``params`` are the psycopg connection parameters of the alias LISTEN goes through; ``notify_using``
    is the Django alias the test notification is sent through (the queue's, as enqueues send theirs).
    """

    def __init__(self, connection_params: dict[str, Any], channel: str, queues: Sequence[str] = (), *,
                 notify_using: str | None = None, listen_using: str = "") -> None:
        self.params = connection_params
        self.channel = channel
        self.queues = set(queues)
        self.notify_using = notify_using
        self.listen_using = listen_using
        self.worker = ""
        #: A check failed: this connection path never delivers, so the listener only sleeps from now on.
        self.disabled = False
        self._conn: Any = None
        self._broken_until = 0.0
        #: When the fleet's look last arrived here (time.monotonic(); 0: never), and its sender's interval.
        self.looked_at = 0.0
        self.look_every = 0.0
        #: Idle slots the last look asks this worker to wake (a look may name several jobs).
        self.look_named = 0
        #: The worker's slots (set by the supervisor's ListenerThread; 1 for a slot's own listener).
        self.slots = 1
        #: How many times :meth:`wait` connected and LISTENed again after a drop.
        self.relistened = 0
        self.hellos = 0  # hellos heard from workers of this host (ListenerThread passes them on)

    @property
    def listening(self) -> bool:
        return self._conn is not None

    @classmethod
    def for_alias(cls, using: str, channel: str, queues: Sequence[str] = (), *,
                  listen_using: str | None = None) -> PgListener | None:
        """A listener for Django database ``using``, or None when it is not PostgreSQL with psycopg 3.

        It LISTENs through ``listen_using`` (default: ``using`` itself), which must be PostgreSQL.
        """
        from django.core.exceptions import ImproperlyConfigured
        from django.db import connections

        from ..dialects import capabilities

        wrapper = connections[using]
        if not capabilities(wrapper.vendor).can_listen or not channel:
            return None
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return None
        listen_alias = listen_using or using
        if listen_alias not in connections.settings:
            raise ImproperlyConfigured(f"SQLQUEUE['LISTEN_DATABASE'] names {listen_alias!r}, which is not in DATABASES")
        listen_wrapper = connections[listen_alias]
        if not capabilities(listen_wrapper.vendor).can_listen:
            raise ImproperlyConfigured(f"SQLQUEUE['LISTEN_DATABASE'] names {listen_alias!r}, a "
                                       f"{listen_wrapper.vendor} database: LISTEN needs PostgreSQL")
        params = dict(listen_wrapper.get_connection_params())
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        params.setdefault("connect_timeout", CONNECT_TIMEOUT)
        return cls(params, channel, queues, notify_using=using, listen_using=listen_alias)

    def start(self, stop: Callable[[], bool]) -> None:
        """Connect, check and LISTEN now (a worker's start), instead of at the first wait.

        Raises :class:`ListenCheckFailed` (after logging a WARNING) when the test notification does
        not arrive; a connection error is logged and retried at a later wait.
        """
        try:
            self._conn = self._connect(stop)
        except ListenCheckFailed:
            raise
        except Exception as exc:
            self._give_up(exc)

    def _connect(self, stop: Callable[[], bool] = lambda: False) -> Any:
        import psycopg
        from psycopg import sql

        conn = psycopg.connect(**self.params, autocommit=True)
        try:
            if self.notify_using is not None:
                self._check(conn, stop)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _check(self, conn: Any, stop: Callable[[], bool]) -> None:
        """Prove that a notification sent through the queue's connection reaches ``conn``."""
        from psycopg import sql

        check = f"sqlqueue_check_{secrets.token_hex(8)}"  # used once: see the module docstring
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(check)))
        self._send_check(check)
        started = time.monotonic()
        end = started + CHECK_SECONDS
        arrived = False
        while not arrived and not stop() and time.monotonic() < end:
            # (notifies() holds the connection until the loop ends: nothing else may run on it inside)
            for note in conn.notifies(timeout=max(0.0, min(end - time.monotonic(), 0.25)), stop_after=1):
                arrived = arrived or note.channel == check
        if arrived:
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(check)))
            log.debug("listen_checked worker=%s listen_database=%s ms=%.1f", self.worker, self.listen_using,
                      (time.monotonic() - started) * 1000)
            return
        if stop():  # stopping already: no verdict, no warning
            raise ListenCheckFailed("stopping")
        try:
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(check)))
        except Exception:
            pass
        self.disabled = True
        log.warning(
            "listen_check_failed worker=%s listen_database=%s channel=%s seconds=%s (a test notification sent "
            "through database %r did not arrive on the LISTEN connection: polling instead, so pickup takes up "
            "to POLL_MAX_SECONDS. Behind PgBouncer in transaction mode, LISTEN never receives: set "
            "SQLQUEUE['LISTEN_DATABASE'] to an alias with a direct connection or a session pool, see "
            "docs/pgbouncer.md)", self.worker, self.listen_using, self.channel, CHECK_SECONDS,
            self.notify_using)
        raise ListenCheckFailed(check)

    def _send_check(self, check: str) -> None:
        from django.db import connections

        from ..dialects import get_dialect

        assert self.notify_using is not None
        connection = connections[self.notify_using]
        with connection.cursor() as cursor:  # delivered at commit: autocommit, or the caller's commit
            cursor.execute(get_dialect(connection).notify_sql(), [check, "check"])

    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool:
        """Wait up to ``seconds``; True as soon as a notification for our queues arrives.

        Returns early (False) when ``stop()`` becomes true. On a connection error it logs once, waits
        without listening, and tries to listen again on a later call (after 30 s). After a failed
        check it only waits.
        """
        end = time.monotonic() + seconds
        if self._conn is None and not self.disabled and time.monotonic() >= self._broken_until:
            try:
                self._conn = self._connect(stop)
                self.relistened += 1
            except ListenCheckFailed:
                pass
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
                    if hello_host(note.payload) == HOST:
                        self.hellos += 1
                    interval = look_interval(note.payload)
                    if interval is not None:
                        self.looked_at, self.look_every = time.monotonic(), interval
                        self.look_named = look_wakes(note.payload, self.queues, self.slots)
                    if wakes(note.payload, self.queues):
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

        from ..dialects import capabilities

        return cls(using) if capabilities(connections[using].vendor).watches_data_version else None

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


class BoardWaker:
    """A slot's wait under a supervisor that LISTENs for it: woken through the worker's WakeBoard."""

    def __init__(self, board: Any, index: int, *, alone: bool = False) -> None:
        self.board = board
        self.index = index
        self.alone = alone  # poll on its own interval even when another slot is the poller

    def wait(self, seconds: float, stop: Callable[[], bool]) -> bool:
        return bool(self.board.wait(self.index, seconds, stop, alone=self.alone))

    def close(self) -> None:
        pass


class SharedListener:
    """LISTEN on the supervisor's own connection; each notification wakes one idle slot.

    Its :meth:`idle` is the database thread's idle hook (dbthread.py): between the supervisor's calls it
    waits on the connection's socket and on the thread's wake-up pipe. It (re)LISTENs whenever the
    thread's connection is new (the first time, and after a reconnect), after a check (module docstring).
    """

    def __init__(self, using: str, channel: str, queues: Sequence[str], board: Any, worker: str) -> None:
        self.using = using
        self.channel = channel
        self.queues = set(queues)
        self.board = board
        self.worker = worker
        self.disabled = False
        self._listening: Any = None  # the psycopg connection the LISTEN is on
        self._retry_at = 0.0
        #: The last look heard with a stamp on this connection: (its stamp on the database's clock,
        #: monotonic time it was heard). Read by the supervisor's beats (session liveness).
        self.stamp: tuple[float, float] | None = None
        #: Called when a worker of this host says hello, and after each LISTEN (hellos may have gone
        #: unheard): the supervisor's sweep reads its host's rows again (heartbeat.HostSweep).
        self.on_hello: Callable[[], None] = lambda: None

    @property
    def listening(self) -> bool:
        return self._listening is not None and not self.disabled

    @property
    def connection(self) -> Any:
        """The psycopg connection the LISTEN is on (None: not listening)."""
        return None if self.disabled else self._listening

    def idle(self, poke: int) -> None:
        conn = self._connection()
        if conn is None:
            select.select([poke], [], [], 1.0)
            return
        try:
            notes = list(conn.notifies(timeout=0))  # those that came in during the calls, first
            if not notes:
                ready = select.select([conn.fileno(), poke], [], [], 5.0)[0]
                if conn.fileno() in ready:
                    notes = list(conn.notifies(timeout=0))
        except Exception as exc:  # the connection broke: the next call or idle turn reconnects
            self._lost(exc)
            return
        for note in notes:
            if note.channel != self.channel:
                continue
            if hello_host(note.payload) is not None:
                if hello_host(note.payload) == HOST:
                    self.on_hello()
                continue
            interval = look_interval(note.payload)
            if interval is not None:
                stamp = look_stamp(note.payload)
                if stamp is not None:
                    self.stamp = (stamp, time.monotonic())
                self.board.looked(interval)
                self.board.wake_some(look_wakes(note.payload, self.queues, self.board.slots))
            elif wakes(note.payload, self.queues):
                self.board.wake_one()

    def _connection(self) -> Any:
        from django.db import connections

        if self.disabled or time.monotonic() < self._retry_at:
            return None
        wrapper = connections[self.using]
        try:
            wrapper.ensure_connection()
        except Exception as exc:
            self._lost(exc)
            return None
        conn = wrapper.connection
        if conn is not self._listening:
            try:
                self._listen(conn)
            except Exception as exc:
                self._lost(exc)
                return None
        return None if self.disabled else conn

    def _listen(self, conn: Any) -> None:
        from psycopg import sql

        if not conn.autocommit:
            raise RuntimeError("the supervisor's connection is not in autocommit: LISTEN needs it")
        check = f"sqlqueue_check_{secrets.token_hex(8)}"  # used once: see the module docstring
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(check)))
        conn.execute("SELECT pg_notify(%s, %s)", [check, "check"])
        started = time.monotonic()
        arrived = False
        for note in conn.notifies(timeout=CHECK_SECONDS, stop_after=1):
            arrived = arrived or (note.channel == check and note.pid == conn.pgconn.backend_pid)
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(check)))
        if not arrived:
            self.disabled = True
            log.warning(
                "listen_check_failed worker=%s listen_database=%s channel=%s seconds=%s (the test notification "
                "did not come back from the server session this connection listens on: polling instead, so "
                "pickup takes up to POLL_MAX_SECONDS. Behind PgBouncer, LISTEN never receives: set "
                "SQLQUEUE['LISTEN_DATABASE'] to an alias with a direct connection or a session pool, see "
                "docs/pgbouncer.md)", self.worker, self.using, self.channel, CHECK_SECONDS)
            return
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self._listening = conn
        self.board.listening.value = 1
        log.debug("listen_checked worker=%s ms=%.1f", self.worker, (time.monotonic() - started) * 1000)
        # Jobs enqueued while no LISTEN was in place (and looks missed: a short drop may not have lasted
        # long enough for the poller to see it) would wait for a poll or a backstop: every idle slot
        # looks once now, and one wake-up is kept for the next slot to idle.
        self.board.wake_idle()
        self.board.wake_one()
        self.on_hello()

    def _lost(self, exc: BaseException) -> None:
        from .support import close_connection

        log.info("listen_unavailable worker=%s error=%s (polling until it is back)", self.worker,
                 " ".join(str(exc).split())[:200])
        self._listening = None
        self.stamp = None
        self.board.listening.value = 0
        self._retry_at = time.monotonic() + 5.0
        close_connection(self.using)


class ListenerThread:
    """The supervisor's LISTEN on ``LISTEN_DATABASE`` (its own connection, one per worker): a thread that
    wakes one idle slot per notification."""

    def __init__(self, listener: PgListener, board: Any) -> None:
        self.listener = listener
        self.board = board
        listener.slots = board.slots
        #: As SharedListener.on_hello.
        self.on_hello: Callable[[], None] = lambda: None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlqueue-listen", daemon=True)

    def start(self) -> bool:
        """Connect and check now; True when it listens."""
        try:
            self.listener.start(self._stop.is_set)
        except ListenCheckFailed:
            return False
        finally:
            self._close_check_connection()
        self._thread.start()
        return self.listener.listening

    def _run(self) -> None:
        seen = 0.0
        relistened, hellos = self.listener.relistened, self.listener.hellos
        while not self._stop.is_set():
            # A second at most: a look that arrived is told to the board while it is fresh.
            self.listener.look_named = 0
            woken = self.listener.wait(1.0, self._stop.is_set)
            if self.listener.relistened != relistened:
                # LISTEN again after a drop: what was sent meanwhile was not heard (SharedListener._listen)
                relistened = self.listener.relistened
                self.board.wake_idle()
                self.board.wake_one()
                self.on_hello()
            if self.listener.hellos != hellos:
                hellos = self.listener.hellos
                self.on_hello()
            if self.listener.looked_at > seen:
                seen = self.listener.looked_at
                self.board.looked(self.listener.look_every)
            if self.listener.look_named:
                self.board.wake_some(self.listener.look_named)
            elif woken:
                self.board.wake_one()
            self._close_check_connection()

    def _close_check_connection(self) -> None:
        """The check's notification goes through the queue's alias, on this thread's Django connection:
        closed again, so the worker keeps no connection for it."""
        from django.db import connections

        alias = self.listener.notify_using
        if alias is not None and connections[alias].connection is not None:
            connections[alias].close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self.listener.close()
