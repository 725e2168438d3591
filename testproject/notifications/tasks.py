"""A Django Tasks example: with ``TASKS`` pointing at django_sqlqueue.tasks.SqlQueueBackend, this runs
under ``run_queue_worker`` with retries, leases and history, its job type being its import path."""

from __future__ import annotations

from django.tasks import TaskContext, task

from .models import Outbox


@task(takes_context=True)
def send_welcome_email(context: TaskContext, user_id: int, email: str) -> dict[str, int]:
    # The result id is the job id: keying the outbox row on it makes a retried attempt write nothing twice.
    outbox, _ = Outbox.objects.get_or_create(
        job_id=int(context.task_result.id), channel="email",
        defaults={"recipient": email, "body": f"Welcome aboard, user {user_id}!"},
    )
    return {"outbox_id": outbox.pk, "attempt": context.attempt}
