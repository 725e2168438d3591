"""The README and docs/ say what the code does: checked against the code, so they cannot drift."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

import django_sqlqueue
from django_sqlqueue.conf import QueueSettings
from django_sqlqueue.states import TRANSITIONS, Status

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def test_readme_starts_with_the_two_commands() -> None:
    lines = README.splitlines()
    first_block = lines[lines.index("```bash") + 1: lines.index("```", lines.index("```bash") + 1)]
    assert lines.index("```bash") <= 2
    assert [line.split("#")[0].strip() for line in first_block] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_lifecycle_diagram_is_the_transition_table() -> None:
    block = doc("lifecycle.md").split("```mermaid", 1)[1].split("```", 1)[0]
    by_label = {s.label: s for s in Status}
    edges = {(by_label[a], by_label[b]) for a, b in re.findall(r"^\s*(\w+) --> (\w+)", block, re.M)}
    expected = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == expected


def test_tasks_status_table_is_the_mapping() -> None:
    from django_sqlqueue.tasks.backend import STATUS_MAP

    rows = re.findall(r"^\| (\w+) \| `(\w+)` \|", doc("tasks.md"), re.M)
    assert {Status.from_label(q): f for q, f in rows} == {s: str(v) for s, v in STATUS_MAP.items()}


@pytest.mark.parametrize("text", [README, doc("configuration.md")], ids=["README", "configuration"])
def test_every_setting_is_documented_with_its_default(text: str) -> None:
    for f in fields(QueueSettings):
        default = f.default if f.default is not MISSING else f.default_factory()  # SCHEDULES: a fresh {}
        shown = f'"{default}"' if isinstance(default, str) else (f"{default}" if not isinstance(default, int)
                                                                  else str(default))
        row = re.search(rf"^\| `{f.name}` \| `([^`]*)` \|", text, re.M)
        assert row is not None, f.name
        assert row.group(1).replace("_", "") == shown.replace("_", ""), (f.name, row.group(1), shown)


def test_every_command_option_is_documented() -> None:
    from django.core.management import load_command_class

    text = doc("configuration.md")
    base = {"-h", "--help", "-v", "--verbosity", "--settings", "--pythonpath", "--traceback", "--no-color",
            "--force-color", "--skip-checks"}
    for name in ["run_queue_worker", "purge_queue", "queue_explain"]:
        parser = load_command_class("django_sqlqueue", name).create_parser("manage.py", name)
        section = text.split(f"## `python manage.py {name}", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for option in action.option_strings:
                if option in base or (option == "--version" and name != "run_queue_worker"):
                    continue
                assert f"`{option}" in section, (name, option)


def test_relative_links_resolve() -> None:
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


def test_changelog_names_the_version() -> None:
    assert f"## {django_sqlqueue.__version__}" in (ROOT / "CHANGELOG.md").read_text()
