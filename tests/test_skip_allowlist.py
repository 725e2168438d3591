"""Unexpected skips fail CI (issue 19): tests/conftest.py's session hook and its per-stage allowlist."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SKIP_ALLOWLIST, unexpected_skips

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("sqlite", "postgres", "tds")

#: Skips the suite can give that must never pass in CI: something CI installs is missing.
MUST_FAIL_IN_CI = {
    "no Chromium at X (apt-get install chromium)",  # test_browser_admin
    "pgbouncer is not installed (apt-get install -y pgbouncer)",  # test_pgbouncer
    "the build backend could not be fetched from the package index: X",  # test_packaging
    "another kind of tracer provider was set in this process",  # test_tracing
    "the soak runs on PostgreSQL and SQLite",  # test_soak: TDS_SKIPS skips the file there first
    "already running on SQL Server: the files themselves are the live suite",  # the mssql stage, not in CI
    # test_mssql_live's own cases, in the parent session of a live run (a SQL Server configured: never CI)
    "a live SQL Server case: it runs in the live suite's child session (SQLQUEUE_TEST_DB=mssql)",
}


def skip_reasons_in_the_code() -> set[str]:
    """Every literal skip reason in tests/ (pytest.skip(...) and skipif(reason=...)); an f-string's
    fields read as ``X``."""

    def text(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "X" for v in node.values)
        return None

    found: set[str] = set()
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            if name == "pytest.skip" and node.args and (reason := text(node.args[0])):
                found.add(reason)
            for kw in node.keywords:
                if kw.arg == "reason" and name.startswith("pytest.mark.skip") and (reason := text(kw.value)):
                    found.add(reason)
    found.discard("X: X")  # conftest's stage tables (TDS_SKIPS, PG_SKIPS): allowed by their own entries
    return found


def test_every_skip_reason_in_the_code_is_allowed_somewhere_or_must_fail() -> None:
    """A new skip is a decision: put it on a stage's allowlist (conftest.py) or here."""
    reasons = skip_reasons_in_the_code()
    assert len(reasons) > 20, reasons  # the scan found the suite's skips
    unplaced = [r for r in reasons
                if r not in MUST_FAIL_IN_CI and all(unexpected_skips([("", r)], s) for s in STAGES)]
    assert not unplaced, unplaced
    for reason in MUST_FAIL_IN_CI:
        assert reason in reasons, f"{reason!r} is no longer in the code: drop it here"
        assert all(unexpected_skips([("", reason)], s) for s in STAGES), reason


def test_the_allowlist_is_per_stage() -> None:
    def allowed(reason: str, stage: str) -> bool:
        return not unexpected_skips([("", reason)], stage)

    # the postgres stage without its own cluster (SQLQUEUE_DATABASE_URL preset) must not pass
    cluster = "needs the test session's own PostgreSQL cluster (SQLQUEUE_TEST_DB=postgres)"
    assert allowed(cluster, "sqlite") and allowed(cluster, "tds") and not allowed(cluster, "postgres")
    assert allowed("LISTEN/NOTIFY is PostgreSQL only", "sqlite")
    assert not allowed("LISTEN/NOTIFY is PostgreSQL only", "postgres")
    assert not allowed("PRAGMA data_version is SQLite only", "sqlite")
    assert allowed("PRAGMA data_version is SQLite only", "postgres")
    # a stage's own table: only with the stage's label, only the reasons it holds
    from tests.conftest import PG_SKIPS, TDS_SKIPS

    pg = next(iter(PG_SKIPS.values()))
    assert allowed(f"postgres stage: {pg}", "postgres") and not allowed(f"postgres stage: {pg}", "sqlite")
    assert not allowed(f"postgres stage: {pg} (and more)", "postgres")
    tds = next(iter(TDS_SKIPS.values()))
    assert allowed(f"tds stage (Babelfish): {tds}", "tds") and not allowed(tds, "tds")
    assert not allowed("could not import 'playwright.sync_api': No module named 'playwright'", "sqlite")
    assert set(SKIP_ALLOWLIST) == set(STAGES)


SAMPLE = '''
import pytest

def test_allowed():
    pytest.skip("LISTEN/NOTIFY is PostgreSQL only")

def test_no_browser():
    pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")

def test_runs():
    pass
'''
MISSING_PACKAGE = '''
import pytest

pytest.importorskip("sqlqueue_no_such_package")

def test_never():
    pass
'''


def run_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "test_missing_package.py").write_text(MISSING_PACKAGE)
    # The sample files live outside tests/: their conftest takes the suite's hooks (imported at collection,
    # once Django is set up).
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import (pytest_collectreport, pytest_runtest_logreport,  # noqa: F401\n"
        "                            pytest_sessionfinish, pytest_terminal_summary)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CI", "SQLQUEUE_DATABASE_URL", "SQLQUEUE_SQLITE_TEST_NAME", "SQLQUEUE_PG_OPTIONS")}
    env.update(SQLQUEUE_TEST_DB="sqlite", PYTHONPATH=str(ROOT))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(ROOT), "-q", "-rs", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def sqlite_stage_only() -> None:
    if os.environ.get("SQLQUEUE_TEST_DB", "sqlite") != "sqlite":
        pytest.skip("the skip gate runs pytest on sample files, whatever the database: run once, in the sqlite stage")


def test_under_ci_an_unlisted_skip_fails_the_run(tmp_path: Path) -> None:
    sqlite_stage_only()
    done = run_pytest(tmp_path, "true")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "unexpected skips (CI=true, stage sqlite): the run fails" in out, out
    section = out[out.index("unexpected skips"):]
    assert "test_sample.py::test_no_browser: no Chromium at /usr/bin/chromium" in section
    assert re.search(r"test_missing_package\.py: could not import 'sqlqueue_no_such_package'", section), section
    assert "test_allowed" not in section
    assert "1 passed, 3 skipped" in out


def test_outside_ci_skips_are_skips(tmp_path: Path) -> None:
    sqlite_stage_only()
    for ci in (None, "false"):
        done = run_pytest(tmp_path, ci)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "unexpected skips" not in done.stdout
