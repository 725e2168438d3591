"""Enqueue: one job or many, deduplicated, with subtype rows, waking idle workers."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.db.models import JSONField
from django.db.models.base import ModelState

from .. import bounds, hooks, jobtypes
from ..conf import get_settings
from ..dialects import JOB_COLUMNS, get_dialect, wake_payload
from ..exceptions import InvalidArgument, SubtypeMismatch
from ..states import DEDUPE_SCOPE, Status
from .rows import RowsMixin
from .values import encode_json, storable_key
from .wakeups import notify_on_commit

if TYPE_CHECKING:
    from ..models import Job, JobData


#: The columns an enqueue writes (attnames, in this order in every row :meth:`JobManager._validated_row`
#: builds); ``enqueued_at`` and ``updated_at`` are stamped by the database clock.
INSERT_COLUMNS: list[str] = ["queue", "job_type_id", "status_id", "step", "priority", "attempt_num", "max_attempts",
                             "payload", "error", "enqueued_at", "scheduled_for", "version", "updated_at", "worker",
                             "trace_context", "concurrency_key", "limited", "dedupe_key"]
#: From this many specs, :meth:`EnqueueMixin.enqueue_many` validates them through :meth:`EnqueueMixin._bulk_rows`.
BULK_ROWS_MIN = 50
#: What a new job's remaining columns hold.
_NOT_YET: dict[str, Any] = dict.fromkeys(("response", "started_at", "finished_at", "duration_ms", "lease_expires_at",
                                          "has_dependents", "batch_id"))


def database_clock(alias: str) -> datetime:
    """The database's current time, aware UTC: one round trip, sent only by an enqueue with a delay."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {get_dialect(connection).now()}", [])
        value = cursor.fetchone()[0]
    if isinstance(value, str):  # SQLite's text
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass
class JobSpec:
    """One job for :meth:`JobManager.enqueue_many`; the same options as :meth:`JobManager.enqueue`."""

    job_type: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    scheduled_for: datetime | None = None
    delay: float | timedelta | None = None
    dedupe_key: str | None = None
    max_attempts: int | None = None
    subtypes: Sequence[JobData] = field(default_factory=tuple)
    #: Jobs this one waits for (workflows.py): jobs, ids, JobSpecs of the same enqueue_many call, or
    #: ``(one of those, "cancel" | "run")``; the policy defaults to ``on_dependency_failure``.
    after: Sequence[Any] = ()
    #: The batch (a Batch or its id) this job is a member of.
    batch: Any = None
    on_dependency_failure: str = "cancel"
    #: The key whose limit the job counts against (docs/limits.md); None: the handler's
    #: ``concurrency_key`` of the payload, if it declares one.
    concurrency_key: str | int | None = None

    def __post_init__(self) -> None:
        if self.after:
            self.after = hooks.normalise_dependencies(self.after, self.on_dependency_failure)


class EnqueueMixin(RowsMixin):
    """Enqueue: validated rows in, Job objects out."""

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        scheduled_for: datetime | None = None,
        delay: float | timedelta | None = None,
        dedupe_key: str | None = None,
        max_attempts: int | None = None,
        subtypes: Sequence[JobData] = (),
        after: Sequence[Any] = (),
        on_dependency_failure: str = "cancel",
        batch: Any = None,
        using: str | None = None,
        concurrency_key: str | int | None = None,
    ) -> Job:
        """Insert one job (and its subtype rows) in one transaction; return it.

        With ``dedupe_key``, a second enqueue while a job with that key is unfinished returns the
        existing job instead of inserting (race-safe: the database's unique index decides).
        Commits with the caller's transaction when called inside ``transaction.atomic()``.

        ``after``: jobs (or ids) this one waits for, Waiting until they have finished; what happens when
        one ends other than Completed is ``on_dependency_failure`` ("cancel" the job, or "run" it
        anyway), or per dependency with ``(job, policy)`` pairs. ``batch``: the open batch it joins.
        See docs/workflows.md. ``concurrency_key``: the key whose limit it counts against, instead of
        the handler's (docs/limits.md).
        """
        spec = JobSpec(job_type, payload, queue, priority, scheduled_for, delay, dedupe_key, max_attempts,
                       tuple(subtypes), after, batch, on_dependency_failure, concurrency_key)
        return self.enqueue_many([spec], using=using)[0]

    def enqueue_many(self, specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
        """Insert many jobs in one transaction, in multi-row INSERTs; return them in input order.

        With OpenTelemetry installed, inside an enqueue span whose context each job carries (ops/tracing.py,
        reached through hooks.enqueue_span).
        """
        specs = list(specs)
        if not specs:  # nothing to insert, nobody to wake (an INSERT of no rows is a syntax error)
            return []
        if not hooks.tracing_enabled():
            return self._enqueue_many(specs, using, None)
        with hooks.enqueue_span([s.job_type for s in specs if isinstance(s.job_type, str)], len(specs),
                                [s.queue for s in specs if isinstance(s.queue, str)]) as carrier:
            return self._enqueue_many(specs, using, carrier)

    def _enqueue_many(self, specs: list[JobSpec], using: str | None, carrier: str | None) -> list[Job]:
        from ..handlers import registry

        alias = self._alias(using)
        connection = connections[alias]
        dialect = get_dialect(connection)
        settings = get_settings()
        flow = any(s.after or s.batch is not None for s in specs)
        if flow:
            hooks.check_workflow_specs(specs)
        rows: list[list[Any]] = []
        infos: dict[Any, jobtypes.TypeInfo] = {}  # one lookup per type name, not per job
        read: list[datetime] = []

        def clock() -> datetime:  # read once per call, and only by a call with a delay
            if not read:
                read.append(database_clock(alias))
            return read[0]

        if len(specs) >= BULK_ROWS_MIN:
            rows = self._bulk_rows(specs, infos, settings.MAX_PAYLOAD_BYTES, alias, dialect, carrier, clock)
        for spec in specs if not rows else ():
            info = infos.get(spec.job_type)
            if info is None:
                bounds.check_type_name(spec.job_type)
                info = jobtypes.get_type(spec.job_type, using=alias, create=registry.is_registered(spec.job_type))
                infos[spec.job_type] = info
            rows.append(self._validated_row(spec, info, settings.MAX_PAYLOAD_BYTES, alias, dialect, carrier, clock))
        key_at = INSERT_COLUMNS.index("concurrency_key")
        for info in infos.values():
            if info.limited:  # the permits of new keys' scopes, before their jobs can be claimed
                hooks.ensure_permits(alias, info, {r[key_at] for r in rows if r[1] == info.id})
        channel = settings.NOTIFY_CHANNEL if dialect.notify_sql() else ""
        if (not flow and len(rows) <= 3 and all(r[-1] is None for r in rows)
                and not any(s.subtypes for s in specs)):
            # The way an app enqueues: ONE statement, atomic by itself; only the id and clock stamps
            # come back. In autocommit it is the whole transaction (on PostgreSQL the wake-up rides in
            # the same round trip, see Dialect.insert_stamped): no BEGIN, no COMMIT round trips.
            # Inside the caller's atomic() no SAVEPOINT either (one statement cannot half-succeed),
            # and the wake-up is sent once per transaction, after its commit (wakeups.notify_on_commit).
            queues = wake_payload(s.queue for s in specs)
            # commit_on_exit is False in an atomic() entered with AUTOCOMMIT off: Django never runs its
            # on_commit hooks there, so the wake-up rides in the transaction (insert_stamped) instead.
            inside = connection.in_atomic_block and connection.commit_on_exit
            with connection.cursor() as cursor:
                stamped = dialect.insert_stamped(cursor, INSERT_COLUMNS, rows, "" if inside else channel, queues)
            if inside and channel:
                notify_on_commit(alias, channel, {s.queue for s in specs})
            return self._stamped_jobs(rows, stamped, alias)
        if (not flow and len(rows) == 1 and not specs[0].subtypes and dialect.multi_row_dedupe
                and not connection.in_atomic_block and connection.get_autocommit()):
            # One job with a dedupe key, in autocommit: INSERT ... ON CONFLICT DO NOTHING is atomic by
            # itself (the unique index decides a race, as inside a transaction), so no BEGIN/COMMIT; the
            # wake-up follows only when a row went in. Two round trips (insert, then the notification or
            # the existing job's read) instead of four or five.
            with connection.cursor() as cursor:
                inserted = self._rows_to_jobs(dialect.insert_job(cursor, INSERT_COLUMNS, rows, True), alias)
                if inserted and channel:
                    dialect.notify_after_commit(cursor, channel, specs[0].queue)
            found: list[Job | None] = [None]
            self._match_inserted(specs, found, 0, rows, inserted, alias)
            return found  # type: ignore[return-value]
        if self._copies(dialect, rows):
            return self._enqueue_copied(specs, rows, alias, flow)
        columns = INSERT_COLUMNS
        per_row = len(columns) - 2  # enqueued_at / updated_at are stamped by the database
        chunk = dialect.insert_chunk(per_row)
        jobs: list[Job | None] = [None] * len(specs)
        new_ids: set[int] = set()
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            for start in range(0, len(rows), chunk):
                part = rows[start:start + chunk]
                dedupe = any(r[-1] is not None for r in part)
                inserted = self._rows_to_jobs(dialect.insert_job(cursor, columns, part, dedupe), alias)
                new_ids.update(j.pk for j in inserted)
                self._match_inserted(specs, jobs, start, part, inserted, alias)
            for spec, job in zip(specs, jobs, strict=True):
                assert job is not None
                if job.pk in new_ids:  # a deduplicated enqueue returns the existing job, rows and all
                    self._save_subtypes(spec, job, alias)
            if flow:
                hooks.link_workflow(specs, jobs, alias)  # type: ignore[arg-type]
            notify = dialect.notify_sql()
            if notify and settings.NOTIFY_CHANNEL:
                # Delivered only when the transaction commits: idle workers wake for committed jobs.
                cursor.execute(notify, [settings.NOTIFY_CHANNEL, wake_payload(s.queue for s in specs)])
        return jobs  # type: ignore[return-value]

    def _validated_row(self, spec: JobSpec, info: jobtypes.TypeInfo, limit: int, alias: str,
                       dialect: Any, carrier: str | None = None,
                       clock: Callable[[], datetime] | None = None) -> list[Any]:
        if not isinstance(spec.queue, str) or not spec.queue or len(spec.queue) > 100:
            raise InvalidArgument(f"queue must be a non-empty string of at most 100 characters, got {spec.queue!r}")
        storable_key(spec.queue, "queue name")
        if not isinstance(spec.priority, int) or not -32768 <= spec.priority <= 32767:
            raise InvalidArgument(f"priority must be an integer from -32768 to 32767, got {spec.priority!r}")
        if spec.max_attempts is not None and (not isinstance(spec.max_attempts, int) or not 1 <= spec.max_attempts <= 32767):
            raise InvalidArgument(f"max_attempts must be an integer from 1 to 32767, got {spec.max_attempts!r}")
        if spec.dedupe_key is not None and (not isinstance(spec.dedupe_key, str) or not 0 < len(spec.dedupe_key) <= 200):
            raise InvalidArgument("dedupe_key must be a non-empty string of at most 200 characters")
        if spec.dedupe_key is not None:
            storable_key(spec.dedupe_key, "dedupe_key")
        when = spec.scheduled_for
        if spec.delay is not None:
            if when is not None:
                raise InvalidArgument("give scheduled_for or delay, not both")
            seconds = bounds.check_delay(spec.delay)
            # Counted from the database's clock, like every due test (a host 1 h behind made a delay=3600
            # job due at once); a delay of 0 is "due now", the insert's own clock (issue 31, item 8).
            start = clock() if clock is not None else database_clock(alias)
            when = start + timedelta(seconds=seconds) if seconds else None
        elif when is not None:
            bounds.check_when(when)
        payload = dialect.json_param(
            "{}" if spec.payload is None else encode_json(spec.payload, "payload", limit))
        if spec.concurrency_key is not None:
            key = bounds.storable_concurrency_key(spec.concurrency_key)
        else:
            from ..handlers import registry

            found = registry.declared(info.name)
            key = found.key_of(spec.payload) if found is not None and found.concurrency_key is not None else ""
        return [
            spec.queue, info.id, int(Status.WAITING if spec.after else Status.PENDING), "", spec.priority, 0,
            spec.max_attempts, payload, "", None, None if when is None else self._prep("scheduled_for", when, alias),
            1, None, "", carrier, key, info.limited, spec.dedupe_key,
        ]

    def _match_inserted(self, specs: list[JobSpec], jobs: list[Job | None], start: int, part: list[list[Any]],
                        inserted: list[Job], alias: str) -> None:
        """Pair inserted rows with their specs; a dedupe conflict returns the existing unfinished job."""
        if len(inserted) == len(part) and all(row[-1] is None for row in part):
            # Every row went in; RETURNING/OUTPUT order is not promised, ids are: sort by id. (Keyed
            # rows may go in key order, not row order, on SQL Server: matched by key below.)
            for i, job in enumerate(sorted(inserted, key=lambda j: j.pk)):
                jobs[start + i] = job
            return
        by_key = {j.dedupe_key: j for j in inserted if j.dedupe_key is not None}
        plain = sorted((j for j in inserted if j.dedupe_key is None), key=lambda j: j.pk)
        plain_iter = iter(plain)
        given: set[str] = set()
        for i, row in enumerate(part):
            key = row[-1]
            if key is None:
                jobs[start + i] = next(plain_iter)
            elif key in by_key and key not in given:  # the spec whose row went in
                jobs[start + i] = by_key[key]
                given.add(key)
            elif key in by_key:
                # A later spec with a key already taken in this call: the same job, marked as returned
                # instead of inserted (a copy, so the first spec's job stays unmarked).
                jobs[start + i] = copy.copy(by_key[key])
                jobs[start + i].deduplicated = True
            else:
                existing = self.using(alias).filter(dedupe_key=key, status_id__in=DEDUPE_SCOPE).first()
                if existing is None:  # finished in between: enqueue afresh
                    existing = self.enqueue_many([specs[start + i]], using=alias)[0]
                else:
                    existing.deduplicated = True
                jobs[start + i] = existing
                by_key[key] = existing
                given.add(key)

    def _save_subtypes(self, spec: JobSpec, job: Job, alias: str) -> None:
        for row in spec.subtypes:
            expected = getattr(row, "job_type_name", None)
            if expected is not None and expected != spec.job_type:
                raise SubtypeMismatch(
                    f"{type(row).__name__} belongs to job type {expected!r}, not {spec.job_type!r}"
                )
            row.job = job
            row.full_clean(exclude=["job"])
            row.save(using=alias, force_insert=True)

    def _stamped_jobs(self, rows: list[list[Any]], stamped: list[tuple[Any, ...]], using: str) -> list[Job]:
        """Jobs as a read would return them, from INSERT_COLUMNS rows as sent plus the database's
        :attr:`~.dialects.base.Dialect.STAMPED` values (no second trip for the rest of the row)."""
        connection = connections[using]
        dialect = get_dialect(connection)
        stamp_convs = self._converters(connection, dialect.STAMPED)
        payload_convs = self._converters(connection, ("payload",))
        fast = self._fast_init()
        out = []
        # The stamps are one clock value (enqueued_at, updated_at, scheduled_for unless given): each
        # distinct raw value is converted once (SQLite's text dates parse at ~10 us each).
        keys = [(i, convs, tuple(convs)) for i, convs in stamp_convs]
        seen: dict[tuple[Any, Any], Any] = {}
        for row, raw in zip(rows, stamped, strict=True):
            values = dict(zip(INSERT_COLUMNS, row, strict=True))
            values.update(_NOT_YET)
            text = dialect.json_text(values["payload"])
            values["payload"] = {} if text == "{}" else self._convert([text], payload_convs, connection)[0]
            stamps = list(raw)
            for i, convs, key in keys:
                hit = seen.get((key, stamps[i]), seen)
                if hit is seen:
                    hit = seen[(key, stamps[i])] = self._convert([stamps[i]], [(0, convs)], connection)[0]
                stamps[i] = hit
            values.update(zip(dialect.STAMPED, stamps, strict=True))
            out.append(self._instance({c: values[c] for c in JOB_COLUMNS}, using, fast))
        return out


    # ----- bulk enqueue through the vendor's bulk load (issue 30, item 4) ------------------------------
    @staticmethod
    def _copies(dialect: Any, rows: list[list[Any]]) -> bool:
        """Whether ``rows`` go in through the dialect's bulk load (PostgreSQL's COPY): enough of them, and
        none with a dedupe key (those need the unique index's ``ON CONFLICT``, which COPY has not)."""
        least = getattr(dialect, "copy_stamped_min_rows", None)
        return least is not None and len(rows) >= least and all(r[-1] is None for r in rows)

    def _enqueue_copied(self, specs: list[JobSpec], rows: list[list[Any]], alias: str, flow: bool) -> list[Job]:
        """:meth:`enqueue_many`'s insert through :meth:`~.dialects.postgresql.PostgresDialect.copy_stamped`,
        with everything else of it unchanged: one transaction, subtype rows, workflow links, ONE notify.

        The Job objects are built from the rows as sent plus the ids and clock the database gave: no
        row comes back (a bulk call's payloads would be sent back and parsed again)."""
        connection = connections[alias]
        dialect = get_dialect(connection)
        settings = get_settings()
        at = INSERT_COLUMNS.index("payload")
        payloads = [dialect.json_text(r[at]) for r in rows]
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            jobs = dialect.copy_stamped(cursor, INSERT_COLUMNS, rows, payloads,
                                        lambda ids, now: self._copied_jobs(rows, payloads, ids, now, alias))
            for spec, job in zip(specs, jobs, strict=True):
                if spec.subtypes:
                    self._save_subtypes(spec, job, alias)
            if flow:
                hooks.link_workflow(specs, jobs, alias)
            notify = dialect.notify_sql()
            if notify and settings.NOTIFY_CHANNEL:  # delivered on commit: idle workers wake for committed jobs
                cursor.execute(notify, [settings.NOTIFY_CHANNEL, wake_payload(s.queue for s in specs)])
        return jobs

    def _bulk_rows(self, specs: list[JobSpec], infos: dict[Any, jobtypes.TypeInfo], limit: int, alias: str,
                   dialect: Any, carrier: str | None, clock: Callable[[], datetime]) -> list[list[Any]]:
        """The rows of many specs, as :meth:`_validated_row` makes them, validated once per set of options.

        A bulk call's specs mostly share every option but their payload (and dedupe key): the first spec
        of each set of options (type, queue, priority, schedule, delay, attempts, dependencies, key) goes
        through :meth:`_validated_row`; the others copy its row and check only what differs, their
        payload and dedupe key (and derive the concurrency key from the payload where the handler
        declares one). Values are compared with their types (``1``, ``1.0`` and ``True`` differ); a spec
        whose options cannot be compared (unhashable) is validated alone. ``infos`` gets each type.
        """
        from ..handlers import registry

        payload_at, key_at = INSERT_COLUMNS.index("payload"), INSERT_COLUMNS.index("concurrency_key")
        empty = dialect.json_param("{}")
        templates: dict[tuple[Any, ...], tuple[list[Any], Any]] = {}
        rows: list[list[Any]] = []
        for spec in specs:
            options: tuple[Any, ...] | None = (
                spec.job_type, type(spec.queue), spec.queue, type(spec.priority), spec.priority,
                type(spec.scheduled_for), spec.scheduled_for, type(spec.delay), spec.delay,
                type(spec.max_attempts), spec.max_attempts, bool(spec.after),
                type(spec.concurrency_key), spec.concurrency_key)
            try:
                found = templates.get(options)  # type: ignore[arg-type]
            except TypeError:  # an unhashable option (refused by the validation below)
                found, options = None, None
            if found is None:
                info = infos.get(spec.job_type)
                if info is None:
                    bounds.check_type_name(spec.job_type)
                    info = jobtypes.get_type(spec.job_type, using=alias,
                                             create=registry.is_registered(spec.job_type))
                    infos[spec.job_type] = info
                row = self._validated_row(spec, info, limit, alias, dialect, carrier, clock)
                if options is not None:
                    declared = registry.declared(info.name) if spec.concurrency_key is None else None
                    templates[options] = (row, declared if declared is not None and declared.concurrency_key
                                          is not None else None)
                rows.append(row)
                continue
            template, declared = found
            key = spec.dedupe_key  # checked as _validated_row checks it
            if key is not None:
                if not isinstance(key, str) or not 0 < len(key) <= 200:
                    raise InvalidArgument("dedupe_key must be a non-empty string of at most 200 characters")
                storable_key(key, "dedupe_key")
            row = template.copy()
            row[payload_at] = empty if spec.payload is None else dialect.json_param(
                encode_json(spec.payload, "payload", limit))
            if declared is not None:
                row[key_at] = declared.key_of(spec.payload)
            row[-1] = key
            rows.append(row)
        return rows

    def _copied_jobs(self, rows: list[list[Any]], payloads: list[str], ids: list[int], now: datetime,
                     alias: str) -> list[Job]:
        """Jobs as a read of the new rows would return them (the JOB_COLUMNS a claim returns), from the
        rows as sent, their payloads' JSON text, and the ids and clock stamp the database gave."""
        connection = connections[alias]
        payload_convs = self._converters(connection, ("payload",))
        fast = self._fast_init()
        sent = [(c, INSERT_COLUMNS.index(c)) for c in JOB_COLUMNS
                if c in INSERT_COLUMNS and c not in ("payload", "enqueued_at", "updated_at", "scheduled_for")]
        when_at = INSERT_COLUMNS.index("scheduled_for")
        plain = type(self.model._meta.get_field("payload")).from_db_value is JSONField.from_db_value and \
            self.model._meta.get_field("payload").decoder is None  # Django's own parse, no custom decoder
        model, new = self.model, self.model.__new__
        base = dict.fromkeys(JOB_COLUMNS)
        base.update(_NOT_YET)
        base["enqueued_at"] = base["updated_at"] = now
        jobs = []
        for row, text, job_id in zip(rows, payloads, ids, strict=True):
            values = base.copy()
            for c, i in sent:
                values[c] = row[i]
            values["id"] = job_id
            when = row[when_at]
            values["scheduled_for"] = now if when is None else when.astimezone(now.tzinfo)
            # "{}" (no payload) parses to a new empty dict: json.loads of it was a fifth of this loop
            values["payload"] = {} if text == "{}" and plain else self._convert([text], payload_convs, connection)[0]
            if fast:  # _instance, inlined (as _rows_to_jobs does)
                job = new(model)
                state = job._state = ModelState()
                state.adding, state.db = False, alias
                job.__dict__.update(values)
                jobs.append(job)
            else:
                jobs.append(self._instance(values, alias, fast))
        return jobs
