"""Enqueueing notifications: the base job and its subtype rows in one transaction."""

from __future__ import annotations

import secrets
from datetime import datetime

from django_sqlqueue.models import Job, JobData

from .models import EmailChannel, ResetPassword, SmsChannel

QUEUE = "notifications"


def request_password_reset(
    *,
    user_id: int,
    username: str,
    email: str | None = None,
    phone: str | None = None,
    language: str = "en",
    fail_send_attempts: int = 0,
    scheduled_for: datetime | None = None,
) -> Job:
    """Enqueue a ResetPassword job with its exclusive row and one inclusive row per channel.

    All or nothing: a row that does not validate (a bad phone number, say) rolls back the job too.
    One unfinished reset per user: asking again while one is pending returns the pending job.
    """
    if not email and not phone:
        raise ValueError("a password reset needs an e-mail address, a phone number, or both")
    otp = f"{secrets.randbelow(10**6):06d}"
    rows: list[JobData] = [ResetPassword(user_id=user_id, username=username, otp=otp)]
    if email:
        rows.append(EmailChannel(email_to=email, preferred_language=language))
    if phone:
        rows.append(SmsChannel(phone=phone))
    payload = {"fail_send_attempts": fail_send_attempts} if fail_send_attempts else {}
    return Job.objects.enqueue(
        "ResetPassword", payload, queue=QUEUE, priority=10, scheduled_for=scheduled_for,
        dedupe_key=f"reset-password:{user_id}", subtypes=rows,
    )
