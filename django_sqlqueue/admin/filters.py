"""List filters, the cheap paginator and the cheap date hierarchy of the job changelist.

Everything here is written for a job table with millions of rows:

- no filter lists its choices with ``SELECT DISTINCT`` over the job table: statuses come from the code,
  types and workers from their own small tables, queues and steps from a "loose index scan" (one index
  seek per distinct value, see :func:`distinct_values`);
- every filter's WHERE clause is one an index serves (docs/admin.md lists which);
- the paginator never counts the whole table (:class:`CheapPaginator`);
- the date hierarchy never runs ``SELECT DISTINCT date_trunc(...)`` (:func:`date_hierarchy_context`).

And a value none of the filter's choices could hold (``?status=Error``, ``?status=99``, ``?type=abc``,
an id past 64 bits, a NUL) is refused as Django's own filters refuse theirs: the list redirects to
``?e=1`` and shows no jobs, instead of ignoring the filter and listing (and letting an action select)
every job.
"""

from __future__ import annotations

import calendar
import datetime
import threading
import time
from typing import Any, NoReturn

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Max, Min, Q, QuerySet
from django.utils import formats, timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _
from django_admin_listfilter_dropdown.filters import SimpleDropdownFilter

from ..dialects.predicates import has_error, index_predicate, lease_expired, overdue  # noqa: F401 (also imported from here)
from ..ops.health import MAX_DISTINCT_VALUES, distinct_values  # noqa: F401 (moved to ops.health; also imported from here)
from ..states import Status, human_label

#: Largest id a filter or the search takes: the id columns are 64-bit integers.
MAX_ID = 2**63 - 1


def parse_id(text: Any) -> int | None:
    """``text`` as a row id (ASCII digits, 1 to 2**63 - 1), else None.

    ``str.isdigit()`` is true for ``"²"`` and other digits ``int()`` refuses or reads as another
    number, and a larger number overflows the database's integer: both were a 500.
    """
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 19):
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ID else None


def refuse(parameter: str, value: Any, why: str) -> NoReturn:
    """Refuse a filter value the way Django's own filters do (the list redirects to ``?e=1``)."""
    raise IncorrectLookupParameters(f"{parameter}={value!r}: {why}")


def text_value(parameter: str, value: str, max_length: int) -> str:
    """A free-text filter value (queue, step, worker) a column of ``max_length`` could hold."""
    from ..queue import unstorable

    if len(value) > max_length:
        refuse(parameter, value[:50], f"longer than {max_length} characters")
    why = unstorable(value)
    if why:
        refuse(parameter, value[:50], why)
    return value

#: Seconds the queue and step dropdowns reuse their choices (per process). New queues and steps are rare;
#: with the queue / step indexes a refresh costs a few seeks, without them a scan per value.
CHOICES_TTL_SECONDS = 30.0
_choices_cache: dict[tuple[str, str], tuple[float, list[Any]]] = {}
_choices_lock = threading.Lock()


def cached_distinct_values(queryset: QuerySet, field: str) -> list[Any]:
    """:func:`distinct_values`, remembered for ``CHOICES_TTL_SECONDS`` per database and field."""
    key = (queryset.db, field)
    now = time.monotonic()
    with _choices_lock:
        hit = _choices_cache.get(key)
    if hit is not None and now - hit[0] < CHOICES_TTL_SECONDS:
        return hit[1]
    values = distinct_values(queryset, field)
    with _choices_lock:
        _choices_cache[key] = (now, values)
    return values


class CheckedFilter:
    """Mixin for list filters: a value the filter's column could not hold is refused, and a value given
    is always applied.

    The value is checked as the filter is built (:meth:`clean`), before Django decides whether to show
    the filter: Django drops a filter with no choices, and its value with it, so ``?worker=w1`` on a
    site with no worker rows listed every job, ready for "select all" and an action.
    """

    parameter_name: str

    def __init__(self, request: Any, params: Any, model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)  # type: ignore[call-arg]
        raw = self.value()  # type: ignore[attr-defined]
        self.cleaned = None if raw is None else self.clean(raw)

    def clean(self, value: str) -> Any:
        """The value to filter on; :func:`refuse` a value the column cannot hold."""
        raise NotImplementedError

    def has_output(self) -> bool:
        return self.value() is not None or super().has_output()  # type: ignore[attr-defined,misc]


class ColumnFilter(CheckedFilter):
    """A checked filter whose value is compared with one column of the job (``column = value``).

    Each subclass names its ``column`` and, beside it, the index that serves the WHERE clause: the
    changelist must stay an index seek on a table of millions of rows (docs/admin.md lists them).
    """

    column: str

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet | None:
        if self.cleaned is None:
            return queryset
        return queryset.filter(**{self.column: self.cleaned})


class StatusFilter(ColumnFilter, SimpleDropdownFilter):
    title = _("status")
    parameter_name = "status"
    column = "status_id"  # index: status_id (FK) / sqlqueue_job_status_type

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(int(s)), human_label(s)) for s in Status]

    def clean(self, value: str) -> int:
        status = parse_id(value)
        if status not in {int(s) for s in Status}:
            refuse(self.parameter_name, value, f"not a status id (1 to {int(max(Status))})")
        return status  # type: ignore[return-value]


class JobTypeFilter(ColumnFilter, SimpleDropdownFilter):
    title = _("type")
    parameter_name = "type"
    column = "job_type_id"  # index: type_id (FK)

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        from ..models import JobType

        return [(str(pk), name) for pk, name in JobType.objects.order_by("name").values_list("pk", "name")]

    def clean(self, value: str) -> int:
        type_id = parse_id(value)
        if type_id is None:
            refuse(self.parameter_name, value, "not a job type id")
        return type_id


class QueueFilter(ColumnFilter, SimpleDropdownFilter):
    title = _("queue")
    parameter_name = "queue"
    column = "queue"  # index: sqlqueue_job_queue

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        from ..models import Job

        return [(q, q) for q in cached_distinct_values(Job.objects.all(), "queue")]

    def clean(self, value: str) -> str:
        return text_value(self.parameter_name, value, 100)


class StepFilter(ColumnFilter, SimpleDropdownFilter):
    title = _("step")
    parameter_name = "step"
    column = "step"  # index: sqlqueue_job_step

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        from ..models import Job

        steps = cached_distinct_values(Job.objects.filter(step__gt=""), "step")
        return [("-", _("(no step)")), *((s, s) for s in steps)]

    def clean(self, value: str) -> str:
        return "" if value == "-" else text_value(self.parameter_name, value, 100)


class BatchFilter(ColumnFilter, admin.SimpleListFilter):
    """The members of one batch (``?batch=<id>``), as the batch page links to them: shown only when
    given (a list of every batch would be long)."""

    title = _("batch")
    parameter_name = "batch"
    column = "batch_id"  # index: sqlqueue_job_batch (batch, status)

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        batch_id = parse_id(self.value() or "")  # called before clean(): Django builds the choices first
        return [(str(batch_id), _("Batch #%(id)d") % {"id": batch_id})] if batch_id is not None else []

    def clean(self, value: str) -> int:
        batch_id = parse_id(value)
        if batch_id is None:
            refuse(self.parameter_name, value, "not a batch id")
        return batch_id  # type: ignore[return-value]


class WorkerFilter(ColumnFilter, SimpleDropdownFilter):
    title = _("worker")
    parameter_name = "worker"
    column = "worker"  # index: sqlqueue_job_worker

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        from ..models import Worker

        # The worker table is small; list the most recently alive ones.
        names = Worker.objects.order_by("-last_heartbeat").values_list("name", flat=True)[:100]
        return [(n, n) for n in sorted(names)]

    def clean(self, value: str) -> str:
        return text_value(self.parameter_name, value, 200)


class _YesFilter(CheckedFilter, admin.SimpleListFilter):
    """A filter with a single "Yes" choice (the negation would be a scan: it is not offered)."""

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("1", _("Yes"))]

    def clean(self, value: str) -> bool:
        if value != "1":
            refuse(self.parameter_name, value, "the only choice is 1 (Yes)")
        return True

    def queryset(self, request: Any, queryset: QuerySet) -> QuerySet | None:
        return queryset if self.cleaned is None else queryset.filter(self.condition(queryset.db))

    def condition(self, using: str) -> Q:
        raise NotImplementedError


class OverdueFilter(_YesFilter):
    """Claimable and due, yet not claimed: workers are behind (or paused, or stopped)."""

    title = _("overdue")
    parameter_name = "overdue"

    def condition(self, using: str) -> Q:
        return overdue(using, timezone.now())


class LeaseExpiredFilter(_YesFilter):
    """Processing with an expired lease: its worker is presumed dead; the next claim takes it over."""

    title = _("lease expired")
    parameter_name = "lease_expired"

    def condition(self, using: str) -> Q:
        return lease_expired(using, timezone.now())


class OrphanedFilter(_YesFilter):
    """Processing jobs whose worker is stopped or stale or whose lease expired (see :mod:`.health`)."""

    title = _("orphaned")
    parameter_name = "orphaned"

    def condition(self, using: str) -> Q:
        from ..ops.health import orphaned_q

        return orphaned_q(timezone.now(), using)


class HasErrorFilter(_YesFilter):
    """Jobs carrying error text (the last failed attempt's traceback)."""

    title = _("has error")
    parameter_name = "has_error"

    def condition(self, using: str) -> Q:
        return has_error(using)


class DeclaredFiltersOnly:
    """ModelAdmin mixin: a list may be filtered through the URL only by its declared filters.

    Django's own ``lookup_allowed`` lets any lookup on a local field through, to anyone who may view
    the list: ``?error__regex=(a+)+$`` (exponential backtracking, in the web process on SQLite),
    ``?payload__icontains=x`` (a scan of every payload), ``?payload__contains=x`` (a 500 on SQLite).
    Here only the list filters' own parameters and the date hierarchy's are allowed; anything else is
    Django's ``DisallowedModelAdminLookup`` (a 400).
    """

    def lookup_allowed(self, lookup: str, value: Any, request: Any = None) -> bool:
        return lookup in self.declared_lookups(request)

    def declared_lookups(self, request: Any) -> set[str]:
        """The URL parameters the declared list filters and the date hierarchy read."""
        from django.contrib.admin.utils import get_fields_from_path

        allowed: set[str] = set()
        for item in self.get_list_filter(request):  # type: ignore[attr-defined]
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                allowed.add(item.parameter_name)  # no instance: building one may query its choices
                continue
            if isinstance(item, str | tuple | list):
                path, filter_class = (item, admin.FieldListFilter.create) if isinstance(item, str) else item
                field = get_fields_from_path(self.model, path)[-1]  # type: ignore[attr-defined]
                spec = filter_class(field, request, {}, self.model, self, field_path=path)  # type: ignore[attr-defined]
            else:
                spec = item(request, {}, self.model, self)  # type: ignore[attr-defined]
            allowed.update(spec.expected_parameters() or ())
        hierarchy = getattr(self, "date_hierarchy", None)
        if hierarchy:
            allowed.update(f"{hierarchy}__{part}" for part in ("year", "month", "day"))
        return allowed


def check_date_hierarchy(field_name: str, params: dict[str, Any]) -> None:
    """Refuse a date hierarchy value Django would crash on (``?enqueued_at__year=10**30`` overflows
    ``datetime()`` with an OverflowError, which Django does not catch) or that names no date."""
    for part, high in (("year", 9999), ("month", 12), ("day", 31)):
        key = f"{field_name}__{part}"
        for value in params.get(key, ()):
            number = parse_id(value)
            if number is None or number > high:
                refuse(key, value, f"not a {part} (1 to {high})")


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class CheapPaginator(Paginator):
    """A paginator that never counts the whole table.

    - Unfiltered list on PostgreSQL: the planner's row estimate (``pg_class.reltuples``), when it is
      above ``count_cap`` (exact counts below it are cheap anyway).
    - Otherwise: ``SELECT COUNT(*) FROM (SELECT ... LIMIT cap + 1)``, so at most ``cap + 1`` index
      entries are read; above the cap the count shows as "more than <cap>".

    ``is_estimate`` / ``is_capped`` tell the template how to word the count.
    """

    count_cap = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.is_estimate = False
        self.is_capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        # values("pk"): count ids only, not the list's annotations (the error excerpt would read every row's error)
        capped = qs.values("pk")[: self.count_cap + 1].count()
        if capped <= self.count_cap:
            return capped
        estimate = self._estimate(qs)
        if estimate is not None and estimate > self.count_cap:
            self.is_estimate = True
            return estimate
        self.is_capped = True
        return self.count_cap

    def _estimate(self, qs: QuerySet) -> int | None:
        if qs.query.where or qs.query.is_sliced:
            return None  # filtered: an estimate of the whole table would mislead
        from ..dialects import get_dialect

        return get_dialect(connections[qs.db]).estimated_rows(qs.model._meta.db_table)


def date_hierarchy_context(cl: Any) -> dict[str, Any] | None:
    """Django's date hierarchy without its ``SELECT DISTINCT`` over the whole table.

    Django lists only the years / months / days that hold rows, which costs a full scan. This takes
    the table's first and last date (two index seeks) and lists every year, month or day between
    them, within the period already chosen.
    """
    field_name = cl.date_hierarchy
    if not field_name:
        return None
    year_field, month_field, day_field = (f"{field_name}__{p}" for p in ("year", "month", "day"))
    year, month, day = (_int(cl.params.get(f)) for f in (year_field, month_field, day_field))

    def link(filters: dict[str, Any]) -> str:
        return cl.get_query_string(filters, [f"{field_name}__"])

    # The whole table's first and last date: two index seeks whatever the filters. (The filtered
    # list's bounds would cost a scan for a search or a rare filter; a link may then lead to an
    # empty period, which is cheap to show.) Two statements: SQLite and SQL Server seek the index for
    # a lone MIN or MAX only, and read it whole for both in one (SQLite, 1M jobs: 0.3 s, on every
    # page of the job list).
    table = cl.root_queryset.order_by()
    bounds = {**table.aggregate(first=Min(field_name)), **table.aggregate(last=Max(field_name))}
    if bounds["first"] is None:
        return {"show": False}
    first, last = (timezone.localtime(v) if timezone.is_aware(v) else v for v in (bounds["first"], bounds["last"]))
    if not year:
        if first.year == last.year:
            year = first.year
            if first.month == last.month:
                month = first.month
    if year and month and day:
        try:
            the_day = datetime.date(year, month, day)
        except ValueError:
            return {"show": False}
        return {
            "show": True,
            "back": {"link": link({year_field: year, month_field: month}),
                     "title": capfirst(formats.date_format(the_day, "YEAR_MONTH_FORMAT"))},
            "choices": [{"title": capfirst(formats.date_format(the_day, "MONTH_DAY_FORMAT"))}],
        }
    if year and month and 1 <= month <= 12:
        days = range(1, calendar.monthrange(year, month)[1] + 1)
        days = [d for d in days if _within(datetime.date(year, month, d), first, last)]
        return {
            "show": True,
            "back": {"link": link({year_field: year}), "title": str(year)},
            "choices": [
                {"link": link({year_field: year, month_field: month, day_field: d}),
                 "title": capfirst(formats.date_format(datetime.date(year, month, d), "MONTH_DAY_FORMAT"))}
                for d in days
            ],
        }
    if year:
        months = [m for m in range(1, 13)
                  if (year, m) >= (first.year, first.month) and (year, m) <= (last.year, last.month)]
        return {
            "show": True,
            "back": {"link": link({}), "title": _("All dates")},
            "choices": [
                {"link": link({year_field: year, month_field: m}),
                 "title": capfirst(formats.date_format(datetime.date(year, m, 1), "YEAR_MONTH_FORMAT"))}
                for m in months
            ],
        }
    return {
        "show": True,
        "back": None,
        "choices": [{"link": link({year_field: y}), "title": str(y)} for y in range(first.year, last.year + 1)],
    }


def _within(day: datetime.date, first: datetime.datetime, last: datetime.datetime) -> bool:
    return first.date() <= day <= last.date()
