"""Helpers for worker tests: start ``manage.py run_queue_worker`` against the test database, wait, kill.

Every process started here is killed (with its whole process group) when the ``worker_procs``
fixture's test ends, whatever happened. Output goes to files, not pipes, so a chatty worker can never
block on a full pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django_sqlqueue.worker.support import pid_alive  # noqa: F401  (tests call wu.pid_alive)
from tests.procutil import test_db_env

REPO = Path(__file__).resolve().parent.parent


#: The least time any wait of a test gives before it fails. A wait's timeout bounds a failure, never a
#: speed: on a 2-core machine at load 8-16 (other work beside the suite, a CPU hog in the proof run) a
#: worker process takes seconds just to start, so a wait of 10 s for "the slot was replaced" fails
#: for no fault of the code. A wait that passes returns as soon as its condition holds: the floor
#: costs nothing then.
WAIT_FLOOR_SECONDS = 60.0
if os.environ.get("SQLQUEUE_TEST_DB") == "tds":
    # Over TDS each new server session compiles every statement it sends the first time (Babelfish: a
    # claim 5-7 s on a quiet machine), and a worker is several new sessions: a bound that holds for a
    # hang on SQLite and PostgreSQL was met by mere start-up there, at CI's load (five tests in one run).
    WAIT_FLOOR_SECONDS = 150.0


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05,
               what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds
    (at least :data:`WAIT_FLOOR_SECONDS`). A wait longer than the caller's ``timeout`` prints how long
    it took (``pytest -s`` / the captured output of a failure), so that slowness shows as a figure."""
    started = time.monotonic()
    deadline = started + max(timeout, WAIT_FLOOR_SECONDS)
    while True:
        value = predicate()
        if value:
            took = time.monotonic() - started
            if took > timeout:
                print(f"slow wait: {took:.1f} s for {what} (the test expected about {timeout} s)")
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {max(timeout, WAIT_FLOOR_SECONDS)}s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    """One ``run_queue_worker`` process (the supervisor) in its own process group."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> None:
        self.args = ["--no-progress", *args]
        self._out = tempfile.NamedTemporaryFile("w+", prefix="worker-out-", suffix=".log", delete=False)
        self._err = tempfile.NamedTemporaryFile("w+", prefix="worker-err-", suffix=".log", delete=False)
        full_env = test_db_env()
        full_env.setdefault("SQLQUEUE_LOG_LEVEL", "INFO")
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, str(REPO / "manage.py"), "run_queue_worker", *self.args],
            cwd=REPO, env=full_env, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = 60.0) -> int:
        timeout = max(timeout, WAIT_FLOOR_SECONDS)  # stopping takes a while on a loaded machine too
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group()
            raise AssertionError(f"worker did not exit within {timeout}s\n{self.output()}") from None

    def signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            # Not before the supervisor handles it: on a loaded machine a worker may still be starting
            # (Django's setup) when the test is done with it, and an early SIGTERM would kill it outright
            # (exit -15) instead of asking it to stop.
            wait_until(lambda: self.proc.poll() is not None or self.catches(signal.SIGTERM), 60,
                       what="the worker to install its signal handlers")
        self.proc.send_signal(signum)

    def catches(self, signum: int) -> bool:
        """Whether the process has a handler for ``signum`` (Linux: /proc/PID/status SigCgt)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return True  # no /proc: cannot tell, do not wait
        mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), None)
        return True if mask is None else bool(mask >> (signum - 1) & 1)

    def kill_group(self) -> None:
        """SIGKILL the supervisor and every slot (they share its process group)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # orphaned slots, if any
            except (ProcessLookupError, PermissionError):
                pass

    def stdout(self) -> str:
        return Path(self._out.name).read_text()

    def stderr(self) -> str:
        return Path(self._err.name).read_text()

    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def cleanup(self) -> None:
        self.kill_group()
        for f in (self._out, self._err):
            f.close()
            try:
                os.unlink(f.name)
            except OSError:
                pass


class JobLog:
    """The file test handlers append to (``"log"`` in the payload): ``job attempt event pid`` lines."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "jobs.log"
        self.path.touch()

    def lines(self) -> list[tuple[int, int, str, int]]:
        out = []
        for line in self.path.read_text().splitlines():
            job, attempt, event, pid = line.split()
            out.append((int(job), int(attempt), event, int(pid)))
        return out

    def events(self, job_id: int) -> list[tuple[int, str]]:
        return [(attempt, event) for job, attempt, event, _ in self.lines() if job == job_id]

    def wait_for(self, job_id: int, event: str, timeout: float = 30.0) -> tuple[int, int, str, int]:
        return wait_until(lambda: next((entry for entry in self.lines() if entry[0] == job_id and entry[2] == event),
                                       None), timeout, what=f"job {job_id} to log {event!r}")


# ----- fixtures (import them into a test module to use them) --------------------------------------------
import pytest  # noqa: E402


@pytest.fixture
def worker_procs():
    """``start(*args, env=None, prefix=())`` starts a worker process (``prefix``: a command it runs under,
    e.g. ``unshare``); all of them are killed when the test ends."""
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> WorkerProcess:
        proc = WorkerProcess(*args, env=env, prefix=prefix)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.cleanup()


@pytest.fixture
def job_log(tmp_path: Path) -> JobLog:
    return JobLog(tmp_path)


def run_worker(name: str = "inproc", **config: Any) -> Any:
    """Run a Worker in this process (no supervisor: no timeouts) until it stops; return its counters."""
    from django_sqlqueue.worker.loop import Worker, WorkerConfig

    config.setdefault("burst", True)
    worker = Worker(WorkerConfig(name=name, **config))
    assert worker.run() == 0
    return worker.counters
