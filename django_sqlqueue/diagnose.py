""""Why is this job not running?": the reasons a job is not being picked up, in plain words.

Used by ``manage.py queue_why <id>`` and the admin's job page. Every reason mirrors a condition of
the claim (dialects/base.py ``due_candidates`` and ``reclaim_candidates``), so what this says is what
the claim does.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from django.utils.timesince import timeuntil

from . import jobtypes
from .conf import get_settings
from .handlers import registry
from .models import Job, Worker
from .states import CLAIMABLE, FINISHED, Status


def why_not_running(job: Job) -> list[str]:
    """Reasons ``job`` is not claimable now; an empty list means a worker may claim it now."""
    using = job._state.db or get_settings().DATABASE
    info = jobtypes.get_type_by_id(job.job_type_id, using=using)
    now = timezone.now()
    reasons: list[str] = []
    state = job.state
    if state in FINISHED:
        return [f"it is {state.label}: finished, nothing more will happen unless an operator retries it"]
    if state is Status.PAUSED:
        reasons.append("it is Paused: resume it to make it claimable")
    if info.paused:
        reasons.append(f"its type {info.name!r} is paused: workers skip the whole type")
    max_attempts = job.max_attempts or info.max_attempts
    if job.attempt_num >= max_attempts:
        reasons.append(f"it has used all {max_attempts} attempts: the reaper will mark it Failed")
    if state in CLAIMABLE and job.scheduled_for > now:
        reasons.append(f"it is scheduled for {job.scheduled_for:%Y-%m-%d %H:%M:%S} UTC "
                       f"(in {timeuntil(job.scheduled_for, now)})")
    if state in CLAIMABLE and job.scheduled_for <= now and info.limited:
        from .permits import explain

        waiting = explain(job)  # "held by the concurrency limit of Export: 2 of 2 running"
        if waiting:
            reasons.append(waiting)
    if state is Status.PROCESSING:
        reasons.extend(_held(job, now))
    if not registry.is_registered(info.name):
        reasons.append(f"no handler for {info.name!r} is registered in this process: check the worker's "
                       f"INSTALLED_APPS / jobs.py (a worker without it sets the job aside with an error)")
    return reasons


def _held(job: Job, now) -> list[str]:  # type: ignore[no-untyped-def]
    worker = Worker.objects.using(job._state.db).filter(name=job.worker).first()
    dead_after = timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS)
    lease = job.lease_expires_at
    if worker is not None and (worker.stopped_at is not None or worker.last_heartbeat < now - dead_after):
        return [f"it is held by worker {job.worker!r}, which is gone (no heartbeat since "
                f"{worker.last_heartbeat:%H:%M:%S}): the next claim takes it over"]
    if lease is not None and lease < now:
        return [f"it is held by {job.worker!r}, whose lease expired at {lease:%H:%M:%S}: the next claim takes it over"]
    until = f" until {lease:%H:%M:%S} UTC (renewed while the worker lives)" if lease else ""
    return [f"it is running: held by worker {job.worker!r}{until}"]
