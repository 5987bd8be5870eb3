#!/usr/bin/env bash
# Runs the whole test suite (ruff lint + format check, the import contracts, then pytest) in .venv, creating it if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The Prometheus-path tests run a real Prometheus server (Debian package); they skip without it.
if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "phaselens: installing Debian's prometheus for the Prometheus-path tests ..." >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } \
    >.venv/apt.log 2>&1 || echo "phaselens: prometheus not installed (see .venv/apt.log); those tests will skip" >&2
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# the layers and contracts of docs/ARCHITECTURE.md ([tool.importlinter] in pyproject.toml)
.venv/bin/lint-imports --no-logo
# Two pytest-xdist workers (PHASELENS_TEST_WORKERS=0: serial): many tests wait on real servers,
# subprocesses and polls, so two workers halve the wall time even on 2 cores. --dist loadgroup keeps
# each file, and the files sharing a session or package fixture, on one worker (tests/conftest.py).
workers=${PHASELENS_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
exec .venv/bin/python -m pytest -q -n "$workers" --dist loadgroup "$@"
