"""Admin pages beside the model admins: the queue dashboard (the actions' own pages, "Retry at…" and
the confirmation page, are in admin_actions.py).

The dashboard runs a handful of aggregate queries (GROUP BY over indexed columns, range scans over
indexed timestamps); Python only reshapes their few result rows. Nothing here loops over jobs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from ..dialects.base import CLAIM_INDEX, LIMITED_INDEX, PROCESSING_INDEX
from ..ops.health import (
    STATUS_INDEX_KEYS,
    claim_priorities,
    count_through,
    oldest_due,  # noqa: F401 (moved to ops.health, beside the metrics that read it too)
    oldest_due_by_queue,
    percentile,
    rows_through,
    status_counts,
    waits_by_queue,
)
from ..ops.rollup import DONE, FAILED, bucket_counts
from ..states import CLAIMABLE, FINISHED, Status
from .stamps import ago

if TYPE_CHECKING:
    from ..models import Job

#: Counts that could be large (overdue, lease expired) stop counting here and show "more than".
COUNT_CAP = 10_000
#: Due work nobody serves is counted up to this many jobs per queue and type ("> 1000"): the page warns,
#: the job list it links to counts the rest, and the metrics give the whole number.
UNSERVED_CAP = 1_000
#: The throughput chart: one bar pair per minute over this many minutes.
CHART_MINUTES = 60
#: Statuses drawn as "finished" and as "failed" in the chart (by the job's finished_at).


# ----- dashboard ----------------------------------------------------------------------------------
def dashboard_context(request: HttpRequest, modeladmin: Any) -> dict[str, Any]:
    """What the dashboard shows: counts by status per queue and type, the oldest due job, throughput,
    workers (the page, and the numbers its auto-refresh fetches)."""
    if not modeladmin.has_view_or_change_permission(request):
        raise PermissionDenied
    started = time.perf_counter()
    now = timezone.now()
    priorities = claim_priorities(modeladmin.model.objects.all())  # the oldest due job's walk, and each queue's
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Queue dashboard"),
        "opts": modeladmin.model._meta,
        "now": now,
        **status_tables(modeladmin.model),
        **backlog(modeladmin.model, now, priorities),
        "chart": throughput_chart(modeladmin.model, now),
        **workers(now),
        "media": modeladmin.media,
    }
    context.update(stuck_work(modeladmin.model, now, pairs=context.pop("waiting_pairs"),
                              types=context.pop("unpaused_types"), paused_queues=context.pop("paused_queues")))
    queue_latency(modeladmin.model, now, context["queue_rows"], context.pop("claimable_queues"), priorities)
    context["elapsed_ms"] = round((time.perf_counter() - started) * 1000, 1)
    context["values_shape"] = values_shape(context)
    return context


def dashboard_view(request: HttpRequest, modeladmin: Any) -> TemplateResponse:
    """One screen; its auto-refresh updates the numbers in place from :func:`dashboard_json_view`."""
    return TemplateResponse(request, "admin/django_sqlqueue/dashboard.html", dashboard_context(request, modeladmin))


def dashboard_json_view(request: HttpRequest, modeladmin: Any) -> JsonResponse:
    """The dashboard's numbers as ``{"values": {key: text}, "shape": ...}``: the page's auto-refresh puts
    each value into the element marked ``data-sqlqueue-value="key"``, and reloads the page when the shape
    (its rows: queues, types, unserved work, workers) changed."""
    context = dashboard_context(request, modeladmin)
    return JsonResponse({"values": dashboard_values(context), "shape": context["values_shape"]})


def values_shape(context: dict[str, Any]) -> str:
    """What rows the page has: when this changes, updating numbers in place is not enough."""
    parts = [[r["label"] for r in context["queue_rows"]], [str(r["label"]) for r in context["type_rows"]],
             [(u["queue"], u["type"]) for u in context.get("unserved") or []],
             [(w["worker"].name, w["stopped"], w["stale"], bool(w["orphaned"])) for w in context["workers"]],
             bool(context.get("stale_workers")), bool(context.get("oldest_due"))]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def dashboard_values(context: dict[str, Any]) -> dict[str, str]:
    """The numbers of the page by key, as the template writes them (see dashboard.html)."""
    capped = {k: ("> " if context.get(f"{k}_capped") else "") + str(context[k])
              for k in ("overdue", "lease_expired", "orphaned")}
    values = {"unfinished": str(context["unfinished"]), "grand_total": str(context["grand_total"]),
              "oldest_due": str(context.get("oldest_due_ago") or "—"), **capped,
              "active_workers": str(context["active_workers"]), "elapsed_ms": str(context["elapsed_ms"])}
    for s in context["statuses"]:
        values[f"status:{s['label']}"] = f"{s['label']}\xa0{s['total']}"
    for prefix, rows in (("queue", context["queue_rows"]), ("type", context["type_rows"])):
        for row in rows:
            key = f"{prefix}:{row['label']}"
            values[f"{key}:total"] = str(row["total"])
            for i, cell in enumerate(row["cells"]):
                values[f"{key}:{i}"] = str(cell["n"])
            if prefix == "queue":
                values[f"{key}:oldest_due"] = row["oldest_due"]
                values[f"{key}:wait"] = row["wait"]
    for u in context.get("unserved") or []:
        values[f"unserved:{u['queue']}:{u['type']}"] = ("> " if u["capped"] else "") + str(u["jobs"])
    for w in context["workers"]:
        values[f"worker:{w['worker'].name}:held"] = str(w["held"])
        values[f"worker:{w['worker'].name}:heartbeat"] = _("%(t)s ago") % {"t": w["heartbeat_ago"]}
        values[f"worker:{w['worker'].name}:done"] = str(w["worker"].jobs_done)
    return values


#: The dashboard's per-queue wait percentiles cover the jobs finished in this many seconds (as the metrics').
LATENCY_WINDOW_SECONDS = 300


def queue_latency(job_model: type[Job], now: datetime, queue_rows: list[dict[str, Any]],
                  claimable_queues: set[str] | None = None, priorities: list[int] | None = None) -> None:
    """Each queue row gets the age of its oldest due job and its wait p50 / p95 over the last 5 minutes."""
    jobs = job_model.objects.all()
    oldest = oldest_due_by_queue(jobs, now, claimable_queues, priorities)
    waits = waits_by_queue(jobs, now - timedelta(seconds=LATENCY_WINDOW_SECONDS), now)
    for row in queue_rows:
        queue = row["label"]
        row["oldest_due"] = ago(oldest[queue], now) if queue in oldest else ""
        row["wait"] = (f"{percentile(waits[queue], 50):.1f} s / {percentile(waits[queue], 95):.1f} s"
                       if queue in waits else "")


def changelist_url(**params: Any) -> str:
    """The job list pre-filtered: ``changelist_url(status=4, queue="emails")``."""
    url = reverse("admin:django_sqlqueue_job_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def status_tables(job_model: type[Job]) -> dict[str, Any]:
    """One GROUP BY (status, type, queue) query, pivoted into a per-queue and a per-type table.

    The (status, type, queue) index covers all three columns: an index-only scan, no table reads. The
    GROUP BY lists them in the index's order, so the rows arrive grouped and are counted as they stream
    (PostgreSQL before 17 does not reorder GROUP BY keys: in another order it hashes every row, about
    40 % slower at 1M jobs).
    """
    from ..models import JobType
    from ..states import human_label

    rows = status_counts(job_model.objects.all(), *STATUS_INDEX_KEYS)
    by_queue: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    by_type: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    totals: dict[int, int] = defaultdict(int)
    waiting, claimable_queues = set(), set()
    for status_id, type_id, queue, n in rows:
        if Status(status_id) in CLAIMABLE or status_id == Status.PROCESSING:
            waiting.add((queue, type_id))
        if Status(status_id) in CLAIMABLE:
            claimable_queues.add(queue)
        by_queue[queue][status_id] += n
        by_type[type_id][status_id] += n
        totals[status_id] += n
    type_rows = list(JobType.objects.values_list("pk", "name", "paused"))
    types = {pk: name for pk, name, _paused in type_rows}
    paused = {pk for pk, _name, is_paused in type_rows if is_paused}
    paused_queues = set(job_model.objects.paused_queues())
    statuses = list(Status)
    base = changelist_url()  # once: a reverse() per cell was a tenth of the page's Python time

    def cell_url(**params: Any) -> str:
        return f"{base}?{urlencode(params)}"

    def table(groups: dict[Any, dict[int, int]], key: str, label: Any) -> list[dict[str, Any]]:
        out = []
        for value, counts in groups.items():
            out.append({
                "label": label(value),
                "paused": value in (paused if key == "type" else paused_queues),
                "pause_url": (reverse("admin:django_sqlqueue_queuepause_change", args=[quote(value)])
                              if key == "queue" and value in paused_queues else ""),
                "url": cell_url(**{key: value}),
                "total": sum(counts.values()),
                "cells": [{"n": counts.get(int(s), 0), "url": cell_url(**{key: value, "status": int(s)})}
                          for s in statuses],
            })
        return sorted(out, key=lambda r: str(r["label"]))

    return {
        "statuses": [{"label": human_label(s), "css": s.label.lower(), "url": cell_url(status=int(s)),
                      "total": totals.get(int(s), 0)} for s in statuses],
        "grand_total": sum(totals.values()),
        "queue_rows": table(by_queue, "queue", str),
        "type_rows": table(by_type, "type", lambda pk: types.get(pk, f"#{pk}")),
        "unfinished": sum(n for s, n in totals.items() if Status(s) not in FINISHED),
        "waiting_pairs": waiting,
        # for stuck_work: what it would read again
        "unpaused_types": {pk: name for pk, name in types.items() if pk not in paused},
        "paused_queues": paused_queues,
        "claimable_queues": claimable_queues,
    }


def _capped_count(qs: QuerySet, index: str | None = None) -> tuple[int, bool]:
    """How many rows ``qs`` holds, up to :data:`COUNT_CAP` (and whether there are more); ``index``: the
    partial index whose rows these are, read through it where the dialect pins indexes (SQLite with no
    statistics took the status index's range and each row's table row instead)."""
    # no ORDER BY: the model's newest-first order would make the planner walk the primary key backwards
    # and filter, where any index of the predicate's rows answers the count
    n = count_through(qs.order_by(), index, COUNT_CAP)
    return min(n, COUNT_CAP), n > COUNT_CAP


def backlog(job_model: type[Job], now: datetime, priorities: list[int] | None = None) -> dict[str, Any]:
    """The oldest due Pending job's age, and how many jobs are overdue or hold an expired lease
    (``priorities``: the claim index's, when the caller has listed them)."""
    from ..dialects.predicates import (  # the partial indexes' own predicates, as literals
        claim_index_rows,
        lease_expired,
        limited_index_rows,
        overdue,
    )

    oldest = oldest_due(job_model, now, priorities)
    jobs = job_model.objects.all()
    # Overdue: the claim index's due rows plus the limited types' (not in it), each read through its own
    # partial index, never the whole table. With the status list alone no partial index matches, and the
    # planner walked the table until it had found 10,001 due rows (60-130 ms at 1M jobs over TDS on
    # Babelfish, against 3 ms through the claim index).
    # (The limited index also holds Processing jobs: overdue() keeps the claimable ones.)
    overdue_count = sum(count_through(jobs.filter(rows).order_by(), index, COUNT_CAP)
                        for rows, index in ((claim_index_rows(jobs.db) & Q(scheduled_for__lte=now), CLAIM_INDEX),
                                            (limited_index_rows(jobs.db) & overdue(jobs.db, now), LIMITED_INDEX)))
    overdue_count, overdue_capped = min(overdue_count, COUNT_CAP), overdue_count > COUNT_CAP
    expired, expired_capped = _capped_count(jobs.filter(lease_expired(jobs.db, now)), PROCESSING_INDEX)
    return {
        "oldest_due": oldest,
        "oldest_due_age": (now - oldest) if oldest else None,
        "oldest_due_ago": ago(oldest, now) if oldest else None,
        "oldest_due_url": changelist_url(status=int(Status.PENDING), overdue=1),
        "overdue": overdue_count, "overdue_capped": overdue_capped, "overdue_url": changelist_url(overdue=1),
        "lease_expired": expired, "lease_expired_capped": expired_capped,
        "lease_expired_url": changelist_url(lease_expired=1),
    }


def stuck_work(job_model: type[Job], now: datetime, pairs: Any = None, types: dict[int, str] | None = None,
               paused_queues: set[str] | None = None) -> dict[str, Any]:
    """Orphaned jobs (the claim would take them over) and due work no live worker serves.

    ``pairs``: the (queue, type) pairs holding waiting jobs, when the caller already counted them;
    ``types`` (the unpaused ones' names) and ``paused_queues``: when the caller already read them.
    """
    from ..ops.diagnose import unserved_due_work
    from ..ops.health import orphaned_q

    orphaned, orphaned_capped = _capped_count(job_model.objects.filter(orphaned_q(now, job_model.objects.db)),
                                              PROCESSING_INDEX)
    unserved = unserved_due_work(job_model, now, pairs=pairs, cap=UNSERVED_CAP, types=types,
                                 paused_queues=paused_queues)
    return {
        "orphaned": orphaned, "orphaned_capped": orphaned_capped, "orphaned_url": changelist_url(orphaned=1),
        "unserved": [{"queue": u.queue, "type": u.type_name, "jobs": u.jobs, "capped": u.capped,
                      "url": changelist_url(queue=u.queue, type=u.type_id)} for u in unserved],
    }


def throughput_chart(job_model: type[Job], now: datetime, minutes: int = CHART_MINUTES) -> dict[str, Any]:
    """Jobs finished and failed per minute over the last hour, laid out as SVG bar coordinates.

    Two GROUP BYs (finished, failed) over the hour's range of the finished_at index, bucketed per
    minute by the database (ops/rollup.py ``bucket_counts``). The template draws the bars from these
    numbers: no JavaScript, nothing fetched from elsewhere.
    """
    end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    start = end - timedelta(minutes=minutes)
    using = job_model.objects.all().db
    done = [0] * minutes
    failed = [0] * minutes
    for series, statuses in ((done, DONE), (failed, FAILED)):  # the throughput page's groups
        for minute, n in bucket_counts(using, "finished_at", start, end, timedelta(minutes=1), statuses):
            i = int((minute - start).total_seconds() // 60)
            if 0 <= i < minutes:
                series[i] += n
    peak = max([*done, *failed, 1])
    width, height, left, top = 600, 140, 40, 10
    plot_h = height - top - 20
    slot = (width - left) / minutes
    bars = []
    for i in range(minutes):
        label = timezone.localtime(start + timedelta(minutes=i)).strftime("%H:%M")
        h_done = round(done[i] / peak * plot_h, 1)
        h_failed = round(failed[i] / peak * plot_h, 1)
        x = round(left + i * slot, 1)
        bars.append({
            "x_done": x + 1, "x_failed": round(x + slot / 2, 1), "w": round(slot / 2 - 1, 1),
            "h_done": h_done, "y_done": round(top + plot_h - h_done, 1),
            "h_failed": h_failed, "y_failed": round(top + plot_h - h_failed, 1),
            "done": done[i], "failed": failed[i], "label": label,
        })
    return {
        "bars": bars, "width": width, "height": height, "left": left, "top": top, "plot_h": plot_h,
        # The middle gridline at a whole number of jobs ("659", not "659.5"); none when the peak is 1.
        "base_y": top + plot_h, "peak": peak, "mid": peak // 2,
        "mid_y": round(top + plot_h - (peak // 2) / peak * plot_h, 1),
        "total_done": sum(done), "total_failed": sum(failed), "minutes": minutes,
        "start_label": bars[0]["label"], "end_label": bars[-1]["label"], "label_y": height - 4,
        "right": width, "label_x": left - 4, "center_x": round(left + (width - left) / 2, 1),
        "center_label": bars[minutes // 2]["label"],
    }


#: Workers listed on the dashboard (the counts above the list cover every worker).
WORKER_LIST_LIMIT = 100


def workers(now: datetime, limit: int = WORKER_LIST_LIMIT) -> dict[str, Any]:
    """Workers not stopped -- stale ones and those holding orphaned jobs first -- and the counts of all.

    The counts come from the whole (small) worker table, never from the listed rows: 72 live workers
    are "72" even though the list shows ``limit`` of them. Stopped workers still holding Processing
    jobs are listed too, flagged: their jobs are orphaned until a claim or an operator requeues them.
    """
    from ..dialects.predicates import index_predicate
    from ..models import Job, Worker
    from ..ops.health import dead_after

    stale_before = now - dead_after()
    # Through the Processing partial index (lease_expires_at, worker), which covers the count: its
    # predicate as a literal, and the lease (every claim sets it) as the range it seeks; without that
    # range SQLite's planner walked the whole worker index for the GROUP BY (1.1 s at 1M jobs).
    processing = index_predicate(Job.objects.db, "status", f"= {int(Status.PROCESSING)}")
    held = dict(rows_through(Job.objects.filter(processing, lease_expires_at__isnull=False).order_by()
                             .values("worker").annotate(n=Count("*")).values_list("worker", "n"), PROCESSING_INDEX))
    running = Worker.objects.filter(stopped_at__isnull=True)
    counted = running.aggregate(active=Count("pk", filter=Q(last_heartbeat__gte=stale_before)),
                                stale=Count("pk", filter=Q(last_heartbeat__lt=stale_before)))
    active, stale = counted["active"], counted["stale"]
    holding_stopped = list(Worker.objects.filter(stopped_at__isnull=False, name__in=[n for n in held if n])
                           .order_by("-stopped_at")[:limit])
    rows = holding_stopped + list(running.order_by("last_heartbeat")[: max(0, limit - len(holding_stopped))])

    def entry(w: Any) -> dict[str, Any]:
        gone = w.stopped_at is not None or w.last_heartbeat < stale_before
        return {"worker": w, "stale": w.stopped_at is None and w.last_heartbeat < stale_before,
                "stopped": w.stopped_at is not None, "held": held.get(w.name, 0),
                "orphaned": held.get(w.name, 0) if gone else 0, "age": now - w.last_heartbeat,
                "heartbeat_ago": ago(w.last_heartbeat, now),
                "serves": _serves_label(w),
                "url": changelist_url(worker=w.name, status=int(Status.PROCESSING))}

    listed = sorted((entry(w) for w in rows), key=lambda e: (not e["orphaned"], not e["stale"], e["worker"].name))
    shown = len(listed)
    total = active + stale + len(holding_stopped)
    return {"workers": listed, "active_workers": active, "stale_workers": stale,
            "stopped_holding": len(holding_stopped), "processing": sum(held.values()),
            "workers_more": max(0, total - shown)}


def _serves_label(worker: Any) -> str:
    queues = ", ".join(worker.queues or []) or _("all queues")
    if worker.types == [""]:  # worker/serving.py SERVES_NONE: its code has no handler for any known type
        types = _("no types (no handler)")
    else:
        types = ", ".join(worker.types or []) or _("all types")
    return f"{queues} / {types}"
