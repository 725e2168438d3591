"""``manage.py queue_schedules``: each schedule, its next runs and its last job's status.

``--sync`` first writes ``SQLQUEUE["SCHEDULES"]`` into the table (as ``migrate`` and worker start do).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_sqlqueue import schedules
from django_sqlqueue.conf import get_settings
from django_sqlqueue.models import Job, Schedule
from django_sqlqueue.ops.timefmt import stamp
from django_sqlqueue.states import Status


class Command(BaseCommand):
    help = "List recurring schedules: what they enqueue, when, their next runs and their last job's status."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--next", type=int, default=5, metavar="N", help="Next runs shown per schedule (1-100).")
        parser.add_argument("--sync", action="store_true", help="Sync SQLQUEUE['SCHEDULES'] into the table first.")
        parser.add_argument("names", nargs="*", metavar="NAME", help="Only these schedules.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not 1 <= options["next"] <= 100:
            raise CommandError(f"--next must be from 1 to 100, got {options['next']}")
        using = get_settings().DATABASE
        if options["sync"]:
            result = schedules.sync_schedules(using)
            if result.skipped:
                raise CommandError(f"not synced: {result.skipped}")
            if result.deferred:
                self.stderr.write(f"not synced: a newer SQLQUEUE['SCHEDULES'] (version {result.deferred[:12]}) is "
                                  f"live; these settings are older")
            for name, error in result.invalid:
                self.stderr.write(f"skipped {name}: {error}")
            self.stdout.write(f"synced: created={len(result.created)} updated={len(result.updated)} "
                              f"undeclared={len(result.undeclared)}")
        rows = Schedule.objects.using(using).order_by("name")
        if options["names"]:
            rows = rows.filter(name__in=options["names"])
        rows = list(rows)
        statuses = dict(Job.objects.using(using).filter(pk__in=[s.last_job_id for s in rows if s.last_job_id])
                        .values_list("id", "status_id"))
        for s in rows:
            self.stdout.write(self._describe(s, statuses, options["next"]))
        if not rows:
            self.stdout.write(self._none_hint(options["names"]))
        elif not options["names"]:
            entries = get_settings().SCHEDULES  # not a dict: check E202 says so; nothing is declared then
            missing = sorted(set(entries) - {s.name for s in rows}) if isinstance(entries, dict) else []
            if missing:
                self.stdout.write(f"declared in SQLQUEUE['SCHEDULES'] but not in the table yet: {', '.join(missing)} "
                                  f"(manage.py migrate, a worker's start or queue_schedules --sync writes them)")

    @staticmethod
    def _none_hint(names: list[str]) -> str:
        """"no schedules", and what to do: before the first sync, the declared ones are not rows yet."""
        entries = get_settings().SCHEDULES
        declared = sorted(entries) if isinstance(entries, dict) else []
        if names:
            return f"no schedule named {', '.join(names)}"
        if declared:
            return (f"no schedules in the table yet; SQLQUEUE['SCHEDULES'] declares {len(declared)} "
                    f"({', '.join(declared[:10])}{' ...' if len(declared) > 10 else ''}): manage.py migrate, a "
                    f"worker's start or queue_schedules --sync writes them")
        return ("no schedules: declare them in SQLQUEUE['SCHEDULES'] or add one in the admin "
                "(docs/schedules.md)")

    @staticmethod
    def _describe(s: Schedule, statuses: dict[int, int], count: int) -> str:
        when = f"cron {s.cron!r} {s.timezone}" if s.cron else f"every {s.every_seconds} s"
        flags = [f for f, on in (("disabled", not s.enabled), ("declared", s.declared)) if on]
        lines = [f"{s.name}: {s.task or s.job_type} {when} queue={s.queue} misfire={s.misfire}"
                 + (f" [{', '.join(flags)}]" if flags else "")]
        if s.last_job_id:
            status = statuses.get(s.last_job_id)
            label = Status(status).label if status is not None else "purged"
            lines.append(f"  last: tick {stamp(s.last_run_at)}, job {s.last_job_id} {label}"
                         if s.last_run_at else f"  last: job {s.last_job_id} {label}")
        if s.last_error:
            lines.append(f"  error: {s.last_error}")
        if s.next_run_at is None:
            lines.append("  next: none (parked: fix the definition)")
            return "\n".join(lines)
        try:
            defn = schedules.definition_of(s)
            ticks = schedules.upcoming(defn, s.next_run_at, count)
        except schedules.ScheduleError as exc:
            lines.append(f"  next: cannot compute ({exc})")
            return "\n".join(lines)
        for t in ticks:
            # One format (ops/timefmt.py); the schedule's own zone beside it only when it is another one.
            local = t.astimezone(defn.zone)
            other = local.utcoffset() != timezone.localtime(t).utcoffset() or defn.timezone != timezone.get_current_timezone_name()
            lines.append(f"  next: {stamp(t)}" + (f" ({defn.timezone}: {local:%Y-%m-%d %H:%M:%S %Z})" if other else ""))
        return "\n".join(lines)
