"""Queue tables: status vocabulary, job types, the base job table, attempt history, workers, subtypes.

Jobs are written through :class:`~django_sqlqueue.queue.JobManager` (enqueue, claim, modify), which
keeps the lifecycle columns consistent; the ORM is used freely for reads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from . import bounds
from .fields import JSONValueField
from .queue import JobManager
from .states import CLAIMABLE, DEDUPE_SCOPE, Status


class QueueStatus(models.Model):
    """The status vocabulary (reference table seeded by a data migration from :class:`Status`)."""

    id = models.PositiveSmallIntegerField(primary_key=True)
    name = models.CharField(max_length=32, unique=True)

    class Meta:
        verbose_name = _("queue status")
        verbose_name_plural = _("queue statuses")
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name


def _at_least(field: str, minimum: float) -> Q:
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__gte": minimum})


def _between(field: str, minimum: float, maximum: float) -> Q:
    return Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__gte": minimum, f"{field}__lte": maximum})


class JobType(models.Model):
    """One row per job type, with the settings an operator may change while workers run.

    Blank numeric settings fall back to the ``SQLQUEUE`` setting of the same meaning. Each setting has
    bounds (:mod:`.limits`): checked by the model's validators (the admin form), by check constraints in
    the database (whatever writes the row), and again when a row is read (:meth:`from_db`).
    """

    name = models.CharField(max_length=200, unique=True, validators=[bounds.validate_type_name])
    description = models.CharField(max_length=500, blank=True, default="")
    max_attempts = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(bounds.MIN_ATTEMPTS)],
        help_text=_("At least 1. Blank: SQLQUEUE['MAX_ATTEMPTS'] (3 unless set).")
    )
    backoff_base_seconds = models.FloatField(
        null=True, blank=True, validators=[bounds.FiniteRange(0, bounds.MAX_BACKOFF_SECONDS)],
        help_text=_("0 to 31536000 (a year). Blank: SQLQUEUE['BACKOFF_BASE_SECONDS'].")
    )
    backoff_max_seconds = models.FloatField(
        null=True, blank=True, validators=[bounds.FiniteRange(0, bounds.MAX_BACKOFF_SECONDS)],
        help_text=_("0 to 31536000 (a year). Blank: SQLQUEUE['BACKOFF_MAX_SECONDS'].")
    )
    timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(bounds.MIN_TIMEOUT_SECONDS)],
        help_text=_("At least 1. Blank: SQLQUEUE['TIMEOUT_SECONDS'].")
    )
    lease_seconds = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(bounds.MIN_LEASE_SECONDS)],
        help_text=_("At least 1; renewed every third of it while the job runs. Blank: SQLQUEUE['LEASE_SECONDS'].")
    )
    paused = models.BooleanField(default=False, help_text=_("Workers do not claim jobs of a paused type."))
    #: Global limits (docs/limits.md), enforced by the claim through :class:`LimitPermit` rows: at most
    #: this many jobs Processing at once, fleet-wide; or at most N starts per period ("10/s"). Per key
    #: when jobs carry a ``concurrency_key`` (the handler's declaration or the enqueue's).
    concurrency_limit = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(bounds.MIN_CONCURRENCY_LIMIT),
                                           MaxValueValidator(bounds.MAX_CONCURRENCY_LIMIT)],
        help_text=_("At most this many jobs of the type (per concurrency key) run at once across all workers. "
                    "Blank: no limit."))
    rate_limit = models.CharField(
        max_length=32, blank=True, default="", validators=[bounds.validate_rate_limit],
        help_text=_('At most N job starts per period across all workers (per concurrency key), e.g. "10/s", '
                    '"100/m", "500/h". Blank: no limit.'))
    #: The handler's options as the code last wrote them to this row. A setting still equal to its value
    #: here follows the code when the code changes; one that differs was changed by an operator and is
    #: kept (see handlers.sync_job_types).
    code_options = models.JSONField(default=dict, blank=True, editable=False)
    #: Created (or first used) by the Tasks backend for a real ``@task``: a worker may import the name.
    #: A dotted name not flagged so is imported only from an installed app (task_runner.may_import).
    is_task = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("job type")
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=_at_least("max_attempts", bounds.MIN_ATTEMPTS),
                                   name="sqlqueue_jobtype_max_attempts"),
            models.CheckConstraint(condition=_at_least("timeout_seconds", bounds.MIN_TIMEOUT_SECONDS),
                                   name="sqlqueue_jobtype_timeout"),
            models.CheckConstraint(condition=_at_least("lease_seconds", bounds.MIN_LEASE_SECONDS),
                                   name="sqlqueue_jobtype_lease"),
            models.CheckConstraint(condition=_between("backoff_base_seconds", 0, bounds.MAX_BACKOFF_SECONDS),
                                   name="sqlqueue_jobtype_backoff_base"),
            models.CheckConstraint(condition=_between("backoff_max_seconds", 0, bounds.MAX_BACKOFF_SECONDS),
                                   name="sqlqueue_jobtype_backoff_max"),
            models.CheckConstraint(condition=_between("concurrency_limit", bounds.MIN_CONCURRENCY_LIMIT,
                                                      bounds.MAX_CONCURRENCY_LIMIT),
                                   name="sqlqueue_jobtype_concurrency_limit"),
        ]

    def clean(self) -> None:
        """A type has a concurrency limit or a rate limit, not both (see docs/limits.md)."""
        super().clean()
        if self.concurrency_limit is not None and self.rate_limit:
            raise ValidationError(_("Give a concurrency limit or a rate limit, not both: a job would need two "
                                    "permits, which one claim cannot take yet."), code="two_limits")

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_db(cls, db: str | None, field_names: Any, values: Any, **kwargs: Any) -> JobType:
        """A row as read, its settings brought within bounds (with a warning) if they are not.

        The check constraints keep new rows in bounds; this covers a row the database holds from before
        them (or with its constraints dropped), so no worker ever runs with a lease of 0 s.
        """
        row = super().from_db(db, field_names, values, **kwargs)  # kwargs: fetch_mode (Django 6.1)
        for field in bounds.TYPE_SETTING_BOUNDS:
            value = row.__dict__.get(field)
            fixed = bounds.clamp_type_setting(row.__dict__.get("name", "?"), field, value)
            if fixed is not value:
                row.__dict__[field] = fixed
        return row


class Job(models.Model):
    """The base queue table: one row per job of any type, carrying the lifecycle columns.

    ``version`` is the optimistic-concurrency token: every write bumps it and every write by a worker
    or an operator must present the value it read. An integer compares exactly on every vendor, which a
    timestamp does not (SQL Server keeps 100 ns ticks, Python microseconds).
    """

    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100, default="default")
    job_type = models.ForeignKey(JobType, on_delete=models.PROTECT, related_name="jobs", db_column="type_id")
    # No single-column index on status: it would be rewritten on every status change and the
    # composite and partial indexes below serve every query that filters on it.
    status = models.ForeignKey(
        QueueStatus, on_delete=models.PROTECT, related_name="+", db_column="status_id", default=Status.PENDING,
        db_index=False,
    )
    step = models.CharField(max_length=100, blank=True, default="")
    priority = models.SmallIntegerField(default=0, help_text=_("Higher runs first."))
    attempt_num = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text=_("Blank: the job type's setting.")
    )
    # Any JSON value, scalars too, on every vendor (see fields.JSONValueField: SQL Server's ISJSON check).
    payload = JSONValueField(default=dict, blank=True)
    response = JSONValueField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    enqueued_at = models.DateTimeField()
    scheduled_for = models.DateTimeField(help_text=_("Earliest time a worker may run it."))
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField()
    worker = models.CharField(max_length=200, blank=True, default="")
    #: The incarnation (``Worker.incarnation``) of the worker process that claimed it: two processes
    #: under one worker name (a paused one and its replacement) never take each other's jobs.
    incarnation = models.CharField(max_length=32, blank=True, default="", db_default="", editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    dedupe_key = models.CharField(max_length=200, null=True, blank=True)
    #: The enqueuing trace's context (OpenTelemetry's propagator carrier as JSON, see tracing.py), so
    #: that the job's run span is a child of the request that enqueued it. NULL when not tracing.
    #: Nullable so that adding it is a plain ADD COLUMN on every vendor (no SQLite table rebuild).
    trace_context = models.CharField(max_length=2000, null=True, blank=True, editable=False)
    #: Workflow markers (workflows.py), read by the finish path from the row it already returns: only a
    #: job with one of them set costs a look for dependents or a batch check when it finishes. NULL on
    #: every job that uses neither (nullable: a plain ADD COLUMN, no SQLite table rebuild).
    #: ``has_dependents``: some job was enqueued ``after`` this one.
    has_dependents = models.BooleanField(null=True, blank=True, editable=False)
    #: The batch this job is a member of. Indexed with the status (partial index: members only) so a
    #: batch's counts are one index range; no counter is written when a member finishes.
    batch = models.ForeignKey("Batch", on_delete=models.SET_NULL, null=True, blank=True, related_name="members",
                              db_index=False, editable=False)
    #: The key whose limit the job counts against (docs/limits.md): its handler's ``concurrency_key`` of
    #: the payload, or the enqueue's ``concurrency_key=``; "" for none (the type's one shared scope).
    concurrency_key = models.CharField(max_length=200, blank=True, default="", db_default="", editable=False)
    #: Its type has a limit: it is claimed only with a permit, and stays out of the claim index, so a deep
    #: backlog of limited jobs costs the ordinary claim nothing (docs/limits.md). Set at enqueue, and
    #: on the unfinished jobs of a type whose limit is set or removed (permits.sync_type).
    limited = models.BooleanField(default=False, db_default=False, editable=False)

    objects: ClassVar[JobManager] = JobManager()
    #: Not a column: True on the job an enqueue returned instead of inserting one (its dedupe key was
    #: held by this unfinished job), so a caller can say "nothing enqueued" without asking again.
    deduplicated: bool = False

    class Meta:
        verbose_name = _("job")
        ordering = ["-id"]
        indexes = [
            # The claim: a seek over claimable rows in the order the claim takes them. Plain columns
            # only (SQL Server skips expression indexes) and the same literal predicate the claim uses.
            models.Index(
                fields=["-priority", "scheduled_for", "id"],
                name="sqlqueue_job_claim",
                condition=Q(status_id__in=sorted(CLAIMABLE), limited=False),
            ),
            # Reclaim: the few Processing rows, by lease expiry (dead workers) and worker (restarts).
            models.Index(
                fields=["lease_expires_at", "worker"],
                name="sqlqueue_job_processing",
                condition=Q(status_id=Status.PROCESSING),
            ),
            # Operator screens and retention.
            models.Index(fields=["status", "job_type", "queue"], name="sqlqueue_job_status_type"),
            models.Index(fields=["finished_at", "status"], name="sqlqueue_job_finished"),
            # Admin filters and search: every filter is backed by an index.
            models.Index(fields=["queue", "id"], name="sqlqueue_job_queue"),
            models.Index(fields=["step", "id"], name="sqlqueue_job_step"),
            models.Index(fields=["worker", "id"], name="sqlqueue_job_worker"),
            models.Index(fields=["id"], name="sqlqueue_job_has_error", condition=Q(error__gt="")),
            models.Index(fields=["dedupe_key"], name="sqlqueue_job_dedupe_key", condition=Q(dedupe_key__isnull=False)),
            models.Index(fields=["batch", "status"], name="sqlqueue_job_batch", condition=Q(batch__isnull=False)),
            models.Index(fields=["enqueued_at"], name="sqlqueue_job_enqueued"),
            # The limited claim branch: the jobs of one limit scope (type, key) in claim order, claimable
            # or Processing (an expired lease is taken over through a permit too).
            models.Index(
                fields=["job_type", "concurrency_key", "-priority", "scheduled_for", "id"],
                name="sqlqueue_job_limited",
                condition=Q(status_id__in=sorted(CLAIMABLE | {Status.PROCESSING}), limited=True),
            ),
        ]
        constraints = [
            # Dedupe: one unfinished job per key; enqueue turns a conflict into "return the existing job".
            models.UniqueConstraint(
                fields=["dedupe_key"],
                name="sqlqueue_job_dedupe",
                condition=Q(status_id__in=sorted(DEDUPE_SCOPE)) & Q(dedupe_key__isnull=False),
            ),
        ]
        permissions = [
            ("retry_job", "Can retry jobs"),
            ("cancel_job", "Can cancel or terminate jobs"),
            ("reschedule_job", "Can reschedule jobs and reset attempts"),
            ("pause_job", "Can pause and resume jobs"),
            ("view_sensitive_job", "Can view sensitive job data"),
            ("enqueue_job", "Can enqueue jobs from the admin"),
        ]

    def __str__(self) -> str:
        """"SendEmail #2941" when the type is loaded (the admin selects it), else "Job #2941".

        Never a query: this names rows in lists, titles, breadcrumbs and the admin history.
        """
        if Job.job_type.is_cached(self):
            return f"{self.job_type.name} #{self.pk}"
        return f"Job #{self.pk}"

    def __repr__(self) -> str:
        """In a shell: id, type id and status, without a query."""
        try:
            status = Status(self.status_id).label
        except ValueError:
            status = f"status {self.status_id}"
        return f"<Job: job {self.pk} (type {self.job_type_id}, {status})>"

    @property
    def state(self) -> Status:
        return Status(self.status_id)

    def refresh(self) -> Job:
        """Re-read this job from the database (handy after a manager call)."""
        self.refresh_from_db()
        return self

    # Convenience wrappers over JobManager.modify; each needs the token this object carries.
    def complete(self, response: Any = None) -> Job:
        return type(self).objects.complete(self, response=response)

    def fail(self, error: str, *, retry_in: float | None = None) -> Job:
        return type(self).objects.fail(self, error, retry_in=retry_in)

    def advance_step(self, step: str, response: Any = None) -> Job:
        return type(self).objects.advance_step(self, step, response=response)


class JobAttempt(models.Model):
    """History: one row per claim. A row with no ``finished_at`` whose job lease expired is a lost attempt."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    attempt_num = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    claimed_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.ForeignKey(
        QueueStatus, on_delete=models.PROTECT, null=True, blank=True, related_name="+", db_column="outcome_id"
    )
    error = models.TextField(blank=True, default="")
    duration_ms = models.BigIntegerField(null=True, blank=True)
    #: The job's step when the attempt was claimed (where a multi-step job resumes), then, once an
    #: operator or the worker ends the attempt other than by a batched success, the step it ended at:
    #: for an error, the step that failed. Empty for jobs without steps; NULL for attempts recorded
    #: before migration 0010 (nullable so that adding it is a plain ADD COLUMN on every vendor, SQLite too).
    step = models.CharField(max_length=100, null=True, blank=True)

    class Meta:
        verbose_name = _("job attempt")
        ordering = ["job_id", "attempt_num"]
        indexes = [models.Index(fields=["job", "attempt_num"], name="sqlqueue_attempt_job")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt_num}"


class CancelRequest(models.Model):
    """An operator's (or code's) request to stop one running attempt of a job: who, when, why.

    Written by :meth:`JobManager.cancel <django_sqlqueue.queue.cancel.CancelMixin.cancel>` for a
    Processing job, read by the slot running that attempt (its heartbeat thread polls while a job runs
    longer than ``CANCEL_CHECK_SECONDS``). A table of its own, not columns of the job: the claim, the
    lease renewal and the finish never read or write it, so jobs nobody cancels do not pay for it. A
    request is made for the attempt then running and also covers later attempts until one finishes (its
    worker died and the job was taken over, or the handler failed and the job is retried: the operator
    asked for the job to stop); an operator's retry of a finished job is not cancelled by it. A request
    whose attempt ended otherwise (Completed first) stays as the record of a cancel that came too late.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="cancel_requests", db_index=False)
    attempt_num = models.PositiveIntegerField()
    requested_at = models.DateTimeField()
    requested_by = models.CharField(max_length=200, blank=True, default="")
    reason = models.CharField(max_length=1000, blank=True, default="")

    class Meta:
        verbose_name = _("cancel request")
        ordering = ["job_id", "attempt_num"]
        constraints = [models.UniqueConstraint(fields=["job", "attempt_num"], name="sqlqueue_cancel_attempt")]

    def __str__(self) -> str:
        return f"cancel job {self.job_id} attempt {self.attempt_num}"

    def describe(self) -> str:
        """The line the attempt's history row and the job's error carry: who asked, and why."""
        who = self.requested_by or "unknown"
        return f"cancelled by {who}" + (f": {self.reason}" if self.reason else "")


class Worker(models.Model):
    """A running (or stopped) worker slot, kept alive by its heartbeat."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, blank=True, default="")
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    jobs_done = models.PositiveBigIntegerField(default=0)
    #: A random id written at each registration. Heartbeats and own-name takeovers are conditional on
    #: it, so a process whose registration was taken over (it was paused past the dead-after time and
    #: a same-name worker started) learns it at its next beat and stops.
    incarnation = models.CharField(max_length=32, blank=True, default="", db_default="", editable=False)
    #: The queues and job types it serves (empty: all), as given at start: the admin can tell which due
    #: work no live worker will ever take.
    queues = models.JSONField(default=list, blank=True, editable=False)
    types = models.JSONField(default=list, blank=True, editable=False)
    #: Which process it is (support.process_key: boot, PID namespace, pid, start time): a worker of the
    #: same host sees at once that it is gone, instead of waiting for its heartbeat to go stale.
    process = models.CharField(max_length=120, blank=True, default="", db_default="", editable=False)
    #: Session liveness (PostgreSQL, worker/beats.py): until when the fleet's look may stamp this row in
    #: place of a heartbeat. Its supervisor's real beat sets it while none of its slots holds a job (and
    #: clears it when one does), a few minutes ahead: a frozen process that kept its session is judged
    #: gone at most that much later, and at once when it held a job.
    stamp_until = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("worker")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class JobData(models.Model):
    """Abstract base for typed subtype tables (base/subtype pattern).

    Exclusive subtype: subclass and set ``job_type_name``; the primary key is the one-to-one link to the
    base job, so a job has at most one row, and :meth:`JobManager.enqueue` checks the type matches.
    Inclusive subtype (e.g. delivery channels): subclass :class:`InclusiveJobData`, which keys the row on
    the job too, so each channel table holds at most one row per job but a job may have rows in several.
    """

    #: Exclusive subtypes name the job type they belong to; ``None`` means inclusive (any type).
    job_type_name: ClassVar[str | None] = None
    #: Columns the admin masks for users without "Can view sensitive job data" (see :mod:`.sensitive`).
    sensitive_fields: ClassVar[tuple[str, ...]] = ()

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")

    class Meta:
        abstract = True


class InclusiveJobData(JobData):
    """Abstract base for inclusive subtypes: a job may have rows in several such tables."""

    job_type_name: ClassVar[str | None] = None
    response = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        abstract = True


def default_schedule_timezone() -> str:
    """A new schedule's time zone: the project's ``TIME_ZONE`` (stored on the row, so changing the
    setting later does not move existing schedules)."""
    from django.conf import settings

    return getattr(settings, "TIME_ZONE", None) or "UTC"


class Schedule(models.Model):
    """A recurring job: a cron expression (in a time zone) or a fixed interval, run once per tick.

    Rows come from ``SQLQUEUE["SCHEDULES"]`` (``declared``) or from the admin; both are looked at
    the same way by every worker (see :mod:`django_sqlqueue.schedules`). ``next_run_at`` is the next
    tick, in UTC, always computed from the database clock.
    """

    class Misfire(models.TextChoices):
        RUN_ONCE = "run_once", _("Run once now, then move on")
        SKIP = "skip", _("Skip missed ticks (run only if not later than the grace)")
        RUN_ALL = "run_all", _("Run every missed tick (up to the limit)")

    name = models.CharField(max_length=200, unique=True)
    job_type = models.CharField(max_length=200, blank=True, default="",
                                help_text=_("The job type it enqueues (or give a task instead)."))
    task = models.CharField(max_length=200, blank=True, default="",
                            help_text=_("The import path of a Django @task it enqueues through the TASKS backend."))
    payload = JSONValueField(default=dict, blank=True, help_text=_(
        "The job's payload; for a task, {\"args\": [...], \"kwargs\": {...}}."))
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text=_("Higher runs first."))
    cron = models.CharField(max_length=200, blank=True, default="",
                            help_text=_("5-field cron expression, read in the time zone below."))
    timezone = models.CharField(max_length=64, default=default_schedule_timezone)
    every_seconds = models.PositiveIntegerField(null=True, blank=True,
                                                help_text=_("Or a fixed interval in seconds (at least 1)."))
    enabled = models.BooleanField(default=True)
    misfire = models.CharField(max_length=16, choices=Misfire.choices, default=Misfire.RUN_ONCE)
    misfire_limit = models.PositiveSmallIntegerField(
        default=10, help_text=_("Run every missed tick: at most this many (the latest ones)."))
    misfire_grace_seconds = models.PositiveIntegerField(
        default=60, help_text=_("Skip missed ticks: a tick found later than this is skipped."))
    expires_after_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Cancel a tick's job still waiting this long after its tick."))
    next_run_at = models.DateTimeField(null=True, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True, help_text=_("The last tick that was enqueued."))
    # No constraint: purging jobs must not touch schedules (a purged last job shows as gone).
    last_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                                 db_index=False, related_name="+")
    last_error = models.TextField(blank=True, default="")
    declared = models.BooleanField(default=False, editable=False,
                                   help_text=_("Declared in SQLQUEUE['SCHEDULES']: a deploy rewrites its definition."))
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = _("schedule")
        ordering = ["name"]
        indexes = [
            # The look: "any enabled schedule due?" is one seek at the start of this index.
            models.Index(fields=["next_run_at"], name="sqlqueue_schedule_due", condition=Q(enabled=True)),
        ]
        permissions = [("run_schedule", "Can run schedules now")]

    def __str__(self) -> str:
        return self.name


class ScheduleRun(models.Model):
    """One tick of a schedule that was enqueued: the unique (schedule, tick) key is the exactly-once
    backstop, and ``expires_at`` marks a job still to cancel if it has not started by then."""

    # Indexed by the unique (schedule, tick_at) key, which leads with it.
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="runs", db_index=False)
    tick_at = models.DateTimeField()
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                            db_index=False, related_name="+")
    enqueued_at = models.DateTimeField()
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("schedule run")
        ordering = ["schedule_id", "-tick_at"]
        constraints = [models.UniqueConstraint(fields=["schedule", "tick_at"], name="sqlqueue_schedule_tick")]
        indexes = [
            models.Index(fields=["expires_at"], name="sqlqueue_schedule_run_expiry",
                         condition=Q(expires_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id}@{self.tick_at:%Y-%m-%d %H:%M:%S}"


class ScheduleDeploy(models.Model):
    """One version of ``SQLQUEUE["SCHEDULES"]`` (its fingerprint) that a sync has seen, and when.

    A rolling deploy runs old and new settings side by side; an old worker that restarts then would sync
    the old settings over the new ones. A sync applies its settings only when no other version that is
    newer (``first_seen_at``) is still live (``seen_at``, refreshed by each worker's periodic re-sync);
    see :func:`django_sqlqueue.schedules.sync_schedules`.
    """

    fingerprint = models.CharField(max_length=64, unique=True)
    first_seen_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    class Meta:
        verbose_name = _("schedule settings version")

    def __str__(self) -> str:
        return self.fingerprint[:12]


class JobDependency(models.Model):
    """``job`` waits (status Waiting) until ``depends_on`` has finished; see docs/workflows.md.

    ``on_failure`` says what happens to ``job`` when ``depends_on`` ends other than Completed: ``cancel``
    (the default) cancels it, ``run`` runs it anyway. Rows are written once, at enqueue, and deleted with
    either job (CASCADE, so :meth:`JobManager.purge` removes them too).
    """

    CANCEL = "cancel"
    RUN = "run"
    POLICIES = ((CANCEL, _("cancel the dependent")), (RUN, _("run the dependent anyway")))

    # Indexes named here rather than Django's generated FK index names: those are longer than the 63
    # characters Babelfish (on PostgreSQL) keeps, so a reverse migration over TDS could not find them.
    # ``job`` lookups use the unique constraint, which leads with it.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependencies", db_index=False)
    depends_on = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependents", db_index=False)
    on_failure = models.CharField(max_length=10, choices=POLICIES, default=CANCEL)

    class Meta:
        verbose_name = _("job dependency")
        verbose_name_plural = _("job dependencies")
        constraints = [models.UniqueConstraint(fields=["job", "depends_on"], name="sqlqueue_dependency_unique")]
        indexes = [models.Index(fields=["depends_on"], name="sqlqueue_dependency_on")]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.depends_on_id} ({self.on_failure})"


class Batch(models.Model):
    """A group of jobs with callbacks enqueued once, when the batch is closed and every member has finished.

    Callbacks are job specs (``{"job_type": ..., "payload": ..., "queue": ...}``): ``on_success`` when every
    member Completed, ``on_failure`` when at least one did not, ``on_finish`` in both cases. Counts are
    computed from the members (an index range on ``sqlqueue_job_batch``), never kept in this row: a
    member's completion writes nothing here. ``finished_at`` is set, with ``callback_ids``, by the one
    transaction that enqueues the callbacks (a conditional UPDATE: exactly once).
    """

    description = models.CharField(max_length=200, blank=True, default="")
    on_success = models.JSONField(null=True, blank=True)
    on_failure = models.JSONField(null=True, blank=True)
    on_finish = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    #: No member may be added once closed; the callbacks wait for it.
    closed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    #: Whether every member had Completed when the batch finished (None: not finished).
    succeeded = models.BooleanField(null=True, blank=True)
    #: The ids of the callback jobs enqueued when it finished.
    callback_ids = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name = _("batch")
        verbose_name_plural = _("batches")
        ordering = ["-id"]
        indexes = [models.Index(fields=["closed_at"], name="sqlqueue_batch_unfinished",
                                condition=Q(finished_at__isnull=True))]

    def __str__(self) -> str:
        return f"Batch #{self.pk}" + (f" ({self.description})" if self.description else "")


class LimitPermit(models.Model):
    """One slot of a limit: a semaphore row the claim takes together with a job of its scope.

    A scope is a limited job type and a ``concurrency_key`` ("" for the type's shared scope); a limit
    of N has N rows (slots 0..N-1). A permit is free when ``held_until`` is NULL or past: a test of the
    row's own columns, so a claimer that waited for another's lock re-checks exactly that. Concurrency
    permits are held until the job's lease expires (renewed by the heartbeat, cleared when the job
    leaves Processing), so a dead worker's permit frees itself; rate permits (``hold_seconds`` set) are
    held one period from the start and never released early. See docs/limits.md.
    """

    class Kind(models.IntegerChoices):
        CONCURRENCY = 1, _("concurrency")
        RATE = 2, _("rate")

    # No database constraint: the rows are bookkeeping that permits.sync_type keeps in line with the
    # type (and Django's CASCADE removes with it); an UPDATE of a constrained row fails on Babelfish
    # (its foreign key check resolves the parent table in the wrong schema), and every limited claim
    # updates one.
    job_type = models.ForeignKey(JobType, on_delete=models.CASCADE, related_name="+", db_index=False,
                                 db_constraint=False)
    key = models.CharField(max_length=200, blank=True, default="")
    kind = models.PositiveSmallIntegerField(choices=Kind.choices)
    slot = models.PositiveSmallIntegerField()
    #: The rate limit's period in seconds (None: a concurrency permit, held for the job's lease).
    hold_seconds = models.FloatField(null=True, blank=True)
    #: The job that took it last (a concurrency permit: the job holding it while ``held_until`` is set).
    job_id = models.BigIntegerField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("limit permit")
        ordering = ["job_type_id", "key", "kind", "slot"]
        constraints = [models.UniqueConstraint(fields=["job_type", "key", "kind", "slot"],
                                               name="sqlqueue_permit_slot")]
        indexes = [models.Index(fields=["job_id"], name="sqlqueue_permit_job", condition=Q(job_id__isnull=False))]

    def __str__(self) -> str:
        return f"{self.job_type_id}/{self.key or '-'}/{self.get_kind_display()}#{self.slot}"


class ThroughputHour(models.Model):
    """Jobs enqueued, finished and failed per job type per hour: the throughput page's history beyond
    the job table, which retention empties (ops/rollup.py).

    The fleet's maintenance holder adds each minute's counts once it is a few minutes old, read from
    the job table's enqueue-time and finish-time indexes, and moves :class:`ThroughputCursor` past it in
    the same transaction; retention never deletes a job finished after the cursor: the counts survive
    the jobs. Rows older than :data:`~django_sqlqueue.ops.rollup.KEEP_DAYS` are deleted. At most 24 rows
    a day per job type: the 30-day view reads them through the unique index, which leads with the hour.
    """

    hour = models.DateTimeField()
    # No database constraint, as for permits: counts are bookkeeping (Django's CASCADE removes them with
    # their type), and the maintenance pass that writes them should not lock job type rows.
    job_type = models.ForeignKey(JobType, on_delete=models.CASCADE, related_name="+", db_index=False,
                                 db_constraint=False)
    enqueued = models.PositiveIntegerField(default=0)
    #: Completed or PartiallyCompleted, by finish time (what the throughput page calls finished).
    finished = models.PositiveIntegerField(default=0)
    #: Failed or Error, by finish time.
    failed = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = _("throughput hour")
        ordering = ["hour", "job_type_id"]
        constraints = [models.UniqueConstraint(fields=["hour", "job_type"], name="sqlqueue_rollup_hour_type")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00} #{self.job_type_id}: {self.enqueued}/{self.finished}/{self.failed}"


class ThroughputCursor(models.Model):
    """Where the throughput rollup has counted up to (one row, ``name="throughput"``): the jobs enqueued
    or finished before ``counted_until`` are in :class:`ThroughputHour`, those after it not yet. Moved
    with a conditional UPDATE ("still where I read it") in the transaction that adds the counts, so two
    maintenance holders at once (one paused past its lease) never count a minute twice."""

    name = models.CharField(max_length=50, primary_key=True)
    counted_until = models.DateTimeField()

    class Meta:
        verbose_name = _("throughput cursor")

    def __str__(self) -> str:
        return f"{self.name}: counted until {self.counted_until:%Y-%m-%d %H:%M:%S}"


class MaintenanceLease(models.Model):
    """Who runs the fleet's maintenance now: one row per kind of work (``"maintenance"``), held by one
    worker (its supervisor) until ``expires_at``, renewed while it lives (worker/maintenance.py).

    Taken with one conditional UPDATE by primary key ("expired, or mine"), so a dead holder's lease
    simply runs out and the next worker to look takes it: no leader process to deploy. The lease saves
    the database work of every worker repeating the same passes; it is not what keeps them correct
    (each pass is safe to run twice, as it was when every worker ran it).
    """

    name = models.CharField(max_length=50, primary_key=True)
    holder = models.CharField(max_length=200, blank=True, default="")
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = _("maintenance lease")

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or '-'} until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class QueuePause(models.Model):
    """A paused queue: while its row exists, no worker claims that queue's jobs (fleet-wide, at once).

    The claim's shared filter holds ``NOT EXISTS`` on this table (dialects/base.py ``common_filters``),
    one primary-key seek per candidate row, as it does for a paused job type; jobs already running
    finish. Written by ``Job.objects.pause_queue`` / ``resume_queue``, the ``queue_pause`` and
    ``queue_resume`` commands and the admin (adding a row pauses, deleting it resumes).
    """

    queue = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField()
    paused_by = models.CharField(max_length=200, blank=True, default="")
    reason = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        verbose_name = _("paused queue")
        ordering = ["queue"]

    def __str__(self) -> str:
        return self.queue
