"""Rows to Job objects, and the database a call goes to (the base of the manager's parts)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections, router
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils.dateparse import parse_datetime

from ..conf import get_settings
from ..dialects import JOB_COLUMNS, get_dialect

if TYPE_CHECKING:
    from ..models import Job


def _utc_datetime_value(value: Any, expression: Any, connection: Any) -> Any:
    """The backend's ``convert_datetimefield_value`` for a connection whose time zone is UTC: the same
    result (a naive value read as UTC; SQLite's text parsed first) without its per-value reads of
    ``settings.USE_TZ`` through the lazy settings object and its second awareness check. A claim
    converts a dozen datetime columns per job: Django's converter was a quarter of a SQLite worker's
    CPU per job (about 100 of 400 us, measured with cProfile in bench/tasks_cost.py's drain)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = parse_datetime(value)
    return value if value.utcoffset() is not None else value.replace(tzinfo=UTC)


def _faster(conv: Any, connection: Any) -> Any:
    """``conv``, or an equivalent that costs less per value: the backend's datetime converter on a UTC
    connection (USE_TZ = True, the database's TIME_ZONE unset: what the package's checks require)."""
    backend = getattr(type(connection.ops), "convert_datetimefield_value", None)
    if (backend is not None and getattr(conv, "__func__", None) is backend and settings.USE_TZ
            and connection.timezone is UTC):
        return _utc_datetime_value
    return conv


class RowsMixin:
    """The manager's plumbing: which database, and Job objects from the rows a statement returns."""

    def _alias(self, using: str | None) -> str:
        return using or self._db or get_settings().DATABASE or router.db_for_write(self.model)

    def _converters(self, connection: Any, names: tuple[str, ...] = JOB_COLUMNS) -> list[tuple[int, list[Any]]]:
        """(position, converters) for the ``names`` that need any; computed once per connection."""
        dialect = get_dialect(connection)
        cache = dialect.__dict__.setdefault("_converter_cache", {})
        cached = cache.get(names)
        if cached is None:
            meta = self.model._meta
            cached = []
            for i, attname in enumerate(names):
                f = next(x for x in meta.concrete_fields if x.attname == attname)
                col = f.get_col(meta.db_table)
                convs = [_faster(conv, connection)
                         for conv in connection.ops.get_db_converters(col) + col.get_db_converters(connection)]
                if convs:
                    cached.append((i, convs))
            cache[names] = cached
        return cached

    @staticmethod
    def _convert(values: list[Any], converters: list[tuple[int, list[Any]]], connection: Any) -> list[Any]:
        for i, convs in converters:
            value = values[i]
            for conv in convs:
                value = conv(value, None, connection)
            values[i] = value
        return values

    def _instance(self, values: dict[str, Any], using: str, fast: bool) -> Job:
        """A Job loaded from ``using`` with these attribute values (every concrete field).

        ``fast`` (nobody listens to pre_init/post_init for Job, who would expect ``__init__`` to run):
        what Model.__init__ would do for a full row, minus its per-field argument handling.
        """
        model = self.model
        if not fast:
            return model.from_db(using, list(values), list(values.values()))
        job = model.__new__(model)
        state = job._state = ModelState()
        state.adding, state.db = False, using
        job.__dict__.update(values)
        return job

    def _fast_init(self) -> bool:
        return not (pre_init.has_listeners(self.model) or post_init.has_listeners(self.model))

    def _rows_to_jobs(self, rows: Iterable[Sequence[Any]], using: str) -> list[Job]:
        """Build Job objects from raw JOB_COLUMNS rows, applying the backend's value converters.

        The claim's hot path: no query, no per-row field lookups (the converters are cached per
        connection), and ``from_db`` as Django's own queryset iterator uses it.
        """
        connection = connections[using]
        converters = self._converters(connection)
        if not self._fast_init():
            return [self._instance(dict(zip(JOB_COLUMNS, self._convert(list(row), converters, connection),
                                            strict=True)), using, False) for row in rows]
        model, new, names = self.model, self.model.__new__, JOB_COLUMNS
        jobs = []
        for row in rows:  # _instance, inlined: this is the claim's hot path
            values = list(row)
            for i, convs in converters:
                value = values[i]
                for conv in convs:
                    value = conv(value, None, connection)
                values[i] = value
            job = new(model)
            state = job._state = ModelState()
            state.adding, state.db = False, using
            job.__dict__.update(zip(names, values, strict=True))
            jobs.append(job)
        return jobs

    def _prep(self, attname: str, value: Any, using: str) -> Any:
        if value is None:
            return None
        return self.model._meta.get_field(attname.removesuffix("_id")).get_db_prep_save(value, connections[using])
