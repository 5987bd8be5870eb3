#!/usr/bin/env bash
# Creates .venv (once) and installs phaselens with what it needs.
# Where no NVIDIA GPU is present, the CPU build torch==2.13.0 goes in first, so nothing
# later pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
VENV=${PHASELENS_VENV:-.venv}
stamp="$VENV/.phaselens-installed"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
log="$VENV/install.log"
pipi() { "$VENV/bin/python" -m pip install -q "$@" >>"$log" 2>&1; }
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "phaselens: installing into $VENV (log: $log) ..." >&2
  : >"$log"
  pipi --upgrade pip || true
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      pipi torch
    else
      pipi torch==2.13.0 \
        || pipi torch==2.13.0 --index-url "${PHASELENS_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
        || { tail -20 "$log" >&2; echo "phaselens: installing the CPU build of torch failed" >&2; exit 1; }
    fi
  fi
  pipi -e '.[dev]' || { tail -30 "$log" >&2; echo "phaselens: pip install failed (see $log)" >&2; exit 1; }
  touch "$stamp"
fi
