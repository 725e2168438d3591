"""Bad input, each refused clearly or survived: enqueue, handlers, the API, the worker's command line, the database.

What tests/test_enqueue.py, test_modify.py, test_worker_run.py and test_worker_cli.py already cover
(unknown type at enqueue, object()/NaN payloads, the size limit on one enqueue, an illegal transition per
pair, a stale token, a non-JSON return value, the basic CLI ranges) is not repeated here.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_sqlqueue import jobtypes
from django_sqlqueue.exceptions import (
    InvalidArgument,
    InvalidPayload,
    JobNotFound,
    UnknownJobType,
)
from django_sqlqueue.handlers import registry
from django_sqlqueue.models import Job, JobType
from django_sqlqueue.queue import MAX_ERROR_CHARS, JobSpec
from django_sqlqueue.states import Status
from django_sqlqueue.worker.runner import Retry
from tests import workerutil as wu
from tests.workerutil import REPO

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def odd_handlers():
    """Register handlers for this test only (the in-process worker reads the same registry)."""
    names: list[str] = []

    def add(name: str, func, **options) -> str:
        registry.register(name, func, **options)
        JobType.objects.update_or_create(name=name, defaults={"backoff_base_seconds": 60, **options})
        jobtypes.clear_cache()
        names.append(name)
        return name

    yield add
    for name in names:
        registry.unregister(name)


# ----- enqueue: payloads and sizes -------------------------------------------------------------------------
def _deep(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


def _circular() -> dict:
    d: dict = {}
    d["self"] = d
    return d


@pytest.mark.django_db
@pytest.mark.parametrize("payload", [
    pytest.param({"b": b"bytes"}, id="bytes"),
    pytest.param({"s": {1, 2}}, id="set"),
    pytest.param({"when": datetime.datetime(2024, 1, 1)}, id="datetime"),
    pytest.param({"money": decimal.Decimal("1.10")}, id="decimal"),
    pytest.param({"x": float("inf")}, id="infinity"),
    pytest.param({(1, 2): "tuple key"}, id="tuple-key"),
    pytest.param(_circular(), id="circular"),
    pytest.param(_deep(100_000), id="nested-100000-deep"),
])
def test_payload_that_json_cannot_carry_is_refused(noop_type, payload) -> None:
    with pytest.raises(InvalidPayload, match="payload must be JSON-serialisable"):
        Job.objects.enqueue("Noop", payload)
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("text", [
    pytest.param("nul \x00 byte", id="nul"),
    pytest.param("lone surrogate \ud800", id="surrogate"),
])
def test_payload_text_no_database_can_store_is_refused_at_enqueue(noop_type, text) -> None:
    """JSON can carry these but PostgreSQL's jsonb cannot (NUL) and no UTF-8 column can (a lone
    surrogate): the enqueue must say so with InvalidPayload, on every vendor, and write nothing."""
    with pytest.raises(InvalidPayload):
        Job.objects.enqueue("Noop", {"text": text})
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_one_bad_spec_in_a_batch_writes_nothing(noop_type, settings) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 1000}
    good = [JobSpec("Noop", {"n": i}) for i in range(5)]
    for bad in (JobSpec("Noop", {"blob": "x" * 2000}), JobSpec("Noop", {"x": object()}), JobSpec("Nope"),
                JobSpec("Noop", queue=""), JobSpec("Noop", priority=2**40)):
        with pytest.raises((InvalidPayload, InvalidArgument, UnknownJobType)):
            Job.objects.enqueue_many([*good, bad, *good])
        assert Job.objects.count() == 0


@pytest.mark.django_db
def test_payload_limit_counts_bytes_not_characters(noop_type, settings) -> None:
    settings.SQLQUEUE = {"MAX_PAYLOAD_BYTES": 1000}
    Job.objects.enqueue("Noop", {"t": "x" * 900})
    with pytest.raises(InvalidPayload, match="limit is 1000"):
        Job.objects.enqueue("Noop", {"t": "\u00e9" * 900})  # 900 characters, more than 1000 bytes
    assert Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(("kwargs", "error"), [
    ({"queue": "q" * 101}, InvalidArgument),
    ({"queue": 5}, InvalidArgument),
    ({"priority": 1.5}, InvalidArgument),
    ({"priority": "1"}, InvalidArgument),
    ({"max_attempts": -1}, InvalidArgument),
    ({"max_attempts": 10**6}, InvalidArgument),
    ({"dedupe_key": ""}, InvalidArgument),
    ({"dedupe_key": 42}, InvalidArgument),
    ({"delay": float("nan")}, InvalidArgument),
    ({"delay": float("inf")}, InvalidArgument),
    ({"delay": 10**12}, InvalidArgument),
    ({"delay": "10"}, InvalidArgument),
    ({"delay": 1, "scheduled_for": datetime.datetime.now(datetime.UTC)}, InvalidArgument),
])
def test_absurd_enqueue_options_are_refused(noop_type, kwargs, error) -> None:
    with pytest.raises(error):
        Job.objects.enqueue("Noop", {}, **kwargs)
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["", " ", "x" * 201, None, 7])
def test_bad_job_type_names_are_refused(name) -> None:
    with pytest.raises(InvalidArgument, match="job type name"):
        Job.objects.enqueue(name)
    with pytest.raises(InvalidArgument):
        registry.register(name, lambda job: None)
    assert Job.objects.count() == 0 and not JobType.objects.filter(name=str(name)).exists()


# ----- the API: claim and modify --------------------------------------------------------------------------
@pytest.mark.django_db
def test_claim_with_an_unknown_type_filter_is_refused(noop_type) -> None:
    Job.objects.enqueue("Noop")
    with pytest.raises(UnknownJobType):
        Job.objects.claim("w", types=["NoSuchType"])
    assert Job.objects.get().state == Status.PENDING


@pytest.mark.django_db
@pytest.mark.parametrize(("call", "error"), [
    (lambda job: Job.objects.modify(job.pk + 1000, None, Status.CANCELLED), JobNotFound),
    (lambda job: Job.objects.modify(job, job.version, 99), ValueError),
    (lambda job: Job.objects.modify(job, job.version, Status.PROCESSING, step="s" * 101), InvalidArgument),
    (lambda job: Job.objects.modify(job, job.version, Status.ERROR, run_in=-5), InvalidArgument),
    (lambda job: Job.objects.modify(job, job.version, Status.ERROR, run_in=float("nan")), InvalidArgument),
    (lambda job: Job.objects.modify(job, job.version, Status.ERROR, run_in=float("inf")), InvalidArgument),
    (lambda job: Job.objects.modify(job, job.version, Status.COMPLETED, response={"x": object()}), InvalidPayload),
    (lambda job: Job.objects.modify(job, job.version, Status.ERROR,
                                    scheduled_for=datetime.datetime(2030, 1, 1)), InvalidArgument),
])
def test_bad_modify_arguments_change_nothing(noop_type, call, error) -> None:
    Job.objects.enqueue("Noop")
    job = Job.objects.claim("w")[0]
    with pytest.raises(error):
        call(job)
    after = Job.objects.get(pk=job.pk)
    assert (after.state, after.version, after.step, after.response) == (Status.PROCESSING, job.version, "", None)


# ----- handlers that raise odd things or return odd values -------------------------------------------------
class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


class NeedsTwoArgs(Exception):
    def __init__(self, a, b) -> None:  # cannot be rebuilt from args: not picklable the usual way
        super().__init__(f"{a}/{b}")


class HoldsALock(Exception):
    def __init__(self) -> None:
        super().__init__("holds an unpicklable lock")
        self.lock = threading.Lock()


def _raiser(exc_factory):
    def handler(job):
        raise exc_factory()
    return handler


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("factory", "expect"), [
    (StrRaises, "StrRaises"),
    (lambda: NeedsTwoArgs(1, 2), "NeedsTwoArgs: 1/2"),
    (HoldsALock, "HoldsALock: holds an unpicklable lock"),
    (lambda: ValueError("x" * (MAX_ERROR_CHARS * 2)), "ValueError: xxxx"),
    (lambda: ExceptionGroup("many", [ValueError("one"), KeyError("two")]), "ExceptionGroup: many"),
    (lambda: RecursionError("deep"), "RecursionError: deep"),
])
def test_odd_exceptions_become_the_jobs_error(odd_handlers, factory, expect) -> None:
    name = odd_handlers("odd.Raise", _raiser(factory), max_attempts=2)
    job = Job.objects.enqueue(name)
    counters = wu.run_worker("odd")
    job.refresh()
    assert job.state == Status.ERROR and job.attempt_num == 1, job.error
    assert expect in job.error and "Traceback" in job.error
    assert len(job.error) <= MAX_ERROR_CHARS
    assert counters[1] == 1  # retried


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("factory", [
    pytest.param(asyncio.CancelledError, id="CancelledError"),
    pytest.param(lambda: SystemExit(3), id="SystemExit"),
    pytest.param(lambda: GeneratorExit(), id="GeneratorExit"),
])
def test_base_exceptions_from_a_handler_fail_the_job_not_the_worker(odd_handlers, factory) -> None:
    """``asyncio.CancelledError`` (a handler that runs asyncio code), ``SystemExit`` (a library calling
    sys.exit) are BaseExceptions, not Exceptions: the job must get its traceback and the worker go on."""
    name = odd_handlers("odd.Base", _raiser(factory), max_attempts=2)
    job = Job.objects.enqueue(name)
    after = Job.objects.enqueue("test.Noop")
    wu.run_worker("odd-base")
    job.refresh()
    assert job.state == Status.ERROR and "Traceback" in job.error, job.error
    assert Job.objects.get(pk=after.pk).state == Status.COMPLETED


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("value", "expect"), [
    pytest.param(float("nan"), "Out of range float values are not JSON compliant", id="nan"),
    pytest.param({"s": {1}}, "not JSON serializable", id="set"),
    pytest.param({(1,): 2}, "keys must be str", id="tuple-key"),
    pytest.param(b"raw", "not JSON serializable", id="bytes"),
])
def test_odd_return_values_fail_the_job_with_a_clear_message(odd_handlers, value, expect) -> None:
    name = odd_handlers("odd.Return", lambda job: value)
    job = Job.objects.enqueue(name)
    wu.run_worker("odd-return")
    job.refresh()
    assert job.state == Status.FAILED and job.attempt_num == 1
    assert "cannot be stored as JSON" in job.error and expect in job.error


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("where", ["response", "error", "retry"])
def test_a_result_the_database_cannot_store_does_not_crash_the_worker(odd_handlers, where) -> None:
    """A NUL character in a handler's return value or exception message (PostgreSQL text and jsonb
    cannot hold it), or a retry "in infinity seconds" (no timestamp can hold it). The outcome must
    still be recorded, with a clear message where the value had to be refused, and the worker go on."""
    def handler(job):
        if where == "error":
            raise ValueError("bad \x00 byte")
        if where == "retry":
            raise Retry("never", delay=float("inf"))
        return {"text": "bad \x00 byte"}

    name = odd_handlers("odd.Unstorable", handler, max_attempts=1)
    job = Job.objects.enqueue(name)
    after = Job.objects.enqueue("test.Noop")
    wu.run_worker("odd-unstorable")
    job.refresh()
    assert job.state in (Status.COMPLETED, Status.FAILED), (job.state, job.error)
    if where != "response" or job.state == Status.FAILED:
        assert job.state == Status.FAILED and job.error, job.error
    assert Job.objects.get(pk=after.pk).state == Status.COMPLETED


# ----- the worker's command line --------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "257"], "--concurrency must be an integer from 1 to 256, got 257"),
    (["--concurrency", "1e3"], "invalid int value"),
    (["--batch", "1.5"], "--batch must be 'auto' or an integer from 1 to 1000, got '1.5'"),
    (["--max-jobs", str(10**13)], "--max-jobs must be an integer from 1 to"),
    (["--max-jobs=-1"], "--max-jobs must be an integer from 1"),
    (["--grace-seconds", "1e9"], "--grace-seconds must be a number of seconds from 0 to"),
    (["--burst", "--wait-due", "inf"], "--wait-due must be a number of seconds"),
    (["--max-seconds", "nan"], "--max-seconds must be a number of seconds"),
    (["--max-seconds", "1e12"], "--max-seconds must be a number of seconds"),
    (["--queue", "q" * 101], "--queue names must be 1-100 characters"),
    (["--worker-name", "line\nbreak"], "--worker-name must be 1-190 printable characters"),
    (["--worker-name", "   "], "--worker-name must be 1-190 printable characters"),
    (["--type", "t" * 201], "--type: a job type name must be"),
    (["--log-level", "'; DROP TABLE x; --"], "--log-level must be one of"),
])
def test_absurd_worker_options_are_clear_cli_errors(args, message) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        call_command("run_queue_worker", *args)


@pytest.mark.django_db
def test_a_hostile_type_name_on_the_command_line_is_an_unknown_type() -> None:
    hostile = "x'); DELETE FROM django_sqlqueue_job; --"
    with pytest.raises(CommandError, match="unknown job type"):
        call_command("run_queue_worker", "--type", hostile, "--burst")


# ----- a database that refuses connections -----------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(url: str, *args: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings",
           "SQLQUEUE_LOG_LEVEL": "INFO"}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--no-progress",
                                 "--log-level", "INFO", *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _retries(text: str, worker: str) -> list[tuple[float, float]]:
    """(the log line's time in seconds, the delay it announced) of each ``database_unavailable`` line."""
    out = []
    for line in text.splitlines():
        if f"database_unavailable worker={worker} " in line and "retry_in=" in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            out.append((stamp.timestamp(), float(line.split("retry_in=")[1].split()[0])))
    return out


def test_refused_connection_at_start_is_retried_with_backoff_not_a_traceback_loop(tmp_path) -> None:
    port = _free_port()  # nothing listens there
    log = tmp_path / "worker.log"
    proc = _worker(f"postgres://postgres@127.0.0.1:{port}/nothing", "--worker-name", "refused", log=log)
    try:
        wu.wait_until(lambda: len(_retries(log.read_text(), "refused/0")) >= 5, 120, interval=0.2,
                      what="five retries")
    finally:
        code = _stop(proc)
    text = log.read_text()
    assert code == 0, text
    assert "database_unavailable worker=refused/0" in text and "Connection refused" in text
    assert "Traceback" not in text
    retries = _retries(text, "refused/0")
    # Backing off, not a hot loop: each retry comes no sooner than the delay the one before announced
    # (by the log lines' own clock; load only lengthens the gaps; 0.06 s for the rounding to 0.1), and
    # the delays grow.
    for (at, delay), (next_at, _) in zip(retries, retries[1:], strict=False):
        assert next_at - at >= delay - 0.06, retries
    assert retries[-1][1] > retries[0][1], retries


def test_worker_started_before_its_database_exists_runs_once_it_does(tmp_path) -> None:
    """SQLite: the directory of the database file does not exist yet (unable to open the file)."""
    db = tmp_path / "later" / "db.sqlite3"
    url = f"sqlite:///{db}"
    log = tmp_path / "worker.log"
    proc = _worker(url, "--worker-name", "early", log=log)
    try:
        wu.wait_until(lambda: "database_unavailable" in log.read_text(), 90, what="the first retry")
        time.sleep(2)
        db.parent.mkdir()
        env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
        subprocess.run([sys.executable, str(REPO / "manage.py"), "migrate", "-v0"], cwd=REPO, env=env, check=True,
                       timeout=120)
        subprocess.run([sys.executable, str(REPO / "manage.py"), "shell", "-c",
                        "from django_sqlqueue.models import Job; Job.objects.enqueue('test.Noop')"],
                       cwd=REPO, env=env, check=True, timeout=120)

        def done() -> bool:
            with sqlite3.connect(db) as conn:
                return conn.execute("SELECT status_id FROM django_sqlqueue_job").fetchone() == (Status.COMPLETED,)

        wu.wait_until(done, 60, interval=0.2, what="the job to complete")
    finally:
        code = _stop(proc)
    text = log.read_text()
    assert code == 0, text
    assert "database_back worker=early/0" in text
    assert "Traceback" not in text, text
