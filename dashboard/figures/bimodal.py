"""The bimodality charts and words: a pool's activity histogram with its modes, the verdict and
Sarle's b as the analytics gave them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import plotly.graph_objects as go

from dashboard.figures.palette import NEUTRAL
from dashboard.figures.style import (
    MODE_LABEL_SPAN_PCT,
    PHASE_COLOURS,
    SARLE_THRESHOLD,
    SM_COLOUR,
    UTIL_COLOUR,
    apply_layout,
    label_figure,
)
from dashboard.figures.text import as_float


def verdict_text(row: Mapping[str, Any] | None) -> str:
    """A bimodality row's verdict in words, as the analytics decided it (``verdict``:
    ``analytics.bimodal.bimodal_verdict`` — ``bimodal (dip p < 0.001, two modes)``, ``not bimodal
    (dip p < 0.001 but one mode)``, ...), so the page, the report and ``phaselens analyze`` say one
    thing. Never re-derived here from the p-value."""
    verdict = (row or {}).get("verdict")
    return str(verdict) if verdict else "no verdict (no bimodality row)"


def sarle_text(sarle: float) -> str:
    """Sarle's b against its threshold, worded as evidence, not as a verdict: ``0.41 (below 0.556)``."""
    side = "above" if sarle > SARLE_THRESHOLD else "below"
    return f"{sarle:.2f} ({side} {SARLE_THRESHOLD:.3f})"


def modes_in_words(row: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """A bimodality row's modes as (label, text) — ``("Modes", "0 % (10% of samples) and 24 % (90%)")``
    or ``("One mode", "40 %")`` — or None without a mode (the dashboard and the report say it alike)."""
    row = row or {}
    lo, hi = as_float(row.get("mode_low_pct")), as_float(row.get("mode_high_pct"))
    if lo != lo:
        return None
    if hi != hi:
        return "One mode", f"{lo:.0f} %"
    w_lo, w_hi = (
        w if w == w else 0.0 for w in (as_float(row.get("weight_low")), as_float(row.get("weight_high")))
    )
    return "Modes", f"{lo:.0f} % ({w_lo:.0%} of samples) and {hi:.0f} % ({w_hi:.0%})"


def bimodal_pool_rows(bimodal: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The bimodality rows (the summary's ``bimodal`` part) of the fleet and of each pool, by pool
    (``fleet`` for all GPUs, as the histogram's groups are keyed)."""
    out: dict[str, dict[str, Any]] = {}
    for row in bimodal.get("table") or []:
        if row.get("scope") == "fleet":
            out["fleet"] = row
        elif row.get("scope") == "pool":
            out[str(row.get("role") or "unknown")] = row
    return out


def _shares_pct(part: Mapping[str, Any]) -> list[float]:
    counts = [float(c) for c in part.get("counts") or []]
    n = sum(counts)
    return [100.0 * c / n for c in counts] if n else [0.0] * len(counts)


def activity_histogram_figure(
    group: Mapping[str, Any],
    edges_pct: Sequence[float],
    bimodal_row: Mapping[str, Any] | None,
    *,
    title: str,
    labels: Iterable[str],
) -> go.Figure:
    """SM activity and utilization % of one pool as overlaid histograms (share of samples per
    bin), the modes (``mode_low_pct`` / ``mode_high_pct`` of the pool's bimodality row: peaks of the
    smoothed histogram; one where the high one is missing) marked, the verdict (:func:`verdict_text`) in the title."""
    edges = [float(e) for e in edges_pct]
    mids = [(a + b) / 2 for a, b in pairwise(edges)]
    width = edges[1] - edges[0] if len(edges) > 1 else 1.0
    fig = go.Figure()
    for key, name, colour, opacity in (
        ("sm_active", "SM activity", SM_COLOUR, 0.75),
        ("gpu_util", "utilization", UTIL_COLOUR, 0.45),
    ):
        part = group.get(key) or {}
        if not part.get("n"):
            continue
        fig.add_trace(
            go.Bar(
                x=mids,
                y=_shares_pct(part),
                width=width,
                name=f"{name} (mean {as_float(part.get('mean_pct')):.0f} %)",
                marker={"color": colour, "line": {"width": 0}},
                opacity=opacity,
                hovertemplate=f"{name} %{{x:.0f}} %: %{{y:.1f}} % of samples<extra></extra>",
            )
        )
    row = bimodal_row or {}
    modes = [
        ("low", as_float(row.get("mode_low_pct")), as_float(row.get("weight_low")), PHASE_COLOURS["decode"]),
        (
            "high",
            as_float(row.get("mode_high_pct")),
            as_float(row.get("weight_high")),
            PHASE_COLOURS["prefill"],
        ),
    ]
    one = modes[1][1] != modes[1][1]  # a single mode: no high one
    for i, (which, centre, weight, colour) in enumerate(modes):
        if centre != centre:
            continue
        name = "mode" if one else f"{which} mode"
        fig.add_vline(x=centre, line={"color": colour, "width": 2.5, "dash": "dash"})
        # text on the side away from the other mode, unless it would run off the plot there (two
        # close modes then share a side, one line apart)
        right_side = centre < MODE_LABEL_SPAN_PCT if which == "low" else centre <= 100 - MODE_LABEL_SPAN_PCT
        fig.add_annotation(
            x=centre,
            y=1.0 - 0.09 * i,
            yref="paper",
            text=f"{name} {centre:.0f} %"
            + (f" ({100 * weight:.0f} % of samples)" if weight == weight and not one else ""),
            showarrow=False,
            yanchor="top",
            xanchor="left" if right_side else "right",
            xshift=4 if right_side else -4,
            font={"size": 11, "color": NEUTRAL["limit"]},
            bgcolor=NEUTRAL["label_bg"],
        )
        # a legend entry naming the marker
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                name="mode (one)" if one else f"mode ({which})",
                line={"color": colour, "width": 2.5, "dash": "dash"},
                hoverinfo="skip",
            )
        )
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_xaxes(title_text=f"SM activity or utilization, % ({width:g} % bins)", range=[0, 100])
    fig.update_yaxes(title_text="share of samples, %", rangemode="tozero")
    apply_layout(fig, f"{title} — {verdict_text(row)}", height=400, legend_y=-0.2)
    return label_figure(fig, labels)
