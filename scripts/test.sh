#!/usr/bin/env bash
# Runs the whole test suite (ruff lint + format check, then pytest) in .venv, creating it if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"
