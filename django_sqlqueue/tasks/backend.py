"""A backend for Django's Tasks framework (``django.tasks``, Django >= 6.0) that runs on the SQL queue.

With ``TASKS = {"default": {"BACKEND": "django_sqlqueue.tasks.SqlQueueBackend", "QUEUES": [...]}}``
every ``@task`` runs under ``run_queue_worker`` as a job: its type is the task's import path, its
payload the (JSON-normalised) arguments, its response the return value; :data:`STATUS_MAP` maps the
queue's ten statuses onto the framework's four. The one OPTION, ``max_attempts``, overrides the job
types' attempts (1: the framework's run-once semantics). Setup, the whole mapping, retries, errors,
transactions and costs: docs/tasks.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from typing import Any

from django.core import checks
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from .. import jobtypes, workflows
from ..conf import get_settings
from ..exceptions import InvalidPayload
from ..states import Status
from . import runner as task_runner

__all__ = ["STATUS_MAP", "LazyHistoryResult", "SqlQueueBackend", "TaskArgumentsError", "build_result",
           "running_result"]

#: Queue status -> framework status (docs/tasks.md, "Status mapping").
STATUS_MAP: dict[Status, TaskResultStatus] = {
    Status.PENDING: TaskResultStatus.READY,
    Status.ERROR: TaskResultStatus.READY,
    Status.PAUSED: TaskResultStatus.READY,
    Status.WAITING: TaskResultStatus.READY,  # waits for other jobs (workflows.py)
    Status.PROCESSING: TaskResultStatus.RUNNING,
    Status.COMPLETED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
    Status.TERMINATED: TaskResultStatus.FAILED,
    Status.PARTIALLY_COMPLETED: TaskResultStatus.FAILED,
}

_KNOWN_OPTIONS = {"max_attempts"}
_MAX_QUEUE_NAME = 100  # Job.queue max_length
_MAX_TYPE_NAME = 200  # JobType.name max_length
_MAX_CHECKED = 1000  # tasks a backend remembers as validated
#: The last line of a Python traceback: ``package.module.ExceptionClass: message`` (or no message).
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")
_EXITED = f"{task_runner.TaskExited.__module__}.{task_runner.TaskExited.__qualname__}"
#: Used when an attempt's error is not a traceback (timed out, lease expired, worker killed...).
FALLBACK_EXCEPTION = "django_sqlqueue.exceptions.SqlQueueError"


class TaskArgumentsError(InvalidPayload, TypeError):
    """Task arguments must be JSON-serialisable (lists, dicts, strings, numbers, booleans, None)."""


task_runner.install()


class SqlQueueBackend(BaseTaskBackend):
    """Django Tasks backend storing each task as a job in django-sqlqueue's tables."""

    supports_defer = True  # run_after -> scheduled_for
    supports_async_task = True  # coroutine functions are run with async_to_sync in the worker
    supports_get_result = True  # results are rows: readable from any process
    supports_priority = True  # priority -> the claim's ORDER BY priority DESC

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.max_attempts: int | None = self.options.get("max_attempts")
        #: Tasks (without run_after) that passed validate_task and _check_importable. A Task is
        #: immutable and a backend lives as long as its settings, so each is checked once, not per enqueue.
        self._checked: set[Any] = set()

    # ----- validation -----------------------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        if len(task.queue_name) > _MAX_QUEUE_NAME:
            raise InvalidTask(f"Queue name {task.queue_name!r} is longer than {_MAX_QUEUE_NAME} characters.")
        if len(task.module_path) > _MAX_TYPE_NAME:
            raise InvalidTask(f"Task path {task.module_path!r} is longer than {_MAX_TYPE_NAME} characters.")
        if task.func.__module__ == "__main__":
            raise InvalidTask("Task function must be importable by a worker; it is defined in __main__.")

    def _check_importable(self, task: Any) -> None:
        """A worker finds the task by its import path: refuse one that does not lead back to it."""
        try:
            found = import_string(task.module_path)
        except ImportError as exc:
            raise InvalidTask(f"Task {task.module_path!r} cannot be imported by a worker: {exc}") from exc
        if getattr(found, "func", None) is not task.func:
            raise InvalidTask(
                f"{task.module_path!r} does not lead back to this task: decorate the module-level "
                f"function with @task and keep it under its own name"
            )

    @staticmethod
    def _normalise_arguments(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        """JSON round-trip of the arguments, exactly as a worker will see them."""
        if not args and not kwargs:
            return [], {}
        try:
            norm_args = normalize_json(list(args))
            norm_kwargs = normalize_json(dict(kwargs))
            text = json.dumps({"args": norm_args, "kwargs": norm_kwargs}, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TaskArgumentsError(
                f"task argument {_offending_argument(args, kwargs)} cannot be stored: {exc}. Task arguments "
                f"must be JSON-serialisable (pass ids and strings, not model instances, datetimes or sets)."
            ) from exc
        data = json.loads(text)
        return data["args"], data["kwargs"]

    # ----- enqueue ----------------------------------------------------------------------------------
    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task as a job (committed with the caller's transaction); return its result.

        Sends ``task_enqueued``. Raises ``InvalidTask`` for a task this backend cannot run and
        :class:`TaskArgumentsError` (a ``TypeError``) for arguments that are not JSON-serialisable.
        """
        from ..models import Job

        if task not in self._checked:
            self.validate_task(task)
            self._check_importable(task)
            if task.run_after is None:  # run_after varies per enqueue: such tasks are not kept
                if len(self._checked) >= _MAX_CHECKED:
                    self._checked.clear()
                self._checked.add(task)
        norm_args, norm_kwargs = self._normalise_arguments(args, kwargs)
        # Only what differs from what a worker assumes when a key is absent (no arguments; the task's
        # own backend; no run_after): every byte of the payload is stored, sent to the worker and
        # parsed on every claim (on PostgreSQL the four keys of a no-argument task cost more per job
        # than the rest of the Tasks path, docs/performance.md).
        payload: dict[str, Any] = {}
        if norm_args:
            payload[task_runner.ARGS] = norm_args
        if norm_kwargs:
            payload[task_runner.KWARGS] = norm_kwargs
        if self.alias != task.backend:
            payload[task_runner.BACKEND] = self.alias
        if task.run_after:
            payload[task_runner.RUN_AFTER] = task.run_after.isoformat()
        using = get_settings().DATABASE
        # The task's type row is created on first use, so an operator can tune it per task.
        jobtypes.get_type(task.module_path, using=using, create=True, task=True)
        flow = workflows.current_task_options()  # inside workflows.task_options(after=..., batch=...)
        job = Job.objects.enqueue(
            task.module_path,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            scheduled_for=task.run_after,
            max_attempts=self.max_attempts,
            using=using,
            **flow,
        )
        result = enqueued_result(task, job, self.alias)
        if _enqueued_heard():
            task_enqueued.send(type(self), task_result=result)
        return result

    # ----- results ----------------------------------------------------------------------------------
    def get_result(self, result_id: Any) -> TaskResult:
        """The current state of task job ``result_id``; ``TaskResultDoesNotExist`` if there is none.

        A job that is not a task job (a typed job, or a task that no longer imports) does not exist
        as far as the framework is concerned.
        """
        from ..models import Job

        try:
            pk = int(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        using = get_settings().DATABASE
        job = Job.objects.using(using).select_related("job_type").filter(pk=pk).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            task = task_runner.load_task(job.job_type.name)
        except Exception:
            task = None
        if task is None or not isinstance(job.payload, dict):
            raise TaskResultDoesNotExist(result_id)
        return build_result(task, job, backend_alias=self.alias)

    # ----- checks -------------------------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        from django.apps import apps

        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_sqlqueue"):
            messages.append(checks.Error(
                "SqlQueueBackend needs 'django_sqlqueue' in INSTALLED_APPS",
                obj=f"TASKS[{self.alias!r}]", id="sqlqueue.E101"))
        unknown = set(self.options) - _KNOWN_OPTIONS
        if unknown:
            messages.append(checks.Error(
                f"unknown OPTIONS for SqlQueueBackend: {', '.join(sorted(unknown))}",
                hint=f"known options: {', '.join(sorted(_KNOWN_OPTIONS))}",
                obj=f"TASKS[{self.alias!r}]", id="sqlqueue.E102"))
        ma = self.max_attempts
        if ma is not None and (not isinstance(ma, int) or isinstance(ma, bool) or not 1 <= ma <= 32767):
            messages.append(checks.Error(
                f"OPTIONS['max_attempts'] must be an integer from 1 to 32767, got {ma!r}",
                obj=f"TASKS[{self.alias!r}]", id="sqlqueue.E103"))
        for name in sorted(self.queues):
            if not isinstance(name, str) or not name or len(name) > _MAX_QUEUE_NAME:
                messages.append(checks.Error(
                    f"queue name {name!r} must be a non-empty string of at most {_MAX_QUEUE_NAME} characters",
                    obj=f"TASKS[{self.alias!r}]", id="sqlqueue.E104"))
        return messages


def _offending_argument(args: Any, kwargs: Any) -> str:
    """Which argument (and where inside it) the JSON round trip refused: ``kwargs['when']``, ``args[0][2]``."""
    from ..queue import offending_path

    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + [(f"kwargs[{k!r}]", v) for k, v in dict(kwargs).items()]
    for label, value in named:
        try:
            json.dumps(normalize_json(value), allow_nan=False)
        except (TypeError, ValueError):
            return label + offending_path(value)
    return "(unknown)"


# ----- building results --------------------------------------------------------------------------------
#: The result fields derived from the job's attempt history (read from the database).
HISTORY_FIELDS = ("started_at", "last_attempted_at", "errors", "worker_ids")
_UNREAD: Any = object()  # stands for a history field a LazyHistoryResult has not read yet


def _history_field(name: str) -> property:
    slot = TaskResult.__dict__[name]  # the dataclass's own storage of the field (a slot)

    def get(self: LazyHistoryResult) -> Any:
        value = slot.__get__(self, type(self))
        if value is _UNREAD:
            self._read_history()
            value = slot.__get__(self, type(self))
        return value

    def put(self: LazyHistoryResult, value: Any) -> None:  # the dataclass __init__, refresh(), unpickling
        slot.__set__(self, value)

    return property(get, put, doc=f"``{name}``, read from the attempt history on first access.")


class LazyHistoryResult(TaskResult):
    """A ``TaskResult`` that reads the job's attempt history only when one of its fields is asked for.

    Why: a worker builds a result for every task it runs (for ``task_started`` / ``task_finished`` and a
    ``takes_context`` task's context), and most tasks and receivers (Django's own log receivers among
    them) never look at ``started_at``, ``last_attempted_at``, ``errors``, ``worker_ids`` or
    ``attempts``. Reading the history eagerly cost one SELECT per task run. The first access to any of
    them reads the history once (as it is then) and fills all four; everything else is as usual.
    """

    __slots__ = ("_history_of",)

    started_at = _history_field("started_at")
    last_attempted_at = _history_field("last_attempted_at")
    errors = _history_field("errors")
    worker_ids = _history_field("worker_ids")

    def _read_history(self) -> None:
        job = self._history_of
        history = _read_history(job)
        for name, value in _history_values(job, history).items():
            object.__setattr__(self, name, value)


def _read_history(job: Any) -> list[Any]:
    from ..models import JobAttempt

    return list(
        JobAttempt.objects.using(job._state.db or get_settings().DATABASE)
        .filter(job_id=job.pk)
        .order_by("attempt_num", "id")
    )


def _history_values(job: Any, history: list[Any]) -> dict[str, Any]:
    first, last = (history[0], history[-1]) if history else (None, None)
    return {
        "started_at": first.claimed_at if first else job.started_at,
        "last_attempted_at": last.claimed_at if last else job.started_at,
        "errors": _errors(job, history),
        "worker_ids": [a.worker for a in history],
    }


def build_result(task: Any, job: Any, *, backend_alias: str, history: list[Any] | None = None,
                 lazy: bool = False) -> TaskResult:
    """A ``TaskResult`` describing ``job`` now.

    ``history``: its JobAttempt rows; when None they are read now, or (``lazy``) on the first access to a
    field derived from them (a :class:`LazyHistoryResult`; the worker's results are built that way).
    """
    status = STATUS_MAP[Status(job.status_id)]
    payload = job.payload if isinstance(job.payload, dict) else {}
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    fields = {
        "task": _task_as_enqueued(task, job, payload, backend_alias),
        "id": str(job.pk),
        "status": status,
        "enqueued_at": job.enqueued_at,
        "finished_at": (job.finished_at or job.updated_at) if finished else None,
        "args": list(payload.get(task_runner.ARGS) or []),
        "kwargs": dict(payload.get(task_runner.KWARGS) or {}),
        "backend": backend_alias,
    }
    if history is None and lazy:
        result: TaskResult = LazyHistoryResult(**fields, **dict.fromkeys(HISTORY_FIELDS, _UNREAD))
        object.__setattr__(result, "_history_of", job)
    else:
        if history is None:
            history = _read_history(job)
        result = TaskResult(**fields, **_history_values(job, history))
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.response)
    return result


#: The fields ``TaskResult.__init__`` takes, as this module knows them: :func:`running_result` sets exactly
#: these. A Django whose ``TaskResult`` has others gets the dataclass constructor instead.
_RESULT_FIELDS = frozenset({"task", "id", "status", "enqueued_at", "started_at", "finished_at",
                            "last_attempted_at", "args", "kwargs", "backend", "errors", "worker_ids"})
_FAST_RESULT = {f.name for f in dataclasses.fields(TaskResult) if f.init} == _RESULT_FIELDS


def running_result(task: Any, job: Any, payload: dict[str, Any], backend_alias: str) -> TaskResult:
    """The RUNNING result a worker builds for every task run, its history read lazily.

    Why not :func:`build_result`: the dataclass constructor's ``__post_init__`` runs ``normalize_json``
    over the arguments again, and a payload decoded from the job's JSON column is JSON already; with the
    keyword-argument dicts that is about a third of a task run's own cost (docs/performance.md).
    The fields are set as the constructor would set them; :data:`_FAST_RESULT` guards the list.
    """
    if not _FAST_RESULT:
        return build_result(task, job, backend_alias=backend_alias, lazy=True)
    result = object.__new__(LazyHistoryResult)
    values = (_task_as_enqueued(task, job, payload, backend_alias), str(job.pk), TaskResultStatus.RUNNING,
              job.enqueued_at, None, list(payload.get(task_runner.ARGS) or ()),
              dict(payload.get(task_runner.KWARGS) or {}), backend_alias, None, *_UNREAD_HISTORY, job)
    for put, value in zip(_PUT, values, strict=True):
        put(result, value)
    return result


#: The slots :func:`running_result` fills, in the order of its values: set through the slots' own
#: descriptors (the history fields' properties would add a Python call each).
_PUT = tuple(
    (LazyHistoryResult if name == "_history_of" else TaskResult).__dict__[name].__set__
    for name in ("task", "id", "status", "enqueued_at", "finished_at", "args", "kwargs", "backend",
                 "_return_value", *HISTORY_FIELDS, "_history_of")
) if _FAST_RESULT else ()
_UNREAD_HISTORY = (_UNREAD,) * len(HISTORY_FIELDS)


#: The fields :func:`enqueued_result` sets, in the order of its values (through the slots' descriptors).
_PUT_ENQUEUED = tuple(
    TaskResult.__dict__[name].__set__
    for name in ("task", "id", "status", "enqueued_at", "started_at", "finished_at", "last_attempted_at", "args",
                 "kwargs", "backend", "errors", "worker_ids", "_return_value")
) if _FAST_RESULT else ()


def enqueued_result(task: Any, job: Any, backend_alias: str) -> TaskResult:
    """The READY result ``enqueue()`` returns for a job it has just inserted: no history yet.

    Why not :func:`build_result`: ``TaskResult``'s constructor runs ``normalize_json`` over arguments
    that ``enqueue()`` has just round-tripped through JSON itself, and the status and history of a new
    job are known without looking: about a fifth of what ``task.enqueue()`` cost on top of the native
    enqueue (docs/performance.md). The fields are what ``build_result(..., history=[])`` sets; a test
    compares them, and a Django whose ``TaskResult`` has other fields gets the constructor.
    """
    status = STATUS_MAP[Status(job.status_id)]
    if not _FAST_RESULT or job.error or status != TaskResultStatus.READY:
        return build_result(task, job, backend_alias=backend_alias, history=[])
    payload = job.payload if isinstance(job.payload, dict) else {}
    result = object.__new__(TaskResult)
    values = (_task_as_enqueued(task, job, payload, backend_alias), str(job.pk), status,
              job.enqueued_at, job.started_at, None, job.started_at, list(payload.get(task_runner.ARGS) or ()),
              dict(payload.get(task_runner.KWARGS) or {}), backend_alias, [], [], None)
    for put, value in zip(_PUT_ENQUEUED, values, strict=True):
        put(result, value)
    return result


def _enqueued_heard() -> bool:
    """Whether sending ``task_enqueued`` could be noticed: False only when its one receiver is Django's own
    log receiver (a DEBUG line) and no handler would emit that line (``django.tasks`` above DEBUG, as
    with Django's default ``LOGGING``): the rule the worker applies to ``task_started`` (docs/tasks.md,
    "Signals"). Any other receiver, for any sender, or a DEBUG line a handler would write, and it is sent."""
    import logging
    import weakref

    from django.tasks import signals

    try:
        for entry in task_enqueued.receivers:
            receiver = entry[1]
            if isinstance(receiver, weakref.ReferenceType):
                receiver = receiver()
            if receiver is not signals.log_task_enqueued:
                return True
    except (AttributeError, IndexError, TypeError):  # a Django whose Signal is shaped otherwise
        return True
    return signals.logger.isEnabledFor(logging.DEBUG) and task_runner.heard_cached(signals.logger, logging.DEBUG)


def _task_as_enqueued(task: Any, job: Any, payload: dict[str, Any], backend_alias: str) -> Any:
    """The task with the priority, queue, run_after and backend this job was enqueued with.

    The task itself when they are its own (the usual case: no new ``Task`` is built and validated).
    """
    run_after = task_runner.parse_run_after(payload.get(task_runner.RUN_AFTER))
    if run_after is None:
        if (job.priority, job.queue, backend_alias) == (task.priority, task.queue_name, task.backend) \
                and task.run_after is None:
            return task
        return _variant(task, job.priority, job.queue, backend_alias)
    return _variant(task, job.priority, job.queue, backend_alias, run_after)


@functools.lru_cache(maxsize=256)
def _variant(task: Any, priority: int, queue_name: str, backend: str, run_after: Any = None) -> Any:
    """``task.using(...)``, built once per distinct set of options (tasks are immutable and hashable)."""
    changes: dict[str, Any] = {"priority": priority, "queue_name": queue_name, "backend": backend}
    if run_after is not None:
        changes["run_after"] = run_after
    try:
        return task.using(**changes)
    except Exception:  # e.g. an operator set a priority outside the framework's range
        return task


def _errors(job: Any, history: list[Any]) -> list[TaskError]:
    errors = [exception_entry(a.error) for a in history if a.error]
    if job.error and Status(job.status_id) in (Status.CANCELLED, Status.TERMINATED, Status.FAILED):
        if not history or history[-1].error != job.error:
            errors.append(exception_entry(job.error))
    return errors


def exception_entry(text: str) -> TaskError:
    """A ``TaskError`` from a stored error: the exception class is read from the traceback's last line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    path = FALLBACK_EXCEPTION
    if lines and "Traceback (most recent call last)" in text:
        match = _EXC_LINE.match(lines[-1])
        if match:
            path = match.group(1)
            if path == _EXITED:  # SystemExit & co. are wrapped by the runner: report the original class
                inner = _EXC_LINE.match(lines[-1].split(": ", 1)[1]) if ": " in lines[-1] else None
                path = inner.group(1) if inner else path
            if "." not in path:
                path = f"builtins.{path}"
    traceback = text if text.endswith("\n") else text + "\n"
    return TaskError(exception_class_path=path, traceback=traceback)
