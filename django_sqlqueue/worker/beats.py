"""The supervisor's heartbeat: its one connection beats for all its slots.

A slot used to hold a connection for its own heartbeat (and one for its LISTEN). Now each slot reports
what it holds and runs (:class:`~django_sqlqueue.worker.contract.SlotReport`, on a pipe: at once after a
claim, and every ``REPORT_SECONDS``) and the supervisor, on its database thread (dbthread.py), beats for
all of them: ONE statement renews the leases every slot holds (per lease length; one in the common case),
ONE stamps every slot's worker row. The answers (:class:`BeatResult`) go back to the slots, whose
standing rules (heartbeat.py) are unchanged: no claim without a recent good beat, a running job whose
lease may be lost is killed before the lease ends.

Safety, with the beats out of the slot process:

- A beat that fails renews nothing for any slot: all of them lose standing together, their leases
  lapse, and a late finish is refused by the job's token, as with a slot's own failing heartbeat.
- The supervisor renews a slot's leases and stamps its row only while that slot keeps reporting
  (``STALE_SECONDS``): a slot process that is stopped (SIGSTOP), frozen, or whose threads cannot run lets
  its leases lapse, as its own heartbeat thread would have. The last "safe until" it published stands,
  and the supervisor kills it when that passes (supervisor.py ``_check_timeout``).
- A slot stuck in its handler keeps reporting (its reporting thread runs): its lease is renewed, and
  the job's timeout (the supervisor's SIGKILL at the type's ``timeout_seconds``) bounds it, as before.

Session liveness (PostgreSQL, LISTEN on the supervisor's own connection): an idle fleet must not send
one heartbeat per worker (issue 28). The supervisor takes a session-level advisory lock on each of its
slots' worker rows, on the connection that LISTENs, and the maintenance holder's look stamps in the same
statement every live row whose lock is held and whose ``stamp_until`` has not passed
(``PostgresDialect.fleet_look_sql``). A real beat sets ``stamp_until`` ``STAMP_WINDOW_SECONDS`` ahead
while no slot holds a job, and clears it while one does (a claim brings that beat at once): a process
frozen with its session alive stops being stamped at once if it held a job, within minutes if not. A look's header
carries the database clock at which it began; once a look began after the locks were taken, the rows
are known fresh, and while no slot holds a job or has finished one since the last beat the supervisor
answers its slots from that look instead of beating (:meth:`Beats._stamped`). A slot that claims gets a
real beat at once (its leases need one); so does a stale, dead or restarted slot (its lock is
released, its row goes stale: :meth:`Beats._unlock_all` when no slot is left to beat for; a lock is
per incarnation's row); the connection's loss takes the locks with it (the supervisor beats again until it relocks);
and a real beat goes at least every ``IDLE_BEAT_SECONDS`` (it is what learns that a row was replaced).
The server drops a dead client's session, and its locks, within about 25 s (TCP keepalives and
``tcp_user_timeout``, set on the session): a host that lost power stops being stamped.

Cancel requests of running attempts are looked for here too (every ``CANCEL_CHECK_SECONDS`` while a job
runs longer than that), and sent to the slot running the attempt.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import Case, F, IntegerField, Q, Value, When
from django.db.models.expressions import RawSQL

from ..dialects import get_dialect
from ..dialects.wake import LOOK_STAMPS_OLDER_THAN
from .contract import BeatResult, SlotReport
from .dbthread import Call, DatabaseThread
from .heartbeat import REPORT_SECONDS, RETRY_SECONDS
from .support import DB_DOWN_ERRORS, close_connection, db_now, lease_ran_out, one_line

log = logging.getLogger("django_sqlqueue.supervisor")

#: A slot that has not reported for this long gets no beats (its leases lapse: see the docstring).
STALE_SECONDS = 5 * REPORT_SECONDS
#: Most job ids in one renewal statement (SQL Server takes 2,100 parameters).
MAX_IDS = 900
#: Under session liveness, an idle worker still beats this often (it learns there that a row was replaced).
IDLE_BEAT_SECONDS = 300.0
#: ... and each of those beats lets the looks stamp its rows for this long (``Worker.stamp_until``): a
#: process frozen with its session alive (SIGSTOP, a paused VM) stops being stamped by then.
STAMP_WINDOW_SECONDS = IDLE_BEAT_SECONDS + 60.0
#: A look's stamp older than this (on the database's clock, as this host sees it) stands for no beat.
STAMP_FRESH_SECONDS = 10.0
#: ... and one whose row stamp is older than this share of WORKER_DEAD_AFTER_SECONDS (the slots would
#: soon stop claiming on it: heartbeat.CLAIM_SHARE is 0.5).
STAMP_SHARE = 0.25
#: How far the wall clock may seem off (the lock statement's round trip) before a stamp is not trusted.
CLOCK_SLACK_SECONDS = 1.0


def stamps_can_stand(dead_after: float) -> bool:
    """Whether a look's stamp, fresh enough to be trusted, may stand for a beat under this
    WORKER_DEAD_AFTER_SECONDS (60 s and more): below it a worker beats as without session liveness, and
    takes no locks (a look would never spare it a beat, and a frozen process would stay stamped)."""
    return dead_after * STAMP_SHARE >= LOOK_STAMPS_OLDER_THAN + STAMP_FRESH_SECONDS


@dataclass
class SlotBeat:
    """The supervisor's view of one slot process (one incarnation)."""

    name: str
    incarnation: str
    link: Any  # the supervisor's end of the slot's pipe
    report: SlotReport | None = None
    reported_at: float = 0.0
    #: The slot's finished-job count that the worker row includes.
    stamped: int = 0
    next_cancel_check: float = 0.0
    gone: bool = False
    #: A beat's result reached it at least once (until then it claims nothing).
    answered: bool = False


@dataclass(frozen=True)
class _Member:
    name: str
    incarnation: str
    held: dict[int, float]
    done: int  # to add to jobs_done
    done_total: int


@dataclass
class Beats:
    """Collects the slots' reports, beats for them on the database thread, and answers them."""

    using: str
    worker: str
    heartbeat_seconds: float
    dead_after: float
    cancel_check: float
    slots: dict[int, SlotBeat] = field(default_factory=dict)
    _call: Call | None = None
    _beat: tuple[list[SlotBeat], list[_Member]] | None = None
    _outcome: dict[str, Any] = field(default_factory=dict)
    _cancel_call: Call | None = None
    _cancels: dict[str, dict[tuple[int, int], Any]] = field(default_factory=dict)
    _next_beat: float = 0.0
    _last_sent: float | None = None
    _failing_since: float | None = None
    _said_failing: bool = False
    _identity: Any = None
    _fatal: str | None = None
    #: Session liveness: the supervisor's SharedListener (its looks' stamps), or None (module docstring).
    session: Any = None
    #: (slot name, incarnation) -> worker row id, locked on _lock_conn
    _locks: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock_conn: Any = None
    _locked_at: float = 0.0  # the database's clock just after the last lock was taken
    _clock_offset: float = 0.0  # the database's clock minus this host's, as the lock statement saw it
    #: The last good beat set its rows' ``stamp_until`` (no slot held a job): looks stamp them.
    _stamping: bool = False
    #: Beats answered from a look's stamp, without a statement (for the tests and the benchmark).
    stamped_beats: int = 0

    @property
    def beaten(self) -> bool:
        """A beat got through at least once (the slots it covered may claim)."""
        return self._last_sent is not None

    # ----- slots come and go (the supervisor's loop) ---------------------------------------------------
    def attach(self, index: int, name: str, incarnation: str, link: Any) -> None:
        self.detach(index)
        self.slots[index] = SlotBeat(name, incarnation, link)

    def detach(self, index: int) -> None:
        slot = self.slots.pop(index, None)
        if slot is not None:
            slot.gone = True
            try:
                slot.link.close()
            except OSError:
                pass

    def connect_errors(self) -> tuple[int, int, str | None]:
        """(slots connected, slots that reported, the last connect error): for the "starved" line."""
        connected, reported, error = 0, 0, None
        for slot in self.slots.values():
            if slot.report is None:
                continue
            reported += 1
            if slot.report.connect_error is None:
                connected += 1
            else:
                error = slot.report.connect_error
        return connected, reported, error

    # ----- every turn of the supervisor's loop ----------------------------------------------------
    def links(self) -> list[Any]:
        """The pipes of the slots still reporting: readable when a slot has something to say."""
        return [slot.link for slot in self.slots.values() if not slot.gone]

    def tick(self, db: DatabaseThread, now: float, *, stopping: bool = False) -> None:
        self._collect(now)
        self._answer()
        if self._stamping and self._holding():
            # The rows' stamp_until is set and a slot holds a job: a real beat at once clears it (a process
            # frozen from now on must be judged gone at the dead-after time, not minutes later).
            self._next_beat = min(self._next_beat, now)
        due = self._call is None and now >= self._next_beat
        members = self._members(now) if due else []
        if members and self._stamped(members, now):
            members = []
        elif due and not members and self._locks:
            # No slot to beat for (all stale or gone): their rows must go stale, so their locks go now.
            self._beat, self._outcome = ([], []), {}
            self._call = db.submit("unlock", self._unlock_all)
        if members:
            self._beat = (list(self.slots.values()), members)
            self._outcome = {}
            self._call = db.submit("heartbeat", self._beat_now, members, self._outcome)
        if self._cancel_call is None and not stopping:
            running = self._running(now)
            if running:
                self._cancels = {}
                self._cancel_call = db.submit("cancel_check", self._cancels_now, running, self._cancels)

    def _holding(self) -> bool:
        return any(slot.report is not None and slot.report.held and not slot.gone for slot in self.slots.values())

    def _collect(self, now: float) -> None:
        for slot in self.slots.values():
            try:
                while slot.link.poll():
                    report = slot.link.recv()
                    if slot.report is None or slot.report.connect_error is not None:
                        self._next_beat = now  # a new slot claims nothing before its first beat: at once
                    elif report.held.keys() - slot.report.held.keys():
                        # New jobs: beat sooner if their lease is shorter than the beats planned so far.
                        self._next_beat = min(self._next_beat, (self._last_sent or 0.0) + self.interval(report))
                    slot.report, slot.reported_at = report, now
            except (EOFError, OSError):
                slot.gone = True  # the slot died: the supervisor's loop sees it and detaches it

    def _members(self, now: float) -> list[_Member]:
        members = []
        for slot in self.slots.values():
            report = slot.report
            if slot.gone or report is None or now - slot.reported_at > STALE_SECONDS:
                continue
            if report.connect_error is not None:
                continue  # not registered: no row to stamp, nothing held
            members.append(_Member(slot.name, slot.incarnation, report.held, max(0, report.done - slot.stamped),
                                   report.done))
        return members

    def interval(self, extra: SlotReport | None = None) -> float:
        """A quarter of the shortest of the dead-after time and every held lease (as heartbeat.py)."""
        leases = [lease for slot in self.slots.values() if slot.report is not None
                  for lease in slot.report.held.values()]
        if extra is not None:
            leases += list(extra.held.values())
        window = min([self.dead_after, *leases])
        interval = min(self.heartbeat_seconds, window / 4)
        if self._failing_since is not None:
            interval = min(interval, RETRY_SECONDS)
        return max(0.05, interval)

    def _stamped(self, members: list[_Member], now: float) -> bool:
        """Answer idle slots from the fleet's look instead of beating, when it stamped their rows (the
        module docstring says when); True if it did."""
        session, conn = self.session, self._lock_conn
        stamp = session.stamp if session is not None else None
        # (not _stamping: the last beat was for a slot holding a job, so the looks leave its rows alone)
        if (stamp is None or conn is None or session.connection is not conn or self._last_sent is None
                or not self._stamping):
            return False
        if now - self._last_sent >= IDLE_BEAT_SECONDS or stamp[0] <= self._locked_at:
            return False
        if len(members) != len(self.slots) or set(self._locks) != {(m.name, m.incarnation) for m in members}:
            return False  # a slot stale, gone, restarted or not locked yet: a real beat (un)locks its row
        if any(m.held or m.done for m in members):
            return False  # leases to renew, finished jobs to count: a real beat
        # The look's start on this host's monotonic clock; the row was stamped then, or within the
        # LOOK_STAMPS_OLDER_THAN before (the look leaves a fresher row alone).
        age = time.time() + self._clock_offset - stamp[0]
        if age < -CLOCK_SLACK_SECONDS or now - age > stamp[1] + CLOCK_SLACK_SECONDS:
            return False  # begun after it was heard, or in the future: this host's clock moved, beat
        began = min(stamp[1], now - max(0.0, age))
        sent = began - LOOK_STAMPS_OLDER_THAN
        if now - began > STAMP_FRESH_SECONDS or now - sent > self.dead_after * STAMP_SHARE:
            return False  # an old look, or a dead-after time too short for a look's stamp to stand for a beat
        for slot in list(self.slots.values()):
            slot.answered = True
            self._send(slot, BeatResult(sent=sent, ok=True, done=slot.stamped))
        self.stamped_beats += 1
        self._next_beat = now + self.interval()
        return True

    def _answer(self) -> None:
        """Send the results of a finished beat (and of a look for cancel requests) to their slots."""
        if self._call is not None and self._call.finished:
            slots, members = self._beat or ([], [])
            sent, results = self._outcome.get("sent", 0.0), self._outcome.get("results", {})
            done = {m.name: m.done_total for m in members}
            for slot in slots:
                result = results.get(slot.name)
                if result is None:
                    continue
                if result.ok:
                    slot.stamped = max(slot.stamped, done[slot.name])
                slot.answered = True
                self._send(slot, result)
            if self._outcome.get("ok"):
                self._last_sent, self._stamping = sent, self._outcome.get("stamping", False)
            self._call, self._beat = None, None
            now = time.monotonic()
            # A slot whose first report came while this beat was on its way was not in it: it claims
            # nothing before its first beat, so that one goes at once, not an interval (10 s) later.
            waiting = any(not slot.answered and not slot.gone and slot.report is not None
                          and slot.report.connect_error is None for slot in self.slots.values())
            self._next_beat = now if waiting else now + self.interval()
        if self._cancel_call is not None and self._cancel_call.finished:
            by_name = {slot.name: slot for slot in self.slots.values()}
            for name, found in self._cancels.items():
                if found and name in by_name:
                    self._send(by_name[name], BeatResult(cancels=found))
            self._cancel_call = None

    def _send(self, slot: SlotBeat, result: BeatResult) -> None:
        if slot.gone:
            return
        try:
            slot.link.send(result)
        except (OSError, ValueError):
            slot.gone = True

    def _running(self, now: float) -> list[tuple[str, int, int]]:
        out = []
        for slot in self.slots.values():
            running = slot.report.running if slot.report is not None else None
            if running is None or now < running[2] or now < slot.next_cancel_check:
                continue
            slot.next_cancel_check = now + self.cancel_check
            out.append((slot.name, running[0], running[1]))
        return out

    # ----- on the database thread -------------------------------------------------------------------
    def _beat_now(self, members: list[_Member], outcome: dict[str, Any]) -> None:
        """One beat for every reporting slot: renew their leases, stamp their rows, find what was lost."""
        try:
            connections[self.using].ensure_connection()  # connecting is not part of the beat
            sent = time.monotonic()
            # Looks may stamp the rows until the next real beat (and a margin) only while no slot holds a
            # job: a process frozen while it held one must be judged gone at the dead-after time.
            stamping = self.session is not None and not any(m.held for m in members)
            results = self._statements(members, sent, stamping)
        except DB_DOWN_ERRORS as exc:
            self._failed(exc)
            outcome["results"] = {m.name: BeatResult() for m in members}
            return
        except DatabaseError as exc:
            log.warning("heartbeat_error worker=%s error=%s", self.worker, one_line(exc))
            close_connection(self.using)
            self._failing_since = self._failing_since or time.monotonic()
            outcome["results"] = {m.name: BeatResult() for m in members}
            return
        if self._failing_since is not None:
            log.warning("heartbeat_back worker=%s after=%.1fs", self.worker, sent - self._failing_since)
        self._failing_since, self._said_failing = None, False
        outcome.update(ok=True, sent=sent, results=results, stamping=stamping)

    def _failed(self, exc: BaseException) -> None:
        """WARNING once per outage (the slots' jobs are at risk), INFO for the retries."""
        now = time.monotonic()
        first = self._failing_since is None
        self._failing_since = self._failing_since or now
        last_ok = "never" if self._last_sent is None else f"{now - self._last_sent:.1f}s ago"
        (log.warning if first or not self._said_failing else log.info)(
            "heartbeat_failed worker=%s slots=%s error=%s last_ok=%s", self.worker, len(self.slots),
            one_line(exc), last_ok)
        self._said_failing = True
        close_connection(self.using)

    def _statements(self, members: list[_Member], sent: float, stamping: bool = False) -> dict[str, BeatResult]:
        from ..models import Job, Worker

        renewed: dict[str, set[int]] = {m.name: set() for m in members}
        lost: dict[str, set[int]] = {m.name: set() for m in members}
        by_lease: dict[int, list[_Member]] = {}
        for m in members:
            for lease in {max(1, round(v)) for v in m.held.values()}:
                by_lease.setdefault(lease, []).append(m)
        for lease, group in by_lease.items():
            holders = [(m.name, m.incarnation, [i for i, v in m.held.items() if max(1, round(v)) == lease])
                       for m in group]
            for chunk in _chunks(holders):
                ids = {i for _n, _inc, chunk_ids in chunk for i in chunk_ids}
                kept = Job.objects.renew_held(chunk, lease, using=self.using)
                taken: set[int] = set()
                if kept < len(ids):
                    taken = self._find_taken(chunk)
                for name, _inc, chunk_ids in chunk:
                    lost[name] |= taken & set(chunk_ids)
                    renewed[name] |= set(chunk_ids) - taken
        stamped = 0
        if members:
            rows = Worker.objects.using(self.using).filter(
                _any(Q(name=m.name, incarnation=m.incarnation) for m in members), stopped_at__isnull=True)
            done = [When(name=m.name, then=Value(m.done)) for m in members if m.done]
            extra = Case(*done, default=Value(0), output_field=IntegerField()) if done else Value(0)
            until = (RawSQL(get_dialect(connections[self.using]).now_plus("%s"), [STAMP_WINDOW_SECONDS])
                     if stamping else None)
            stamped = rows.update(last_heartbeat=db_now(self.using), jobs_done=F("jobs_done") + extra,
                                  stamp_until=until)
        replaced: set[str] = set()
        if stamped < len(members):
            live = set(Worker.objects.using(self.using).filter(
                name__in=[m.name for m in members], stopped_at__isnull=True).values_list("name", "incarnation"))
            replaced = {m.name for m in members if (m.name, m.incarnation) not in live}
        self._check_identity()
        if self.session is not None:
            self._lock_rows([m for m in members if m.name not in replaced])
        return {m.name: BeatResult(sent=sent, ok=True, renewed=tuple(sorted(renewed[m.name])),
                                   lost=tuple(sorted(lost[m.name])), replaced=m.name in replaced,
                                   fatal=self._fatal, done=m.done_total)
                for m in members}

    def _lock_rows(self, members: list[_Member]) -> None:
        """Session liveness: hold the session lock of exactly these slots' rows (each slot's incarnation:
        a row deleted and registered again, or taken by another process, is another row), on the
        connection that LISTENs. One statement when a slot is new to it; none in the steady state."""
        wrapper = connections[self.using]
        raw = wrapper.connection
        if raw is None or raw is not self.session.connection:
            self._locks, self._lock_conn = {}, None  # not listening here: no looks to stand for beats
            return
        dialect = get_dialect(wrapper)
        try:
            with wrapper.cursor() as cursor:
                if self._lock_conn is not raw:  # a new connection: the old one's locks went with it
                    self._locks, self._lock_conn, self._locked_at = {}, None, 0.0
                    cursor.execute(dialect.keepalive_sql())
                    self._lock_conn = raw
                wanted = {(m.name, m.incarnation) for m in members}
                self._unlock(cursor, [held for held in self._locks if held not in wanted])
                new = sorted(wanted - set(self._locks))
                if new:
                    cursor.execute(dialect.lock_rows_sql(len(new)), dialect.lock_rows_params(new))
                    for row_id, name, incarnation, ok, clock in cursor.fetchall():
                        if ok:
                            self._locks[(name, incarnation)] = row_id
                        self._locked_at = max(self._locked_at, clock)
                        self._clock_offset = clock - time.time()
        except DatabaseError as exc:  # never the beat's failure: the slots are beaten, not stamped
            self._lock_failed(exc)

    def _unlock(self, cursor: Any, held: list[tuple[str, str]]) -> None:
        dialect = get_dialect(connections[self.using])
        for key in held:
            cursor.execute(dialect.unlock_row_sql(), dialect.unlock_row_params(self._locks.pop(key)))

    def _unlock_all(self) -> None:
        """On the database thread: no slot is beaten any more, so no row of theirs may stay stamped."""
        wrapper = connections[self.using]
        if wrapper.connection is None or wrapper.connection is not self._lock_conn:
            self._locks, self._lock_conn = {}, None  # the locks went with that connection
            return
        try:
            with wrapper.cursor() as cursor:
                self._unlock(cursor, list(self._locks))
        except DatabaseError as exc:
            self._lock_failed(exc)

    def _lock_failed(self, exc: BaseException) -> None:
        """Which locks are held is unknown now: close the connection, which releases them all."""
        log.info("session_lock_failed worker=%s error=%s", self.worker, one_line(exc))
        self._locks, self._lock_conn = {}, None
        close_connection(self.using)

    def _find_taken(self, holders: list[tuple[str, str, list[int]]]) -> set[int]:
        """Of these held jobs, those lost: another worker or incarnation holds them now, or they are still
        Processing under their holder with a lease the renewal did not extend (it ran out, and a claim gave
        the job's concurrency permit to another job: ``Dialect.permit_guard_sql``). A job its slot
        finished meanwhile is still under its name and incarnation, and not Processing: not lost."""
        from ..models import Job

        owner = {i: (name, inc) for name, inc, ids in holders for i in ids}
        rows = Job.objects.using(self.using).filter(pk__in=list(owner)).annotate(
            ran_out=lease_ran_out(self.using)).values_list("pk", "worker", "incarnation", "ran_out")
        return {pk for pk, worker, inc, ran_out in rows if (worker, inc) != owner[pk] or ran_out}

    def baseline(self) -> None:
        """Note the database file's identity now (the supervisor's connection was just opened, before
        the slots start): a file deleted before the first beat must not become the baseline."""
        if self._identity is None:
            self._check_identity()

    def _check_identity(self) -> None:
        """SQLite: the database file deleted or replaced under the worker (heartbeat.py says why)."""
        identity = get_dialect(connections[self.using]).database_identity()
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity and self._fatal is None:
            name = connections[self.using].settings_dict.get("NAME")
            self._fatal = f"the database file {name} was deleted or replaced under this worker"
            log.error("database_file_gone worker=%s path=%s: its open connection would write to a file nobody "
                      "reads; stopping", self.worker, name)

    def _cancels_now(self, running: list[tuple[str, int, int]], found: dict[str, dict[tuple[int, int], Any]]) -> None:
        from ..models import Job

        for name, job_id, attempt in running:
            try:
                request = Job.objects.cancel_request_for(job_id, attempt, using=self.using)
            except DatabaseError as exc:  # down, or the table not migrated yet: never the beat's death
                log.info("cancel_check_failed worker=%s job=%s error=%s", name, job_id, one_line(exc))
                close_connection(self.using)
                return
            if request is not None:
                found[name] = {(job_id, attempt): request}


def _any(conditions: Any) -> Q:
    out = Q()
    for condition in conditions:
        out |= condition
    return out


def _chunks(holders: list[tuple[str, str, list[int]]]) -> list[list[tuple[str, str, list[int]]]]:
    """Split the holders so that no statement carries more than MAX_IDS ids (a holder may be split)."""
    out: list[list[tuple[str, str, list[int]]]] = [[]]
    size = 0
    for name, inc, ids in holders:
        for start in range(0, len(ids), MAX_IDS):
            part = ids[start:start + MAX_IDS]
            if size + len(part) > MAX_IDS and out[-1]:
                out.append([])
                size = 0
            out[-1].append((name, inc, part))
            size += len(part)
    return [chunk for chunk in out if chunk]
