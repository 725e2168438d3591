#!/usr/bin/env bash
# Full check: bootstrap, ruff, the import contracts (lint-imports: [tool.importlinter] in pyproject.toml),
# migrations check, pytest on SQLite and PostgreSQL (and, without extra arguments, the core tests once
# more under PostgreSQL server-side binding), and the SQL Server
# code path over TDS on Babelfish when ../shared/babelfish is there (the "tds" stage; see
# tests/babelfish.py: not SQL Server, no locking semantics, so the tests that need them skip there).
# The postgres stage also runs workers behind a real PgBouncer in transaction mode (tests/test_pgbouncer.py,
# ~45 s; skipped with the reason when Debian's pgbouncer package is not installed).
#
#   scripts/test.sh [extra pytest args]     e.g. scripts/test.sh -x -k claim
#
# Every stage runs even if another one failed; the database stages run at the same time (their logs
# are printed one after another); a summary is printed at the end and the exit status is non-zero if
# any stage failed.  Extra arguments go to every full pytest run.  Pytest exit code 5 (no tests
# collected) is a failure.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$PWD

if ! bash scripts/bootstrap.sh; then
    echo "test.sh: bootstrap failed; nothing was tested" >&2
    exit 1
fi

VENV="$ROOT/.venv"
export PATH="$VENV/bin:$PATH"
export PYTHONDONTWRITEBYTECODE=1
PY="$VENV/bin/python"

# Each stage picks its own database: a URL (or engine) left in the caller's environment would quietly
# send a stage to another server.
unset SQLQUEUE_DATABASE_URL SQLQUEUE_MSSQL_ENGINE SQLQUEUE_MSSQL_EXTRA SQLQUEUE_MSSQL_TEST_NAME

names=()
results=()
overall=0

record() {
    # record NAME RC SECONDS: one line of the summary
    local name=$1 rc=$2 note="ok"
    if [ "$rc" -ne 0 ]; then
        overall=1
        note="FAILED (exit $rc)"
        [ "$rc" -eq 5 ] && [[ "$name" == pytest* ]] && note="FAILED (exit 5: no tests collected)"
    fi
    names+=("$name")
    results+=("$(printf '%-16s %-36s %4ss' "$name" "$note" "$3")")
}

run_stage() {
    # run_stage NAME CMD...
    local name=$1 start
    shift
    echo
    echo "=== [$name] $*"
    start=$SECONDS
    "$@"
    record "$name" "$?" "$((SECONDS - start))"
}

run_stage ruff "$VENV/bin/ruff" check .
run_stage lint-imports "$VENV/bin/lint-imports"
run_stage migrations env SQLQUEUE_TEST_DB=sqlite "$PY" manage.py makemigrations --check --dry-run
# The three database stages run at the same time (each its own database server or file, its own log):
# most of their time is spent waiting on worker processes, so together they take about as long as the
# longest alone. Their logs are printed one after the other when all are done.
logdir="$(mktemp -d)"
trap 'rm -rf "$logdir"' EXIT

bg_stage() {
    # bg_stage NAME CMD...: run in the background; output to $logdir/NAME.log, "rc seconds" to NAME.rc
    local name=$1
    shift
    ( start=$SECONDS; { echo "=== [$name] $*"; "$@"; } >"$logdir/$name.log" 2>&1; echo "$? $((SECONDS - start))" >"$logdir/$name.rc" ) &
}

collect() {
    # collect NAME: print a background stage's log and record its result
    local name=$1 rc secs
    echo
    cat "$logdir/$name.log"
    read -r rc secs <"$logdir/$name.rc"
    record "$name" "$rc" "$secs"
}

stages=(pytest-sqlite pytest-postgres)
bg_stage pytest-sqlite env SQLQUEUE_TEST_DB=sqlite "$PY" -m pytest "$@"
bg_stage pytest-postgres env SQLQUEUE_TEST_DB=postgres "$PY" -m pytest "$@"
if [ $# -eq 0 ]; then
    # The raw SQL once more under psycopg's server-side binding (Django's OPTIONS["server_side_binding"]):
    # parameters are typed by the driver there, not spliced into the text.
    stages+=(pg-server-binding)
    bg_stage pg-server-binding env SQLQUEUE_TEST_DB=postgres SQLQUEUE_PG_OPTIONS=server_side_binding=true \
        "$PY" -m pytest -q tests/test_enqueue.py tests/test_enqueue_bulk.py tests/test_claim.py tests/test_modify.py \
        tests/test_complete_many.py tests/test_batching.py tests/test_worker_run.py tests/test_tasks_backend.py \
        tests/test_admin_actions.py tests/test_purge.py
fi

# SQL Server over TDS: Babelfish from ../shared/babelfish (or SQLQUEUE_BABELFISH_KIT). Absent on a
# user's machine: one line says so and the stage is skipped, like the live SQL Server suite.
tds=0
if "$PY" -c 'import sys; from tests.babelfish import kit; sys.exit(0 if kit() else 1)'; then
    tds=1
    # In two parts at once, each its own session and test database (tests/conftest.py _keep_shard): one
    # session keeps about one core busy, Babelfish's turn and the client's alternating. The server is
    # started first, so that the two sessions do not both start it.
    "$PY" -m tests.babelfish start >/dev/null || echo "test.sh: Babelfish did not start; the tds stages will say why" >&2
    # Babelfish now and then fails a statement it ran many times before with this planner error (never
    # SQL Server's; the table it names is a control character, e.g. "\x05", so the pattern stops before
    # the name): such a test runs again from its start, twice at most; any other failure fails the stage.
    # The parts deal the test files between them as they go, in the suite's order (SQLQUEUE_TEST_SHARD_CLAIMS:
    # a directory where each part claims a file before running it), so they end within about one file.
    claims="$logdir/tds-claims"
    mkdir -p "$claims"
    for part in 1 2; do
        stages+=("pytest-tds-$part")
        bg_stage "pytest-tds-$part" env SQLQUEUE_TEST_DB=tds SQLQUEUE_TEST_SHARD="$part/2" \
            SQLQUEUE_TEST_SHARD_CLAIMS="$claims" "$PY" -m pytest \
            --reruns 2 --only-rerun 'missing FROM-clause entry for table' "$@"
    done
fi
wait
[ "$tds" -eq 1 ] && { "$PY" -m tests.babelfish stop || true; }
for name in "${stages[@]}"; do
    collect "$name"
done
if [ "$tds" -eq 0 ]; then
    echo
    echo "=== [pytest-tds] skipped: no Babelfish kit (../shared/babelfish/start.sh); the SQL Server path ran only as parsed T-SQL"
fi

echo
echo "=== summary"
for line in "${results[@]}"; do
    echo "  $line"
done
if [ "$overall" -eq 0 ]; then
    echo "ALL ${#names[@]} STAGES PASSED"
else
    echo "SOME STAGES FAILED"
fi
exit "$overall"
