"""The ``tds`` test stage's endpoint: Babelfish for PostgreSQL from ``../shared/babelfish`` (a TDS server
that runs T-SQL; NOT SQL Server: it ignores every table hint, so no concurrency test runs on it).

Standard library plus mssql-python, so scripts can use it without Django::

    python -m tests.babelfish start     # prints the URL of a fresh database, e.g. for the demo
    python -m tests.babelfish stop

:func:`kit` finds the kit (``SQLQUEUE_BABELFISH_KIT`` or ``../shared/babelfish`` beside the repository);
None where it is absent, as on a user's machine, and the stage is skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
#: Where start.sh keeps the server (its own default, so a server started by hand is reused).
SERVER_DIR = os.environ.get("SQLQUEUE_BABELFISH_DIR", "/tmp/sqlqueue-babelfish")
#: What the test settings need besides the URL: the harness backend (testproject/babelfish) and no TLS
#: (the endpoint has no certificate).
ENV = {"SQLQUEUE_MSSQL_ENGINE": "testproject.babelfish", "SQLQUEUE_MSSQL_EXTRA": "Encrypt=no"}


def kit() -> Path | None:
    """The Babelfish kit's folder, or None when this machine has none."""
    path = Path(os.environ.get("SQLQUEUE_BABELFISH_KIT", ROOT.parent / "shared" / "babelfish"))
    return path if (path / "start.sh").is_file() else None


def start() -> str:
    """Start (or reuse) the server; return its ``mssql://user:password@host:port/`` URL."""
    found = kit()
    if found is None:
        raise RuntimeError("no Babelfish kit (../shared/babelfish/start.sh or SQLQUEUE_BABELFISH_KIT)")
    import fcntl

    # One start at a time on this machine: two test sessions starting a stopped server at once race in
    # pg_ctl ("another server might be running"); the second one then finds it running and reuses it.
    with open(os.path.join(tempfile.gettempdir(), "sqlqueue-babelfish-start.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = subprocess.run(["bash", str(found / "start.sh"), SERVER_DIR], capture_output=True, text=True,
                             timeout=300)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines or not lines[-1].startswith("mssql://"):
        raise RuntimeError(f"babelfish start.sh failed (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")
    return lines[-1]


def stop() -> None:
    found = kit()
    if found is not None:
        subprocess.run(["bash", str(found / "stop.sh"), SERVER_DIR], capture_output=True, timeout=120)


def create_database(url: str, name: str, *, fresh: bool = False) -> str:
    """``CREATE DATABASE name`` over TDS if it is missing (``fresh``: dropped first if it is there);
    return the URL of that database."""
    import mssql_python

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,100}", name):
        raise ValueError(f"not a plain database name: {name!r}")
    u = urlparse(url)
    conn = mssql_python.connect(f"Server={u.hostname},{u.port};UID={u.username};PWD={u.password};"
                                f"{ENV['SQLQUEUE_MSSQL_EXTRA']}", autocommit=True)
    try:
        if fresh:
            conn.cursor().execute(f"IF DB_ID(N'{name}') IS NOT NULL DROP DATABASE [{name}]")
        conn.cursor().execute(f"IF DB_ID(N'{name}') IS NULL CREATE DATABASE [{name}]")
    finally:
        conn.close()
    return url.rstrip("/") + "/" + name


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        url = create_database(start(), argv[1] if len(argv) > 1 else "sqlqueue")
        print(url)
        return 0
    if argv[:1] == ["stop"]:
        stop()
        return 0
    print("usage: python -m tests.babelfish start [DBNAME] | stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
