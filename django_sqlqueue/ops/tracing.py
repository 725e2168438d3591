"""OpenTelemetry: a span around each enqueue and each job run, the run a child of the enqueuing trace.

Active only where ``opentelemetry-api`` is installed (``pip install "django-sqlqueue[tracing]"``) and the
application has set an SDK's tracer provider (with an exporter), as for any Python service. With the
API alone every span would be a no-op: nothing is started or stored, at the cost of a clock read per
enqueue and per run.

The trace context travels with the job: at enqueue the configured propagator (W3C ``traceparent`` /
``tracestate`` and baggage by default) injects the enqueue span's context into a text carrier, stored as
JSON in ``Job.trace_context``; the worker extracts it and starts the run span as that context's child,
current while the handler runs, so the handler's own spans (database, HTTP...) nest under it. A carrier
larger than the column (:data:`MAX_CARRIER_CHARS`, e.g. a huge baggage) is not stored: the run then
starts a trace of its own rather than failing the enqueue.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import Job

#: ``Job.trace_context``'s length.
MAX_CARRIER_CHARS = 2000
TRACER_NAME = "django_sqlqueue"


@cache
def _modules() -> Any:
    """The ``opentelemetry`` modules this needs, or None when the API is not installed (asked once)."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return trace, propagate


#: Whether a real tracer provider (an SDK) is set: once it is, it stays (OpenTelemetry sets it once per
#: process); until then it is asked again at most every :data:`RECHECK_SECONDS`, so that a process with
#: the API but no SDK pays a clock read per job, not a provider lookup.
_state = {"active": False, "checked_at": float("-inf")}
RECHECK_SECONDS = 1.0


def _api() -> Any:
    """The modules, when OpenTelemetry is installed AND an SDK's tracer provider is set; else None."""
    if _state["active"]:
        return _modules()
    now = time.monotonic()
    if now - _state["checked_at"] < RECHECK_SECONDS:
        return None
    _state["checked_at"] = now
    modules = _modules()
    if modules is None:
        return None
    trace = modules[0]
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None  # the API alone: every span would be a no-op
    _state["active"] = True
    return modules


def enabled() -> bool:
    """Whether enqueues and runs are traced (OpenTelemetry installed and an SDK configured)."""
    return _api() is not None


def recheck() -> None:
    """Look for a tracer provider at the next call (after one was set in this process, e.g. by a test)."""
    _state["checked_at"] = float("-inf")


@contextmanager
def enqueue_span(type_names: Sequence[str], count: int, queues: Sequence[str]) -> Iterator[str | None]:
    """A PRODUCER span ``sqlqueue.enqueue <type>`` around an enqueue; yields the carrier to store with
    each job (None when there is no recording trace to carry)."""
    api = _api()
    if api is None:
        yield None
        return
    trace, propagate = api
    names = sorted(set(type_names))
    name = names[0] if len(names) == 1 else "(several types)"
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"sqlqueue.enqueue {name}", kind=trace.SpanKind.PRODUCER,
        attributes={"messaging.system": "django_sqlqueue", "messaging.operation.type": "send",
                    "messaging.batch.message_count": count, "sqlqueue.types": names,
                    "sqlqueue.queues": sorted(set(queues))},
    ) as span:
        if not span.get_span_context().is_valid:
            yield None
            return
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        text = json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None
        yield text if text is not None and len(text) <= MAX_CARRIER_CHARS else None


@contextmanager
def run_span(job: Job, type_name: str, worker: str) -> Iterator[Any]:
    """A CONSUMER span ``sqlqueue.run <type>`` around a job's run, current while the handler runs, a
    child of the enqueuing trace when the job carries one. Yields the span (None without the API);
    :func:`end_run` records the outcome on it."""
    api = _api()
    if api is None:
        yield None
        return
    trace, _ = api
    parent = _parent(job)
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"sqlqueue.run {type_name}", context=parent, kind=trace.SpanKind.CONSUMER,
        attributes=_run_attributes(job, worker),
        # The runner classifies the handler's exceptions (a Retry is not a crash): end_run says.
        record_exception=False, set_status_on_exception=False,
    ) as span:
        yield span


def end_run(span: Any, outcome: str, error: str = "") -> None:
    """Record the run's outcome (``success``, ``retry``, ``cancel``, ``fatal``, ``error``) on its span."""
    if span is None:
        return
    trace, _ = _api()
    span.set_attribute("sqlqueue.outcome", outcome)
    if outcome in ("retry", "fatal", "error"):
        span.set_status(trace.Status(trace.StatusCode.ERROR, error[-200:]))


def record_timeout(job: Job, worker: str, seconds: float, error: str) -> None:
    """The run span of an attempt its supervisor killed for overrunning its timeout (the slot died
    inside its own span): written by the supervisor, ``seconds`` long, outcome ``timeout``, an error."""
    api = _api()
    if api is None:
        return
    trace, _ = api
    end_ns = time.time_ns()
    span = trace.get_tracer(TRACER_NAME).start_span(
        f"sqlqueue.run {job.job_type.name}", context=_parent(job), kind=trace.SpanKind.CONSUMER,
        start_time=end_ns - int(seconds * 1e9), attributes={**_run_attributes(job, worker), "sqlqueue.outcome": "timeout"})
    span.set_status(trace.Status(trace.StatusCode.ERROR, error[-200:]))
    span.end(end_time=end_ns)


def _run_attributes(job: Job, worker: str) -> dict[str, Any]:
    return {"messaging.system": "django_sqlqueue", "messaging.operation.type": "process",
            "sqlqueue.job.id": job.pk, "sqlqueue.queue": job.queue, "sqlqueue.attempt": job.attempt_num,
            "sqlqueue.worker": worker, "sqlqueue.step": job.step or ""}


def _parent(job: Job) -> Any:
    """The context the job's run spans are children of: the enqueuing trace's, or an empty one (a trace
    of its own, never a child of whatever span happens to be current in the worker)."""
    from opentelemetry.context import Context

    _, propagate = _modules()
    if job.trace_context:
        try:
            return propagate.extract(json.loads(job.trace_context), context=Context())
        except (ValueError, TypeError, AttributeError):
            pass  # a carrier that is not ours (edited by hand)
    return Context()
