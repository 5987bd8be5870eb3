"""What every chart shares: the colours (phases, cost categories, trust labels), the trust labels
written into each chart (:func:`label_figure`) and the common layout."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go

from analytics.cost_pricing import CATEGORIES
from dashboard.figures.palette import COST_COLOURS as COST_COLOURS  # defined there, named from here too
from dashboard.figures.palette import NEUTRAL, SIGNAL_COLOURS, STATUS_COLOURS
from dashboard.figures.palette import PHASE_COLOURS as PHASE_COLOURS
from dashboard.figures.palette import TRUST_COLOURS as TRUST_COLOURS

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
SM_COLOUR = SIGNAL_COLOURS["sm_active"]  # SM activity, as on the GPUs page
UTIL_COLOUR = SIGNAL_COLOURS["gpu_util"]  # utilization %, as on the GPUs page
TTFT_COLOUR = SIGNAL_COLOURS["ttft"]  # the first token waits on prefill
ITL_COLOUR = SIGNAL_COLOURS["itl"]  # token gaps are decode steps
MET_COLOUR = STATUS_COLOURS["met"]  # an SLO met
MISSED_COLOUR = STATUS_COLOURS["missed"]  # an SLO missed
PERCENTILE_DASH = {50: "solid", 90: "dash", 99: "dot"}
SARLE_THRESHOLD = 5.0 / 9.0  # analytics.bimodal.SARLE_THRESHOLD (evidence beside the verdict)
MODE_LABEL_SPAN_PCT = 32.0  # about how much of a histogram's 0..100 % axis a mode's label spans
_GRID = NEUTRAL["grid"]
TRUST_ANNOTATION = "trust"  # the name of the trust label's annotation in a chart


# -- trust labels -------------------------------------------------------------------------------------


def ordered_labels(labels: Iterable[str]) -> list[str]:
    """Trust labels in the fixed order measured, emulated, simulated, host-bound, estimated."""
    given = set(labels)
    return [label for label in TRUST_ORDER if label in given] + sorted(given - set(TRUST_ORDER))


def trust_markup(labels: Iterable[str]) -> str:
    """The trust labels as every chart writes them: upper case, each in its colour, in
    :func:`ordered_labels` order (markup that both Plotly's text and HTML read); empty for none."""
    return " · ".join(
        f"<span style='color:{TRUST_COLOURS.get(lb, ('', NEUTRAL['reference']))[1]}'>{lb.upper()}</span>"
        for lb in ordered_labels(labels)
    )


def label_figure(fig: go.Figure, labels: Iterable[str]) -> go.Figure:
    """Write the trust labels into the chart itself (top right), so that a screenshot or an
    exported image still says how far the numbers can be trusted."""
    text = trust_markup(labels)
    if not text:
        return fig
    fig.add_annotation(
        name=TRUST_ANNOTATION,
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
