"""Stranded compute and stranded bandwidth in the phase attribution: on which basis each busy second
is split, and the SQL of that split (issue 23 point 4).

A busy second of decode is split into productive decode and **stranded compute** by ``1 − MFU`` of the
GPU's decode work, a busy second of prefill into productive prefill and **stranded bandwidth** by
``1 − MBU`` of its prefill work — computed from the work the iterations carry (``flops``,
``hbm_bytes``) and their GPU-busy time (:func:`analytics.roofline.phase_rates`: the GPU-hour's rates,
else the GPU's over the window); a mixed (chunked-prefill) iteration's decode share by the mixed
iterations' MFU, its prefill share by their MBU. Where no iteration of that GPU and phase carries a
count (an external fleet, a store from before migration 14, a GPU without known peaks), the split
falls back to the older basis: ``1 − SM activity`` / ``1 − DRAM activity`` during GPU-busy time from
the GPU's samples; where that is missing too the time counts productive (``*_activity_unknown_s``).
Each figure says which basis it rests on (:func:`stranded_basis`); the activity basis's figure is
kept beside the roofline's (``stranded_compute_sm_s``, ``stranded_bandwidth_dram_s``).
Formulas: docs/analytics/attribution.md, "GPU-time categories".
"""

from __future__ import annotations

from typing import Any

import pandas as pd

# per busy state of the interval table: its stranded kind, the rate that splits it (a column of the
# joined :func:`analytics.roofline.phase_rates`, prefixed ``r_``) and the activity it falls back to
_STATES: dict[str, tuple[str, str, str]] = {
    "decode": ("compute", "r_mfu_decode", "sm_busy"),
    "mixed_decode": ("compute", "r_mfu_mixed", "sm_busy"),
    "prefill": ("bandwidth", "r_mbu_prefill", "dram_busy"),
    "mixed_prefill": ("bandwidth", "r_mbu_mixed", "dram_busy"),
}

# Which basis split each busy second into productive and stranded (decode: ``decode_roofline_s`` by
# 1 − MFU, ``decode_activity_s`` by 1 − SM activity, ``decode_activity_unknown_s`` neither: counted
# productive; prefill likewise by 1 − MBU / 1 − DRAM activity), and the activity basis's figure beside
# the roofline's (``stranded_compute_sm_s`` over ``decode_sm_known_s``, the decode seconds with SM
# activity; ``stranded_bandwidth_dram_s`` over ``prefill_dram_known_s``)
BASIS_SUM_COLS = (
    "decode_roofline_s",
    "decode_activity_s",
    "decode_activity_unknown_s",
    "prefill_roofline_s",
    "prefill_activity_s",
    "prefill_activity_unknown_s",
    "stranded_compute_sm_s",
    "decode_sm_known_s",
    "stranded_bandwidth_dram_s",
    "prefill_dram_known_s",
)


def stranded_sql(kind: str, unit: str) -> str:
    """SQL of an interval row's stranded ``kind`` (``compute``: its decode and mixed-decode seconds;
    ``bandwidth``: prefill and mixed-prefill) in seconds (``unit`` ``s``) or apportioned joules
    (``j``: the states' ``e_<state>``), each state's part times ``1 − rate``, else ``1 − activity``,
    else 0."""
    parts = []
    for state, (k, rate, activity) in _STATES.items():
        if k == kind:
            amount = f"coalesce({state}_s, 0)" if unit == "s" else f"coalesce(e_{state}, 0)"
            parts.append(f"{amount} * coalesce(1.0 - coalesce({rate}, {activity}), 0.0)")
    return " + ".join(parts)


def basis_sql(kind: str, which: str) -> str:
    """SQL of an interval row's seconds of ``kind``'s phase split on basis ``which``: ``roofline``
    (a rate), ``activity`` (no rate, the activity), ``unknown`` (neither)."""
    parts = []
    for state, (k, rate, activity) in _STATES.items():
        if k == kind:
            cond = {
                "roofline": f"{rate} IS NOT NULL",
                "activity": f"{rate} IS NULL AND {activity} IS NOT NULL",
                "unknown": f"{rate} IS NULL AND {activity} IS NULL",
            }[which]
            parts.append(f"CASE WHEN {cond} THEN coalesce({state}_s, 0) ELSE 0 END")
    return " + ".join(parts)


#: the bases a stranded figure can rest on (:func:`stranded_basis`)
BASIS_ROOFLINE = "roofline"
BASIS_ACTIVITY = "activity"
BASIS_MIXED = "mixed"
BASIS_LABELS = {
    ("compute", BASIS_ROOFLINE): "decode time × (1 − MFU), from the work counted and the time",
    ("compute", BASIS_ACTIVITY): "decode time × (1 − SM activity), from the GPU samples (no work count)",
    ("bandwidth", BASIS_ROOFLINE): "prefill time × (1 − MBU), from the work counted and the time",
    ("bandwidth", BASIS_ACTIVITY): "prefill time × (1 − DRAM activity), from the GPU samples (no work count)",
}
#: short words for a headline's basis (:func:`basis_word`)
BASIS_SHORT = {
    BASIS_ROOFLINE: "from MFU/MBU",
    BASIS_ACTIVITY: "from SM/DRAM activity",
    BASIS_MIXED: "from MFU/MBU where counted, else SM/DRAM activity",
}


def stranded_basis(raw: pd.DataFrame) -> dict[str, Any]:
    """Which basis the stranded figures of ``raw`` (:attr:`analytics.attribution.PhaseBreakdown.raw`,
    or any table with :data:`BASIS_SUM_COLS`) rest on: per kind (``compute``, ``bandwidth``)
    ``roofline`` (every split second of that phase by 1 − MFU / 1 − MBU), ``activity`` (by 1 − SM /
    DRAM activity: no work count), ``mixed`` (some of each), or None (no split time of that phase);
    ``<kind>_roofline_share`` (of the split seconds, those on the roofline basis), ``<kind>_label``
    (the formula in words), ``stranded_compute_decode_share`` / ``stranded_bandwidth_prefill_share``
    (the stranded seconds over all the phase's busy seconds, on the basis used); and beside them the
    activity basis's own figure over the seconds that
    have the activity: ``stranded_compute_sm_share`` (of the decode seconds with SM activity, the share
    1 − SM activity calls stranded), ``stranded_bandwidth_dram_share`` likewise."""
    out: dict[str, Any] = {}

    def total(col: str) -> float:
        return float(raw[col].sum()) if col in raw and len(raw) else 0.0

    for kind, phase in (("compute", "decode"), ("bandwidth", "prefill")):
        roof, act = total(f"{phase}_roofline_s"), total(f"{phase}_activity_s")
        split = roof + act
        if split <= 0:
            basis = None
        elif act <= 1e-9 * split:
            basis = BASIS_ROOFLINE
        elif roof <= 1e-9 * split:
            basis = BASIS_ACTIVITY
        else:
            basis = BASIS_MIXED
        out[kind] = basis
        out[f"{kind}_roofline_share"] = roof / split if split > 0 else None
        if basis == BASIS_MIXED:
            out[f"{kind}_label"] = (
                f"{BASIS_LABELS[(kind, BASIS_ROOFLINE)]} on {roof / split:.0%} of the {phase} time; "
                f"{BASIS_LABELS[(kind, BASIS_ACTIVITY)]} on the rest"
            )
        else:
            out[f"{kind}_label"] = BASIS_LABELS.get((kind, basis or ""))
        seconds = split + total(f"{phase}_activity_unknown_s")
        col = "stranded_compute_s" if kind == "compute" else "stranded_bandwidth_s"
        out[f"stranded_{kind}_{phase}_share"] = total(col) / seconds if seconds > 0 else None
    known_d, known_p = total("decode_sm_known_s"), total("prefill_dram_known_s")
    out["stranded_compute_sm_share"] = total("stranded_compute_sm_s") / known_d if known_d > 0 else None
    out["stranded_bandwidth_dram_share"] = (
        total("stranded_bandwidth_dram_s") / known_p if known_p > 0 else None
    )
    return out


def basis_word(basis: dict[str, Any] | None) -> str | None:
    """One basis for both kinds together (``roofline``, ``activity`` or ``mixed``), or None where
    neither has split time."""
    if not basis:
        return None
    kinds = {basis.get("compute"), basis.get("bandwidth")} - {None}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else BASIS_MIXED


def basis_note(basis: dict[str, Any]) -> str:
    """The trust note saying what the stranded categories rest on (one sentence: the idle and cost
    parts carry the same one, so a merged summary says it once)."""
    compute = basis.get("compute_label") or "decode time × (1 − MFU), else × (1 − SM activity)"
    bandwidth = basis.get("bandwidth_label") or "prefill time × (1 − MBU), else × (1 − DRAM activity)"
    return f"stranded compute = {compute}; stranded bandwidth = {bandwidth}"
