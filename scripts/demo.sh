#!/usr/bin/env bash
# Run the django-sqlqueue demo on a local SQLite database.
#
#   scripts/demo.sh [args for manage.py sqlqueue_demo]
#
# Needs only the Python dependencies plus unixodbc/libltdl7 (no PostgreSQL
# server, no browser), so bootstrap runs in --minimal mode.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/bootstrap.sh --minimal
exec .venv/bin/python manage.py sqlqueue_demo "$@"
