"""System checks run where a newcomer looks: ``manage.py check`` and ``runserver`` (issue 20 items 2, 3, 6)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

pytestmark = pytest.mark.django_db  # Django's own JSONField check asks SQLite about JSON support


def check_ids(**options) -> str:
    """The ids of what plain ``manage.py check`` reports (no --database), as its error text."""
    with pytest.raises(SystemCheckError) as caught:
        call_command("check", **options)
    return str(caught.value)


def test_a_misspelt_setting_fails_plain_check() -> None:
    with override_settings(SQLQUEUE={"MAX_ATTEMPT": 7}):
        text = check_ids()
    assert "sqlqueue.E001" in text and "unknown SQLQUEUE setting 'MAX_ATTEMPT' (did you mean 'MAX_ATTEMPTS'?)" in text


def test_every_settings_mistake_is_reported_at_once() -> None:
    """Issue 32 item 6: three mistakes, one run of check, three errors (not one per run)."""
    with override_settings(SQLQUEUE={"DATABASE": "queue", "MAX_ATTEMPTS": 0, "LEASE_SECONDS": "60",
                                     "lease_secs": 5}):
        text = check_ids()
    assert "SQLQUEUE['DATABASE'] names 'queue', which is not in DATABASES" in text
    assert "SQLQUEUE['MAX_ATTEMPTS'] must be a number >= 1, got 0" in text
    assert "SQLQUEUE['LEASE_SECONDS'] must be a number >= 1, got '60'" in text
    assert "unknown SQLQUEUE setting 'lease_secs' (did you mean 'LEASE_SECONDS'?)" in text
    assert text.count("sqlqueue.E001") == 3 and text.count("sqlqueue.E002") == 1


def test_a_notify_channel_postgresql_would_refuse_fails_plain_check() -> None:
    """pg_notify refuses a channel over 63 bytes: sent after an autocommit enqueue's COMMIT, it would
    fail every enqueue of jobs that did go in. Refused at check time instead."""
    with override_settings(SQLQUEUE={"NOTIFY_CHANNEL": "c" * 64}):
        text = check_ids()
    assert "SQLQUEUE['NOTIFY_CHANNEL'] must be at most 63 bytes (a PostgreSQL identifier), got 64" in text
    with override_settings(SQLQUEUE={"NOTIFY_CHANNEL": "c" * 63}):
        call_command("check")  # the longest PostgreSQL takes


def test_use_tz_false_fails_plain_check() -> None:
    with override_settings(USE_TZ=False):
        assert "sqlqueue.E004" in check_ids()


def test_a_sound_configuration_passes_plain_check(capsys) -> None:
    call_command("check")
    assert "no issues" in capsys.readouterr().out


def run_check_in_a_fresh_project(tmp_path, extra: str, *args: str):
    """``manage.py check`` in a new process with a minimal project's settings plus ``extra``."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "fresh_settings.py").write_text(
        "SECRET_KEY = 'x'\nUSE_TZ = True\nROOT_URLCONF = 'testproject.urls'\n"
        "INSTALLED_APPS = ['django.contrib.admin', 'django.contrib.auth', 'django.contrib.contenttypes',\n"
        "    'django.contrib.sessions', 'django.contrib.messages', 'django_admin_listfilter_dropdown',\n"
        "    'django_sqlqueue']\n"
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(tmp_path / 'db')!r}}}}}\n"
        "MIDDLEWARE = ['django.contrib.sessions.middleware.SessionMiddleware',\n"
        "    'django.contrib.auth.middleware.AuthenticationMiddleware',\n"
        "    'django.contrib.messages.middleware.MessageMiddleware']\n"
        "TEMPLATES = [{'BACKEND': 'django.template.backends.django.DjangoTemplates', 'APP_DIRS': True,\n"
        "    'OPTIONS': {'context_processors': ['django.template.context_processors.request',\n"
        "        'django.contrib.auth.context_processors.auth', 'django.contrib.messages.context_processors.messages']}}]\n"
        + extra)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{repo}", "DJANGO_SETTINGS_MODULE": "fresh_settings"}
    return subprocess.run([sys.executable, "-m", "django", "check", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_tasks_backends_checks_run_in_plain_check(tmp_path) -> None:
    done = run_check_in_a_fresh_project(tmp_path, "TASKS = {'default': {\n"
                                        "    'BACKEND': 'django_sqlqueue.tasks.SqlQueueBackend',\n"
                                        "    'OPTIONS': {'max_attemps': 2}}}\n")
    assert done.returncode == 1 and "sqlqueue.E102" in done.stderr and "max_attemps" in done.stderr, done.stderr


def test_the_admin_without_the_dropdown_app_fails_check() -> None:
    """Issue 20 item 6: without it the job list was a 500 (TemplateDoesNotExist) and check said nothing."""
    from django.test import modify_settings

    with modify_settings(INSTALLED_APPS={"remove": ["django_admin_listfilter_dropdown"]}):
        text = check_ids()
    assert "sqlqueue.E008" in text and "'django_admin_listfilter_dropdown'" in text


def test_sqlite_without_the_recommended_options_gets_a_warning(tmp_path) -> None:
    """Issue 32 item 5: startproject's SQLite has no WAL, no IMMEDIATE, Django's 5 s timeout."""
    done = run_check_in_a_fresh_project(tmp_path, "")
    assert done.returncode == 0, done.stderr  # a warning, not an error
    text = done.stdout + done.stderr
    assert "sqlqueue.W020" in text and "WAL" in text and "IMMEDIATE" in text and "a timeout" in text
    done = run_check_in_a_fresh_project(
        tmp_path, "DATABASES['default']['OPTIONS'] = {'init_command': 'PRAGMA journal_mode=WAL;', "
                  "'transaction_mode': 'IMMEDIATE', 'timeout': 20}\n")
    assert done.returncode == 0 and "sqlqueue.W020" not in done.stdout + done.stderr, done.stderr
