""""Why is this job not running?": the reasons a job is not being picked up, in plain words.

Used by ``manage.py queue_why <id>`` and the admin's job page. Every reason mirrors a condition of
the claim (dialects/base.py ``due_candidates`` and ``reclaim_candidates``), so what this says is what
the claim does.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from django.utils.timesince import timeuntil

from .. import jobtypes
from ..conf import get_settings
from ..handlers import registry
from ..models import Job, Worker
from ..states import CLAIMABLE, FINISHED, Status


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
    if state is Status.WAITING:
        reasons.extend(waiting_reasons(job))
    if info.paused:
        reasons.append(f"its type {info.name!r} is paused: workers skip the whole type")
    max_attempts = job.max_attempts or info.max_attempts
    if job.attempt_num >= max_attempts:
        reasons.append(f"it has used all {max_attempts} attempts: the reaper will mark it Failed")
    if state in CLAIMABLE and job.scheduled_for > now:
        reasons.append(f"it is scheduled for {job.scheduled_for:%Y-%m-%d %H:%M:%S} UTC "
                       f"(in {timeuntil(job.scheduled_for, now)})")
    if state in CLAIMABLE and job.scheduled_for <= now and info.limited:
        from ..limits import explain

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
    reasons = [f"it is running: held by worker {job.worker!r}{until}"]
    request = Job.objects.cancel_request_for(job.pk, job.attempt_num, using=job._state.db)
    if request is not None:
        reasons.append(f"a cancel was requested at {request.requested_at:%H:%M:%S} UTC by "
                       f"{request.requested_by or 'an unnamed caller'}: its worker stops it (within "
                       f"CANCEL_CHECK_SECONDS + CANCEL_GRACE_SECONDS), or it completes first")
    return reasons


#: Dependencies named one by one in :func:`waiting_reasons`; the rest are counted.
NAMED_DEPENDENCIES = 10


def waiting_reasons(job: Job) -> list[str]:
    """Why a Waiting job waits: each unfinished dependency, with its status and, when one is running,
    the worker that holds it ("waits for job 12 (Processing on host-a/2)")."""
    from ..models import JobDependency
    from ..states import UNFINISHED

    deps = JobDependency.objects.using(job._state.db).filter(job_id=job.pk)
    pending = deps.filter(depends_on__status_id__in=sorted(UNFINISHED)).order_by("depends_on_id")
    rows = list(pending.values_list("depends_on_id", "depends_on__status_id", "depends_on__worker")
                [:NAMED_DEPENDENCIES + 1])
    if not rows:
        return ["it is Waiting, but every job it waits for has finished: the next release or the "
                "supervisor's periodic look (every 30 s) moves it on"]
    out = []
    for dep_id, status, worker in rows[:NAMED_DEPENDENCIES]:
        where = f" on {worker}" if status == Status.PROCESSING and worker else ""
        out.append(f"waits for job {dep_id} ({Status(status).label}{where})")
    if len(rows) > NAMED_DEPENDENCIES:
        out.append(f"and {pending.count() - NAMED_DEPENDENCIES} more unfinished jobs it waits for")
    return out
