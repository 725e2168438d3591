"""``manage.py run_queue_worker``: validate options, set up logging, run the supervisor. Nothing more.

See docs/worker.md for what each option does and what happens on signals, crashes and outages.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_sqlqueue import jobtypes
from django_sqlqueue.conf import get_settings
from django_sqlqueue.exceptions import InvalidArgument, UnknownJobType
from django_sqlqueue.handlers import registry
from django_sqlqueue.worker.dbthread import bounded_connect
from django_sqlqueue.worker.loop import WorkerConfig, configure_logging, default_worker_name
from django_sqlqueue.worker.supervisor import Supervisor

#: The start-up checks' connect timeout: a database that never answers must not hold the start up.
START_CONNECT_SECONDS = 5.0

MAX_CONCURRENCY = 256
MAX_BATCH = 1000
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class Command(BaseCommand):
    help = (
        "Run queue jobs: claim, run the registered handler, record the outcome; retry with backoff, "
        "renew leases, recover from crashes and database outages. Runs until SIGTERM/SIGINT unless "
        "--burst, --max-jobs or --max-seconds says otherwise."
    )
    # Django's own system checks may open the database (on Django 6.1 the SQLite JSONField probe does,
    # and reports fields.E180 when the file cannot be opened yet). A worker must start while the
    # database is away and wait for it, so it runs only checks that need no connection.
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        """``--version``: this package's version (BaseCommand's default prints Django's)."""
        from django_sqlqueue import __version__

        return f"django-sqlqueue {__version__}"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-q", "--queue", action="append", dest="queues", default=[], metavar="NAME",
                            help="Claim jobs of this queue only (repeatable; default: every queue).")
        parser.add_argument("--type", action="append", dest="types", default=[], metavar="NAME",
                            help="Claim jobs of this job type only (repeatable; default: every type).")
        parser.add_argument("--concurrency", type=int, default=1, metavar="N",
                            help=f"Job slots, each its own OS process (1-{MAX_CONCURRENCY}; default 1).")
        parser.add_argument("--batch", default="auto", metavar="N|auto",
                            help=f"Jobs a slot claims per round trip: 'auto' (default) grows the batch while "
                                 f"the queue is deep and the jobs are short (SQLQUEUE BATCH_MAX, BATCH_SECONDS); "
                                 f"N (1-{MAX_BATCH}) fixes it. Claimed jobs wait their turn in the slot.")
        parser.add_argument("--burst", "--until-empty", action="store_true", dest="burst",
                            help="Drain the jobs that are due, then exit 0 (default: run until stopped); "
                                 "non-zero when the database stayed unreachable (--db-wait) or a slot died "
                                 "running a job.")
        parser.add_argument("--wait-due", type=float, default=0.0, metavar="SECONDS",
                            help="With --burst: keep going while a matching job becomes due within SECONDS "
                                 "(retries, jobs scheduled a little ahead). Default 0.")
        parser.add_argument("--db-wait", type=float, default=60.0, metavar="SECONDS",
                            help="With --burst: how long to wait for an unreachable database before giving up "
                                 "with a non-zero exit (default 60). Without --burst a worker waits for ever.")
        parser.add_argument("--max-jobs", type=int, default=None, metavar="N",
                            help="Exit cleanly after claiming N jobs in all (for recycling).")
        parser.add_argument("--max-seconds", type=float, default=None, metavar="SECONDS",
                            help="Exit cleanly after running this long (for recycling).")
        parser.add_argument("--worker-name", default=None, metavar="NAME",
                            help="Name this worker's slots NAME/0, NAME/1, ... (default host:pid). A worker "
                                 "restarted under the same name takes back its unfinished jobs at once.")
        parser.add_argument("--grace-seconds", type=float, default=30.0, metavar="SECONDS",
                            help="On SIGTERM/SIGINT, how long running jobs may take to finish before their "
                                 "slots are killed (default 30). A second signal stops at once.")
        parser.add_argument("--log-level", default="INFO", metavar="LEVEL", type=str.upper,
                            help=f"Level of the django_sqlqueue loggers: {', '.join(LOG_LEVELS)} (default INFO).")
        parser.add_argument("--no-progress", action="store_true",
                            help="No progress bar (by default --burst shows one on stderr when it is a terminal).")

    def handle(self, *args: Any, **options: Any) -> None:
        from ...ops.checks import check_queue_database

        errors = [e for e in check_queue_database() if e.is_serious()]
        if errors:
            raise CommandError("; ".join(f"{e.id}: {e.msg}" for e in errors))
        config, supervisor = self.build(options)
        using = config.using or get_settings().DATABASE
        with bounded_connect(using, START_CONNECT_SECONDS):  # a silent database cannot hold the start up
            reachable = self.check_migrated(using)
            configure_logging(options["log_level"])
            if reachable:
                self.sync_types(config)
                self.check_types(config)
                self.announce(config, using)
        summary = supervisor.run()
        self.stdout.write(summary.line())
        if config.burst:
            self.report_not_due(config)
            self.report_unhandled(config, using)
        if summary.exit_code:
            raise CommandError(summary.reason or "a worker slot stopped on a fatal error (see the log above)",
                               returncode=summary.exit_code)

    # ----- validation ----------------------------------------------------------------------------
    def build(self, o: dict[str, Any]) -> tuple[WorkerConfig, Supervisor]:
        _int_range("--concurrency", o["concurrency"], 1, MAX_CONCURRENCY)
        batch = _batch(o["batch"])
        if o["max_jobs"] is not None:
            _int_range("--max-jobs", o["max_jobs"], 1, 10**12)
        _seconds("--grace-seconds", o["grace_seconds"], 0, 7 * 86400)
        _seconds("--wait-due", o["wait_due"], 0, 7 * 86400)
        _seconds("--db-wait", o["db_wait"], 0, 7 * 86400)
        if o["wait_due"] and not o["burst"]:
            raise CommandError("--wait-due only makes sense with --burst")
        if o["max_seconds"] is not None:
            _seconds("--max-seconds", o["max_seconds"], 0, 10 * 365 * 86400)
            if o["max_seconds"] <= 0:
                raise CommandError("--max-seconds must be greater than 0")
        if o["log_level"] not in LOG_LEVELS:
            raise CommandError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {o['log_level']!r}")
        for queue in o["queues"]:
            if not queue or len(queue) > 100:
                raise CommandError(f"--queue names must be 1-100 characters, got {queue!r}")
        for name in o["types"]:
            try:
                jobtypes.validate_name(name)
            except InvalidArgument as exc:
                raise CommandError(f"--type: {exc}") from exc
        name = o["worker_name"] if o["worker_name"] is not None else default_worker_name()
        if not name.strip() or len(name) > 190 or not name.isprintable():
            raise CommandError(f"--worker-name must be 1-190 printable characters, got {name!r}")
        config = WorkerConfig(
            name=name, queues=tuple(dict.fromkeys(o["queues"])), types=tuple(dict.fromkeys(o["types"])),
            batch=batch, burst=o["burst"], wait_due=o["wait_due"], db_wait=o["db_wait"], max_jobs=o["max_jobs"],
            using=get_settings().DATABASE,
        )
        supervisor = Supervisor(config, concurrency=o["concurrency"], grace_seconds=o["grace_seconds"],
                                max_seconds=o["max_seconds"], log_level=o["log_level"],
                                progress=not o["no_progress"])
        return config, supervisor

    def report_not_due(self, config: WorkerConfig) -> None:
        """After a burst: the jobs it left because they are not due yet, and when the next one is.

        A burst drains what is due; a job enqueued with ``delay=`` a moment ago is not, and a bare
        ``processed=0`` reads as "the queue does not work".
        """
        from django.db.models import Count, Min
        from django.utils import timezone

        from django_sqlqueue.models import Job
        from django_sqlqueue.states import CLAIMABLE

        now = timezone.now()
        jobs = Job.objects.using(config.using or "default").filter(status_id__in=CLAIMABLE, scheduled_for__gt=now)
        if config.queues:
            jobs = jobs.filter(queue__in=config.queues)
        if config.types:
            jobs = jobs.filter(job_type__name__in=config.types)
        try:
            found = jobs.order_by().aggregate(n=Count("id"), next=Min("scheduled_for"))
        except DatabaseError:
            return
        if found["n"]:
            self.stdout.write(
                f"{found['n']} job{'s' if found['n'] != 1 else ''} of this worker's queues and types "
                f"{'are' if found['n'] != 1 else 'is'} not due yet; the next is due at "
                f"{found['next'].isoformat(timespec='seconds')} (in {(found['next'] - now).total_seconds():.0f} s). "
                f"--wait-due SECONDS keeps a burst worker for jobs due within SECONDS.")

    def announce(self, config: WorkerConfig, using: str) -> None:
        """The start line: the job types and tasks this worker serves (it claims only those), and a
        warning when it serves none -- a worker without handlers used to claim jobs only to fail them."""
        from django_sqlqueue.worker import serving

        try:
            found = serving.resolve(using, config.types)
        except DatabaseError as exc:  # the database is down: the slots read the types when it is back
            self.stderr.write(f"could not read the job types now ({exc}); continuing")
            return
        for line in serving.describe(found):
            self.stdout.write(line)
        for problem in serving.problems(found):
            self.stderr.write(self.style.WARNING(f"warning: {problem}"))

    def report_unhandled(self, config: WorkerConfig, using: str) -> None:
        """After a burst: due jobs it left because its code has no handler for their type."""
        from django.db.models import Count

        from django_sqlqueue.models import Job
        from django_sqlqueue.states import CLAIMABLE
        from django_sqlqueue.worker import serving

        try:
            found = serving.resolve(using, config.types)
            if not found.unhandled:
                return
            jobs = Job.objects.using(using).filter(status_id__in=CLAIMABLE, job_type__name__in=found.unhandled)
            if config.queues:
                jobs = jobs.filter(queue__in=config.queues)
            rows = list(jobs.order_by().values("job_type__name").annotate(n=Count("id"))
                        .values_list("job_type__name", "n")[:20])
        except DatabaseError:
            return
        if rows:
            self.stdout.write("left unclaimed (no handler for their type in this code): "
                              + ", ".join(f"{name} ({n})" for name, n in sorted(rows)))

    def check_migrated(self, using: str) -> bool:
        """Refuse to start on a database whose queue tables are missing or behind the code.

        Without this a worker started before ``migrate`` retried "no such table" forever (SQLite) or
        crashed its slots with tracebacks (PostgreSQL). A database that cannot be reached is not
        refused: the slots wait for it, as they wait through any outage.
        """
        from django.db import connections
        from django.db.migrations.loader import MigrationLoader

        try:
            if self.queue_migrations_applied(using):
                return True
            loader = MigrationLoader(connections[using], ignore_no_migrations=True)
            applied = set(loader.applied_migrations)
        except DatabaseError as exc:
            self.stderr.write(f"could not check the migrations now ({exc}); continuing")
            return False
        missing = sorted(key[1] for key in loader.disk_migrations
                         if key[0] == "django_sqlqueue" and key not in applied)
        if missing:
            raise CommandError(
                f"the queue's tables in database {using!r} are not migrated (django_sqlqueue "
                f"{', '.join(missing)} not applied): run manage.py migrate")
        return True

    @staticmethod
    def queue_migrations_applied(using: str) -> bool:
        """True when every migration file of the queue's app is recorded as applied: the usual answer,
        from the file names and one read of ``django_migrations``. ``MigrationLoader`` imports every
        app's migrations to say the same (a tenth of a second and more of a worker's start); it still
        decides whenever this finds one missing (a squashed migration, a file not applied yet)."""
        import importlib
        import pkgutil

        from django.db import connections
        from django.db.migrations.loader import MigrationLoader
        from django.db.migrations.recorder import MigrationRecorder

        module_name, _ = MigrationLoader.migrations_module("django_sqlqueue")
        if module_name is None:
            return False
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            return False
        names = {m.name for m in pkgutil.iter_modules(getattr(module, "__path__", [])) if m.name[0] not in "_~"}
        applied = {name for app, name in MigrationRecorder(connections[using]).applied_migrations()
                   if app == "django_sqlqueue"}
        return bool(names) and names <= applied

    def sync_types(self, config: WorkerConfig) -> None:
        """The handlers' options reach their job type rows (as after migrate): this worker runs this code."""
        from django_sqlqueue.handlers import describe_overrides, sync_job_types

        try:
            report = sync_job_types(using=config.using or "default")
        except DatabaseError as exc:  # the database is down: the slots wait for it
            self.stderr.write(f"could not sync job types now ({exc}); continuing")
            return
        for line in describe_overrides(report):
            self.stderr.write(line)

    def check_types(self, config: WorkerConfig) -> None:
        """Refuse a --type nobody knows; create the row of a registered handler's type if missing."""
        for name in config.types:
            try:
                jobtypes.get_type(name, using=config.using or "default", create=registry.is_registered(name))
            except UnknownJobType as exc:
                raise CommandError(f"--type {name!r}: {exc}") from exc
            except DatabaseError as exc:  # the database is down: the slots wait for it
                self.stderr.write(f"could not check --type {name!r} now ({exc}); continuing")
                return


def _int_range(option: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise CommandError(f"{option} must be an integer from {low} to {high}, got {value}")


def _seconds(option: str, value: float, low: float, high: float) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise CommandError(f"{option} must be a number of seconds from {low} to {high}, got {value}")


def _batch(value: Any) -> int | None:
    """``--batch``: 'auto' (None: adaptive, see batching.py) or a fixed size from 1 to MAX_BATCH."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise CommandError(f"--batch must be 'auto' or an integer from 1 to {MAX_BATCH}, got {value!r}") from None
    if isinstance(value, float) or not 1 <= n <= MAX_BATCH:
        raise CommandError(f"--batch must be 'auto' or an integer from 1 to {MAX_BATCH}, got {value!r}")
    return n
