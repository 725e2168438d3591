"""Who serves what: live workers, which queues and types they serve, orphaned jobs -- the facts
:mod:`.diagnose` (the one answer to "why is this job not running") and the admin's lists build on.

Each mirrors the claim
(``dialects/base.py`` ``reclaim_candidates``): a worker is live when it has not stopped and its
heartbeat is younger than ``WORKER_DEAD_AFTER_SECONDS``; it serves a queue / type when its row lists
it (``Worker.queues`` / ``Worker.types``, empty meaning all); a Processing job is taken over by the
next claim when its lease expired or its worker is stopped or stale -- but only by a live worker that
serves its queue and type. The worker table holds one row per worker process (small): it is read
whole and matched in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet

from ..conf import get_settings
from ..dialects.predicates import index_predicate
from ..states import Status

if TYPE_CHECKING:
    from ..models import Job, Worker


def dead_after() -> timedelta:
    return timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS)


def live_q(now: datetime) -> Q:
    """Workers not stopped whose heartbeat is recent: the claim's notion of alive."""
    return Q(stopped_at__isnull=True, last_heartbeat__gte=now - dead_after())


def dead_q(now: datetime) -> Q:
    """Stopped, or heartbeat stale: the claim takes their jobs over."""
    return Q(stopped_at__isnull=False) | Q(last_heartbeat__lt=now - dead_after())


def serves(worker: Worker, queue: str, type_name: str) -> bool:
    """Whether ``worker`` claims jobs of this queue and type (an empty list means all)."""
    queues, types = worker.queues or [], worker.types or []
    return (not queues or queue in queues) and (not types or type_name in types)


def live_workers(now: datetime, using: str | None = None) -> list[Worker]:
    from ..models import Worker

    return list(Worker.objects.using(using).filter(live_q(now)).only("name", "queues", "types"))


def orphaned_q(now: datetime, using: str = "default") -> Q:
    """Processing jobs the claim would take over: lease expired, or held by a stopped / stale worker.

    The status test is the partial Processing index's own literal predicate (SQL Server matches a
    filtered index only on a literal), so this reads that index's few rows, never the job table.
    """
    from ..models import Worker

    processing = index_predicate(using, "status", f"= {int(Status.PROCESSING)}")
    dead_names = Worker.objects.using(using).filter(dead_q(now)).values("name")
    return processing & (Q(lease_expires_at__lt=now) | Q(worker__in=dead_names))


@dataclass
class Holder:
    """The worker named on a Processing job, as the claim sees it."""

    state: str  # "alive", "stopped", "stale", "missing"
    worker: Worker | None


def holder_of(job: Job, now: datetime) -> Holder:
    from ..models import Worker

    worker = Worker.objects.using(job._state.db).filter(name=job.worker).first() if job.worker else None
    if worker is None:
        return Holder("missing", None)
    if worker.stopped_at is not None:
        return Holder("stopped", worker)
    if worker.last_heartbeat < now - dead_after():
        return Holder("stale", worker)
    return Holder("alive", worker)


def is_orphan(job: Job, now: datetime, holder: Holder | None = None) -> bool:
    """The claim would take this Processing job over (see :func:`orphaned_q`)."""
    if job.status_id != Status.PROCESSING:
        return False
    if job.lease_expires_at is not None and job.lease_expires_at < now:
        return True
    holder = holder or holder_of(job, now)
    return holder.state in ("stopped", "stale")


def orphans(job_model: type[Job], now: datetime) -> QuerySet:
    return job_model.objects.filter(orphaned_q(now, job_model.objects.db))
