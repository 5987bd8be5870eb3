"""Latency: TTFT and inter-token latency percentiles over time, SLO attainment over time for the
TTFT / TPOT SLOs the user sets, and goodput sweeps.

Reads the ``latency`` part of ``GET /api/v1/analytics/summary`` (with ``slo_ttft_ms`` and
``slo_tpot_ms``). Goodput results are not stored by the service: ``phaselens goodput --json FILE``
writes one, and this page shows a file given to it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common, compare, figures
from dashboard.page_trust import PageTrust

DEFAULT_TTFT_MS = 2000  # analytics.latency.SloSpec's defaults
DEFAULT_TPOT_MS = 100
TARGET = 0.9  # DistServe's goodput target


def _ms(v: Any) -> str:
    """A latency in seconds as a person reads it: ms below a second (``85.2 ms``, ``420 ms``), s from
    a second up (``9.06 s``, not ``9,063 ms``)."""
    if not isinstance(v, int | float) or math.isnan(v):
        return "—"
    ms = v * 1000
    if ms >= 1000:
        return f"{v:,.2f} s" if v < 100 else f"{v:,.0f} s"
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms"


def _share(v: Any) -> str:
    return "—" if not isinstance(v, int | float) or math.isnan(v) else f"{v:.1%}"


def _slo_controls() -> tuple[int, int]:
    c1, c2 = st.columns(2)
    ttft = c1.slider(
        "TTFT SLO, ms",
        min_value=50,
        max_value=10_000,
        value=DEFAULT_TTFT_MS,
        step=50,
        key="slo_ttft_ms",
        help="time to first token a request must meet",
    )
    tpot = c2.slider(
        "TPOT SLO, ms per output token",
        min_value=1,
        max_value=500,
        value=DEFAULT_TPOT_MS,
        step=1,
        key="slo_tpot_ms",
        help="mean time per output token after the first",
    )
    return int(ttft), int(tpot)


def _headline(lat: dict[str, Any]) -> None:
    att = lat.get("attainment") or {}
    pct = lat.get("percentiles") or {}
    c1, c2, c3, c4, c5 = st.columns(5)
    c1.metric(
        "Meeting both SLOs",
        _share(att.get("both")),
        help=f"{att.get('met', 0)} of {att.get('requests', 0)} requests; failed requests count as misses",
    )
    c2.metric("Meeting the TTFT SLO", _share(att.get("ttft")))
    c3.metric("Meeting the TPOT SLO", _share(att.get("tpot")))
    c4.metric("TTFT p90", _ms((pct.get("ttft") or {}).get("p90_s")))
    c5.metric("ITL p90", _ms((pct.get("itl") or {}).get("p90_s")))


def _percentile_table(lat: dict[str, Any]) -> None:
    names = {"ttft": "Time to first token", "tpot": "Time per output token", "itl": "Inter-token latency"}
    names["e2e"] = "End to end"
    rows = []
    for metric, name in names.items():
        p = (lat.get("percentiles") or {}).get(metric) or {}
        rows.append(
            {
                "Latency": name,
                "Values": int(p.get("n") or 0),
                "p50": _ms(p.get("p50_s")),
                "p90": _ms(p.get("p90_s")),
                "p99": _ms(p.get("p99_s")),
                "Mean": _ms(p.get("mean_s")),
                "Method": "from buckets (estimated)" if p.get("method") == "histogram" else "per request",
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def _goodput(trust: PageTrust) -> None:
    st.subheader("Goodput")
    st.markdown(
        "Goodput (DistServe) is the highest request rate at which at least 90 % of requests meet both SLOs, "
        "per GPU. It takes a sweep of runs at several rates, so the service does not compute or store it: "
        "run it with the simulator or against a live stack and write the result to a file,\n\n"
        "```bash\n"
        "phaselens goodput --layout agg:2xh100-sxm --slo-ttft-ms 2000 --slo-tpot-ms 100 --json goodput.json\n"
        "phaselens goodput --url http://127.0.0.1:8000 --gpus 2 --json goodput.json   # a live stack\n"
        "```\n\nthen open the file here to chart it."
    )
    up = st.file_uploader(
        "Goodput result (JSON from phaselens goodput --json)", type=["json"], key="goodput_file"
    )
    if up is None:
        return
    try:
        result = json.loads(up.getvalue())
        if not isinstance(result, dict) or not isinstance(result.get("sweep"), list):
            raise ValueError("no 'sweep' list")
    except (ValueError, UnicodeDecodeError) as e:
        st.error(f"**{up.name} is not a goodput result** of `phaselens goodput --json` ({e}).")
        return
    trust.add(figures.part_labels(result))
    if trust.differs(figures.part_labels(result)):
        st.caption(f"Figures of this sweep: {', '.join(figures.ordered_labels(figures.part_labels(result)))}")
    bound = "" if result.get("bounded", True) else "≥ "
    c1, c2 = st.columns(2)
    c1.metric("Goodput", f"{bound}{float(result.get('goodput_rps') or 0):.3g} req/s")
    c2.metric("Per GPU", f"{bound}{float(result.get('goodput_rps_per_gpu') or 0):.3g} req/s")
    trust.chart(
        figures.goodput_sweep_figure(result), figures.part_labels(result), width="stretch", key="goodput"
    )


def render(sel: common.Selection, ttft_ms: int, tpot_ms: int, trust_slot: Any = None) -> None:
    """The page body for the chosen SLOs."""
    trust = PageTrust(trust_slot)
    try:
        compare.body_or_compared(
            sel.compare,
            sel.compare_note,
            lambda: _body(sel, ttft_ms, tpot_ms, trust),
            lambda other: _compared(sel, other, ttft_ms, tpot_ms, trust),
        )
        _goodput(trust)
    finally:
        trust.render()


def _pct_of(lat: dict[str, Any], metric: str, p: str) -> float | None:
    v = ((lat.get("percentiles") or {}).get(metric) or {}).get(p)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[compare.Row]:
    """The latency figures of windows A and B (two ``latency`` parts) as comparison rows: attainment
    (higher is better, in points), then the p90s (lower is better)."""
    rows = []
    for key, label in (
        ("both", "Meeting both SLOs"),
        ("ttft", "Meeting the TTFT SLO"),
        ("tpot", "Meeting the TPOT SLO"),
    ):
        va, vb = ((x.get("attainment") or {}).get(key) for x in (a, b))
        rows.append(
            compare.Row(
                key=f"attainment_{key}", label=label, a=va, b=vb, a_text=_share(va), b_text=_share(vb),
                ratio=True, higher_is_better=True,
            )
        )  # fmt: skip
    for metric, label in (
        ("ttft", "TTFT p90"),
        ("tpot", "TPOT p90"),
        ("itl", "ITL p90"),
        ("e2e", "End to end p90"),
    ):
        va, vb = _pct_of(a, metric, "p90_s"), _pct_of(b, metric, "p90_s")
        rows.append(
            compare.Row(
                key=f"{metric}_p90_s", label=label, a=va, b=vb, a_text=_ms(va), b_text=_ms(vb),
                higher_is_better=False,
            )
        )  # fmt: skip
    return rows


def _compared(
    sel: common.Selection, other: common.Selection, ttft_ms: int, tpot_ms: int, trust: PageTrust
) -> None:
    """Windows A and B side by side at the same SLOs: the figures with the change, then each window's
    latency percentiles over time."""
    with common.service_errors():
        sums = [common.analytics(s, slo_ttft_ms=ttft_ms, slo_tpot_ms=tpot_ms) for s in (sel, other)]
    lats = [(s.get("parts") or {}).get("latency") or {} for s in sums]
    for lat in lats:
        trust.add(figures.part_labels(lat), primary=True)
    st.caption(f"A: {common.describe_window(sel)} · B: {common.describe_window(other)} · the same SLOs")
    st.markdown(compare.table_html(compare_rows(lats[0], lats[1]), "A", "B"), unsafe_allow_html=True)
    left, right = compare.headers(common.describe_window(sel), common.describe_window(other))
    for col, s, lat, summary, side in (
        (left, sel, lats[0], sums[0], "a"),
        (right, other, lats[1], sums[1], "b"),
    ):
        with col:
            if not lat.get("requests"):
                common.empty_window("requests", s)
                continue
            labels = figures.part_labels(lat)
            slo = lat.get("slo") or {}
            win = summary.get("window") or {}
            window_s = (
                (float(win["start_s"]), float(win["end_s"])) if "start_s" in win and "end_s" in win else None
            )
            fig = figures.latency_over_time_figure(
                lat.get("over_time") or [],
                labels=labels,
                simulated=s.simulated,
                slo_ttft_s=slo.get("ttft_s"),
                slo_tpot_s=slo.get("tpot_s"),
                bucket_s=lat.get("bucket_s"),
                window_s=window_s,
            )
            fig.update_layout(legend={"y": -0.14})  # half a page wide: the legend wraps to two rows
            trust.chart(
                fig, labels, width="stretch", key=f"latency_time_{side}", config={"displaylogo": False}
            )


def _body(sel: common.Selection, ttft_ms: int, tpot_ms: int, trust: PageTrust) -> None:
    with common.service_errors():
        summary = common.analytics(sel, slo_ttft_ms=ttft_ms, slo_tpot_ms=tpot_ms)
    lat = (summary.get("parts") or {}).get("latency")
    if not lat or not lat.get("requests"):
        common.empty_window("requests", sel)
        why = (summary.get("missing") or {}).get("latency")
        if why:
            st.caption(f"Latency not computed: {why}")
        return
    labels = figures.part_labels(lat)
    trust.add(labels, primary=True)
    _headline(lat)
    over = lat.get("over_time") or []
    slo = lat.get("slo") or {}
    win = summary.get("window") or {}
    window_s = (float(win["start_s"]), float(win["end_s"])) if "start_s" in win and "end_s" in win else None
    trust.chart(
        figures.latency_over_time_figure(
            over,
            labels=labels,
            simulated=sel.simulated,
            slo_ttft_s=slo.get("ttft_s"),
            slo_tpot_s=slo.get("tpot_s"),
            bucket_s=lat.get("bucket_s"),
            window_s=window_s,
        ),
        labels,
        width="stretch",
        key="latency_time",
        config={"displaylogo": False},
    )
    trust.chart(
        figures.attainment_over_time_figure(
            over,
            labels=labels,
            simulated=sel.simulated,
            target=TARGET,
            slo_text=f"TTFT ≤ {ttft_ms:g} ms, TPOT ≤ {tpot_ms:g} ms",
            bucket_s=lat.get("bucket_s"),
            window_s=window_s,
        ),
        labels,
        width="stretch",
        key="attainment_time",
        config={"displaylogo": False},
    )
    st.caption(
        "Each SLO is drawn on the metric it bounds: TTFT on TTFT, TPOT (a request's mean time per output "
        "token) on TPOT. Inter-token latency is every single gap between tokens, with no SLO line: its p99 "
        "may sit above the TPOT SLO while every request meets it. "
        "Requests are counted in the bucket they arrived in; a request that failed misses the SLO. "
        "The pool and GPU filters do not apply here: latency is per request, over the whole data set."
    )
    _percentile_table(lat)
    notes = (lat.get("trust") or {}).get("notes") or []
    if notes:
        with st.expander("How these figures were made"):
            st.markdown("\n".join(f"- {n}" for n in notes))


with common.service_errors():
    sel = common.sidebar()
st.title("Latency")
st.caption(f"{common.describe_window(sel)} · TTFT and inter-token latency, SLO attainment, goodput")
trust_slot = st.empty()  # the page's trust badges, under its title (filled by the fragment)
ttft_ms, tpot_ms = _slo_controls()


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel, ttft_ms, tpot_ms, trust_slot)


_live()
