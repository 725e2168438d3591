"""The first hour, as a newcomer lives it (issue 20): a fresh ``startproject`` on SQLite, the README's
Quick start as printed (its code blocks are taken from README.md itself), the Tasks way, the admin.

The package is imported from this checkout (``PYTHONPATH``) instead of being pip-installed: the same
code, without a network round trip in CI. Every step is a real ``manage.py`` process in the new project.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.environ.get("SQLQUEUE_TEST_DB", "sqlite") != "sqlite",
                       reason="the walkthrough makes its own SQLite project: run once, in the sqlite stage"),
]


def readme_blocks(language: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quick_start = text[text.index("## Quick start"):text.index("## Features")]
    return re.findall(rf"^```{language}\n(.*?)^```", quick_start, re.S | re.M)


def block_starting(blocks: list[str], first_line: str) -> str:
    return next(b for b in blocks if b.splitlines()[0].strip() == first_line)


class Project:
    def __init__(self, base: Path) -> None:
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
        for key in ("SQLQUEUE_DATABASE_URL", "SQLQUEUE_TEST_DB"):
            self.env.pop(key, None)
        self.run_in(base, "-m", "django", "startproject", "mysite")
        self.dir = base / "mysite"

    def run_in(self, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, *args], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run_in(self.dir, "manage.py", *args)

    def shell(self, code: str) -> str:
        return self.manage("shell", "-c", code).stdout

    @property
    def settings(self) -> Path:
        return self.dir / "mysite" / "settings.py"


def test_a_newcomer_gets_from_startproject_to_a_job_run_a_task_run_and_the_admin(tmp_path) -> None:
    python = readme_blocks("python")
    project = Project(tmp_path)

    # 1. Install and add the app: the apps the README's settings block names, in the new settings.
    settings_block = block_starting(python, "# settings.py")
    apps = re.findall(r'^\s*"([\w.]+)",', settings_block, re.M)
    assert apps == ["django.contrib.admin", "django_admin_listfilter_dropdown", "django_sqlqueue"]
    text = project.settings.read_text()
    added = "".join(f"    {app!r},\n" for app in apps if f"'{app}'" not in text)
    text = text.replace("INSTALLED_APPS = [\n", "INSTALLED_APPS = [\n" + added + "    'myapp',\n", 1)
    assert "USE_TZ = True" in settings_block and "USE_TZ = True" in text
    # README step 2's handler sends an e-mail: Django 6.1's new project prints them (MAILERS, console).
    assert "django.core.mail.backends.console.EmailBackend" in text
    project.manage("startapp", "myapp")  # "any installed app": the newcomer makes one
    project.settings.write_text(text)
    assert "System check identified no issues" in project.manage("check").stdout
    project.manage("migrate")

    # 2. Define a handler: the README's myapp/jobs.py, as printed.
    (project.dir / "myapp" / "jobs.py").write_text(block_starting(python, "# myapp/jobs.py"))

    # 3. Enqueue: the README's block, as printed, with the user model and address it takes for granted.
    enqueue_block = next(b for b in python if "sqlqueue.enqueue(" in b)
    project.shell("from django.contrib.auth.models import User\nemail = 'newcomer@example.com'\n" + enqueue_block)

    # 4. Run a worker: the README's burst command.
    burst = next(line.split("#")[0].split() for b in readme_blocks("bash") for line in b.splitlines()
                 if "run_queue_worker --burst" in line)
    assert burst[:2] == ["python", "manage.py"]
    out = project.manage(*burst[2:], "--no-progress").stdout
    assert "processed=1 succeeded=1" in out and "Welcome!" in out and "newcomer@example.com" in out

    # The Tasks way: the README's TASKS setting and myapp/tasks.py, then an enqueue and a worker.
    tasks_setting = next(b for b in python if b.startswith("TASKS = "))
    project.settings.write_text(project.settings.read_text() + "\n" + tasks_setting)
    (project.dir / "myapp" / "tasks.py").write_text(block_starting(python, "# myapp/tasks.py"))
    assert "System check identified no issues" in project.manage("check").stdout
    enqueue_task = next(b for b in python if ".enqueue(user.pk)" in b)
    result_id = project.shell("from django.contrib.auth.models import User\nfrom myapp.tasks import send_welcome\n"
                              "user = User.objects.get()\n" + enqueue_task + "print(result.id)").split()[-1]
    assert "processed=1 succeeded=1" in project.manage(*burst[2:], "--no-progress").stdout
    status = project.shell(f"from myapp.tasks import send_welcome\n"
                           f"print(send_welcome.get_result({result_id!r}).status)")
    assert status.strip().splitlines()[-1] == "SUCCESSFUL"

    # 5. Open the admin: a superuser's browser, through Django's test client.
    pages = project.shell(
        "from django.test.utils import setup_test_environment\nsetup_test_environment()\n"
        "from django.contrib.auth.models import User\nfrom django.test import Client\n"
        "admin = User.objects.create_superuser('admin', 'admin@example.com', 'pw')\n"
        "client = Client()\nclient.force_login(admin)\n"
        "for url in ['/admin/', '/admin/django_sqlqueue/job/', '/admin/django_sqlqueue/jobtype/',\n"
        "            '/admin/django_sqlqueue/job/?status=4', '/admin/django_sqlqueue/worker/']:\n"
        "    response = client.get(url)\n"
        "    print(url, response.status_code, 'WelcomeEmail' in response.content.decode())\n")
    lines = dict(line.split(" ", 1) for line in pages.strip().splitlines() if line.startswith("/admin/"))
    assert len(lines) == 5, pages
    assert all(v.startswith("200") for v in lines.values()), pages
    assert lines["/admin/django_sqlqueue/job/"] == "200 True"  # the job the Quick start ran
    assert lines["/admin/django_sqlqueue/jobtype/"] == "200 True"
