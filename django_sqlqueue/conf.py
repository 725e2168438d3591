"""Typed settings: ``SQLQUEUE = {...}`` in the Django settings, each key optional.

Read through :func:`get_settings` (not cached at import) so tests and ``override_settings`` work.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from django.conf import settings as django_settings

from .bounds import MAX_BACKOFF_SECONDS
from .exceptions import SqlQueueConfigError


@dataclass(frozen=True)
class QueueSettings:
    #: Database alias holding the queue tables.
    DATABASE: str = "default"
    #: Attempts a job gets when neither the job nor its type says otherwise.
    MAX_ATTEMPTS: int = 3
    #: Retry backoff: base * 2 ** (attempt - 1) seconds, +/- JITTER share, capped at BACKOFF_MAX_SECONDS.
    BACKOFF_BASE_SECONDS: float = 5.0
    BACKOFF_MAX_SECONDS: float = 3600.0
    BACKOFF_JITTER: float = 0.2
    #: Default per-type run-time limit and lease length, for types that do not set their own.
    TIMEOUT_SECONDS: int = 300
    LEASE_SECONDS: int = 60
    #: How often a worker renews its heartbeat and the leases of the jobs it holds.
    HEARTBEAT_SECONDS: float = 10.0
    #: A worker whose heartbeat is older than this is dead: the claim takes its jobs at once.
    WORKER_DEAD_AFTER_SECONDS: float = 60.0
    #: Largest serialised payload accepted at enqueue, in bytes.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Largest serialised response (a handler's return value) stored, in bytes; a larger one fails the job.
    MAX_RESPONSE_BYTES: int = 1_000_000
    #: Seconds a worker caches job-type settings before re-reading them.
    TYPE_CACHE_SECONDS: float = 5.0
    #: Idle polling: start at POLL_MIN_SECONDS, double up to POLL_MAX_SECONDS while there is no work.
    POLL_MIN_SECONDS: float = 0.05
    POLL_MAX_SECONDS: float = 2.0
    #: PostgreSQL only: wake idle workers with LISTEN/NOTIFY on this channel ("" turns it off).
    NOTIFY_CHANNEL: str = "sqlqueue"
    #: PostgreSQL only: the database alias idle workers LISTEN through ("": DATABASE's). Set it to an
    #: alias with a direct connection (or a session pool) when DATABASE goes through a transaction pooler.
    LISTEN_DATABASE: str = ""
    #: ``--batch auto`` (the default): most jobs a slot claims at once, and the seconds a claimed batch
    #: may take before its unstarted jobs are handed back to other slots (see batching.py).
    BATCH_MAX: int = 50
    BATCH_SECONDS: float = 0.5
    #: A busy worker's claims take only due jobs; every RECLAIM_SECONDS (and whenever a claim comes back
    #: empty) a claim also takes stuck Processing jobs: expired leases, dead or stopped workers' jobs.
    RECLAIM_SECONDS: float = 1.0
    #: Recurring schedules declared in code: ``{name: {"type" | "task": ..., "cron" | "every": ...}}``,
    #: synced into the Schedule table at migrate and worker start (see schedules.py, docs/schedules.md).
    #: Entries are checked by a system check; a bad one is skipped by the worker, never fatal.
    #: A dict of name -> entry; anything else is reported by the check (E202) and synced as nothing.
    SCHEDULES: Any = field(default_factory=dict)
    #: How often each worker (its supervisor) looks for due schedule rows; 0 turns looking off.
    SCHEDULES_CHECK_SECONDS: float = 1.0
    #: Cancelling a running job: a slot whose job has run this long looks for a cancel request of it
    #: every CANCEL_CHECK_SECONDS (one primary-key read on a small table; shorter jobs never look).
    CANCEL_CHECK_SECONDS: float = 1.0
    #: Seconds a cancelled handler gets to stop by itself (``ctx.cancelled``) before its slot process
    #: is killed, as a timeout kills it; a handler may set its own (``cancel_grace_seconds=``).
    CANCEL_GRACE_SECONDS: float = 2.0


_NUMERIC_MINIMUMS = {
    "MAX_ATTEMPTS": 1,
    "BACKOFF_BASE_SECONDS": 0,
    "BACKOFF_MAX_SECONDS": 0,
    "BACKOFF_JITTER": 0,
    "TIMEOUT_SECONDS": 1,
    "LEASE_SECONDS": 1,
    "HEARTBEAT_SECONDS": 0.01,
    "WORKER_DEAD_AFTER_SECONDS": 1,
    "MAX_PAYLOAD_BYTES": 1,
    "MAX_RESPONSE_BYTES": 1,
    "TYPE_CACHE_SECONDS": 0,
    "POLL_MIN_SECONDS": 0.001,
    "POLL_MAX_SECONDS": 0.001,
    "BATCH_MAX": 1,
    "BATCH_SECONDS": 0.001,
    "RECLAIM_SECONDS": 0,
    "SCHEDULES_CHECK_SECONDS": 0,
    "CANCEL_CHECK_SECONDS": 0.05,
    "CANCEL_GRACE_SECONDS": 0,
}


#: (the user's items, the settings built from them): the hot path calls get_settings() per job.
_cache: tuple[tuple[Any, ...], QueueSettings] | None = None


def get_settings() -> QueueSettings:
    """Return the effective settings, validating the user's ``SQLQUEUE`` dict.

    Rebuilt whenever the dict's items differ from last time (override_settings, a test that edits
    it), otherwise served from a one-entry cache: building and validating costs more than a query's
    worth of Python, and the worker asks several times per job.
    """
    global _cache
    user = getattr(django_settings, "SQLQUEUE", {}) or {}
    try:
        key: tuple[Any, ...] = tuple((k, _hashable(v)) for k, v in user.items())
        hash(key)
    except TypeError:  # an unhashable value: let the validation below report it, uncached
        key = ()
    else:
        cached = _cache
        if cached is not None and cached[0] == key:
            return cached[1]
    result = _build(user)
    if key or not user:
        _cache = (key, result)
    return result


def _hashable(value: Any) -> Any:
    """A dict setting (SCHEDULES, or a malformed list in its place) as its JSON text, so the cache key stays
    hashable; others as they are."""
    if isinstance(value, dict | list):
        return ("dict", json.dumps(value, sort_keys=True, default=repr))
    return value


def _build(user: Any) -> QueueSettings:
    known = {f.name for f in fields(QueueSettings)}
    unknown = set(user) - known
    if unknown:
        raise SqlQueueConfigError(f"unknown SQLQUEUE setting(s): {', '.join(sorted(unknown))}")
    result = replace(QueueSettings(), **user)
    for name, minimum in _NUMERIC_MINIMUMS.items():
        value = getattr(result, name)
        if not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
            raise SqlQueueConfigError(f"SQLQUEUE[{name!r}] must be a number >= {minimum}, got {value!r}")
    for name in ("BACKOFF_BASE_SECONDS", "BACKOFF_MAX_SECONDS"):
        value = getattr(result, name)
        if value > MAX_BACKOFF_SECONDS:
            raise SqlQueueConfigError(f"SQLQUEUE[{name!r}] must be at most {MAX_BACKOFF_SECONDS} seconds (a year), "
                                      f"got {value!r}")
    if not isinstance(result.LISTEN_DATABASE, str):
        raise SqlQueueConfigError(f"SQLQUEUE['LISTEN_DATABASE'] must be a database alias (a string), "
                                  f"got {result.LISTEN_DATABASE!r}")
    # A SCHEDULES that is not a dict is NOT refused here: every enqueue and every worker reads these
    # settings, and bad schedule input must stop nothing but the schedules (docs/schedules.md). The
    # system check reports it (sqlqueue.E202) and the workers sync nothing while it stays malformed.
    if not isinstance(result.BATCH_MAX, int) or result.BATCH_MAX > 1000:
        raise SqlQueueConfigError(f"SQLQUEUE['BATCH_MAX'] must be an integer from 1 to 1000, got {result.BATCH_MAX!r}")
    return result
