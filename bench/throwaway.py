"""Throwaway databases for the bench scripts that measure in a child process (cancel, stale_window, worker).

Why a child process: Django reads its settings once per process, and the test project takes its
database from ``SQLQUEUE_DATABASE_URL``; so the parent starts an empty database (a SQLite file in a
temporary directory, or a local PostgreSQL cluster from tests/pgcluster.py), runs the same script with
``--child DB`` against it, and throws the database away afterwards whatever the child did. A script
imports this module as a sibling (``python bench/x.py`` puts bench/ first on sys.path), the way
bench/limits.py imports bench/claim.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The repo root, not bench/, holds tests.pgcluster and the test project the child's settings name.
sys.path.insert(0, str(REPO))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments every such script shares: which databases, and the hidden child switch."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


@contextmanager
def database(db: str, prefix: str) -> Iterator[tuple[str, str]]:
    """Yield (database URL, temporary directory) for an empty ``sqlite`` or ``postgres`` database.

    The directory (and the SQLite file in it) is removed on the way out, the cluster destroyed, even
    when the body raises: a bench run must not leave a PostgreSQL server behind on a shared machine.
    """
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = None
        if db == "sqlite":
            url = f"sqlite:///{tmp}/bench.sqlite3"
        else:
            from tests.pgcluster import PgCluster

            cluster = PgCluster().start()
            url = cluster.url
        try:
            yield url, tmp
        finally:
            if cluster is not None:
                cluster.destroy()


def run_children(script: str, which: str, prefix: str, args: Sequence[str],
                 extra_env: Mapping[str, str] | None = None) -> int:
    """Run ``script --child DB *args`` once per database ``which`` names; the first failing exit code.

    The child finds its database in ``SQLQUEUE_DATABASE_URL`` and a scratch directory in ``BENCH_TMP``;
    ``extra_env`` adds settings the measurement needs (e.g. a short dead-after time).
    """
    for db in (["sqlite", "postgres"] if which == "both" else [which]):
        with database(db, prefix) as (url, tmp):
            env = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings",
                   "SQLQUEUE_LOG_LEVEL": "WARNING", "BENCH_TMP": tmp, **(extra_env or {})}
            rc = subprocess.run([sys.executable, script, "--child", db, *args], env=env, cwd=REPO).returncode
            if rc:
                return rc
    return 0


def setup_child() -> None:
    """In the child: set Django up against the throwaway database and create the tables."""
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def start_worker(name: str, *extra: str) -> subprocess.Popen:
    """Start ``run_queue_worker`` in its own session, so the caller can signal its whole process group."""
    return subprocess.Popen([sys.executable, str(REPO / "manage.py"), "run_queue_worker", "--no-progress",
                             "--log-level", "WARNING", "--worker-name", name, *extra], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait(predicate: Callable[[], object], timeout: float, interval: float) -> None:
    """Poll ``predicate`` every ``interval`` seconds; end the run if it is still false after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s")
        time.sleep(interval)
