"""Workflows: jobs that wait for other jobs (dependencies), and batches with callbacks.

A job enqueued ``after=[a, b]`` is inserted Waiting (not claimable: the claim and its indexes are
untouched) with one :class:`~.models.JobDependency` row per dependency, and each dependency is marked
``has_dependents``. A job put in a batch carries ``batch_id``. Those two columns come back in every row
the finish path already returns, so only a job that has one of them set costs anything when it
finishes: :func:`after_finish` then looks for its dependents and its batch.

Why the release runs AFTER the finish has committed, in a transaction of its own (not inside it):
under READ COMMITTED with row versioning (PostgreSQL, SQL Server's READ_COMMITTED_SNAPSHOT) two
dependencies finishing at once in two transactions may each see the other as unfinished, and neither
would release the dependent. Run after the commit, the release of whichever finish committed LAST
starts after both commits, so its snapshot sees both dependencies finished: someone always releases.
Two releases that both see it are serialised by the dependent's concurrency token (modify refuses
the second with StaleJob), so a job is released once. A worker that dies between its commit and the
release loses nothing: :func:`backstop` (the supervisor's periodic look, with the reaper) finds Waiting
jobs whose dependencies are all finished and batches whose members are, and completes the work.

Batches live in batches.py (re-exported here: ``from django_sqlqueue.workflows import batch``); the
release path below calls their :func:`~.batches.finish_batch` for the batches of finished jobs.
See docs/workflows.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Exists, OuterRef

from ..exceptions import InvalidArgument, JobNotFound, StaleJob
from ..states import FINISHED, UNFINISHED, Status
from .batches import (
    BatchClosed,
    BatchHandle,
    batch,
    batch_counts,
    close_batch,
    create_batch,
    finish_batch,
    open_batch,
)

if TYPE_CHECKING:
    from ..models import Job
    from ..queue import JobSpec

__all__ = ["CANCEL", "RUN", "BatchClosed", "BatchHandle", "Dependency", "DependencyError", "after_finish", "backstop",
           "batch", "batch_counts", "close_batch", "create_batch", "current_task_options", "dependencies",
           "finish_batch", "open_batch", "resolve", "task_options"]

log = logging.getLogger("django_sqlqueue.workflows")

CANCEL = "cancel"
RUN = "run"
POLICIES = (CANCEL, RUN)
#: Most ids in one IN list (SQL Server takes 2,100 parameters a statement).
_CHUNK = 500


class DependencyError(InvalidArgument):
    """A dependency cannot be recorded (missing job, cycle, or a combination enqueue does not allow)."""


@dataclass(frozen=True)
class Dependency:
    """One entry of ``after``: a job (or its id, or a JobSpec of the same ``enqueue_many`` call) and the
    policy when it ends other than Completed: ``"cancel"`` the dependent (default) or ``"run"`` it anyway."""

    target: Any
    on_failure: str = CANCEL


def _is_spec(value: Any) -> bool:
    from ..queue.enqueue import JobSpec

    return isinstance(value, JobSpec)


def dependencies(after: Iterable[Any] | None, default: str = CANCEL) -> tuple[Dependency, ...]:
    """``after`` as given to enqueue (jobs, ids, JobSpecs, ``(one of those, policy)`` pairs or
    :class:`Dependency`) as Dependency entries, checked."""
    if after is None:
        return ()
    if isinstance(after, str | bytes | int) or hasattr(after, "pk") or not isinstance(after, Iterable):
        raise DependencyError("after must be a list of jobs, job ids or JobSpecs")
    out = []
    for item in after:
        dep = item if isinstance(item, Dependency) else (
            Dependency(item[0], item[1]) if isinstance(item, tuple) and len(item) == 2 else Dependency(item, default))
        if dep.on_failure not in POLICIES:
            # Named as the caller spelled it: enqueue's on_dependency_failure= or an (job, policy) pair in
            # after= (a batch's on_failure is something else: its callback).
            raise DependencyError(
                f"a dependency's policy (on_dependency_failure=, or the second item of a (job, policy) pair "
                f"in after=) must be one of {', '.join(POLICIES)}, got {dep.on_failure!r}")
        target = dep.target
        if isinstance(target, bool) or not (isinstance(target, int) or hasattr(target, "pk")
                                            or _is_spec(target)):
            raise DependencyError(f"a dependency must be a job, a job id or a JobSpec, got {target!r}")
        out.append(dep)
    return tuple(out)


# ----- enqueue ---------------------------------------------------------------------------------------
def check_specs(specs: Sequence[JobSpec]) -> None:
    """Refuse what cannot be enqueued, before anything is written: a cycle among the specs of one
    call (a spec may name another spec of the same call), a spec named that is not in the call, a
    dependency together with a dedupe key (a deduplicated enqueue returns another job)."""
    index = {id(s): i for i, s in enumerate(specs)}
    edges: dict[int, list[int]] = {}
    for i, spec in enumerate(specs):
        if spec.after and spec.dedupe_key is not None:
            raise DependencyError("a job with dependencies cannot have a dedupe_key (a deduplicated enqueue "
                                  "returns an existing job, which would not get them)")
        for dep in spec.after:
            if _is_spec(dep.target):
                if id(dep.target) not in index:
                    raise DependencyError("a JobSpec named in after must be enqueued in the same enqueue_many call")
                edges.setdefault(i, []).append(index[id(dep.target)])
    # Depth-first search for a cycle (white 0, grey 1, black 2).
    colour = [0] * len(specs)
    for root in range(len(specs)):
        if colour[root]:
            continue
        stack: list[tuple[int, Iterator[int]]] = [(root, iter(edges.get(root, ())))]
        colour[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
            elif colour[child] == 1:
                raise DependencyError(f"the dependencies form a cycle (job spec {child} waits for itself "
                                      f"through spec {node}): nothing was enqueued")
            elif colour[child] == 0:
                colour[child] = 1
                stack.append((child, iter(edges.get(child, ()))))


def link(specs: Sequence[JobSpec], jobs: Sequence[Job], alias: str) -> None:
    """Record the dependencies and batch memberships of freshly inserted ``jobs`` (inside the enqueue's
    transaction), and resolve at once the Waiting jobs whose dependencies have all finished already.

    Every dependency is marked (and so locked) before its status is read: a dependency that finishes
    concurrently either committed before (its status is read here) or waits for this transaction and
    then sees the mark (its finish path releases the dependent).
    """
    from ..models import Batch, Job, JobDependency

    index = {id(s): i for i, s in enumerate(specs)}
    rows: list[JobDependency] = []
    for spec, job in zip(specs, jobs, strict=True):
        for dep in spec.after:
            t = dep.target
            target = jobs[index[id(t)]].pk if _is_spec(t) else int(getattr(t, "pk", t))
            rows.append(JobDependency(job_id=job.pk, depends_on_id=target, on_failure=dep.on_failure))
    manager = Job.objects.db_manager(alias)
    if rows:
        targets = sorted({r.depends_on_id for r in rows})
        marked = 0
        for start in range(0, len(targets), _CHUNK):
            marked += manager.filter(pk__in=targets[start:start + _CHUNK]).update(has_dependents=True)
        if marked != len(targets):
            found = set()
            for start in range(0, len(targets), _CHUNK):
                found.update(manager.filter(pk__in=targets[start:start + _CHUNK]).values_list("pk", flat=True))
            missing = sorted(set(targets) - found)
            raise JobNotFound(f"cannot wait for job(s) {', '.join(map(str, missing[:10]))}: no such job; "
                              "nothing was enqueued")
        JobDependency.objects.using(alias).bulk_create(rows, batch_size=_CHUNK)
    by_batch: dict[int, list[int]] = {}
    for spec, job in zip(specs, jobs, strict=True):
        if spec.batch is not None:
            by_batch.setdefault(int(getattr(spec.batch, "pk", spec.batch)), []).append(job.pk)
    for batch_id, ids in by_batch.items():
        # Locks the batch row until commit: a close waits for the members being added, so the batch
        # cannot finish (and fire) without them.
        if not Batch.objects.using(alias).filter(pk=batch_id, closed_at__isnull=True).update(closed_at=None):
            raise BatchClosed(f"batch {batch_id} is closed or does not exist: nothing was enqueued")
        for start in range(0, len(ids), _CHUNK):
            manager.filter(pk__in=ids[start:start + _CHUNK]).update(batch_id=batch_id)
        members = set(ids)
        for job in jobs:
            if job.pk in members:
                job.batch_id = batch_id
    parents = {r.depends_on_id for r in rows}
    for job in jobs:
        if job.pk in parents:
            job.has_dependents = True
    waiting = [j.pk for j in jobs if j.status_id == Status.WAITING]
    if not waiting:
        return
    settled = _resolve_many(waiting, alias)
    if not settled:
        return  # nothing had finished yet: every waiting job of this call still waits
    # Cancelled at once (a dependency had failed): the dependents in this call follow, now.
    _settle([j for j in settled if j.state in FINISHED], alias)
    fresh = {j.pk: j for j in manager.filter(pk__in=waiting)}
    for job in jobs:
        if job.pk in fresh:
            job.__dict__.update({f.attname: getattr(fresh[job.pk], f.attname) for f in Job._meta.concrete_fields})


# ----- release ------------------------------------------------------------------------------------
def after_finish(jobs: Iterable[Job], alias: str) -> None:
    """Called by the manager for jobs it has just moved to a finished status: once that has committed,
    release (or cancel) their dependents and finish their batches. Errors are logged, not raised: the
    finish itself is committed, and :func:`backstop` redoes what was missed."""
    marked = [j for j in jobs if j.has_dependents or j.batch_id]
    if not marked:
        return

    def run() -> None:
        try:
            _settle(marked, alias)
        except Exception:
            log.exception("workflow_release_failed jobs=%s (the periodic backstop will retry)",
                          ",".join(str(j.pk) for j in marked[:20]))

    transaction.on_commit(run, using=alias)


def _settle(finished: list[Job], alias: str) -> None:
    """Release or cancel the Waiting dependents of ``finished`` jobs, following cancellations down the
    chain, then finish the batches of every job finished on the way."""
    from ..models import JobDependency

    batches = {j.batch_id for j in finished if j.batch_id}
    frontier = sorted({j.pk for j in finished if j.has_dependents})
    while frontier:
        waiting: set[int] = set()
        for start in range(0, len(frontier), _CHUNK):
            waiting.update(JobDependency.objects.using(alias).filter(
                depends_on_id__in=frontier[start:start + _CHUNK], job__status_id=Status.WAITING,
            ).values_list("job_id", flat=True))
        done = [j for j in _resolve_many(sorted(waiting), alias) if j.state in FINISHED]
        batches.update(j.batch_id for j in done if j.batch_id)
        frontier = sorted(j.pk for j in done if j.has_dependents)
    for batch_id in sorted(batches):
        finish_batch(batch_id, alias)


def _resolve_many(ids: list[int], alias: str) -> list[Job]:
    from ..queue.wakeups import wake_on_commit

    out = []
    for job_id in ids:
        new = resolve(job_id, alias, wake=False)
        if new is not None:
            out.append(new)
    # One wake-up for the jobs released (a fan-out of thousands: one notification, not thousands).
    wake_on_commit(alias, {j.queue for j in out if j.state == Status.PENDING})
    return out


def decide(job_id: int, alias: str) -> tuple[Status | None, str]:
    """What a Waiting job should become now, read from its dependencies' current statuses: Cancelled
    (a dependency under the "cancel" policy ended other than Completed), Pending (all have finished),
    or None (still waiting); with the reason."""
    from ..models import JobDependency

    deps = list(JobDependency.objects.using(alias).filter(job_id=job_id)
                .values_list("depends_on_id", "depends_on__status_id", "on_failure").order_by("depends_on_id"))
    for dep_id, status, policy in deps:
        if policy == CANCEL and status in FINISHED and status != Status.COMPLETED:
            return Status.CANCELLED, f"cancelled: job {dep_id}, which it waited for, ended {Status(status).label}"
    if all(status in FINISHED for _, status, _ in deps):
        return Status.PENDING, ""
    return None, ""


def resolve(job_id: int, alias: str, *, wake: bool = True) -> Job | None:
    """Move Waiting job ``job_id`` on if its dependencies allow it; return its new row, or None when it
    stays (or someone else moved it first: the token decides, so it moves once)."""
    from ..models import Job

    manager = Job.objects.db_manager(alias)
    try:
        job = manager.get_for_update(job_id, using=alias)
    except JobNotFound:
        return None
    if job.state != Status.WAITING:
        return None
    new, reason = decide(job_id, alias)  # a new statement: sees every finish committed before it
    if new is None:
        return None
    try:
        return manager.modify(job, job.version, new, error=reason or None, using=alias, wake=wake)
    except StaleJob:
        return None


# ----- the backstop -------------------------------------------------------------------------------
def backstop(using: str | None = None, limit: int = 200) -> tuple[int, int]:
    """Finish what a dead worker left between its commit and its release: move Waiting jobs whose
    dependencies allow it, and fire batches whose members have all finished. Returns (jobs moved,
    batches finished). Run by the supervisor with the reaper; cheap when nothing waits (an index
    seek on status Waiting, and on the unfinished batches' partial index)."""
    from ..conf import get_settings
    from ..models import Batch, Job, JobDependency

    alias = using or get_settings().DATABASE or "default"
    deps = JobDependency.objects.using(alias).filter(job_id=OuterRef("pk"))
    unfinished = deps.filter(depends_on__status_id__in=sorted(UNFINISHED))
    failed = deps.filter(on_failure=CANCEL, depends_on__status_id__in=sorted(FINISHED - {Status.COMPLETED}))
    waiting = Job.objects.db_manager(alias).filter(status_id=Status.WAITING)
    ready = list(waiting.filter(~Exists(unfinished) | Exists(failed)).order_by("pk").values_list("pk", flat=True)[:limit])
    moved = _resolve_many(ready, alias)
    if moved:
        _settle([j for j in moved if j.state in FINISHED], alias)
    members = Job.objects.db_manager(alias).filter(batch_id=OuterRef("pk"), status_id__in=sorted(UNFINISHED))
    due = list(Batch.objects.using(alias).filter(finished_at__isnull=True, closed_at__isnull=False)
               .filter(~Exists(members)).order_by("pk").values_list("pk", flat=True)[:limit])
    fired = 0
    for batch_id in due:
        try:
            fired += bool(finish_batch(batch_id, alias))
        except (OperationalError, InterfaceError):
            raise  # the database is gone: so are the other batches' chances, this pass
        except Exception:  # one batch whose callback cannot be enqueued must not hold back the others
            log.exception("batch_finish_failed batch=%s (retried at the next backstop)", batch_id)
    if moved or fired:
        log.warning("workflow_backstop moved=%s batches=%s (a release was missed, e.g. a worker died)",
                    len(moved), fired)
    return len(moved), fired


# ----- Django Tasks ---------------------------------------------------------------------------------
_TASK_OPTIONS: ContextVar[dict[str, Any] | None] = ContextVar("sqlqueue_task_workflow", default=None)


@contextmanager
def task_options(*, after: Iterable[Any] = (), batch: Any = None, on_dependency_failure: str = CANCEL) -> Iterator[None]:
    """Tasks enqueued inside (``my_task.enqueue(...)`` on the SqlQueueBackend) wait ``after`` these jobs
    or task results, and/or join ``batch``. Django's ``Task.using()`` has no room for such options."""
    def target(item: Any) -> Any:
        if isinstance(item, tuple) and len(item) == 2:
            return (target(item[0]), item[1])
        if hasattr(item, "pk") or isinstance(item, int):
            return item
        try:  # a TaskResult: its id is the job's id, as text
            return int(item.id)
        except (AttributeError, TypeError, ValueError):
            raise DependencyError(f"after takes jobs, job ids or task results, got {item!r}") from None

    options: dict[str, Any] = {}
    if after:
        options["after"] = dependencies([target(a) for a in after], on_dependency_failure)
    if batch is not None:
        options["batch"] = getattr(batch, "pk", batch)
    token = _TASK_OPTIONS.set(options)
    try:
        yield
    finally:
        _TASK_OPTIONS.reset(token)


def current_task_options() -> dict[str, Any]:
    """The options of the innermost :func:`task_options` block ({} outside one)."""
    return _TASK_OPTIONS.get() or {}

