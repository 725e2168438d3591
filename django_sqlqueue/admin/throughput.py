"""Throughput: enqueued vs finished vs failed rates, queue wait and run time, over 1 h / 24 h / 7 d / 30 d.

What each number costs (docs/admin.md repeats this):

- rates: one GROUP BY per series over a range of an index -- ``enqueued_at`` (sqlqueue_job_enqueued)
  for enqueued, ``finished_at`` (sqlqueue_job_finished) for finished and failed -- bucketed by minute
  (1 h, 24 h) or hour (7 d, 30 d). The database reads every index entry in the window: O(jobs in the
  window), no table rows for enqueued on PostgreSQL (index-only), one per row for the finished series'
  status. The 7-day and 30-day windows read the hourly rollup (ops/rollup.py: one row per hour and
  type, kept past retention) up to its cursor, and the job table only after the cursor.
- queue wait (``started_at - scheduled_for``: from due to the claim of the attempt that finished) and
  run time per type (``duration_ms``): read for the newest :data:`SAMPLE_LIMIT` jobs finished in the
  window (a backward range scan of the finished_at index, stopped at the limit), percentiles in Python.
  The page says when it sampled.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.translation import gettext as _

from ..ops import rollup
from ..ops.health import percentile
from ..ops.rollup import DONE, FAILED

#: Jobs read (newest finished first) for the wait and run-time percentiles.
SAMPLE_LIMIT = 5_000


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    span: timedelta
    bucket: timedelta
    #: Counted from the hourly rollup (ops/rollup.py) where it has rows, the job table for the rest:
    #: the window reaches back past retention, and reads a few hundred rows instead of every job.
    rolled: bool = False

    @property
    def buckets(self) -> int:
        return int(self.span / self.bucket)


WINDOWS = {
    "1h": Window("1h", "1 hour", timedelta(hours=1), timedelta(minutes=1)),
    "24h": Window("24h", "24 hours", timedelta(hours=24), timedelta(minutes=15)),
    "7d": Window("7d", "7 days", timedelta(days=7), timedelta(hours=2), rolled=True),
    "30d": Window("30d", "30 days", timedelta(days=30), timedelta(hours=6), rolled=True),
}
SERIES = ("enqueued", "finished", "failed")


def rates(job_model: Any, now: datetime, window: Window) -> dict[str, Any]:
    """Rows per bucket of ``window`` for each series, ending with the current minute (hour, for windows
    bucketed by hours): one GROUP BY per series, counted per minute or hour and added up into buckets."""
    unit = timedelta(hours=1) if window.bucket >= timedelta(hours=1) else timedelta(minutes=1)
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    if unit == timedelta(hours=1):
        end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - window.span
    out: dict[str, Any] = {"start": start, **{k: [0] * window.buckets for k in SERIES}}

    def add(key: str, at: datetime, n: int) -> None:
        i = (at - start) // window.bucket
        if 0 <= i < window.buckets:
            out[key][i] += n

    using = job_model.objects.all().db
    live_from = start
    if window.rolled:
        counted, live_from = rollup.history(using, start, end, window.bucket)
        for key in SERIES:
            for at, n in counted[key].items():
                add(key, at, n)
    for key, field, statuses in (("enqueued", "enqueued_at", ()), ("finished", "finished_at", DONE),
                                 ("failed", "finished_at", FAILED)):
        for at, n in rollup.bucket_counts(using, field, live_from, end, unit, statuses):
            add(key, at, n)
    out["rolled_until"] = live_from if live_from > start else None
    return out


def waits_and_runtimes(job_model: Any, now: datetime, window: Window) -> dict[str, Any]:
    from ..models import JobType

    rows = list(job_model.objects.filter(finished_at__gte=now - window.span, finished_at__lte=now,
                                         started_at__isnull=False)
                .order_by("-finished_at")
                .values_list("job_type_id", "queue", "scheduled_for", "started_at", "duration_ms")
                [: SAMPLE_LIMIT + 1])
    sampled = len(rows) > SAMPLE_LIMIT
    rows = rows[:SAMPLE_LIMIT]
    waits: dict[str, list[float]] = defaultdict(list)
    per_type: dict[int, list[float]] = defaultdict(list)
    for type_id, queue, due, started, ms in rows:
        if due and started:
            waits[queue].append(max(0.0, (started - due).total_seconds()))
        if ms is not None:
            per_type[type_id].append(ms / 1000)
    names = dict(JobType.objects.values_list("pk", "name"))
    runtime = sorted(({"type": names.get(t, f"#{t}"), "n": len(v), "p50": percentile(v, 50),
                       "p95": percentile(v, 95), "max": max(v)} for t, v in per_type.items()),
                     key=lambda r: -r["n"])
    every = [w for v in waits.values() for w in v]
    by_queue = [{"queue": q, "n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95), "max": max(v)}
                for q, v in sorted(waits.items())]
    return {"wait_p50": percentile(every, 50), "wait_p95": percentile(every, 95), "wait_n": len(every),
            "wait_by_queue": by_queue, "runtime": runtime, "sampled": sampled, "sample_limit": SAMPLE_LIMIT}


def chart(series: dict[str, list[int]], window: Window) -> dict[str, Any]:
    """SVG polylines on a log scale (log10(1 + n)): one burst does not flatten the rest."""
    width, height, left, top, bottom = 720, 180, 44, 10, 22
    plot_h = height - top - bottom
    n = window.buckets
    peak = max([1, *series["enqueued"], *series["finished"], *series["failed"]])
    top_log = math.log10(1 + peak)

    def y(v: int) -> float:
        return round(top + plot_h - (math.log10(1 + v) / top_log) * plot_h, 1)

    def points(values: list[int]) -> str:
        step = (width - left) / max(1, n - 1)
        return " ".join(f"{round(left + i * step, 1)},{y(v)}" for i, v in enumerate(values))

    ticks = [t for t in (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000) if t <= peak] or [1]
    start = series["start"]  # type: ignore[index]
    return {
        "width": width, "height": height, "left": left, "base_y": top + plot_h, "right": width,
        "enqueued": points(series["enqueued"]), "finished": points(series["finished"]),
        "failed": points(series["failed"]),
        "ticks": [{"label": f"{t:,}", "y": y(t)} for t in ticks],
        "start_label": timezone.localtime(start).strftime("%Y-%m-%d %H:%M %Z"),  # type: ignore[arg-type]
        "end_label": timezone.localtime(start + window.span).strftime("%Y-%m-%d %H:%M %Z"),  # type: ignore[operator]
        "label_y": height - 6,
        "totals": {k: sum(series[k]) for k in ("enqueued", "finished", "failed")},
        "per_minute": {k: round(sum(series[k]) / (window.span.total_seconds() / 60), 2)
                       for k in ("enqueued", "finished", "failed")},
    }


def throughput_view(request: HttpRequest, modeladmin: Any) -> TemplateResponse:
    if not modeladmin.has_view_or_change_permission(request):
        raise PermissionDenied
    window = WINDOWS.get(request.GET.get("window", "1h"), WINDOWS["1h"])
    started = time.perf_counter()
    now = timezone.now()
    series = rates(modeladmin.model, now, window)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Throughput"), "opts": modeladmin.model._meta, "window": window, "windows": WINDOWS.values(),
        "chart": chart(series, window), "rolled_until": series["rolled_until"],
        **waits_and_runtimes(modeladmin.model, now, window),
        "media": modeladmin.media,
    }
    context["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return TemplateResponse(request, "admin/django_sqlqueue/throughput.html", context)
