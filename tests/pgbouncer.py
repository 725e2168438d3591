"""A throwaway PgBouncer in front of the test PostgreSQL (Debian's ``pgbouncer`` package), for tests.

Standard library only. Usage::

    with PgBouncer(pg_port, pool_mode="transaction", pool_size=2) as bouncer:
        bouncer.port    # clients connect to 127.0.0.1:port, any database name of the server

PgBouncer refuses to run as root, so when the current process is root it runs as the ``postgres`` OS
user (the one tests/pgcluster.py runs the server as), its files in a temporary directory of that user.
It is killed with the process that started it (``PR_SET_PDEATHSIG``), whatever happens.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

__all__ = ["PgBouncer", "find_pgbouncer"]


def find_pgbouncer() -> str | None:
    """The pgbouncer executable (Debian installs it in /usr/sbin), or None."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class PgBouncer:
    """PgBouncer on a free 127.0.0.1 port, trust auth, every database of the server on 127.0.0.1:``pg_port``."""

    host = "127.0.0.1"

    def __init__(self, pg_port: int, *, pool_mode: str = "transaction", pool_size: int = 2,
                 max_client_conn: int = 200, extra: str = "") -> None:
        self.pg_port = pg_port
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.extra = extra
        self.port = 0
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None

    def url(self, dbname: str, user: str = "postgres", query: str = "") -> str:
        return f"postgres://{user}@{self.host}:{self.port}/{dbname}" + (f"?{query}" if query else "")

    @property
    def log_path(self) -> str:
        assert self.dir is not None
        return os.path.join(self.dir, "pgbouncer.log")

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return "(no pgbouncer log)"

    def start(self) -> PgBouncer:
        exe = find_pgbouncer()
        if exe is None:
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install -y pgbouncer)")
        self.dir = tempfile.mkdtemp(prefix="sqlqueue-pgbouncer-")
        as_root = os.geteuid() == 0
        user = pwd.getpwnam("postgres") if as_root else None
        with socket.socket() as s:
            s.bind((self.host, 0))
            self.port = s.getsockname()[1]
        ini = os.path.join(self.dir, "pgbouncer.ini")
        users = os.path.join(self.dir, "users.txt")
        with open(ini, "w", encoding="utf-8") as f:
            f.write(f"""[databases]
* = host=127.0.0.1 port={self.pg_port}

[pgbouncer]
listen_addr = {self.host}
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = {self.max_client_conn}
logfile = {self.log_path}
ignore_startup_parameters = extra_float_digits
{self.extra}
""")
        with open(users, "w", encoding="utf-8") as f:
            f.write('"postgres" ""\n')
        if user is not None:
            for path in (self.dir, ini, users):
                os.chown(path, user.pw_uid, user.pw_gid)
        kwargs: dict = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user else {}
        self.proc = subprocess.Popen([exe, ini], cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent, **kwargs)
        deadline = time.monotonic() + 30
        while True:  # up when it accepts connections
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log()
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start:\n{log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
