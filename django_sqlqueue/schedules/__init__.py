"""Recurring schedules: cron expressions and fixed intervals, each tick enqueued exactly once, no leader.

A schedule is a row (:class:`~django_sqlqueue.models.Schedule`), declared in ``SQLQUEUE["SCHEDULES"]``
(synced by :func:`sync_schedules` after ``migrate`` and at worker start) or created in the admin.
The worker holding the fleet's maintenance lease (:mod:`django_sqlqueue.worker.maintenance`) runs
:func:`run_due` every ``SCHEDULES_CHECK_SECONDS``; the claim below needs no leader (two lookers at
once, during a lease handover, enqueue each tick once), the lease only spares the other workers' looks:

1. the look: ONE statement, two partial-index seeks, no locks (:meth:`Dialect.schedules_probe_sql`):
   "is any enabled schedule due?" and "is any tick's job past its expiry?". Nothing due: done.
2. the claim, in one transaction (:meth:`Dialect.schedules_transaction`): the due rows are read with
   the vendor's skip-locked read (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, ``UPDLOCK, READPAST`` on
   SQL Server, an immediate transaction on SQLite); for each, the misfire policy picks the ticks to
   run, each tick's job is enqueued together with its :class:`ScheduleRun` row, and ``next_run_at``
   moves past now. A second worker skips the locked row, or sees it already advanced. The unique
   (schedule, tick) key of ScheduleRun is the backstop: a tick can never hold two jobs.

All times come from the database clock (``now`` is a parameter only so tests can move the clock).
Cron expressions are parsed and evaluated by ``cronsim`` (maintained, used in production by
Healthchecks, and matching Debian cron, including its handling of DST transitions), in the schedule's
time zone; ticks are stored in UTC.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.db import IntegrityError, connections, transaction

from ..conf import get_settings
from ..dialects import get_dialect
from ..exceptions import IllegalTransition, InvalidArgument, JobNotFound, StaleJob
from ..states import CLAIMABLE, Status
from ..worker.support import DB_DOWN_ERRORS, db_now, one_line

log = logging.getLogger("django_sqlqueue.schedules")

MISFIRE_POLICIES = ("run_once", "skip", "run_all")
#: Keys a ``SQLQUEUE["SCHEDULES"]`` entry may have.
ENTRY_KEYS = frozenset({"type", "task", "payload", "args", "kwargs", "queue", "priority", "cron", "timezone",
                        "every", "enabled", "misfire", "misfire_limit", "misfire_grace", "expires"})
#: Most due schedules one claim takes (a look claims again while it gets this many).
CLAIM_LIMIT = 100
#: ScheduleRun rows kept per schedule (older ones are pruned; rows still awaiting expiry are kept).
KEEP_RUNS = 100
#: Longest back-off between looks after errors (the database is down, the table is not migrated yet).
MAX_LOOK_BACKOFF = 60.0
#: A running worker syncs its settings again this often: it keeps its settings version marked live, and
#: puts its schedules back if an older version's sync got in meanwhile.
RESYNC_SECONDS = 60.0
#: A worker that does not hold the maintenance lease only keeps its version live, this often, with ONE
#: statement (:func:`keep_version_live`): the holder (every RESYNC_SECONDS) puts schedules back. A full
#: sync in every worker every minute was seven statements: most of what an idle worker still sent.
RESYNC_OTHERS_SECONDS = 120.0
#: A settings version no sync has seen for this long is no longer live: an older one may apply again (a
#: rollback), and the same version seen again later counts as new (a schedule removed and added back).
LIVE_SECONDS = 300.0


class ScheduleError(InvalidArgument):
    """A schedule definition that cannot run: bad cron, unknown zone or target, bad interval..."""


# ----- definitions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleDef:
    """A validated schedule definition (from a settings entry, a row, or the admin form)."""

    name: str
    job_type: str = ""
    task: str = ""
    payload: Any = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    cron: str = ""
    timezone: str = "UTC"
    every_seconds: int | None = None
    enabled: bool = True
    misfire: str = "run_once"
    misfire_limit: int = 10
    misfire_grace_seconds: int = 60
    expires_after_seconds: int | None = None

    #: Model fields a definition sets (a deploy rewrites these on a declared row, see sync_schedules).
    FIELDS = ("job_type", "task", "payload", "queue", "priority", "cron", "timezone", "every_seconds", "misfire",
              "misfire_limit", "misfire_grace_seconds", "expires_after_seconds")
    #: Fields whose change moves next_run_at (the tick grid changes).
    TIMING = ("cron", "timezone", "every_seconds")

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def values(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.FIELDS}

    def describe(self) -> str:
        when = f"cron {self.cron!r} ({self.timezone})" if self.cron else f"every {self.every_seconds} s"
        return f"{self.task or self.job_type}, {when}"


def _seconds(value: Any, what: str, minimum: int, *, allow_none: bool = False) -> int | None:
    """Whole seconds from an int (or an integral float) or a timedelta; refuses bools and fractions."""
    if value is None and allow_none:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScheduleError(f"{what} must be a whole number of seconds, got {value!r}")
    if value != int(value):
        raise ScheduleError(f"{what} must be a whole number of seconds, got {value!r}")
    if value < minimum:
        raise ScheduleError(f"{what} must be at least {minimum} s, got {value!r}")
    if value > 100 * 365 * 86400:
        raise ScheduleError(f"{what} must be at most a century, got {value!r}")
    return int(value)


def check_timing(cron: str, timezone: str, every: Any) -> int | None:
    """Validate the timing part (either a 5-field cron expression and a time zone, or an interval);
    return the interval in seconds (None for cron)."""
    if bool(cron) == (every is not None):
        raise ScheduleError("give either a cron expression or an interval ('every'), not both and not neither")
    if not isinstance(timezone, str) or not timezone:
        raise ScheduleError(f"timezone must be a time zone name such as 'Europe/Paris', got {timezone!r}")
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleError(f"unknown time zone {timezone!r} (use an IANA name such as 'Europe/Paris')") from None
    if every is not None:
        return _seconds(every, "the interval ('every')", 1)
    if not isinstance(cron, str) or len(cron.split()) != 5:
        raise ScheduleError(f"the cron expression must have 5 fields (minute hour day month weekday), got {cron!r}")
    try:
        it = CronSim(cron, datetime.now(zone))
        next(it)
    except CronSimError as exc:
        raise ScheduleError(f"invalid cron expression {cron!r}: {exc}") from None
    except StopIteration:
        raise ScheduleError(f"the cron expression {cron!r} matches no time in the next 50 years") from None
    return None


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ScheduleError(f"{what} must be JSON (lists, dicts, strings, numbers, booleans, None): {exc}") from None


def check_target(job_type: str, task: str, payload: Any, queue: str, priority: Any, *,
                 known_type: Any = None) -> None:
    """Validate what a tick enqueues: exactly one of a job type and a task, with a payload it takes.

    ``known_type(name)`` decides whether a job type exists (default: a handler is registered for it).
    """
    from ..handlers import registry
    from ..jobtypes import validate_name

    if bool(job_type) == bool(task):
        raise ScheduleError("give either a job type ('type') or a Django task ('task'), not both and not neither")
    if not isinstance(queue, str) or not queue or len(queue) > 100:
        raise ScheduleError(f"queue must be a non-empty string of at most 100 characters, got {queue!r}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -32768 <= priority <= 32767:
        raise ScheduleError(f"priority must be an integer from -32768 to 32767, got {priority!r}")
    _json(payload, "the payload")
    if job_type:
        try:
            validate_name(job_type)
        except InvalidArgument as exc:
            raise ScheduleError(str(exc)) from None
        known = known_type(job_type) if known_type is not None else registry.is_registered(job_type)
        if not known:
            raise ScheduleError(f"unknown job type {job_type!r}: no handler is registered for it")
        return
    task_obj = load_schedule_task(task)
    if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
        raise ScheduleError('a task\'s payload must be {"args": [...], "kwargs": {...}}')
    if not isinstance(payload.get("args", []), list) or not isinstance(payload.get("kwargs", {}), dict):
        raise ScheduleError("a task's args must be a list and its kwargs a dict")
    try:
        task_obj.using(queue_name=queue, priority=priority)
    except Exception as exc:  # django.tasks' InvalidTask: a queue the backend does not serve, a priority
        raise ScheduleError(f"task {task!r} cannot be enqueued with queue {queue!r} and priority {priority}: "
                            f"{exc}") from None


def load_schedule_task(path: str) -> Any:
    """The ``django.tasks`` Task at ``path``, enqueued through a SqlQueueBackend (so ``get_result``
    reads the tick's job); :class:`ScheduleError` otherwise."""
    from ..tasks.runner import load_task, may_import

    backend_problem = _tasks_backend_problem()
    if backend_problem:  # said first: importing the module may fail on another task's queue name
        raise ScheduleError(f"task {path!r}: {backend_problem}")
    # A path written in SQLQUEUE["SCHEDULES"] is the developer's own code: imported wherever it lives.
    # One typed into the admin is an operator's: only a task module of an installed app (or a task the
    # backend enqueued before) may be imported for it -- any other path would run any module's code.
    entries = get_settings().SCHEDULES  # not a dict: a check error (E202), never an exception here
    declared = isinstance(entries, Mapping) and path in {
        e.get("task") for e in entries.values() if isinstance(e, Mapping)}
    try:
        task_obj = load_task(path, trusted=declared)
    except Exception as exc:
        raise ScheduleError(f"task {path!r} cannot be imported: {exc}") from None
    if task_obj is None and not declared and not may_import(path):
        raise ScheduleError(f"task {path!r} is not in an installed app: a schedule made in the admin may name only "
                            f"tasks of installed apps (an operator's entry must not import arbitrary modules); "
                            f"declare it in SQLQUEUE['SCHEDULES'] or move the task into an installed app")
    if task_obj is None:  # also every path on Django < 6.0 (no tasks framework)
        raise ScheduleError(f"unknown task {path!r}: not the import path of a @task function")
    from ..tasks.backend import SqlQueueBackend  # needs django.tasks, which exists if a task was found
    try:
        backend = task_obj.get_backend()
    except Exception as exc:
        raise ScheduleError(f"task {path!r}: its TASKS backend cannot be loaded: {exc}") from None
    if not isinstance(backend, SqlQueueBackend):
        raise ScheduleError(f"task {path!r} uses the {type(backend).__name__} backend; scheduled tasks must use "
                            f"django_sqlqueue.tasks.SqlQueueBackend")
    return task_obj


def _tasks_backend_problem() -> str | None:
    """Why no task can be scheduled with these TASKS settings (none uses SqlQueueBackend), or None."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict) or not tasks:
        return ("TASKS is not set (Django's default is ImmediateBackend); scheduled tasks must use "
                "django_sqlqueue.tasks.SqlQueueBackend")
    paths = {alias: str((conf or {}).get("BACKEND", "")) for alias, conf in tasks.items() if isinstance(conf, dict)}
    if any(p.rpartition(".")[2] == "SqlQueueBackend" for p in paths.values()):
        return None
    default = paths.get("default") or next(iter(paths.values()), "")
    return (f"TASKS uses {default.rpartition('.')[2] or 'no backend'}, not django_sqlqueue.tasks.SqlQueueBackend; "
            f"scheduled tasks must use SqlQueueBackend")


def parse_entry(name: Any, entry: Any) -> ScheduleDef:
    """A ``SQLQUEUE["SCHEDULES"]`` entry as a definition; :class:`ScheduleError` says what is wrong."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ScheduleError(f"a schedule name must be a non-empty string of at most 200 characters, got {name!r}")
    if not isinstance(entry, Mapping):
        raise ScheduleError(f"the entry must be a dict, got {type(entry).__name__}")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise ScheduleError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                            f"known: {', '.join(sorted(ENTRY_KEYS))}")
    job_type, task = entry.get("type") or "", entry.get("task") or ""
    if not isinstance(job_type, str) or not isinstance(task, str):
        raise ScheduleError("'type' and 'task' must be strings")
    if task:
        if "payload" in entry:
            raise ScheduleError("a task entry takes 'args' and 'kwargs', not 'payload'")
        payload: Any = {"args": list(entry.get("args", [])) if isinstance(entry.get("args", []), list | tuple)
                        else entry.get("args"), "kwargs": entry.get("kwargs", {})}
    else:
        if "args" in entry or "kwargs" in entry:
            raise ScheduleError("a job type entry takes 'payload', not 'args'/'kwargs'")
        payload = entry.get("payload", {})
    from django.conf import settings

    cron = entry.get("cron") or ""
    every = entry.get("every")
    zone = entry.get("timezone", getattr(settings, "TIME_ZONE", None) or "UTC")
    every_seconds = check_timing(cron, zone, every)
    queue, priority = entry.get("queue", "default"), entry.get("priority", 0)
    check_target(job_type, task, payload, queue, priority)
    misfire = entry.get("misfire", "run_once")
    if misfire not in MISFIRE_POLICIES:
        raise ScheduleError(f"misfire must be one of {', '.join(MISFIRE_POLICIES)}, got {misfire!r}")
    limit = entry.get("misfire_limit", 10)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 32767:
        raise ScheduleError(f"misfire_limit must be an integer from 1 to 32767, got {limit!r}")
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ScheduleError(f"enabled must be True or False, got {enabled!r}")
    return ScheduleDef(
        name=name, job_type=job_type, task=task, payload=_json(payload, "the payload"), queue=queue,
        priority=priority, cron=cron, timezone=zone, every_seconds=every_seconds, enabled=enabled,
        misfire=misfire, misfire_limit=limit,
        misfire_grace_seconds=_seconds(entry.get("misfire_grace", 60), "misfire_grace", 0) or 0,
        expires_after_seconds=_seconds(entry.get("expires"), "expires", 1, allow_none=True),
    )


def setting_error(entries: Any) -> str:
    """Why ``SQLQUEUE["SCHEDULES"]`` as a whole cannot be read ("" when it is a dict of entries)."""
    if isinstance(entries, Mapping):
        return ""
    return (f"SQLQUEUE['SCHEDULES'] must be a dict of name -> entry, got {type(entries).__name__} "
            f"{one_line(repr(entries))[:200]}; no schedule is synced while it is malformed (the rows keep "
            f"what the last good setting wrote), and jobs still run")


def declared_errors(entries: Any = None) -> list[tuple[str, str]]:
    """(name, message) for each bad entry of ``SQLQUEUE["SCHEDULES"]`` (the system check's list);
    a malformed setting as a whole is :func:`setting_error`'s (this returns [] for it)."""
    if entries is None:
        entries = get_settings().SCHEDULES
    if setting_error(entries):
        return []
    out = []
    for name, entry in entries.items():
        try:
            parse_entry(name, entry)
        except ScheduleError as exc:
            out.append((str(name), str(exc)))
    return out


def definition_of(row: Any) -> ScheduleDef:
    """A row's definition, validated (an operator or a direct SQL write may have stored nonsense)."""
    every = check_timing(row.cron, row.timezone, row.every_seconds)
    return ScheduleDef(name=row.name, job_type=row.job_type, task=row.task, payload=row.payload, queue=row.queue,
                       priority=row.priority, cron=row.cron, timezone=row.timezone, every_seconds=every,
                       enabled=row.enabled, misfire=row.misfire, misfire_limit=max(1, row.misfire_limit or 1),
                       misfire_grace_seconds=row.misfire_grace_seconds or 0,
                       expires_after_seconds=row.expires_after_seconds)


# ----- tick arithmetic (pure: the tests move the clock) --------------------------------------------
def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("schedule times must be timezone-aware")
    return value.astimezone(UTC)


def next_tick(defn: ScheduleDef, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (UTC).

    Cron: evaluated by cronsim in the schedule's zone. A fixed-time entry (``30 2 * * *``) runs once
    on a spring-forward day (at the first valid minute after the gap) and once on a fall-back day (the
    first 02:30); a frequent one (``*/20 * * * *``) follows real time through both.
    """
    after = _utc(after)
    if defn.every_seconds:
        return after + timedelta(seconds=defn.every_seconds)
    it = CronSim(defn.cron, after.astimezone(defn.zone))
    for candidate in it:
        tick = candidate.astimezone(UTC)
        if tick > after:  # a fall-back day's fixed-time tick may be read before ``after``: skip it
            return tick
    raise ScheduleError(f"the cron expression {defn.cron!r} has no next time")  # pragma: no cover


def first_run(defn: ScheduleDef, now: datetime) -> datetime:
    """``next_run_at`` of a new schedule (or one whose timing changed): the first tick after ``now``;
    an interval's grid starts one interval after ``now``."""
    return next_tick(defn, now)


def _due_cron_ticks(defn: ScheduleDef, due_at: datetime, now: datetime, cap: int) -> list[datetime]:
    """The latest ``cap`` cron ticks t with due_at < t <= now, newest first (reverse iteration: bounded
    by ``cap``, however long the workers were away)."""
    out: list[datetime] = []
    it = CronSim(defn.cron, (now + timedelta(seconds=1)).astimezone(defn.zone), reverse=True)
    for candidate in it:
        tick = candidate.astimezone(UTC)
        if tick > now:
            continue
        if tick <= due_at or len(out) >= cap:
            break
        out.append(tick)
    return out


@dataclass(frozen=True)
class Plan:
    """What one look does with a due schedule: the ticks to enqueue and the new ``next_run_at``."""

    ticks: tuple[datetime, ...]
    next_run_at: datetime
    #: Due ticks found (a cron schedule counts at most the policy's cap): more than one means ticks were
    #: missed (the workers were away, or a look came late).
    due: int


def plan_ticks(defn: ScheduleDef, due_at: datetime, now: datetime) -> Plan:
    """Apply the misfire policy to the ticks due between ``due_at`` (the stored next_run_at, itself a
    tick) and ``now``.

    - ``run_once`` (default): one job, for the latest due tick, however many were missed;
    - ``skip``: the latest due tick only if it is at most ``misfire_grace_seconds`` old, else none;
    - ``run_all``: one job per due tick, the latest ``misfire_limit`` of them.

    ``next_run_at`` is the first tick after ``now`` (an interval keeps its grid).
    """
    due_at, now = _utc(due_at), _utc(now)
    if due_at > now:
        return Plan((), due_at, 0)
    cap = defn.misfire_limit if defn.misfire == "run_all" else 1
    if defn.every_seconds:
        step = timedelta(seconds=defn.every_seconds)
        count = (now - due_at) // step + 1
        latest = due_at + (count - 1) * step
        due = [latest - i * step for i in range(min(count, cap))]  # newest first
        nxt = latest + step
        found = count
    else:
        # due_at is itself a due tick; the later ones (newest first) are looked for only as far as the
        # policy needs, so ``found`` is "at least".
        due = [*_due_cron_ticks(defn, due_at, now, cap), due_at]
        found = len(due)
        due = due[:cap]
        nxt = next_tick(defn, now)
    due.sort()
    if defn.misfire == "run_all":
        ticks = due[-cap:]
    elif defn.misfire == "skip":
        ticks = due[-1:] if (now - due[-1]).total_seconds() <= defn.misfire_grace_seconds else []
    else:
        ticks = due[-1:]
    return Plan(tuple(ticks), nxt, found)


def upcoming(defn: ScheduleDef, start: datetime, count: int) -> list[datetime]:
    """``start`` (the stored next_run_at) and the ``count - 1`` ticks after it."""
    out = [_utc(start)]
    while len(out) < count:
        out.append(next_tick(defn, out[-1]))
    return out


# ----- the database clock -----------------------------------------------------------------------------
def as_utc(value: Any) -> datetime:
    """A clock value as the driver returned it (aware, naive UTC, or SQLite's text) as aware UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def db_clock(using: str) -> datetime:
    """The database's current time (UTC): schedules never trust a worker host's clock."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {get_dialect(connection).now()}", [])
        return as_utc(cursor.fetchone()[0])


# ----- sync from settings ------------------------------------------------------------------------------
@dataclass
class SyncResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    undeclared: list[str] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)
    #: Why nothing was synced: the setting as a whole is malformed ("" otherwise).
    skipped: str = ""
    #: The fingerprint of a newer settings version still live, when this sync deferred to it ("" otherwise).
    deferred: str = ""


def sync_schedules(using: str | None = None, *, entries: Mapping[str, Any] | None = None,
                   now: datetime | None = None) -> SyncResult:
    """Make the Schedule table match ``SQLQUEUE["SCHEDULES"]`` (called after migrate and at worker start).

    A declared schedule's definition (target, payload, queue, priority, timing, misfire, expiry) is
    rewritten from the settings; ``enabled`` is the operator's: set only when the row is created, never
    written by a sync after that, so an operator's disable survives deploys. A timing change moves
    ``next_run_at``. A row declared before and no longer in the settings is parked (``declared`` off,
    no next run, ``last_error`` says why) and becomes an ordinary admin row; declared again later, it
    gets a next run and runs again (or stays disabled, if an operator disabled it). An admin row whose
    name a settings entry takes becomes declared. Bad entries are logged and skipped (the system check
    names them); idempotent, and safe while other workers do the same.

    A rolling deploy runs two versions of the settings at once, and an old worker that restarts during
    it syncs the old one. So each sync first records its version (a fingerprint of the setting) in
    :class:`ScheduleDeploy` and applies it only if no newer version (first seen later) is live (seen by
    a sync within ``LIVE_SECONDS``): the old worker's sync changes nothing (``deferred``). Running
    workers sync again every ``RESYNC_SECONDS``, which keeps their version live and converges the table
    to the newest live version. A version unseen for ``LIVE_SECONDS`` that comes back (a rollback, an
    entry removed and then added back) counts as new.
    """
    from ..models import Schedule

    alias = using or get_settings().DATABASE
    entries = get_settings().SCHEDULES if entries is None else entries
    result = SyncResult()
    if error := setting_error(entries):
        # Not "no schedules declared": that would undeclare every row. A malformed setting is unknown
        # intent, so nothing is written; the check (sqlqueue.E202) stops the deploy's `check`/`migrate`.
        result.skipped = error
        log.error("schedules_setting_invalid error=%s", error)
        return result
    defs: dict[str, ScheduleDef] = {}
    for name, entry in entries.items():
        try:
            defs[name] = parse_entry(name, entry)
        except ScheduleError as exc:
            result.invalid.append((str(name), str(exc)))
            log.error("schedule_invalid name=%s error=%s (skipped; see manage.py check)", name, exc)
    clock = _utc(now) if now is not None else db_clock(alias)
    newer = _register_version(alias, entries, clock)
    if newer:
        result.deferred = newer
        log.warning("schedules_sync_deferred newer=%s (a newer SQLQUEUE['SCHEDULES'] is live: this worker's older "
                    "settings change nothing; restart it with the new code)", newer[:12])
        return result
    for attempt in range(2):
        try:
            # Read first, write only what changed: a worker start with nothing to change takes no write
            # lock (SQLite) and no row locks.
            plan = _sync_plan(Schedule, alias, defs, clock)
            if any(plan):
                with transaction.atomic(using=alias):
                    _sync_apply(Schedule, alias, plan, result)
            break
        except IntegrityError:  # another worker created the same row meanwhile: read it and go again
            result.created.clear()
            result.updated.clear()
            result.undeclared.clear()
            if attempt:
                raise
    return result


def keep_version_live(using: str | None = None) -> bool:
    """Mark this worker's settings version seen now, in one UPDATE, if it is live (seen within
    ``LIVE_SECONDS``, less a margin); False when it is not (never recorded, or not seen for that long):
    the caller then syncs in full, which records it and decides whether it is new again."""
    from django.db.models import DateTimeField
    from django.db.models.expressions import RawSQL

    from ..models import ScheduleDeploy

    alias = using or get_settings().DATABASE
    now_plus = get_dialect(connections[alias]).now_plus("%s")
    live_after = RawSQL(now_plus, [-(LIVE_SECONDS - 60.0)], output_field=DateTimeField())
    rows = ScheduleDeploy.objects.using(alias).filter(
        fingerprint=settings_fingerprint(get_settings().SCHEDULES), seen_at__gte=live_after, seen_at__lte=db_now(alias))
    return bool(rows.update(seen_at=db_now(alias)))


def settings_fingerprint(entries: Mapping[str, Any]) -> str:
    """The version of a ``SCHEDULES`` setting: a hash of its canonical JSON (timedeltas by their repr)."""
    text = json.dumps(entries, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _register_version(alias: str, entries: Mapping[str, Any], clock: datetime) -> str:
    """Record that this settings version is live now; return the fingerprint of a newer live version
    ("" when this one is the newest live one, so its sync may apply)."""
    from ..models import ScheduleDeploy

    rows = ScheduleDeploy.objects.using(alias)
    fingerprint = settings_fingerprint(entries)
    live_after = clock - timedelta(seconds=LIVE_SECONDS)
    for attempt in range(2):
        try:
            with transaction.atomic(using=alias):
                mine = rows.filter(fingerprint=fingerprint).first()
                if mine is None:
                    mine = rows.create(fingerprint=fingerprint, first_seen_at=clock, seen_at=clock)
                    # (versions nobody has seen for a month are history)
                    rows.filter(seen_at__lt=clock - timedelta(days=30)).delete()
                else:
                    changes: dict[str, Any] = {"seen_at": max(clock, mine.seen_at)}
                    if mine.seen_at < live_after:  # back after a while: a new deploy of the same settings
                        changes["first_seen_at"] = clock
                    rows.filter(pk=mine.pk).update(**changes)
                    mine.first_seen_at = changes.get("first_seen_at", mine.first_seen_at)
            break
        except IntegrityError:  # another worker of the same deploy recorded it just now: read it
            if attempt:
                raise
    # (seen_at after clock + LIVE_SECONDS: a clock moved back, as tests do; such a row does not count)
    newer = (rows.filter(first_seen_at__gt=mine.first_seen_at, seen_at__gte=live_after,
                         seen_at__lte=clock + timedelta(seconds=LIVE_SECONDS))
             .exclude(fingerprint=fingerprint).order_by("-first_seen_at").values_list("fingerprint", flat=True)[:1])
    return next(iter(newer), "")


def _sync_plan(model: Any, alias: str, defs: dict[str, ScheduleDef], clock: datetime
               ) -> tuple[list[dict[str, Any]], list[tuple[Any, dict[str, Any]]], list[str]]:
    """(rows to create, (row, changed fields) to update, names no longer declared): reads only."""
    rows = model.objects.using(alias)
    existing = {s.name: s for s in rows.filter(name__in=list(defs))}
    create, update = [], []
    for name, defn in defs.items():
        row = existing.get(name)
        if row is None:
            create.append({"name": name, "declared": True, "enabled": defn.enabled,
                           "next_run_at": first_run(defn, clock), **defn.values()})
            continue
        changes = {f: v for f, v in defn.values().items() if getattr(row, f) != v}
        if not row.declared:
            changes["declared"] = True
        if any(f in changes for f in ScheduleDef.TIMING) or row.next_run_at is None:
            changes["next_run_at"] = first_run(defn, clock)
        if changes:
            changes["last_error"] = ""
            update.append((row, changes))
    gone = list(rows.filter(declared=True).exclude(name__in=list(defs)).values_list("name", flat=True))
    return create, update, gone


def _sync_apply(model: Any, alias: str, plan: tuple[list[dict[str, Any]], list[tuple[Any, dict[str, Any]]], list[str]],
                result: SyncResult) -> None:
    create, update, gone = plan
    rows = model.objects.using(alias)
    for values in create:
        rows.create(**values)
        result.created.append(values["name"])
    for row, changes in update:
        for f, v in changes.items():
            setattr(row, f, v)
        row.save(using=alias, update_fields=[*changes, "updated_at"])
        result.updated.append(row.name)
    if gone:
        # Parked, not disabled: ``enabled`` stays the operator's, so declaring it again brings it back
        # as it was (issue 31: a sync that disabled it left it disabled for good).
        rows.filter(declared=True, name__in=gone).update(
            declared=False, next_run_at=None,
            last_error="no longer in SQLQUEUE['SCHEDULES']: parked (save it in the admin to run it as an admin "
                       "schedule, or declare it again)")
        result.undeclared.extend(gone)
        log.warning("schedules_undeclared names=%s (no longer in SQLQUEUE['SCHEDULES']: parked)", ",".join(gone))


# ----- the look ----------------------------------------------------------------------------------------
@dataclass
class LookResult:
    enqueued: int = 0
    expired: int = 0
    claimed: int = 0
    job_ids: list[int] = field(default_factory=list)


def run_due(using: str | None = None, *, now: datetime | None = None) -> LookResult:
    """One look: enqueue the due ticks of every due schedule (exactly once across workers) and cancel
    tick jobs past their expiry. Costs one cheap statement when nothing is due."""
    alias = using or get_settings().DATABASE
    connection = connections[alias]
    dialect = get_dialect(connection)
    result = LookResult()
    with connection.cursor() as cursor:
        sql, params = dialect.schedules_probe_sql(now)
        dialect.execute(cursor, sql, params)
        due, expired = cursor.fetchone()
    if due:
        while _claim_and_enqueue(alias, dialect, now, result) >= CLAIM_LIMIT:
            pass
    if expired:
        _expire(alias, now, result)
    return result


def _claim_and_enqueue(alias: str, dialect: Any, now: datetime | None, result: LookResult) -> int:
    from ..models import Schedule

    connection = connections[alias]
    with dialect.schedules_transaction():
        with connection.cursor() as cursor:
            sql, params = dialect.claim_schedules_sql(CLAIM_LIMIT, now)
            dialect.execute(cursor, sql, params)
            rows = cursor.fetchall()
        if not rows:
            return 0
        clock = _utc(now) if now is not None else as_utc(rows[0][1])
        schedules = Schedule.objects.using(alias).in_bulk([r[0] for r in rows])
        for schedule_id, _ in rows:
            schedule = schedules.get(schedule_id)
            if schedule is not None:
                _fire(schedule, clock, alias, result)
        result.claimed += len(rows)
        return len(rows)


def _fire(schedule: Any, clock: datetime, alias: str, result: LookResult) -> None:
    """Enqueue one claimed schedule's due ticks and advance it (inside the look's transaction)."""
    from ..models import Schedule, ScheduleRun

    rows = Schedule.objects.using(alias).filter(pk=schedule.pk)
    try:
        defn = definition_of(schedule)
    except ScheduleError as exc:  # stored nonsense: park it (no next run) and say why
        log.error("schedule_broken name=%s error=%s (parked until fixed)", schedule.name, exc)
        rows.update(next_run_at=None, last_error=str(exc))
        return
    plan = plan_ticks(defn, schedule.next_run_at, clock)
    if plan.due > 1:
        log.warning("schedule_misfire name=%s due_ticks=%s policy=%s enqueued=%s (ticks were missed)",
                    schedule.name, plan.due, defn.misfire, len(plan.ticks))
    last_job, last_tick, error = None, None, ""
    for tick in plan.ticks:
        try:
            with transaction.atomic(using=alias):  # a savepoint per tick: the backstop and the job go together
                job_id = enqueue_target(defn, alias)
                expires = tick + timedelta(seconds=defn.expires_after_seconds) if defn.expires_after_seconds else None
                ScheduleRun.objects.using(alias).create(schedule_id=schedule.pk, tick_at=tick, job_id=job_id,
                                                        enqueued_at=clock, expires_at=expires)
        except IntegrityError:
            # The backstop: this tick already has its job (never expected while the claim holds).
            log.warning("schedule_tick_already_enqueued name=%s tick=%s", schedule.name, tick.isoformat())
            continue
        except DB_DOWN_ERRORS:
            raise
        except Exception as exc:  # a bad payload, an unknown type, the task's backend refusing it
            error = f"tick {tick.isoformat()}: {one_line(exc)}"
            log.error("schedule_enqueue_failed name=%s tick=%s error=%s", schedule.name, tick.isoformat(),
                      one_line(exc))
            continue
        last_job, last_tick = job_id, tick
        result.enqueued += 1
        result.job_ids.append(job_id)
    changes: dict[str, Any] = {"next_run_at": plan.next_run_at, "last_error": error}
    if last_tick is not None:
        changes.update(last_run_at=last_tick, last_job_id=last_job)
    rows.update(**changes)
    if last_job is not None and last_job % 16 == 0:
        _prune_runs(schedule.pk, alias)


def enqueue_target(defn: ScheduleDef, alias: str) -> int:
    """Enqueue one job of ``defn`` now; return its id. A task goes through its TASKS backend (so its
    result is readable with ``get_result``), a job type through ``Job.objects.enqueue``."""
    from ..models import Job

    if defn.task:
        if alias != get_settings().DATABASE:
            raise ScheduleError("task schedules live in SQLQUEUE['DATABASE'] (the TASKS backend enqueues there)")
        task_obj = load_schedule_task(defn.task)
        payload = defn.payload if isinstance(defn.payload, dict) else {}
        task_result = task_obj.using(queue_name=defn.queue, priority=defn.priority).enqueue(
            *payload.get("args", []), **payload.get("kwargs", {}))
        return int(task_result.id)
    return Job.objects.enqueue(defn.job_type, defn.payload, queue=defn.queue, priority=defn.priority, using=alias).pk


def _prune_runs(schedule_id: int, alias: str) -> None:
    from ..models import ScheduleRun

    runs = ScheduleRun.objects.using(alias).filter(schedule_id=schedule_id)
    cutoff = list(runs.order_by("-tick_at").values_list("tick_at", flat=True)[KEEP_RUNS:KEEP_RUNS + 1])
    if cutoff:
        runs.filter(tick_at__lte=cutoff[0], expires_at__isnull=True).delete()


def _expire(alias: str, now: datetime | None, result: LookResult) -> None:
    """Cancel tick jobs that have not started by their expiry (still Pending, or Error awaiting a retry)."""
    from ..models import Job, ScheduleRun

    clock: Any = now if now is not None else db_now(alias)
    runs = ScheduleRun.objects.using(alias)
    for run_id, job_id, expires_at in runs.filter(expires_at__isnull=False, expires_at__lte=clock).values_list(
            "id", "job_id", "expires_at")[:500]:
        job = Job.objects.using(alias).filter(pk=job_id).first() if job_id else None
        if job is not None and job.status_id in CLAIMABLE:
            try:
                Job.objects.modify(job, job.version, Status.CANCELLED, using=alias,
                                   error=f"expired: the schedule's tick job had not started by {expires_at.isoformat()}")
            except StaleJob:
                continue  # claimed or changed just now: look again next time
            except (IllegalTransition, JobNotFound):
                pass
            else:
                result.expired += 1
        runs.filter(pk=run_id).update(expires_at=None)


def run_now(schedule: Any, using: str | None = None) -> int:
    """Enqueue one extra job of ``schedule`` now ("run now"); its ticks and next_run_at do not move."""
    from ..models import Schedule

    alias = using or get_settings().DATABASE
    defn = definition_of(schedule)
    check_target(defn.job_type, defn.task, defn.payload, defn.queue, defn.priority, known_type=lambda n: True)
    job_id = enqueue_target(defn, alias)
    Schedule.objects.using(alias).filter(pk=schedule.pk).update(last_job_id=job_id)
    return job_id
