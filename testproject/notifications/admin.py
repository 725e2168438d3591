"""Admin for the example's outbox (the job admin shows the subtype rows inline)."""

from __future__ import annotations

from django.contrib import admin

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
