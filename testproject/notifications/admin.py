"""Admin for the example's outbox (the job admin shows the subtype rows inline)."""

from __future__ import annotations

from django.contrib import admin

from django_sqlqueue.sensitive import PERMISSION

from .models import Outbox


@admin.register(Outbox)
class OutboxAdmin(admin.ModelAdmin):
    list_display = ["id", "job_id", "channel", "recipient", "sent_at"]
    list_filter = ["channel"]
    search_fields = ["recipient", "=job_id"]
    date_hierarchy = "sent_at"
    readonly_fields = ["job_id", "channel", "recipient", "body", "sent_at"]
    ordering = ["-id"]

    def has_add_permission(self, request) -> bool:  # written by the Send step only
        return False

    def get_readonly_fields(self, request, obj=None):
        # A message body holds the reset code: only who may view sensitive job data sees it.
        if request.user.has_perm(PERMISSION):
            return self.readonly_fields
        return [f for f in self.readonly_fields if f != "body"]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj)
