"""The ``roofline`` part of a summary (analytics/roofline.py) as display rows, shared by the Bimodal page
and the HTML report: MFU and MBU per pool and phase with the activities beside them, and the stranded
compute / bandwidth per pool. Pure: no Streamlit, no HTML."""

from __future__ import annotations

import math
from typing import Any

#: what the stranded figures are, in words (the page's and the report's caption)
STRANDED_TEXT = (
    "Stranded compute = decode GPU-seconds × (1 − MFU of decode); stranded bandwidth = prefill "
    "GPU-seconds × (1 − MBU of prefill), a mixed iteration's decode and prefill shares by its own MFU and MBU: "
    "computed from each iteration's counted FLOPs and HBM bytes over its GPU-busy time against the GPU's "
    "dense peak (BF16 or FP8) and HBM bandwidth — the basis of the Overview's stranded share. SM / tensor / DRAM "
    "activity: the same GPUs' samples while that phase ran, per busy second (measured on real GPUs, "
    "modeled on emulated and simulated ones). SM activity counts SMs holding any work; the tensor pipes "
    "and MFU show how much of the compute did useful math."
)


def _pct(v: Any) -> str:
    return "—" if not isinstance(v, int | float) or math.isnan(v) else f"{100 * v:.1f} %"


def _num(v: Any, digits: int = 1) -> str:
    return "—" if not isinstance(v, int | float) or math.isnan(v) else f"{v:,.{digits}f}"


def _pool(row: dict[str, Any]) -> str:
    return "all GPUs" if row.get("scope") == "fleet" else f"{row.get('role') or 'unknown'} pool"


def roofline_rows(part: dict[str, Any]) -> list[dict[str, str]]:
    """One row per pool (and the fleet, where there is more than one pool) and phase."""
    table = part.get("table") or []
    pools = {r.get("role") for r in table if r.get("scope") == "pool"}
    rows = []
    for r in table:
        if r.get("scope") == "gpu" or (r.get("scope") == "fleet" and len(pools) == 1):
            continue
        rows.append(
            {
                "pool": _pool(r),
                "phase": str(r.get("phase")),
                "busy GPU-s": _num(r.get("busy_s"), 2),
                "TFLOP/s": _num(r.get("achieved_tflops_s")),
                "TB/s": _num(r.get("achieved_tb_s"), 2),
                "MFU": _pct(r.get("mfu")),
                "MBU": _pct(r.get("mbu")),
                "SM active %": _num(r.get("sm_active_pct")),
                "tensor active %": _num(r.get("tensor_active_pct")),
                "DRAM active %": _num(r.get("dram_active_pct")),
                "trust": ", ".join(r.get("trust") or []),
            }
        )
    return rows


def stranded_rows(part: dict[str, Any]) -> list[dict[str, str]]:
    """Stranded compute and bandwidth per pool (and the fleet, where there is more than one pool)."""
    stranded = part.get("stranded") or []
    pools = [s for s in stranded if s.get("scope") == "pool"]
    rows = []
    for s in stranded:
        if s.get("scope") == "fleet" and len(pools) == 1:
            continue
        rows.append(
            {
                "pool": _pool(s),
                "stranded compute, GPU-s": _num(s.get("stranded_compute_s"), 2),
                "of decode GPU-s": _num(s.get("decode_s"), 2),
                "MFU (decode)": _pct(s.get("mfu_decode")),
                "SM active % (decode)": _num(s.get("sm_active_decode_pct")),
                "tensor active % (decode)": _num(s.get("tensor_active_decode_pct")),
                "stranded bandwidth, GPU-s": _num(s.get("stranded_bandwidth_s"), 2),
                "of prefill GPU-s": _num(s.get("prefill_s"), 2),
                "MBU (prefill)": _pct(s.get("mbu_prefill")),
                "DRAM active % (prefill)": _num(s.get("dram_active_prefill_pct")),
                "trust": ", ".join(s.get("trust") or []),
            }
        )
    return rows


def roofline_labels(part: dict[str, Any]) -> list[str]:
    """The part's trust labels."""
    return list((part.get("trust") or {}).get("labels") or [])
