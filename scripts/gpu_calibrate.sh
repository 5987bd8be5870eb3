#!/usr/bin/env bash
# The real-GPU power calibration of scripts/gpu_check.sh (issue 24): `phaselens serve` on cuda:0, then
# `phaselens calibrate` on NVML — bounded (2 points per knob, --max-minutes 4, timeout 330 s), the
# knobs restored by the sweep at its end or on SIGTERM, read back here and checked — recorded in
# $OUT/calibrate.json and docs/gpu/<date>-<gpu>-calibrate.json. When the driver refuses to set limits
# (not root) the record says "setting limits needs root". Usage: gpu_calibrate.sh OUT PYTHON
# CALIBRATE_DEVICE (cuda:0) and CALIBRATE_SERVE_ARGS let the flow be rehearsed on an emulated device
# (with a stand-in nvidia-smi on PATH; the record then says emulated, not measured); RECORD_DIR
# (docs/gpu) is where the record goes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out}; PY=${2:-python3}; mkdir -p "$OUT"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_calibrate: no NVIDIA GPU here: skipping the calibration" >&2
  exit 0
fi
TOKEN=gpu-check-$$; PORT=${CALIBRATE_PORT:-8399}; URL=http://127.0.0.1:$PORT
"$PY" -m serving.cli serve --port "$PORT" --control-token "$TOKEN" --mode aggregated --workers 1 \
  --device "${CALIBRATE_DEVICE:-cuda:0}" --model "${CALIBRATE_MODEL:-llama-3.2-1b}" --kv-cache-mb 8192 \
  ${CALIBRATE_SERVE_ARGS:-} >"$OUT/calibrate-serve.log" 2>&1 &
SERVE=$!
trap 'kill -INT $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
"$PY" - "$URL" <<'PY' || { echo "gpu_calibrate: the stack did not start (see $OUT/calibrate-serve.log)" >&2; exit 1; }
import sys
from serving.cli import wait_ready
wait_ready(sys.argv[1], timeout_s=240)
PY
timeout -s TERM 330 "$PY" -m phaselens calibrate --url "$URL" --token "$TOKEN" --execute \
  --db "$OUT/calibrate.duckdb" --points 2 --point-s 8 --settle-s 2 --max-minutes 4 --rate 4 --json \
  >"$OUT/calibrate-out.json" 2>"$OUT/calibrate.log"
RC=$?
"$PY" - "$URL" "$TOKEN" "$OUT" "$RC" "${RECORD_DIR:-docs/gpu}" <<'PY'
import datetime, json, pathlib, re, sys
import httpx
url, token, out, rc = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3]), int(sys.argv[4])
record_dir = pathlib.Path(sys.argv[5])
log = (out / "calibrate.log").read_text(errors="replace")
try:
    outcome = json.loads((out / "calibrate-out.json").read_text() or "null")
except ValueError:
    outcome = None
h = {"Authorization": f"Bearer {token}"}
knobs = httpx.get(f"{url}/control/workers/worker-0/device", headers=h, timeout=30).json()
restored = knobs.get("power_limit_w") == knobs.get("power_limit_default_w") and knobs.get("locked_sm_clock_min_mhz") is None
root = "needs root" in log or "no permission" in log
rec = {
    "when_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "gpu": knobs.get("gpu_name"), "driver": knobs.get("driver_version"),
    "exit_status": rc, "needs_root": root,
    "note": "setting limits needs root: the driver refused; run scripts/gpu_check.sh as root" if root else None,
    "knobs_after": knobs, "defaults_restored": restored,
    "outcome": outcome, "log_tail": log.splitlines()[-20:],
    "trust": "emulated" if knobs.get("emulated") else "measured",
}
(out / "calibrate.json").write_text(json.dumps(rec, indent=1, default=str))
name = re.sub(r"[^a-z0-9]+", "-", str(knobs.get("gpu_name") or "gpu").lower().replace("nvidia ", "")).strip("-")
record_dir.mkdir(parents=True, exist_ok=True)
dest = record_dir / f"{datetime.date.today()}-{name}-calibrate.json"
dest.write_text(json.dumps(rec, indent=1, default=str))
print(f"gpu_calibrate: exit {rc}; defaults restored: {restored}; " + (rec["note"] or "recorded") + f" -> {dest}")
PY
