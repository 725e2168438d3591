"""Which job types a worker serves: those its code can run, so it never claims a job only to fail it.

A worker's code runs a type when a handler is registered for it (``@handler`` in an installed app's
``jobs.py``) or when the name resolves to a ``@task`` by its import path (the Tasks backend's types).
The job types the database knows (the small ``JobType`` table) are split into those it can run and
those it cannot:

* it can run every known type (the usual case): the claim takes no type filter, exactly the statement
  it always was;
* some it cannot: the claim gets ``job_type_id IN (the ones it can)``, a residual test on the rows the
  claim index already seeks (the seek, the order and the one statement stay; docs/worker.md);
* none (no handler at all, e.g. ``jobs.py`` renamed): it claims nothing and says so at start.

A type created after the worker started (a new ``@task`` enqueued for the first time, a deploy that
reached the web before the workers) is claimed by an unfiltered worker and, when it cannot run it,
handed back unstarted with its attempt refunded; the worker then re-reads the types and leaves that
one alone. A filtered worker re-reads the types every :data:`REFRESH_SECONDS`, so a new task it can run
is picked up. The worker row lists the types a filtered worker serves, so the diagnosis (queue_why, the
admin, the metrics) says "no live worker serves" about a type nobody can run.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How often a worker that serves a subset of the types looks for new ones (a small table's names).
REFRESH_SECONDS = 10.0
#: Job type rows read at most (a type name per row; a real deployment has tens).
MAX_TYPES = 10_000
#: The worker row's ``types`` when it serves none: an entry no type can be named (names are non-empty).
SERVES_NONE = ""


@dataclass(frozen=True)
class Serving:
    """What a worker claims, by job type name."""

    #: ``--type`` names given (empty: every type).
    requested: tuple[str, ...]
    #: Known types (or requested ones) this code runs: handlers, and tasks resolved by import path.
    handled: tuple[str, ...]
    #: Known types (or requested ones) it has no handler for: not claimed.
    unhandled: tuple[str, ...]

    @property
    def filtered(self) -> bool:
        """The claim carries a type filter (some known or requested type is not, or not only, served)."""
        return bool(self.requested) or bool(self.unhandled)

    @property
    def nothing(self) -> bool:
        """It can run none of the types it would claim: it claims nothing."""
        return self.filtered and not self.handled

    @property
    def claim_types(self) -> tuple[str, ...]:
        """The claim's type filter: ``()`` for every type."""
        return self.handled if self.filtered else ()

    @property
    def row_types(self) -> list[str]:
        """The worker row's ``types`` (empty: all), as :func:`~django_sqlqueue.ops.health.serves` reads it."""
        if not self.filtered:
            return []
        return list(self.handled) or [SERVES_NONE]


def resolve(using: str, requested: tuple[str, ...] = ()) -> Serving:
    """Split the requested types (or every type the database knows) by whether this code runs them.

    Reads the ``JobType`` rows (unless ``--type`` named them); asking the registry about a
    dotted name may import that task's module (only where tasks may be: tasks/runner.py ``may_import``).
    """
    from .. import jobtypes
    from ..handlers import registry

    # Whole rows, not just names: they fill the type cache, so the claim that follows reads no type.
    names = list(requested) if requested else jobtypes.read_all(using, limit=MAX_TYPES)
    handled, unhandled = [], []
    for name in names:
        try:
            runs = registry.is_registered(name)
        except Exception:  # a task module that fails to import: the job would fail; do not claim it
            runs = False
        (handled if runs else unhandled).append(name)
    return Serving(tuple(requested), tuple(handled), tuple(unhandled))


def declared_handlers() -> tuple[list[str], list[str]]:
    """(handler names, task names) this process's code declares or has resolved so far."""
    from ..handlers import registry

    handlers, tasks = [], []
    for h in registry.all():
        (tasks if h.func.__qualname__.startswith("run_task[") else handlers).append(h.name)
    return sorted(handlers), sorted(tasks)


def describe(serving: Serving) -> list[str]:
    """The start lines: what it serves ("types: A, B; tasks: app.tasks.f") and what it leaves alone."""
    from ..handlers import registry

    handlers, tasks = declared_handlers()
    tasks = sorted(set(tasks) | {n for n in serving.handled if n not in handlers and "." in n
                                 and registry.declared(n) is None})
    lines = [f"serves job types: {', '.join(handlers) or '(no handler registered)'}"
             + (f"; tasks: {', '.join(tasks)}" if tasks else "")]
    if serving.unhandled:
        shown = ", ".join(serving.unhandled[:20]) + (" ..." if len(serving.unhandled) > 20 else "")
        lines.append(f"not claimed here (no handler in this code): {shown}")
    return lines


def problems(serving: Serving) -> list[str]:
    """Warnings for the start: no handler at all, or ``--type`` names it cannot run."""
    handlers, tasks = declared_handlers()
    out = []
    if not handlers and not tasks and not serving.handled:
        out.append("no job handler is registered in this process: this worker claims no job (they stay "
                   "Pending, no attempt spent). Handlers are found in each installed app's jobs.py module "
                   "(@sqlqueue.handler); tasks by their import path" + _misplaced_hint())
    for name in serving.requested:
        if name in serving.unhandled:
            out.append(f"--type {name!r}: no handler for it in this code: not claimed")
    return out


def _misplaced_hint() -> str:
    """", e.g. myapp/handlers.py is not loaded" when an installed app has handlers in another module."""
    from importlib.util import find_spec

    from django.apps import apps

    for app in apps.get_app_configs():
        if app.name.startswith(("django.", "django_sqlqueue")):
            continue
        try:
            has_jobs = find_spec(f"{app.name}.jobs") is not None
            other = next((m for m in ("handlers", "job_handlers", "queue_jobs")
                          if find_spec(f"{app.name}.{m}") is not None), None)
        except (ImportError, ValueError):
            continue
        if other and not has_jobs:
            return (f" ({app.name}/{other}.py is not loaded: rename it to jobs.py, or import it from "
                    f"{app.name}'s AppConfig.ready())")
    return ""
