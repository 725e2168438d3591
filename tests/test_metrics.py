"""The Prometheus endpoint (protected, read from the queue tables); OpenTelemetry is test_tracing.py's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue.models import Job
from django_sqlqueue.states import Status
from tests.test_admin_support import (  # noqa: F401  (fixtures)
    TYPE_NAME,
    fast_password_hasher,
    fresh_admin_caches,
    make_job,
    make_worker,
    user_with,
)

pytest.importorskip("prometheus_client")
pytestmark = pytest.mark.django_db

URL = "sqlqueue-metrics"


def sample(text: str, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_metrics_need_a_token_or_a_staff_viewer(client, settings) -> None:
    assert client.get(reverse(URL)).status_code == 403
    client.force_login(user_with(username="staff-no-perm"))
    assert client.get(reverse(URL)).status_code == 403
    settings.SQLQUEUE_METRICS_TOKEN = "s3cret"
    assert client.get(reverse(URL), headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert client.get(reverse(URL), headers={"Authorization": "Bearer s3cret"}).status_code == 200
    client.force_login(user_with("view_job", username="viewer-m"))
    assert client.get(reverse(URL)).status_code == 200


def test_metrics_report_depth_age_recent_outcomes_runtime_and_workers(admin_client) -> None:
    make_job(queue="emails")
    make_job(queue="emails")
    old = make_job(queue="reports")
    Job.objects.filter(pk=old.pk).update(scheduled_for=timezone.now() - timedelta(minutes=10))
    done = make_job(Status.COMPLETED)
    Job.objects.filter(pk=done.pk).update(duration_ms=1500)
    make_job(Status.FAILED)
    make_job(Status.COMPLETED)  # finished long ago: outside the window
    Job.objects.filter(status_id=Status.COMPLETED).exclude(pk=done.pk).update(
        finished_at=timezone.now() - timedelta(hours=2))
    make_job(Status.PROCESSING, worker="w-gone")
    make_worker("w-gone", stopped=True)
    make_worker("w-live")
    response = admin_client.get(reverse(URL))
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert sample(text, "sqlqueue_jobs", queue="emails", type=TYPE_NAME, status="Pending") == 2
    assert sample(text, "sqlqueue_jobs", status="Completed") is None  # finished jobs are not counted
    assert 590 < sample(text, "sqlqueue_oldest_due_age_seconds") < 700
    assert sample(text, "sqlqueue_jobs_finished_recent", type=TYPE_NAME, status="Completed") == 1
    assert sample(text, "sqlqueue_jobs_finished_recent", type=TYPE_NAME, status="Failed") == 1
    assert sample(text, "sqlqueue_job_run_seconds_bucket", type=TYPE_NAME, le="1.0") == 0
    assert sample(text, "sqlqueue_job_run_seconds_bucket", type=TYPE_NAME, le="2.5") == 1
    assert sample(text, "sqlqueue_workers", state="alive") == 1
    assert sample(text, "sqlqueue_workers", state="stopped") == 1
    assert sample(text, "sqlqueue_orphaned_jobs") == 1
