"""``manage.py queue_why JOB_ID``: explain why a job is (not) running."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...models import Job
from ...ops.diagnose import why_not_running


class Command(BaseCommand):
    help = "Explain why a job is not being run (paused, scheduled later, out of attempts, held by a worker...)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("job_id", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        job = Job.objects.filter(pk=options["job_id"]).select_related("job_type").first()
        if job is None:
            raise CommandError(f"no job with id {options['job_id']}")
        self.stdout.write(f"job {job.pk} ({job.job_type.name}, queue {job.queue!r}): {job.state.label}, "
                          f"attempt {job.attempt_num}")
        reasons = why_not_running(job)
        if not reasons:
            self.stdout.write("- nothing stops it: a worker serving its queue will claim it now")
        for reason in reasons:
            self.stdout.write(f"- {reason}")
