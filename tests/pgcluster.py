"""Throwaway PostgreSQL cluster on loopback, for tests and benchmarks.

Standard library only, so benchmark scripts can import it without Django or
pytest.  Usage::

    from tests.pgcluster import PgCluster

    with PgCluster() as pg:          # initdb + start on a free 127.0.0.1 port
        print(pg.url)                # postgres://postgres@127.0.0.1:PORT/postgres
        pg.restart()                 # same port, same data dir
    # stopped and removed here

Run ``python tests/pgcluster.py`` to get a cluster for manual work: it prints
the URL and keeps the server up until Ctrl-C / SIGTERM, then removes it.

PostgreSQL refuses to run as root, so when the current process is root the
server binaries run as the ``postgres`` OS user (created with ``useradd
--system`` if missing) and the whole cluster lives in a fresh temporary
directory owned by that user, with its unix socket inside that directory.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["PgCluster", "find_pg_bindir"]

PG_OS_USER = "postgres"
_START_TIMEOUT = 120  # seconds, for pg_ctl -w

# Run by the watchdog process (python -I -c CODE pg_ctl data_dir base_dir uid gid).
_WATCHDOG_CODE = """
import os, shutil, subprocess, sys
pg_ctl, data_dir, base_dir, uid, gid = sys.argv[1:6]
try:
    while sys.stdin.buffer.read(65536):
        pass
except BaseException:
    pass
if os.path.exists(os.path.join(data_dir, "postmaster.pid")):
    kw = {"user": int(uid), "group": int(gid), "extra_groups": []} if int(uid) >= 0 else {}
    try:
        subprocess.run([pg_ctl, "-D", data_dir, "-m", "immediate", "-w", "-t", "60", "stop"],
                       cwd=base_dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=90, **kw)
    except Exception:
        pass
shutil.rmtree(base_dir, ignore_errors=True)
"""


def _version_key(path: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin/initdb -> (15,) / (9, 6)
    ver = os.path.basename(os.path.dirname(os.path.dirname(path)))
    return tuple(int(p) for p in re.findall(r"\d+", ver)) or (0,)


def find_pg_bindir() -> str:
    """Directory holding initdb/pg_ctl/postgres.

    ``$SQLQUEUE_PG_BINDIR`` if set, else the highest
    /usr/lib/postgresql/<version>/bin (Debian layout), else
    ``pg_config --bindir`` if that directory has initdb.
    """
    override = os.environ.get("SQLQUEUE_PG_BINDIR")
    if override:
        if not os.access(os.path.join(override, "initdb"), os.X_OK):
            raise RuntimeError(f"SQLQUEUE_PG_BINDIR={override!r} has no executable initdb")
        return override
    candidates = [p for p in glob.glob("/usr/lib/postgresql/*/bin/initdb") if os.access(p, os.X_OK)]
    if candidates:
        return os.path.dirname(max(candidates, key=_version_key))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and os.access(os.path.join(out, "initdb"), os.X_OK):
            return out
    initdb = shutil.which("initdb")
    if initdb:
        return os.path.dirname(initdb)
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's "
        "postgresql package (apt-get install -y postgresql) or run scripts/bootstrap.sh, "
        "or set SQLQUEUE_PG_BINDIR"
    )


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ensure_os_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return pwd.getpwnam(name)


class PgCluster:
    """A private PostgreSQL server on 127.0.0.1 with trust auth."""

    host: str = "127.0.0.1"
    user: str = "postgres"  # database superuser

    def __init__(
        self,
        *,
        port: int | None = None,
        fsync: bool = False,
        base_dir: str | None = None,
        watchdog: bool = True,
    ) -> None:
        self.port: int = port if port is not None else _free_port(self.host)
        self._port_fixed = port is not None
        self.fsync = fsync
        self._base_dir_parent = base_dir
        self.bindir = find_pg_bindir()
        self.base_dir: str | None = None  # temp dir holding everything, set by start()
        self._initialized = False
        self._running = False
        self._as_root = os.geteuid() == 0
        self._os_user: pwd.struct_passwd | None = None
        self._atexit_registered = False
        self._use_watchdog = watchdog
        self._watchdog: subprocess.Popen | None = None
        self._watchdog_fd: int | None = None

    # ------------------------------------------------------------------ paths
    @property
    def data_dir(self) -> str:
        return os.path.join(self._require_base(), "data")

    @property
    def socket_dir(self) -> str:
        return os.path.join(self._require_base(), "socket")

    @property
    def log_path(self) -> str:
        return os.path.join(self._require_base(), "postgres.log")

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/postgres"

    def url_for(self, dbname: str) -> str:
        return f"postgres://{self.user}@{self.host}:{self.port}/{dbname}"

    @property
    def running(self) -> bool:
        return self._running

    def _require_base(self) -> str:
        if self.base_dir is None:
            raise RuntimeError("PgCluster not started yet")
        return self.base_dir

    # ---------------------------------------------------------------- helpers
    def _run(self, args: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess:
        kwargs: dict = {}
        env = dict(os.environ)
        env.pop("PGDATA", None)
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        if self._as_root:
            assert self._os_user is not None
            kwargs.update(user=self._os_user.pw_uid, group=self._os_user.pw_gid, extra_groups=[])
            env.update(HOME=self._require_base(), USER=self._os_user.pw_name, LOGNAME=self._os_user.pw_name)
        return subprocess.run(
            list(args),
            cwd=self._require_base(),  # the caller's cwd may be unreadable for postgres
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            start_new_session=True,  # keep terminal Ctrl-C away from the server
            **kwargs,
        )

    def _bin(self, name: str) -> str:
        return os.path.join(self.bindir, name)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _make_base_dir(self) -> None:
        base = tempfile.mkdtemp(prefix="sqlqueue-pg-", dir=self._base_dir_parent)
        os.chmod(base, 0o700)
        os.mkdir(os.path.join(base, "socket"), 0o700)
        self.base_dir = base
        if self._as_root:
            self._os_user = _ensure_os_user(PG_OS_USER)
            uid, gid = self._os_user.pw_uid, self._os_user.pw_gid
            os.chown(base, uid, gid)
            os.chown(os.path.join(base, "socket"), uid, gid)
            # Every ancestor must be traversable by the postgres user.
            check = self._run(["test", "-w", base], timeout=30)
            if check.returncode != 0:
                shutil.rmtree(base, ignore_errors=True)
                self.base_dir = None
                raise RuntimeError(
                    f"{base} is not reachable by OS user {PG_OS_USER!r}; "
                    "pass a base_dir under a world-traversable directory such as /tmp"
                )

    def _initdb(self) -> None:
        args = [
            self._bin("initdb"),
            "-D",
            self.data_dir,
            "-U",
            self.user,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-instructions",
        ]
        if not self.fsync:
            args.append("--no-sync")
        res = self._run(args)
        if res.returncode != 0:
            raise RuntimeError(f"initdb failed (exit {res.returncode}):\n{res.stdout}")
        onoff = "on" if self.fsync else "off"
        sock = self.socket_dir.replace("'", "''")
        conf = f"""
# --- added by tests/pgcluster.py ---
listen_addresses = '{self.host}'
port = {self.port}
unix_socket_directories = '{sock}'
max_connections = 200
shared_buffers = 128MB
fsync = {onoff}
synchronous_commit = {onoff}
full_page_writes = {onoff}
logging_collector = off
lc_messages = 'C'
"""
        # Appending keeps the files' owner (the postgres user when root).
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a", encoding="utf-8") as f:
            f.write(conf)
        with open(os.path.join(self.data_dir, "pg_hba.conf"), "w", encoding="utf-8") as f:
            f.write(
                "# written by tests/pgcluster.py\n"
                "local all all trust\n"
                f"host  all all {self.host}/32 trust\n"
                f"host  replication all {self.host}/32 trust\n"
            )
        self._initialized = True

    def _set_port(self, port: int) -> None:
        self.port = port
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a", encoding="utf-8") as f:
            f.write(f"port = {port}\n")

    def _pg_ctl_start(self) -> subprocess.CompletedProcess:
        return self._run(
            [
                self._bin("pg_ctl"),
                "-D",
                self.data_dir,
                "-l",
                self.log_path,
                "-w",
                "-t",
                str(_START_TIMEOUT),
                "start",
            ],
            timeout=_START_TIMEOUT + 30,
        )

    def _start_watchdog(self) -> None:
        """A helper process that stops the server and removes the temp dir if this process
        dies without calling destroy() (SIGKILL, os._exit, pytest-timeout's thread method).

        It blocks reading a pipe whose write end only this process holds; EOF means we are
        gone (or destroy() closed it after cleaning up, in which case there is nothing left).
        """
        if not sys.executable:
            return
        read_fd, write_fd = os.pipe()
        uid = self._os_user.pw_uid if self._os_user else -1
        gid = self._os_user.pw_gid if self._os_user else -1
        try:
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-c",
                    _WATCHDOG_CODE,
                    self._bin("pg_ctl"),
                    self.data_dir,
                    self._require_base(),
                    str(uid),
                    str(gid),
                ],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                start_new_session=True,  # not killed by a terminal's Ctrl-C with us
                close_fds=True,
            )
        except OSError:
            os.close(write_fd)
            self._watchdog = None
            return
        finally:
            os.close(read_fd)
        self._watchdog_fd = write_fd

    def _stop_watchdog(self) -> None:
        if self._watchdog_fd is not None:
            os.close(self._watchdog_fd)
            self._watchdog_fd = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    # -------------------------------------------------------------------- API
    def start(self) -> PgCluster:
        """initdb (first time only) and ``pg_ctl start -w``; returns self."""
        if self._running:
            return self
        if self.base_dir is None:
            self._make_base_dir()
            if self._use_watchdog:
                self._start_watchdog()
        if not self._atexit_registered:
            atexit.register(self.destroy)
            self._atexit_registered = True
        if not self._initialized:
            self._initdb()
        attempts = 1 if self._port_fixed else 3
        for attempt in range(attempts):
            res = self._pg_ctl_start()
            if res.returncode == 0:
                self._running = True
                return self
            tail = self.log_tail()
            port_taken = "could not bind" in tail or "Address already in use" in tail
            if port_taken and attempt + 1 < attempts:
                # Someone grabbed our auto-picked port: take another one.
                self._set_port(_free_port(self.host))
                continue
            raise RuntimeError(
                f"PostgreSQL failed to start on {self.host}:{self.port} "
                f"(pg_ctl exit {res.returncode}):\n{res.stdout}\n"
                f"--- tail of {self.log_path} ---\n{tail}"
            )
        raise AssertionError("unreachable")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m MODE`` (smart/fast/immediate); no-op if not running."""
        if self.base_dir is None or not self._initialized:
            return
        if not os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
            self._running = False
            return
        res = self._run(
            [self._bin("pg_ctl"), "-D", self.data_dir, "-m", mode, "-w", "-t", "60", "stop"],
            timeout=90,
        )
        if res.returncode != 0 and os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
            status = self._run([self._bin("pg_ctl"), "-D", self.data_dir, "status"], timeout=30)
            if status.returncode == 0:  # still running
                raise RuntimeError(
                    f"pg_ctl stop -m {mode} failed (exit {res.returncode}):\n{res.stdout}\n"
                    f"--- tail of {self.log_path} ---\n{self.log_tail()}"
                )
        self._running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop then start again on the same port and data dir."""
        self.stop(mode)
        self._port_fixed = True  # clients hold the URL: never move the port
        self.start()

    def destroy(self) -> None:
        """Stop if running and remove the temporary directory. Idempotent."""
        if self._atexit_registered:
            atexit.unregister(self.destroy)
            self._atexit_registered = False
        if self.base_dir is None:
            return
        try:
            self.stop("fast")
        except Exception:
            try:
                self.stop("immediate")
            except Exception:
                pass
        shutil.rmtree(self.base_dir, ignore_errors=True)
        self.base_dir = None
        self._stop_watchdog()
        self._initialized = False
        self._running = False

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def __repr__(self) -> str:
        state = "running" if self._running else "stopped"
        return f"<PgCluster {self.url} {state} dir={self.base_dir}>"


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import signal
    import threading

    parser = argparse.ArgumentParser(description="Run a throwaway PostgreSQL cluster.")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--fsync", action="store_true", help="durable settings (default off)")
    parser.add_argument("--base-dir", default=None, help="parent of the temp dir")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def _handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _handler)

    with PgCluster(port=args.port, fsync=args.fsync, base_dir=args.base_dir) as pg:
        print(pg.url, flush=True)
        print(
            f"# data: {pg.data_dir}  log: {pg.log_path}  (Ctrl-C to stop and remove)",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(1.0):
            pass
        print("# stopping and removing cluster", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
