"""Issue 18, item 18: the demo's closing hint works as printed -- the admin it opens is styled.

Starts the printed runserver command (its own SQLite file, DEBUG off as in the example) and fetches
the admin's stylesheet and ours from it: with the hint's ``--insecure`` both are served; a plain
``runserver`` (the old hint) answers 404, which is what made the admin render unstyled.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testproject.notifications.management.commands.sqlqueue_demo import RUNSERVER_HINT

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch_statuses(args: list[str], tmp_path: Path) -> list[int]:
    port = free_port()
    env = {**os.environ, "SQLQUEUE_DATABASE_URL": f"sqlite:///{tmp_path / 'hint.sqlite3'}",
           "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    env.pop("DJANGO_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "manage.py", *args, "--noreload", f"127.0.0.1:{port}"], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):  # wait until it listens (a readiness wait, not a timing assertion)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"runserver exited with {proc.returncode}") from None
                time.sleep(0.1)
        statuses = []
        for path in ("/static/admin/css/base.css", "/static/django_sqlqueue/admin.css"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
                    statuses.append(response.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
        return statuses
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_the_printed_runserver_serves_the_admin_css(tmp_path) -> None:
    words = shlex.split(RUNSERVER_HINT)
    assert words[:3] == ["python", "manage.py", "runserver"]
    assert fetch_statuses(words[2:], tmp_path) == [200, 200]
    assert fetch_statuses(["runserver"], tmp_path) == [404, 404]  # the old hint: an unstyled admin
