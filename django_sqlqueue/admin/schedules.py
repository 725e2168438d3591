"""Admin for recurring schedules: list with next runs, the next 5 ticks and recent runs on the change
page, enable / disable, "run now" (needs the ``run_schedule`` permission), and a form that refuses
what a worker could not run (bad cron, unknown zone or target, both or neither of cron / interval).

Saving writes only the fields the form changed (plus ``next_run_at`` when the timing changed or the
schedule is enabled again), so an edit never rewinds what a worker wrote meanwhile.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import schedules, sensitive
from ..conf import get_settings
from ..models import Job, JobType, Schedule, ScheduleRun
from .guard import GuardedChangelist
from .pretty import pretty_json
from .stamps import stamp_column
from .types import status_badge

#: Ticks shown on the change page.
NEXT_RUNS = 5
#: Recent runs shown on the change page.
RECENT_RUNS = 10


def _known_type(name: str) -> bool:
    from ..handlers import registry

    return registry.is_registered(name) or JobType.objects.filter(name=name).exists()


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["name", "enabled", "job_type", "task", "payload", "queue", "priority", "cron", "timezone",
                  "every_seconds", "misfire", "misfire_limit", "misfire_grace_seconds", "expires_after_seconds"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        try:
            schedules.check_timing(data.get("cron") or "", data.get("timezone") or "", data.get("every_seconds"))
        except schedules.ScheduleError as exc:
            raise ValidationError(str(exc)) from None
        # Without the payload field (masked for this user: ScheduleAdmin.get_fieldsets) the stored one is checked.
        payload = data.get("payload") if "payload" in self.fields else self.instance.payload
        try:
            schedules.check_target(data.get("job_type") or "", data.get("task") or "", payload,
                                   data.get("queue") or "", data.get("priority"), known_type=_known_type)
        except schedules.ScheduleError as exc:
            raise ValidationError(str(exc)) from None
        return data


@admin.action(permissions=["change"], description=_("Enable selected schedules"))
def enable_schedules(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    changed = []
    alias = get_settings().DATABASE
    now = schedules.db_clock(alias)
    for schedule in queryset.filter(enabled=False):
        # From now on: a schedule switched off for a week does not count its week as missed ticks.
        try:
            schedule.next_run_at = schedules.first_run(schedules.definition_of(schedule), now)
        except schedules.ScheduleError as exc:
            modeladmin.message_user(request, _("Schedule %(name)s: %(error)s") % {"name": schedule.name, "error": exc},
                                    messages.ERROR)
            continue
        schedule.enabled = True
        schedule.save(update_fields=["enabled", "next_run_at", "updated_at"])
        changed.append(schedule)
    _log(request, changed, "Enabled")
    modeladmin.message_user(request, ngettext("%d schedule enabled.", "%d schedules enabled.", len(changed))
                            % len(changed), messages.SUCCESS)


@admin.action(permissions=["change"], description=_("Disable selected schedules"))
def disable_schedules(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    changed = list(queryset.filter(enabled=True))
    for schedule in changed:
        schedule.enabled = False
        schedule.save(update_fields=["enabled", "updated_at"])
    _log(request, changed, "Disabled")
    modeladmin.message_user(request, ngettext("%d schedule disabled.", "%d schedules disabled.", len(changed))
                            % len(changed), messages.SUCCESS)


@admin.action(permissions=["run"], description=_("Run selected schedules now (one extra job each)"))
def run_schedules_now(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    if not modeladmin.has_run_permission(request):
        raise PermissionDenied
    done = []
    for schedule in queryset:
        try:
            job_id = schedules.run_now(schedule)
        except Exception as exc:  # an unknown type, a task that no longer imports: say so, go on
            modeladmin.message_user(request, _("Schedule %(name)s: %(error)s") % {"name": schedule.name, "error": exc},
                                    messages.ERROR)
            continue
        done.append(schedule)
        modeladmin.message_user(request, format_html('{} {}: <a href="{}">job {}</a> enqueued.', _("Schedule"), schedule.name,
                                                     reverse("admin:django_sqlqueue_job_change", args=[job_id]), job_id),
                                messages.SUCCESS)
    _log(request, done, "Ran now")


def _masked(obj: Schedule) -> Any:
    """The schedule's payload with the keys marked sensitive for the type (or task) it enqueues masked."""
    return sensitive.mask(obj.payload, sensitive.sensitive_keys(obj.job_type or obj.task))


def _log(request: HttpRequest, objects: list[Schedule], what: str) -> None:
    if objects:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=objects, action_flag=CHANGE,
                                     change_message=what, single_object=len(objects) == 1)


class ScheduleAdmin(GuardedChangelist, admin.ModelAdmin):
    form = ScheduleForm
    list_display = ["name", "enabled", "target", "timing", "next_run", "last_run", "last_job_link", "declared_col"]
    list_filter = ["enabled", "declared", "misfire"]
    search_fields = ["name", "job_type", "task"]
    actions = [enable_schedules, disable_schedules, run_schedules_now]
    readonly_fields = ["declared_col", "next_run", "next_runs", "last_run", "last_job_link", "last_error",
                       "recent_runs", "created", "updated", "payload_masked"]
    fieldsets = [
        (None, {"fields": ["name", "enabled", "declared_col"]}),
        (_("What it enqueues"), {"fields": ["job_type", "task", "payload", "queue", "priority"]}),
        (_("When"), {"fields": ["cron", "timezone", "every_seconds", "next_run", "next_runs"]}),
        (_("After downtime and delays"), {"fields": ["misfire", "misfire_limit", "misfire_grace_seconds",
                                                     "expires_after_seconds"]}),
        (_("Runs"), {"fields": ["last_run", "last_job_link", "last_error", "recent_runs", "created", "updated"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The last job's status in the same query (a LEFT JOIN by primary key), without its big columns.
        return super().get_queryset(request).select_related("last_job").defer(
            "last_job__payload", "last_job__response", "last_job__error")

    def get_fieldsets(self, request: HttpRequest, obj: Schedule | None = None) -> Any:
        """The payload masked where it holds keys marked sensitive (:mod:`..sensitive`), unless the user
        may see them. Masked, it is shown read-only and left out of the form: an edit would save the mask."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or sensitive.can_view(request.user) or _masked(obj) == obj.payload:
            return fieldsets
        return [(name, {**opts, "fields": ["payload_masked" if f == "payload" else f for f in opts["fields"]]})
                for name, opts in fieldsets]

    @admin.display(description=_("payload"))
    def payload_masked(self, obj: Schedule) -> SafeString:
        return format_html("{}<p class=\"help\">{}</p>", pretty_json(_masked(obj)),
                           _("Keys marked sensitive are hidden; changing this payload needs the “Can view "
                             "sensitive job data” permission."))

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqlqueue.run_schedule")

    next_run = stamp_column("next_run_at", _("next run at"))
    last_run = stamp_column("last_run_at", _("last run at"))
    created = stamp_column("created_at", _("created at"))
    updated = stamp_column("updated_at", _("updated at"))

    @admin.display(description=_("declared"), ordering="declared")
    def declared_col(self, obj: Schedule) -> str:
        """In words: a red cross read as an error; not being declared in the settings is not one."""
        return str(_("in the settings") if obj.declared else _("made in the admin"))

    @admin.display(description=_("enqueues"))
    def target(self, obj: Schedule) -> str:
        return obj.task or obj.job_type

    @admin.display(description=_("when"))
    def timing(self, obj: Schedule) -> str:
        return f"{obj.cron} ({obj.timezone})" if obj.cron else f"every {obj.every_seconds} s"

    @admin.display(description=_("last job"))
    def last_job_link(self, obj: Schedule) -> SafeString:
        if obj.last_job_id is None:
            return format_html("{}", "—")
        try:
            job = obj.last_job
        except Job.DoesNotExist:  # purged (no constraint keeps it)
            job = None
        if job is None:
            return format_html('{} <span class="quiet">({})</span>', obj.last_job_id, _("purged"))
        return format_html('<a href="{}">{}</a> {}', reverse("admin:django_sqlqueue_job_change", args=[job.pk]),
                           job.pk, status_badge(job.status_id))

    @admin.display(description=_("next runs"))
    def next_runs(self, obj: Schedule) -> SafeString:
        if obj.pk is None or obj.next_run_at is None:
            return format_html("{}", "—")
        try:
            defn = schedules.definition_of(obj)
            ticks = schedules.upcoming(defn, obj.next_run_at, NEXT_RUNS)
        except schedules.ScheduleError as exc:
            return format_html("{}", exc)
        zone = defn.zone
        return format_html("<ol>{}</ol>", format_html_join(
            "", "<li>{} UTC ({} {})</li>",
            ((t.strftime("%Y-%m-%d %H:%M:%S"), t.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z"), defn.timezone)
             for t in ticks)))

    @admin.display(description=_("recent runs"))
    def recent_runs(self, obj: Schedule) -> SafeString:
        if obj.pk is None:
            return format_html("{}", "—")
        runs = list(ScheduleRun.objects.filter(schedule=obj).order_by("-tick_at")[:RECENT_RUNS])
        if not runs:
            return format_html("{}", _("none yet"))
        statuses = dict(Job.objects.filter(pk__in=[r.job_id for r in runs if r.job_id]).values_list("id", "status_id"))
        return format_html("<ol>{}</ol>", format_html_join(
            "", '<li>{} UTC: <a href="{}">job {}</a> {}</li>',
            ((r.tick_at.strftime("%Y-%m-%d %H:%M:%S"), reverse("admin:django_sqlqueue_job_change", args=[r.job_id]),
              r.job_id, status_badge(statuses.get(r.job_id))) for r in runs if r.job_id)))

    def save_model(self, request: HttpRequest, obj: Schedule, form: forms.ModelForm, change: bool) -> None:
        alias = get_settings().DATABASE
        timing_changed = any(f in form.changed_data for f in schedules.ScheduleDef.TIMING)
        enabled_again = change and "enabled" in form.changed_data and obj.enabled
        if not change or timing_changed or enabled_again or obj.next_run_at is None:
            obj.next_run_at = schedules.first_run(schedules.definition_of(obj), schedules.db_clock(alias))
        if not change:
            obj.save()
        else:
            obj.last_error = "" if timing_changed else obj.last_error
            fields = [*form.changed_data, "next_run_at", "last_error", "updated_at"]
            obj.save(update_fields=list(dict.fromkeys(fields)))
        if obj.enabled:
            self._warn_if_unserved(request, obj)

    def _warn_if_unserved(self, request: HttpRequest, obj: Schedule) -> None:
        """Saved, but said: a queue (and type) no live worker serves would fill up without a word."""
        from django.utils import timezone

        from ..ops import health

        live = health.live_workers(timezone.now(), get_settings().DATABASE)
        if obj.task:  # a task's job type is named by the backend: the queue alone decides here
            served = any(not w.queues or obj.queue in w.queues for w in live)
        else:
            served = any(health.serves(w, obj.queue, obj.job_type) for w in live)
        if not served:
            self.message_user(request, _("No live worker serves queue %(queue)s%(type)s now: the jobs of schedule "
                                         "%(name)s will wait until one that does starts.") % {
                "queue": obj.queue, "name": obj.name,
                "type": (_(" and type %(type)s") % {"type": obj.job_type}) if obj.job_type else ""},
                messages.WARNING)


admin.site.register(Schedule, ScheduleAdmin)
