"""``manage.py queue_pause QUEUE... [--reason TEXT]``: stop every worker of the fleet from claiming a
queue's jobs, from their next claim on; ``queue_pause`` alone lists the paused queues.
``manage.py queue_resume QUEUE...`` undoes it. Running jobs finish; waiting jobs keep their order.

Like ``queue_why``, it runs no system checks: pausing is what an operator does when things are broken.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...exceptions import InvalidArgument
from ...models import Job
from ...ops.timefmt import stamp


def operator_name() -> str:
    """Who runs the command, as the pause records it: ``user@host``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for the uid (a container's user)
        user = "?"
    return f"{user}@{socket.gethostname()}"


class Command(BaseCommand):
    help = ("Pause queues fleet-wide: no worker claims their jobs until queue_resume (running jobs finish). "
            "Without a queue, list the paused ones.")
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE")
        parser.add_argument("--reason", default="", help="why, shown in the admin and by queue_why")
        parser.add_argument("--by", default=None, help="who pauses (default: user@host)")
        parser.add_argument("--database", default=None, help="the queue's database alias (default: SQLQUEUE's)")

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"]
        if not options["queues"]:
            paused = Job.objects.paused_queues(using=using)
            if not paused:
                self.stdout.write("no queue is paused")
            for p in paused.values():
                by = f" by {p.paused_by}" if p.paused_by else ""
                why = f": {p.reason}" if p.reason else ""
                self.stdout.write(f"{p.queue}: paused{by} at {stamp(p.paused_at)}{why}")
            return
        by = options["by"] if options["by"] is not None else operator_name()
        for queue in options["queues"]:
            try:
                new = Job.objects.pause_queue(queue, by=by, reason=options["reason"], using=using)
            except InvalidArgument as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"{queue}: paused" if new else f"{queue}: was already paused (kept as it was)")
