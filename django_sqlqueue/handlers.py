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

from .bounds import validate_name
from .exceptions import InvalidArgument, UnknownJobType

HandlerFunc = Callable[..., Any]


@dataclass(frozen=True)
class Handler:
    name: str
    func: HandlerFunc
    steps: tuple[str, ...] = ()
    #: Defaults for the job type row created for this handler (None: the SQLQUEUE default).
    options: dict[str, Any] = field(default_factory=dict)
    #: Seconds a cancelled run gets to stop by itself before its slot is killed (None:
    #: ``SQLQUEUE['CANCEL_GRACE_SECONDS']``). The code's, not the job type row's: it is about the code.
    cancel_grace_seconds: float | None = None
    #: What a job's limit key is (docs/limits.md): a payload field name, or a callable of the payload.
    concurrency_key: str | Callable[[Any], Any] | None = None

    def key_of(self, payload: Any) -> str:
        """The concurrency key of a job with ``payload`` ("" when the handler declares none)."""
        from .bounds import storable_concurrency_key

        spec = self.concurrency_key
        if spec is None:
            return ""
        if callable(spec):
            return storable_concurrency_key(spec(payload))
        if not isinstance(payload, dict) or spec not in payload:
            return ""  # a job without the field shares the type's "" scope
        return storable_concurrency_key(payload[spec])


#: The JobType fields a handler's options set; an operator may change each in the admin.
TYPE_FIELDS: tuple[str, ...] = ("description", "max_attempts", "backoff_base_seconds", "backoff_max_seconds",
                                "timeout_seconds", "lease_seconds", "concurrency_limit", "rate_limit")
_TYPE_OPTIONS = frozenset(TYPE_FIELDS)
#: What a JobType field holds when the code says nothing about it (blank: the SQLQUEUE default).
_UNSET_VALUE: dict[str, Any] = {"description": "", "rate_limit": ""}


def _check_option(name: str, key: str, value: Any) -> None:
    """Refuse a handler option the JobType column cannot hold, when the handler is declared."""
    if key in ("concurrency_limit", "rate_limit"):
        from .bounds import check_concurrency_limit, parse_rate

        if key == "concurrency_limit":
            check_concurrency_limit(value, f"handler option concurrency_limit of {name!r}")
        elif value is not None:
            parse_rate(value)
        return
    if key == "description":
        ok = isinstance(value, str) and len(value) <= 500
        what = "a string of at most 500 characters"
    elif key in ("backoff_base_seconds", "backoff_max_seconds"):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 10**9
        what = "a number of seconds from 0 to 1e9"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 32767
        what = "an integer from 1 to 32767"
    if not ok and value is not None:
        raise InvalidArgument(f"handler option {key} of {name!r} must be {what}, got {value!r}")


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

    def register(self, name: str, func: HandlerFunc, *, steps: Sequence[str] = (),
                 cancel_grace_seconds: float | None = None,
                 concurrency_key: str | Callable[[Any], Any] | None = None, **options: Any) -> Handler:
        validate_name(name)
        if cancel_grace_seconds is not None and (
                not isinstance(cancel_grace_seconds, int | float) or isinstance(cancel_grace_seconds, bool)
                or not 0 <= cancel_grace_seconds <= 86400):
            raise InvalidArgument(f"handler option cancel_grace_seconds of {name!r} must be a number of seconds "
                                  f"from 0 to 86400, got {cancel_grace_seconds!r}")
        unknown = set(options) - _TYPE_OPTIONS
        if unknown:
            raise InvalidArgument(f"unknown handler option(s) for {name!r}: {', '.join(sorted(unknown))}")
        for key, value in options.items():
            _check_option(name, key, value)
        if options.get("concurrency_limit") is not None and options.get("rate_limit"):
            raise InvalidArgument(f"handler {name!r} may have a concurrency_limit or a rate_limit, not both "
                                  "(docs/limits.md)")
        if concurrency_key is not None and not callable(concurrency_key) and not (
                isinstance(concurrency_key, str) and concurrency_key):
            raise InvalidArgument(f"concurrency_key of {name!r} must be a payload field name or a callable of "
                                  f"the payload, got {concurrency_key!r}")
        if concurrency_key is not None and "concurrency_limit" not in options and "rate_limit" not in options:
            # A key alone limits nothing, silently. concurrency_limit=None says so on purpose: an operator
            # sets the limit on the type's row (the admin), and the key divides it from then on.
            raise InvalidArgument(f"handler {name!r} has a concurrency_key but no concurrency_limit (or rate_limit): "
                                  f"the key only divides a limit into scopes; set concurrency_limit=N, or "
                                  f"concurrency_limit=None when an operator sets the limit on the type's row "
                                  f"(docs/limits.md)")
        _check_signature(name, func, steps)
        if len(set(steps)) != len(steps) or any(not s or len(s) > 100 for s in steps):
            raise InvalidArgument(f"steps of {name!r} must be distinct non-empty names of at most 100 characters")
        existing = self._handlers.get(name)
        if existing is not None and existing.func is not func:
            same = getattr(existing.func, "__qualname__", None) == getattr(func, "__qualname__", None)
            if not same:  # re-import of the same module (autoreload) is fine; two handlers are not
                raise InvalidArgument(f"job type {name!r} already has a handler: {existing.func!r}")
        handler = Handler(name, func, tuple(steps), dict(options),
                          None if cancel_grace_seconds is None else float(cancel_grace_seconds), concurrency_key)
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

    def declared(self, name: str) -> Handler | None:
        """The handler registered under ``name``, without asking the resolvers (a dict lookup: the
        enqueue asks it for every job's concurrency key)."""
        return self._handlers.get(name)

    def is_registered(self, name: str) -> bool:
        return name in self._handlers or self._resolve(name) is not None

    def all(self) -> list[Handler]:
        return list(self._handlers.values())

    def options_for(self, name: str) -> dict[str, Any] | None:
        """The options the code declares for type ``name`` (None: no handler or task knows the name)."""
        found = self._handlers.get(name) or self._resolve(name)
        return None if found is None else {k: v for k, v in found.options.items() if v is not None}


registry = Registry()


def _check_signature(name: str, func: Any, steps: Sequence[str]) -> None:
    """Refuse, at registration, a handler the worker could never call: it is called with the job (and,
    for a multi-step handler, the step name), so it must take that many positional arguments."""
    import inspect

    if not callable(func):
        raise InvalidArgument(f"the handler of {name!r} must be callable, got {func!r}")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return
    wanted = ["job", "step"] if steps else ["job"]
    try:
        signature.bind(*wanted)
    except TypeError:
        raise InvalidArgument(
            f"the handler of {name!r} must take {' and '.join(wanted)} ({'def f(job, step)' if steps else 'def f(job)'}"
            f"): {getattr(func, '__qualname__', func)}{signature} cannot be called so") from None


def handler(name: str, *, steps: Sequence[str] = (), concurrency_key: str | Callable[[Any], Any] | None = None,
            **options: Any) -> Callable[[HandlerFunc], HandlerFunc]:
    """Decorator: run ``func`` for jobs of type ``name``. See the module docstring; limits
    (``concurrency_limit=2``, ``rate_limit="10/s"``, ``concurrency_key="customer_id"``): docs/limits.md."""

    def decorate(func: HandlerFunc) -> HandlerFunc:
        registry.register(name, func, steps=steps, concurrency_key=concurrency_key, **options)
        return func

    return decorate


@dataclass
class TypeDrift:
    """How a job type's row compares with its handler's options (see :func:`compare`)."""

    #: Fields the code changed since it last wrote the row and the operator did not touch: field ->
    #: the code's value. :func:`sync_job_types` writes them.
    follow: dict[str, Any] = field(default_factory=dict)
    #: Fields an operator changed (the row's value is not the one the code last wrote): field ->
    #: (the row's value, the code's value). The row wins; ``check`` and the admin show them.
    operator: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: The code's options as they should be remembered on the row (its ``code_options``).
    remembered: dict[str, Any] = field(default_factory=dict)


def compare(row: Any, options: dict[str, Any]) -> TypeDrift:
    """Compare a JobType row with the code's ``options`` for it.

    The row remembers what the code last wrote (``code_options``). A field whose value still equals
    that follows the code; a field whose value differs was changed by an operator (the admin, a shell)
    and is kept, since the row is the operator's run-time override. A blank field follows the code (so
    an operator hands a setting back by blanking it; a row created with the name only, before the
    code's options were known, follows the code in every field).
    """
    drift = TypeDrift(remembered={k: options[k] for k in TYPE_FIELDS if options.get(k) is not None})
    last = row.code_options if isinstance(row.code_options, dict) else {}
    for key in TYPE_FIELDS:
        unset = _UNSET_VALUE.get(key)
        code = options.get(key, unset)
        code = unset if code is None else code
        value = getattr(row, key)
        if value == code:
            continue
        if value == last.get(key, unset) or value == unset:  # untouched, or blanked: the code's again
            drift.follow[key] = code
        else:
            drift.operator[key] = (value, code)
    return drift


def sync_job_types(using: str = "default", names: Sequence[str] | None = None) -> dict[str, TypeDrift]:
    """Bring every registered handler's JobType row in line with the code; return each type's drift.

    A missing row is created with the handler's options. On an existing row, a field the operator has
    not changed takes the code's current value (a changed ``timeout_seconds=`` reaches the row); a field
    an operator changed is kept and reported in the result's ``operator`` entries. Called after
    ``migrate`` and when a worker starts. ``names``: only these types (default: every handler).
    """
    from django.apps import apps

    JobType = apps.get_model("django_sqlqueue", "JobType")  # below models.py: no import of it
    report: dict[str, TypeDrift] = {}
    handlers = [h for h in registry.all() if names is None or h.name in names]
    # One read of the (small: a row per type) table, not one per handler: this runs after each migrate
    # and flush and at every worker's start. No IN list: SQL Server takes at most 2,100 parameters.
    rows = {r.name: r for r in JobType.objects.using(using).all()}
    for h in handlers:
        options = {k: v for k, v in h.options.items() if v is not None}
        row = rows.get(h.name)
        if row is None:
            row, created = JobType.objects.using(using).get_or_create(
                name=h.name, defaults={**options, "code_options": options})
            if created:
                report[h.name] = TypeDrift(remembered=options)
                continue
        drift = compare(row, options)
        report[h.name] = drift
        changed = list(drift.follow)
        for key, value in drift.follow.items():
            setattr(row, key, value)
        if row.code_options != drift.remembered:
            row.code_options = drift.remembered
            changed.append("code_options")
        if changed:
            row.save(using=using, update_fields=[*changed, "updated_at"])
    refresh_small_tables_stats(using)
    return report


def refresh_small_tables_stats(using: str) -> None:
    """Planner statistics for the small tables the claim joins, where the vendor needs them sent
    (PostgreSQL: see ``PostgresDialect.small_tables_stats_sql``). A failure (a role that may not analyze
    them) costs a worse plan, never the sync: it is logged."""
    import logging

    from django.db import DatabaseError, connections, transaction

    from .dialects import get_dialect

    sql = get_dialect(connections[using]).small_tables_stats_sql()
    if sql is None:
        return
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as exc:
        logging.getLogger("django_sqlqueue").warning("small_tables_not_analyzed database=%s error=%s", using, exc)


def describe_overrides(report: dict[str, TypeDrift]) -> list[str]:
    """One line per field where an operator's value on the row overrides the code's."""
    return [
        f"job type {name!r}: {key} is {row!r} on the row (changed by an operator), the code says {code!r}; "
        f"the row wins (blank it in the admin to follow the code again)"
        for name, drift in sorted(report.items()) for key, (row, code) in drift.operator.items()
    ]
