"""Helpers and fixtures shared by the admin tests (no tests here).

Jobs are put into each status the way production does where that is cheap (enqueue, claim, fail);
for the statuses only reachable through a long history, the row is set directly, with a version bump
as every real write does.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db.models import F
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue.models import Job, JobType, Worker
from django_sqlqueue.states import Status

CHANGELIST = "admin:django_sqlqueue_job_changelist"
TYPE_NAME = "AdminTest"


def changelist_url(**params: Any) -> str:
    from urllib.parse import urlencode

    url = reverse(CHANGELIST)
    return f"{url}?{urlencode(params)}" if params else url


def ids_in(response: Any) -> list[int]:
    """The ids of the jobs a changelist response lists, in its order."""
    return [obj.pk for obj in response.context["cl"].result_list]


def change_url(job: Job) -> str:
    return reverse("admin:django_sqlqueue_job_change", args=[job.pk])


def make_job(status: Status = Status.PENDING, payload: Any = None, **fields: Any) -> Job:
    """A job of type ``AdminTest`` in ``status``; extra ``fields`` are written to the row."""
    JobType.objects.get_or_create(name=TYPE_NAME)
    queue = fields.pop("queue", "default")
    job = Job.objects.enqueue(TYPE_NAME, payload if payload is not None else {"n": 1},
                              queue=f"claim-{uuid.uuid4().hex}" if status == Status.PROCESSING else queue,
                              dedupe_key=fields.pop("dedupe_key", None))
    if status == Status.PROCESSING:
        # A real claim (attempt + 1, lease, history row), from a queue of its own so it takes this job.
        claimed = Job.objects.claim(fields.pop("worker", "w-admin"), 1, queues=[job.queue])
        assert [j.pk for j in claimed] == [job.pk]
        Job.objects.filter(pk=job.pk).update(queue=queue)  # not a lifecycle change: no version bump
    elif status != Status.PENDING:
        fields.setdefault("status_id", int(status))
        if status in (Status.FAILED, Status.ERROR):
            fields.setdefault("error", "Traceback (most recent call last):\nValueError: boom")
            fields.setdefault("attempt_num", 3 if status == Status.FAILED else 1)
        if status in (Status.FAILED, Status.COMPLETED, Status.CANCELLED, Status.TERMINATED):
            fields.setdefault("finished_at", timezone.now())
    if fields:
        Job.objects.filter(pk=job.pk).update(version=F("version") + 1, **fields)
    return Job.objects.get(pk=job.pk)


def token_in_page(html: str, job: Job) -> int:
    """The concurrency token the changelist rendered next to ``job``'s checkbox."""
    match = re.search(rf'name="_token_{job.pk}" value="(\d+)"', html)
    assert match, f"no token rendered for job {job.pk}"
    return int(match.group(1))


def post_action(client: Client, action: str, jobs: list[Job], *, tokens: dict[int, int] | None = None,
                url: str | None = None, follow: bool = True, **extra: Any) -> Any:
    data: dict[str, Any] = {"action": action, "index": "0", "_selected_action": [str(j.pk) for j in jobs]}
    for job in jobs:
        data[f"_token_{job.pk}"] = str((tokens or {}).get(job.pk, job.version))
    data.update(extra)
    return client.post(url or changelist_url(), data, follow=follow)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def user_with(*codenames: str, username: str = "operator") -> User:
    """A staff user holding exactly these django_sqlqueue permissions."""
    user = User.objects.create_user(username, is_staff=True)  # force_login: no password to hash
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_sqlqueue",
                                                        codename__in=codenames))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def make_worker(name: str, *, heartbeat_age: float = 0, stopped: bool = False, **fields: Any) -> Worker:
    now = timezone.now()
    return Worker.objects.create(name=name, host=fields.pop("host", "host-1"), pid=fields.pop("pid", 123),
                                 started_at=now - timedelta(hours=1),
                                 last_heartbeat=now - timedelta(seconds=heartbeat_age),
                                 stopped_at=now if stopped else None, **fields)


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    """admin_client's superuser has a password: hash it cheaply (PBKDF2 costs ~0.3 s per user)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def fresh_admin_caches():
    """The queue / step dropdown choices are cached per process: start each test without them."""
    from django_sqlqueue.admin import filters as admin_filters

    admin_filters._choices_cache.clear()
    yield
    admin_filters._choices_cache.clear()


@pytest.fixture
def operator_client(client: Client):
    """A client logged in as a staff user with all four job permissions and view_job."""
    user = user_with("view_job", "retry_job", "cancel_job", "reschedule_job", "pause_job", "view_jobtype",
                     "change_jobtype", "view_worker", username="allperms")
    client.force_login(user)
    return client
