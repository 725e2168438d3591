"""Typed subtype rows (``JobData`` / ``InclusiveJobData`` subclasses) as inlines on a job's page.

Every concrete subclass of :class:`~django_sqlqueue.models.JobData` in any installed app is found
through ``django.apps.apps.get_models()`` and shown read-only on the job page, with no admin code in
that app. An app may change how its subtype shows, or hide it::

    from django_sqlqueue.admin_subtypes import SubtypeInline, register_subtype_inline

    @register_subtype_inline(ResetPassword)
    class ResetPasswordInline(SubtypeInline):
        model = ResetPassword
        exclude = ["otp"]  # never show the one-time code

    register_subtype_inline(SmsChannel, None)  # hide it

An exclusive subtype (``job_type_name`` set) shows only on jobs of that type; an inclusive one only
when the job has a row in it (one EXISTS query per inclusive table).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import Job, JobData
from ..sensitive import MASK, can_view, sensitive_fields

_custom: dict[type[JobData], type[admin.options.InlineModelAdmin] | None] = {}


class ReadOnlyJobInline:
    """Mixin for inlines on the job page (history, subtype rows): never editable, visible to whoever
    may see the job."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_sqlqueue.view_job") or request.user.has_perm(
            "django_sqlqueue.change_job")


class SubtypeInline(ReadOnlyJobInline, admin.StackedInline):
    """Read-only inline for one subtype table; the default for every subtype without its own.

    The model's ``sensitive_fields`` are left out for a user without "Can view sensitive job data"
    (:mod:`.sensitive`); a line names them instead, so the operator knows something is withheld.
    """

    fk_name = "job"
    extra = 0
    max_num = 0
    can_delete = False
    classes = ["sqlqueue-subtype"]

    def _hidden(self, request: HttpRequest) -> tuple[str, ...]:
        return () if can_view(request.user) else sensitive_fields(self.model)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        hidden = self._hidden(request)
        fields = [f for f in super().get_fields(request, obj) if f not in hidden]
        return [*fields, "sensitive_note"] if hidden else fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        return [*fields, "sensitive_note"] if self._hidden(request) else fields

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> list[str] | None:
        hidden = self._hidden(request)
        excluded = list(super().get_exclude(request, obj) or [])
        return [*excluded, *hidden] if hidden or excluded else None

    @admin.display(description=_("hidden"))
    def sensitive_note(self, obj: Any) -> str:
        return _("%(fields)s: %(mask)s (needs the “Can view sensitive job data” permission)") % {
            "fields": ", ".join(sensitive_fields(self.model)), "mask": MASK}



def register_subtype_inline(model: type[JobData], inline: type[admin.options.InlineModelAdmin] | None = ...,  # type: ignore[assignment]
                            ) -> Any:
    """Use ``inline`` for ``model`` on job pages (``None`` hides it). Works as a class decorator too."""
    if inline is not ...:
        _custom[model] = inline
        return inline

    def decorator(cls: type[admin.options.InlineModelAdmin]) -> type[admin.options.InlineModelAdmin]:
        _custom[model] = cls
        return cls

    return decorator


def subtype_models() -> list[type[JobData]]:
    """Every concrete (non-abstract, non-proxy) JobData subclass among the installed apps' models."""
    return [m for m in apps.get_models() if issubclass(m, JobData) and not m._meta.proxy]


def inline_class(model: type[JobData]) -> type[admin.options.InlineModelAdmin] | None:
    if model in _custom:
        return _custom[model]
    return type(f"{model.__name__}Inline", (SubtypeInline,), {"model": model, "__module__": __name__})


def subtype_inlines_for(job: Job | None, type_name: str | None) -> list[type[admin.options.InlineModelAdmin]]:
    """The inline classes to show on ``job``'s page."""
    if job is None:
        return []
    found = []
    for model in subtype_models():
        cls = inline_class(model)
        if cls is None:
            continue
        expected = getattr(model, "job_type_name", None)
        if expected is not None:
            if expected != type_name:
                continue
        elif not model._default_manager.using(job._state.db).filter(job=job).exists():
            continue
        found.append(cls)
    return found
