"""``manage.py queue_why JOB_ID``: explain why a job is (not) running -- the same diagnosis as the admin's
job page (ops/diagnose.py).

A diagnostic tool must run when things are broken, so it runs no system checks: an invalid schedule in
settings (a check error) is exactly when someone asks why a job does not run.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...models import Job
from ...ops.diagnose import diagnose


class Command(BaseCommand):
    help = ("Explain why a job is not being run (paused, scheduled later, out of attempts, held by a worker, "
            "no live worker serving its queue and type, waiting for another job...).")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("job_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        job = Job.objects.filter(pk=options["job_id"]).select_related("job_type").first()
        if job is None:
            raise CommandError(f"no job with id {options['job_id']}")
        self.stdout.write(f"job {job.pk} ({job.job_type.name}, queue {job.queue!r}): {job.state.label}, "
                          f"attempt {job.attempt_num}")
        found = diagnose(job)
        if found.runs_now:
            self.stdout.write("- nothing stops it: " + found.text)
            return
        for line in found.lines:
            self.stdout.write(f"- {line}")
