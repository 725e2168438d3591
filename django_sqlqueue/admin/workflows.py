"""Admin for workflows: what a job waits for and what waits for it (job page), and the batches.

Read-only: batches are built by code (workflows.batch); a failed member is retried from its job page
with the job actions (their permissions apply). Counts are read from the members through the
``sqlqueue_job_batch`` index, never kept in the batch row.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..models import Batch, Job, JobDependency
from ..states import FINISHED, Status, human_label
from ..workflows import batch_counts
from .guard import GuardedChangelist
from .stamps import stamp_column
from .types import status_badge

#: Rows shown in the waits-for / waited-by lists and the batch's member table.
SHOWN = 100


def _job_link(job_id: int, status_id: int, type_name: str, extra: str = "") -> tuple[str, str, SafeString, str]:
    return (reverse("admin:django_sqlqueue_job_change", args=[job_id]), f"{type_name} #{job_id}",
            status_badge(status_id), extra)


def _job_list(rows: list[tuple[str, str, SafeString, str]], total: int) -> SafeString:
    if not rows:
        return format_html('<span class="quiet">{}</span>', _("none"))
    more = format_html(" <li>{}</li>", _("… and %(n)d more") % {"n": total - len(rows)}) if total > len(rows) else ""
    return format_html('<ul class="sqlqueue-workflow">{}{}</ul>', format_html_join(
        "", '<li><a href="{}">{}</a> {} {}</li>', rows), more)


def waits_for(job: Job) -> SafeString:
    """The jobs ``job`` waits for (or waited for), their statuses and the policy of each."""
    qs = JobDependency.objects.using(job._state.db).filter(job_id=job.pk).order_by("depends_on_id")
    rows = [_job_link(d, s, t, str(_("(runs anyway if it fails)")) if p == "run" else "")
            for d, s, t, p in qs.values_list("depends_on_id", "depends_on__status_id",
                                             "depends_on__job_type__name", "on_failure")[:SHOWN]]
    return _job_list(rows, qs.count() if len(rows) == SHOWN else len(rows))


def waited_by(job: Job) -> SafeString:
    """The jobs that wait (or waited) for ``job``."""
    if not job.has_dependents:
        return _job_list([], 0)
    qs = JobDependency.objects.using(job._state.db).filter(depends_on_id=job.pk).order_by("job_id")
    rows = [_job_link(j, s, t) for j, s, t in qs.values_list("job_id", "job__status_id", "job__job_type__name")[:SHOWN]]
    return _job_list(rows, qs.count() if len(rows) == SHOWN else len(rows))


def batch_link(job: Job) -> SafeString:
    if job.batch_id is None:
        return format_html('<span class="quiet">{}</span>', "—")
    return format_html('<a href="{}">{}</a>', reverse("admin:django_sqlqueue_batch_change", args=[job.batch_id]),
                       _("Batch #%(id)d") % {"id": job.batch_id})


def counts_html(counts: dict[Status, int]) -> SafeString:
    if not counts:
        return format_html('<span class="quiet">{}</span>', _("no members"))
    return format_html_join(" ", "{} {}", ((status_badge(s), n) for s, n in sorted(counts.items())))


def callback_roles(batch: Batch) -> dict[int, str]:
    """{callback job id: "on_success" / "on_failure" / "on_finish"}.

    ``finish_batch`` enqueues, in this order, ``on_success`` (every member Completed) or ``on_failure``
    (not), when given, then ``on_finish``, when given, and stores their ids in that order.
    """
    first = ("on_success", batch.on_success) if batch.succeeded else ("on_failure", batch.on_failure)
    names = [name for name, spec in (first, ("on_finish", batch.on_finish)) if spec]
    return {int(pk): name for pk, name in zip(batch.callback_ids or [], names, strict=False)}


@admin.register(Batch)
class BatchAdmin(GuardedChangelist, admin.ModelAdmin):
    list_display = ("id", "description", "members", "state", "created", "finished")
    list_display_links = ("id", "description")
    ordering = ("-id",)
    sortable_by = ("id",)
    list_per_page = 50
    show_full_result_count = False
    fields = ("id", "description", "state", "progress", "members", "failed_members", "created", "closed",
              "finished", "callbacks", "callback_specs", "member_list")
    readonly_fields = fields

    created = stamp_column("created_at", _("created at"))
    closed = stamp_column("closed_at", _("closed at"))
    finished = stamp_column("finished_at", _("finished at"))

    class Media:
        css = {"all": ["django_sqlqueue/admin.css"]}

    # Read-only: batches are built by code; members are changed from their job pages.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("members by status"))
    def members(self, obj: Batch) -> SafeString:
        return counts_html(batch_counts(obj.pk, obj._state.db))

    @admin.display(description=_("progress"))
    def progress(self, obj: Batch) -> SafeString:
        """Finished members of all, as a bar and in words (a member is finished in a final state)."""
        counts = batch_counts(obj.pk, obj._state.db)
        total = sum(counts.values())
        done = sum(n for s, n in counts.items() if s in FINISHED)
        if not total:
            return format_html('<span class="quiet">{}</span>', _("no members"))
        percent = done * 100 // total
        return format_html('<progress class="sqlqueue-progress" max="{}" value="{}">{}%</progress> {}', total, done,
                           percent, _("%(done)d of %(total)d members finished (%(percent)d%%)") % {
                               "done": done, "total": total, "percent": percent})

    @admin.display(description=_("failed members"))
    def failed_members(self, obj: Batch) -> SafeString:
        """The Failed members in the job list (its Retry actions, their permissions), filtered to this batch."""
        failed = batch_counts(obj.pk, obj._state.db).get(Status.FAILED, 0)
        if not failed:
            return format_html('<span class="quiet">{}</span>', _("none"))
        url = reverse("admin:django_sqlqueue_job_changelist") + f"?batch={obj.pk}&status={int(Status.FAILED)}"
        return format_html('<a class="sqlqueue-retry-failed" href="{}">{}</a>', url, ngettext(
            "%(n)d Failed member: select it there and Retry now", "%(n)d Failed members: select them there and "
            "Retry now (or Reset attempts and retry)", failed) % {"n": failed})

    @admin.display(description=_("state"))
    def state(self, obj: Batch) -> str:
        if obj.finished_at is not None:
            return str(_("finished: every member Completed") if obj.succeeded
                       else _("finished: some member did not complete"))
        if obj.closed_at is None:
            return str(_("open: members may still be added"))
        return str(_("closed: waiting for its members"))

    @admin.display(description=_("callback jobs"))
    def callbacks(self, obj: Batch) -> SafeString:
        """Each callback job with the callback it was enqueued for (on_success / on_failure / on_finish)."""
        roles = callback_roles(obj)
        rows = [_job_link(pk, s, t, roles.get(pk, "")) for pk, s, t in Job.objects.using(obj._state.db)
                .filter(pk__in=obj.callback_ids).order_by("pk").values_list("pk", "status_id", "job_type__name")]
        if not rows and obj.finished_at is None:
            return format_html('<span class="quiet">{}</span>', _("not enqueued yet"))
        return _job_list(rows, len(rows))

    @admin.display(description=_("callbacks"))
    def callback_specs(self, obj: Batch) -> SafeString:
        specs = [(name, spec["job_type"]) for name, spec in
                 (("on_success", obj.on_success), ("on_failure", obj.on_failure), ("on_finish", obj.on_finish)) if spec]
        if not specs:
            return format_html('<span class="quiet">{}</span>', _("none"))
        return format_html_join(", ", "{}: {}", specs)

    @admin.display(description=_("members"))
    def member_list(self, obj: Batch) -> SafeString:
        qs = Job.objects.using(obj._state.db).filter(batch_id=obj.pk).order_by("pk")
        rows = [_job_link(pk, s, t) for pk, s, t in qs.values_list("pk", "status_id", "job_type__name")[:SHOWN]]
        total = sum(batch_counts(obj.pk, obj._state.db).values()) if len(rows) == SHOWN else len(rows)
        return _job_list(rows, total)


__all__ = ["BatchAdmin", "batch_link", "callback_roles", "counts_html", "human_label", "waited_by", "waits_for"]
