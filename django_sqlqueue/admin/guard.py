"""Every changelist of the app refuses, and says so, instead of guessing.

Django answers a filter value it cannot use (``IncorrectLookupParameters``) and a page past the last
one with a redirect to ``?e=1``, and ``?e=1`` lists the whole table: an operator who asked for Error
jobs (``?status=Error``) saw the newest jobs of every status, with working checkboxes and "select
all". Here such a request gets a page that names what was refused and lists nothing (HTTP 400), and so
does a lookup that is not one of the list's declared filters (:class:`.filters.DeclaredFiltersOnly`:
``?on_success__icontains=sk_live_`` probed a secret the batch page hides).

A hand-crafted action POST whose ``_selected_action`` is not a row id (``abc``, a number past 64 bits)
was a 500 from the database driver; it is now refused with a message, before anything is read.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG
from django.db.models import IntegerField
from django.db.models.fields import AutoFieldMixin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _

from .filters import DeclaredFiltersOnly, parse_id


class RefusedList(Exception):
    """A changelist request that lists nothing: the message says why (shown to the operator)."""


class GuardedChangelist(DeclaredFiltersOnly):
    """ModelAdmin mixin: declared filters only, a refusal page instead of ``?e=1``, ids checked in POSTs."""

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        try:
            return super().get_changelist_instance(request)  # type: ignore[misc]
        except IncorrectLookupParameters as exc:
            raise RefusedList(str(exc) or _("That page of the list does not exist.")) from exc
        except DisallowedModelAdminLookup as exc:
            raise RefusedList(_("%(lookup)s is not a filter of this list.") % {"lookup": _lookup_of(exc)}) from exc

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if ERROR_FLAG in request.GET:  # an old "?e=1" bookmark: it meant "refused", never "everything"
            return refusal_page(self, request, _("This address carries the mark of a refused filter (e=1)."))
        if request.method == "POST" and isinstance(self.model._meta.pk, AutoFieldMixin | IntegerField):  # type: ignore[attr-defined]
            bad = [v for v in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME) if parse_id(v) is None]
            if bad:
                self.message_user(request, _("Nothing was changed: %(values)s is not the id of a %(model)s.") % {  # type: ignore[attr-defined]
                    "values": ", ".join(repr(v[:30]) for v in bad[:3]),
                    "model": self.model._meta.verbose_name}, messages.ERROR)  # type: ignore[attr-defined]
                return HttpResponseRedirect(request.get_full_path())
        try:
            return super().changelist_view(request, extra_context)  # type: ignore[misc]
        except RefusedList as exc:
            return refusal_page(self, request, str(exc))


def _lookup_of(exc: Exception) -> str:
    text = str(exc)
    return text.removeprefix("Filtering by ").removesuffix(" not allowed") or text


def refusal_page(modeladmin: Any, request: HttpRequest, why: str) -> TemplateResponse:
    """The list's title, the reason, no rows and no actions; a link to the list without the refused parts."""
    opts = modeladmin.model._meta
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("%(name)s: request refused") % {"name": str(opts.verbose_name_plural).capitalize()},
        "opts": opts, "why": why, "cl_url": request.path, "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/django_sqlqueue/refused_list.html", context, status=400)
