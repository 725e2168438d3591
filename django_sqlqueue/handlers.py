"""Handler registry: binds a job type name to a Python callable, optionally with ordered steps.

Handlers are declared in code with :func:`handler` in an installed app's ``jobs.py`` module, which
the app config autodiscovers (the way the admin discovers ``admin.py``)::

    @sqlqueue.handler("SendEmail")
    def send_email(job):
        ...
        return {"message_id": "..."}          # stored as the job's response

    @sqlqueue.handler("Notify", steps=["Render", "Send", "Confirm"])
    def notify(job, step):
        ...                                   # called once per step, starting at the job's step
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .exceptions import InvalidArgument, UnknownJobType
from .jobtypes import validate_name

HandlerFunc = Callable[..., Any]


@dataclass(frozen=True)
class Handler:
    name: str
    func: HandlerFunc
    steps: tuple[str, ...] = ()
    #: Defaults for the job type row created for this handler (None: the SQLQUEUE default).
    options: dict[str, Any] = field(default_factory=dict)

    def first_step(self) -> str:
        return self.steps[0] if self.steps else ""


_TYPE_OPTIONS = {"max_attempts", "timeout_seconds", "lease_seconds", "backoff_base_seconds",
                 "backoff_max_seconds", "description"}


Resolver = Callable[[str], "Handler | None"]


#: Most unresolvable names remembered (see Registry._unresolved).
MAX_UNRESOLVED = 10_000


class Registry:
    """Name -> Handler. Resolvers supply handlers for names not declared up front (Django tasks)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._resolvers: list[Resolver] = []
        #: Names no resolver knew (asked once per process: a task resolver's import attempt costs more
        #: than the enqueue that asks). Forgotten when a handler is registered or a resolver added.
        self._unresolved: set[str] = set()

    def add_resolver(self, resolver: Resolver) -> None:
        """Ask ``resolver(name)`` for a Handler when ``name`` is not registered (first hit is kept)."""
        if resolver not in self._resolvers:
            self._resolvers.append(resolver)
            self._unresolved.clear()

    def _resolve(self, name: str) -> Handler | None:
        if name in self._unresolved:
            return None
        for resolver in self._resolvers:
            found = resolver(name)
            if found is not None:
                self._handlers[name] = found
                return found
        if len(self._unresolved) >= MAX_UNRESOLVED:  # bounded, whatever names callers make up
            self._unresolved.clear()
        self._unresolved.add(name)
        return None

    def register(self, name: str, func: HandlerFunc, *, steps: Sequence[str] = (), **options: Any) -> Handler:
        validate_name(name)
        unknown = set(options) - _TYPE_OPTIONS
        if unknown:
            raise InvalidArgument(f"unknown handler option(s) for {name!r}: {', '.join(sorted(unknown))}")
        if len(set(steps)) != len(steps) or any(not s or len(s) > 100 for s in steps):
            raise InvalidArgument(f"steps of {name!r} must be distinct non-empty names of at most 100 characters")
        existing = self._handlers.get(name)
        if existing is not None and existing.func is not func:
            same = getattr(existing.func, "__qualname__", None) == getattr(func, "__qualname__", None)
            if not same:  # re-import of the same module (autoreload) is fine; two handlers are not
                raise InvalidArgument(f"job type {name!r} already has a handler: {existing.func!r}")
        handler = Handler(name, func, tuple(steps), dict(options))
        self._handlers[name] = handler
        self._unresolved.discard(name)
        return handler

    def unregister(self, name: str) -> None:
        self._handlers.pop(name, None)

    def get(self, name: str) -> Handler:
        found = self._handlers.get(name) or self._resolve(name)
        if found is None:
            raise UnknownJobType(f"no handler is registered for job type {name!r}")
        return found

    def is_registered(self, name: str) -> bool:
        return name in self._handlers or self._resolve(name) is not None

    def all(self) -> list[Handler]:
        return list(self._handlers.values())


registry = Registry()


def handler(name: str, *, steps: Sequence[str] = (), **options: Any) -> Callable[[HandlerFunc], HandlerFunc]:
    """Decorator: run ``func`` for jobs of type ``name``. See the module docstring."""

    def decorate(func: HandlerFunc) -> HandlerFunc:
        registry.register(name, func, steps=steps, **options)
        return func

    return decorate


def sync_job_types(using: str = "default") -> int:
    """Create (or fill in defaults of) the JobType row of every registered handler; return how many new.

    Called after ``migrate``; never overwrites a value an operator set.
    """
    from .models import JobType

    created = 0
    for h in registry.all():
        obj, was_created = JobType.objects.using(using).get_or_create(name=h.name, defaults=h.options)
        created += was_created
    return created
