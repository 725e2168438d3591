"""Prometheus metrics for the queue, read from the queue tables at scrape time (``pip install
django-sqlqueue[metrics]``). See docs/metrics.md for the metric names and Grafana-ready queries;
OpenTelemetry spans are tracing.py's.

Mount the view in the project's urls.py::

    from django_sqlqueue.metrics import metrics_view
    urlpatterns += [path("sqlqueue/metrics", metrics_view)]

It is protected: a scrape must carry ``Authorization: Bearer <settings.SQLQUEUE_METRICS_TOKEN>``, or
come from a logged-in user holding ``django_sqlqueue.view_job``; anything else is a 403 (and without a
token set, only such users get through).

Every metric is computed so that it stays cheap at millions of rows: no query counts finished jobs
(they are most of the table). Depth counts only unfinished statuses (a range of the status-led index);
finished / failed / retried jobs and the run-time histogram cover a recent window (``WINDOW_SECONDS``,
a range of the finished_at index, the histogram from at most ``HISTOGRAM_SAMPLE`` rows); workers come
from the worker table (one row per worker process). Each is a gauge of "now", not a process-lifetime
counter: the web process that serves the scrape did not run the jobs, and the database is the one
place that knows. Use them as gauges in PromQL (no ``rate()``; see docs/metrics.md).
"""

from __future__ import annotations

import hmac
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.utils import timezone

from ..states import CLAIMABLE, UNFINISHED, Status, sql_list

#: The recent window the finished / failed / retried gauges and the histogram cover.
WINDOW_SECONDS = 300
#: The most jobs the run-time histogram reads per scrape (newest finished first).
HISTOGRAM_SAMPLE = 10_000
#: Run-time histogram buckets, seconds.
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


def available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _authorized(request: HttpRequest) -> bool:
    token = getattr(settings, "SQLQUEUE_METRICS_TOKEN", None)
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), str(token).encode()):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff
                and user.has_perm("django_sqlqueue.view_job"))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text exposition of :class:`QueueCollector` (403 unless authorized)."""
    if not _authorized(request):
        return HttpResponseForbidden("sqlqueue metrics: a bearer token (SQLQUEUE_METRICS_TOKEN) or a staff "
                                     "user with django_sqlqueue.view_job is needed\n")
    if not available():
        return HttpResponse("prometheus_client is not installed: pip install django-sqlqueue[metrics]\n",
                            status=501, content_type="text/plain")
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(using=getattr(settings, "SQLQUEUE_METRICS_DATABASE", None)))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class QueueCollector:
    """A prometheus_client custom collector: every metric read from the database when scraped."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list[Any]:
        return []  # computed at collect time only (no database read at registration)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily

        from ..dialects.base import PROCESSING_INDEX
        from ..dialects.predicates import index_predicate
        from ..models import Job, JobType, Worker
        from .diagnose import unserved_due_work
        from .health import (
            STATUS_INDEX_KEYS,
            claim_priorities,
            count_through,
            dead_q,
            live_q,
            oldest_due,
            oldest_due_by_queue,
            orphaned_q,
            status_counts,
            waits_by_queue,
        )

        started = time.perf_counter()
        jobs = Job.objects.using(self.using) if self.using else Job.objects.all()
        db = jobs.db
        now = timezone.now()
        names = dict(JobType.objects.using(db).values_list("pk", "name"))

        depth = GaugeMetricFamily("sqlqueue_jobs", "Unfinished jobs by queue, type and status",
                                  labels=["queue", "type", "status"])
        rows = status_counts(jobs.filter(index_predicate(db, "status", f"IN ({sql_list(UNFINISHED)})")),
                             *STATUS_INDEX_KEYS)
        waiting, claimable_queues = set(), set()
        for status_id, type_id, queue, n in rows:
            depth.add_metric([queue, names.get(type_id, str(type_id)), Status(status_id).label], n)
            if status_id in (Status.PENDING, Status.ERROR, Status.PROCESSING):
                waiting.add((queue, type_id))
            if Status(status_id) in CLAIMABLE:
                claimable_queues.add(queue)
        yield depth

        priorities = claim_priorities(jobs)  # listed once for the oldest due job and each queue's
        oldest = oldest_due(Job, now, priorities) if not self.using else None
        age = GaugeMetricFamily("sqlqueue_oldest_due_age_seconds",
                                "Age of the oldest due Pending job (0 when none is due)")
        age.add_metric([], (now - oldest).total_seconds() if oldest else 0.0)
        yield age

        latency = GaugeMetricFamily("sqlqueue_queue_oldest_due_age_seconds",
                                    "Age of each queue's oldest due Pending or Error job (queues with one)",
                                    labels=["queue"])
        for queue, due in sorted(oldest_due_by_queue(jobs, now, claimable_queues, priorities).items()):
            latency.add_metric([queue], max(0.0, (now - due).total_seconds()))
        yield latency

        since = now - timedelta(seconds=WINDOW_SECONDS)
        wait = GaugeHistogramMetricFamily(
            "sqlqueue_job_wait_seconds",
            f"Queue wait (due to claim) of the jobs finished in the last {WINDOW_SECONDS} s, by queue",
            labels=["queue"])
        for queue, values in sorted(waits_by_queue(jobs, since, now, HISTOGRAM_SAMPLE).items()):
            cumulative = [(str(float(b)), float(sum(1 for v in values if v <= b))) for b in BUCKETS]
            cumulative.append(("+Inf", float(len(values))))
            wait.add_metric([queue], cumulative, gsum_value=sum(values))
        yield wait

        recent = GaugeMetricFamily(
            "sqlqueue_jobs_finished_recent",
            f"Jobs whose attempt ended in the last {WINDOW_SECONDS} s, by type and outcome "
            "(Completed, PartiallyCompleted, Error = will retry, Failed, Cancelled, Terminated)",
            labels=["type", "status"])
        counted = (jobs.filter(finished_at__gte=since, finished_at__lte=now).order_by()
                   .values("job_type_id", "status_id").annotate(n=Count("*"))
                   .values_list("job_type_id", "status_id", "n"))
        for type_id, status_id, n in counted:
            recent.add_metric([names.get(type_id, str(type_id)), Status(status_id).label], n)
        yield recent

        runtime = GaugeHistogramMetricFamily(
            "sqlqueue_job_run_seconds",
            f"Run time of the jobs finished in the last {WINDOW_SECONDS} s, by type", labels=["type"])
        durations: dict[int, list[float]] = defaultdict(list)
        for type_id, ms in (jobs.filter(finished_at__gte=since, finished_at__lte=now, duration_ms__isnull=False)
                            .order_by("-finished_at").values_list("job_type_id", "duration_ms")[:HISTOGRAM_SAMPLE]):
            durations[type_id].append(ms / 1000)
        for type_id, values in durations.items():
            cumulative = [(str(float(b)), float(sum(1 for v in values if v <= b))) for b in BUCKETS]
            cumulative.append(("+Inf", float(len(values))))
            runtime.add_metric([names.get(type_id, str(type_id))], cumulative, gsum_value=sum(values))
        yield runtime

        workers = GaugeMetricFamily("sqlqueue_workers", "Worker processes by state", labels=["state"])
        rows_w = Worker.objects.using(db)
        alive = rows_w.filter(live_q(now)).count()
        stopped = rows_w.filter(stopped_at__isnull=False).count()
        stale = rows_w.filter(dead_q(now), stopped_at__isnull=True).count()
        for state, n in (("alive", alive), ("stale", stale), ("stopped", stopped)):
            workers.add_metric([state], n)
        yield workers

        orphaned = GaugeMetricFamily("sqlqueue_orphaned_jobs",
                                     "Processing jobs whose worker is stopped or stale or whose lease expired")
        # through the Processing index (pinned on SQLite, whose planner without statistics took the
        # status index's range and each job's table row)
        orphaned.add_metric([], count_through(jobs.filter(orphaned_q(now, db)), PROCESSING_INDEX))
        yield orphaned

        unserved = GaugeMetricFamily("sqlqueue_unserved_due_jobs",
                                     "Due jobs of a queue and type no live worker serves", labels=["queue", "type"])
        for u in unserved_due_work(Job, now, pairs=waiting) if not self.using else []:
            unserved.add_metric([u.queue, u.type_name], u.jobs)
        yield unserved

        paused = GaugeMetricFamily("sqlqueue_queue_paused", "1 for each paused queue (queue_pause; the admin)",
                                   labels=["queue"])
        for queue in Job.objects.paused_queues(using=db):
            paused.add_metric([queue], 1.0)
        yield paused

        took = GaugeMetricFamily("sqlqueue_scrape_seconds", "Time this scrape's queries took")
        took.add_metric([], time.perf_counter() - started)
        yield took
