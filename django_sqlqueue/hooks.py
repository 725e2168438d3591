"""Where the queue calls a feature: slots that the features fill when the app is ready.

The queue wing (enqueue, claim, finish, housekeeping) sits below the features (limits, workflows) and
the ops wing (tracing), which all build on it; so the queue never imports them. Where a job's path must
reach one (a completion frees the job's permit and releases its workflow dependents; an enqueue links
dependencies and opens permits for new keys; a lease renewal renews permits), it calls a slot of this
module, and ``SqlQueueConfig.ready()`` (apps.py) fills each slot with the feature's function, once per
process. Read docs/architecture.md for the map.

Cost: the queue reads a slot as it read the feature module's attribute before (one module attribute
lookup at the call, none per job in a loop). Until ``ready()`` has run no model can be used, so no slot
is called; a slot still empty when called raises rather than silently skipping a feature's duty.

Nothing here imports anything of the package: it is the floor every wing may stand on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any


def _unset(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"django_sqlqueue.hooks.{name} is not installed: django_sqlqueue's AppConfig.ready() has not run "
            f"(is 'django_sqlqueue' in INSTALLED_APPS and django.setup() called?)"
        )

    missing.__name__ = name
    return missing


# ----- limits (django_sqlqueue.limits): concurrency permits follow their jobs' leases -----------------
#: ``(cursor, dialect, job_ids)``: free the permits the given jobs hold (their attempt finished).
release_permits: Callable[..., None] = _unset("release_permits")
#: ``(cursor, dialect, job_ids, lease_seconds)``: extend the permits with the jobs' leases.
renew_permits: Callable[..., None] = _unset("renew_permits")
#: ``(using, type_info, keys)``: the permits of new keys' scopes, before their jobs can be claimed.
ensure_permits: Callable[..., None] = _unset("ensure_permits")
#: ``(job, using)``: a job retried under another type moves its permit scope with it.
follow_type_on_retry: Callable[..., None] = _unset("follow_type_on_retry")

# ----- workflows (django_sqlqueue.workflows): dependencies and batches ----------------------------------
#: ``(after, on_dependency_failure) -> list``: a JobSpec's ``after`` normalised.
normalise_dependencies: Callable[..., Any] = _unset("normalise_dependencies")
#: ``(specs)``: refuse an enqueue_many call whose dependencies or batches are inconsistent.
check_workflow_specs: Callable[..., None] = _unset("check_workflow_specs")
#: ``(specs, jobs, using)``: write the dependency rows and batch counts of just-inserted jobs.
link_workflow: Callable[..., None] = _unset("link_workflow")
#: ``(jobs, using)``: finished jobs that carry a workflow marker release or cancel their dependents.
after_finish: Callable[..., None] = _unset("after_finish")


# ----- tracing (django_sqlqueue.ops.tracing): OpenTelemetry, when installed and configured -----------
def _tracing_off() -> bool:
    return False


def _no_span(type_names: Any, count: int, queues: Any) -> AbstractContextManager[str | None]:
    return nullcontext(None)


#: ``() -> bool``: whether enqueues are traced. Tracing is optional: off until ops.tracing is installed.
tracing_enabled: Callable[[], bool] = _tracing_off
#: ``(type_names, count, queues)``: a context manager around an enqueue yielding the carrier to store.
enqueue_span: Callable[..., AbstractContextManager[str | None]] = _no_span
