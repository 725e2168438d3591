"""JobQuerySet (reads) and JobManager (enqueue, claim, complete, modify, purge, reap).

Every change of a job's status goes through :class:`JobManager` (:meth:`~JobManager.claim`,
:meth:`~JobManager.modify` and the batched :meth:`~JobManager.complete_many`), so the transition table
and the concurrency token are enforced in one place for the worker, the admin and the API alike.
Reads do not all come through here: the admin's filters (admin_filters.py) and explain.py send their
own SQL.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, models, router, transaction
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from . import jobtypes, limits, tracing
from .conf import get_settings
from .dialects import JOB_COLUMNS, ClaimRequest, get_dialect
from .exceptions import (
    IllegalTransition,
    InvalidArgument,
    InvalidPayload,
    JobNotFound,
    StaleJob,
    SubtypeMismatch,
)
from .states import CLAIMABLE, FINISHED, TRANSITIONS, UNFINISHED, Status

if TYPE_CHECKING:
    from .models import Job, JobData

#: Entering Processing is the claim's job (it bumps the attempt and writes history); modify refuses it
#: except for a job already Processing (a step advance within the same attempt).
CLAIM_ONLY = frozenset({(Status.PENDING, Status.PROCESSING), (Status.ERROR, Status.PROCESSING)})
_UNSET: Any = object()
MAX_ERROR_CHARS = 65_536
CLAIM_RETRIES = 5

#: The columns an enqueue writes (attnames, in this order in every row :meth:`JobManager._validated_row`
#: builds); ``enqueued_at`` and ``updated_at`` are stamped by the database clock.
INSERT_COLUMNS: list[str] = ["queue", "job_type_id", "status_id", "step", "priority", "attempt_num", "max_attempts",
                             "payload", "error", "enqueued_at", "scheduled_for", "version", "updated_at", "worker",
                             "trace_context", "dedupe_key"]
#: What a new job's remaining columns hold.
_NOT_YET: dict[str, Any] = dict.fromkeys(("response", "started_at", "finished_at", "duration_ms", "lease_expires_at"))


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


#: Longest delay or retry a caller may ask for (a century; see :mod:`.limits`).
MAX_DELAY_SECONDS = limits.MAX_DELAY_SECONDS


def new_incarnation() -> str:
    """A fresh worker incarnation id (see ``Worker.incarnation``): random, 32 hex characters."""
    return uuid.uuid4().hex


def unstorable(value: Any) -> str | None:
    """Why ``value`` (JSON-serialisable) cannot be stored on every vendor, or None.

    PostgreSQL's jsonb and text refuse the NUL character, and no UTF-8 column holds a lone surrogate;
    SQLite stores both. Refused everywhere so that what works on SQLite works on PostgreSQL too.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "it contains a NUL character (\\u0000), which PostgreSQL cannot store"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it contains a lone surrogate, which is not valid UTF-8"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


def finite_seconds(value: Any) -> bool:
    """A non-negative, finite number of seconds within :data:`MAX_DELAY_SECONDS`."""
    return limits.is_seconds(value, MAX_DELAY_SECONDS)


def duration_ms(seconds: float | None) -> int | None:
    """A handler's measured run time (seconds, or None: not measured) as the ``duration_ms`` column holds it."""
    if seconds is None:
        return None
    if not finite_seconds(seconds):
        raise InvalidArgument(f"duration must be a non-negative number of seconds, got {seconds!r}")
    return round(seconds * 1000)


def storable_error(text: str) -> str:
    """Error text as every vendor can store it (NUL and lone surrogates escaped), truncated."""
    return text[:MAX_ERROR_CHARS].replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def offending_path(value: Any) -> str:
    """Where in ``value`` the first item JSON cannot hold sits, as ``['order']['items'][1]`` ('' for
    ``value`` itself or when nothing is found), so an error names the key instead of only the type."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if len(path) > 300:
            return path[:300] + "..."
        if isinstance(item, dict):
            for key in reversed(list(item)):
                if not isinstance(key, str | int | float | bool) and key is not None:
                    return f"{path}[{key!r}]"
                stack.append((item[key], f"{path}[{key!r}]"))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], f"{path}[{i}]") for i in reversed(range(len(item))))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path
        elif not (item is None or isinstance(item, str | int | bool)):
            return path
    return ""


def _encode_json(value: Any, what: str, limit: int | None = None) -> str:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        # Name the offending key (not for a cycle or a too-deep value: no key is at fault there).
        where = "" if isinstance(exc, RecursionError) or "Circular" in str(exc) else offending_path(value)
        raise InvalidPayload(f"{what} must be JSON-serialisable: {f'{what}{where}: ' if where else ''}{exc}") from exc
    why = unstorable(value)
    if why:
        raise InvalidPayload(f"{what} cannot be stored: {why}")
    if limit is not None and len(text.encode()) > limit:
        raise InvalidPayload(f"{what} is {len(text.encode())} bytes; the limit is {limit} (SQLQUEUE['MAX_PAYLOAD_BYTES'])")
    return text


def _check_response(value: Any) -> None:
    """A response the queue may store: JSON, storable on every vendor, within ``MAX_RESPONSE_BYTES``."""
    why = limits.response_too_large(_encode_json(value, "response"))
    if why:
        raise InvalidPayload(f"response cannot be stored: {why}")


def _storable_key(value: Any, what: str) -> None:
    """Queue names and dedupe keys: text every vendor stores (PostgreSQL refuses NUL in text)."""
    why = unstorable(value)
    if why:
        raise InvalidArgument(f"{what} cannot be stored: {why}")


class JobQuerySet(models.QuerySet):
    """Read helpers used by the admin, the worker and tests."""

    def with_status(self, *statuses: Status | int | str) -> JobQuerySet:
        ids = [Status.from_label(s) if isinstance(s, str) else Status(s) for s in statuses]
        return self.filter(status_id__in=ids)

    def overdue(self) -> JobQuerySet:
        return self.filter(status_id__in=CLAIMABLE, scheduled_for__lte=timezone.now())

    def purgeable(self, statuses: Iterable[Status | int], cutoff: datetime, queues: Sequence[str] = ()) -> JobQuerySet:
        """Jobs :meth:`JobManager.purge` would delete: in ``statuses`` (finished ones only), finished
        (or, without a finish time, last updated) before ``cutoff``, of ``queues`` if given.

        Read ids from it (``values_list("id")``), never whole rows: payloads can be large.
        """
        old = models.Q(finished_at__lt=cutoff) | models.Q(finished_at__isnull=True, updated_at__lt=cutoff)
        qs = self.filter(old, status_id__in=_purge_statuses(statuses))
        return qs.filter(queue__in=list(queues)) if queues else qs


def _purge_statuses(statuses: Iterable[Status | int]) -> list[int]:
    out = sorted({int(Status(s)) for s in statuses})
    if not out or any(Status(s) not in FINISHED for s in out):
        raise InvalidArgument("only finished jobs may be purged: statuses must be some of "
                              f"{', '.join(s.label for s in sorted(FINISHED))}, got {statuses!r}")
    return out


class JobManager(models.Manager.from_queryset(JobQuerySet)):  # type: ignore[misc]
    """Enqueue, claim and modify jobs. ``using`` picks the database (default: SQLQUEUE['DATABASE'])."""

    # ----- helpers ------------------------------------------------------------------------------
    def _alias(self, using: str | None) -> str:
        return using or self._db or get_settings().DATABASE or router.db_for_write(self.model)

    def _converters(self, connection: Any, names: tuple[str, ...] = JOB_COLUMNS) -> list[tuple[int, list[Any]]]:
        """(position, converters) for the ``names`` that need any; computed once per connection."""
        dialect = get_dialect(connection)
        cache = dialect.__dict__.setdefault("_converter_cache", {})
        cached = cache.get(names)
        if cached is None:
            meta = self.model._meta
            cached = []
            for i, attname in enumerate(names):
                f = next(x for x in meta.concrete_fields if x.attname == attname)
                col = f.get_col(meta.db_table)
                convs = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
                if convs:
                    cached.append((i, convs))
            cache[names] = cached
        return cached

    @staticmethod
    def _convert(values: list[Any], converters: list[tuple[int, list[Any]]], connection: Any) -> list[Any]:
        for i, convs in converters:
            value = values[i]
            for conv in convs:
                value = conv(value, None, connection)
            values[i] = value
        return values

    def _instance(self, values: dict[str, Any], using: str, fast: bool) -> Job:
        """A Job loaded from ``using`` with these attribute values (every concrete field).

        ``fast`` (nobody listens to pre_init/post_init for Job, who would expect ``__init__`` to run):
        what Model.__init__ would do for a full row, minus its per-field argument handling.
        """
        model = self.model
        if not fast:
            return model.from_db(using, list(values), list(values.values()))
        job = model.__new__(model)
        state = job._state = ModelState()
        state.adding, state.db = False, using
        job.__dict__.update(values)
        return job

    def _fast_init(self) -> bool:
        return not (pre_init.has_listeners(self.model) or post_init.has_listeners(self.model))

    def _rows_to_jobs(self, rows: Iterable[Sequence[Any]], using: str) -> list[Job]:
        """Build Job objects from raw JOB_COLUMNS rows, applying the backend's value converters.

        The claim's hot path: no query, no per-row field lookups (the converters are cached per
        connection), and ``from_db`` as Django's own queryset iterator uses it.
        """
        connection = connections[using]
        converters = self._converters(connection)
        if not self._fast_init():
            return [self._instance(dict(zip(JOB_COLUMNS, self._convert(list(row), converters, connection),
                                            strict=True)), using, False) for row in rows]
        model, new, names = self.model, self.model.__new__, JOB_COLUMNS
        jobs = []
        for row in rows:  # _instance, inlined: this is the claim's hot path
            values = list(row)
            for i, convs in converters:
                value = values[i]
                for conv in convs:
                    value = conv(value, None, connection)
                values[i] = value
            job = new(model)
            state = job._state = ModelState()
            state.adding, state.db = False, using
            job.__dict__.update(zip(names, values, strict=True))
            jobs.append(job)
        return jobs

    def _stamped_jobs(self, rows: list[list[Any]], stamped: list[tuple[Any, ...]], using: str) -> list[Job]:
        """Jobs as a read would return them, from INSERT_COLUMNS rows as sent plus the database's
        :attr:`~.dialects.base.Dialect.STAMPED` values (no second trip for the rest of the row)."""
        connection = connections[using]
        dialect = get_dialect(connection)
        stamp_convs = self._converters(connection, dialect.STAMPED)
        payload_convs = self._converters(connection, ("payload",))
        fast = self._fast_init()
        out = []
        for row, raw in zip(rows, stamped, strict=True):
            values = dict(zip(INSERT_COLUMNS, row, strict=True))
            values.update(_NOT_YET)
            values["payload"] = self._convert([dialect.json_text(values["payload"])], payload_convs, connection)[0]
            values.update(zip(dialect.STAMPED, self._convert(list(raw), stamp_convs, connection), strict=True))
            out.append(self._instance({c: values[c] for c in JOB_COLUMNS}, using, fast))
        return out

    def _prep(self, attname: str, value: Any, using: str) -> Any:
        if value is None:
            return None
        return self.model._meta.get_field(attname.removesuffix("_id")).get_db_prep_save(value, connections[using])

    # ----- enqueue ------------------------------------------------------------------------------
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
        using: str | None = None,
    ) -> Job:
        """Insert one job (and its subtype rows) in one transaction; return it.

        With ``dedupe_key``, a second enqueue while a job with that key is unfinished returns the
        existing job instead of inserting (race-safe: the database's unique index decides).
        Commits with the caller's transaction when called inside ``transaction.atomic()``.
        """
        spec = JobSpec(job_type, payload, queue, priority, scheduled_for, delay, dedupe_key, max_attempts,
                       tuple(subtypes))
        return self.enqueue_many([spec], using=using)[0]

    def enqueue_many(self, specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
        """Insert many jobs in one transaction, in multi-row INSERTs; return them in input order.

        With OpenTelemetry installed, inside an enqueue span whose context each job carries (tracing.py).
        """
        specs = list(specs)
        if not specs:  # nothing to insert, nobody to wake (an INSERT of no rows is a syntax error)
            return []
        if not tracing.enabled():
            return self._enqueue_many(specs, using, None)
        with tracing.enqueue_span([s.job_type for s in specs if isinstance(s.job_type, str)], len(specs),
                                  [s.queue for s in specs if isinstance(s.queue, str)]) as carrier:
            return self._enqueue_many(specs, using, carrier)

    def _enqueue_many(self, specs: list[JobSpec], using: str | None, carrier: str | None) -> list[Job]:
        from .handlers import registry

        alias = self._alias(using)
        connection = connections[alias]
        dialect = get_dialect(connection)
        settings = get_settings()
        rows: list[list[Any]] = []
        infos: dict[Any, jobtypes.TypeInfo] = {}  # one lookup per type name, not per job
        for spec in specs:
            info = infos.get(spec.job_type)
            if info is None:
                limits.check_type_name(spec.job_type)
                info = jobtypes.get_type(spec.job_type, using=alias, create=registry.is_registered(spec.job_type))
                infos[spec.job_type] = info
            rows.append(self._validated_row(spec, info, settings.MAX_PAYLOAD_BYTES, alias, dialect, carrier))
        channel = settings.NOTIFY_CHANNEL if dialect.notify_sql() else ""
        if (len(rows) <= 3 and not connection.in_atomic_block and all(r[-1] is None for r in rows)
                and not any(s.subtypes for s in specs)):
            # The way an app enqueues, one job per transaction: ONE statement in autocommit (insert
            # and, on PostgreSQL, pg_notify in the same statement), atomic by itself. No BEGIN, no
            # separate notify, no COMMIT round trips; only the id and clock stamps come back.
            with connection.cursor() as cursor:
                stamped = dialect.insert_stamped(cursor, INSERT_COLUMNS, rows, channel,
                                                 ",".join(sorted({s.queue for s in specs})))
            return self._stamped_jobs(rows, stamped, alias)
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
            notify = dialect.notify_sql()
            if notify and settings.NOTIFY_CHANNEL:
                queues = sorted({s.queue for s in specs})
                # Delivered only when the transaction commits: idle workers wake for committed jobs.
                cursor.execute(notify, [settings.NOTIFY_CHANNEL, ",".join(queues)])
        return jobs  # type: ignore[return-value]

    def _validated_row(self, spec: JobSpec, info: jobtypes.TypeInfo, limit: int, alias: str,
                       dialect: Any, carrier: str | None = None) -> list[Any]:
        if not isinstance(spec.queue, str) or not spec.queue or len(spec.queue) > 100:
            raise InvalidArgument(f"queue must be a non-empty string of at most 100 characters, got {spec.queue!r}")
        _storable_key(spec.queue, "queue name")
        if not isinstance(spec.priority, int) or not -32768 <= spec.priority <= 32767:
            raise InvalidArgument(f"priority must be an integer from -32768 to 32767, got {spec.priority!r}")
        if spec.max_attempts is not None and (not isinstance(spec.max_attempts, int) or not 1 <= spec.max_attempts <= 32767):
            raise InvalidArgument(f"max_attempts must be an integer from 1 to 32767, got {spec.max_attempts!r}")
        if spec.dedupe_key is not None and (not isinstance(spec.dedupe_key, str) or not 0 < len(spec.dedupe_key) <= 200):
            raise InvalidArgument("dedupe_key must be a non-empty string of at most 200 characters")
        if spec.dedupe_key is not None:
            _storable_key(spec.dedupe_key, "dedupe_key")
        when = spec.scheduled_for
        if spec.delay is not None:
            if when is not None:
                raise InvalidArgument("give scheduled_for or delay, not both")
            seconds = limits.check_delay(spec.delay)
            when = timezone.now() + timedelta(seconds=seconds) if seconds else None
        elif when is not None:
            limits.check_when(when)
        payload = dialect.json_param(
            "{}" if spec.payload is None else _encode_json(spec.payload, "payload", limit))
        return [
            spec.queue, info.id, int(Status.PENDING), "", spec.priority, 0, spec.max_attempts, payload, "", None,
            None if when is None else self._prep("scheduled_for", when, alias), 1, None, "", carrier,
            spec.dedupe_key,
        ]

    def _match_inserted(self, specs: list[JobSpec], jobs: list[Job | None], start: int, part: list[list[Any]],
                        inserted: list[Job], alias: str) -> None:
        """Pair inserted rows with their specs; a dedupe conflict returns the existing unfinished job."""
        if len(inserted) == len(part):
            # Every row went in; RETURNING/OUTPUT order is not promised, ids are: sort by id.
            for i, job in enumerate(sorted(inserted, key=lambda j: j.pk)):
                jobs[start + i] = job
            return
        by_key = {j.dedupe_key: j for j in inserted if j.dedupe_key is not None}
        plain = sorted((j for j in inserted if j.dedupe_key is None), key=lambda j: j.pk)
        plain_iter = iter(plain)
        for i, row in enumerate(part):
            key = row[-1]
            if key is None:
                jobs[start + i] = next(plain_iter)
            elif key in by_key:
                jobs[start + i] = by_key[key]
            else:
                existing = self.using(alias).filter(dedupe_key=key, status_id__in=UNFINISHED).first()
                if existing is None:  # finished in between: enqueue afresh
                    existing = self.enqueue_many([specs[start + i]], using=alias)[0]
                jobs[start + i] = existing
                by_key[key] = existing

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

    # ----- claim --------------------------------------------------------------------------------
    def claim(
        self,
        worker: str,
        limit: int = 1,
        *,
        queues: Sequence[str] = (),
        types: Sequence[str] = (),
        using: str | None = None,
        incarnation: str | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` jobs for ``worker`` in one statement; return them, claim order.

        Takes, in priority (high first), scheduled_for, id order: Pending/Error jobs that are due with
        attempts left and an unpaused type; Processing jobs held by this worker name from an earlier
        incarnation (its own unfinished work after a restart) unless another incarnation holds the
        name's worker row now; Processing jobs whose lease expired or whose worker's heartbeat is stale.
        Each becomes Processing with attempt + 1, a lease from the database clock, a new token
        (``version``), ``incarnation`` (a fresh random one when None: each call is its own incarnation)
        and a history row. Never returns a job to two claimers.
        """
        if not isinstance(limit, int) or limit < 1 or limit > 10_000:
            raise InvalidArgument(f"limit must be an integer from 1 to 10000, got {limit!r}")
        return self.complete_and_claim((), worker, limit, queues=queues, types=types, using=using,
                                       incarnation=incarnation)[1]

    def complete_many(self, done: Sequence[tuple[Job, Any] | tuple[Job, Any, float | None]], *,
                      using: str | None = None) -> list[Job]:
        """Processing -> Completed for many jobs at once: ``done`` is (job, response) pairs, or (job,
        response, seconds the handler ran) triples: without it the duration is claim to completion.

        One statement per chunk (on PostgreSQL one data-modifying CTE updates the jobs and closes their
        history rows), all in one transaction. Each job must still carry the token it was claimed with:
        a job whose token moved on (reclaimed after a stall, changed by an operator) is left alone and
        missing from the result, exactly as :meth:`complete` would refuse it with :class:`StaleJob`.
        Returns the updated rows of the jobs that were completed.
        """
        return self.complete_and_claim(done, "", 0, using=using)[0]

    def complete_and_claim(
        self,
        done: Sequence[tuple[Job, Any] | tuple[Job, Any, float | None]],
        worker: str,
        limit: int,
        *,
        queues: Sequence[str] = (),
        types: Sequence[str] = (),
        using: str | None = None,
        reclaim: bool = True,
        incarnation: str | None = None,
    ) -> tuple[list[Job], list[Job]]:
        """Record finished jobs and claim the next ones in ONE transaction (one commit, not two).

        ``done``: the jobs to complete, as :meth:`complete_many` takes them; then up to ``limit``
        jobs are claimed for ``worker`` as :meth:`claim` does (``limit=0``: complete only). A worker
        that just finished a batch would otherwise commit its results and then, at once, commit a
        claim: joining the two loses nothing (the results are committed before the new jobs run, and
        a failure rolls both back, so the jobs are still Processing under the old token and the
        caller records them again). Returns (completed rows, claimed jobs).

        ``reclaim=False`` claims only due Pending/Error jobs, not stuck Processing ones: a busy worker
        uses it between periodic full claims because it is much cheaper (see worker.py).
        """
        if not isinstance(limit, int) or limit < 0 or limit > 10_000:
            raise InvalidArgument(f"limit must be an integer from 0 to 10000, got {limit!r}")
        if limit and (not isinstance(worker, str) or not worker or len(worker) > 200):
            raise InvalidArgument("worker must be a non-empty string of at most 200 characters")
        alias = self._alias(using)
        items = []
        for job, response, *ran in done:
            _check_response(response)
            items.append((job.pk, job.version, self._prep("response", response, alias),
                          duration_ms(ran[0] if ran else None)))
        settings = get_settings()
        type_ids = tuple(jobtypes.get_type(t, using=alias).id for t in types) if limit else ()
        req = ClaimRequest(
            worker=worker or "-",
            limit=limit,
            queues=tuple(queues),
            types=type_ids,
            default_max_attempts=settings.MAX_ATTEMPTS,
            default_lease_seconds=settings.LEASE_SECONDS,
            worker_dead_after_seconds=settings.WORKER_DEAD_AFTER_SECONDS,
            reclaim=reclaim,
            incarnation=new_incarnation() if incarnation is None else str(incarnation)[:32],
        )
        connection = connections[alias]
        dialect = get_dialect(connection)
        for attempt in range(CLAIM_RETRIES):
            try:
                # SQLite: BEGIN IMMEDIATE (the write lock before the first read); PostgreSQL: one
                # statement alone runs in autocommit; otherwise atomic().
                with connection.cursor() as cursor, dialect.write_transaction(cursor, len(items), bool(limit)):
                    finished, rows = dialect.complete_and_claim(cursor, items, req if limit else None)
                return self._rows_to_jobs(finished, alias), self._rows_to_jobs(rows, alias)
            except DatabaseError as exc:
                # Inside the caller's transaction a deadlock victim's whole transaction is gone: no retry.
                if (attempt == CLAIM_RETRIES - 1 or not dialect.is_retryable_error(exc)
                        or connection.in_atomic_block):
                    raise
                time.sleep(0.01 * 2**attempt)
        return [], []  # pragma: no cover

    # ----- modify -------------------------------------------------------------------------------
    def get_for_update(self, job_id: int, *, using: str | None = None) -> Job:
        """Read the current row (a locking read on SQL Server, so row versioning cannot show a stale one)."""
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        with connections[alias].cursor() as cursor:
            dialect.execute(cursor, dialect.select_job_sql(f"{dialect.n.j['id']} = %s"), [job_id])
            rows = cursor.fetchall()
        if not rows:
            raise JobNotFound(f"no job with id {job_id}")
        return self._rows_to_jobs(rows, alias)[0]

    def modify(
        self,
        job: Job | int,
        token: int | None,
        status: Status | int,
        *,
        step: str | None = None,
        response: Any = _UNSET,
        error: str | None = None,
        scheduled_for: datetime | None = None,
        run_in: float | None = None,
        reset_attempts: bool = False,
        duration: float | None = None,
        using: str | None = None,
        _release_note: str = "",
    ) -> Job:
        """Move a job to ``status`` if ``token`` still matches its ``version``; return the new row.

        Refuses transitions not in the table (:class:`IllegalTransition`) and writes nothing when the token is stale (:class:`StaleJob`). An Error when attempts are
        exhausted becomes Failed. Finishing an attempt stamps finished_at and duration and closes the
        history row; handing a Processing job back to Pending gives its attempt back. ``step`` keeps
        or advances the step. ``run_in`` sets scheduled_for to the database clock plus that many
        seconds (so a retry's due time does not depend on the worker host's clock). ``duration``: the
        seconds the handler itself ran, as the worker measured it, stored as the attempt's duration
        when it finishes (without it: the time since the claim, by the database clock). ``job`` may be
        a Job (its status and version are what the caller read) or an id (the current row is read
        first; ``token=None`` then means "whatever it is now").
        """
        alias = self._alias(using)
        new = Status(status)
        if not isinstance(job, self.model):
            job = self.get_for_update(int(job), using=alias)  # type: ignore[arg-type]
        if token is None:
            token = job.version
        if job.version != token:
            raise StaleJob(f"job {job.pk}: token {token} is stale (now {job.version}); nothing was changed")
        current = job.state
        if new not in TRANSITIONS[current] or (current, new) in CLAIM_ONLY:
            raise IllegalTransition(f"job {job.pk}: {current.label} -> {new.label} is not allowed")
        if scheduled_for is not None:
            limits.check_when(scheduled_for)
        if run_in is not None:
            if scheduled_for is not None:
                raise InvalidArgument("give run_in or scheduled_for, not both")
            limits.check_delay(run_in, "run_in (a retry's delay)")
        ms = duration_ms(duration)
        connection = connections[alias]
        dialect = get_dialect(connection)
        sql, params = self._modify_statement(dialect, job, current, new, step, response, error, scheduled_for,
                                             run_in, reset_attempts, alias, ms)
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            dialect.execute(cursor, sql, [*params, job.pk, token])
            rows = cursor.fetchall()
            if not rows:
                raise StaleJob(f"job {job.pk} changed since token {token} was read; nothing was changed")
            updated = self._rows_to_jobs(rows, alias)[0]
            if current == Status.PROCESSING and new != Status.PROCESSING:
                self._close_attempt(cursor, dialect, job, updated, released=new == Status.PENDING,
                                    note=_release_note)
        return updated

    def _modify_statement(self, dialect: Any, job: Job, current: Status, new: Status, step: str | None,
                          response: Any, error: str | None, scheduled_for: datetime | None,
                          run_in: float | None, reset_attempts: bool, alias: str,
                          run_ms: int | None = None) -> tuple[str, list[Any]]:
        """Modify's checked values, in database form, as the dialect's statement: (SQL, params before
        the job's id and token)."""
        if step is not None and (not isinstance(step, str) or len(step) > 100):
            raise InvalidArgument("step must be a string of at most 100 characters")
        if response is not _UNSET:
            _check_response(response)
        sets, params = dialect.modify_sets(
            current, new, default_max_attempts=get_settings().MAX_ATTEMPTS, step=step,
            set_response=response is not _UNSET,
            response=None if response is _UNSET else self._prep("response", response, alias),
            error=None if error is None else storable_error(str(error)),
            scheduled_for=self._prep("scheduled_for", scheduled_for, alias), run_in=run_in,
            reset_attempts=reset_attempts, run_ms=run_ms)
        return dialect.modify_sql(sets), params

    def _close_attempt(self, cursor: Any, dialect: Any, before: Job, after: Job, *, released: bool,
                       note: str = "") -> None:
        if released and note:
            dialect.execute(cursor, dialect.close_attempt_sql(),
                            [int(Status.PENDING), storable_error(note), None, before.step, before.pk,
                             before.attempt_num])
            return
        if released:
            dialect.execute(cursor, dialect.delete_attempt_sql(), [before.pk, before.attempt_num])
            return
        error = after.error if after.status_id in (Status.ERROR, Status.FAILED) else ""
        dialect.execute(cursor, dialect.close_attempt_sql(),
                       [after.status_id, error, after.duration_ms, after.step, before.pk, before.attempt_num])

    # ----- conveniences over modify ---------------------------------------------------------------
    def complete(self, job: Job, response: Any = None, *, duration: float | None = None,
                 using: str | None = None) -> Job:
        """Processing -> Completed with ``response`` stored (``duration``: as in :meth:`modify`)."""
        return self.modify(job, job.version, Status.COMPLETED, response=response, duration=duration,
                           using=using or job._state.db)

    def fail(self, job: Job, error: str, *, retry_in: float | None = None, duration: float | None = None,
             using: str | None = None) -> Job:
        """Processing -> Error, due again after ``retry_in`` seconds (default: the type's backoff).

        Becomes Failed instead when the job has no attempts left.
        """
        if retry_in is None:
            from .backoff import backoff_seconds

            info = jobtypes.get_type_by_id(job.job_type_id, using=using or job._state.db or self._alias(None))
            retry_in = backoff_seconds(job.attempt_num, info)
        return self.modify(job, job.version, Status.ERROR, error=error, run_in=max(0.0, float(retry_in)),
                           duration=duration, using=using or job._state.db)

    def advance_step(self, job: Job, step: str, *, response: Any = _UNSET, using: str | None = None) -> Job:
        """Record that ``job`` reached ``step`` (still Processing, same attempt)."""
        return self.modify(job, job.version, Status.PROCESSING, step=step, response=response,
                           using=using or job._state.db)

    def release(self, job: Job, *, using: str | None = None, note: str = "") -> Job:
        """Hand a claimed, unstarted job back to Pending without spending its attempt.

        The attempt's history row is dropped, or, with a ``note`` (e.g. "claim reply lost"), kept and
        closed as Pending with the note as its error, so the history shows what happened.
        """
        return self.modify(job, job.version, Status.PENDING, using=using or job._state.db,
                           _release_note=note)

    # ----- leases and housekeeping --------------------------------------------------------------
    def renew_leases(self, worker: str, job_ids: Sequence[int], lease_seconds: int, *,
                     using: str | None = None, incarnation: str | None = None) -> int:
        """Push the lease of jobs ``worker`` (its ``incarnation``, if given) still holds; return how many.

        No token bump: a lease renewal is not a state change. A job someone else reclaimed has another
        worker name or incarnation and is left alone (fencing: the late worker's finish is refused by
        the token).
        """
        if not job_ids:
            return 0
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        with connections[alias].cursor() as cursor:
            dialect.execute(cursor, dialect.renew_leases_sql(len(job_ids), incarnation is not None),
                            [int(lease_seconds), *job_ids, worker, *([incarnation] if incarnation is not None else [])])
            return cursor.rowcount

    def purge(self, ids: Sequence[int], *, statuses: Iterable[Status | int], cutoff: datetime,
              queues: Sequence[str] = (), using: str | None = None) -> int:
        """Delete those of jobs ``ids`` that :meth:`JobQuerySet.purgeable` still selects, with their
        history and subtype rows, in one transaction (one per chunk where the database takes fewer
        parameters than ``ids`` needs); return how many jobs were deleted.

        The ids were read earlier, without a lock: a job retried (back to Pending) or otherwise changed
        since is kept, rows and all. The jobs that still qualify are locked first, so none can change
        between the deletion of its rows and its own; the conditions are repeated in the job DELETE.
        Rows are deleted by job id and never read: no payload is loaded, whatever its size, and no
        delete signal is sent. Every model referencing ``Job`` must do so with ``on_delete=CASCADE``
        (history, subtype tables: their rows go too) or ``DO_NOTHING``; see :func:`purge_references`.
        """
        if timezone.is_naive(cutoff):
            raise InvalidArgument("cutoff must be timezone-aware")
        status_ids = _purge_statuses(statuses)
        ids = [int(i) for i in ids]
        queues = list(queues)
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        room = dialect.max_params - len(status_ids) - len(queues) - 2
        if room < 1:
            raise InvalidArgument(f"too many queues for one purge statement on this database: {len(queues)}")
        when = self._prep("finished_at", cutoff, alias)
        references = purge_references(self.model)
        deleted = 0
        for start in range(0, len(ids), room):
            deleted += self._purge_chunk(ids[start:start + room], status_ids, when, queues, references, alias)
        return deleted

    def _purge_chunk(self, ids: list[int], status_ids: list[int], when: Any, queues: list[str],
                     references: list[tuple[str, str]], alias: str) -> int:
        connection = connections[alias]
        dialect = get_dialect(connection)
        tail = [*status_ids, when, when, *queues]
        with connection.cursor() as cursor, dialect.exclusive_transaction(cursor):
            where = dialect.purge_where(len(ids), len(status_ids), len(queues))
            dialect.execute(cursor, dialect.purge_lock_sql(where), [*ids, *tail])
            locked = [row[0] for row in cursor.fetchall()]
            if not locked:
                return 0
            for table, column in references:
                dialect.execute(cursor, dialect.delete_by_job_sql(table, column, len(locked)), locked)
            where = dialect.purge_where(len(locked), len(status_ids), len(queues))
            dialect.execute(cursor, dialect.purge_delete_sql(where), [*locked, *tail])
            return cursor.rowcount

    def reap(self, *, using: str | None = None, limit: int = 500) -> int:
        """Move Processing jobs with an expired lease and no attempts left to Failed; return how many.

        These would never be claimed again (the claim requires attempts left), so without this they
        would sit in Processing forever. Each goes through :meth:`modify`, so history is closed.
        """
        alias = self._alias(using)
        dialect = get_dialect(connections[alias])
        with connections[alias].cursor() as cursor:
            dialect.execute(cursor, dialect.reap_candidates_sql(), [get_settings().MAX_ATTEMPTS])
            ids = [r[0] for r in cursor.fetchmany(limit)]
        done = 0
        for job_id in ids:
            try:
                job = self.get_for_update(job_id, using=alias)
                self.modify(job, job.version, Status.FAILED,
                            error=(job.error + "\n" if job.error else "")
                            + f"lease expired with no attempts left (last worker {job.worker!r})",
                            using=alias)
                done += 1
            except (StaleJob, IllegalTransition, JobNotFound):
                continue  # someone else moved it meanwhile
        return done


def purge_references(job_model: type[Job]) -> list[tuple[str, str]]:
    """(table, column) of every model that references a job and is deleted with it: the attempt
    history and the subtype tables (``on_delete=CASCADE``), in model order.

    :meth:`JobManager.purge` deletes these rows by job id, one level deep, as the database would have
    them gone; a reference it cannot honour that way (``PROTECT``, ``SET_NULL``, a cascaded model that
    is itself referenced) is refused up front with :class:`~.exceptions.SqlQueueError` rather than
    half done or failed by a foreign key at commit.
    """
    from .exceptions import SqlQueueError

    def references(model: Any) -> list[Any]:
        # Every reverse relation, hidden ones too (the subtypes' related_name is "+").
        return [f for f in model._meta.get_fields(include_hidden=True) if f.auto_created and not f.concrete
                and (f.one_to_many or f.one_to_one or f.many_to_many)]

    out = []
    for rel in references(job_model):
        related = rel.related_model
        if rel.on_delete is models.DO_NOTHING or related._meta.proxy:
            continue
        where = f"{related._meta.label}.{rel.field.name}"
        if rel.on_delete is not models.CASCADE or rel.many_to_many:
            raise SqlQueueError(f"purge_queue deletes jobs by id and cannot honour {where} "
                                f"(on_delete={getattr(rel.on_delete, '__name__', rel.on_delete)!s}): "
                                "references to jobs must use CASCADE or DO_NOTHING")
        if any(r.on_delete is not models.DO_NOTHING for r in references(related)):
            raise SqlQueueError(f"purge_queue deletes the rows of {related._meta.label} by job id, one level "
                                f"deep, but other models reference them: delete those first")
        out.append((related._meta.db_table, rel.field.column))
    return out
