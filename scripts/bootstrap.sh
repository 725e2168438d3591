#!/usr/bin/env bash
# Prepare a dev/CI machine for django-sqlqueue.  Idempotent and fast when done.
#
#   scripts/bootstrap.sh [--minimal]
#
# 1. Debian packages, only the missing ones and only when root:
#      postgresql (server binaries), pgbouncer (tests/test_pgbouncer.py, in the postgres stage;
#      the package enables its own service where systemd runs), unixodbc, libltdl7, chromium, and
#      libossp-uuid16 where the Babelfish kit (../shared/babelfish, the tds test stage) is present
#    --minimal (or SQLQUEUE_BOOTSTRAP_MINIMAL=1) needs only unixodbc + libltdl7
#    (enough for the demo).  SQLQUEUE_SKIP_APT=1 skips this step entirely.
# 2. A repo-local .venv with Python >= 3.12, chosen from: $SQLQUEUE_PYTHON,
#    python3.12 on PATH, /root/.pyenv/versions/3.12*/bin/python, python3.
# 3. uv pip install -e '.[test,postgres,mssql]' (pip if uv fails) when pyproject.toml changed since
#    the last successful install (sha256 stamp kept inside .venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV="$ROOT/.venv"
STAMP="$VENV/.sqlqueue-bootstrap-stamp"
EXTRAS="test,postgres,mssql"
UV_PIN="uv==0.13.9"  # the installer (PyPI); see step 3
START_TS=$SECONDS

minimal=${SQLQUEUE_BOOTSTRAP_MINIMAL:-0}
for arg in "$@"; do
    case "$arg" in
        --minimal) minimal=1 ;;
        -h|--help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "bootstrap: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { echo "bootstrap: $*" >&2; }
die() { echo "bootstrap: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- apt packages
have_lib() {
    # $1 = soname, e.g. libodbc.so.2
    local ldconfig
    ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
    if [ -x "$ldconfig" ] && "$ldconfig" -p 2>/dev/null | grep -qF "$1 "; then
        return 0
    fi
    compgen -G "/usr/lib/*/$1" >/dev/null || compgen -G "/usr/lib/$1" >/dev/null \
        || compgen -G "/lib/*/$1" >/dev/null
}

missing=()
have_lib libodbc.so.2 || missing+=(unixodbc)
have_lib libltdl.so.7 || missing+=(libltdl7)
if [ "$minimal" != 1 ]; then
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
    command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
    # The Babelfish kit (tests' tds stage) links libossp-uuid.so.16 (its uuid-ossp extension).
    if [ -f "$ROOT/../shared/babelfish/start.sh" ] || [ -n "${SQLQUEUE_BABELFISH_KIT:-}" ]; then
        have_lib libossp-uuid.so.16 || missing+=(libossp-uuid16)
    fi
    # fonts-liberation: without recommends chromium may have no font at all.
    [ -x /usr/bin/chromium ] || missing+=(chromium fonts-liberation)
fi

if [ "${#missing[@]}" -gt 0 ]; then
    if [ "${SQLQUEUE_SKIP_APT:-0}" = 1 ]; then
        log "WARNING: missing Debian packages (SQLQUEUE_SKIP_APT=1): ${missing[*]}"
    elif [ "$(id -u)" != 0 ]; then
        log "WARNING: missing Debian packages and not root: ${missing[*]}"
        log "         install them with: sudo apt-get install -y ${missing[*]}"
    elif ! command -v apt-get >/dev/null; then
        log "WARNING: missing packages ${missing[*]} and no apt-get on this machine"
    else
        log "installing Debian packages: ${missing[*]}"
        apt_log=$(mktemp /tmp/sqlqueue-apt.XXXXXX.log)
        export DEBIAN_FRONTEND=noninteractive
        apt_opts=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confdef
                  -o Dpkg::Options::=--force-confold --no-install-recommends)
        if ! apt-get -o DPkg::Lock::Timeout=600 update >"$apt_log" 2>&1; then
            tail -n 30 "$apt_log" >&2
            die "apt-get update failed (full log: $apt_log)"
        fi
        if ! apt-get install "${apt_opts[@]}" "${missing[@]}" >>"$apt_log" 2>&1 </dev/null; then
            tail -n 40 "$apt_log" >&2
            die "apt-get install ${missing[*]} failed (full log: $apt_log)"
        fi
        rm -f "$apt_log"
        log "Debian packages installed ($((SECONDS - START_TS))s)"
    fi
fi

# ---------------------------------------------------------------------- python
py_ok() {
    # True if $1 runs and is CPython >= 3.12.
    [ -n "$1" ] && "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' \
        >/dev/null 2>&1
}

find_python() {
    if [ -n "${SQLQUEUE_PYTHON:-}" ]; then
        py_ok "$SQLQUEUE_PYTHON" || die "SQLQUEUE_PYTHON=$SQLQUEUE_PYTHON is not a working Python >= 3.12"
        echo "$SQLQUEUE_PYTHON"
        return
    fi
    local cand cands=()
    # pyenv shims exist on PATH even when the version is not selected: py_ok
    # actually runs each candidate, so a broken shim is skipped.
    cand=$(command -v python3.12 || true); [ -n "$cand" ] && cands+=("$cand")
    mapfile -t -O "${#cands[@]}" cands < <(compgen -G '/root/.pyenv/versions/3.12*/bin/python' | sort -rV)
    cand=$(command -v python3 || true); [ -n "$cand" ] && cands+=("$cand")
    cand=$(command -v python3.13 || true); [ -n "$cand" ] && cands+=("$cand")
    mapfile -t -O "${#cands[@]}" cands < <(compgen -G '/root/.pyenv/versions/3.1[3-9]*/bin/python' | sort -rV)
    for cand in "${cands[@]}"; do
        if py_ok "$cand"; then
            echo "$cand"
            return
        fi
    done
    die "no Python >= 3.12 found; install one (e.g. pyenv install 3.12) or set SQLQUEUE_PYTHON=/path/to/python3.12"
}

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if ! py_ok "$VENV/bin/python"; then
    PY=$(find_python)
    if [ -e "$VENV" ]; then
        log "existing .venv is broken or too old; recreating it"
        rm -rf "$VENV"
    fi
    log "creating .venv with $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"
    "$PY" -m venv "$VENV" || die "could not create $VENV with $PY"
fi

[ -f "$ROOT/pyproject.toml" ] || die "pyproject.toml not found in $ROOT"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1) extras=$EXTRAS"
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
    log "installing -e '.[$EXTRAS]' (pyproject.toml changed or first run)"
    rm -f "$STAMP"
    pip_log=$(mktemp /tmp/sqlqueue-pip.XXXXXX.log)
    pip_rc=0
    # uv (from PyPI, pinned) resolves, downloads and installs in parallel: on a fresh CI machine about
    # 40 s where pip takes about 150 s. Bytecode is compiled at install time, as pip does: the test
    # stages run with PYTHONDONTWRITEBYTECODE=1, so without it every worker process would compile
    # Django again. uv reads no pip configuration: pip's index (PIP_INDEX_URL or pip.conf's index-url)
    # is handed to it. If uv cannot be had or fails, pip does the install, and the bytecode is
    # compiled after it (a uv that failed while compiling left the packages installed, which pip then
    # finds "already satisfied" and does not compile).
    index=${PIP_INDEX_URL:-$("$VENV/bin/python" -m pip config get global.index-url 2>/dev/null || true)}
    if { "$VENV/bin/python" -m pip install -q --progress-bar off "$UV_PIN" \
            && UV_COMPILE_BYTECODE=1 UV_INDEX_URL=${index:-https://pypi.org/simple} \
               "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -e ".[$EXTRAS]"; \
       } >"$pip_log" 2>&1; then
        : >"$pip_log"  # uv's output is noise once it succeeded
    else
        log "uv could not install (its output follows); pip does"
        "$VENV/bin/python" -m pip install -q --progress-bar off -e ".[$EXTRAS]" >>"$pip_log" 2>&1 \
            || pip_rc=$?
        [ "$pip_rc" -eq 0 ] && { "$VENV/bin/python" -m compileall -q "$VENV/lib" >/dev/null 2>&1 || true; }
    fi
    # Show pip's warnings/errors, minus the noise about absent find-links dirs.
    grep -v -E "^WARNING: Location '[^']*' is ignored" "$pip_log" >&2 || true
    rm -f "$pip_log"
    [ "$pip_rc" -eq 0 ] || die "pip install -e '.[$EXTRAS]' failed (exit $pip_rc)"
    echo "$want" >"$STAMP"
    log "Python dependencies installed"
fi

log "ready: $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])') in .venv ($((SECONDS - START_TS))s)"
