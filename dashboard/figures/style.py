"""What every chart shares: the colours (phases, cost categories, trust labels), the trust labels
written into each chart (:func:`label_figure`) and the common layout."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from analytics.cost_pricing import CATEGORIES

PHASE_COLOURS = {"prefill": "#f5a623", "decode": "#4caf50", "mixed": "#ab7ddb", "idle": "#ffffff"}
# Trust labels (analytics/trust.py, docs/STORE.md) -> badge colour (Streamlit's palette) and hex.
TRUST_COLOURS = {
    "measured": ("green", "#2e7d32"),
    "emulated": ("orange", "#e65100"),
    "simulated": ("violet", "#6a1b9a"),
    "host-bound": ("red", "#c62828"),
    "estimated": ("blue", "#1565c0"),
    "unvalidated": ("gray", "#616161"),
}
TRUST_ORDER = tuple(TRUST_COLOURS)

#: the cost categories of analytics/cost.py, in stacking order, with what to call them
COST_CATEGORIES = CATEGORIES
COST_LABELS = {
    "prefill": "productive prefill",
    "decode": "productive decode",
    "stranded_prefill": "stranded prefill bandwidth",
    "stranded_decode": "stranded decode compute",
    "host_bound": "host-bound",
    "other_busy": "other busy (not engine work)",  # an external fleet's busy time no engine work explains
    "idle": "idle",
    "unsampled": "unsampled (no samples)",  # a gap in the GPU's samples: not known, not idle
}
#: cost categories shown in tables only where the window has time in them (external fleets only)
OPTIONAL_COST = frozenset({"other_busy"})
COST_COLOURS = {
    "prefill": PHASE_COLOURS["prefill"],
    "decode": PHASE_COLOURS["decode"],
    # the waste in red shades (decode's compute, prefill's bandwidth), as on the Overview
    "stranded_prefill": "#ef9a9a",
    "stranded_decode": "#c62828",
    "host_bound": "#8e6bbf",
    "other_busy": "#cdbfe6",  # a paler host-bound: busy with work the engine does not report
    "idle": "#b0b7c3",
    "unsampled": "#e4e7ec",  # paler than idle: time with no data, not waste
}
SM_COLOUR = "#1f2a44"  # SM activity, as on the GPUs page
UTIL_COLOUR = "#d62728"  # utilization %, as on the GPUs page
TTFT_COLOUR = PHASE_COLOURS["prefill"]  # the first token waits on prefill
ITL_COLOUR = "#2e7d32"  # token gaps are decode steps (a darker decode green, readable as a line)
PERCENTILE_DASH = {50: "solid", 90: "dash", 99: "dot"}
SARLE_THRESHOLD = 5.0 / 9.0  # analytics.bimodal.SARLE_THRESHOLD (evidence beside the verdict)
MODE_LABEL_SPAN_PCT = 32.0  # about how much of a histogram's 0..100 % axis a mode's label spans
_GRID = "#eeeeee"


# -- trust labels -------------------------------------------------------------------------------------


def ordered_labels(labels: Iterable[str]) -> list[str]:
    """Trust labels in the fixed order measured, emulated, simulated, host-bound, estimated."""
    given = set(labels)
    return [label for label in TRUST_ORDER if label in given] + sorted(given - set(TRUST_ORDER))


def trust_markup(labels: Iterable[str]) -> str:
    """The trust labels as every chart writes them: upper case, each in its colour, in
    :func:`ordered_labels` order (markup that both Plotly's text and HTML read); empty for none."""
    return " · ".join(
        f"<span style='color:{TRUST_COLOURS.get(lb, ('', '#555'))[1]}'>{lb.upper()}</span>"
        for lb in ordered_labels(labels)
    )


def label_figure(fig: go.Figure, labels: Iterable[str]) -> go.Figure:
    """Write the trust labels into the chart itself (top right), so that a screenshot or an
    exported image still says how far the numbers can be trusted."""
    text = trust_markup(labels)
    if not text:
        return fig
    fig.add_annotation(
        text=f"<b>{text}</b>",
        xref="paper",
        yref="paper",
        x=1.0,
        y=1.0,
        yshift=8,
        xanchor="right",
        yanchor="bottom",
        showarrow=False,
        font={"size": 12},
    )
    return fig


def part_labels(part: Mapping[str, Any] | None) -> list[str]:
    """The trust labels of a summary part (``part["trust"]["labels"]``)."""
    trust = (part or {}).get("trust") or {}
    return list(trust.get("labels") or [])


def apply_layout(fig: go.Figure, title: str, *, height: int = 380, legend_y: float = -0.22) -> None:
    """The layout every chart shares: title at the top left, legend under the plot, light grid."""
    fig.update_layout(
        title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        height=height,
        margin={"l": 70, "r": 20, "t": 56, "b": 40},
        legend={
            "orientation": "h",
            "yanchor": "top",
            "y": legend_y,
            "x": 0,
            "font": {"size": 12},
            "traceorder": "normal",
        },
        plot_bgcolor="white",
    )
    fig.update_xaxes(showgrid=True, gridcolor=_GRID)
    fig.update_yaxes(showgrid=True, gridcolor=_GRID)
