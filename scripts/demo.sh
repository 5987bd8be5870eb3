#!/usr/bin/env bash
# Starts the demo (phaselens/demo.py, docs/DEMO.md): the serving stack, the collector and its store,
# a looping trace replay, a simulated fleet scenario and the dashboard on 127.0.0.1:8501; Ctrl-C stops
# them all. Arguments go to `phaselens demo` (e.g. --dashboard-port 8601, --db FILE, --no-sim).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/phaselens demo "$@"
