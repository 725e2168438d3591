""""Why is this job (not) running?" -- the ONE answer, used by ``queue_why``, the admin's job page, the
dashboard's "due work nobody serves" and the ``sqlqueue_unserved_due_jobs`` metric.

Every sentence mirrors a condition of the claim (dialects/base.py ``due_candidates`` and
``reclaim_candidates``) and of the fleet as the claim sees it (:mod:`.health`: a worker is live when it
has not stopped and beat recently; it serves a queue and type when its row lists them, empty meaning
all). So "nothing stops it" is said only when a live worker that serves the job's queue and type would
take it now, and a job in a queue nobody serves is said to wait for a worker that does.

A Waiting job's answer follows its dependencies to the first job that is not itself waiting and says
what holds that one ("waits for job 3169 (Pending): Due 2 minutes ago, but none of the 1 live
worker(s) serves queue emails ..."), at most :data:`CHAIN_DEPTH` steps deep and never twice through the
same job (a cycle cannot be enqueued, but rows can be edited).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connections
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from .. import jobtypes
from ..conf import get_settings
from ..dialects.base import PROCESSING_INDEX
from ..dialects.predicates import index_predicate
from ..handlers import registry
from ..states import CLAIMABLE, FINISHED, TRANSITIONS, UNFINISHED, Status, sql_list
from . import health
from .timefmt import ago, stamp, until

if TYPE_CHECKING:
    from ..models import Job, QueuePause, Worker

#: Dependencies of a Waiting job named one by one; the rest are counted.
NAMED_DEPENDENCIES = 10
#: How far a Waiting job's chain of dependencies is followed to find what really holds it.
CHAIN_DEPTH = 20


@dataclass
class Diagnosis:
    """What holds a job, in sentences (the first is the main one), and whether nothing does."""

    job: Job
    lines: list[str]
    #: A live worker that serves the job's queue and type takes it at its next claim: nothing stops it.
    runs_now: bool = False

    @property
    def text(self) -> str:
        return " ".join(self.lines)


@dataclass
class _Fleet:
    """The live workers, read once per diagnosis (a Waiting job's chain diagnoses several jobs)."""

    using: str | None
    now: datetime
    _live: list[Worker] | None = field(default=None, repr=False)

    @property
    def live(self) -> list[Worker]:
        if self._live is None:
            self._live = health.live_workers(self.now, self.using)
        return self._live

    def serving(self, queue: str, type_name: str) -> list[Worker]:
        return [w for w in self.live if health.serves(w, queue, type_name)]

    _pauses: dict[str, QueuePause] | None = field(default=None, repr=False)

    def queue_pause(self, queue: str) -> QueuePause | None:
        """The pause of ``queue`` (who, when, why), or None: the claim passes over a paused queue's jobs."""
        if self._pauses is None:
            from ..models import Job

            self._pauses = Job.objects.paused_queues(using=self.using)
        return self._pauses.get(queue)


def diagnose(job: Job, *, now: datetime | None = None) -> Diagnosis:
    """Why ``job`` is, or is not, running now (see the module docstring)."""
    fleet = _Fleet(job._state.db, now or timezone.now())
    return _diagnose(job, fleet, depth=0, seen={job.pk})


def why_not_running(job: Job) -> list[str]:
    """The sentences of :func:`diagnose`, or ``[]`` when a live worker serving the job takes it now."""
    found = diagnose(job)
    return [] if found.runs_now else found.lines


def _diagnose(job: Job, fleet: _Fleet, *, depth: int, seen: set[int]) -> Diagnosis:
    using = job._state.db or get_settings().DATABASE
    info = jobtypes.get_type_by_id(job.job_type_id, using=using)
    now, state = fleet.now, job.state
    if state in FINISHED:
        if Status.PENDING in TRANSITIONS[state]:
            line = _("Finished (%(status)s); only an operator's retry runs it again.") % {"status": state.label}
        else:
            line = _("Finished (%(status)s) for good: no action runs it again; enqueue a new job to redo the "
                     "work.") % {"status": state.label}
        return Diagnosis(job, [line])
    lines: list[str] = []
    if state is Status.PAUSED:
        lines.append(_("Paused by an operator: Resume to let workers take it."))
    elif state is Status.WAITING:
        lines.extend(_waiting(job, fleet, depth=depth, seen=seen))
    elif state is Status.PROCESSING:
        lines.extend(_running(job, info, fleet))
    if state is not Status.PROCESSING and info.paused:
        lines.append(_("Its job type %(type)s is paused: no worker takes its jobs.") % {"type": info.name})
    pause = fleet.queue_pause(job.queue)
    if state is not Status.PROCESSING and pause is not None:
        lines.append(queue_paused_line(pause))
    max_attempts = job.max_attempts or info.max_attempts
    if job.attempt_num >= max_attempts and (state is not Status.PROCESSING or health.is_orphan(job, now)):
        lines.append(_("No attempts left (all %(n)d used): the reaper marks it Failed; Retry or Reset attempts "
                       "to run it again.") % {"n": max_attempts})
    if state in CLAIMABLE and job.scheduled_for > now:
        lines.append(_("Scheduled: due %(when)s (at %(at)s).") % {"when": until(job.scheduled_for, now),
                                                                 "at": stamp(job.scheduled_for)})
    if state in CLAIMABLE and job.scheduled_for <= now and info.limited:
        from ..limits import explain as limit_wait

        held = limit_wait(job)  # "held by the concurrency limit of Export: 2 of 2 running"
        if held:
            lines.append(held[0].upper() + held[1:] + ".")
    found = _due(job, info.name, fleet) if state in CLAIMABLE and not lines else Diagnosis(job, lines)
    if not registry.is_registered(info.name):
        # A note about this process's code, not a fact about the workers (their rows say what they serve:
        # a worker without the handler does not list the type, see worker/serving.py).
        found.lines.append(_("No handler for %(type)r is registered in this code: a worker running it does "
                             "not claim such jobs (handlers are found in each installed app's jobs.py; tasks "
                             "by their import path).") % {"type": info.name})
    return found


def queue_paused_line(pause: QueuePause) -> str:
    """"Its queue emails is paused (by alice, 3 minutes ago: provider down): ..." """
    who = _(" by %(who)s") % {"who": pause.paused_by} if pause.paused_by else ""
    why = f": {pause.reason}" if pause.reason else ""
    return _("Its queue %(queue)s is paused%(who)s %(ago)s ago%(why)s: no worker takes its jobs until it is "
             "resumed.") % {"queue": pause.queue, "who": who, "ago": ago(pause.paused_at, timezone.now()),
                            "why": why}


def _due(job: Job, type_name: str, fleet: _Fleet) -> Diagnosis:
    """A due, claimable job nothing else holds: it runs now if, and only if, a live worker serves it."""
    since = ago(job.scheduled_for, fleet.now)
    if not fleet.live:
        return Diagnosis(job, [_("Due %(ago)s ago, but no worker is alive.") % {"ago": since}])
    serving = fleet.serving(job.queue, type_name)
    if not serving:
        return Diagnosis(job, [_(
            "Due %(ago)s ago, but none of the %(n)d live worker(s) serves queue %(queue)s and type %(type)s: it "
            "waits until a worker that does starts.") % {"ago": since, "n": len(fleet.live), "queue": job.queue,
                                                          "type": type_name}])
    return Diagnosis(job, [_("Due %(ago)s ago: waiting for one of %(n)d live worker(s) serving queue %(queue)s "
                             "and type %(type)s.") % {"ago": since, "n": len(serving), "queue": job.queue,
                                                      "type": type_name}], runs_now=True)


def _running(job: Job, info: jobtypes.TypeInfo, fleet: _Fleet) -> list[str]:
    """A Processing job: running on a live worker, or orphaned (and then, who takes it over)."""
    now = fleet.now
    holder = health.holder_of(job, now)
    worker = job.worker or "?"
    if holder.state == "stopped":
        why = _("Orphaned: worker %(worker)s stopped %(ago)s ago but the job is still Processing.") % {
            "worker": worker, "ago": ago(holder.worker.stopped_at, now)}  # type: ignore[union-attr]
    elif holder.state == "stale":
        why = _("Orphaned: worker %(worker)s has sent no heartbeat for %(ago)s (presumed dead).") % {
            "worker": worker, "ago": ago(holder.worker.last_heartbeat, now)}  # type: ignore[union-attr]
    elif job.lease_expires_at and job.lease_expires_at < now:
        why = _("Lease expired %(ago)s ago: worker %(worker)s is presumed dead.") % {
            "ago": ago(job.lease_expires_at, now), "worker": worker}
    else:
        if holder.state == "missing":
            lines = [_("Running on %(worker)s (no worker row by that name) since %(ago)s ago; its lease expires "
                       "%(left)s, then a live worker serving it takes it over.") % {
                "worker": worker, "ago": ago(job.started_at or now, now), "left": until(job.lease_expires_at or now, now)}]
        else:
            lease = (_(", its lease renewed while the worker lives (until %(t)s)") % {"t": stamp(job.lease_expires_at)}
                     if job.lease_expires_at else "")
            lines = [_("Running on %(worker)s since %(ago)s ago%(lease)s.") % {
                "worker": worker, "ago": ago(job.started_at or now, now), "lease": lease}]
        return lines + _cancel_pending(job)
    if info.paused:
        return [why, _("Its type is paused: nobody takes it over until it is resumed.")]
    pause = fleet.queue_pause(job.queue)
    if pause is not None:
        return [why, queue_paused_line(pause)]
    serving = fleet.serving(job.queue, info.name)
    if serving:
        return [why, _("The next claim by one of %(n)d live worker(s) serving queue %(queue)s takes it over (or "
                       "Requeue it).") % {"n": len(serving), "queue": job.queue}]
    return [why, _("No live worker serves queue %(queue)s and type %(type)s: it stays here until one starts. "
                   "Requeue it to make it Pending.") % {"queue": job.queue, "type": info.name}]


def _cancel_pending(job: Job) -> list[str]:
    from ..models import Job as JobModel

    request = JobModel.objects.cancel_request_for(job.pk, job.attempt_num, using=job._state.db)
    if request is None:
        return []
    return [_("A cancel was requested at %(at)s by %(by)s: its worker stops it (within CANCEL_CHECK_SECONDS + "
              "CANCEL_GRACE_SECONDS), or it completes first.") % {
        "at": stamp(request.requested_at), "by": request.requested_by or _("an unnamed caller")}]


def _waiting(job: Job, fleet: _Fleet, *, depth: int, seen: set[int]) -> list[str]:
    """Each unfinished dependency with its status, and what holds the first job down its chain that is
    not itself waiting ("waits for job 12 (Processing on host-a/2): Running on host-a/2 since ...")."""
    from ..models import Job as JobModel
    from ..models import JobDependency

    deps = JobDependency.objects.using(job._state.db).filter(job_id=job.pk)
    pending = deps.filter(depends_on__status_id__in=sorted(UNFINISHED)).order_by("depends_on_id")
    named = NAMED_DEPENDENCIES if depth == 0 else 1  # down the chain, its first one: bounded work
    ids = list(pending.values_list("depends_on_id", flat=True)[:named + 1])
    if not ids:
        return [_("It is Waiting, but every job it waits for has finished: the next release or the supervisor's "
                  "periodic look (every 30 s) moves it on.")]
    jobs = {j.pk: j for j in JobModel.objects.using(job._state.db).filter(pk__in=ids[:named])}
    out = []
    for dep_id in ids[:named]:
        dep = jobs.get(dep_id)
        if dep is None:  # deleted meanwhile
            continue
        where = _(" on %(worker)s") % {"worker": dep.worker} if dep.state is Status.PROCESSING and dep.worker else ""
        line = _("waits for job %(id)d (%(status)s%(where)s)") % {"id": dep_id, "status": dep.state.label,
                                                                  "where": where}
        out.append(line + _chain(dep, fleet, depth=depth + 1, seen=seen))
    if len(ids) > named:
        out.append(_("and %(n)d more unfinished jobs it waits for") % {"n": pending.count() - named})
    return [_("It is Waiting:") + " " + "; ".join(out) + "."]


def _chain(dep: Job, fleet: _Fleet, *, depth: int, seen: set[int]) -> str:
    """What holds ``dep``, a dependency: ``": <its diagnosis>"``; a Waiting one is followed further."""
    if dep.pk in seen:
        return _(": a cycle of dependencies leads back to it (nothing in it can run)")
    if depth > CHAIN_DEPTH:
        return _(", and so on: the chain is longer than %(n)d jobs (run queue_why %(id)d)") % {
            "n": CHAIN_DEPTH, "id": dep.pk}
    seen.add(dep.pk)
    try:
        found = _diagnose(dep, fleet, depth=depth, seen=seen)
    finally:
        seen.discard(dep.pk)
    text = found.text
    if dep.state is Status.WAITING and text.startswith(_("It is Waiting:")):
        text = text[len(_("It is Waiting:")):].strip().rstrip(".")
        return _(", which %(rest)s") % {"rest": text}
    return ": " + text.rstrip(".")


def _due_counts(job_model: type[Job], due: Q, pairs: list[tuple[str, int]],
                cap: int | None) -> dict[tuple[str, int], int]:
    """{(queue, type id): due jobs} for ``pairs``, in one statement: a UNION ALL of one count per pair,
    each a seek of the (status, type, queue) index; with ``cap``, each counts at most ``cap`` + 1 rows.

    One statement per pair was 30 statements for 30 pairs. A filter on their queues and their types
    apart would also read every served pair those two lists cross; an OR of the pairs is planned as
    that same wide range by SQLite on a database with no statistics.
    """
    rows = [job_model.objects.filter(due, queue=queue, job_type_id=type_id).order_by() for queue, type_id in pairs]
    if cap is None:
        per_pair = [qs.values("queue", "job_type_id").annotate(n=Count("*")).values_list("queue", "job_type_id", "n")
                    for qs in rows]
        return {(queue, type_id): n for queue, type_id, n in per_pair[0].union(*per_pair[1:], all=True).order_by()}
    # Django's union refuses a LIMIT in a branch on SQLite, so the capped branches are the ORM's own
    # compiled (parameterised) statements, each counted in a derived table and tagged by its position.
    using = job_model.objects.db
    branches, params = [], []
    for i, qs in enumerate(rows):
        sql, branch_params = qs.values_list("pk")[: cap + 1].query.get_compiler(using).as_sql()
        branches.append(f"SELECT {i} AS pair, COUNT(*) AS n FROM ({sql}) sqlqueue_due_{i}")
        params.extend(branch_params)
    with connections[using].cursor() as cursor:
        cursor.execute(" UNION ALL ".join(branches), params)
        return {pairs[i]: int(n) for i, n in cursor.fetchall()}


# ----- the fleet-wide question: due work no live worker serves (the dashboard, the metrics) ----------------
@dataclass
class Unserved:
    """Due work of one queue and type that no live worker serves."""

    queue: str
    type_id: int
    type_name: str
    jobs: int
    #: The due jobs were counted up to the caller's cap and there are more: ``jobs`` (the cap plus the
    #: orphaned ones) is a floor.
    capped: bool = False


#: Unserved (queue, type) pairs counted per call at most (their index ranges are read by two GROUP BYs).
UNSERVED_PAIRS_LIMIT = 50


def waiting_pairs(job_model: type[Job]) -> set[tuple[str, int]]:
    """(queue, type id) pairs holding Pending, Error or Processing jobs: one GROUP BY over the
    (status, type, queue) index, index-only, reading only those statuses' entries."""
    waiting = index_predicate(job_model.objects.db, "status", f"IN ({sql_list({*CLAIMABLE, Status.PROCESSING})})")
    return set(job_model.objects.filter(waiting).order_by().values_list("queue", "job_type_id").distinct())


def unserved_due_work(job_model: type[Job], now: datetime, workers: Iterable[Worker] | None = None,
                      *, pairs: Iterable[tuple[str, int]] | None = None,
                      limit: int = UNSERVED_PAIRS_LIMIT, cap: int | None = None,
                      types: dict[int, str] | None = None, paused_queues: set[str] | None = None) -> list[Unserved]:
    """(queue, type) pairs with due Pending/Error jobs or orphaned Processing jobs, no live worker serving:
    the jobs :func:`diagnose` says "none of the live workers serves" (or "no worker is alive") about.

    Nothing is read when a live worker serves every queue and type (the common setup). Otherwise the
    pairs that hold waiting jobs (``pairs``, e.g. from the dashboard's status counts, or
    :func:`waiting_pairs`) are matched against the live workers in Python, and only the unserved ones
    are counted: due claimable rows and orphaned rows of that queue and type, each a range of the
    (status, type, queue) index. Counting due rows over every queue at once would read every due row's
    table row (the claim index holds no queue or type): 0.4 s at 150,000 due jobs. Paused types and
    queues are left out (nobody is meant to run them).

    ``cap``: count each pair's due jobs up to ``cap`` only (``Unserved.capped`` says there are more). Its
    due rows' table rows are read for their due time, and a large unserved backlog is mostly that read
    (about 10 ms per 3,500 rows over TDS on Babelfish); a page that only warns needs no more. The
    metrics count them all. ``types`` (the names of the types not paused, by id) and ``paused_queues``:
    when the caller has read them already.
    """
    from ..models import JobType

    using = job_model.objects.db
    workers = list(workers) if workers is not None else health.live_workers(now, using)
    if any(not (w.queues or []) and not (w.types or []) for w in workers):
        return []
    if types is None:
        types = dict(JobType.objects.using(using).filter(paused=False).values_list("pk", "name"))
    paused = paused_queues if paused_queues is not None else set(job_model.objects.paused_queues(using=using))
    candidates = sorted(p for p in (pairs if pairs is not None else waiting_pairs(job_model))
                        if p[1] in types and p[0] not in paused
                        and not any(health.serves(w, p[0], types[p[1]]) for w in workers))
    candidates = candidates[:limit]
    if not candidates:
        return []
    claimable = index_predicate(using, "status", f"IN ({sql_list(CLAIMABLE)})") & Q(scheduled_for__lte=now)
    due = _due_counts(job_model, claimable, candidates, cap)  # one statement, a seek per pair
    counts = {pair: min(n, cap) if cap is not None else n for pair, n in due.items()}
    # Their orphaned jobs: one GROUP BY over the Processing index's rows (a few per worker slot), the
    # pairs picked in Python. A UNION branch per pair cost a statement as long again to parse and plan.
    wanted = set(candidates)
    orphaned = health.rows_through(job_model.objects.filter(health.orphaned_q(now, using)).order_by()
                                   .values("queue", "job_type_id").annotate(n=Count("*"))
                                   .values_list("queue", "job_type_id", "n"), PROCESSING_INDEX)
    for queue, type_id, n in orphaned:
        if (queue, type_id) in wanted:
            counts[(queue, type_id)] = counts.get((queue, type_id), 0) + n
    out = []
    for queue, type_id in candidates:
        n = counts.get((queue, type_id), 0)
        if n:
            capped = cap is not None and due.get((queue, type_id), 0) > cap
            out.append(Unserved(queue, type_id, types[type_id], n, capped))
    out.sort(key=lambda u: (-u.jobs, u.queue, u.type_name))
    return out
