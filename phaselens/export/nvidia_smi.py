"""A ``power`` recommendation as an ``nvidia-smi`` script, for clusters without the bundled stack
(issue 24, item 3): run as root on each node with ``ROLE`` (the role its GPUs serve) and optionally
``GPUS`` (indices; default every GPU), ``ACTION=apply`` (default) or ``restore``. Apply resets the
clocks and the power limit to the default, then sets the role's knob (as the control API does);
restore puts the defaults back. It says, and stops, when not root or when a GPU is not the model the
setting was calibrated on."""

from __future__ import annotations

import json
import shlex
from typing import Any

from phaselens.export.common import ExportError


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _knob_lines(setting: dict[str, Any]) -> list[str]:
    knob = setting.get("knob", "default")
    if knob == "power_limit":
        return [f'  nvidia-smi -i "$gpu" -pl {float(setting["power_limit_w"]):g}']
    if knob == "sm_clock":
        lo, hi = int(setting["sm_clock_min_mhz"]), int(setting["sm_clock_max_mhz"])
        return [f'  nvidia-smi -i "$gpu" -lgc {lo},{hi}']
    return ["  : # the defaults"]


def power_script(rec: dict[str, Any], gpu_models: dict[str, str] | None = None) -> str:
    """The script of ``rec`` (a ``power`` recommendation row; JSON columns may be text).
    ``gpu_models``: role → the GPU name it was calibrated on (checked against nvidia-smi's)."""
    rid = rec.get("recommendation_id")
    if rec.get("kind") != "power":
        raise ExportError(
            f"recommendation {rid} is of kind {rec.get('kind')!r}; --format nvidia-smi exports power ones"
        )
    proposed = _json(rec.get("proposed")) or {}
    settings = proposed.get("settings") or {}
    if not settings:
        raise ExportError(f"recommendation {rid} proposes no settings")
    roles = sorted(settings)
    lines = [
        "#!/usr/bin/env bash",
        f"# phaselens export --format nvidia-smi: recommendation {rid} ({str(proposed.get('mode', '')).upper()} mode)",
        *(f"#   {r}: {settings[r]['setting'].get('label', 'default')}" for r in roles),
        "# Run as root on each node: ROLE=<role> [GPUS=0,1] [ACTION=apply|restore] bash this-script",
        "set -euo pipefail",
        f"ROLE=${{ROLE:?set ROLE to one of: {' '.join(roles)}}}",
        "ACTION=${ACTION:-apply}",
        "GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}",
        'if [ "$(id -u)" != 0 ]; then',
        '  echo "setting GPU power limits and clocks needs root: run as root (or ask an admin)" >&2',
        "  exit 1",
        "fi",
        "defaults() {  # clocks unlocked, the default power limit",
        '  nvidia-smi -i "$gpu" -rgc',
        '  nvidia-smi -i "$gpu" -pl "$(nvidia-smi -i "$gpu" --query-gpu=power.default_limit --format=csv,noheader,nounits)"',
        "}",
        "check_gpu() {  # the setting was calibrated on this GPU model",
        '  local name; name=$(nvidia-smi -i "$gpu" --query-gpu=name --format=csv,noheader)',
        '  if [ -n "$1" ] && [ "$name" != "$1" ]; then',
        '    echo "GPU $gpu is $name; the $ROLE setting was calibrated on $1: not applied" >&2',
        "    exit 2",
        "  fi",
        "}",
        "for gpu in ${GPUS//,/ }; do",
        '  if [ "$ACTION" = restore ]; then defaults; continue; fi',
        '  [ "$ACTION" = apply ] || { echo "ACTION must be apply or restore, got $ACTION" >&2; exit 2; }',
        '  case "$ROLE" in',
    ]
    for r in roles:
        want = (gpu_models or {}).get(r, "").removesuffix(" (emulated)").removesuffix(" (simulated)")
        lines += [
            f"  {shlex.quote(r)})",
            f"  check_gpu {shlex.quote(want)}",
            "  defaults",
            *_knob_lines(settings[r].get("setting") or {}),
            "  ;;",
        ]
    lines += [
        f'  *) echo "unknown ROLE $ROLE; roles: {" ".join(roles)}" >&2; exit 2 ;;',
        "  esac",
        "done",
        'echo "$ACTION: $ROLE on GPUs $GPUS"',
        "",
    ]
    return "\n".join(lines)
