"""``manage.py purge_queue --older-than 7d --status Completed``: retention for finished jobs.

Deletes in small batches, each its own short transaction (a job row, its history and its subtype rows
go together, deleted by job id: :meth:`~django_sqlqueue.queue.JobManager.purge`), so the queue table
is never locked for long and SQL Server has no reason to escalate to a table lock. Only finished
statuses may be purged, and a job that changed since its id was read (retried to Pending) is kept: the
conditions are checked again, under a lock, in the batch's own transaction. No job row is ever loaded,
so memory does not grow with payload size.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_sqlqueue import bounds
from django_sqlqueue.conf import get_settings
from django_sqlqueue.queue.housekeeping import purge_batches
from django_sqlqueue.states import FINISHED, Status

MAX_BATCH = 2000  # ids per batch (JobManager.purge splits a batch further where parameters run short)


def parse_age(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` or a plain number of seconds (bounds.parse_age)."""
    try:
        return bounds.parse_age(text or "", "--older-than", minimum=0)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


class Command(BaseCommand):
    help = "Delete finished jobs (and their history and subtype rows) older than a given age, in batches."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", required=True, metavar="AGE",
                            help="Age by finish time: 90s, 15m, 12h, 7d, 2w (a plain number is seconds).")
        parser.add_argument("--status", action="append", dest="statuses", default=[], metavar="STATUS",
                            help="Finished status to purge (repeatable): "
                                 f"{', '.join(s.label for s in sorted(FINISHED))}. Default: Completed.")
        parser.add_argument("-q", "--queue", action="append", dest="queues", default=[], metavar="NAME",
                            help="Only jobs of this queue (repeatable; default: every queue).")
        parser.add_argument("--batch-size", type=int, default=500, metavar="N",
                            help=f"Jobs deleted per transaction (1-{MAX_BATCH}; default 500).")
        parser.add_argument("--pause", type=float, default=0.0, metavar="SECONDS",
                            help="Sleep between batches, to leave the database to the workers (default 0).")
        parser.add_argument("--workers", action="store_true",
                            help="Also delete worker rows whose last heartbeat is older than the age.")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be deleted; delete nothing.")

    def handle(self, *args: Any, **o: Any) -> None:
        from django.db.models import Exists, OuterRef

        from django_sqlqueue.models import Batch, Job, Worker

        age = parse_age(o["older_than"])
        statuses = self._statuses(o["statuses"] or ["Completed"])
        if not 1 <= o["batch_size"] <= MAX_BATCH:
            raise CommandError(f"--batch-size must be an integer from 1 to {MAX_BATCH}, got {o['batch_size']}")
        if not 0 <= o["pause"] <= 60:
            raise CommandError(f"--pause must be from 0 to 60 seconds, got {o['pause']}")
        using = get_settings().DATABASE
        cutoff = timezone.now() - age
        qs = Job.objects.using(using).purgeable(statuses, cutoff, o["queues"])
        workers = Worker.objects.using(using).filter(last_heartbeat__lt=cutoff)
        # Workflow batches (docs/workflows.md) that finished before the cutoff go once no member is left
        # (a member kept, of a status or queue not purged, keeps its batch, and its page in the admin).
        old_batches = Batch.objects.using(using).filter(finished_at__lt=cutoff)
        labels = ", ".join(s.label for s in statuses)
        if o["dry_run"]:
            staying = Job.objects.using(using).filter(batch_id=OuterRef("pk")).exclude(pk__in=qs.values("pk"))
            self.stdout.write(f"would purge {qs.count()} job(s) ({labels}) finished before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
                              + (f" and {workers.count()} worker row(s)" if o["workers"] else "")
                              + f" and {old_batches.exclude(Exists(staying)).count()} finished batch(es)")
            return
        deleted = 0
        while True:
            # Ids only: a job that changes before its batch is deleted is left out by purge() itself.
            ids = list(qs.order_by("id").values_list("id", flat=True)[: o["batch_size"]])
            if not ids:
                break
            deleted += Job.objects.purge(ids, statuses=statuses, cutoff=cutoff, queues=o["queues"], using=using)
            if o["verbosity"] >= 2:
                self.stdout.write(f"  deleted {deleted} so far")
            if o["pause"]:
                time.sleep(o["pause"])
        message = f"purged {deleted} job(s) ({labels}) finished before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
        gone = purge_batches(old_batches.exclude(
            Exists(Job.objects.using(using).filter(batch_id=OuterRef("pk")))), using)
        if gone:
            message += f" and {gone} finished batch(es) without members"
        if o["workers"]:
            n, _ = workers.delete()
            message += f" and {n} worker row(s)"
        self.stdout.write(message)

    @staticmethod
    def _statuses(labels: list[str]) -> list[Status]:
        out = []
        for label in labels:
            finished = ", ".join(s.label for s in sorted(FINISHED))
            try:
                status = Status.from_label(label)
            except ValueError:  # offer only what may be purged (not every status there is)
                raise CommandError(f"--status: unknown status {label!r}; a finished status is one of "
                                   f"{finished}") from None
            if status not in FINISHED:
                raise CommandError(f"--status {status.label} is not a finished status: only {finished} can be "
                                   f"purged")
            out.append(status)
        return sorted(set(out))
