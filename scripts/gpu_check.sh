#!/usr/bin/env bash
# Real-GPU check (needs an NVIDIA GPU): NVML through the Device interface, power-limit and clock
# knobs (set and restored), per-phase engine timing/power, and the serving stack on cuda:0.
# Results: $OUT/gpu_check.json (OUT defaults to ./out). Finishes in a few minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
# On a machine without registry access, wheels carried in .whl/ supply the web stack.
if ! "$PY" -c 'import fastapi, uvicorn' 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/phaselens-site .whl/*.whl
  export PYTHONPATH=/tmp/phaselens-site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,power.limit,power.default_limit,clocks.max.sm --format=csv
export PYTHONUNBUFFERED=1
"$PY" scripts/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
