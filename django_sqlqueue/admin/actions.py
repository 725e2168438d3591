"""The operator's bulk actions on jobs, all through :meth:`JobManager.modify`.

Each action reads the selected jobs (status, version and a few columns), then asks ``modify`` to move
each one, presenting the concurrency token the operator saw: the version rendered next to the row's
checkbox when the list was shown (``_token_<id>`` in the POST), else the version read now. So a job a
worker changed between the page render and the click is refused, never overwritten. Jobs that changed
are logged in the admin history (``LogEntry``) under the operator's name; refused ones are reported
with the reason.

Permissions are checked twice: Django offers an action only to a user holding its permission
(``allowed_permissions``), and :func:`run_transition` checks again before touching anything, so a
crafted POST is refused too.

The actions' own pages are here too: the "Retry at…" form and the confirmation page shown before an
action that cannot easily be undone (this module imports admin_views, never the other way round).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..bounds import MAX_DELAY_SECONDS, check_when
from ..exceptions import CancelTooLate, IllegalTransition, InvalidArgument, JobNotFound, StaleJob
from ..states import Status
from .views import COUNT_CAP

if TYPE_CHECKING:
    from ..models import Job

logger = logging.getLogger(__name__)

#: The largest number of jobs one action run touches (each is one UPDATE); "select all" across a
#: million-row list processes this many (newest first) and says so. Override on the ModelAdmin.
ACTION_BATCH_LIMIT = 2000
TOKEN_PREFIX = "_token_"
#: Columns an action reads per job: what modify and the refusal checks need, not the payload.
_FIELDS = ("id", "status", "version", "attempt_num", "scheduled_for", "job_type", "worker", "lease_expires_at")
#: Running jobs are stopped by Cancel (which asks their worker) or Mark terminated; nothing else may take
#: one from its worker.
_RUNNING_REFUSAL = "running (a worker holds it): only Cancel or Mark terminated may stop a running job"


@dataclass
class Outcome:
    """What an action did: the rows it changed and, per reason, the ids it refused."""

    changed: list[Job] = field(default_factory=list)
    refused: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    truncated: bool = False
    #: Running jobs whose worker was asked to stop them (Cancel on a Processing job).
    requested: list[Job] = field(default_factory=list)

    @property
    def refused_count(self) -> int:
        return sum(len(ids) for ids in self.refused.values())


def posted_tokens(request: HttpRequest) -> dict[int, int]:
    """The versions the operator saw, from the hidden ``_token_<id>`` inputs next to each checkbox."""
    tokens: dict[int, int] = {}
    for key, value in request.POST.items():
        if key.startswith(TOKEN_PREFIX):
            try:
                tokens[int(key[len(TOKEN_PREFIX):])] = int(value)
            except ValueError:
                continue
    return tokens


def _waiting(job: Job, target: Status) -> str | None:
    """A Waiting job is released by its dependencies (workflows.py), not by a retry: refused here."""
    if job.state == Status.WAITING and target == Status.PENDING:
        return str(_("waiting for other jobs (cancel it, or let them finish)"))
    return None


def run_transition(
    modeladmin: Any,
    request: HttpRequest,
    queryset: QuerySet,
    *,
    verb: str,
    permission: str,
    target: Status,
    options: Callable[[Job], dict[str, Any]] = lambda job: {},
    refuse: Callable[[Job], str | None] = lambda job: None,
    note: str = "",
    take_running: bool = False,
    limit: int | None = None,
    report: bool = True,
    on_running: Callable[[Job, int], Job] | None = None,
) -> Outcome:
    """Move every selected job to ``target`` through ``modify``; report and log the outcome.

    ``options(job)`` gives extra ``modify`` arguments per job; ``refuse(job)`` may return a reason to
    leave a job alone before ``modify`` is asked (for refusals the transition table alone would not make).
    ``take_running``: the action may move a Processing job (Requeue, which refuses all but orphans).
    ``on_running(job, token)``: what to do with a Processing job instead of refusing it (Cancel: ask its
    worker to stop it); it may raise as ``modify`` does.
    """
    from ..models import Job

    if not request.user.has_perm(f"django_sqlqueue.{permission}"):
        logger.warning("action=%s refused=permission user=%s", verb, request.user.pk)
        raise PermissionDenied(f"{verb} needs the django_sqlqueue.{permission} permission")
    limit = limit or getattr(modeladmin, "action_batch_limit", ACTION_BATCH_LIMIT)
    # The type's name travels with each job (a join on a small table): the history names it "SendEmail #12".
    jobs = list(queryset.order_by("-id").select_related("job_type").only(*_FIELDS, "job_type__name")[: limit + 1])
    outcome = Outcome(truncated=len(jobs) > limit)
    tokens = posted_tokens(request)
    stale = _("changed by a worker or another operator since the list was shown (concurrency token is "
              "stale); reload the page and try again")
    for job in jobs[:limit]:
        token = tokens.get(job.pk, job.version)
        reason = stale if token != job.version else (_waiting(job, target) or refuse(job))
        running = job.state == Status.PROCESSING
        if reason is None and running and target != Status.TERMINATED and not take_running and on_running is None:
            reason = _RUNNING_REFUSAL
        if reason is not None:
            outcome.refused[reason].append(job.pk)
            continue
        try:
            if running and on_running is not None:
                updated = on_running(job, token)
                if updated.state == Status.PROCESSING:
                    Job.job_type.field.set_cached_value(updated, job.job_type)
                    outcome.requested.append(updated)
                    continue
            else:
                extra = {"_release_note": note} if take_running and running else {}
                updated = Job.objects.modify(job, token, target, using=job._state.db, **options(job), **extra)
        except StaleJob:  # changed between our read and the UPDATE: modify's WHERE version caught it
            outcome.refused[stale].append(job.pk)
        except IllegalTransition:
            from ..states import human_label

            if job.state == target:
                reason = _("already %(status)s") % {"status": human_label(job.state)}
            else:
                reason = _("%(from)s → %(to)s is not allowed") % {"from": human_label(job.state),
                                                                  "to": human_label(target)}
            outcome.refused[reason].append(job.pk)
        except CancelTooLate:
            outcome.refused[_("finished before the cancel reached it (too late)")].append(job.pk)
        except JobNotFound:
            outcome.refused[_("no longer exists")].append(job.pk)
        except InvalidArgument as exc:
            outcome.refused[str(exc)].append(job.pk)
        else:
            Job.job_type.field.set_cached_value(updated, job.job_type)
            updated._sqlqueue_from = job.state  # type: ignore[attr-defined]
            outcome.changed.append(updated)
    _log(request, outcome, verb, note)
    if report:
        _report(modeladmin, request, outcome, verb, limit)
    logger.info("action=%s user=%s changed=%d refused=%d", verb, request.user.pk, len(outcome.changed),
                outcome.refused_count)
    return outcome


def _log(request: HttpRequest, outcome: Outcome, verb: str, note: str) -> None:
    groups: dict[tuple[Status, int], list[Job]] = defaultdict(list)
    for job in outcome.changed:
        groups[(job._sqlqueue_from, job.status_id)].append(job)  # type: ignore[attr-defined]
    for (before, after), jobs in groups.items():
        message = f"{verb}: {before.label} → {Status(after).label}" + (f" ({note})" if note else "")
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=jobs, action_flag=CHANGE,
                                     change_message=message)
    if outcome.requested:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=outcome.requested, action_flag=CHANGE,
                                     change_message=f"{verb}: asked the worker running it to stop it")


def merge(outcomes: list[Outcome]) -> Outcome:
    """One outcome for an action run in chunks (ids are bound as parameters: SQL Server takes 2,100)."""
    total = Outcome()
    for outcome in outcomes:
        total.changed += outcome.changed
        for reason, ids in outcome.refused.items():
            total.refused[reason] += ids
        total.truncated = total.truncated or outcome.truncated
    return total


def report(modeladmin: Any, request: HttpRequest, outcome: Outcome, verb: str, limit: int) -> None:
    _report(modeladmin, request, outcome, verb, limit)


def _report(modeladmin: Any, request: HttpRequest, outcome: Outcome, verb: str, limit: int) -> None:
    n = len(outcome.changed)
    if outcome.requested:
        modeladmin.message_user(request, ngettext(
            "%(verb)s: %(n)d running job: its worker was asked to stop it (within a few seconds; it then "
            "shows as Cancelled, or Completed if it finished first).",
            "%(verb)s: %(n)d running jobs: their workers were asked to stop them (within a few seconds; "
            "they then show as Cancelled, or Completed if they finished first).", len(outcome.requested))
            % {"verb": verb, "n": len(outcome.requested)}, messages.SUCCESS)
    if n or not (outcome.refused or outcome.requested):
        modeladmin.message_user(
            request, ngettext("%(verb)s: %(n)d job changed.", "%(verb)s: %(n)d jobs changed.", n)
            % {"verb": verb, "n": n}, messages.SUCCESS if n else messages.INFO)
    if outcome.refused:
        details = format_html_join("; ", "{} ({}): {}", (
            (ngettext("%(n)d job", "%(n)d jobs", len(ids)) % {"n": len(ids)},
             ", ".join(str(i) for i in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else ""),
             reason)
            for reason, ids in outcome.refused.items()))
        modeladmin.message_user(request, format_html("{}: {} refused: {}.", verb, outcome.refused_count, details),
                                messages.WARNING)
    if outcome.truncated:
        modeladmin.message_user(
            request, _("%(verb)s stopped after %(limit)d jobs (the newest); run it again for the rest.")
            % {"verb": verb, "limit": limit}, messages.WARNING)


def _back_to_job(request: HttpRequest, outcome: Outcome) -> HttpResponse | None:
    """Buttons on a job's page post here with ``_sqlqueue_return``: send the operator back to that job."""
    from .filters import parse_id

    # parse_id, not str.isdigit(): "²" is a digit to isdigit() and a ValueError to int(), which was a 500
    # after the action had been applied.
    job_id = parse_id(request.POST.get("_sqlqueue_return"))
    if job_id is not None:
        return HttpResponseRedirect(reverse("admin:django_sqlqueue_job_change", args=[job_id]))
    return None


def _transition(modeladmin: Any, request: HttpRequest, queryset: QuerySet, **how: Any) -> HttpResponse | None:
    """An action's body: :func:`run_transition` with ``how``, then back to the job page it was posted from."""
    return _back_to_job(request, run_transition(modeladmin, request, queryset, **how))


def _keep_schedule(job: Job) -> dict[str, Any]:
    return {"scheduled_for": job.scheduled_for}


# ----- Retry at… ----------------------------------------------------------------------------------
class RetryAtForm(forms.Form):
    """When the selected jobs should run again: a date and time, or a delay from now.

    Either must fall within a century of now (:data:`~django_sqlqueue.limits.MAX_DELAY_SECONDS`), the
    bound ``modify`` holds every schedule to: a form error, not an OverflowError (10,000,000 days) or
    a refusal per job.
    """

    UNITS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}

    run_at = forms.DateTimeField(
        label=gettext_lazy("Run at"), required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"),
        input_formats=["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"],
        help_text=gettext_lazy("In the server's time zone."),
    )
    delay = forms.IntegerField(label=gettext_lazy("or in"), required=False, min_value=0,
                               max_value=MAX_DELAY_SECONDS)
    unit = forms.ChoiceField(label=gettext_lazy("unit"), choices=[(u, u) for u in UNITS], initial="minutes")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        run_at, delay = data.get("run_at"), data.get("delay")
        if (run_at is None) == (delay is None):
            raise forms.ValidationError(_("Give either a date and time or a delay."))
        if delay is not None and data.get("unit") in self.UNITS and delay * self.UNITS[data["unit"]] > MAX_DELAY_SECONDS:
            self.add_error("delay", _("At most 100 years from now."))
        elif run_at is not None:
            try:
                check_when(run_at, "the time")
            except InvalidArgument:
                self.add_error("run_at", _("Give a time within 100 years of now."))
        return data

    def when(self) -> datetime:
        data = self.cleaned_data
        if data["run_at"] is not None:
            return data["run_at"]
        return timezone.now() + timedelta(seconds=data["delay"] * self.UNITS[data["unit"]])


def retry_at_view(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """The intermediate page of the "Retry at…" action; on submit, applies it through ``modify``."""
    if not modeladmin.has_reschedule_permission(request):
        raise PermissionDenied
    if request.POST.get("apply"):
        form = RetryAtForm(request.POST)
        if form.is_valid():
            outcome = apply_retry_at(modeladmin, request, queryset, form.when())
            return _back_to_job(request, outcome) or HttpResponseRedirect(request.get_full_path())
    else:
        form = RetryAtForm()
    preview = list(queryset.order_by("-id").values_list("id", "status_id")[:21])
    count = queryset[: COUNT_CAP + 1].count()
    carried = [(k, v) for k in ("_selected_action", "select_across", "_sqlqueue_return")
               for v in request.POST.getlist(k)]
    carried += [(k, v) for k, v in request.POST.items() if k.startswith(TOKEN_PREFIX)]
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Retry jobs at a chosen time"),
        "opts": modeladmin.model._meta,
        "form": form,
        "preview": [(pk, Status(s).label) for pk, s in preview[:20]],
        "more": max(0, count - 20),
        "count": count,
        "capped": count > COUNT_CAP,
        "carried": carried,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "server_now": timezone.localtime().strftime("%Y-%m-%d %H:%M:%S"),
        "server_tz": timezone.get_current_timezone_name(),
        "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/django_sqlqueue/retry_at.html", context)


# ----- confirmation before an action that cannot (easily) be undone -------------------------------
def carried_fields(request: HttpRequest, extra: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The POSTed selection (ids, select-across, tokens, return-to) to carry through an intermediate page."""
    carried = [(k, v) for k in ("_selected_action", "select_across", "_sqlqueue_return", "action", *extra)
               for v in request.POST.getlist(k)]
    carried += [(k, v) for k, v in request.POST.items() if k.startswith(TOKEN_PREFIX)]
    return carried


def confirm_page(modeladmin: Any, request: HttpRequest, queryset: QuerySet, *, verb: str, warning: str,
                 button: str, danger: bool = True, limit: int | None = None) -> TemplateResponse | None:
    """A page naming how many jobs an action would change, unless this POST already confirmed it.

    ``None`` means "confirmed: go ahead". The count is exact up to
    :data:`~django_sqlqueue.admin_views.COUNT_CAP` and says "more than" beyond; when the action changes at most ``limit`` jobs per run, the page says so up front.
    """
    if request.POST.get("confirm") == "yes":
        return None
    count = queryset.order_by()[: COUNT_CAP + 1].count()
    preview = list(queryset.order_by("-id").values_list("id", "status_id")[:21])
    limit_note = ""
    if limit is not None and count > limit:
        limit_note = _("One run changes at most %(limit)d jobs (the newest first); run it again for the rest.") % {
            "limit": limit}
    back = request.POST.get("_sqlqueue_return")
    back_url = (reverse("admin:django_sqlqueue_job_change", args=[back]) if back and back.isascii()
                and back.isdigit() else reverse("admin:django_sqlqueue_job_changelist"))
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": verb, "verb": verb, "warning": warning, "button": button, "danger": danger,
        "opts": modeladmin.model._meta, "count": min(count, COUNT_CAP), "capped": count > COUNT_CAP,
        "preview": [(pk, Status(st).label) for pk, st in preview[:20]], "more": max(0, min(count, COUNT_CAP) - 20),
        "carried": carried_fields(request), "limit_note": limit_note, "back_url": back_url,
        "form_action": request.get_full_path(), "media": modeladmin.media,
    }
    return TemplateResponse(request, "admin/django_sqlqueue/confirm_action.html", context)


# ----- the actions (methods of JobAdmin through JobAdmin.actions) ------------------------------------
@admin.action(permissions=["retry"], description=gettext_lazy("Retry now"))
def retry_now(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Error / Failed / Cancelled / Paused / PartiallyCompleted -> Pending, due now."""
    return _transition(modeladmin, request, queryset, verb=_("Retry now"), permission="retry_job",
                       target=Status.PENDING)


@admin.action(permissions=["reschedule"], description=gettext_lazy("Retry at…"))
def retry_at(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """The same as Retry now, due at a chosen time: an intermediate form asks when."""
    return retry_at_view(modeladmin, request, queryset)


def apply_retry_at(modeladmin: Any, request: HttpRequest, queryset: QuerySet, when: datetime) -> Outcome:
    return run_transition(modeladmin, request, queryset, verb=_("Retry at"), permission="reschedule_job",
                          target=Status.PENDING, options=lambda job: {"scheduled_for": when},
                          note=_("due %(when)s") % {"when": when.isoformat(timespec="seconds")})


@admin.action(permissions=["reschedule"], description=gettext_lazy("Reset attempts and retry"))
def reset_attempts(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Back to Pending with the attempt count at zero; an Error job keeps its retry time."""

    def options(job: Job) -> dict[str, Any]:
        return {"reset_attempts": True, **(_keep_schedule(job) if job.state == Status.ERROR else {})}

    return _transition(modeladmin, request, queryset, verb=_("Reset attempts"), permission="reschedule_job",
                       target=Status.PENDING, options=options, note=_("attempts reset to 0"))


def _confirm(modeladmin: Any, request: HttpRequest, queryset: QuerySet, permission: str, verb: str,
             warning: str, button: str) -> HttpResponse | None:
    """The confirmation page, after the permission check (a page is not shown to who may not act)."""
    if not request.user.has_perm(f"django_sqlqueue.{permission}"):
        raise PermissionDenied(f"{verb} needs the django_sqlqueue.{permission} permission")
    return confirm_page(modeladmin, request, queryset, verb=verb, warning=warning, button=button,
                        limit=getattr(modeladmin, "action_batch_limit", ACTION_BATCH_LIMIT))


@admin.action(permissions=["cancel"], description=gettext_lazy("Cancel"))
def cancel(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Pending / Error / Paused -> Cancelled at once; a running job's worker is asked to stop it
    (:meth:`JobManager.cancel`): its handler is told, then its slot killed after the grace period.

    Asks for confirmation first: a cancelled job runs again only through an operator's retry.
    """
    from ..models import Job

    page = _confirm(modeladmin, request, queryset, "cancel_job", _("Cancel"),
                    _("Cancelled jobs do not run; an operator's retry brings one back. A running job is "
                      "stopped by its worker within a few seconds (Completed instead if it finishes first). "
                      "Finished jobs are left alone and reported."), _("Yes, cancel them"))
    if page is not None:
        return page
    user = getattr(request.user, "get_username", lambda: "?")()
    by = f"operator {user}"

    def ask_worker(job: Job, token: int) -> Job:
        return Job.objects.cancel(job, by=by, reason=_("cancelled in the admin"), token=token,
                                  using=job._state.db)

    return _transition(modeladmin, request, queryset, verb=_("Cancel"), permission="cancel_job",
                       target=Status.CANCELLED, on_running=ask_worker)


@admin.action(permissions=["pause"], description=gettext_lazy("Pause"))
def pause(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Pending / Error -> Paused: workers leave it alone until resumed."""
    return _transition(modeladmin, request, queryset, verb=_("Pause"), permission="pause_job",
                       target=Status.PAUSED)


@admin.action(permissions=["pause"], description=gettext_lazy("Resume"))
def resume(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Paused -> Pending, keeping the time it was scheduled for."""

    def refuse(job: Job) -> str | None:
        return None if job.state == Status.PAUSED else _("not Paused (%(status)s)") % {"status": job.state.label}

    return _transition(modeladmin, request, queryset, verb=_("Resume"), permission="pause_job",
                       target=Status.PENDING, options=_keep_schedule, refuse=refuse)


@admin.action(permissions=["cancel"], description=gettext_lazy("Mark terminated"))
def mark_terminated(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Pending / Processing / Error / Paused -> Terminated.

    For a running job: its worker's next write carries the old token and is refused, so the worker
    cannot bring it back. Terminated is final: a confirmation page says so and names the count first.
    """
    page = _confirm(modeladmin, request, queryset, "cancel_job", _("Mark terminated"),
                    _("Terminated is final: it cannot be undone, and no action runs a terminated job again. "
                      "A running job's worker is stopped from writing its result."), _("Yes, terminate them"))
    if page is not None:
        return page
    return _transition(modeladmin, request, queryset, verb=_("Mark terminated"), permission="cancel_job",
                       target=Status.TERMINATED)


@admin.action(permissions=["retry"], description=gettext_lazy("Requeue orphaned jobs"))
def requeue(modeladmin: Any, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
    """Orphaned Processing -> Pending, due now: its worker is stopped or stale, or its lease expired.

    The claim takes such jobs over by itself, but only a live worker serving their queue and type
    does (:mod:`.health`); this hands them back at once. A job whose worker is alive is refused: it is
    running. The attempt is given back (the history row says it was requeued, and by whom).
    """
    from ..models import Worker
    from ..ops.health import dead_q

    now = timezone.now()
    dead = set(Worker.objects.filter(dead_q(now)).values_list("name", flat=True))

    def refuse(job: Job) -> str | None:
        if job.state != Status.PROCESSING:
            return _("not Processing (%(status)s): only an orphaned running job is requeued") % {
                "status": job.state.label}
        orphan = (job.lease_expires_at is not None and job.lease_expires_at < now) or job.worker in dead
        if not orphan:
            return _("not orphaned: its worker is alive and its lease current (Mark terminated stops it)")
        return None

    user = getattr(request.user, "get_username", lambda: "?")()
    return _transition(modeladmin, request, queryset, verb=_("Requeue"), permission="retry_job",
                       target=Status.PENDING, refuse=refuse, take_running=True,
                       note=_("requeued by operator %(user)s") % {"user": user})


JOB_ACTIONS = [retry_now, retry_at, reset_attempts, requeue, cancel, pause, resume, mark_terminated]


class JobActionPermissions:
    """``has_<name>_permission`` methods the ``allowed_permissions`` of the actions refer to."""

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"django_sqlqueue.{codename}")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry_job")

    def has_reschedule_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "reschedule_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel_job")

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "pause_job")


#: Action name -> the status it moves a job to (what the job page's buttons are filtered by).
_TARGETS = {
    "retry_now": Status.PENDING, "retry_at": Status.PENDING, "reset_attempts": Status.PENDING,
    "cancel": Status.CANCELLED, "pause": Status.PAUSED, "resume": Status.PENDING,
    "mark_terminated": Status.TERMINATED, "requeue": Status.PENDING,
}


def applies(action_name: str, status: Status) -> bool:
    """Whether the action could move a job in ``status`` (the job page offers only these)."""
    from ..queue import CLAIM_ONLY
    from ..states import TRANSITIONS

    target = _TARGETS.get(action_name)
    if target is None:
        return False
    if action_name == "requeue":
        return status == Status.PROCESSING  # the job page offers it only to orphans
    if status == Status.PROCESSING and target not in (Status.TERMINATED, Status.CANCELLED):
        return False
    if action_name == "resume":
        return status == Status.PAUSED
    if status == Status.WAITING and target == Status.PENDING:
        return False  # released by its dependencies, not retried
    return target in TRANSITIONS[status] and (status, target) not in CLAIM_ONLY
