"""Admin for job types (settings, pause / resume, counts by status) and workers (stale heartbeats)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..conf import get_settings
from ..dialects.predicates import index_predicate
from ..models import Job, JobType, Worker
from ..ops.health import status_counts
from ..states import Status, human_label, sql_list  # noqa: F401 (human_label: also imported from here)
from .filters import CheckedFilter, refuse
from .guard import GuardedChangelist
from .stamps import ago, stamp, stamp_column
from .views import changelist_url


def status_badge(status_id: int | None) -> SafeString:
    """A coloured badge for a status id (the label comes from the code: no join, no query)."""
    if status_id is None:
        return format_html("{}", "—")
    status = Status(status_id)
    return format_html('<span class="sqlqueue-badge sqlqueue-{}">{}</span>', status.label.lower(), human_label(status))


def counts_by_status(type_ids: list[int]) -> dict[int, dict[int, int]]:
    """{type id: {status id: jobs}} in one GROUP BY over the (status, type, queue) index.

    One type (its page): every status, as a literal list, bounds the index's first column, so each
    (status, type) is a seek of that type's entries (11 ms at 1M jobs on PostgreSQL, against 35 ms for
    a walk of the whole index; on SQLite with no statistics, the walk). A page of types reads most of
    the index anyway, and there the list is a test per entry (163 ms against 97 ms), so it is left out.
    """
    counts: dict[int, dict[int, int]] = defaultdict(dict)
    rows = Job.objects.filter(job_type_id__in=type_ids)
    if len(type_ids) == 1:
        rows = rows.filter(index_predicate(Job.objects.db, "status", f"IN ({sql_list(Status)})"))
    for status_id, type_id, n in status_counts(rows, "status_id", "job_type_id"):
        counts[type_id][status_id] = n
    return counts


def render_counts(type_id: int, counts: dict[int, int]) -> SafeString:
    if not counts:
        return format_html('<span class="quiet">{}</span>', _("no jobs"))
    return format_html_join(
        " ", '<a class="sqlqueue-badge sqlqueue-{}" href="{}">{}&nbsp;{}</a>',
        ((Status(s).label.lower(), changelist_url(type=type_id, status=s), human_label(s), n)
         for s, n in sorted(counts.items())))


def _setting(value: Any, default: Any, unit: str = "") -> SafeString:
    if value is None:
        return format_html('<span class="quiet">{}{} ({})</span>', default, unit, _("default"))
    return format_html("{}{}", value, unit)


@admin.action(permissions=["pause"], description=_("Pause selected job types"))
def pause_types(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    _set_paused(modeladmin, request, queryset, True)


@admin.action(permissions=["pause"], description=_("Resume selected job types"))
def resume_types(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> None:
    _set_paused(modeladmin, request, queryset, False)


def _set_paused(modeladmin: Any, request: HttpRequest, queryset: QuerySet, paused: bool) -> None:
    if not modeladmin.has_pause_permission(request):
        raise PermissionDenied
    changed = []
    for jt in queryset.filter(paused=not paused):
        jt.paused = paused
        jt.save(update_fields=["paused", "updated_at"])  # post_save clears the workers' type cache
        changed.append(jt)
    if changed:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=changed, action_flag=CHANGE,
                                     change_message="Paused" if paused else "Resumed")
    verb = _("paused") if paused else _("resumed")
    modeladmin.message_user(request, ngettext("%(n)d job type %(verb)s.", "%(n)d job types %(verb)s.",
                                              len(changed)) % {"n": len(changed), "verb": verb},
                            messages.SUCCESS)


class JobTypeAdmin(GuardedChangelist, admin.ModelAdmin):
    list_display = ("name", "paused_flag", "max_attempts_col", "backoff_col", "timeout_col", "lease_col",
                    "limits_col", "code_drift", "job_counts", "updated")
    list_filter = ("paused",)
    search_fields = ("name",)
    actions = [pause_types, resume_types]
    fields = ("name", "description", "paused", "max_attempts", "backoff_base_seconds", "backoff_max_seconds",
              "timeout_seconds", "lease_seconds", "concurrency_limit", "rate_limit", "limit_usage", "code_drift",
              "job_counts", "created", "updated")
    readonly_fields = ("limit_usage", "code_drift", "job_counts", "created", "updated")
    created = stamp_column("created_at", _("created at"))
    updated = stamp_column("updated_at", _("updated at"))

    class Media:
        css = {"all": ["django_sqlqueue/admin.css"]}

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_sqlqueue.pause_job")

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[list[Any], dict[str, int], set[str], list[Any]]:
        """Refuse up front, with the real reason, to delete a type that still has jobs.

        Django's collector would walk every job of the type (slow for a busy type) and then report
        a missing permission (jobs are not deletable here) rather than the protection.
        """
        from .views import COUNT_CAP

        protected = []
        for jt in objs:
            n = Job.objects.filter(job_type_id=jt.pk).order_by()[: COUNT_CAP + 1].count()  # FK index seek
            if n:
                protected.append(_("%(name)s: %(n)s job(s) — a job type with jobs cannot be deleted; purge its "
                                   "finished jobs (manage.py purge_queue) or pause the type instead") % {
                    "name": jt.name, "n": f"more than {COUNT_CAP}" if n > COUNT_CAP else n})
        if protected:
            return [], {}, set(), protected
        return super().get_deleted_objects(objs, request)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        fields = tuple(self.readonly_fields)
        if obj is not None:
            fields += ("name",)  # handlers are registered under this name
        if not self.has_pause_permission(request):
            fields += ("paused",)
        return fields

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        response = super().changelist_view(request, extra_context)
        cl = getattr(response, "context_data", {}).get("cl") if isinstance(response, TemplateResponse) else None
        if cl is not None:
            rows = list(cl.result_list)  # evaluates and caches the page: the template reuses these objects
            counts = counts_by_status([r.pk for r in rows])
            for row in rows:
                row._sqlqueue_counts = counts.get(row.pk, {})
        return response

    @admin.display(description=_("paused"), ordering="paused")
    def paused_flag(self, obj: JobType) -> SafeString:
        # Words, not Django's red x for False: "not paused" is the healthy state, not an error.
        if obj.paused:
            return format_html('<span class="sqlqueue-badge sqlqueue-paused">{}</span>', _("paused"))
        return format_html('<span class="quiet">{}</span>', _("running"))

    @admin.display(description=_("max attempts"))
    def max_attempts_col(self, obj: JobType) -> SafeString:
        return _setting(obj.max_attempts, get_settings().MAX_ATTEMPTS)

    @admin.display(description=_("backoff"))
    def backoff_col(self, obj: JobType) -> SafeString:
        s = get_settings()
        return format_html("{} … {}", _setting(obj.backoff_base_seconds, s.BACKOFF_BASE_SECONDS, " s"),
                           _setting(obj.backoff_max_seconds, s.BACKOFF_MAX_SECONDS, " s"))

    @admin.display(description=_("timeout"))
    def timeout_col(self, obj: JobType) -> SafeString:
        return _setting(obj.timeout_seconds, get_settings().TIMEOUT_SECONDS, " s")

    @admin.display(description=_("lease"))
    def lease_col(self, obj: JobType) -> SafeString:
        return _setting(obj.lease_seconds, get_settings().LEASE_SECONDS, " s")

    @admin.display(description=_("limit"))
    def limits_col(self, obj: JobType) -> SafeString:
        if obj.concurrency_limit is not None:
            return format_html("{}", _("%(n)s at once") % {"n": obj.concurrency_limit})
        if obj.rate_limit:
            return format_html("{}", obj.rate_limit)
        return format_html('<span class="quiet">{}</span>', _("none"))

    @admin.display(description=_("limit in use"))
    def limit_usage(self, obj: JobType) -> SafeString:
        """How many permits are held now, per key (the busiest 20), and the handler's key (docs/limits.md)."""
        from ..handlers import registry
        from ..limits import usage

        if obj.pk is None or (obj.concurrency_limit is None and not obj.rate_limit):
            return format_html('<span class="quiet">{}</span>', _("no limit"))
        found = registry.declared(obj.name)
        key = getattr(found, "concurrency_key", None) if found is not None else None
        key_text = (_("per key: %(k)s (the handler's concurrency_key)") % {"k": key if isinstance(key, str)
                                                                          else getattr(key, "__name__", "a callable")}
                    if key is not None else _("one limit for the whole type (unless enqueued with a concurrency_key)"))
        rows = usage(obj)
        lines = format_html_join(mark_safe("<br>"), "{}: {} / {}", ((k or _("(no key)"), held, slots)
                                                                  for k, held, slots in rows))
        return format_html("{}<br>{}", key_text, lines or _("no permits held"))

    @admin.display(description=_("code"))
    def code_drift(self, obj: JobType) -> SafeString:
        """Where this row and the handler's options disagree (handlers.compare; no query)."""
        from ..handlers import compare, registry

        options = registry.options_for(obj.name) if obj.pk is not None else None
        if options is None:
            return format_html('<span class="quiet">{}</span>', _("no handler in this process"))
        drift = compare(obj, options)
        lines = [(key, value, code, _("changed by an operator; the row wins (blank it to follow the code)"))
                 for key, (value, code) in drift.operator.items()]
        lines += [(key, getattr(obj, key), code, _("not applied yet: migrate or a worker's start writes it"))
                  for key, code in drift.follow.items()]
        if not lines:
            return format_html('<span class="quiet">{}</span>', _("as in the code"))
        return format_html_join(
            mark_safe("<br>"), '<span class="sqlqueue-drift">{}: {} (code: {}) — {}</span>', lines)

    @admin.display(description=_("jobs by status"))
    def job_counts(self, obj: JobType) -> SafeString:
        if obj.pk is None:
            return format_html("{}", "—")
        counts = getattr(obj, "_sqlqueue_counts", None)
        if counts is None:  # the change page: one query for this type
            counts = counts_by_status([obj.pk]).get(obj.pk, {})
        return render_counts(obj.pk, counts)


class WorkerStateFilter(CheckedFilter, admin.SimpleListFilter):
    """Alive, stale (heartbeat older than WORKER_DEAD_AFTER_SECONDS, not stopped) or stopped.

    The worker table holds one row per worker process: small, so no index is needed.
    """

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("alive", _("Alive")), ("stale", _("Stale heartbeat")), ("stopped", _("Stopped"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        cutoff = timezone.now() - timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS)
        value = self.value()
        if value == "alive":
            return queryset.filter(stopped_at__isnull=True, last_heartbeat__gte=cutoff)
        if value == "stale":
            return queryset.filter(stopped_at__isnull=True, last_heartbeat__lt=cutoff)
        if value == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        return queryset

    def clean(self, value: str) -> str:
        if value not in ("alive", "stale", "stopped"):
            refuse(self.parameter_name, value, "the choices are alive, stale and stopped")
        return value


class WorkerAdmin(GuardedChangelist, admin.ModelAdmin):
    list_display = ("name", "state", "host", "pid", "started", "heartbeat", "jobs_done", "held_jobs", "stopped")
    list_filter = (WorkerStateFilter,)
    search_fields = ("name", "host")
    ordering = ("stopped_at", "-last_heartbeat")
    fields = ("name", "host", "pid", "started", "heartbeat", "stopped", "jobs_done", "state", "held_jobs")
    readonly_fields = fields
    started = stamp_column("started_at", _("started at"))
    stopped = stamp_column("stopped_at", _("stopped at"))

    class Media:
        css = {"all": ["django_sqlqueue/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers register themselves

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # their heartbeats write these rows

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        response = super().changelist_view(request, extra_context)
        cl = getattr(response, "context_data", {}).get("cl") if isinstance(response, TemplateResponse) else None
        if cl is not None:
            rows = list(cl.result_list)
            held = dict(Job.objects.filter(Q(status_id=Status.PROCESSING), worker__in=[w.name for w in rows])
                        .order_by().values("worker").annotate(n=Count("*")).values_list("worker", "n"))
            for row in rows:
                row._sqlqueue_held = held.get(row.name, 0)
        return response

    @admin.display(description=_("state"))
    def state(self, obj: Worker) -> SafeString:
        if obj.stopped_at is not None:
            return format_html('<span class="sqlqueue-badge sqlqueue-stopped">{}</span>', _("stopped"))
        if timezone.now() - obj.last_heartbeat > timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS):
            return format_html('<span class="sqlqueue-badge sqlqueue-stale" title="{}">{}</span>',
                               _("No heartbeat for longer than WORKER_DEAD_AFTER_SECONDS: presumed dead; its "
                                 "jobs are reclaimed."), _("stale"))
        return format_html('<span class="sqlqueue-badge sqlqueue-alive">{}</span>', _("alive"))

    @admin.display(description=_("last heartbeat"), ordering="last_heartbeat")
    def heartbeat(self, obj: Worker) -> SafeString:
        return format_html("{} <span class=\"sqlqueue-hint\">{}</span>",
                           stamp(obj.last_heartbeat), _("%s ago") % ago(obj.last_heartbeat))

    @admin.display(description=_("running jobs"))
    def held_jobs(self, obj: Worker) -> SafeString:
        n = getattr(obj, "_sqlqueue_held", None)
        if n is None:
            n = Job.objects.filter(status_id=Status.PROCESSING, worker=obj.name).count()
        url = changelist_url(worker=obj.name, status=int(Status.PROCESSING))
        gone = obj.stopped_at is not None or (
            timezone.now() - obj.last_heartbeat > timedelta(seconds=get_settings().WORKER_DEAD_AFTER_SECONDS))
        if n and gone:  # a stopped or stale worker holding jobs: they are orphaned until reclaimed or requeued
            return format_html('<a class="sqlqueue-badge sqlqueue-failed" href="{}" title="{}">{} {}</a>', url,
                               _("This worker is gone but these jobs are still Processing: a live worker "
                                 "serving them takes them over, or Requeue them."), n, _("orphaned"))
        return format_html('<a href="{}">{}</a>', url, n)
