"""One way to write a time in the admin: ``2026-11-26 22:38:30 UTC`` (local time, seconds, zone), and
ages in seconds below a minute ("12 seconds", never "0 minutes").

Django writes a model's datetime in the locale's format ("Nov. 26, 2026, 10:38 p.m.", no zone) in
lists and read-only fields; a page that showed that next to our stamps had two formats side by side.
Every datetime column of the app's admins goes through :func:`stamp_column` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _

#: The one date format of the admin pages (Python's strftime; templates use "Y-m-d H:i:s T").
STAMP_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def stamp(when: datetime | None) -> str:
    """A local timestamp with seconds and the time zone (operators compare these to logs)."""
    return timezone.localtime(when).strftime(STAMP_FORMAT) if when else "—"


def short_stamp(when: datetime | None) -> SafeString | str:
    """For the list: the time and zone alone when it is today, else the full stamp (one format)."""
    if when is None:
        return "—"
    local = timezone.localtime(when)
    text = local.strftime("%H:%M:%S %Z") if local.date() == timezone.localdate() else stamp(when)
    return format_html('<span title="{}">{}</span>', stamp(when), text)


def until(when: datetime, now: datetime) -> str:
    """"in 42 seconds" / "in 3 minutes": never "in 0 minutes"."""
    seconds = (when - now).total_seconds()
    if seconds < 60:
        return _("in %d seconds") % max(1, int(seconds))
    return _("in %s") % timeuntil(when, now)


def ago(when: datetime, now: datetime | None = None) -> str:
    """"12 seconds" / "3 minutes": never "0 minutes"."""
    now = now or timezone.now()
    seconds = (now - when).total_seconds()
    if seconds < 60:
        return _("%d seconds") % max(0, int(seconds))
    return timesince(when, now)


def stamp_column(field: str, description: Any) -> Callable[[Any, Any], str]:
    """A ModelAdmin display method writing ``field`` with :func:`stamp` (sortable by the field)."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return stamp(getattr(obj, field))

    column.__name__ = f"{field}_stamp"
    return column
