"""Failure triage: failed jobs grouped by type and exception class, with "retry all" / "discard all".

Grouping by exception class needs the error text, which no index orders: the page reads the id, type,
status, time and the *last* :data:`TAIL_CHARS` characters of the error of the newest
:data:`SCAN_LIMIT` Failed and Error jobs (the has-error partial index narrows the read to jobs with an
error), and groups them in Python. That is O(failed jobs), bounded: beyond the limit the page says it
looked at the newest ones only. A group's action re-reads the same bounded set and changes at most
:data:`GROUP_ACTION_LIMIT` jobs per run, and the confirmation page names the count and the limit.

"Retry all": Failed / Error -> Pending, due now (retry permission). "Discard all": Error -> Cancelled
(no more retries; cancel permission) and Failed jobs deleted with their history through
:meth:`JobManager.purge` (delete permission on jobs), except a batch's members (:func:`batch_members`). Each change goes through ``modify`` / ``purge``
with the version read, like every other action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Coalesce, Right
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..dialects.predicates import has_error
from ..ops.health import rows_through
from ..states import Status

#: How many failed jobs the page reads (newest first) to group them.
SCAN_LIMIT = 10_000
#: Characters read from the end of each error: the exception line is the traceback's last.
TAIL_CHARS = 300
#: The most jobs one "retry all" / "discard all" changes per run (said on the confirmation page).
GROUP_ACTION_LIMIT = 10_000
FAILURE_STATUSES = (int(Status.FAILED), int(Status.ERROR))
#: "module.Class: message" or "Class": a dotted name, then a colon or the end of the line.
_EXC = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def exception_line(error: str) -> str:
    """The traceback's last non-empty line ("smtplib.SMTPError: 554 rejected")."""
    for line in reversed((error or "").splitlines()):
        if line.strip():
            return line.strip()
    return ""


def exception_class(error: str) -> str:
    """The exception's class name, without its module path ("SMTPError"); "" when there is none."""
    line = exception_line(error)
    match = _EXC.match(line)
    if not match:
        return ""
    return match.group(1).rsplit(".", 1)[-1]


def error_message(error: str) -> str:
    """The exception line with the class's module path dropped: "SMTPError: 554 rejected"."""
    line = exception_line(error)
    cls = exception_class(error)
    if cls:
        head, sep, rest = line.partition(":")
        return f"{cls}{sep}{rest}" if sep else cls
    return line


@dataclass
class Group:
    type_id: int
    type_name: str
    exc: str
    failed: int = 0
    error: int = 0
    first: datetime | None = None
    last: datetime | None = None
    example: str = ""
    ids: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.failed + self.error

    @property
    def key(self) -> str:
        return f"{self.type_id}:{self.exc}"


def _rows(job_model: Any, type_id: int | None = None) -> tuple[list[tuple[Any, ...]], bool]:
    qs = job_model.objects.filter(has_error(job_model.objects.db), status_id__in=FAILURE_STATUSES)
    if type_id is not None:
        qs = qs.filter(job_type_id=type_id)
    # Newest first along the error index (its rows only: error text is set); pinned to it on SQLite, whose
    # planner with no statistics took the status index's range of every failed job and sorted it (1M
    # jobs, 130,000 failed: 1.2 s, against 0.04 s through the error index).
    rows = rows_through(qs.order_by("-id").annotate(tail=Right("error", TAIL_CHARS),
                                                    seen=Coalesce("finished_at", "updated_at"))
                        .values_list("id", "job_type_id", "status_id", "seen", "tail")[: SCAN_LIMIT + 1],
                        "sqlqueue_job_has_error")
    return rows[:SCAN_LIMIT], len(rows) > SCAN_LIMIT


def failure_groups(job_model: Any, type_id: int | None = None) -> tuple[list[Group], bool]:
    """The groups, largest first, and whether the scan stopped at :data:`SCAN_LIMIT`."""
    from ..models import JobType

    names = dict(JobType.objects.values_list("pk", "name"))
    rows, capped = _rows(job_model, type_id)
    groups: dict[tuple[int, str], Group] = {}
    for pk, tid, status_id, seen, tail in rows:
        exc = exception_class(tail) or _("(no exception class)")
        group = groups.get((tid, exc))
        if group is None:
            group = groups[(tid, exc)] = Group(tid, names.get(tid, f"#{tid}"), exc, example=error_message(tail))
        if status_id == Status.FAILED:
            group.failed += 1
        else:
            group.error += 1
        group.ids.append(pk)
        if seen is not None:
            group.first = seen if group.first is None or seen < group.first else group.first
            group.last = seen if group.last is None or seen > group.last else group.last
    return sorted(groups.values(), key=lambda g: (-g.total, g.type_name, g.exc)), capped


def find_group(job_model: Any, key: str) -> Group | None:
    type_part, _sep, exc = key.partition(":")
    if not type_part.isascii() or not type_part.isdigit() or len(type_part) > 19:
        return None
    groups, _capped = failure_groups(job_model, int(type_part))
    return next((g for g in groups if g.exc == exc), None)


def triage_view(request: HttpRequest, modeladmin: Any) -> HttpResponse:
    """The grouped failures; POST ``group`` + ``op`` (retry / discard) asks for confirmation, then acts."""
    if not modeladmin.has_view_or_change_permission(request):
        raise PermissionDenied
    model = modeladmin.model
    if request.method == "POST":
        group = find_group(model, request.POST.get("group", ""))
        op = request.POST.get("op")
        if op not in ("retry", "discard"):
            raise PermissionDenied("op must be retry or discard")
        _check_permission(request, op)
        if group is None:
            modeladmin.message_user(request, _("That group has no failed jobs any more."), messages.INFO)
            return HttpResponseRedirect(request.path)
        if request.POST.get("confirm") == "yes":
            _apply(modeladmin, request, model, group, op)
            return HttpResponseRedirect(request.path)
        return _confirmation(request, modeladmin, group, op)
    groups, capped = failure_groups(model)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Failures by type and exception"), "opts": model._meta, "groups": groups,
        "capped": capped, "scan_limit": SCAN_LIMIT, "now": timezone.now(), "media": modeladmin.media,
        "can_retry": modeladmin.has_retry_permission(request),
        "can_discard": modeladmin.has_cancel_permission(request),
        "list_url": reverse("admin:django_sqlqueue_job_changelist"),
    }
    return TemplateResponse(request, "admin/django_sqlqueue/failures.html", context)


def _check_permission(request: HttpRequest, op: str) -> None:
    needed = ["django_sqlqueue.retry_job"] if op == "retry" else ["django_sqlqueue.cancel_job"]
    if not all(request.user.has_perm(p) for p in needed):
        raise PermissionDenied(f"{op} all needs {', '.join(needed)}")


def batch_members(model: Any, ids: list[int]) -> list[int]:
    """Those of the Failed jobs ``ids`` that belong to a batch: Discard all keeps them.

    A batch counts its members from their rows (:func:`~django_sqlqueue.workflows.batch_counts`):
    deleting a failed member left a batch that "did not complete" with only Completed members listed,
    and, while the batch was still open, would have let it finish as a success and fire ``on_success``.
    """
    return [pk for chunk in _chunks(ids) for pk in model.objects.filter(
        pk__in=chunk, status_id=Status.FAILED, batch_id__isnull=False).values_list("id", flat=True)]


def _confirmation(request: HttpRequest, modeladmin: Any, group: Group, op: str) -> TemplateResponse:
    can_delete = request.user.has_perm("django_sqlqueue.delete_job")
    in_batch = len(batch_members(modeladmin.model, group.ids[:GROUP_ACTION_LIMIT])) if op == "discard" else 0
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Retry all") if op == "retry" else _("Discard all"), "opts": modeladmin.model._meta,
        "group": group, "op": op, "limit": GROUP_ACTION_LIMIT, "over_limit": group.total > GROUP_ACTION_LIMIT,
        "can_delete": can_delete, "media": modeladmin.media, "in_batch": in_batch,
        "deleted": max(0, group.failed - in_batch),
    }
    return TemplateResponse(request, "admin/django_sqlqueue/failures_confirm.html", context)


def _apply(modeladmin: Any, request: HttpRequest, model: Any, group: Group, op: str) -> None:

    ids = group.ids[:GROUP_ACTION_LIMIT]
    label = f"{group.type_name} / {group.exc}"

    if op == "retry":
        _in_chunks(modeladmin, request, model, ids, None, verb=_("Retry all (%s)") % label,
                   permission="retry_job", target=Status.PENDING)
    else:
        if group.error:  # no "cancel Error jobs: 0 jobs changed" for a group of Failed jobs only
            _in_chunks(modeladmin, request, model, ids, Status.ERROR, verb=_("Discard all (%s), Error jobs cancelled")
                       % label, permission="cancel_job", target=Status.CANCELLED)
        failed_ids = [pk for chunk in _chunks(ids) for pk in model.objects.filter(
            pk__in=chunk, status_id=Status.FAILED).values_list("id", flat=True)]
        kept = set(batch_members(model, failed_ids))
        if kept:
            failed_ids = [pk for pk in failed_ids if pk not in kept]
            modeladmin.message_user(request, ngettext(
                "%(n)d Failed job kept: it belongs to a batch, whose record and callbacks count it.",
                "%(n)d Failed jobs kept: they belong to batches, whose records and callbacks count them.",
                len(kept)) % {"n": len(kept)}, messages.WARNING)
        if failed_ids:
            if not request.user.has_perm("django_sqlqueue.delete_job"):
                modeladmin.message_user(request, ngettext(
                    "%(n)d Failed job kept: deleting it needs the “Can delete job” permission.",
                    "%(n)d Failed jobs kept: deleting them needs the “Can delete job” permission.",
                    len(failed_ids)) % {"n": len(failed_ids)}, messages.WARNING)
            else:
                _purge_failed(modeladmin, request, model, failed_ids, label)
    if group.total > GROUP_ACTION_LIMIT:
        modeladmin.message_user(request, _("Stopped after %(limit)d jobs (the newest); run it again for the rest.")
                                % {"limit": GROUP_ACTION_LIMIT}, messages.WARNING)


#: Ids bound per statement (SQL Server takes at most 2,100 parameters).
CHUNK = 1000


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK)]


def _in_chunks(modeladmin: Any, request: HttpRequest, model: Any, ids: list[int], status: Status | None, *,
               verb: str, permission: str, target: Status) -> None:
    from .actions import merge, report, run_transition

    outcomes = []
    for chunk in _chunks(ids):
        qs = model.objects.filter(pk__in=chunk)
        if status is not None:
            qs = qs.filter(status_id=int(status))
        outcomes.append(run_transition(modeladmin, request, qs, verb=verb, permission=permission, target=target,
                                       limit=CHUNK, report=False))
    report(modeladmin, request, merge(outcomes), verb, GROUP_ACTION_LIMIT)


def _purge_failed(modeladmin: Any, request: HttpRequest, model: Any, ids: list[int], label: str) -> None:
    jobs = [job for chunk in _chunks(ids) for job in model.objects.filter(pk__in=chunk)
            .select_related("job_type").only("id", "job_type", "job_type__name")]
    deleted = model.objects.purge(ids, statuses=[Status.FAILED], cutoff=timezone.now() + timedelta(seconds=1))
    if deleted:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=jobs, action_flag=DELETION,
                                     change_message=f"Discard all ({label}): Failed job deleted")
    modeladmin.message_user(request, ngettext(
        "Discard all (%(label)s): %(n)d Failed job deleted with its history.",
        "Discard all (%(label)s): %(n)d Failed jobs deleted with their history.", deleted)
        % {"label": label, "n": deleted}, messages.SUCCESS)
