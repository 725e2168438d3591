"""Input an operator writes by hand: enqueue a one-off job (any known type, its payload written as JSON,
validated as code's ``enqueue`` validates it: the same call), with the ``enqueue_job`` permission; and
retry a job with an edited payload (``Job.objects.retry_with_payload``), with ``retry_job``.

What an operator reaches for when a job must run once more by hand (a customer's export redone, a
webhook resent) without a shell on a production host. The job is an ordinary job: it keeps the type's
limits, retries and dedupe rules, and the admin's history (LogEntry) records who enqueued it and when.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..exceptions import SqlQueueError
from ..models import Job, JobType
from ..queue import MAX_DELAY_SECONDS

PERMISSION = "django_sqlqueue.enqueue_job"


class EnqueueForm(forms.Form):
    job_type = forms.ChoiceField(label=gettext_lazy("Job type"))
    queue = forms.CharField(label=gettext_lazy("Queue"), max_length=100, initial="default")
    priority = forms.IntegerField(label=gettext_lazy("Priority"), initial=0, min_value=-32768, max_value=32767,
                                  help_text=gettext_lazy("Higher runs first."))
    delay = forms.IntegerField(label=gettext_lazy("Delay (seconds)"), required=False, min_value=0,
                               max_value=MAX_DELAY_SECONDS, help_text=gettext_lazy("Empty: due now."))
    dedupe_key = forms.CharField(label=gettext_lazy("Dedupe key"), max_length=200, required=False,
                                 help_text=gettext_lazy("Optional: no second unfinished job with this key."))
    payload = forms.CharField(label=gettext_lazy("Payload (JSON)"), initial="{}",
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
        try:
            job = Job.objects.enqueue(data["job_type"], data["payload"], queue=data["queue"],
                                      priority=data["priority"], delay=data["delay"] or None,
                                      dedupe_key=data["dedupe_key"] or None)
        except SqlQueueError as exc:  # an invalid payload, queue name or key: nothing was written
            form.add_error(None, str(exc))
        else:
            if job.deduplicated:  # the dedupe rule kept the unfinished job with this key
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


class EditedPayloadForm(forms.Form):
    payload = forms.CharField(label=gettext_lazy("Payload (JSON)"),
                              widget=forms.Textarea(attrs={"rows": 14, "cols": 60, "spellcheck": "false"}))
    token = forms.IntegerField(widget=forms.HiddenInput)

    def clean_payload(self) -> Any:
        try:
            return json.loads(self.cleaned_data["payload"])
        except ValueError as exc:
            raise forms.ValidationError(_("Not JSON: %(error)s") % {"error": exc}) from exc


def changed_keys(old: Any, new: Any) -> list[str]:
    """The top-level keys whose value the edit changed (names only: a value may be a secret)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [] if old == new else ["(the whole payload)"]
    return sorted(k for k in old.keys() | new.keys() if old.get(k, object()) != new.get(k, object()))


def edited_retry_view(request: HttpRequest, modeladmin: Any, object_id: str) -> HttpResponse:
    """The job's payload in a form; on submit, ``retry_with_payload`` with the token the form was read
    at, logged with the keys it changed. Needs ``retry_job``, and ``view_sensitive_job`` when the job's
    type has keys marked sensitive (the form shows the payload in clear)."""
    from .. import sensitive
    from .actions import applies

    if not modeladmin.has_retry_permission(request):
        raise PermissionDenied
    job = modeladmin.get_object(request, object_id)
    if job is None:
        raise Http404(_("No job with id %(id)s.") % {"id": object_id[:30]})
    if sensitive.sensitive_keys(job.job_type.name) and not sensitive.can_view(request.user):
        raise PermissionDenied
    page = reverse("admin:django_sqlqueue_job_change", args=[job.pk])
    if not applies("retry_now", job.state):
        modeladmin.message_user(request, _("%(job)s is %(status)s: it cannot be retried now.") % {
            "job": job, "status": job.state.label}, messages.ERROR)
        return HttpResponseRedirect(page)
    initial = {"payload": json.dumps(job.payload, indent=2, ensure_ascii=False), "token": job.version}
    form = EditedPayloadForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            Job.objects.retry_with_payload(job, form.cleaned_data["token"], form.cleaned_data["payload"])
        except SqlQueueError as exc:  # a stale token, an illegal move, a payload the queue refuses
            form.add_error(None, str(exc))
        else:
            keys = changed_keys(job.payload, form.cleaned_data["payload"])
            note = ("Retried with an edited payload (changed: " + ", ".join(keys) + ")" if keys
                    else "Retried with its payload unchanged")
            LogEntry.objects.log_actions(user_id=request.user.pk, queryset=[job], action_flag=CHANGE,
                                         change_message=note)
            modeladmin.message_user(request, _("%(job)s retried with the edited payload.") % {"job": job},
                                    messages.SUCCESS)
            return HttpResponseRedirect(page)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Retry %(job)s with an edited payload") % {"job": job},
        "opts": modeladmin.model._meta,
        "form": form,
        "job": job,
        "media": modeladmin.media + form.media,
    }
    return TemplateResponse(request, "admin/django_sqlqueue/edited_retry.html", context)
