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
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      "$VENV/bin/python" -m pip install -q torch
    else
      "$VENV/bin/python" -m pip install -q torch==2.13.0 \
        || "$VENV/bin/python" -m pip install -q torch==2.13.0 --index-url "${PHASELENS_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
    fi
  fi
  "$VENV/bin/python" -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
