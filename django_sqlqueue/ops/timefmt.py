"""The one way the package writes a time for people: ``2026-11-26 22:11:52 UTC`` (local time, its zone).

The admin, ``queue_why``, ``queue_schedules`` and the worker's reports all print times through here, so
an operator never sees "22:11:52 UTC" next to "2026-11-26 22:11:52 UTC" and wonders which day the first
one was. Relative phrases ("in 3 minutes", "12 seconds", "1 second") are here too: never "in 0 minutes".
"""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

#: The one date format (Python's strftime; templates use "Y-m-d H:i:s T").
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def stamp(when: datetime | None) -> str:
    """A local timestamp with seconds and the time zone (operators compare these to logs)."""
    return timezone.localtime(when).strftime(STAMP_FORMAT) if when else "—"


def until(when: datetime, now: datetime) -> str:
    """"in 42 seconds" / "in 3 minutes": never "in 0 minutes"."""
    seconds = (when - now).total_seconds()
    if seconds < 60:
        n = max(1, int(seconds))
        return ngettext("in %d second", "in %d seconds", n) % n
    return _("in %s") % timeuntil(when, now)


def ago(when: datetime, now: datetime | None = None) -> str:
    """"12 seconds" / "3 minutes": never "0 minutes"."""
    now = now or timezone.now()
    seconds = (now - when).total_seconds()
    if seconds < 60:
        n = max(0, int(seconds))
        return ngettext("%d second", "%d seconds", n) % n
    return timesince(when, now)
