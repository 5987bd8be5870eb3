#!/usr/bin/env bash
# Starts the demo: the serving stack (1 prefill + 1 decode worker) and a short trace replay.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/phaselens demo "$@"
