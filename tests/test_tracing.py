"""OpenTelemetry: an enqueue span whose context the job carries, and a run span that is its child and
is current while the handler runs (django_sqlqueue/tracing.py), with a real SDK and an in-memory
exporter, on the test session's database."""

from __future__ import annotations

import json

import pytest

from django_sqlqueue.models import Job
from django_sqlqueue.ops import tracing
from django_sqlqueue.states import Status
from tests import workerutil as wu

sdk = pytest.importorskip("opentelemetry.sdk.trace")
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

_EXPORTER = InMemorySpanExporter()


_INSTALLED: list[bool] = []


@pytest.fixture
def spans():
    """The finished spans of this test (the global tracer provider can be set once per process)."""
    if not _INSTALLED:
        if not isinstance(trace.get_tracer_provider(), sdk.TracerProvider):
            trace.set_tracer_provider(sdk.TracerProvider())
        provider = trace.get_tracer_provider()
        if not isinstance(provider, sdk.TracerProvider):
            pytest.skip("another kind of tracer provider was set in this process")
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        _INSTALLED.append(True)
    tracing.recheck()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _by_name(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_the_run_is_a_child_of_the_enqueuing_request_and_current_in_the_handler(spans) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /signup") as request:
        job = Job.objects.enqueue("test.TraceIds", {})
    request_ctx = request.get_span_context()
    [enqueue] = _by_name(spans, "sqlqueue.enqueue")
    assert enqueue.name == "sqlqueue.enqueue test.TraceIds" and enqueue.kind == trace.SpanKind.PRODUCER
    assert enqueue.parent.span_id == request_ctx.span_id
    # The job carries the enqueue span's context (W3C traceparent by default).
    carrier = json.loads(Job.objects.get(pk=job.pk).trace_context)
    assert carrier["traceparent"].startswith(f"00-{request_ctx.trace_id:032x}-{enqueue.context.span_id:016x}-")

    wu.run_worker()
    job.refresh()
    assert job.state == Status.COMPLETED
    [run] = _by_name(spans, "sqlqueue.run")
    assert run.name == "sqlqueue.run test.TraceIds" and run.kind == trace.SpanKind.CONSUMER
    assert run.context.trace_id == request_ctx.trace_id and run.parent.span_id == enqueue.context.span_id
    assert run.attributes["sqlqueue.job.id"] == job.pk and run.attributes["sqlqueue.outcome"] == "success"
    assert run.attributes["sqlqueue.attempt"] == 1 and run.attributes["sqlqueue.worker"].startswith("inproc")
    # The run span was current while the handler ran: the handler's own spans nest under it.
    assert job.response == {"trace_id": f"{run.context.trace_id:032x}", "span_id": f"{run.context.span_id:016x}"}
    assert run.status.status_code == trace.StatusCode.UNSET


def test_a_failed_attempt_is_an_error_span_and_a_retry_keeps_the_trace(spans) -> None:
    with trace.get_tracer("test").start_as_current_span("cron"):
        job = Job.objects.enqueue("test.FailTimes", {"times": 1})
    from tests.test_worker_run import set_type

    set_type("test.FailTimes", backoff_base_seconds=0.05)
    wu.run_worker(wait_due=5)
    job.refresh()
    assert job.state == Status.COMPLETED and job.attempt_num == 2
    runs = sorted(_by_name(spans, "sqlqueue.run"), key=lambda s: s.attributes["sqlqueue.attempt"])
    assert [s.attributes["sqlqueue.outcome"] for s in runs] == ["error", "success"]
    assert runs[0].status.status_code == trace.StatusCode.ERROR
    assert "planned failure in attempt 1" in runs[0].status.description
    [enqueue] = _by_name(spans, "sqlqueue.enqueue")
    assert {s.parent.span_id for s in runs} == {enqueue.context.span_id}  # both attempts in the one trace


def test_one_enqueue_span_for_a_bulk_enqueue(spans) -> None:
    from django_sqlqueue import JobSpec

    jobs = Job.objects.enqueue_many([JobSpec("test.Noop", {}), JobSpec("test.Echo", {}, queue="other")])
    [enqueue] = _by_name(spans, "sqlqueue.enqueue")
    assert enqueue.name == "sqlqueue.enqueue (several types)"
    assert enqueue.attributes["messaging.batch.message_count"] == 2
    assert list(enqueue.attributes["sqlqueue.queues"]) == ["default", "other"]
    stored = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("trace_context", flat=True))
    assert len(stored) == 1 and f"{enqueue.context.span_id:016x}" in stored.pop()


def test_a_carrier_that_is_not_ours_starts_a_trace_of_its_own(spans) -> None:
    job = Job.objects.enqueue("test.TraceIds", {})
    Job.objects.filter(pk=job.pk).update(trace_context="not json {")
    wu.run_worker()
    job.refresh()
    assert job.state == Status.COMPLETED
    [run] = _by_name(spans, "sqlqueue.run")
    assert run.parent is None and job.response["trace_id"] == f"{run.context.trace_id:032x}"


def test_a_job_without_a_carrier_runs_in_a_trace_of_its_own(spans) -> None:
    """Rows written before migration 0010 (or by an old worker during a rolling deploy) carry NULL."""
    job = Job.objects.enqueue("test.Noop", {})
    Job.objects.filter(pk=job.pk).update(trace_context=None)
    with trace.get_tracer("test").start_as_current_span("whatever is current in the worker"):
        wu.run_worker()  # the run is not made a child of it
    job.refresh()
    assert job.state == Status.COMPLETED
    [run] = _by_name(spans, "sqlqueue.run")
    assert run.parent is None


def test_with_the_api_alone_nothing_is_traced_or_stored(spans, monkeypatch) -> None:
    """No SDK configured (the API's proxy provider): no span is started and the job carries nothing."""
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    monkeypatch.setitem(tracing._state, "active", False)
    tracing.recheck()
    assert not tracing.enabled()
    with trace.get_tracer("test").start_as_current_span("request"):
        job = Job.objects.enqueue("test.Noop", {})
    assert Job.objects.get(pk=job.pk).trace_context is None
    assert [s.name for s in spans.get_finished_spans()] == ["request"]


def test_a_run_killed_for_its_timeout_gets_its_span_from_the_supervisor(spans) -> None:
    """The slot dies inside its run span; the supervisor, recording the timeout, writes the span."""
    with trace.get_tracer("test").start_as_current_span("request") as request:
        job = Job.objects.enqueue("test.Noop", {})
    job = Job.objects.get(pk=job.pk)
    tracing.record_timeout(job, "w/0", 2.5, "timed out after 2 s (worker w/0 was killed)")
    [run] = _by_name(spans, "sqlqueue.run")
    [enqueue] = _by_name(spans, "sqlqueue.enqueue")
    assert run.context.trace_id == request.get_span_context().trace_id and run.parent.span_id == enqueue.context.span_id
    assert run.attributes["sqlqueue.outcome"] == "timeout" and run.status.status_code == trace.StatusCode.ERROR
    assert 2.4e9 < run.end_time - run.start_time < 2.6e9
