"""``manage.py reset_password``: enqueue a password reset (job + subtype rows, one transaction)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from testproject.notifications.services import request_password_reset


class Command(BaseCommand):
    help = "Enqueue a ResetPassword job with its ResetPassword, EmailChannel and SmsChannel rows."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--user-id", type=int, required=True)
        parser.add_argument("--username", required=True)
        parser.add_argument("--email", help="send the code by e-mail to this address")
        parser.add_argument("--phone", help="send the code by SMS to this number")
        parser.add_argument("--language", default="en")
        parser.add_argument("--fail-send", type=int, default=0, metavar="N",
                            help="make the Send step fail on the first N attempts (demo)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = request_password_reset(
                user_id=options["user_id"], username=options["username"], email=options["email"],
                phone=options["phone"], language=options["language"], fail_send_attempts=options["fail_send"],
            )
        except (ValueError, ValidationError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"enqueued ResetPassword job {job.pk} (status {job.state.label})")
