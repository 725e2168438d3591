"""The worker and the first hour (issue 32 items 2, 3, 13): it serves only what its code runs and says
so at start; a --burst run ends, non-zero and saying why, when the database stays away or a slot dies
running a job; a task raising KeyboardInterrupt is a failed attempt, not a job left Processing."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
from django.utils import timezone

from django_sqlqueue import Status, jobtypes
from django_sqlqueue.models import Job, JobAttempt, JobType, Worker
from django_sqlqueue.ops.diagnose import why_not_running
from django_sqlqueue.worker import serving
from tests import workerutil as wu
from tests.workerutil import worker_procs  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_serving_splits_the_known_types_by_whether_this_code_runs_them() -> None:
    JobType.objects.get_or_create(name="test.Noop")
    everything = serving.resolve("default")
    assert "test.Noop" in everything.handled
    if not everything.unhandled:
        assert everything.claim_types == () and everything.row_types == []  # the claim as it always was
    JobType.objects.create(name="nobody.Handles")
    subset = serving.resolve("default")
    assert subset.unhandled == ("nobody.Handles",) and "test.Noop" in subset.claim_types
    assert "nobody.Handles" not in subset.row_types
    none = serving.resolve("default", ("nobody.Handles",))
    assert none.nothing and none.row_types == [serving.SERVES_NONE]


@contextmanager
def running_slot(name: str):
    """An in-process worker (no supervisor) in a thread, stopped and joined at the end."""
    from django_sqlqueue.worker.loop import Worker as Slot
    from django_sqlqueue.worker.loop import WorkerConfig

    slot = Slot(WorkerConfig(name=name))
    thread = threading.Thread(target=slot.run, daemon=True)
    thread.start()
    try:
        yield wu.wait_until(lambda: Worker.objects.filter(name=name, stopped_at__isnull=True).first(),
                            timeout=120, what="the worker row")
    finally:
        slot._signals += 1
        thread.join(30)
    assert not thread.is_alive()


def test_a_worker_row_lists_what_it_serves_and_the_diagnosis_follows() -> None:
    """The worker that cannot run a type does not count as serving it: queue_why says nobody does."""
    JobType.objects.create(name="nobody.Handles")
    JobType.objects.get_or_create(name="test.Noop")
    jobtypes.clear_cache()
    job = Job.objects.enqueue("nobody.Handles")
    with running_slot("serving-test") as row:
        assert "test.Noop" in row.types and "nobody.Handles" not in row.types
        reasons = why_not_running(Job.objects.get(pk=job.pk))
        assert any("none of the 1 live worker(s) serves queue default and type nobody.Handles" in r
                   for r in reasons), reasons
        time.sleep(1.0)
        seen = Job.objects.get(pk=job.pk)
        assert seen.attempt_num == 0 and not JobAttempt.objects.filter(job_id=job.pk).exists(), (
            seen.worker, list(Worker.objects.values_list("name", "stopped_at", "types")))


def test_a_type_created_after_the_start_is_handed_back_once_attempt_refunded() -> None:
    JobType.objects.get_or_create(name="test.Noop")
    jobtypes.clear_cache()
    with running_slot("serving-late") as row:
        assert row.types == []  # it runs every known type: no filter
        JobType.objects.create(name="later.Type")
        late = Job.objects.enqueue("later.Type")
        attempt = wu.wait_until(lambda: JobAttempt.objects.filter(job_id=late.pk).exclude(error="").first(),
                                timeout=120, what="the late job handed back")
        late = Job.objects.get(pk=late.pk)
        assert late.state is Status.PENDING and late.attempt_num == 0
        assert "has no handler for job type 'later.Type'" in attempt.error and "attempt refunded" in attempt.error
        types = wu.wait_until(lambda: Worker.objects.get(name="serving-late").types, timeout=120,
                              what="the row's types")
        assert "test.Noop" in types and "later.Type" not in types
        time.sleep(1.0)  # it claims the late job no more
        assert JobAttempt.objects.filter(job_id=late.pk).count() == 1
        assert Job.objects.get(pk=late.pk).state is Status.PENDING


@pytest.mark.timeout(900)  # a whole burst run: minutes on Babelfish under load
def test_the_start_line_lists_types_and_tasks(worker_procs) -> None:  # noqa: F811
    pytest.importorskip("django.tasks")
    from testproject.testjobs.tasks import noop

    noop.enqueue()  # a task type row: this worker resolves it by its import path
    w = worker_procs("--burst")
    assert w.wait(600) == 0, w.output()
    out = w.stdout()
    assert "serves job types: " in out and "test.Noop" in out
    # In a whole-suite session other tests' task rows are there too, sorted before or after this one.
    [start] = [line for line in out.splitlines() if line.startswith("serves job types: ")]
    assert "testproject.testjobs.tasks.noop" in start.partition("; tasks: ")[2].split(", "), start
    # Not the "no handler" warning (type rows other tests of the session left may be named otherwise).
    assert "no job handler is registered" not in w.stderr() and "no handler for it" not in w.stderr()


@pytest.mark.timeout(900)  # a whole burst run: minutes on Babelfish under load
def test_a_burst_worker_gives_up_on_an_unreachable_database(worker_procs) -> None:  # noqa: F811
    """Issue 32 item 3: a port nobody listens on; --db-wait 2 ends the run, non-zero, saying why."""
    started = time.monotonic()
    w = worker_procs("--burst", "--db-wait", "2",
                     env={"SQLQUEUE_DATABASE_URL": "postgres://nobody@127.0.0.1:9/nowhere"})
    code = w.wait(600)
    assert code != 0, w.output()
    assert "the database was unreachable for --db-wait 2 s" in w.stderr(), w.output()
    assert "worker_gave_up" in w.stderr()
    print(f"gave up after {time.monotonic() - started:.1f} s (bounded by the 600 s wait above)")


@pytest.mark.timeout(900)  # a whole burst run: minutes on Babelfish under load
def test_a_burst_run_in_which_a_slot_died_running_a_job_exits_non_zero(worker_procs) -> None:  # noqa: F811
    """Issue 32 item 13: a handler that ends the slot's process (os._exit) leaves nothing 'running'."""
    # A long lease: the reaper (lease expired, no attempts left) must not answer first on a slow machine.
    JobType.objects.update_or_create(name="test.Exit", defaults={"max_attempts": 1, "lease_seconds": 600})
    jobtypes.clear_cache()
    job = Job.objects.enqueue("test.Exit", {"code": 1})
    w = worker_procs("--burst")
    assert w.wait(600) != 0, w.output()
    assert f"a worker slot died while running job(s) {job.pk}" in w.stderr(), w.output()
    job = Job.objects.get(pk=job.pk)
    assert job.state is Status.FAILED, (job.state, job.error)
    # The job's error says what happened: the supervisor's record of the death, or (when the dead slot's
    # lease was ended at once, issue 31 item 7, and the maintenance reaper got to it first) the reaper's
    # "lease expired with no attempts left", naming the dead slot.
    assert ("the worker slot running it died (exit 1" in job.error
            or "lease expired with no attempts left" in job.error), job.error


@pytest.mark.timeout(900)  # a whole burst run: minutes on Babelfish under load
def test_a_task_raising_keyboard_interrupt_is_a_failed_attempt(worker_procs) -> None:  # noqa: F811
    """Issue 32 item 13 as reported: the task's job was left Processing and the burst exited 0."""
    pytest.importorskip("django.tasks")
    from testproject.testjobs.tasks import interrupted

    result = interrupted.enqueue()
    JobType.objects.filter(name=interrupted.module_path).update(max_attempts=1)
    jobtypes.clear_cache()
    w = worker_procs("--burst")
    assert w.wait(600) == 0, w.output()
    assert "processed=1" in w.stdout() and "failed=1" in w.stdout(), w.output()
    job = Job.objects.get(pk=int(result.id))
    assert job.state is Status.FAILED and "KeyboardInterrupt" in job.error
    result.refresh()
    assert result.status == "FAILED"
    assert job.finished_at is not None and job.finished_at <= timezone.now()
