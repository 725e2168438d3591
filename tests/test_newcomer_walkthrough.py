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
    text += "\n" + block_starting(python, "# settings.py (SQLite)")  # README's SQLite options (check warns without)
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


def try_manage(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py`` in the project, whatever its exit status (the mistakes below are meant to fail)."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=project.dir, env=project.env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.timeout(900)
def test_the_newcomers_mistakes_are_each_named_once_with_a_way_out(tmp_path) -> None:
    """Issue 32, as a newcomer made them, each in a real ``manage.py`` process of a fresh project."""
    python = readme_blocks("python")
    project = Project(tmp_path)
    settings_block = block_starting(python, "# settings.py")
    apps = re.findall(r'^\s*"([\w.]+)",', settings_block, re.M)
    text = project.settings.read_text()
    added = "".join(f"    {app!r},\n" for app in apps if f"'{app}'" not in text)
    project.manage("startapp", "myapp")
    project.settings.write_text(text.replace("INSTALLED_APPS = [\n", "INSTALLED_APPS = [\n" + added + "    'myapp',\n", 1))

    # Item 5: startproject's SQLite runs without WAL / IMMEDIATE / a timeout: check warns; README's block fixes it.
    done = try_manage(project, "check")
    assert done.returncode == 0 and "sqlqueue.W020" in done.stdout + done.stderr, done.stderr
    sqlite_block = block_starting(python, "# settings.py (SQLite)")
    project.settings.write_text(project.settings.read_text() + "\n" + sqlite_block)
    assert "System check identified no issues" in project.manage("check").stdout
    good_settings = project.settings.read_text()
    project.manage("migrate")
    jobs_py = project.dir / "myapp" / "jobs.py"
    jobs_py.write_text(block_starting(python, "# myapp/jobs.py"))

    # Item 6: a misspelt type at enqueue is named with the registered one.
    done = try_manage(project, "shell", "-c", "import django_sqlqueue as q; q.enqueue('WelcomEmail', {'to': 'x@example.com'})")
    assert done.returncode != 0 and "did you mean 'WelcomeEmail'?" in done.stderr, done.stderr
    ids = project.shell("import django_sqlqueue as q\n"
                        "print(q.enqueue('WelcomeEmail', {'to': 'a@example.com'}, queue='emails').pk)\n"
                        "print(q.enqueue('WelcomeEmail', {'to': 'b@example.com'}).pk)").split()
    emails_job, default_job = ids[-2], ids[-1]

    # Item 2: jobs.py renamed handlers.py: the worker says it serves nothing, claims nothing, spends nothing.
    jobs_py.rename(project.dir / "myapp" / "handlers.py")
    done = try_manage(project, "run_queue_worker", "--burst", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "no job handler is registered in this process" in done.stderr
    assert "myapp/handlers.py is not loaded: rename it to jobs.py" in done.stderr
    assert "processed=0" in done.stdout and "left unclaimed (no handler for their type in this code): WelcomeEmail (2)" \
        in done.stdout, done.stdout
    assert "Pending, attempt 0" in project.manage("queue_why", default_job).stdout
    (project.dir / "myapp" / "handlers.py").rename(jobs_py)

    # Item 1: the queue typo (-q email for "emails"): queue_why never says "nothing stops it".
    done = project.manage("run_queue_worker", "--burst", "--no-progress", "-q", "email")
    assert "serves job types: WelcomeEmail" in done.stdout and "processed=0" in done.stdout
    why = project.manage("queue_why", emails_job).stdout
    assert "nothing stops it" not in why and "no worker is alive" in why, why

    # Item 6: three settings mistakes, one check, all three named (and a misspelt name with its suggestion).
    project.settings.write_text(good_settings + "\nSQLQUEUE = {'DATABASE': 'queue', 'MAX_ATTEMPTS': 0, "
                                "'LEASE_SECONDS': '60', 'LEASE_SECOND': 60}\n")
    done = try_manage(project, "check")
    assert done.returncode != 0
    for words in ("'DATABASE'] names 'queue'", "'MAX_ATTEMPTS'] must be a number >= 1, got 0",
                  "'LEASE_SECONDS'] must be a number >= 1, got '60'", "'LEASE_SECOND' (did you mean 'LEASE_SECONDS'?)"):
        assert words in done.stderr, done.stderr

    # Item 7: an invalid schedule fails check; queue_why still answers.
    project.settings.write_text(good_settings + "\nSQLQUEUE = {'SCHEDULES': {'hourly': {'type': 'WelcomeEmail', "
                                "'cron': '61 * * * *'}}}\n")
    done = try_manage(project, "check")
    assert done.returncode != 0 and "sqlqueue.E201" in done.stderr, done.stderr
    why = try_manage(project, "queue_why", emails_job)
    assert why.returncode == 0 and f"job {emails_job} (WelcomeEmail, queue 'emails')" in why.stdout, why.stderr
