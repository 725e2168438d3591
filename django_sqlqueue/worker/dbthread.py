"""The supervisor's database work, on a thread of its own, so that no database wait holds up its loop.

The supervisor's loop watches the slots, kills a slot whose job overruns its timeout and acts on
SIGTERM within the grace period. Its database work (reaping, handing back a dead slot's jobs,
recording a timeout, stamping stopped rows) would hold all of that up if it ran in that loop, for
as long as one database wait lasts (a connect to a server that accepts TCP but never answers, a
pooler's queue: PgBouncer's ``query_wait_timeout`` is 120 s, a lock wait), which can be longer than a
service manager waits between SIGTERM and SIGKILL.

Here each piece of work is a :class:`Call`, run in order on one thread with one connection (the
supervisor's only connection: its heartbeat for all slots, beats.py, and its LISTEN, wakeup.py, share
it); the loop submits calls and only looks at whether they have finished. Between calls the thread
runs its ``idle`` hook, if it has one (the LISTEN: it waits on the connection's socket and on a pipe
that :meth:`DatabaseThread.submit` writes to, so a call never waits for a notification). That
connection gets a connect timeout when the alias's OPTIONS set none, so a hung connect ends on its own. A call never raises into the loop: an exception is logged and the thread goes on.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("django_sqlqueue.supervisor")


class Call:
    """One piece of database work submitted to a :class:`DatabaseThread`."""

    def __init__(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.name = name
        self.fn = fn
        self.args = args
        self._done = threading.Event()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when the call has finished (whatever its outcome)."""
        return self._done.wait(max(0.0, timeout))

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except Exception:  # the functions log the database errors they expect; this is for the rest
            log.exception("supervisor_db_error call=%s", self.name)
        finally:
            self._done.set()


class DatabaseThread:
    """Runs :class:`Call` s one after another on a daemon thread with its own database connection."""

    def __init__(self, using: str, connect_timeout: float,
                 idle: Callable[[int], None] | None = None) -> None:
        self.using = using
        self.connect_timeout = connect_timeout
        self._queue: queue.Queue[Call | None] = queue.Queue()
        self._pending: list[Call] = []
        self._thread: threading.Thread | None = None
        #: Run on this thread while no call waits, given a file descriptor that becomes readable when
        #: one is submitted; it returns then (or whenever it likes: it is called again).
        self.idle = idle
        self._poke: tuple[int, int] | None = None
        #: Readable once a call has finished (:meth:`finished_fd`): the loop wakes for the next step.
        self._ended = os.pipe()
        for fd in self._ended:
            os.set_blocking(fd, False)
        if idle is not None:
            self._poke = os.pipe()
            os.set_blocking(self._poke[0], False)
            os.set_blocking(self._poke[1], False)

    def submit(self, name: str, fn: Callable[..., Any], *args: Any) -> Call:
        call = Call(name, fn, args)
        self.start()
        self._pending = [c for c in self._pending if not c.finished] + [call]
        self._queue.put(call)
        self._wake()
        return call

    def start(self) -> None:
        """Start the thread now (it connects at once when it has an ``idle`` hook: the LISTEN)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sqlqueue-supervisor-db", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        if self._poke is not None:
            try:
                os.write(self._poke[1], b"x")
            except (BlockingIOError, OSError):
                pass  # the pipe is full (the thread will read it) or closed (the thread is gone)

    def finished_fd(self) -> int:
        """A descriptor that is readable once a call has finished since the last :meth:`clear_finished`:
        the supervisor's loop waits on it beside its slots, so it acts on a call's outcome (a beat's answer
        to the slots, the end of a stop's work) at once rather than at its next tick."""
        return self._ended[0]

    def clear_finished(self) -> None:
        try:
            while os.read(self._ended[0], 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def pending(self) -> list[Call]:
        """Calls submitted and not finished yet (the one running first)."""
        self._pending = [c for c in self._pending if not c.finished]
        return list(self._pending)

    def close(self, timeout: float) -> list[Call]:
        """Let the submitted calls finish for up to ``timeout`` seconds; return those that did not.

        The thread is a daemon: a call still waiting on the database does not keep the process alive.
        """
        if self._thread is None:
            return []
        self._queue.put(None)
        self._wake()
        self._thread.join(max(0.0, timeout))
        return self.pending()

    # ----- the thread ------------------------------------------------------------------------------
    def _loop(self) -> None:
        from django.db import connections

        try:
            self._bound_connect()
            while True:
                call = self._next()
                if call is None:
                    return
                started = time.monotonic()
                call.run()
                log.debug("supervisor_db call=%s seconds=%.3f", call.name, time.monotonic() - started)
                try:
                    os.write(self._ended[1], b"x")
                except (BlockingIOError, OSError):
                    pass  # full: the loop has not read it yet, and will
        finally:
            connections.close_all()  # this thread's connections only
            for fd in self._ended:  # the loop that waited on it has ended (close() comes after it)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _next(self) -> Call | None:
        if self.idle is None or self._poke is None:
            return self._queue.get()
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            try:
                self.idle(self._poke[0])
            except Exception:  # the hook logs what it expects; never the thread's death
                log.exception("supervisor_idle_error")
                time.sleep(1.0)
            try:
                while os.read(self._poke[0], 4096):
                    pass
            except BlockingIOError:
                pass

    def _bound_connect(self) -> None:
        """Give this thread's connection a connect timeout when the alias's OPTIONS set none.

        A wrapper of its own for this thread (Django keeps one per thread), from a copy of the alias's
        settings: the slots and the rest of the process keep theirs as configured.
        """
        from django.db import connections

        from ..dialects import dialect_class

        base = connections[self.using]
        extra = dialect_class(base.vendor).connect_timeout_options(self.connect_timeout)
        options = base.settings_dict.get("OPTIONS") or {}
        missing = {key: value for key, value in extra.items() if key not in options}
        if missing:
            settings = {**base.settings_dict, "OPTIONS": {**options, **missing}}
            connections[self.using] = type(base)(settings, self.using)


@contextmanager
def bounded_connect(using: str, seconds: float) -> Iterator[None]:
    """In this thread, ``using``'s connection gets a connect timeout of ``seconds`` (when its OPTIONS set
    none) for the duration of the block, then is closed and the alias's own wrapper put back.

    For the start-up checks of ``run_queue_worker``: a database that accepts connections and never
    answers must not hold a worker's start (and its SIGTERM) forever.
    """
    from django.db import connections

    from ..dialects import dialect_class

    base = connections[using]
    extra = dialect_class(base.vendor).connect_timeout_options(seconds)
    options = base.settings_dict.get("OPTIONS") or {}
    missing = {key: value for key, value in extra.items() if key not in options}
    if not missing:
        yield
        return
    bounded = type(base)({**base.settings_dict, "OPTIONS": {**options, **missing}}, using)
    connections[using] = bounded
    try:
        yield
    finally:
        try:
            bounded.close()
        finally:
            connections[using] = base
