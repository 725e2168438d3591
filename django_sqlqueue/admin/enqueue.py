"""Enqueue a one-off job from the admin: any known type, its payload written as JSON, validated as code's
``enqueue`` validates it (the same call), with the ``enqueue_job`` permission.

What an operator reaches for when a job must run once more by hand (a customer's export redone, a
webhook resent) without a shell on a production host. The job is an ordinary job: it keeps the type's
limits, retries and dedupe rules, and the admin's history (LogEntry) records who enqueued it and when.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..exceptions import SqlQueueError
from ..models import Job, JobType
from ..queue import MAX_DELAY_SECONDS
from ..states import DEDUPE_SCOPE

PERMISSION = "django_sqlqueue.enqueue_job"


class EnqueueForm(forms.Form):
    job_type = forms.ChoiceField(label=gettext_lazy("job type"))
    queue = forms.CharField(label=gettext_lazy("queue"), max_length=100, initial="default")
    priority = forms.IntegerField(label=gettext_lazy("priority"), initial=0, min_value=-32768, max_value=32767,
                                  help_text=gettext_lazy("Higher runs first."))
    delay = forms.IntegerField(label=gettext_lazy("delay (seconds)"), required=False, min_value=0,
                               max_value=MAX_DELAY_SECONDS, help_text=gettext_lazy("Empty: due now."))
    dedupe_key = forms.CharField(label=gettext_lazy("dedupe key"), max_length=200, required=False,
                                 help_text=gettext_lazy("Optional: no second unfinished job with this key."))
    payload = forms.CharField(label=gettext_lazy("payload (JSON)"), initial="{}",
                              widget=forms.Textarea(attrs={"rows": 10, "cols": 60, "spellcheck": "false"}))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["job_type"].choices = [(n, n) for n in JobType.objects.order_by("name")
                                           .values_list("name", flat=True)]

    def clean_payload(self) -> Any:
        text = self.cleaned_data["payload"]
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(_("Not JSON: %(error)s") % {"error": exc}) from exc


def enqueue_view(request: HttpRequest, modeladmin: Any) -> HttpResponse:
    """The form; on a valid submit, ``Job.objects.enqueue`` and the new job's page."""
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    form = EnqueueForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        key = data["dedupe_key"] or None
        held = (Job.objects.filter(dedupe_key=key, status_id__in=DEDUPE_SCOPE).values_list("pk", flat=True).first()
                if key else None)
        try:
            job = Job.objects.enqueue(data["job_type"], data["payload"], queue=data["queue"],
                                      priority=data["priority"], delay=data["delay"] or None,
                                      dedupe_key=data["dedupe_key"] or None)
        except SqlQueueError as exc:  # an invalid payload, queue name or key: nothing was written
            form.add_error(None, str(exc))
        else:
            if job.pk == held:  # the dedupe rule kept the unfinished job with this key
                modeladmin.message_user(request, _("Nothing enqueued: %(job)s with this dedupe key is unfinished.")
                                        % {"job": job}, messages.WARNING)
                return HttpResponseRedirect(reverse("admin:django_sqlqueue_job_change", args=[job.pk]))
            LogEntry.objects.log_actions(user_id=request.user.pk, queryset=[job], action_flag=ADDITION,
                                         change_message="Enqueued from the admin")
            modeladmin.message_user(request, _("%(job)s enqueued in queue %(queue)s.") % {
                "job": job, "queue": job.queue}, messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:django_sqlqueue_job_change", args=[job.pk]))
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Enqueue a job"),
        "opts": modeladmin.model._meta,
        "form": form,
        "media": modeladmin.media + form.media,
    }
    return TemplateResponse(request, "admin/django_sqlqueue/enqueue.html", context)
