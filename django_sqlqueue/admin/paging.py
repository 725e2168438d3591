"""Walk a job list of any length: "older" / "newer" pages by id (keyset paging).

The numbered pages stop where the cheap count stops (:class:`.filters.CheapPaginator`: 10,000 rows,
100 pages), and a deep ``OFFSET`` costs every row it skips. ``?before=<id>`` lists the next page of jobs
with a smaller id, ``?after=<id>`` the page with a larger one: each is ``WHERE id < n ORDER BY id DESC
LIMIT 100`` on top of the list's filters, an index range (the primary key, or a filter's ``(column,
id)`` index) however deep it is. An action's "select all" still means every job the filters match.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR
from django.http import HttpRequest
from django.utils.translation import gettext as _

from .filters import parse_id

#: The query parameters of the walk (not filters: they never reach ``lookup_allowed``).
BEFORE, AFTER = "before", "after"


class KeysetWalk:
    """ChangeList mixin: ``before`` / ``after`` cursors and the links to the older and newer pages."""

    cursor: tuple[str, int] | None
    older_url: str | None = None
    newer_url: str | None = None
    newest_url: str | None = None

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        if not hasattr(self, "cursor"):
            self.cursor = self._take_cursor()
        return super().get_queryset(request, exclude_parameters)  # type: ignore[misc]

    def _take_cursor(self) -> tuple[str, int] | None:
        given = [(key, self.params.pop(key)) for key in (BEFORE, AFTER) if key in self.params]  # type: ignore[attr-defined]
        for key, _value in given:
            self.filter_params.pop(key, None)  # type: ignore[attr-defined]
        if not given:
            return None
        if len(given) > 1:
            raise IncorrectLookupParameters(_("Give “before” or “after”, not both."))
        key, value = given[0]
        job_id = parse_id(value)
        if job_id is None:
            raise IncorrectLookupParameters(_("%(key)s=%(value)s: not a job id.") % {"key": key, "value": value[:30]})
        return key, job_id

    def get_results(self, request: HttpRequest) -> None:
        if self.cursor is None:
            past = _(
                "Page %(page)s does not exist: numbered pages stop at the last one counted. Walk on with "
                "“older” at the foot of the last page.") % {"page": request.GET.get(PAGE_VAR, "")[:20]}
            try:
                super().get_results(request)  # type: ignore[misc]
            except IncorrectLookupParameters:
                raise IncorrectLookupParameters(past) from None
            # Django shows the only page for any page number: "?p=101" of a short list listed it all.
            if self.page_num > max(1, self.paginator.num_pages):  # type: ignore[attr-defined]
                raise IncorrectLookupParameters(past)
        else:
            self._walk_results(request)
        self._walk_links()

    def _descending(self) -> bool:
        order = list(self.queryset.query.order_by) or ["-pk"]  # type: ignore[attr-defined]
        first = order[0]
        return not isinstance(first, str) or first.startswith("-")

    def _walk_results(self, request: HttpRequest) -> None:
        admin = self.model_admin  # type: ignore[attr-defined]
        qs = self.queryset  # type: ignore[attr-defined]
        paginator = admin.get_paginator(request, qs, self.list_per_page)  # type: ignore[attr-defined]
        key, job_id = self.cursor  # type: ignore[misc]
        if key == BEFORE:
            rows = list(qs.filter(pk__lt=job_id).order_by("-pk")[: self.list_per_page])  # type: ignore[attr-defined]
        else:
            rows = list(qs.filter(pk__gt=job_id).order_by("pk")[: self.list_per_page])  # type: ignore[attr-defined]
        rows.sort(key=lambda job: job.pk, reverse=self._descending())
        self.result_count = paginator.count
        self.show_full_result_count = False
        self.full_result_count = None
        self.show_admin_actions = True
        self.result_list = rows
        self.can_show_all = False
        self.multi_page = True
        self.paginator = paginator

    def _walk_links(self) -> None:
        """Links to the next older and newer pages, when there are jobs there (two index seeks)."""
        ids = [job.pk for job in self.result_list]  # type: ignore[attr-defined]
        qs = self.queryset  # type: ignore[attr-defined]
        if self.cursor is not None:
            self.newest_url = self.get_query_string()  # type: ignore[attr-defined]
        if not ids:
            return
        low, high = min(ids), max(ids)
        if qs.filter(pk__lt=low).exists():
            self.older_url = self.get_query_string({BEFORE: low}, remove=[AFTER])  # type: ignore[attr-defined]
        if qs.filter(pk__gt=high).exists():
            self.newer_url = self.get_query_string({AFTER: high}, remove=[BEFORE])  # type: ignore[attr-defined]
