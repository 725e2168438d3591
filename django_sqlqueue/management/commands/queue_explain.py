"""``manage.py queue_explain``: print the claim's query plan and whether it uses the claim index."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...ops.explain import explain_claim


class Command(BaseCommand):
    help = "Show the query plan of the worker's claim statement and check it uses the claim index."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--database", default=None, help="Database alias (default: SQLQUEUE['DATABASE']).")
        parser.add_argument("--limit", type=int, default=10, help="Claim batch size to plan for (default 10).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        try:
            report = explain_claim(using=options["database"], limit=options["limit"])
        except NotImplementedError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(report.plan)
        verdict = "OK: the claim walks the claim index" if report.ok else "WARNING: the claim does not seek the claim index"
        self.stdout.write(verdict)
        if not report.ok:
            raise CommandError("claim plan check failed (see above); run ANALYZE on the job table and retry")
