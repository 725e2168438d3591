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
    assert "sqlqueue.E001" in text and "unknown SQLQUEUE setting(s): MAX_ATTEMPT" in text


def test_use_tz_false_fails_plain_check() -> None:
    with override_settings(USE_TZ=False):
        assert "sqlqueue.E004" in check_ids()


def test_a_sound_configuration_passes_plain_check(capsys) -> None:
    call_command("check")
    assert "no issues" in capsys.readouterr().out
