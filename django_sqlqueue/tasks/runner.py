"""Run Django Tasks (``django.tasks``, Django >= 6.0) as queue jobs.

A task enqueued through :class:`django_sqlqueue.tasks.SqlQueueBackend` is stored as a job whose type
name is the task's import path (``Task.module_path``, e.g. ``myapp.tasks.send_welcome``) and whose
payload holds the JSON-normalised arguments. No handler is declared for such a type up front: the
resolver installed by :func:`install` recognises the name as a task, so the worker runs it the same
way as any typed job (retries, leases, timeouts, history, admin).

This module must import on Django versions without ``django.tasks`` (5.2): :func:`install` is safe to
call from ``AppConfig.ready()`` everywhere, and the resolver simply declines every name there.
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import time
import weakref
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from django.utils import timezone

from ..handlers import Handler, registry
from ..worker.runner import Fail, JobContext  # Fail: the worker fails these at once instead of retrying

if TYPE_CHECKING:
    from ..models import Job

logger = logging.getLogger(__name__)

#: A dotted Python path: ``package.module.function``. Anything else is not a task name.
_TASK_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")

#: Payload keys of a task job.
ARGS, KWARGS, BACKEND, RUN_AFTER = "args", "kwargs", "backend", "run_after"


def may_import(name: str, *, imported_ok: bool = True) -> bool:
    """Whether the resolver may import the module of job type ``name`` to look for a task there.

    A job type name comes from the database (an operator's row, a crafted enqueue), so importing
    whatever it names would run any importable module's top-level code, in a worker and in a web
    process that only asked whether the name is known. Only names where tasks are may be imported:
    a module of an installed app; a type row the Tasks backend flagged when it enqueued a real
    ``@task`` (tasks outside installed apps); or (``imported_ok``) a module already imported, which
    running again costs nothing and executes nothing.
    """
    if not isinstance(name, str) or not _TASK_PATH.match(name):
        return False
    module_path = name.rpartition(".")[0]
    if imported_ok and module_path in sys.modules:
        return True
    from django.apps import apps

    if any(module_path == app.name or module_path.startswith(app.name + ".") for app in apps.get_app_configs()):
        return True
    return _flagged_as_task(name)


def _flagged_as_task(name: str) -> bool:
    from contextlib import nullcontext

    from django.db import DatabaseError, connections, transaction

    from ..conf import get_settings
    from ..models import JobType

    alias = get_settings().DATABASE
    # Inside a caller's transaction: a savepoint, so that a failure leaves it usable. Outside one: no
    # transaction at all, since on SQLite (BEGIN IMMEDIATE) atomic() takes the write lock, and a worker
    # starting beside a long writer would wait out the busy timeout for each task row it reads.
    guard = transaction.atomic(using=alias) if connections[alias].in_atomic_block else nullcontext()
    try:
        with guard:
            return JobType.objects.using(alias).filter(name=name, is_task=True).exists()
    except DatabaseError:  # no tables yet, or the database is away: not known to be a task
        return False


def load_task(name: str, *, trusted: bool = False) -> Any | None:
    """The ``django.tasks.Task`` object at import path ``name``, or None when ``name`` is not one.

    Import errors of a module that does exist propagate: a task module that fails to import is a bug
    the operator must see (in the job's error), not an "unknown job type". So do all import errors of
    a name the Tasks backend flagged as a task (a worker started without the task's code on its path).
    Only names :func:`may_import` allows are imported; any other is not a task -- unless ``trusted``:
    the name comes from the developer's own code (a schedule declared in settings), not from a row.
    """
    if not trusted and not may_import(name):
        return None
    try:
        from django.tasks import Task
    except ImportError:  # Django < 6.0: no tasks framework, so no task jobs
        return None
    from django.utils.module_loading import import_string

    module_path = name.rpartition(".")[0]
    try:
        obj = import_string(name)
    except ImportError as exc:
        # "No module named X" for the path itself means: not a task. Anything else (a module that
        # exists but raises ImportError inside) is a real error.
        missing = getattr(exc, "name", None)
        if _flagged_as_task(name):  # the backend enqueued a real task here: this process cannot import it
            raise
        if missing is not None and (module_path == missing or module_path.startswith(missing + ".")):
            return None
        if "does not define" in str(exc):
            return None
        raise
    return obj if isinstance(obj, Task) else None


def resolve(name: str) -> Handler | None:
    """Registry resolver: a Handler running the task at import path ``name``, or None.

    Only a dotted path is ever imported; anything else (a typed job's name, a non-string) is declined
    before any import, so a bad name can never leave a handler behind in the registry.
    """
    if not isinstance(name, str) or not _TASK_PATH.match(name):
        return None
    try:
        task = load_task(name)
    except Exception as exc:  # the module exists but cannot be imported: fail the job, loudly
        logger.exception("task module import failed name=%s", name)
        error = exc

        def broken(job: Job) -> Any:
            raise RuntimeError(f"task {name!r} cannot be imported: {error!r}") from error

        return Handler(name, broken)
    if task is None:
        return None

    def run(ctx: Any, *args: Any) -> Any:
        # The worker passes a JobContext (the Job is its ``job``); tests may pass the Job itself.
        job = ctx.job if isinstance(ctx, JobContext) else ctx
        return run_task_job(task, job)

    run.__qualname__ = run.__name__ = f"run_task[{name}]"
    return Handler(name, run, options={"description": f"Django task {name}"[:500]})


def install() -> None:
    """Register :func:`resolve` with the handler registry (idempotent).

    Call it in every process that runs or enqueues tasks; ``django_sqlqueue``'s app config does so
    in ``ready()``, and importing :mod:`django_sqlqueue.tasks` does too.
    """
    registry.add_resolver(resolve)


def parse_run_after(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value)


def run_task_job(task: Any, job: Job) -> Any:
    """Run ``task`` with the job's arguments; return the JSON-normalised return value.

    ``takes_context`` tasks get a ``TaskContext`` whose ``task_result`` describes this job as it is
    now (RUNNING, attempts counted from the history, this attempt included). The result's
    history-derived fields (``attempts``, ``worker_ids``, ``errors``, ``started_at``,
    ``last_attempted_at``) are read from the database only when a task or a signal receiver first asks
    for one of them (:class:`~django_sqlqueue.tasks.LazyHistoryResult`): a task run that nothing
    inspects costs no query beyond the worker's own. ``task_started`` is sent
    before the call and ``task_finished`` after it returns or raises, with the status that attempt
    leads to (SUCCESSFUL; READY when the job will be retried; FAILED when it will not).
    A return value that is not JSON-serialisable raises ``TypeError`` (the attempt fails, as with
    Django's own backends) wrapped in :class:`TaskReturnValueError`, which the worker treats as
    not retryable: the task's work is done, running it again would not change its return value.
    """
    api = _api()
    payload = job.payload if isinstance(job.payload, dict) else {}
    args = payload.get(ARGS) or ()
    kwargs = payload.get(KWARGS) or {}
    alias = payload.get(BACKEND) or task.backend
    plan = _plan(task, api)
    if plan.eager_history:
        result = api.build_result(task, job, backend_alias=alias)
    else:
        result = api.running_result(task, job, payload, alias)
    task_finished, SqlQueueBackend, TaskResultStatus = api.task_finished, api.SqlQueueBackend, api.TaskResultStatus
    if plan.send_started:
        api.task_started.send(sender=SqlQueueBackend, task_result=result)
    try:
        if task.takes_context:
            raw = task.call(api.TaskContext(task_result=result), *args, **kwargs)
        else:
            raw = task.call(*args, **kwargs)
        value = _normalised_return_value(raw)
    except BaseException as exc:
        # SystemExit or KeyboardInterrupt raised by a task is a task failure, not a request to stop the
        # worker slot (whose own signal handling never raises them): the result is FAILED / READY.
        retry = _will_retry(job) and not isinstance(exc, TaskReturnValueError)
        status = TaskResultStatus.READY if retry else TaskResultStatus.FAILED
        _finish(result, status, None)
        if plan.send_finished or status == TaskResultStatus.FAILED:
            task_finished.send(sender=SqlQueueBackend, task_result=result)
        if isinstance(exc, Exception):
            raise
        raise TaskExited(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}") from exc
    _finish(result, TaskResultStatus.SUCCESSFUL, value)
    if plan.send_finished:
        task_finished.send(sender=SqlQueueBackend, task_result=result)
    return value


class _Plan(NamedTuple):
    """What a task run must do besides calling the task, read from the connected receivers."""

    #: Read the result's history up front: it may be first read inside an event loop, where the ORM
    #: refuses to run (an async ``takes_context`` task reads its context in the loop ``async_to_sync``
    #: runs it in; async receivers of the signals run in one too).
    eager_history: bool
    #: Send ``task_started``, and ``task_finished`` for a run that did not fail: False only when their
    #: sole receivers are Django's own log receivers and no handler would emit their INFO records
    #: (:func:`_heard`), so that sending would do nothing observable. A failed run's ``task_finished`` (logged at ERROR) is
    #: always sent.
    send_started: bool
    send_finished: bool


def _plan(task: Any, api: _Api) -> _Plan:
    """One scan of the two signals' receiver lists (a short list; Django keeps (key, receiver, sender,
    is_async), the receiver usually as a weak reference): cheaper per run than asking the signals for
    this sender's live receivers, and conservative: any receiver not known to be Django's log receiver,
    for any sender, keeps the signal sent."""
    eager = bool(task.takes_context and api.iscoroutinefunction(task.func))
    quiet = not api.tasks_log.isEnabledFor(logging.INFO) or not _info_heard(api.tasks_log)
    send = [True, True]
    for i, (sig, own) in enumerate(((api.task_started, api.log_started), (api.task_finished, api.log_finished))):
        only_own = True
        try:
            for entry in sig.receivers:
                if entry[3]:
                    eager = True
                receiver = entry[1]
                if isinstance(receiver, weakref.ReferenceType):
                    receiver = receiver()
                if receiver is not own:
                    only_own = False
        except (AttributeError, IndexError, TypeError):  # a Django whose Signal is shaped otherwise
            eager, only_own = True, False
        send[i] = not (quiet and only_own)
    return _Plan(eager, send[0], send[1])


#: Per level: (when, answer) of the last :func:`_heard` walk for :func:`heard_cached`.
_HEARD: dict[int, tuple[float, bool]] = {}
#: How long a walk's answer is kept: the walk costs about half of what the signals it may spare cost,
#: and a logging reconfiguration then applies to task runs within a second.
HEARD_TTL_SECONDS = 1.0


def _info_heard(logger: logging.Logger) -> bool:
    return heard_cached(logger, logging.INFO)


def heard_cached(logger: logging.Logger, level: int) -> bool:
    """:func:`_heard`, walked at most once per :data:`HEARD_TTL_SECONDS` and level (and again at once
    when a setting changes: ``DEBUG`` decides Django's own filters). Also asked by the backend's
    ``enqueue()`` for ``task_enqueued``'s DEBUG line."""
    now = time.monotonic()
    last = _HEARD.get(level)
    if last is not None and now - last[0] < HEARD_TTL_SECONDS:
        return last[1]
    answer = _heard(logger, level)
    _HEARD[level] = (now, answer)
    return answer


def forget_heard(**kwargs: Any) -> None:
    """``setting_changed`` receiver: the next task run (or enqueue) walks the handlers again."""
    _HEARD.clear()


def _heard(logger: logging.Logger, level: int) -> bool:
    """Whether a record at ``level`` from ``logger`` may reach a handler that emits it.

    Conservative: False only when the logger drops the level, or every handler on its way up drops it
    by its level or by one of Django's own ``RequireDebugTrue`` / ``RequireDebugFalse`` filters (what
    Django's default ``LOGGING`` does with INFO records when ``DEBUG`` is off: each task run's two log
    records were built, then dropped, about a third of a task run's cost). Any other filter, a filter
    on a logger, or a custom record factory counts as heard.
    """
    if not logger.isEnabledFor(level):
        return False
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return True
    from django.conf import settings
    from django.utils.log import RequireDebugFalse, RequireDebugTrue

    debug, found = bool(settings.DEBUG), False
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return True
        for handler in current.handlers:
            found = True
            if level < handler.level:
                continue
            dropped = any((type(f) is RequireDebugTrue and not debug) or (type(f) is RequireDebugFalse and debug)
                          for f in handler.filters)
            if not dropped:
                return True
        current = current.parent if current.propagate else None
    # No handler at all: logging's last resort (WARNING by default) gets the record.
    return not found and logging.lastResort is not None and level >= logging.lastResort.level


class _Api(NamedTuple):
    """What a task run uses from ``django.tasks`` and :mod:`.tasks`, imported once per process (this
    module must import where ``django.tasks`` does not exist, and an import statement in the run costs
    a lookup per task)."""

    TaskContext: Any
    TaskResultStatus: Any
    task_started: Any
    task_finished: Any
    SqlQueueBackend: Any
    build_result: Any
    running_result: Any
    iscoroutinefunction: Any
    tasks_log: logging.Logger
    log_started: Any
    log_finished: Any


@functools.cache
def _api() -> _Api:
    from inspect import iscoroutinefunction

    from django.tasks import TaskContext, TaskResultStatus, signals
    from django.tasks.signals import task_finished, task_started

    from .backend import SqlQueueBackend, build_result, running_result

    return _Api(TaskContext, TaskResultStatus, task_started, task_finished, SqlQueueBackend, build_result,
                running_result, iscoroutinefunction, signals.logger, signals.log_task_started,
                signals.log_task_finished)


class TaskExited(Exception):
    """The task raised SystemExit (or another BaseException that is not an Exception)."""


class TaskReturnValueError(Fail, TypeError):
    """The task's return value cannot be stored as JSON.

    Its message is the formatted traceback of the underlying error, so that the job's stored error
    (which the worker takes from this message, without a traceback, for a non-retryable failure) still
    names the original exception class (``TypeError: Unsupported type ...``) for ``TaskResult.errors``.
    """


def _normalised_return_value(raw: Any) -> Any:
    if raw is None or type(raw) in (str, int, bool):  # JSON as they are (a float may be NaN)
        return raw
    import json
    from traceback import format_exception

    from django.utils.json import normalize_json

    try:
        value = normalize_json(raw)
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TaskReturnValueError("".join(format_exception(exc))) from exc
    return value


def _finish(result: Any, status: Any, value: Any) -> None:
    put = object.__setattr__
    put(result, "status", status)
    put(result, "finished_at", timezone.now())
    put(result, "_return_value", value)


def _will_retry(job: Job) -> bool:
    from .. import jobtypes
    from ..conf import get_settings

    limit = job.max_attempts
    if limit is None:
        using = job._state.db or get_settings().DATABASE  # the queue's database, not Django's "default"
        limit = jobtypes.get_type_by_id(job.job_type_id, using=using).max_attempts
    return job.attempt_num < limit
