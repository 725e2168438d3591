"""Security pass: hostile strings are data everywhere, the admin keeps CSRF, the worker never evaluates data.

Not repeated here (covered elsewhere): a hostile queue name through enqueue and claim
(test_enqueue.py), admin actions without their permission and crafted POSTs (test_admin_actions.py),
``<script>`` payloads rendered as text (test_admin_pages.py, test_browser_admin.py).
"""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

import django_sqlqueue
from django_sqlqueue import jobtypes
from django_sqlqueue.models import Job, JobAttempt, JobType, Worker
from django_sqlqueue.ops.diagnose import diagnose, why_not_running
from django_sqlqueue.queue import JobSpec
from django_sqlqueue.states import Status
from tests import procutil
from tests import workerutil as wu
from tests.workerutil import REPO

MARK = "zq9MARKzq9"
#: Quotes of every dialect, comment and statement separators, placeholders of every DB-API style and
#: of Python's % formatting, a backslash, a NUL-free non-ASCII character and a unique marker.
HOSTILE = f"x'\"`]); DROP TABLE django_sqlqueue_job; --/**/ %s %% %(a)s ? :1 $1 \\ \u2603 {MARK}"
PACKAGE = Path(django_sqlqueue.__file__).parent


class SqlLog:
    """Every statement sent to the database, as text and parameters, kept apart (execute_wrapper)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute, sql, params, many, context):
        self.statements.append((sql, params))
        return execute(sql, params, many, context)

    def with_marker_in_sql(self) -> list[str]:
        return [sql for sql, _ in self.statements if MARK in sql]

    def with_marker_in_params(self) -> int:
        return sum(1 for _, params in self.statements if MARK in repr(params))


@contextlib.contextmanager
def sql_log():
    log = SqlLog()
    with connection.execute_wrapper(log):
        yield log


# ----- every path to raw SQL, fed hostile strings ---------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_hostile_strings_are_data_through_the_whole_api() -> None:
    type_name = f"T {HOSTILE}"
    queue = HOSTILE[:100]
    worker = f"w {HOSTILE}"
    step = HOSTILE[:100]
    payload = {HOSTILE: [HOSTILE, {"nested": HOSTILE}], "n": 1}
    with sql_log() as log:
        jobtypes.get_type(type_name, using="default", create=True)
        first = Job.objects.enqueue(type_name, payload, queue=queue, dedupe_key=HOSTILE)
        again = Job.objects.enqueue(type_name, {"other": 1}, queue=queue, dedupe_key=HOSTILE)
        many = Job.objects.enqueue_many([JobSpec(type_name, payload, queue=queue, dedupe_key=f"{HOSTILE}-{i}")
                                         for i in range(3)] + [JobSpec(type_name, payload, queue=queue)])
        Worker.objects.create(name=worker, started_at=first.enqueued_at, last_heartbeat=first.enqueued_at)
        claimed = Job.objects.claim(worker, 10, queues=[queue], types=[type_name])
        assert Job.objects.renew_leases(worker, [j.pk for j in claimed], 30) == len(claimed)
        job = next(j for j in claimed if j.pk == first.pk)
        job = Job.objects.advance_step(job, step, response={"partial": HOSTILE})
        job = Job.objects.fail(job, f"Traceback: {HOSTILE}", retry_in=0)
        # The diagnosis reads the job and its type back: due, attempts left, a live worker serving it,
        # only the handler missing in this process's code.
        assert why_not_running(job) == []
        [*_, reason] = diagnose(job).lines
        assert reason.startswith(f"No handler for {type_name!r} is registered in this code"), reason
        for other in claimed:
            if other.pk != first.pk:
                Job.objects.modify(other, other.version, Status.CANCELLED, error=HOSTILE)
        retried = Job.objects.claim(worker, 1, queues=[queue], types=[type_name])
        assert [j.pk for j in retried] == [first.pk]
        done = Job.objects.complete(retried[0], response={HOSTILE: HOSTILE})
        Job.objects.reap()
        Job.objects.get_for_update(first.pk)
        list(Job.objects.with_status("Completed").filter(queue=queue, dedupe_key=HOSTILE))
    assert log.with_marker_in_sql() == []
    assert log.with_marker_in_params() > 10  # the strings did go to the database, as parameters
    # ... and came back unchanged.
    assert again.pk == first.pk
    assert len({j.pk for j in many}) == 4
    done = Job.objects.get(pk=done.pk)
    assert (done.queue, done.dedupe_key, done.payload, done.step) == (queue, HOSTILE, payload, step)
    assert done.response == {HOSTILE: HOSTILE} and done.job_type.name == type_name
    assert [a.worker for a in JobAttempt.objects.filter(job=done)] == [worker, worker]
    assert HOSTILE in JobAttempt.objects.get(job=done, attempt_num=1).error
    assert Job.objects.filter(queue=queue).count() == 5  # the table is still there, and whole


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_hostile_names_on_the_worker_command_line_are_data() -> None:
    queue = HOSTILE[:100]
    worker = f"w {HOSTILE}"[:190]
    mine = Job.objects.enqueue("test.Echo", {"text": HOSTILE}, queue=queue)
    other = Job.objects.enqueue("test.Echo", {"text": "not mine"}, queue="default")
    env = procutil.test_db_env()
    out = subprocess.run([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--burst", "--no-progress",
                          "--queue", queue, "--type", "test.Echo", "--worker-name", worker],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    mine = Job.objects.get(pk=mine.pk)
    assert mine.state == Status.COMPLETED and mine.response["payload"] == {"text": HOSTILE}
    assert mine.worker == f"{worker}/0"
    assert Job.objects.get(pk=other.pk).state == Status.PENDING
    assert Worker.objects.filter(name=f"{worker}/0").exists()


# ----- the admin -------------------------------------------------------------------------------------------
@pytest.fixture
def superuser(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return User.objects.create_superuser("root", "root@example.invalid", "pw")


@pytest.mark.django_db
def test_hostile_admin_filters_and_search_are_data(superuser) -> None:
    JobType.objects.create(name=f"T {HOSTILE}")
    target = Job.objects.enqueue(f"T {HOSTILE}", {"x": HOSTILE}, queue=HOSTILE[:100], dedupe_key=HOSTILE)
    plain = Job.objects.enqueue(f"T {HOSTILE}", {"x": 1}, queue="plain")
    client = Client()
    client.force_login(superuser)
    url = reverse("admin:django_sqlqueue_job_changelist")
    both = sorted([target.pk, plain.pk])
    #: What each hostile parameter must give: the jobs listed, or (ERROR_PAGE) the changelist's redirect
    #: for parameters it refuses (Django's ``?e=1``), never a server error or another page.
    ERROR_PAGE = "refused"
    expected: dict[str, Any] = {
        "queue": [target.pk], "q": [target.pk],  # matched as data, exactly
        "worker": [], "step": [],  # no job has them
        "o": both, "p": both,  # an ordering or page it does not know: ignored
        "type": ERROR_PAGE, "status": ERROR_PAGE, "overdue": ERROR_PAGE, "lease_expired": ERROR_PAGE,
        "has_error": ERROR_PAGE, "enqueued_at__year": ERROR_PAGE,
    }
    with sql_log() as log:
        for name, want in expected.items():
            value = HOSTILE[:100] if name == "queue" else HOSTILE
            response = client.get(url, {name: value})
            if want == ERROR_PAGE:
                assert (response.status_code, response.headers.get("Location")) == (302, f"{url}?e=1"), name
            else:
                assert response.status_code == 200, (name, response.status_code)
                assert sorted(j.pk for j in response.context["cl"].result_list) == want, name
        page = client.get(reverse("admin:django_sqlqueue_job_change", args=[target.pk]))
    assert log.with_marker_in_sql() == []
    assert page.status_code == 200 and MARK in page.content.decode()


@pytest.mark.django_db
def test_admin_actions_keep_csrf_protection(superuser) -> None:
    JobType.objects.get_or_create(name="Noop")
    job = Job.objects.enqueue("Noop")
    client = Client(enforce_csrf_checks=True)
    client.force_login(superuser)
    url = reverse("admin:django_sqlqueue_job_changelist")
    data = {"action": "cancel", "index": "0", "_selected_action": [str(job.pk)], f"_token_{job.pk}": str(job.version),
            "confirm": "yes"}
    response = client.post(url, data)
    assert response.status_code == 403 and b"CSRF" in response.content
    assert Job.objects.get(pk=job.pk).state == Status.PENDING
    # With the token the page hands out, the same POST goes through: the check is on, not the action off.
    page = client.get(url)
    data["csrfmiddlewaretoken"] = page.context["csrf_token"]
    done = client.post(url, data)
    assert (done.status_code, done.headers.get("Location")) == (302, url)  # done, back to the list
    assert Job.objects.get(pk=job.pk).state == Status.CANCELLED


@pytest.mark.django_db
def test_admin_pages_send_no_cache_and_frame_headers(superuser) -> None:
    client = Client()
    client.force_login(superuser)
    response = client.get(reverse("admin:django_sqlqueue_job_changelist"))
    assert response.headers["X-Frame-Options"] == "DENY"
    assert "no-cache" in response.headers.get("Cache-Control", "") or "private" in response.headers.get(
        "Cache-Control", "")
    anonymous = Client().get(reverse("admin:django_sqlqueue_job_changelist"))
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
    dashboard = Client().get(reverse("admin:django_sqlqueue_dashboard"))
    assert dashboard.status_code == 302 and "/login/" in dashboard.headers["Location"]


# ----- nothing from the database is unpickled or evaluated -----------------------------------------------------
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "yaml", "jsonpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
#: The only modules that may import by name: the Django Tasks resolver, which imports only an object that
#: is a django.tasks.Task (tasks.runner.load_task) and never evaluates the payload.
IMPORT_BY_NAME_ALLOWED = {"tasks/runner.py", "tasks/backend.py"}


def _package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


_BUILTINS = {"builtins", "__builtins__"}


def forbidden(source: str, name: str) -> list[str]:
    """What in ``source`` unpickles, evaluates or imports by name: eval/exec/compile/__import__ called by
    name, through the builtins module (``builtins.eval``, ``__builtins__["exec"]``), fetched with
    ``getattr(..., "eval")`` or imported (``from builtins import eval``); ``.eval``/``.exec`` called on
    anything."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        where = f"{name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and
                                                    node.module else [])
            bad = {n.split(".")[0] for n in names} & FORBIDDEN_MODULES
            if bad:
                found.append(f"{where} imports {bad}")
            if "import_string" in names or "import_module" in names:
                if name not in IMPORT_BY_NAME_ALLOWED:
                    found.append(f"{where} imports by name")
            if isinstance(node, ast.ImportFrom) and node.module in _BUILTINS:
                found.extend(f"{where} imports builtins.{a.name}" for a in node.names if a.name in FORBIDDEN_CALLS)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                found.append(f"{where} calls {func.id}()")
            elif isinstance(func, ast.Attribute) and (
                    func.attr in {"eval", "exec", "__import__"}
                    or (func.attr in FORBIDDEN_CALLS and isinstance(func.value, ast.Name) and func.value.id in _BUILTINS)):
                found.append(f"{where} calls {ast.unparse(func)}()")
            elif (isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value in FORBIDDEN_CALLS):
                found.append(f"{where} fetches {node.args[1].value} with getattr()")
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and node.slice.value in FORBIDDEN_CALLS):
            found.append(f"{where} fetches {node.slice.value} by key")
    return found


def test_the_scan_finds_eval_however_it_is_reached() -> None:
    for source in ["eval('1')", "exec('x = 1')", "import builtins\nbuiltins.eval('1')", "builtins.exec('x')",
                   "__builtins__['eval']('1')", "getattr(builtins, 'exec')('x')", "from builtins import eval as e",
                   "import pickle", "from marshal import loads", "__import__('os')", "builtins.compile('1', '', 'eval')",
                   "from django.utils.module_loading import import_string"]:
        assert forbidden(source, "sample.py"), source
    assert forbidden("re.compile('x'); cursor.execute('SELECT 1'); d['name']", "sample.py") == []


def test_the_package_has_no_unpickling_or_eval() -> None:
    found = [f for path in _package_sources() for f in forbidden(path.read_text(encoding="utf-8"),
                                                                    path.relative_to(PACKAGE).as_posix())]
    assert found == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("type_name", ["builtins.eval", "builtins.exec", "os.system", "subprocess.getoutput",
                                       "pickle.loads", "django.utils.module_loading.import_string"])
def test_a_callable_named_by_a_job_type_is_never_called(tmp_path, type_name) -> None:
    """A job whose type names a dangerous callable (written straight into the tables, as an attacker with
    database access could) is a type without a handler: not claimed; its payload is never run."""
    probe = tmp_path / "pwned"
    code = f"__import__('pathlib').Path({str(probe)!r}).touch()"
    JobType.objects.create(name=type_name, max_attempts=1)
    jobtypes.clear_cache()
    job = Job.objects.enqueue(type_name, {"args": [code], "kwargs": {}, "cmd": f"touch {probe}"})
    wu.run_worker("probe")
    job = Job.objects.get(pk=job.pk)
    assert not probe.exists()
    assert job.state == Status.PENDING and job.attempt_num == 0  # not claimed: no handler (worker/serving.py)


@pytest.mark.django_db(transaction=True)
def test_payload_strings_that_look_like_pickles_or_code_stay_strings() -> None:
    import base64
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    blob = base64.b64encode(pickle.dumps(Boom())).decode()
    payload = {"pickle": blob, "protocol0": pickle.dumps(Boom(), protocol=0).decode("ascii"), "code": "__import__('os')",
               "__class__": "os.system", "$type": "System.Diagnostics.Process"}
    job = Job.objects.enqueue("test.Echo", payload)
    wu.run_worker("echo")
    job = Job.objects.get(pk=job.pk)
    assert job.state == Status.COMPLETED and job.response["payload"] == payload
