"""Every ``python`` code block of README.md and docs/*.md runs (issue 20 item 8), so the docs cannot drift.

The blocks of one page run in order in one namespace, as a reader pastes them. A block headed by a
module path comment (``# myapp/jobs.py``) is written to that file in a temporary directory on
``sys.path`` and imported, so its handlers register and its ``@task`` functions are importable, the way
they are in a project; ``# settings.py`` and ``# urls.py`` blocks run on their own. The names the
prose takes for granted (``user``, ``email``, ``job_id``, ``User``) are given below. A block that
cannot run standalone is preceded in the page by ``<!-- docs-test: skip: REASON -->``; one that shows
what a worker has done by ``<!-- docs-test: after a worker -->`` (the due jobs are run first).
"""

from __future__ import annotations

import importlib
import re
import sys
import tempfile
from pathlib import Path

import pytest

from django_sqlqueue import jobtypes
from django_sqlqueue.handlers import registry

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- docs-test: (?P<marker>[^>]*?) -->\n)?```python\n(?P<code>.*?)^```", re.S | re.M)
MODULE_HEADER = re.compile(r"^# (?P<path>[\w/]+)\.py\s*$")

pytestmark = pytest.mark.django_db


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, marker, code) of every python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(text[:m.start("code")].count("\n") + 1, m.group("marker") or "", m.group("code"))
            for m in BLOCK.finditer(text)]


def run_due_jobs() -> None:
    from .test_tasks_defs import run_one

    while run_one("docs") is not None:
        pass


@pytest.fixture
def page_sandbox(tmp_path, monkeypatch):
    """A temporary directory on sys.path for the page's modules; the registry and modules restored after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    handlers, before = dict(registry._handlers), set(sys.modules)
    yield tmp_path
    registry._handlers.clear()
    registry._handlers.update(handlers)
    registry._unresolved.clear()
    for name in set(sys.modules) - before:
        # the page's own modules (myapp, shop, ...): another page may write a module of the same name
        if name.split(".")[0] == "myapp" or str(getattr(sys.modules[name], "__file__", None) or "").startswith(
                str(tmp_path)):
            del sys.modules[name]
    jobtypes.clear_cache()


def reader_namespace() -> dict[str, object]:
    """What the prose around the blocks takes for granted: a user just created, a job's id."""
    from django.contrib.auth.models import User

    from django_sqlqueue import Status, enqueue
    from django_sqlqueue.models import Job

    job = enqueue("test.Noop", {})
    Job.objects.modify(job, job.version, Status.PAUSED)  # a job an operator may act on
    return {"BASE_DIR": Path(tempfile.gettempdir()),  # settings.py's, as startproject writes it
            "User": User, "email": "newcomer@example.com",
            "user": User.objects.create(username="newcomer", email="newcomer@example.com"), "job_id": job.pk}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_code_block_runs(page: Path, page_sandbox: Path) -> None:
    namespace = reader_namespace()
    for line, marker, code in blocks(page):
        where = f"{page.relative_to(ROOT)}:{line}"
        if marker.startswith("skip:"):
            assert marker[5:].strip(), f"{where}: a skipped block needs a reason"
            continue
        assert marker in ("", "after a worker"), f"{where}: unknown marker {marker!r}"
        if marker == "after a worker":
            run_due_jobs()
        header = MODULE_HEADER.match(code.splitlines()[0])
        try:
            if header and "/" in header["path"]:  # an app's module: a file in a package, imported
                path = page_sandbox / f"{header['path']}.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                for parent in path.relative_to(page_sandbox).parents:
                    (page_sandbox / parent / "__init__.py").touch()
                path.write_text(code, encoding="utf-8")
                module = importlib.import_module(header["path"].replace("/", "."))
                namespace.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
            elif header:  # settings.py, urls.py: on their own
                exec(compile(code, where, "exec"), {"__name__": header["path"]})
            else:
                exec(compile(code, where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{where}: the code block fails: {exc!r}\n{code}") from exc


def test_the_skip_list_is_short() -> None:
    skipped = [(p.name, line, m) for p in PAGES for line, m, _ in blocks(p) if m.startswith("skip:")]
    ran = sum(1 for p in PAGES for _, m, _ in blocks(p) if not m.startswith("skip:"))
    assert len(skipped) <= 6 and ran >= 3 * len(skipped), skipped
