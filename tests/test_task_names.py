"""A dotted job type name imports nothing but tasks (issue 21 finding 11).

The Tasks resolver imported any importable module named by a job type, running its top-level code, in
a worker and in a web process on a refused enqueue. Now it imports a name only where it is a task:
a module of an installed app, or a type row the Tasks backend created for a real ``@task``.
"""

from __future__ import annotations

import sys
import uuid

import pytest

from django_sqlqueue import UnknownJobType, enqueue
from django_sqlqueue.handlers import registry
from django_sqlqueue.models import JobType
from django_sqlqueue.tasks import runner as task_runner
from testproject.notifications.tasks import send_welcome_email

from . import test_tasks_defs as defs

pytestmark = pytest.mark.django_db


@pytest.fixture
def side_effect_module(tmp_path, monkeypatch):
    """An importable module whose top-level code leaves a marker file; returns (module name, marker)."""
    name = f"sq_side_effect_{uuid.uuid4().hex}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\nfn = print\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def test_a_refused_enqueue_imports_nothing(side_effect_module) -> None:
    module, marker = side_effect_module
    with pytest.raises(UnknownJobType):
        enqueue(f"{module}.fn", {})
    assert not marker.exists() and module not in sys.modules


def test_a_worker_does_not_import_a_dotted_type_an_operator_created(side_effect_module) -> None:
    module, marker = side_effect_module
    JobType.objects.create(name=f"{module}.fn")  # not created by the Tasks backend: not flagged as a task
    with pytest.raises(UnknownJobType):
        registry.get(f"{module}.fn")
    assert task_runner.resolve(f"{module}.fn") is None
    assert not marker.exists() and module not in sys.modules


def test_tasks_still_resolve_from_installed_apps_and_from_rows_the_backend_flagged() -> None:
    assert task_runner.may_import(send_welcome_email.module_path)  # an installed app's module
    name = defs.noop_task.module_path  # tests.test_tasks_defs: not an installed app...
    assert not task_runner.may_import(name, imported_ok=False)
    defs.noop_task.enqueue()  # ...but the backend enqueued a real @task under it
    assert JobType.objects.get(name=name).is_task
    assert task_runner.may_import(name, imported_ok=False)
