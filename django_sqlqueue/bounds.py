"""The queue's documented bounds, checked where a value enters: the API, the model, the admin forms.

A value outside them is refused with a message naming the bound, at the call that brought it in,
instead of failing later, far from its cause: a retry time no timestamp column can hold would crash
the worker recording it; a lease of 0 s lets two workers run the same job; a newline in a type name
forges log lines. ``docs/configuration.md`` lists these bounds.
"""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.deconstruct import deconstructible

from .exceptions import InvalidArgument

log = logging.getLogger("django_sqlqueue")

#: Longest delay, retry or backoff a caller may ask for, and how far ahead (or back) a job may be
#: scheduled: a century. Every vendor's timestamp columns hold any date within it (SQL Server's
#: datetime2 and SQLite's ISO text end with the year 9999, PostgreSQL's much later), and so does
#: Python's datetime; the admin's "Retry at…" form and the worker's retry are held to it too.
MAX_DELAY_SECONDS = 100 * 365 * 86400
#: Largest backoff a job type (or ``SQLQUEUE['BACKOFF_*_SECONDS']``) may set: a year. A retry is for a
#: transient failure; a wait longer than this is a schedule, and belongs in ``scheduled_for``.
MAX_BACKOFF_SECONDS = 365 * 86400
#: Smallest lease a job type may set. The heartbeat renews a lease every third of its length (or every
#: ``HEARTBEAT_SECONDS`` when that is sooner), so any lease spans at least three renewals; a lease of 0 s
#: expires at the claim itself and lets a second worker take the job while the first runs it.
MIN_LEASE_SECONDS = 1
#: Smallest run-time limit and attempt count of a job type (0 would mean "never runs").
MIN_TIMEOUT_SECONDS = 1
MIN_ATTEMPTS = 1


def is_seconds(value: Any, maximum: float = MAX_DELAY_SECONDS) -> bool:
    """A finite, non-negative number of seconds up to ``maximum`` (a bool is not a number here)."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= maximum)


_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(value: Any, what: str = "age", minimum: float = 1.0) -> timedelta:
    """An age as ``purge_queue --older-than`` and ``SQLQUEUE["RETENTION"]`` take it: ``90s``, ``15m``,
    ``12h``, ``7d``, ``2w``, a plain number of seconds (text or number) or a timedelta; from ``minimum``
    seconds to 100 years. ValueError, naming ``what``, otherwise."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _AGE.fullmatch(value) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"{what} must look like 90s, 15m, 12h, 7d or 2w (or a number of seconds), got {value!r}")
        seconds = float(match.group(1)) * _AGE_UNITS[match.group(2) or "s"]
    if not math.isfinite(seconds) or seconds < minimum:
        raise ValueError(f"{what} must be at least {minimum:g} second(s), got {value!r}")
    if seconds > MAX_DELAY_SECONDS:
        raise ValueError(f"{what} {value!r} is more than 100 years")
    return timedelta(seconds=seconds)


def check_delay(value: float | timedelta, what: str = "delay") -> float:
    """``value`` (seconds or a timedelta) as seconds; :class:`InvalidArgument` outside 0 .. a century."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if not is_seconds(seconds):
        raise InvalidArgument(f"{what} must be a non-negative number of seconds up to {MAX_DELAY_SECONDS} "
                              f"(100 years), got {value!r}")
    return float(seconds)


def check_when(when: datetime, what: str = "scheduled_for", now: datetime | None = None) -> datetime:
    """``when`` if it is timezone-aware and within a century of now; else :class:`InvalidArgument`.

    A date further out is a mistake (a unit mixed up, a year typed wrong), and near the year 9999 one
    that the database cannot store or that a time-zone conversion for display overflows.
    """
    if not isinstance(when, datetime):
        raise InvalidArgument(f"{what} must be a datetime, got {when!r}")
    if timezone.is_naive(when):
        raise InvalidArgument(f"{what} must be timezone-aware")
    now = now or timezone.now()
    span = timedelta(seconds=MAX_DELAY_SECONDS)
    if not now - span <= when <= now + span:
        raise InvalidArgument(f"{what} must be within 100 years of now, got {when.isoformat()}")
    return when


def retry_at_seconds(at: datetime) -> float:
    """Seconds from now until ``at`` (0 if past), for ``Retry(at=...)``: refused beyond a century.

    The worker records a retry as "due in so many seconds" by the database clock; this is where a
    handler's absurd ``at`` is caught, in the handler's own attempt, not when the worker records it.
    """
    check_when(at, "Retry(at=...)")
    return max(0.0, (at - timezone.now()).total_seconds())


# ----- job type settings ------------------------------------------------------------------------------
#: Unicode categories Cc (U+0000-U+001F, U+007F-U+009F), Zl (U+2028) and Zp (U+2029), exactly.
_LINE_BREAKERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def unsafe_text(text: str) -> str | None:
    """Why ``text`` may not name a job type (or appear in one log line), or None.

    Control characters (newline, carriage return, escape, NUL, ...) and the Unicode line and paragraph
    separators would let a name start a new line in the worker's log and forge entries there.
    """
    found = _LINE_BREAKERS.search(text)  # checked on every enqueue: one regex scan, not a loop in Python
    return f"it contains the control character {found.group()!r}" if found else None


def check_type_name(name: str) -> str:
    """``name`` if it may name a job type; :class:`InvalidArgument` for control characters."""
    why = unsafe_text(name) if isinstance(name, str) else None
    if why:
        raise InvalidArgument(f"a job type name may not contain control characters or line breaks: {why}")
    return name


def validate_name(name: object) -> str:
    """``name`` if it may name a job type (here, below handlers and jobtypes, which both check names)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidArgument(f"a job type name must be a non-empty string of at most 200 characters, got {name!r}")
    return check_type_name(name)  # no control characters or line breaks (they would forge log lines)


def validate_type_name(value: str) -> None:
    """Model validator for ``JobType.name`` (the admin form shows the message)."""
    why = unsafe_text(value)
    if why:
        raise ValidationError("A job type name may not contain control characters or line breaks (%(why)s).",
                              code="control_character", params={"why": why})


@deconstructible
class FiniteRange:
    """Model validator: a finite number from ``minimum`` to ``maximum`` (NaN and infinity refused:
    ``NaN < 0`` and ``NaN > max`` are both false, so Min/MaxValueValidator let NaN through)."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def __call__(self, value: Any) -> None:
        if value is None:
            return
        if not (isinstance(value, int | float) and math.isfinite(value) and self.minimum <= value <= self.maximum):
            raise ValidationError("Enter a number from %(min)s to %(max)s.", code="out_of_range",
                                  params={"min": self.minimum, "max": self.maximum})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FiniteRange) and (self.minimum, self.maximum) == (other.minimum, other.maximum)

    def __hash__(self) -> int:
        return hash((self.minimum, self.maximum))


#: JobType field -> (smallest, largest) value it may hold (None: no bound of ours beyond the column's).
TYPE_SETTING_BOUNDS: dict[str, tuple[float, float | None]] = {
    "max_attempts": (MIN_ATTEMPTS, None),
    "timeout_seconds": (MIN_TIMEOUT_SECONDS, None),
    "lease_seconds": (MIN_LEASE_SECONDS, None),
    "backoff_base_seconds": (0, MAX_BACKOFF_SECONDS),
    "backoff_max_seconds": (0, MAX_BACKOFF_SECONDS),
}


def clamp_type_setting(type_name: str, field: str, value: Any) -> Any:
    """A job type's stored ``field`` value brought within its bounds, with a warning if it was not.

    For rows written before the bounds existed (or past them by hand): a lease of 0 would let two
    workers run the same job, a backoff of 1e10 s would make every retry unrecordable. None (blank:
    the ``SQLQUEUE`` default applies) and values within bounds are returned as they are.
    """
    if value is None or field not in TYPE_SETTING_BOUNDS:
        return value
    low, high = TYPE_SETTING_BOUNDS[field]
    if isinstance(value, float) and math.isnan(value):
        fixed: Any = None
    elif value < low:
        fixed = type(value)(low)
    elif high is not None and value > high:
        fixed = type(value)(high)
    else:
        return value
    log.warning("job_type_setting_out_of_range type=%r field=%s stored=%r used=%r (bounds: %s..%s); "
                "fix it in the admin", type_name, field, value, "the default" if fixed is None else fixed,
                low, "" if high is None else high)
    return fixed


# ----- what every vendor stores ------------------------------------------------------------------------
def unstorable(value: Any) -> str | None:
    """Why ``value`` (JSON-serialisable) cannot be stored on every vendor, or None.

    PostgreSQL's jsonb and text refuse the NUL character, and no UTF-8 column holds a lone surrogate;
    SQLite stores both. Refused everywhere so that what works on SQLite works on PostgreSQL too.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return "it contains a NUL character (\\u0000), which PostgreSQL cannot store"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it contains a lone surrogate, which is not valid UTF-8"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return None


# ----- concurrency and rate limits (docs/limits.md) ----------------------------------------------------
#: A concurrency limit: at least 1 job at a time (0 would mean "never runs": pause the type instead),
#: at most 1000 (one permit row per slot and key; more than that is not a limit worth enforcing).
MIN_CONCURRENCY_LIMIT = 1
MAX_CONCURRENCY_LIMIT = 1000
#: A rate limit's count is held in as many permit rows, so it is bounded the same way.
MAX_RATE_COUNT = 1000
#: The periods a rate limit may name, in seconds.
RATE_PERIODS: dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(\d{1,4})\s*/\s*(\d{0,6})\s*([smhd])\s*$")


def parse_rate(text: str) -> tuple[int, float]:
    """``"10/s"`` as (10 starts, per 1.0 s); ``"100/m"``, ``"5/2s"``, ``"500/h"``, ``"1000/d"`` alike.

    :class:`InvalidArgument` for anything else: a count from 1 to 1000 over a period of s, m, h or d
    (optionally with a multiplier, ``5/10s``).
    """
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(f'a rate limit must look like "10/s", "100/m", "5/10s" or "500/h", got {text!r}')
    count, multiplier, unit = int(match[1]), int(match[2] or 1), match[3]
    if not 1 <= count <= MAX_RATE_COUNT:
        raise InvalidArgument(f"a rate limit's count must be from 1 to {MAX_RATE_COUNT}, got {count} in {text!r}")
    if multiplier < 1:
        raise InvalidArgument(f"a rate limit's period must be at least 1{unit}, got {text!r}")
    return count, float(multiplier * RATE_PERIODS[unit])


def check_concurrency_limit(value: Any, what: str = "concurrency_limit") -> int | None:
    """``value`` if it may be a concurrency limit (None: no limit); else :class:`InvalidArgument`."""
    if value is None:
        return None
    if (not isinstance(value, int) or isinstance(value, bool)
            or not MIN_CONCURRENCY_LIMIT <= value <= MAX_CONCURRENCY_LIMIT):
        raise InvalidArgument(f"{what} must be an integer from {MIN_CONCURRENCY_LIMIT} to {MAX_CONCURRENCY_LIMIT} "
                              f"(or None for no limit), got {value!r}")
    return value


def check_limits(concurrency_limit: Any, rate_limit: Any, what: str = "a job type") -> None:
    """Refuse limits one type cannot have: bad values, or a concurrency and a rate limit together
    (a job would need two permits, which one claim statement does not take)."""
    check_concurrency_limit(concurrency_limit)
    if rate_limit:
        parse_rate(rate_limit)
    if concurrency_limit is not None and rate_limit:
        raise InvalidArgument(f"{what} may have a concurrency_limit or a rate_limit, not both")


def validate_rate_limit(value: str) -> None:
    """Model validator for ``JobType.rate_limit`` (blank: no limit)."""
    if not value:
        return
    try:
        parse_rate(value)
    except InvalidArgument as exc:
        raise ValidationError(str(exc), code="rate_limit") from None


def storable_concurrency_key(value: Any) -> str:
    """A concurrency key as stored: text of at most 200 characters, no control characters.

    Numbers are accepted and stored as text (a ``customer_id`` of 42 is the key "42"); None is no key.
    """
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidArgument(f"a concurrency key must be a string or an integer, got {type(value).__name__}")
    text = str(value)
    if len(text) > 200:
        raise InvalidArgument(f"a concurrency key may be at most 200 characters, got {len(text)}")
    why = unsafe_text(text)
    if why:
        raise InvalidArgument(f"a concurrency key may not contain control characters: {why}")
    return text
