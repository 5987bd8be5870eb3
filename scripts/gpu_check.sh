#!/usr/bin/env bash
# Real-GPU check (needs an NVIDIA GPU): NVML through the Device interface, power-limit and clock
# knobs (set and restored), per-phase engine timing/power, and the serving stack on cuda:0.
# Results: $OUT/gpu_check.json (OUT defaults to ./out). Finishes in a few minutes.
# Then a short per-phase power calibration (issue 24): `phaselens calibrate` on NVML against the stack
# on cuda:0 (bounded: 2 points per knob, --max-minutes 4, a hard timeout; the knobs restored at the
# end, also when interrupted), recorded in $OUT/calibrate.json and docs/gpu/<date>-<gpu>-calibrate.json;
# "setting limits needs root" when the driver refuses. SKIP_CALIBRATE=1 skips it.
# Without an NVIDIA GPU it says so and exits 0 (nothing to check).
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi missing or it lists none): skipping the real-GPU check and calibration" >&2
  exit 0
fi
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

[ "${SKIP_CALIBRATE:-0}" = 1 ] && exit 0
bash scripts/gpu_calibrate.sh "$OUT" "$PY"
