"""Job-type lookup with a short-lived cache, so the hot path does not query settings per job.

The cache maps a type name to a frozen snapshot of its row plus the effective settings (the row's
value, else the ``SQLQUEUE`` default). Only committed rows are cached (see :func:`_remember`). It
expires after ``TYPE_CACHE_SECONDS`` and is cleared at once when a ``JobType`` is saved in this process
(the admin), so an operator's change reaches every worker within that many seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from django.apps import apps
from django.db import IntegrityError, connections, transaction

from .bounds import validate_name
from .conf import get_settings
from .exceptions import UnknownJobType


@dataclass(frozen=True)
class TypeInfo:
    id: int
    name: str
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    timeout_seconds: int
    lease_seconds: int
    paused: bool
    is_task: bool = False
    #: Global limits (docs/limits.md): None / "" when the type has none.
    concurrency_limit: int | None = None
    rate_limit: str = ""

    @property
    def limited(self) -> bool:
        """Its jobs are claimed only with a permit (the claim's limited branch)."""
        return self.concurrency_limit is not None or bool(self.rate_limit)


_lock = threading.Lock()
_by_name: dict[tuple[str, str], tuple[float, TypeInfo]] = {}
_by_id: dict[tuple[str, int], tuple[float, TypeInfo]] = {}


_limited: dict[str, tuple[float, frozenset[int]]] = {}
#: Per database: until when (monotonic) this process's claims leave the limited branch out, after one
#: found no free permit with a job (see :func:`limited_branch_due`).
_limited_idle: dict[str, float] = {}
#: How long claims skip the limited branch after it found nothing: a permit freed by another process
#: (or a rate permit's period ending) is seen within this; one freed here is seen at once.
LIMITED_RECHECK_SECONDS = 0.25


def clear_cache(*_args: object, **_kwargs: object) -> None:
    """Forget every cached type (connected to JobType post_save/post_delete)."""
    with _lock:
        _by_name.clear()
        _by_id.clear()
        _limited.clear()
        _limited_idle.clear()


def limited_branch_due(using: str) -> bool:
    """Whether this claim should carry the limited branch: not within LIMITED_RECHECK_SECONDS of one
    that found nothing (a saturated limit would otherwise cost every claim the branch)."""
    return time.monotonic() >= _limited_idle.get(using, 0.0)


def limited_branch_result(using: str, found: bool) -> None:
    """Record what the limited branch found: nothing backs it off for LIMITED_RECHECK_SECONDS."""
    _limited_idle[using] = 0.0 if found else time.monotonic() + LIMITED_RECHECK_SECONDS


def permits_released(using: str) -> None:
    """A permit was freed in this process: the next claim looks for a limited job at once."""
    _limited_idle.pop(using, None)


def limited_type_ids(using: str) -> frozenset[int]:
    """Ids of the types with a concurrency or rate limit, cached like the types (TYPE_CACHE_SECONDS).

    Decides only whether a claim carries the limited branch and whether a finish releases a permit:
    the claim's due branch excludes limited types by their row, whatever this says, so a stale answer
    can delay a limited job (or a permit's release, to its lease's expiry) but never over-admit.
    """
    entry = _limited.get(using)
    if entry is not None and time.monotonic() - entry[0] <= get_settings().TYPE_CACHE_SECONDS:
        return entry[1]
    from django.db.models import Q

    JobType = _job_type_model()
    ids = frozenset(JobType.objects.using(using).filter(Q(concurrency_limit__isnull=False) | ~Q(rate_limit=""))
                    .values_list("id", flat=True))
    # Cached even when read inside a transaction: a limit that transaction set and then rolled back
    # only makes claims look for limited jobs in vain until the entry expires.
    with _lock:
        _limited[using] = (time.monotonic(), ids)
    return ids


#: The row's fields a TypeInfo is made of, named alike (:func:`read_all` reads no other column).
_INFO_FIELDS = tuple(f.name for f in fields(TypeInfo))


def _info(row: object) -> TypeInfo:
    s = get_settings()

    def pick(value: object, default: float) -> float:
        return default if value is None else value  # type: ignore[return-value]

    return TypeInfo(
        id=row.id,  # type: ignore[attr-defined]
        name=row.name,  # type: ignore[attr-defined]
        max_attempts=int(pick(row.max_attempts, s.MAX_ATTEMPTS)),  # type: ignore[attr-defined]
        backoff_base_seconds=float(pick(row.backoff_base_seconds, s.BACKOFF_BASE_SECONDS)),  # type: ignore[attr-defined]
        backoff_max_seconds=float(pick(row.backoff_max_seconds, s.BACKOFF_MAX_SECONDS)),  # type: ignore[attr-defined]
        timeout_seconds=int(pick(row.timeout_seconds, s.TIMEOUT_SECONDS)),  # type: ignore[attr-defined]
        lease_seconds=int(pick(row.lease_seconds, s.LEASE_SECONDS)),  # type: ignore[attr-defined]
        paused=bool(row.paused),  # type: ignore[attr-defined]
        is_task=bool(row.is_task),  # type: ignore[attr-defined]
        concurrency_limit=row.concurrency_limit,  # type: ignore[attr-defined]
        rate_limit=row.rate_limit or "",  # type: ignore[attr-defined]
    )


def _remember(using: str, info: TypeInfo) -> TypeInfo:
    """Cache ``info``, but only once what it was read from is committed.

    Inside a transaction the row may be one this transaction created (an enqueue's first use of a
    type): if it rolls back, the id is void, and SQLite hands it to the next type another process
    creates, so a cached id would file later jobs under the wrong type. So a row read inside
    ``atomic()`` is cached when that transaction commits, and forgotten if it rolls back.
    """
    if connections[using].in_atomic_block and not _known_committed(using, info):
        transaction.on_commit(lambda: _store(using, info), using=using)
    else:
        _store(using, info)
    return info


def _known_committed(using: str, info: TypeInfo) -> bool:
    """Whether this process cached the same id for the same name before (expired or not): that row was
    committed then, so re-reading it inside a transaction may refresh the cache at once (a long
    transaction that enqueues past TYPE_CACHE_SECONDS does not query the type for every job)."""
    entry = _by_name.get((using, info.name))
    return entry is not None and entry[1].id == info.id


def _store(using: str, info: TypeInfo) -> None:
    now = time.monotonic()
    with _lock:
        _by_name[(using, info.name)] = (now, info)
        _by_id[(using, info.id)] = (now, info)


def _fresh(entry: tuple[float, TypeInfo] | None) -> TypeInfo | None:
    if entry is None or time.monotonic() - entry[0] > get_settings().TYPE_CACHE_SECONDS:
        return None
    return entry[1]


def _job_type_model() -> Any:
    """JobType from Django's app registry, on a cache miss only: this cache sits below models.py (whose
    manager, the queue wing, reads types through it), so it does not import the models module."""
    return apps.get_model("django_sqlqueue", "JobType")


def get_type(name: str, *, using: str, create: bool = False, task: bool = False) -> TypeInfo:
    """The type called ``name``; create its row when ``create`` (a registered handler or task).

    ``task``: the Tasks backend is enqueueing a real ``@task`` under this name, so the row is flagged
    ``is_task`` (a worker may import the name even outside installed apps; see task_runner.may_import).
    Raises :class:`UnknownJobType` for a name with no row that may not be created.
    """
    validate_name(name)
    hit = _fresh(_by_name.get((using, name)))
    if hit is not None and (hit.is_task or not task):
        return hit
    JobType = _job_type_model()
    row = JobType.objects.using(using).filter(name=name).first()
    if row is not None and task and not row.is_task:
        JobType.objects.using(using).filter(pk=row.pk).update(is_task=True)
        row.is_task = True
    if row is None:
        from .handlers import registry

        if not create:
            from .conf import did_you_mean

            raise UnknownJobType(
                f"unknown job type {name!r}{did_you_mean(name, [h.name for h in registry.all()])}: register "
                f"a handler for it (django_sqlqueue.handler) or create the JobType row"
            )

        # Whoever creates the row (an enqueue before migrate's sync, a worker, a task's first use), it
        # takes the code's options: a max_attempts=1 in the handler must hold for the very first job.
        options = registry.options_for(name) or {}
        try:
            with transaction.atomic(using=using):
                row = JobType.objects.using(using).create(name=name, **options, code_options=options, is_task=task)
        except IntegrityError:  # another process created it first
            row = JobType.objects.using(using).get(name=name)
    return _remember(using, _info(row))


def type_ids(names: Sequence[str], *, using: str) -> tuple[int, ...]:
    """The ids of the types called ``names`` (a worker's served types, for its claim's filter), from the
    cache, with ONE read for those not cached: a worker serving 30 types sent 30 reads before a claim
    once the cache had expired (every claim of an idle slot). A name without a row raises
    :class:`UnknownJobType`, as :func:`get_type` does."""
    found: dict[str, int] = {}
    missing = []
    for name in names:
        hit = _fresh(_by_name.get((using, name)))
        if hit is None:
            missing.append(name)
        else:
            found[name] = hit.id
    if missing:
        for row in _job_type_model().objects.using(using).filter(name__in=missing):
            found[row.name] = _remember(using, _info(row)).id
        for name in missing:
            if name not in found:
                get_type(name, using=using)  # raises, naming it
    return tuple(found[name] for name in names)


def read_all(using: str, *, limit: int) -> list[str]:
    """Every type's row in ONE read (at most ``limit``, by name): their names, for the types a worker
    serves (worker/serving.py). The rows are cached as :func:`get_type` caches them, and, when every row
    was read, the limited ids as :func:`limited_type_ids` caches them: the claim that follows reads no
    type. (It read the names, the limited ids and its served types' rows, three statements before each
    claim of an idle slot, in a worker that serves a subset of the types.)"""
    rows = list(_job_type_model().objects.using(using).order_by("name").only(*_INFO_FIELDS)[:limit])
    infos = [_remember(using, _info(row)) for row in rows]
    if len(rows) < limit:
        with _lock:
            _limited[using] = (time.monotonic(), frozenset(info.id for info in infos if info.limited))
    return [info.name for info in infos]


def get_type_by_id(type_id: int, *, using: str) -> TypeInfo:
    hit = _fresh(_by_id.get((using, type_id)))
    if hit is not None:
        return hit
    row = _job_type_model().objects.using(using).get(pk=type_id)
    return _remember(using, _info(row))
