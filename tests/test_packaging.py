"""Building the package from a checkout leaves the checkout as it was (issue 20 item 9).

setuptools wrote ``build/`` and ``django_sqlqueue.egg-info`` into the source tree on ``pip install .``;
the build backend now builds out of tree. The wheel must still carry the templates, static files and
migrations. Builds a copy of the checkout's tracked files with pip (which fetches the build backend).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import django_sqlqueue

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(600)


def test_building_a_wheel_writes_nothing_into_the_checkout(tmp_path) -> None:
    import os

    if os.environ.get("SQLQUEUE_TEST_DB", "sqlite") != "sqlite":
        pytest.skip("packaging does not depend on the database: run once, in the sqlite stage")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    source = tmp_path / "checkout"
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    out = tmp_path / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=540)
    if done.returncode != 0 and ("Could not find a version" in done.stderr or "No matching distribution" in done.stderr):
        pytest.skip(f"the build backend could not be fetched from the package index: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr
    after = sorted(p.relative_to(source) for p in source.rglob("*") if "__pycache__" not in p.parts)
    assert after == [p for p in before if "__pycache__" not in p.parts]  # no build/, no *.egg-info
    (wheel,) = out.glob("django_sqlqueue-*.whl")
    assert wheel.name.startswith(f"django_sqlqueue-{django_sqlqueue.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    for expected in ("django_sqlqueue/templates/", "django_sqlqueue/static/django_sqlqueue/admin.css",
                     "django_sqlqueue/migrations/0001_initial.py"):
        assert any(n.startswith(expected) for n in names), expected
    assert not any(n.startswith(("tests/", "testproject/", "bench/")) for n in names)
