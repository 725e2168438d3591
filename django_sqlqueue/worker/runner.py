"""Running one job's handler: the context a handler receives, and what it may raise.

A handler is called with a :class:`JobContext` (and, for a multi-step handler, the step name)::

    @sqlqueue.handler("SendEmail")
    def send_email(job):                      # job is a JobContext
        row = job.subtype(EmailChannel)       # a subtype row of this job, or None
        if not mail_server_up():
            raise sqlqueue.Retry(delay=60, reason="mail server down")
        if row.email_to.endswith(".invalid"):
            raise sqlqueue.Cancel("bad address")
        return {"sent": True}                 # stored as the job's response (must be JSON)

The context reads through to the :class:`~django_sqlqueue.models.Job` row (``job.payload``,
``job.pk``, ``job.attempt_num`` ...). This module decides the :class:`Outcome` of one run and never
writes to the queue itself, except :meth:`JobContext` step advances of multi-step handlers, which
must be persisted before the next step starts. The worker records the outcome.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Any, NoReturn

from django.utils import timezone

from ..exceptions import InvalidPayload, SqlQueueError
from ..ops import tracing

if TYPE_CHECKING:
    from ..handlers import Handler
    from ..models import Job, JobData


class Retry(SqlQueueError):
    """The handler asked for this job to be retried later."""

    def __init__(self, reason: str = "", *, delay: float | timedelta | None = None,
                 at: datetime | None = None) -> None:
        """Retry after ``delay`` seconds, or at ``at`` (timezone-aware); neither: the type's backoff.

        The attempt counts: when the job has no attempts left it becomes Failed instead.
        """
        if delay is not None and at is not None:
            raise ValueError("give delay or at, not both")
        if at is not None:  # aware and within a century (InvalidArgument is a ValueError)
            from ..bounds import check_when

            check_when(at, "at")
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None:
            from ..queue import MAX_DELAY_SECONDS, finite_seconds

            if not finite_seconds(delay):
                raise ValueError(f"delay must be a non-negative number of seconds up to {MAX_DELAY_SECONDS}, got {delay!r}")
        self.reason = reason
        self.delay = delay
        self.at = at
        super().__init__(f"retry requested{': ' + reason if reason else ''}")

    def retry_in(self) -> float | None:
        """Seconds from now, or None for the type's backoff."""
        if self.at is not None:
            return max(0.0, (self.at - timezone.now()).total_seconds())
        return self.delay


class Cancel(SqlQueueError):
    """The handler cancelled this job; it will not be retried."""

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(f"cancelled{': ' + reason if reason else ''}")


class Fail(SqlQueueError):
    """The job cannot succeed by being run again: it becomes Failed now, whatever attempts it has left.

    Raise it from a handler for a permanent error (a record that no longer exists, input that will
    never validate); the message is stored as the job's error. The worker raises subclasses of it
    itself for a return value it cannot store and an unknown step.
    """

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(reason or "failed by its handler")


class Kind(Enum):
    SUCCESS = "success"
    ERROR = "error"  # an exception: Error (retried with backoff) or Failed when attempts are exhausted
    RETRY = "retry"  # explicit Retry: like ERROR, at the time the handler asked for
    CANCEL = "cancel"
    FATAL = "fatal"  # cannot succeed by retrying (Fail, bad return value, unknown step): Failed at once


@dataclass
class Outcome:
    kind: Kind
    job: Job  # the row as last written (a step advance bumps its token)
    response: Any = None
    error: str = ""
    retry_in: float | None = None
    duration: float = 0.0


@cache
def _subtype_models() -> tuple[type[JobData], ...]:
    from django.apps import apps

    from ..models import JobData

    return tuple(m for m in apps.get_models() if issubclass(m, JobData))


class JobContext:
    """What a handler receives: the job row plus helpers. Unknown attributes read through to the Job."""

    def __init__(self, job: Job, handler: Handler, worker: str,
                 stop_requested: Callable[[], bool] | None = None,
                 cancel_request: Callable[[], Any] | None = None) -> None:
        self.job = job
        self.handler = handler
        self.worker = worker
        #: The step being run ("" for a handler without steps).
        self.step = ""
        #: Multi-step handlers: each finished step's return value, by step name (kept across retries).
        self.results: dict[str, Any] = {}
        self._stop_requested = stop_requested
        self._cancel_request = cancel_request
        self._subtypes: list[JobData] | None = None

    def __getattr__(self, name: str) -> Any:
        # Only called for names not found on the context: payload, pk, attempt_num, queue, ...
        return getattr(self.__dict__["job"], name)

    def __repr__(self) -> str:
        return f"<JobContext {self.handler.name}#{self.job.pk} attempt {self.job.attempt_num}>"

    @property
    def type_name(self) -> str:
        return self.handler.name

    @property
    def subtypes(self) -> list[JobData]:
        """Every subtype row of this job (exclusive ones of its type, inclusive ones), read once."""
        if self._subtypes is None:
            rows: list[JobData] = []
            db = self.job._state.db
            for model in _subtype_models():
                if model.job_type_name not in (None, self.handler.name):
                    continue
                rows.extend(model._default_manager.using(db).filter(job_id=self.job.pk))
            self._subtypes = rows
        return self._subtypes

    def subtype(self, model: type[JobData]) -> JobData | None:
        """This job's row in subtype table ``model``, or None."""
        return next((r for r in self.subtypes if isinstance(r, model)), None)

    @property
    def cancelled(self) -> bool:
        """True once someone asked to cancel this run (``Job.objects.cancel``, the admin's Cancel).

        A long handler checks it (or :meth:`should_stop`) between units of work and stops, e.g. with
        ``job.cancel()``: the job ends Cancelled (whatever the handler raises; a handler that returns
        successfully instead completes it, the cancel came too late). Under ``run_queue_worker`` a
        handler that does not stop within the grace period has its slot process killed.
        """
        return self._cancel_request is not None and self._cancel_request() is not None

    @property
    def cancel_request(self) -> Any:
        """The :class:`~django_sqlqueue.models.CancelRequest` (who asked, when, why), or None."""
        return None if self._cancel_request is None else self._cancel_request()

    def should_stop(self) -> bool:
        """True once this run should end: the job was cancelled (:attr:`cancelled`), the worker is shutting down, or this job's lease is at risk
        (the slot's heartbeat has not been written for most of the lease, or a renewal found the job
        taken over), so another worker may soon run it. A long handler checks it between units of work
        and stops early (and Retry); the supervisor kills a slot whose lease is lost anyway."""
        return self._stop_requested is not None and self._stop_requested()

    def retry(self, reason: str = "", *, delay: float | timedelta | None = None,
              at: datetime | None = None) -> NoReturn:
        raise Retry(reason, delay=delay, at=at)

    def cancel(self, reason: str = "") -> NoReturn:
        raise Cancel(reason)

    def fail(self, reason: str = "") -> NoReturn:
        raise Fail(reason)


class _BadReturn(Fail, InvalidPayload):
    """The handler returned a value that cannot be stored as JSON."""


def _check_json(value: Any, what: str) -> None:
    if value is None or value is True or value is False or (type(value) is int and -2**63 <= value < 2**63):
        return  # JSON as they are, and small: most handlers return None (a huge int is still checked)
    from ..bounds import response_too_large
    from ..queue import unstorable

    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _BadReturn(
            f"{what} cannot be stored as JSON ({type(exc).__name__}: {exc}); the handler's work is done, "
            f"so the job is not retried"
        ) from exc
    why = unstorable(value) or response_too_large(text)
    if why:
        raise _BadReturn(f"{what} cannot be stored: {why}; the handler's work is done, so the job is not retried")


def _atomic_depths() -> dict[str, int]:
    from django.db import connections

    return {conn.alias: len(conn.atomic_blocks) for conn in connections.all(initialized_only=True)}


def _close_abandoned_atomics(before: dict[str, int]) -> list[str]:
    """Roll back ``transaction.atomic()`` blocks a handler entered and never left; return the aliases.

    Such a block (``atomic().__enter__()`` without its exit, a generator left suspended inside one)
    keeps the connection in a transaction: the worker's own writes would then join it and vanish
    when the connection is dropped. Each leftover block is exited as if an exception had left it,
    innermost first, which is exactly Django's rollback (to its savepoint, or of the transaction).
    """
    from django.db import connections

    left = []
    for conn in connections.all(initialized_only=True):
        depth = before.get(conn.alias, 0)
        if len(conn.atomic_blocks) <= depth:
            continue
        left.append(conn.alias)
        while len(conn.atomic_blocks) > depth:
            block = conn.atomic_blocks[-1]
            try:
                block.__exit__(RuntimeError, RuntimeError("atomic block left open by a job handler"), None)
            except Exception:  # the rollback itself failed: drop the connection, it is unusable
                conn.atomic_blocks.clear()
                conn.savepoint_ids.clear()
                conn.in_atomic_block = False
                conn.needs_rollback = False
                conn.close()
                break
    return left


def run(ctx: JobContext) -> Outcome:
    """Call the handler (once, or once per remaining step) and classify what happened.

    With OpenTelemetry installed, inside a run span that is current while the handler runs (tracing.py).
    """
    if not tracing.enabled():
        return _run(ctx)
    with tracing.run_span(ctx.job, ctx.handler.name, ctx.worker) as span:
        outcome = _run(ctx)
        tracing.end_run(span, outcome.kind.value, outcome.error or "")
    return outcome


def _run(ctx: JobContext) -> Outcome:
    from ..models import Job

    started = time.monotonic()
    depths = _atomic_depths()
    try:
        if ctx.handler.steps:
            response = _run_steps(ctx, Job)
        else:
            response = ctx.handler.func(ctx)
            _check_json(response, "the handler's return value")
        outcome = Outcome(Kind.SUCCESS, ctx.job, response=response)
    except Retry as exc:
        outcome = Outcome(Kind.RETRY, ctx.job, error=str(exc), retry_in=exc.retry_in())
    except Cancel as exc:
        outcome = Outcome(Kind.CANCEL, ctx.job, error=exc.reason or "cancelled by its handler")
    except Fail as exc:  # retrying cannot help (the handler says so, or its result cannot be stored)
        outcome = Outcome(Kind.FATAL, ctx.job, error=str(exc))
    except BaseException:  # the handler's failure is the job's, never the worker's
        # BaseException too: asyncio.CancelledError, SystemExit, GeneratorExit and KeyboardInterrupt raised
        # inside a handler are its failures. The worker's own SIGINT handling only sets a flag (slots
        # ignore SIGINT until it is installed), so a KeyboardInterrupt here was raised by the handler's code:
        # letting it kill the slot left the job Processing, its attempt unrecorded.
        outcome = Outcome(Kind.ERROR, ctx.job, error=traceback.format_exc())
    left = _close_abandoned_atomics(depths)
    if left:
        outcome = Outcome(Kind.ERROR, ctx.job, error=(
            f"the handler returned with transaction.atomic() still open on database(s) {', '.join(left)}: "
            f"its uncommitted work there was rolled back (leave every atomic block, e.g. use it as a "
            f"'with' block)" + (f"\n{outcome.error}" if outcome.error else "")))
    outcome.duration = time.monotonic() - started
    return outcome


class _UnknownStep(Fail):
    """The job's stored step is not one of its handler's steps."""


def _run_steps(ctx: JobContext, job_model: Any) -> dict[str, Any]:
    steps = ctx.handler.steps
    current = ctx.job.step or steps[0]
    if current not in steps:
        raise _UnknownStep(
            f"job is at step {current!r}, which handler {ctx.handler.name!r} does not have "
            f"(its steps: {', '.join(steps)})"
        )
    if ctx.job.step and isinstance(ctx.job.response, dict):
        # Resuming: the steps before this one are done; their results were stored with the step.
        ctx.results = {k: v for k, v in ctx.job.response.items() if k in steps[: steps.index(current)]}
    for step in steps[steps.index(current):]:
        if step != ctx.job.step and step != steps[0]:
            # Persist "reached this step" (and the results so far) before running it, so that a
            # retry resumes here and never re-runs a finished step.
            ctx.job = job_model.objects.advance_step(ctx.job, step, response=ctx.results)
        ctx.step = step
        value = ctx.handler.func(ctx, step)
        _check_json(value, f"step {step!r}'s return value")
        ctx.results[step] = value
    return ctx.results
