"""Bimodal: per pool, how SM activity is distributed (two modes on a GPU that does both phases),
the bimodality verdict, the two modes, and utilization % beside it, so the gap between
"a kernel was running" and "the SMs were busy" shows.

Reads ``GET /api/v1/analytics/histogram`` (binned counts per pool, never the samples) and the
``bimodal`` part of ``GET /api/v1/analytics/summary`` (dip test, Sarle's coefficient, modes, and
each row's ``verdict`` under the part's ``rule``: the page shows them as the analytics decided), and
its ``roofline`` part: MFU / MBU per pool and phase and the stranded compute / bandwidth beside the
activities (dashboard/roofline.py).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common, figures
from dashboard.page_trust import PageTrust, render_with_trust


def _pct(v: Any, digits: int = 0) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.{digits}f} %"


def _facts(group: dict[str, Any], row: dict[str, Any] | None) -> None:
    """The figures beside a pool's histogram: utilization % against SM activity, the test results."""
    row = row or {}
    util = (group.get("gpu_util") or {}).get("mean_pct")
    sm = (group.get("sm_active") or {}).get("mean_pct")
    gap = row.get("util_sm_gap_pct")
    c1, c2 = st.columns(2)
    c1.metric("Mean utilization", _pct(util), help="share of time a kernel was running (NVML utilization %)")
    c2.metric(
        "Mean SM activity",
        _pct(sm),
        help="share of the SMs doing work (DCGM/GPM SM activity); the gap is busy time with idle compute",
    )
    if isinstance(gap, int | float):
        points = "point" if round(gap) in (1, -1) else "points"
        st.markdown(f"**Busy but compute-idle:** {gap:.0f} {points} (utilization − SM activity)")
    st.markdown(f"**Bimodal?** {figures.verdict_text(row)}")
    sarle = row.get("sarle")
    if isinstance(sarle, int | float):
        st.markdown(f"**Sarle's b** (supporting evidence, not the verdict): {figures.sarle_text(sarle)}")
    modes = figures.modes_in_words(row)
    if modes:
        st.markdown(f"**{modes[0]}:** {modes[1]}")
    sp, sd = row.get("sm_prefill_pct"), row.get("sm_decode_pct")
    if isinstance(sp, int | float) or isinstance(sd, int | float):
        st.markdown(f"**SM activity in prefill / decode:** {_pct(sp)} / {_pct(sd)}")
    st.caption(f"{group.get('gpus', 0)} GPUs · {int(group.get('samples') or 0):,} samples")


def _gpu_table(bimodal: dict[str, Any], sel: common.Selection) -> None:
    rows = [r for r in bimodal.get("table") or [] if r.get("scope") == "gpu"]
    if not rows:
        return
    labels = {g.analytics_key: g.label for g in sel.all_gpus}
    wanted = {g.analytics_key for g in sel.gpus}
    shown = []
    for r in rows:
        key = str(r.get("gpu"))
        if labels and key not in wanted:
            continue
        shown.append(
            {
                "GPU": labels.get(key, key),
                "Pool": r.get("role") or "—",
                "Bimodal?": figures.verdict_text(r),
                "Low mode": _pct(r.get("mode_low_pct")),
                "High mode": _pct(r.get("mode_high_pct")),
                "Mean SM activity": _pct(r.get("mean_sm_pct"), 1),
                "Mean utilization": _pct(r.get("util_pct"), 1),
                "Sarle's b (evidence)": "—" if r.get("sarle") is None else f"{float(r['sarle']):.2f}",
            }
        )
    if not shown:
        return
    st.subheader("Per GPU")
    st.dataframe(pd.DataFrame(shown), hide_index=True, width="stretch")


def _roofline(summary: dict[str, Any], trust: PageTrust) -> None:
    """MFU and MBU per pool and phase beside the activities, and the stranded GPU-seconds (their trust
    labels go into the page's one badge block)."""
    from dashboard.roofline import STRANDED_TEXT, roofline_labels, roofline_rows, stranded_rows

    part = (summary.get("parts") or {}).get("roofline") or {}
    st.subheader("Against the roofline: MFU, MBU and stranded time")
    if not part:
        why = (summary.get("missing") or {}).get("roofline") or "no iteration carries a work count"
        st.info(f"No MFU / MBU: {why}")
        return
    trust.add(roofline_labels(part))
    st.dataframe(pd.DataFrame(roofline_rows(part)), hide_index=True, width="stretch")
    st.dataframe(pd.DataFrame(stranded_rows(part)), hide_index=True, width="stretch")
    st.caption(STRANDED_TEXT)
    for note in (part.get("trust") or {}).get("notes") or []:
        st.caption(note)


def render(sel: common.Selection) -> None:
    """The page body (re-run every few seconds for live data with refresh on)."""
    render_with_trust(lambda trust: _body(sel, trust))


def _body(sel: common.Selection, trust: PageTrust) -> None:
    with common.service_errors():
        hist = common.analytics(sel, "histogram")
        summary = common.analytics(sel)
    groups = [g for g in hist.get("groups") or [] if g.get("samples")]
    if not groups:
        common.empty_window("GPU samples", sel)
        return
    bimodal = (summary.get("parts") or {}).get("bimodal") or {}
    rows = figures.bimodal_pool_rows(bimodal)
    labels = set(figures.part_labels(hist)) | set(figures.part_labels(bimodal))
    trust.add(labels, primary=True)
    pools = common.pool_filter(sel)
    pool_groups = [g for g in groups if g["pool"] != "fleet" and (pools is None or g["pool"] in pools)]
    if not pool_groups:
        common.empty_window("samples of the selected pools", sel)
        return
    fleet = next((g for g in groups if g["pool"] == "fleet"), None)
    if fleet is not None and len(pool_groups) > 1 and pools is None:
        pool_groups.insert(0, fleet)
    if "bimodal" in (summary.get("missing") or {}):
        st.warning(f"The dip test could not run: {summary['missing']['bimodal']}", icon=":material/warning:")
    for g in pool_groups:
        name = "All GPUs" if g["pool"] == "fleet" else f"{g['pool'].capitalize()} pool"
        left, right = st.columns([5, 2], vertical_alignment="center")
        with left:
            fig = figures.activity_histogram_figure(
                g, hist["edges_pct"], rows.get(g["pool"]), title=name, labels=labels
            )
            trust.chart(fig, labels, width="stretch", key=f"hist_{g['pool']}", config={"displaylogo": False})
        with right:
            _facts(g, rows.get(g["pool"]))
    rule = bimodal.get("rule") or "no rule: no bimodality part in the summary"
    st.caption(
        "Bars: share of the window's samples in each bin (SM activity dark, utilization % red). Dashed lines: "
        "the modes, peaks of the smoothed SM-activity histogram, with the share of samples on each side of the "
        f"valley between them. Verdict: {rule}. Two separate modes mean the GPUs spend their time in two distinct states (idle or "
        "memory-bound decode low, compute-bound prefill high), while utilization % reads busy whenever a kernel runs."
    )
    if sel.gpus != sel.all_gpus:
        st.caption("Histograms are per pool: the GPU filter narrows the pools shown and the per-GPU table.")
    _gpu_table(bimodal, sel)
    _roofline(summary, trust)


with common.service_errors():
    sel = common.sidebar()
st.title("Bimodal")
st.caption(f"{common.describe_window(sel)} · SM activity against utilization %, per pool")


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel)


_live()
