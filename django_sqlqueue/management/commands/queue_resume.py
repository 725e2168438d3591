"""``manage.py queue_resume QUEUE...``: workers claim the queue's jobs again from their next claim on
(see ``queue_pause``)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...exceptions import InvalidArgument
from ...models import Job


class Command(BaseCommand):
    help = "Resume paused queues: workers claim their jobs again at their next claim."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="+", metavar="QUEUE")
        parser.add_argument("--database", default=None, help="the queue's database alias (default: SQLQUEUE's)")

    def handle(self, *args: Any, **options: Any) -> None:
        for queue in options["queues"]:
            try:
                resumed = Job.objects.resume_queue(queue, using=options["database"])
            except InvalidArgument as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"{queue}: resumed" if resumed else f"{queue}: was not paused")
