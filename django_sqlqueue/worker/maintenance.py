"""Maintenance once per fleet: the worker holding the maintenance lease runs it, the others only look.

The fleet's upkeep (reaping jobs stuck without attempts, healing limit flags and permits, the workflow
backstop, the schedule look and retention) needs running somewhere, but once per database, not once per
worker: fifty workers each reaping every 30 s cost the database fifty times the work for the same
result. So every supervisor asks, on its database thread, for one row of :class:`MaintenanceLease`
with ONE conditional UPDATE by primary key ("expired, or already mine": :meth:`Dialect.take_lease_sql`,
the database's clock deciding). Whoever gets it runs the passes below and renews it every third of
``MAINTENANCE_LEASE_SECONDS``; the others try again about once per lease length (an UPDATE that matches
nothing: one primary-key seek), and only every ``HEARD_TRY_SECONDS`` while they hear the holder's fleet's
look (PostgreSQL). A holder that dies simply stops renewing, and the lease runs out (taken
over within twice its length); one that stops cleanly gives it up, so the next look takes it. There is no leader process to deploy.

The lease saves work; it is not what makes the passes correct. Each pass was, and stays, safe to run
twice at once (two holders for a moment, after a holder paused past its lease): the reaper and the
backstop go through token-checked transitions, heal's updates are idempotent, the schedule claim is
skip-locked with a unique tick key, retention re-checks every job under a lock.

What the holder runs, each pass costing index seeks that do not grow with the backlog:

* every ``FLEET_LOOK_SECONDS`` (PostgreSQL, with a ``NOTIFY_CHANNEL``): the fleet's look, one statement
  that notifies the queues holding due work; listening workers stop polling while it runs;
* every ``SCHEDULES_CHECK_SECONDS``: the schedule look (one statement, two partial-index seeks);
* every ``REAP_SECONDS``: the reaper (the Processing index), heal for the types saved in the last
  ``HEAL_WINDOW_SECONDS`` (nothing at all when none was), the workflow backstop;
* every ``ROLLUP_SECONDS``: the throughput rollup (ops/rollup.py), the minutes since its cursor up to
  five minutes ago: one GROUP BY per series over that range of the enqueue-time and finish-time indexes;
* retention (``SQLQUEUE["RETENTION"]``): per status, one batch of ``RETENTION_BATCH_SIZE`` jobs, read by
  an index range of the finish-time index; again a second later while batches come back full, otherwise
  after ``RETENTION_IDLE_SECONDS``. At most one batch per status a second: a bounded rate. It deletes
  only jobs finished before the rollup's cursor, so the counts outlive the jobs.

Every worker still syncs the declared schedules (``SQLQUEUE["SCHEDULES"]``) at its start and again every
``schedules.RESYNC_SECONDS``, holder or not: a deploy's new definitions reach the table with the first new
worker, and the rolling-deploy guard needs each deploy's version kept live.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, connections
from django.utils import timezone

from ..conf import get_settings, retention_ages
from ..dialects import WAKE_ALL, get_dialect
from ..dialects.wake import LOOK_STAMPS_OLDER_THAN
from ..ops.rollup import Rollup
from ..queue.wakeups import wake_on_commit
from ..states import Status
from .beats import stamps_can_stand
from .support import DB_DOWN_ERRORS, close_connection, one_line

log = logging.getLogger("django_sqlqueue.maintenance")

LEASE_NAME = "maintenance"
#: A worker that hears the fleet's look still tries for the lease this often: a look heard on the channel
#: may come from another installation's holder (another schema of the same database, the same
#: NOTIFY_CHANNEL), which keeps no lease of ours alive.
HEARD_TRY_SECONDS = 300.0
#: How often the holder reaps, heals and runs the workflow backstop.
REAP_SECONDS = 30.0
#: The first reap after the lease is taken waits this long (the slots are starting).
FIRST_REAP_SECONDS = 5.0
#: Heal looks at the job types saved (``JobType.updated_at``) this recently: a process's type cache is
#: at most ``TYPE_CACHE_SECONDS`` stale, so a stale enqueue follows a limit change within seconds; five
#: minutes also covers a slow transaction and clock skew between the host that saved the type and this.
HEAL_WINDOW_SECONDS = 300.0
#: Heal also looks at jobs enqueued this long before the save of their type (a transaction that began
#: before the limit changed and enqueued with the old one).
HEAL_MARGIN_SECONDS = 60.0
#: The throughput rollup counts the minutes past its grace this often (sooner while it catches up).
ROLLUP_SECONDS = 60.0
#: Retention waiting this long for the throughput rollup is reported at WARNING (and again as often).
RETENTION_WAIT_WARN_SECONDS = 600.0
#: Retention, when the last batch of every status came back short (nothing more due yet).
RETENTION_IDLE_SECONDS = 10.0
#: Retention, while batches come back full.
RETENTION_BUSY_SECONDS = 1.0
#: A worker whose take failed looks whether the lease row exists at all (a new database, a deleted row)
#: at most this often; otherwise a look is the UPDATE alone.
INSERT_CHECK_SECONDS = 600.0
#: The fleet's look reads at most this many jobs that came due per priority (more: it names every
#: queue) and this many limit scopes with a free permit: bounded work whatever the backlog.
LOOK_ROWS = 200
#: The first look of a new holder names the jobs that came due this long ago at most (the later ones,
#: those since the previous look).
LOOK_BACK_SECONDS = 60.0
#: Where the look is off (another vendor, no NOTIFY_CHANNEL, FLEET_LOOK_SECONDS = 0): the settings are
#: read again this often.
LOOK_OFF_SECONDS = 60.0
#: Longest back-off of a pass after errors (the database down, tables not migrated yet).
MAX_BACKOFF_SECONDS = 60.0


# ----- the lease --------------------------------------------------------------------------------------
def take_lease(using: str, holder: str, seconds: float, name: str = LEASE_NAME, *, insert: bool = True) -> bool:
    """Take or renew the lease ``name`` for ``holder``; True when ``holder`` holds it now.

    One conditional UPDATE by primary key. With ``insert``, an UPDATE that matched nothing looks whether
    the row exists and creates it if not (the very first take on a database; a racing insert loses on
    the primary key and is simply not the holder).
    """
    connection = connections[using]
    dialect = get_dialect(connection)
    with connection.cursor() as cursor:
        dialect.execute(cursor, dialect.take_lease_sql(), [holder, float(seconds), name, holder])
        if cursor.rowcount:
            return True
    if not insert:
        return False
    from ..models import MaintenanceLease

    if MaintenanceLease.objects.using(using).filter(name=name).exists():
        return False
    try:
        with connection.cursor() as cursor:
            dialect.execute(cursor, dialect.insert_lease_sql(), [name, holder, float(seconds)])
    except IntegrityError:
        return False
    return True


def release_lease(using: str, holder: str, name: str = LEASE_NAME) -> None:
    """Give the lease up if ``holder`` holds it (a clean stop): the next look elsewhere takes it."""
    connection = connections[using]
    dialect = get_dialect(connection)
    with connection.cursor() as cursor:
        dialect.execute(cursor, dialect.release_lease_sql(), [name, holder])


def new_holder(worker_name: str) -> str:
    """The lease's holder text for a supervisor: its worker name and a token of this process (a restart
    under the same name is another holder, and waits for the old lease like anyone else)."""
    return f"{worker_name[:180]}#{secrets.token_hex(4)}"


# ----- the passes -------------------------------------------------------------------------------------
@dataclass
class Task:
    """One periodic pass of the holder: when it is next due, and its error back-off."""

    name: str
    run: Callable[[], float]  # runs the pass; returns the seconds until the next one
    due_at: float = 0.0
    failures: int = 0


@dataclass
class Maintenance:
    """The maintenance of one supervisor: :meth:`run` is called on its database thread whenever
    :attr:`next_at` has passed; it looks for the lease and, while held, runs the passes that are due."""

    using: str
    holder: str
    holding: bool = False
    next_at: float = 0.0
    _renew_at: float = 0.0
    #: When a failed take next looks whether the lease row exists at all (a new database, a deleted row).
    _insert_check_at: float = 0.0
    _synced: str | None = None
    _resync_at: float = 0.0
    _tasks: list[Task] = field(default_factory=list)
    #: Retention: per status, the finish time where its next batch starts (see retention_batch).
    _retention_from: dict[Status, datetime] = field(default_factory=dict)
    _retention_key: str = ""
    _rollup: Rollup = field(init=False)
    _retention_waiting_since: float | None = None
    _retention_warned_at: float = 0.0
    #: When (time.monotonic()) this holder's last look went out; None: not since it took the lease.
    _looked_at: float | None = None
    #: Whether this worker hears the fleet's look (the supervisor's wake board): while it does, a holder
    #: is alive and renewing, so a worker that does not hold the lease skips its try (an UPDATE that
    #: would match nothing) until the looks stop, but for one try every HEARD_TRY_SECONDS.
    look_heard: Callable[[], bool] = lambda: False
    _try_anyway_at: float = 0.0

    def __post_init__(self) -> None:
        self._rollup = Rollup(self.using)
        # The rollup before retention: a turn that deletes jobs has counted them first.
        self._tasks = [Task("look", self._look), Task("schedules", self._schedules), Task("reap", self._reap),
                       Task("rollup", self._roll_up), Task("retention", self._retention)]

    # ----- called by the supervisor --------------------------------------------------------------------
    def due(self, now: float) -> bool:
        return now >= self.next_at

    def run(self) -> None:
        """One turn: sync the declared schedules (once), take or renew the lease, run the due passes.
        Never raises: a database error is logged and retried later."""
        now = time.monotonic()
        lease_seconds = get_settings().MAINTENANCE_LEASE_SECONDS
        self._sync_schedules()
        if not self.holding and now < self._try_anyway_at and self.look_heard():
            self.next_at = now + lease_seconds * random.uniform(0.7, 1.0)
            return
        if not self.holding or now >= self._renew_at:
            if not self.holding:
                self._try_anyway_at = now + HEARD_TRY_SECONDS
            try:
                insert = now >= self._insert_check_at
                held = take_lease(self.using, self.holder, lease_seconds, insert=insert)
                if insert and not held:  # the row exists: a look costs one UPDATE for the next while
                    self._insert_check_at = now + INSERT_CHECK_SECONDS
            except DatabaseError as exc:
                self._failed("maintenance_lease_failed", exc)
                held = False
            self._held(held, now)
            if not held:
                # Once per lease length, give or take (so a fleet spreads out): a dead holder's lease is
                # taken over within twice its length, and each worker that does not hold it costs the
                # database about two primary-key seeks a minute.
                self.next_at = now + lease_seconds * random.uniform(0.7, 1.0)
                return
            self._renew_at = now + lease_seconds / 3
        for task in self._tasks:
            if now >= task.due_at:
                self._run_task(task, now)
        self.next_at = min(self._renew_at, *(t.due_at for t in self._tasks))

    def release(self) -> None:
        """At a clean stop: give the lease up, so another worker takes it at its next look."""
        if not self.holding:
            return
        self.holding = False
        try:
            release_lease(self.using, self.holder)
        except DatabaseError as exc:
            self._failed("maintenance_lease_release_failed", exc)

    # ----- the lease's comings and goings --------------------------------------------------------------
    def _held(self, held: bool, now: float) -> None:
        if held and not self.holding:
            log.info("maintenance_lease_taken holder=%s (this worker now runs the fleet's reaper, heal, "
                     "backstop, schedule looks and retention)", self.holder)
            for task in self._tasks:  # a new holder starts every pass afresh
                task.due_at = now + (FIRST_REAP_SECONDS if task.name == "reap" else 0.0)
                task.failures = 0
            self._retention_from.clear()
            self._rollup.reset()
            self._looked_at = None
        elif self.holding and not held:
            log.info("maintenance_lease_lost holder=%s (another worker holds it now)", self.holder)
        self.holding = held

    def _run_task(self, task: Task, now: float) -> None:
        log.debug("maintenance_pass task=%s holder=%s", task.name, self.holder)
        try:
            delay = task.run()
        except Exception as exc:  # noqa: BLE001  (one pass failing must not stop the others)
            task.failures += 1
            delay = min(MAX_BACKOFF_SECONDS, 2.0 ** min(task.failures, 6))
            # The schedule look keeps the event name docs/schedules.md gives (it was a thread of its own).
            event = "schedule_look_failed" if task.name == "schedules" else f"maintenance_{task.name}_failed"
            self._failed(event, exc, next_in=delay)
        else:
            task.failures = 0
        task.due_at = now + delay

    def _failed(self, event: str, exc: BaseException, **fields: object) -> None:
        level = logging.INFO if isinstance(exc, DB_DOWN_ERRORS) else logging.WARNING
        detail = "".join(f" {k}={v}" for k, v in fields.items())
        log.log(level, "%s error=%s%s", event, one_line(exc), detail)
        if isinstance(exc, DatabaseError):
            close_connection(self.using)

    # ----- the passes ----------------------------------------------------------------------------------
    def _sync_schedules(self) -> None:
        """Write ``SQLQUEUE["SCHEDULES"]`` into the table at the worker's start, when it changes, and again
        every ``schedules.RESYNC_SECONDS`` in the holder, and keeps the version live with one statement
        every ``RESYNC_OTHERS_SECONDS`` in the others (a full sync when it is not live): that keeps this deploy's
        settings version live, so an older deploy's worker (a crashed pod restarted mid-rollout) defers
        to it and anything it changed is put back (see ``schedules.sync_schedules``)."""
        from ..schedules import RESYNC_OTHERS_SECONDS, RESYNC_SECONDS, keep_version_live, sync_schedules

        key = json.dumps(get_settings().SCHEDULES, sort_keys=True, default=repr)
        if self._synced == key and time.monotonic() < self._resync_at:
            return
        try:
            # Not the holder, synced already: one UPDATE keeps the version live (a full sync when it is not)
            if self.holding or self._synced != key or not keep_version_live(self.using):
                sync_schedules(self.using)
        except Exception as exc:  # noqa: BLE001  (retried at the next turn)
            self._failed("schedule_sync_failed", exc)
            return
        self._synced = key
        self._resync_at = time.monotonic() + (RESYNC_SECONDS if self.holding else RESYNC_OTHERS_SECONDS)

    def _look(self) -> float:
        """The fleet's look: notify the queues holding due work (one statement, PostgreSQL with a
        NOTIFY_CHANNEL; elsewhere nothing, read again a minute later). Its notification also tells the
        listening workers that the look runs, so their idle slots wait for it instead of polling."""
        settings = get_settings()
        interval = settings.FLEET_LOOK_SECONDS
        now = time.monotonic()
        # The jobs that came due since the last look, and a margin (a pass late behind a slow one, the
        # clocks of a statement); a new holder looks back as far as LOOK_BACK_SECONDS.
        since = LOOK_BACK_SECONDS if self._looked_at is None else min(LOOK_BACK_SECONDS, now - self._looked_at + 2.0)
        connection = connections[self.using]
        look = get_dialect(connection).fleet_look_sql(
            settings.NOTIFY_CHANNEL, interval=interval, since_seconds=since,
            default_max_attempts=settings.MAX_ATTEMPTS,
            worker_dead_after_seconds=settings.WORKER_DEAD_AFTER_SECONDS, rows=LOOK_ROWS,
            # Stamps only where workers opted in: otherwise the look reads no pg_locks (a one-time filter)
            stamp_older_than=(LOOK_STAMPS_OLDER_THAN if settings.SESSION_LIVENESS
                              and stamps_can_stand(settings.WORKER_DEAD_AFTER_SECONDS) else 0.0),
        ) if settings.NOTIFY_CHANNEL and interval > 0 else None
        if look is None:
            return LOOK_OFF_SECONDS
        with connection.cursor() as cursor:
            cursor.execute(*look)
        self._looked_at = now
        return interval

    def _schedules(self) -> float:
        from ..schedules import run_due

        interval = get_settings().SCHEDULES_CHECK_SECONDS
        if interval <= 0:
            return 1.0  # looking is off here; the setting is read again
        run_due(self.using)
        return interval

    def _reap(self) -> float:
        from ..limits import heal, remove_idle_key_permits
        from ..models import Job, JobType
        from ..workflows import backstop

        n = Job.objects.reap(using=self.using)
        if n:
            log.warning("reaped jobs=%s (lease expired with no attempts left: Failed)", n)
        lately = timezone.now() - timedelta(seconds=HEAL_WINDOW_SECONDS)
        changed = dict(JobType.objects.using(self.using).filter(updated_at__gte=lately).values_list("pk", "updated_at"))
        if changed:  # none saved lately: no job can carry a stale flag, nothing to look at
            # Jobs enqueued since a minute before the oldest save (a transaction that enqueued with the old
            # limit may have started a little before the change): an enqueue-time index range.
            since = min(changed.values()) - timedelta(seconds=HEAL_MARGIN_SECONDS)
            healed = heal(self.using, list(changed), since=since)
            if healed:  # jobs unflagged (or scopes given permits) are claimable now: wake the workers
                wake_on_commit(self.using, {WAKE_ALL})
                log.warning("permits_healed jobs_or_scopes=%s (jobs of a type whose limit changed were enqueued "
                            "with the old one)", healed)
        remove_idle_key_permits(self.using)  # a read of the permit table: nothing when no key has permits
        backstop(using=self.using)
        return REAP_SECONDS

    def _retention_waits(self, now: float) -> None:
        """Retention waits for the rollup: say so at WARNING once it has waited
        :data:`RETENTION_WAIT_WARN_SECONDS`, and again every as long, so a failing rollup (a table not
        migrated, a statement timeout) does not stop retention unseen."""
        if self._retention_waiting_since is None:
            self._retention_waiting_since = now
            self._retention_warned_at = now
        elif now - self._retention_warned_at >= RETENTION_WAIT_WARN_SECONDS:
            self._retention_warned_at = now
            log.warning("retention_waiting_for_rollup seconds=%d (retention deletes only jobs the throughput "
                        "rollup has counted, and it has not run here: see maintenance_rollup_failed above; "
                        "is migration 0019 applied?)", now - self._retention_waiting_since)

    def _roll_up(self) -> float:
        from ..schedules import db_clock

        behind = self._rollup.run(db_clock(self.using))  # the job times are the database's
        return RETENTION_BUSY_SECONDS if behind else ROLLUP_SECONDS

    def _retention(self) -> float:
        """One batch per status that has a retention age; sooner again while batches come back full.
        Only jobs finished before the rollup's cursor: none until its first pass here."""
        from ..models import Batch, Job
        from ..queue.housekeeping import purge_batches, retention_batch

        settings = get_settings()
        ages = retention_ages(settings.RETENTION)
        if not ages:
            return RETENTION_IDLE_SECONDS
        key = json.dumps({int(s): a.total_seconds() for s, a in ages.items()}, sort_keys=True)
        if key != self._retention_key:  # ages changed: every status starts from its beginning again
            self._retention_from.clear()
            self._retention_key = key
        counted = self._rollup.until
        if counted is None:  # the rollup has not run yet here, or fails (its own log line says why)
            self._retention_waits(time.monotonic())
            return RETENTION_IDLE_SECONDS
        self._retention_waiting_since = None
        size = settings.RETENTION_BATCH_SIZE
        now = timezone.now()
        busy = False
        for status, age in sorted(ages.items()):
            read, deleted, after = retention_batch(status, min(now - age, counted),
                                                   self._retention_from.get(status), size, self.using)
            if after is not None:
                self._retention_from[status] = after
            if deleted:
                log.info("retention_deleted status=%s jobs=%s older_than=%ss", status.label, deleted,
                         int(age.total_seconds()))
            busy = busy or read >= size
        if not busy:
            from django.db.models import Exists, OuterRef

            members = Job.objects.using(self.using).filter(batch_id=OuterRef("pk"))
            old = Batch.objects.using(self.using).filter(finished_at__lt=now - min(ages.values()))
            purge_batches(old.exclude(Exists(members)), self.using, limit=size)
        return RETENTION_BUSY_SECONDS if busy else RETENTION_IDLE_SECONDS
