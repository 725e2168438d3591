"""Paused queues in the admin: adding one pauses the queue fleet-wide, the Resume action ends it.

Django's own permissions say who may do what: ``add_queuepause`` pauses, ``delete_queuepause``
resumes, ``view_queuepause`` sees the list; a pause's reason may be edited (``change_queuepause``), its
queue, time and author never. Both ways go through ``Job.objects.pause_queue`` / ``resume_queue``, the
same calls as the ``queue_pause`` / ``queue_resume`` commands.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..exceptions import InvalidArgument
from ..models import Job, QueuePause, Worker
from ..ops.health import live_q
from ..queue.pauses import MAX_BY_CHARS, checked_queue_name
from ..states import Status
from .guard import GuardedChangelist
from .stamps import stamp_column
from .views import changelist_url


class PauseForm(forms.ModelForm):
    """The queue name checked as enqueue checks it; a queue no job and no worker names is refused (a typo
    would pause nothing and say nothing)."""

    class Meta:
        model = QueuePause
        fields = ("queue", "reason")

    def clean_queue(self) -> str:
        queue = self.cleaned_data["queue"]
        try:
            checked_queue_name(queue)
        except InvalidArgument as exc:
            raise forms.ValidationError(str(exc)) from exc
        if self.instance._state.adding and not known_queue(queue):
            raise forms.ValidationError(_("No job is in queue %(queue)s and no worker names it: check the "
                                          "spelling.") % {"queue": queue})
        return queue


def known_queue(queue: str) -> bool:
    """A job is (or was) in the queue, or a worker serves it by name: two index seeks."""
    return (Job.objects.filter(queue=queue).exists()
            or any(queue in (w.queues or []) for w in Worker.objects.filter(stopped_at__isnull=True)))


@admin.action(permissions=["delete"], description=gettext_lazy("Resume the selected queues"))
def resume_queues(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    if not modeladmin.has_delete_permission(request):
        raise PermissionDenied
    resumed = [p for p in queryset if Job.objects.resume_queue(p.queue)]
    if resumed:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=resumed, action_flag=DELETION,
                                     change_message="Resumed")
    modeladmin.message_user(request, ngettext("%(n)d queue resumed.", "%(n)d queues resumed.", len(resumed))
                            % {"n": len(resumed)}, messages.SUCCESS)


class QueuePauseAdmin(GuardedChangelist, admin.ModelAdmin):
    form = PauseForm
    list_display = ("queue", "paused_by", "paused", "reason", "waiting_jobs")
    ordering = ("queue",)
    actions = [resume_queues]
    paused = stamp_column("paused_at", gettext_lazy("paused at"))

    class Media:
        css = {"all": ["django_sqlqueue/admin.css"]}

    def get_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("queue", "reason") if obj is None else ("queue", "paused_by", "paused", "reason")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else ("queue", "paused_by", "paused")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        # Django 6.1 passes where the actions show (the list, or a change form); 5.2 does not know it.
        actions = (super().get_actions(request) if action_location is None
                   else super().get_actions(request, action_location=action_location))
        actions.pop("delete_selected", None)  # resuming is the way a pause ends
        return actions

    def save_model(self, request: HttpRequest, obj: QueuePause, form: Any, change: bool) -> None:
        if change:
            QueuePause.objects.filter(pk=obj.pk).update(reason=obj.reason)
            return
        # A custom user model's name may be longer than the column (an email: 254): the start is who.
        by = (request.user.get_username() if request.user.is_authenticated else "")[:MAX_BY_CHARS]
        if not Job.objects.pause_queue(obj.queue, by=by, reason=obj.reason):
            self.message_user(request, _("Queue %(queue)s was already paused: the first pause is kept.")
                              % {"queue": obj.queue}, messages.WARNING)
        obj.refresh_from_db()
        serving = [w for w in Worker.objects.filter(live_q(timezone.now()))
                   if not w.queues or obj.queue in w.queues]
        self.message_user(request, ngettext(
            "Paused: %(n)d live worker serves queue %(queue)s and stops claiming its jobs at its next claim; "
            "running jobs finish.",
            "Paused: %(n)d live workers serve queue %(queue)s and stop claiming its jobs at their next claim; "
            "running jobs finish.", len(serving)) % {"n": len(serving), "queue": obj.queue}, messages.INFO)

    def delete_model(self, request: HttpRequest, obj: QueuePause) -> None:
        Job.objects.resume_queue(obj.queue)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for p in queryset:
            Job.objects.resume_queue(p.queue)

    @admin.display(description=gettext_lazy("waiting jobs"))
    def waiting_jobs(self, obj: QueuePause) -> SafeString:
        """A link to the queue's Pending jobs (no count: a count of a big queue costs a scan per row)."""
        return format_html('<a href="{}">{}</a>', changelist_url(queue=obj.queue, status=int(Status.PENDING)), _("Pending jobs"))


admin.site.register(QueuePause, QueuePauseAdmin)
