"""One way to write a time in the admin: ``2026-11-26 22:38:30 UTC`` (local time, seconds, zone), and
ages in seconds below a minute ("12 seconds", never "0 minutes").

Django writes a model's datetime in the locale's format ("Nov. 26, 2026, 10:38 p.m.", no zone) in
lists and read-only fields; a page that showed that next to our stamps had two formats side by side.
Every datetime column of the app's admins goes through :func:`stamp_column` instead. The format and the
relative phrases are :mod:`django_sqlqueue.ops.timefmt`'s, shared with ``queue_why`` and ``queue_schedules``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..ops.timefmt import STAMP_FORMAT, ago, stamp, until  # noqa: F401  (the one format: ops/timefmt.py)


def short_stamp(when: datetime | None) -> SafeString | str:
    """For the list: the time and zone alone when it is today, else the full stamp (one format)."""
    if when is None:
        return "—"
    local = timezone.localtime(when)
    text = local.strftime("%H:%M:%S %Z") if local.date() == timezone.localdate() else stamp(when)
    return format_html('<span title="{}">{}</span>', stamp(when), text)


def stamp_column(field: str, description: Any) -> Callable[[Any, Any], str]:
    """A ModelAdmin display method writing ``field`` with :func:`stamp` (sortable by the field)."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        return stamp(getattr(obj, field))

    column.__name__ = f"{field}_stamp"
    return column
