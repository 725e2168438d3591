"""Handlers of the notifications example (autodiscovered by django_sqlqueue, like admin.py).

- ``ResetPassword``: three steps, Render -> Send -> Confirm. Each finished step is persisted before the
  next starts, so a retry resumes at the step that failed. Send "delivers" to the local Outbox table
  (no network) and is idempotent: a message already in the outbox for this job and channel is not
  written twice. ``payload["fail_send_attempts"] = n`` makes Send fail on the job's first n attempts
  (a transient outage, for the demo).
- ``SendDigest``: one step, one outbox row; ``payload["fail_attempts"] = n`` fails the first n attempts.
- ``DeliverWebhook``: always fails (the host does not resolve), to show a job ending Failed.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django_sqlqueue import handler
from django_sqlqueue.sensitive import mark_sensitive

from .models import EmailChannel, Outbox, ResetPassword, SmsChannel

#: Demo-friendly retry settings, written to the job type rows by ``migrate`` (an operator may change them).
FAST_RETRIES = {"backoff_base_seconds": 0.5, "backoff_max_seconds": 5.0}

SUBJECTS = {"en": "Your password reset code", "fr": "Votre code de réinitialisation", "de": "Ihr Code"}


class TransientDeliveryError(ConnectionError):
    """The (simulated) mail or SMS relay is unavailable; retrying later will work."""


def _channels(job: Any) -> list[EmailChannel | SmsChannel]:
    return [row for row in (job.subtype(EmailChannel), job.subtype(SmsChannel)) if row is not None]


def _planned_failure(job: Any, key: str, what: str) -> None:
    planned = int((job.payload or {}).get(key, 0))
    if job.attempt_num <= planned:
        raise TransientDeliveryError(
            f"{what} unavailable (demo: planned failure {job.attempt_num} of {planned})"
        )


# The rendered messages carry the reset code: the admin masks their bodies for users without
# "Can view sensitive job data" (the code column of the subtype row is marked on the model).
mark_sensitive("ResetPassword", "body")


@handler("ResetPassword", steps=["Render", "Send", "Confirm"], max_attempts=4,
         description="Password reset code by email and/or SMS (Render -> Send -> Confirm)", **FAST_RETRIES)
def reset_password(job: Any, step: str) -> Any:
    data = job.subtype(ResetPassword)
    if data is None:
        job.cancel("no ResetPassword row for this job")
    if step == "Render":
        return render_reset(data, _channels(job))
    if step == "Send":
        return send_rendered(job, job.results["Render"])
    return confirm(job)


def render_reset(data: ResetPassword, channels: list[EmailChannel | SmsChannel]) -> dict[str, Any]:
    messages: dict[str, Any] = {}
    for row in channels:
        if isinstance(row, EmailChannel):
            subject = SUBJECTS.get(row.preferred_language, SUBJECTS["en"])
            messages["email"] = {
                "to": row.email_to,
                "subject": subject,
                "body": f"Hello {data.username},\n\nyour code is {data.otp}. It expires in 15 minutes.\n",
            }
        else:
            messages["sms"] = {"to": row.phone, "body": f"Code {data.otp} (valid 15 min)"}
    return messages


def send_rendered(job: Any, messages: dict[str, Any]) -> dict[str, int]:
    """Write each rendered message to the outbox once; record each channel's outcome on its row."""
    sent: dict[str, int] = {}
    rows = {("email" if isinstance(r, EmailChannel) else "sms"): r for r in _channels(job)}
    for channel in ("email", "sms"):
        if channel not in messages:
            continue
        row = rows[channel]
        if channel == "sms":
            # Fail between the two channels: the retry must not send the email twice.
            try:
                _planned_failure(job, "fail_send_attempts", "SMS gateway")
            except TransientDeliveryError as exc:
                row.error = str(exc)
                row.save(update_fields=["error"])
                raise
        msg = messages[channel]
        body = f"{msg['subject']}\n\n{msg['body']}" if channel == "email" else msg["body"]
        outbox, created = Outbox.objects.get_or_create(
            job_id=job.pk, channel=channel, defaults={"recipient": msg["to"], "body": body}
        )
        row.response = {"outbox_id": outbox.pk, "written_now": created}
        row.error = ""
        row.save(update_fields=["response", "error"])
        sent[channel] = outbox.pk
    if "sms" not in messages:
        _planned_failure(job, "fail_send_attempts", "mail relay")
    return sent


def confirm(job: Any) -> dict[str, Any]:
    delivered = sorted(Outbox.objects.filter(job_id=job.pk).values_list("channel", flat=True))
    expected = sorted("email" if isinstance(r, EmailChannel) else "sms" for r in _channels(job))
    if delivered != expected:
        raise RuntimeError(f"outbox holds {delivered}, expected {expected}")
    return {"delivered": delivered}


@handler("SendDigest", max_attempts=3, description="Weekly digest e-mail (one outbox row)", **FAST_RETRIES)
def send_digest(job: Any) -> dict[str, Any]:
    _planned_failure(job, "fail_attempts", "mail relay")
    payload = job.payload or {}
    outbox, _ = Outbox.objects.get_or_create(
        job_id=job.pk, channel="email",
        defaults={"recipient": payload.get("email", ""),
                  "body": f"Your digest: {int(payload.get('items', 0))} new items"},
    )
    return {"outbox_id": outbox.pk}


@handler("DeliverWebhook", max_attempts=2, description="POST an event to a customer webhook (demo: always fails)",
         **FAST_RETRIES)
def deliver_webhook(job: Any) -> None:
    host = urlsplit((job.payload or {}).get("url", "")).hostname or "?"
    raise ConnectionError(f"cannot reach {host}: name does not resolve (demo: always fails)")
