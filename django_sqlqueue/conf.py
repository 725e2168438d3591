"""Typed settings: ``SQLQUEUE = {...}`` in the Django settings, each key optional.

Read through :func:`get_settings` (not cached at import) so tests and ``override_settings`` work.
"""

from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

from .bounds import MAX_BACKOFF_SECONDS, parse_age
from .exceptions import SqlQueueConfigError
from .states import Status


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
    #: PostgreSQL with NOTIFY_CHANNEL only: how often the worker holding the maintenance lease looks for
    #: due work for the whole fleet and notifies its queues (delays and retries that came due, dead
    #: workers' jobs, freed permits, resumed queues). While those looks arrive, a listening worker's idle
    #: slots stop polling (docs/scaling.md); 0 turns the look off and every worker polls again.
    FLEET_LOOK_SECONDS: float = 2.0
    #: PostgreSQL, with WORKER_DEAD_AFTER_SECONDS of 60 or more: an idle worker lets the fleet's look stamp
    #: its rows instead of beating (docs/scaling.md, "An idle worker sends nothing"). A worker frozen with
    #: its session alive (SIGSTOP, a paused VM) is judged gone at the dead-after time if it held a job,
    #: and within 6 minutes more if it was idle. False: every worker beats every HEARTBEAT_SECONDS.
    SESSION_LIVENESS: bool = True
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
    #: Retention: finished jobs deleted automatically once this old (by finish time), per status label,
    #: e.g. ``{"Completed": "7d", "Failed": "30d", "Cancelled": "7d"}``; a status not named is kept.
    #: Run by the worker holding the maintenance lease, in short batches (worker/maintenance.py).
    RETENTION: dict[str, Any] = field(default_factory=dict)
    #: Retention: jobs per batch (one short transaction each); at most one batch per status a second.
    RETENTION_BATCH_SIZE: int = 500
    #: The maintenance lease (reap, heal, backstops, schedule looks, retention: once per fleet): how long
    #: a holder keeps it without renewing. A dead holder's work moves to another worker within this.
    MAINTENANCE_LEASE_SECONDS: float = 30.0


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
    "FLEET_LOOK_SECONDS": 0,
    "BATCH_MAX": 1,
    "BATCH_SECONDS": 0.001,
    "RECLAIM_SECONDS": 0,
    "SCHEDULES_CHECK_SECONDS": 0,
    "CANCEL_CHECK_SECONDS": 0.05,
    "CANCEL_GRACE_SECONDS": 0,
    "RETENTION_BATCH_SIZE": 1,
    "MAINTENANCE_LEASE_SECONDS": 2,
}


#: (a copy of the user's items, the settings built from them): the hot path calls get_settings() per
#: job and per enqueue.
_cache: tuple[tuple[tuple[str, Any], ...], QueueSettings] | None = None


def get_settings() -> QueueSettings:
    """Return the effective settings, validating the user's ``SQLQUEUE`` dict.

    Rebuilt whenever the dict's items differ from last time (override_settings, a test that edits
    it, nested values included), otherwise served from a one-entry cache: building and validating
    costs more than a query's worth of Python, and the worker asks several times per job. The items
    are compared with a deep copy taken when the settings were built, by ``==`` (C-level): they were
    compared as a key with each dict turned into JSON text, which cost 42-59 us a call with five
    SCHEDULES (four calls per enqueue), against 5 us now (6-7 us against 2.3 us without schedules).
    """
    global _cache
    user = getattr(django_settings, "SQLQUEUE", {}) or {}
    items = tuple(user.items()) if isinstance(user, dict) else None
    cached = _cache
    if items is not None and cached is not None and cached[0] == items:
        return cached[1]
    result = _build(user)
    if items is not None:
        try:
            _cache = (copy.deepcopy(items), result)
        except Exception:  # noqa: BLE001 (a value that cannot be copied: validated each time, uncached)
            _cache = None
    return result


def _build(user: Any) -> QueueSettings:
    """The settings from the user's dict; every problem in it reported at once (one run, one fix)."""
    if not isinstance(user, dict):
        raise SqlQueueConfigError(f"SQLQUEUE must be a dict of setting name -> value, got {user!r}")
    known = [f.name for f in fields(QueueSettings)]
    problems = [f"unknown SQLQUEUE setting {name!r}{did_you_mean(str(name), known)}"
                for name in sorted(set(user) - set(known), key=str)]
    result = replace(QueueSettings(), **{k: v for k, v in user.items() if k in known})
    for name, minimum in _NUMERIC_MINIMUMS.items():
        value = getattr(result, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < minimum:
            problems.append(f"SQLQUEUE[{name!r}] must be a number >= {minimum}, got {value!r}")
        elif name in ("BACKOFF_BASE_SECONDS", "BACKOFF_MAX_SECONDS") and value > MAX_BACKOFF_SECONDS:
            problems.append(f"SQLQUEUE[{name!r}] must be at most {MAX_BACKOFF_SECONDS} seconds (a year), got {value!r}")
    if not isinstance(result.SESSION_LIVENESS, bool):
        problems.append(f"SQLQUEUE['SESSION_LIVENESS'] must be True or False, got {result.SESSION_LIVENESS!r}")
    for name in ("DATABASE", "LISTEN_DATABASE", "NOTIFY_CHANNEL"):
        if not isinstance(getattr(result, name), str):
            problems.append(f"SQLQUEUE[{name!r}] must be a string (a database alias, a channel name), "
                            f"got {getattr(result, name)!r}")
    if isinstance(result.NOTIFY_CHANNEL, str) and len(result.NOTIFY_CHANNEL.encode()) > 63:
        # PostgreSQL's identifier limit: pg_notify refuses a longer channel ("channel name too long")
        # and, sent after an autocommit enqueue's COMMIT, would fail every enqueue of committed jobs.
        problems.append(f"SQLQUEUE['NOTIFY_CHANNEL'] must be at most 63 bytes (a PostgreSQL identifier), "
                        f"got {len(result.NOTIFY_CHANNEL.encode())}")
    databases = getattr(django_settings, "DATABASES", {}) or {}
    if isinstance(result.DATABASE, str) and result.DATABASE not in databases:
        problems.append(f"SQLQUEUE['DATABASE'] names {result.DATABASE!r}, which is not in DATABASES"
                        f"{did_you_mean(result.DATABASE, list(databases))}")
    # A SCHEDULES that is not a dict is NOT refused here: every enqueue and every worker reads these
    # settings, and bad schedule input must stop nothing but the schedules (docs/schedules.md). The
    # system check reports it (sqlqueue.E202) and the workers sync nothing while it stays malformed.
    if isinstance(result.BATCH_MAX, int | float) and (not isinstance(result.BATCH_MAX, int) or result.BATCH_MAX > 1000):
        problems.append(f"SQLQUEUE['BATCH_MAX'] must be an integer from 1 to 1000, got {result.BATCH_MAX!r}")
    if isinstance(result.RETENTION_BATCH_SIZE, int | float) and (
            not isinstance(result.RETENTION_BATCH_SIZE, int) or result.RETENTION_BATCH_SIZE > 2000):
        problems.append(f"SQLQUEUE['RETENTION_BATCH_SIZE'] must be an integer from 1 to 2000, "
                        f"got {result.RETENTION_BATCH_SIZE!r}")
    try:
        retention_ages(result.RETENTION)
    except SqlQueueConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise SqlQueueConfigError("; ".join(problems), problems=problems)
    return result


def retention_ages(value: Any) -> dict[Status, timedelta]:
    """``SQLQUEUE["RETENTION"]`` as {finished status: age}, or :class:`SqlQueueConfigError` saying which
    entry is wrong and what it may be (a system check reports it: ``sqlqueue.E001``)."""
    from .states import FINISHED

    finished = ", ".join(s.label for s in sorted(FINISHED))
    if not isinstance(value, dict):
        raise SqlQueueConfigError(f"SQLQUEUE['RETENTION'] must be a dict of status -> age, e.g. "
                                  f"{{'Completed': '7d', 'Failed': '30d'}}, got {value!r}")
    out: dict[Status, timedelta] = {}
    for label, age in value.items():
        try:
            status = Status.from_label(label) if isinstance(label, str) else None
        except ValueError:
            status = None
        if status is None or status not in FINISHED:
            raise SqlQueueConfigError(f"SQLQUEUE['RETENTION']: {label!r} is not a finished status; retention "
                                      f"deletes only finished jobs: {finished}")
        if status in out:
            raise SqlQueueConfigError(f"SQLQUEUE['RETENTION'] names {status.label} twice")
        try:
            out[status] = parse_age(age, f"SQLQUEUE['RETENTION'][{label!r}]")
        except ValueError as exc:
            raise SqlQueueConfigError(str(exc)) from None
    return out


def did_you_mean(name: str, choices: Any) -> str:
    """``" (did you mean 'MAX_ATTEMPTS'?)"`` for the closest of ``choices``, or ``""`` when none is close.

    Case is ignored (``max_attempts``, ``lease_secs``); :mod:`difflib` finds a near spelling.
    """
    by_lower = {c.lower(): c for c in choices if isinstance(c, str)}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
