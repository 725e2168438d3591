"""Batches: a group of jobs whose callbacks are enqueued once, when the batch is closed and every member
has finished (see docs/workflows.md; the dependencies are in workflows.py, which re-exports this API).

The callbacks are enqueued by the transaction that first sets the batch's ``finished_at`` (a
conditional UPDATE, ``finished_at IS NULL``), in the same transaction as their INSERT: exactly once
however many members finish at the same moment, on however many hosts. No counter is written when a
member finishes; counts are read from the members (index ``sqlqueue_job_batch``), not under READPAST.
A member is added under a lock on the batch row (an UPDATE conditional on it being open), so a close
waits for members being added and a batch never finishes without them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count
from django.db.models.functions import Now

from ..exceptions import InvalidArgument, SqlQueueError
from ..states import UNFINISHED, Status

if TYPE_CHECKING:
    from ..models import Batch, Job
    from ..queue import JobSpec

log = logging.getLogger("django_sqlqueue.workflows")


class BatchClosed(InvalidArgument):
    """The batch is closed (or gone): no member may be added to it."""


class _NotDone(SqlQueueError):
    """A member became unfinished between the look and the lock: roll the attempt back."""


def batch_counts(batch_id: int, alias: str | None = None, *, locked: bool = False) -> dict[Status, int]:
    """The batch's members by status (one index range on ``sqlqueue_job_batch``). ``locked``: a locked
    read, which waits for a member being changed right now (see :func:`finish_batch`)."""
    from ..models import Job

    if locked:
        from django.db import connections

        from ..conf import get_settings
        from ..dialects import get_dialect

        connection = connections[alias or get_settings().DATABASE]
        dialect = get_dialect(connection)
        with connection.cursor() as cursor:
            dialect.execute(cursor, dialect.batch_counts_sql(locked=True), [batch_id])
            return {Status(s): n for s, n in cursor.fetchall()}
    qs = Job.objects.db_manager(alias) if alias else Job.objects
    rows = qs.filter(batch_id=batch_id).order_by().values_list("status_id").annotate(n=Count("id"))
    return {Status(s): n for s, n in rows}


def finish_batch(batch_id: int, alias: str) -> list[int]:
    """If batch ``batch_id`` is closed, unfinished, and all its members have finished, enqueue its
    callbacks, once; return their ids ([] when it is not time, or another process did it)."""
    from ..models import Batch, Job

    batch = Batch.objects.using(alias).filter(pk=batch_id).first()
    if batch is None or batch.finished_at is not None or batch.closed_at is None:
        return []
    counts = batch_counts(batch_id, alias)
    if any(s in UNFINISHED for s in counts):
        return []
    try:
        with transaction.atomic(using=alias):
            # The guard: the first transaction to set finished_at enqueues; a racing one waits for the
            # row lock, then finds finished_at set and updates nothing.
            if not Batch.objects.using(alias).filter(pk=batch_id, finished_at__isnull=True).update(finished_at=Now()):
                return []
            # Again, in a new statement, under the batch's lock, and a locked read: under SQL Server's
            # READ_COMMITTED_SNAPSHOT a plain read would see the last committed version of a member an
            # operator is retrying right now (Completed, still), and fire the callbacks before it reruns.
            counts = batch_counts(batch_id, alias, locked=True)
            if any(s in UNFINISHED for s in counts):
                raise _NotDone
            succeeded = all(s == Status.COMPLETED for s in counts)
            ids = []
            for spec in (batch.on_success if succeeded else batch.on_failure, batch.on_finish):
                if spec:
                    payload = spec.get("payload")
                    if payload is None or isinstance(payload, dict):
                        payload = {"batch_id": batch_id, **(payload or {})}
                    ids.append(Job.objects.db_manager(alias).enqueue(
                        spec["job_type"], payload, queue=spec.get("queue", "default"),
                        priority=spec.get("priority", 0), using=alias).pk)
            Batch.objects.using(alias).filter(pk=batch_id).update(succeeded=succeeded, callback_ids=ids)
    except _NotDone:
        return []
    log.info("batch_finished batch=%s succeeded=%s callbacks=%s", batch_id, succeeded, ids)
    return ids


def _callback(value: Any, what: str) -> dict[str, Any] | None:
    """A callback as given (a job type name, or ``(job type, payload)``, or a dict) as stored."""
    from ..queue.values import encode_json

    if value is None:
        return None
    if isinstance(value, str):
        value = {"job_type": value}
    elif isinstance(value, tuple) and len(value) == 2:
        value = {"job_type": value[0], "payload": value[1]}
    if not isinstance(value, dict) or not isinstance(value.get("job_type"), str) or not value["job_type"]:
        raise InvalidArgument(f"{what} must be a job type name, a (job type, payload) pair or a dict with "
                              f"a 'job_type', got {value!r}")
    unknown = set(value) - {"job_type", "payload", "queue", "priority"}
    if unknown:
        raise InvalidArgument(f"{what}: unknown keys {', '.join(sorted(unknown))}")
    encode_json(value, what)
    return value


class BatchHandle:
    """What ``with batch(...) as b`` gives: add members, then close (at the end of the block).

    ``b.id`` (also ``b.pk``) is the batch's id: keep it to add members later (:func:`open_batch`), to
    find the batch in the admin, or to read ``b.counts()``.
    """

    def __init__(self, batch: Batch, alias: str) -> None:
        self.batch = batch
        self.alias = alias

    @property
    def id(self) -> int:
        """The batch's id (the ``Batch`` row's primary key)."""
        return self.batch.pk

    @property
    def pk(self) -> int:
        return self.batch.pk

    def __repr__(self) -> str:
        state = "closed" if self.batch.closed_at is not None else "open"
        label = f" {self.batch.description!r}" if self.batch.description else ""
        return f"<BatchHandle id={self.batch.pk}{label} {state} on {self.alias!r}>"

    def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> Job:
        """:meth:`JobManager.enqueue` of a member of this batch."""
        from ..models import Job

        return Job.objects.enqueue(job_type, payload, batch=self.batch.pk, using=self.alias, **options)

    def enqueue_many(self, specs: Iterable[JobSpec]) -> list[Job]:
        """:meth:`JobManager.enqueue_many` of members of this batch."""
        from ..models import Job

        specs = list(specs)
        for spec in specs:
            spec.batch = self.batch.pk
        return Job.objects.enqueue_many(specs, using=self.alias)

    def close(self) -> None:
        """No more members; the callbacks fire once all have finished (at once if they have)."""
        close_batch(self.batch.pk, using=self.alias)

    def counts(self) -> dict[Status, int]:
        return batch_counts(self.batch.pk, self.alias)


def create_batch(*, on_success: Any = None, on_failure: Any = None, on_finish: Any = None, description: str = "",
                 using: str | None = None) -> Batch:
    """A new, open batch. Callbacks: a job type name, a ``(job type, payload)`` pair, or a dict with
    ``job_type`` and optionally ``payload``, ``queue``, ``priority``. A dict payload gets ``batch_id``."""
    from .. import bounds, jobtypes
    from ..conf import get_settings
    from ..handlers import registry
    from ..models import Batch

    if not isinstance(description, str) or len(description) > 200:
        raise InvalidArgument("description must be a string of at most 200 characters")
    alias = using or get_settings().DATABASE or "default"
    callbacks = {"on_success": _callback(on_success, "on_success"), "on_failure": _callback(on_failure, "on_failure"),
                 "on_finish": _callback(on_finish, "on_finish")}
    for spec in filter(None, callbacks.values()):
        # Now, not when the batch finishes: an unknown type would fail then, long after the caller left.
        bounds.check_type_name(spec["job_type"])
        jobtypes.get_type(spec["job_type"], using=alias, create=registry.is_registered(spec["job_type"]))
    return Batch.objects.using(alias).create(description=description, **callbacks)


def close_batch(batch_id: int, *, using: str | None = None) -> None:
    """Close a batch: no more members; its callbacks are enqueued when (or if already) all have finished."""
    from ..conf import get_settings
    from ..models import Batch

    alias = using or get_settings().DATABASE or "default"
    Batch.objects.using(alias).filter(pk=batch_id, closed_at__isnull=True).update(closed_at=Now())
    transaction.on_commit(lambda: finish_batch(batch_id, alias), using=alias, robust=True)


@contextmanager
def batch(*, on_success: Any = None, on_failure: Any = None, on_finish: Any = None, description: str = "",
          close: bool = True, using: str | None = None) -> Iterator[BatchHandle]:
    """``with batch(on_success=...) as b: b.enqueue(...)``: one transaction for the batch and its
    members (an exception rolls back all of it); closed at the end unless ``close=False`` (add more
    later with :func:`open_batch`, then ``close()``)."""
    from ..conf import get_settings

    alias = using or get_settings().DATABASE or "default"
    with transaction.atomic(using=alias):
        handle = BatchHandle(create_batch(on_success=on_success, on_failure=on_failure, on_finish=on_finish,
                                          description=description, using=alias), alias)
        yield handle
        if close:
            handle.close()


def open_batch(batch_id: int, *, using: str | None = None) -> BatchHandle:
    """A handle on an existing batch, to add members (refused at enqueue once it is closed) or close it."""
    from ..conf import get_settings
    from ..models import Batch

    alias = using or get_settings().DATABASE or "default"
    found = Batch.objects.using(alias).filter(pk=batch_id).first()
    if found is None:
        raise BatchClosed(f"no batch with id {batch_id}")
    return BatchHandle(found, alias)
