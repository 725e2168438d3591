"""The operator's admin: jobs (list, detail, actions), job types, workers and a dashboard.

Built for a job table with millions of rows: the list never counts the whole table, every filter is
served by an index, and no page loops over jobs in Python. Jobs are only ever changed through
:meth:`JobManager.modify` (see :mod:`django_sqlqueue.admin_actions`); their fields are read-only here.
See docs/admin.md.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.db.models.functions import Right
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import sensitive
from ..conf import get_settings
from ..dialects.predicates import has_error
from ..models import Job, JobAttempt, JobType, Worker
from ..ops import health
from ..states import CLAIMABLE, FINISHED, Status, human_label
from . import actions as admin_actions
from . import enqueue as admin_enqueue
from . import workflows as admin_workflows
from .filters import (
    BatchFilter,
    CheapPaginator,
    HasErrorFilter,
    JobTypeFilter,
    LeaseExpiredFilter,
    OrphanedFilter,
    OverdueFilter,
    QueueFilter,
    StatusFilter,
    StepFilter,
    WorkerFilter,
    check_date_hierarchy,
    date_hierarchy_context,
    parse_id,
)
from .guard import GuardedChangelist
from .paging import KeysetWalk
from .pretty import PRETTY_JSON_DEPTH, PRETTY_JSON_LIMIT, pretty_json  # noqa: F401 (also imported from here)
from .stamps import STAMP_FORMAT, ago, short_stamp, stamp, until  # noqa: F401 (also imported from here)
from .subtypes import ReadOnlyJobInline, subtype_inlines_for
from .throughput import throughput_view
from .triage import error_message, triage_view
from .types import JobTypeAdmin, WorkerAdmin, status_badge
from .views import dashboard_json_view, dashboard_view

#: Characters of the error shown in the list (the rest stays in the database until the job is opened).
ERROR_EXCERPT_CHARS = 120
def ellipsize(text: str, limit: int) -> str:
    """``text`` cut at a word boundary within ``limit`` characters, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,.;:") + "…"


def human_ms(ms: int | None) -> str:
    if ms is None:
        return "—"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


class JobAttemptInline(ReadOnlyJobInline, admin.TabularInline):
    """The job's attempt history, one row per claim, read-only."""

    model = JobAttempt
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("attempt_num",)
    fields = ("attempt_no", "step_at", "worker", "claimed", "finished", "outcome_badge", "duration", "error_text")
    readonly_fields = fields
    verbose_name_plural = _("attempt history")
    classes = ["sqlqueue-attempts"]

    @admin.display(description=_("claimed"))
    def claimed(self, obj: JobAttempt) -> str:
        return stamp(obj.claimed_at)

    @admin.display(description=_("attempt"))
    def attempt_no(self, obj: JobAttempt) -> str:
        return f"#{obj.attempt_num}"

    @admin.display(description=_("step"))
    def step_at(self, obj: JobAttempt) -> str:
        """The step the attempt began at, or, for an attempt that ended in an error, failed at."""
        return obj.step or "—"

    @admin.display(description=_("finished"))
    def finished(self, obj: JobAttempt) -> str:
        return stamp(obj.finished_at)

    @admin.display(description=_("outcome"))
    def outcome_badge(self, obj: JobAttempt) -> SafeString:
        if obj.outcome_id is None:
            return format_html('<span class="sqlqueue-badge sqlqueue-running">{}</span>',
                               _("running") if obj.finished_at is None else "—")
        return status_badge(obj.outcome_id)

    @admin.display(description=_("duration"))
    def duration(self, obj: JobAttempt) -> str:
        return human_ms(obj.duration_ms)

    @admin.display(description=_("error"))
    def error_text(self, obj: JobAttempt) -> SafeString | str:
        if not obj.error:
            return ""
        return format_html('<details class="sqlqueue-attempt-error"><summary>{}</summary><pre>{}</pre></details>',
                           ellipsize(error_message(obj.error), ERROR_EXCERPT_CHARS), obj.error)

#: Sorts an index of the whole job table serves (the primary key; the (finished_at, status) index).
INDEXED_SORTS = frozenset({"pk", "id", "finished_at"})
#: Any other sort orders the newest this-many jobs that match the list's filters.
SORT_WINDOW = 10_000


class JobChangeList(KeysetWalk, ChangeList):
    """The list reads an excerpt of the error and neither payload nor response (they may be large), and
    walks past the numbered pages by id (:mod:`.paging`)."""

    def get_filters(self, request: HttpRequest) -> Any:
        if self.date_hierarchy:
            check_date_hierarchy(self.date_hierarchy, self.filter_params)
        return super().get_filters(request)

    #: Set by :meth:`get_results` when the list is sorted by a column no index orders: the page then
    #: sorts the newest this-many jobs the filters match (a top-N sort of a bounded set), and says so.
    sort_window: int | None = None
    #: True when sorted by finish time: the jobs without one (unfinished) are left out, and it says so.
    finished_only: bool = False

    def get_ordering_field(self, field_name: Any) -> Any:
        # Django sorts by any list column given in ?o=, sortable_by only hides the header's link: a
        # column that does not sort does not, whatever the URL says.
        if isinstance(field_name, str) and field_name not in self.model_admin.sortable_by:
            return None
        return super().get_ordering_field(field_name)

    @staticmethod
    def first_order(qs: QuerySet) -> str:
        first = next(iter(qs.query.order_by), "-pk")
        return first.lstrip("-") if isinstance(first, str) else ""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        qs = super().get_queryset(request, exclude_parameters)
        if self.first_order(qs) == "finished_at":
            # The (finished_at, status) index orders the finished jobs; the unfinished ones (no finish
            # time) would be one tie to sort by id first, and are not what this order is asked for.
            qs = qs.filter(finished_at__isnull=False)
            self.finished_only = True
        # The end of a traceback says what went wrong: read only that much of the error.
        return qs.defer("payload", "response", "error").annotate(error_tail=Right("error", ERROR_EXCERPT_CHARS))

    def get_results(self, request: HttpRequest) -> None:
        """The page (in a bounded window when no index orders the sort), then the page's orphaned
        Processing jobs flagged: one read of the (small) worker table per page."""
        order = self.first_order(self.queryset)
        if order not in INDEXED_SORTS:
            # priority, scheduled for, attempts: an index of their own on the job table would cost every
            # enqueue, claim and finish a write. The page sorts the newest SORT_WINDOW matches: the id
            # where they begin is one walk of the primary key (or the filter's index) backwards, then a
            # key range. Only the page: an action's "select all" still means every match.
            edge = list(self.queryset.order_by("-pk").values_list("pk", flat=True)[SORT_WINDOW - 1:SORT_WINDOW])
            if edge:
                self.queryset = self.queryset.filter(pk__gte=edge[0])
            self.sort_window = SORT_WINDOW
        super().get_results(request)
        if order not in ("pk", "id"):  # the older/newer walk goes by id: it has no place in another order
            self.older_url = self.newer_url = None
        from ..limits import explain_many

        # Why a due job of a limited type waits: one read of the page's scopes' permits.
        for job, why in explain_many(self.result_list).items():
            job._sqlqueue_limit_wait = why
        running = [job for job in self.result_list if job.status_id == Status.PROCESSING]
        if not running:
            return
        now = timezone.now()
        dead = set(Worker.objects.filter(health.dead_q(now), name__in={j.worker for j in running})
                   .values_list("name", flat=True))
        for job in running:
            job._sqlqueue_orphan = (job.lease_expires_at is not None and job.lease_expires_at < now) or (
                job.worker in dead)


@admin.register(Job)
class JobAdmin(GuardedChangelist, admin_actions.JobActionPermissions, admin.ModelAdmin):
    # "started" is on the job page (and "duration" here), the step under the type: the list keeps to 1,400 px.
    list_display = ("id", "type_col", "queue", "status_col", "priority_col", "attempts_col", "scheduled",
                    "finished_col", "duration", "worker", "error_excerpt")
    list_display_links = ("id",)
    list_filter = (StatusFilter, JobTypeFilter, QueueFilter, StepFilter, WorkerFilter, OverdueFilter,
                   LeaseExpiredFilter, OrphanedFilter, HasErrorFilter, BatchFilter)
    list_select_related = ("job_type",)
    list_per_page = 100
    ordering = ("-id",)
    # Id and finish time are index orders; priority, scheduled for and attempts sort the newest
    # SORT_WINDOW matches of the filters (JobChangeList.get_queryset), and the page says so.
    sortable_by = ("id", "priority_col", "attempts_col", "scheduled", "finished_col")
    date_hierarchy = "enqueued_at"
    search_fields = ("=id", "=dedupe_key", "error")  # the search itself is get_search_results
    search_help_text = _("A job id, a dedupe key (exact), key=value in the payload (to=a@example.com, "
                         "user.id=7), or text in the error.")
    show_full_result_count = False
    empty_value_display = "—"
    show_facets = admin.ShowFacets.NEVER
    paginator = CheapPaginator
    actions = admin_actions.JOB_ACTIONS
    action_batch_limit = admin_actions.ACTION_BATCH_LIMIT
    inlines = [JobAttemptInline]
    fieldsets = (
        (None, {"fields": ("id", "type_link", "queue", "status_col", "step", "priority", "diagnosis")}),
        (_("Attempts"), {"fields": ("attempts", "worker", "started_full", "finished", "duration", "lease",
                                    "operator_actions", "cancel_requests")}),
        (_("Schedule"), {"fields": ("enqueued", "scheduled_full", "updated", "version", "dedupe_key")}),
        (_("Data"), {"fields": ("payload_pretty", "response_pretty", "error_traceback")}),
        (_("Workflow"), {"fields": ("waits_for", "waited_by", "batch_col")}),
    )
    readonly_fields = ("id", "type_link", "queue", "status_col", "step", "priority", "diagnosis", "attempts",
                       "worker", "started_full", "finished", "duration", "lease", "enqueued", "scheduled_full", "updated",
                       "version", "dedupe_key", "payload_pretty", "response_pretty", "error_traceback",
                       "payload_masked", "response_masked", "operator_actions", "cancel_requests", "waits_for",
                       "waited_by", "batch_col")
    #: Shown instead to a user without "Can view sensitive job data" (see :mod:`.sensitive`).
    masked_fields = {"payload_pretty": "payload_masked", "response_pretty": "response_masked"}

    class Media:
        css = {"all": ["django_sqlqueue/admin.css"]}

    # ----- permissions: jobs are read-only here; actions change them through modify ------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a form save would write stale lifecycle columns over a worker's

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retention is purge_queue's job, in batches

    # ----- list -------------------------------------------------------------------------------------
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        """An id (digits, optionally ``#``), else a dedupe key, else text in the error.

        Id and dedupe key are index seeks; error text is a scan of the jobs that have an error
        (narrowed by the has-error partial index): add a filter (status, type, date) on large tables.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = parse_id(term.lstrip("#"))  # ASCII digits within 64 bits ("²" is a digit to isdigit())
        if job_id is not None:
            return queryset.filter(Q(pk=job_id) | Q(dedupe_key=term)), False
        if queryset.model.objects.filter(dedupe_key=term).exists():  # one seek: a key is exact, stop here
            return queryset.filter(dedupe_key=term), False
        payload = payload_condition(term, request.user)
        if payload is not None:
            return queryset.filter(payload), False
        return queryset.filter(has_error(queryset.db), error__icontains=term), False

    def action_checkbox(self, obj: Job) -> SafeString:
        """Django's checkbox (written out: its widget template, rendered per row, is slow) plus the token.

        The version the operator sees travels with the selection: a job changed since is refused.
        """
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">'
            '<input type="hidden" name="{}{}" value="{}">',
            helpers.ACTION_CHECKBOX_NAME, obj.pk, _("Select this object for an action - %s") % obj,
            admin_actions.TOKEN_PREFIX, obj.pk, obj.version)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        response = super().changelist_view(request, extra_context)
        if isinstance(response, TemplateResponse) and "cl" in (response.context_data or {}):
            response.context_data["sqlqueue_date_hierarchy"] = date_hierarchy_context(response.context_data["cl"])
            response.context_data["sqlqueue_may_enqueue"] = request.user.has_perm(admin_enqueue.PERMISSION)
        return response

    @admin.display(description=_("type / step"))
    def type_col(self, obj: Job) -> SafeString | str:
        """The type, and under it the step the job is at, if any (one column: the list keeps to 1,400 px;
        the step filter and the job page show it too)."""
        if not obj.step:
            return obj.job_type.name
        return format_html('{}<br><span class="sqlqueue-step" title="{}">{}</span>', obj.job_type.name,
                           _("step"), obj.step)

    @admin.display(description=_("status"))
    def status_col(self, obj: Job) -> SafeString:
        if getattr(obj, "_sqlqueue_orphan", False):
            return format_html('{} <span class="sqlqueue-badge sqlqueue-failed" title="{}">{}</span>',
                               status_badge(obj.status_id),
                               _("Its worker is stopped or stale, or its lease expired: Requeue it, or a live "
                                 "worker serving it takes it over."), _("orphaned"))
        if getattr(obj, "_sqlqueue_limit_wait", None):
            return format_html('{} <span class="sqlqueue-badge sqlqueue-pending" title="{}">{}</span>',
                               status_badge(obj.status_id), obj._sqlqueue_limit_wait, _("held by limit"))
        return status_badge(obj.status_id)

    @admin.display(description=_("attempts"))
    def attempts(self, obj: Job) -> str:
        return f"{obj.attempt_num} / {effective_max_attempts(obj)}"

    @admin.display(description=_("prio."), ordering="priority")
    def priority_col(self, obj: Job) -> int:
        """The list's priority column: a short header (the list keeps to 1,400 px)."""
        return obj.priority

    # Not "attempts" in the list: Django would take that name for the job's reverse relation to its
    # history rows and sort by a join.
    @admin.display(description=_("attempts"), ordering="attempt_num")
    def attempts_col(self, obj: Job) -> str:
        return self.attempts(obj)

    @admin.display(description=_("scheduled for"), ordering="scheduled_for")
    def scheduled(self, obj: Job) -> SafeString:
        return format_html("{} {}", short_stamp(obj.scheduled_for), self._due_hint(obj))

    @admin.display(description=_("scheduled for"))
    def scheduled_full(self, obj: Job) -> SafeString:
        return format_html("{} {}", stamp(obj.scheduled_for), self._due_hint(obj))

    def _due_hint(self, obj: Job) -> SafeString | str:
        """"in 5 minutes" / "overdue 3 minutes" for a job a worker may claim; nothing otherwise."""
        when = obj.scheduled_for
        if not when or obj.state not in CLAIMABLE:
            return ""
        now = timezone.now()
        if when > now:
            return format_html('<span class="sqlqueue-hint">{}</span>', until(when, now))
        if now - when < timedelta(minutes=1):
            return format_html('<span class="sqlqueue-hint">{}</span>', _("due now"))
        return format_html('<span class="sqlqueue-hint sqlqueue-overdue">{}</span>',
                           _("overdue %s") % ago(when, now))

    @admin.display(description=_("started"))
    def started(self, obj: Job) -> SafeString | str:
        return short_stamp(obj.started_at)

    @admin.display(description=_("started"))
    def started_full(self, obj: Job) -> str:
        """The job page: the full stamp, as "finished" beside it (the list's short form is for the list)."""
        return stamp(obj.started_at)

    @admin.display(description=_("finished"))
    def finished(self, obj: Job) -> str:
        return stamp(obj.finished_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished_col(self, obj: Job) -> SafeString | str:
        return short_stamp(obj.finished_at)

    @admin.display(description=_("enqueued"))
    def enqueued(self, obj: Job) -> str:
        return stamp(obj.enqueued_at)

    @admin.display(description=_("updated"))
    def updated(self, obj: Job) -> str:
        return stamp(obj.updated_at)

    @admin.display(description=_("lease expires"))
    def lease(self, obj: Job) -> SafeString | str:
        if obj.lease_expires_at is None:
            return "—"
        now = timezone.now()
        if obj.lease_expires_at < now:
            return format_html('{} <span class="sqlqueue-hint sqlqueue-overdue">{}</span>', stamp(obj.lease_expires_at),
                               _("expired %s ago") % ago(obj.lease_expires_at, now))
        return format_html('{} <span class="sqlqueue-hint">{}</span>', stamp(obj.lease_expires_at),
                           until(obj.lease_expires_at, now))

    @admin.display(description=_("duration"))
    def duration(self, obj: Job) -> str:
        if obj.state == Status.PROCESSING and obj.started_at:
            return _("running %s") % ago(obj.started_at, timezone.now())
        return human_ms(obj.duration_ms)

    @admin.display(description=_("error"))
    def error_excerpt(self, obj: Job) -> SafeString | str:
        text = getattr(obj, "error_tail", None)
        if text is None:
            text = obj.error[-ERROR_EXCERPT_CHARS:]
        message = error_message(text)  # "SMTPError: 554 rejected", not "smtplib.SMTPError: ..."
        if not message:
            return ""
        return format_html('<span class="sqlqueue-error-excerpt" title="{}">{}</span>', text, message)

    # ----- detail -----------------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).select_related("job_type")

    def get_inline_instances(self, request: HttpRequest, obj: Job | None = None) -> list[Any]:
        instances = super().get_inline_instances(request, obj)
        type_name = obj.job_type.name if obj is not None else None
        for cls in subtype_inlines_for(obj, type_name):
            inline = cls(self.model, self.admin_site)
            if inline.has_view_or_change_permission(request, obj):
                instances.append(inline)
        return instances

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> Any:
        extra_context = dict(extra_context or {})
        obj = self.get_object(request, object_id)
        if obj is not None:
            # get_action_choices: (name, description) pairs on Django 6.0 and 6.1 alike
            orphan = health.is_orphan(obj, timezone.now())
            extra_context["sqlqueue_actions"] = [
                (name, desc) for name, desc in self.get_action_choices(request, default_choices=[])
                if admin_actions.applies(name, obj.state) and (name != "requeue" or orphan)]
            extra_context["sqlqueue_job"] = obj
            if (self.has_retry_permission(request) and admin_actions.applies("retry_now", obj.state)
                    and (sensitive.can_view(request.user) or not sensitive.sensitive_keys(obj.job_type.name))):
                extra_context["sqlqueue_edited_retry_url"] = reverse("admin:django_sqlqueue_job_edited_retry",
                                                                     args=[obj.pk])
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description=_("type"))
    def type_link(self, obj: Job) -> SafeString:
        url = reverse("admin:django_sqlqueue_jobtype_change", args=[obj.job_type_id])
        return format_html('<a href="{}">{}</a>', url, obj.job_type.name)

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        """The payload and response masked where marked sensitive, unless the user may see them."""
        fieldsets = super().get_fieldsets(request, obj)
        if sensitive.can_view(request.user):
            return fieldsets
        return [(name, {**opts, "fields": tuple(self.masked_fields.get(f, f) for f in opts["fields"])})
                for name, opts in fieldsets]

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: Job) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description=_("response"))
    def response_pretty(self, obj: Job) -> SafeString:
        return pretty_json(obj.response)

    @admin.display(description=_("payload"))
    def payload_masked(self, obj: Job) -> SafeString:
        return pretty_json(sensitive.mask(obj.payload, sensitive.sensitive_keys(obj.job_type.name)))

    @admin.display(description=_("response"))
    def response_masked(self, obj: Job) -> SafeString:
        return pretty_json(sensitive.mask(obj.response, sensitive.sensitive_keys(obj.job_type.name)))

    @admin.display(description=_("error"))
    def error_traceback(self, obj: Job) -> SafeString:
        if not obj.error:
            return format_html('<span class="quiet">{}</span>', "—")
        return format_html('<pre class="sqlqueue-traceback">{}</pre>', obj.error)

    @admin.display(description=_("cancel requests"))
    def cancel_requests(self, obj: Job) -> SafeString:
        """Requests to stop a running attempt: who, when, why, and what became of that attempt (a request
        whose attempt ended otherwise, e.g. Completed first, came too late)."""
        from django.utils.html import format_html_join

        requests = list(obj.cancel_requests.order_by("-attempt_num")[:20])
        if not requests:
            return format_html('<span class="quiet">{}</span>', _("none"))
        outcomes = dict(JobAttempt.objects.using(obj._state.db).filter(job=obj, attempt_num__in=[r.attempt_num for r in requests])
                        .values_list("attempt_num", "outcome_id"))

        def fate(request: Any) -> str:
            outcome = outcomes.get(request.attempt_num)
            if outcome is None:
                return _("waiting for its worker to stop it")
            if outcome == Status.CANCELLED:
                return _("done: the attempt was cancelled")
            if outcome not in FINISHED:  # e.g. Error: it covers the next attempts (queue/cancel.py)
                return _("the attempt ended %(status)s first: its next attempt is stopped") % {
                    "status": human_label(outcome)}
            return _("too late: the attempt ended %(status)s first") % {"status": human_label(outcome)}

        return format_html('<ul class="sqlqueue-cancel-requests">{}</ul>', format_html_join(
            "", "<li>{} {} — {} ({}): {}</li>",
            ((_("attempt #%(n)d") % {"n": r.attempt_num}, stamp(r.requested_at), r.requested_by or "—",
              r.reason or "—", fate(r)) for r in requests)))

    @admin.display(description=_("operator actions"))
    def operator_actions(self, obj: Job) -> SafeString:
        """Who retried, cancelled, requeued this job and when (the admin's LogEntry rows, newest first)."""
        from django.contrib.admin.models import LogEntry
        from django.contrib.contenttypes.models import ContentType
        from django.utils.html import format_html_join

        entries = list(LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(Job),
                                               object_id=str(obj.pk)).select_related("user")
                       .order_by("-action_time")[:20])
        if not entries:
            return format_html('<span class="quiet">{}</span>', _("none"))
        return format_html('<ul class="sqlqueue-operator-actions">{}</ul>', format_html_join(
            "", "<li>{} — {}: {}</li>",
            ((stamp(e.action_time), e.user.get_username() if e.user else "?", e.get_change_message())
             for e in entries)))

    @admin.display(description=_("waits for"))
    def waits_for(self, obj: Job) -> SafeString:
        return admin_workflows.waits_for(obj)

    @admin.display(description=_("waited for by"))
    def waited_by(self, obj: Job) -> SafeString:
        return admin_workflows.waited_by(obj)

    @admin.display(description=_("batch"))
    def batch_col(self, obj: Job) -> SafeString:
        return admin_workflows.batch_link(obj)

    @admin.display(description=_("why it is (not) running"))
    def diagnosis(self, obj: Job) -> str:
        return explain(obj)

    # ----- dashboard --------------------------------------------------------------------------------
    def get_urls(self) -> list[Any]:
        custom = [path("dashboard/", self.admin_site.admin_view(lambda request: dashboard_view(request, self)),
                       name="django_sqlqueue_dashboard"),
                  path("dashboard.json", self.admin_site.admin_view(lambda request: dashboard_json_view(request, self)),
                       name="django_sqlqueue_dashboard_json"),
                  path("failures/", self.admin_site.admin_view(lambda request: triage_view(request, self)),
                       name="django_sqlqueue_failures"),
                  path("throughput/", self.admin_site.admin_view(lambda request: throughput_view(request, self)),
                       name="django_sqlqueue_throughput"),
                  path("enqueue/", self.admin_site.admin_view(lambda request: admin_enqueue.enqueue_view(request, self)),
                       name="django_sqlqueue_enqueue"),
                  path("<path:object_id>/retry-edited/", self.admin_site.admin_view(
                      lambda request, object_id: admin_enqueue.edited_retry_view(request, self, object_id)),
                       name="django_sqlqueue_job_edited_retry")]
        return custom + super().get_urls()


#: ``key=value`` / ``a.b=value`` in the search box: a payload search.
PAYLOAD_TERM = re.compile(r"^([A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*){0,4})=(\S.*)$")


def payload_condition(term: str, user: Any) -> Q | None:
    """``to=a@example.com`` as a payload condition, or None when the term is not of that form.

    JSON containment (``payload @> {"to": "a@example.com"}``): on PostgreSQL the GIN index of migration
    0007 serves it. Elsewhere (SQLite, SQL Server) the same question is a JSON path lookup that reads
    the payload of every job the other filters leave: add a status / type / queue filter on big tables.
    The value matches as text and, when it parses as JSON, as that value too (``n=7`` finds 7 and "7").
    A key marked sensitive (:mod:`.sensitive`) is not searchable without the permission to see it: the
    search would answer yes/no questions about the hidden value.
    """
    match = PAYLOAD_TERM.match(term)
    if not match:
        return None
    path, raw = match.group(1).split("."), match.group(2)
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if not sensitive.can_view(user) and set(path) & sensitive.all_sensitive_keys():
        return Q(pk__in=[])
    from django.db import connections

    from ..dialects import get_dialect

    indexed = get_dialect(connections[Job.objects.db]).payload_containment_indexed
    condition = Q(pk__in=[])
    for candidate in {json.dumps(v): v for v in (value, raw)}.values():  # 7 and "7" alike
        nested: Any = candidate
        for key in reversed(path):
            nested = {key: nested}
        condition |= Q(payload__contains=nested) if indexed else Q(**{"payload__" + "__".join(path): candidate})
    return condition


def effective_max_attempts(job: Job) -> int:
    if job.max_attempts is not None:
        return job.max_attempts
    if job.job_type.max_attempts is not None:
        return job.job_type.max_attempts
    return get_settings().MAX_ATTEMPTS


def explain(job: Job) -> str:
    """Why this job is, or is not, running now: the one diagnosis (ops/diagnose.py), as queue_why says it."""
    from ..ops.diagnose import diagnose

    return diagnose(job).text


admin.site.register(JobType, JobTypeAdmin)
admin.site.register(Worker, WorkerAdmin)

# The admin index links to the dashboard through this template (it extends "admin/index.html"); a
# project with its own index template keeps it and may include "admin/django_sqlqueue/index_link.html".
if admin.site.index_template is None:
    admin.site.index_template = "admin/django_sqlqueue/index.html"
from . import queues as admin_queues  # noqa: E402, F401  (registers the QueuePause admin)
from . import schedules as admin_schedules  # noqa: E402, F401  (registers the Schedule admin)
