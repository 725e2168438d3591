"""The seeds' notification example made real: typed subtype tables on the base job table."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from django_sqlqueue.models import InclusiveJobData, JobData


class ResetPassword(JobData):
    """Exclusive subtype: exactly one per ResetPassword job."""

    job_type_name = "ResetPassword"
    #: The one-time code: masked in the admin for users without "Can view sensitive job data".
    sensitive_fields = ("otp",)

    user_id = models.BigIntegerField()
    username = models.CharField(max_length=150)
    otp = models.CharField(max_length=12, validators=[RegexValidator(r"^[0-9]{6,12}$", "a 6-12 digit code")])

    class Meta:
        verbose_name = "reset password data"
        verbose_name_plural = "reset password data"


class EmailChannel(InclusiveJobData):
    """Inclusive subtype: a notification may go out by email (and by SMS too)."""

    email_to = models.EmailField()
    preferred_language = models.CharField(max_length=10, default="en")

    class Meta:
        verbose_name = "email channel"


class SmsChannel(InclusiveJobData):
    """Inclusive subtype: delivery by SMS."""

    phone = models.CharField(max_length=32, validators=[RegexValidator(r"^\+?[0-9 ]{6,31}$", "a phone number")])

    class Meta:
        verbose_name = "SMS channel"


class Outbox(models.Model):
    """Where the example's Send step 'delivers' messages: a local table, no network."""

    job_id = models.BigIntegerField(db_index=True)
    channel = models.CharField(max_length=10)
    recipient = models.CharField(max_length=254)
    body = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "outbox"
