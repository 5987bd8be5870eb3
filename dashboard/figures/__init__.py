"""Plotly figures of the analytics summary: pure functions, a part of the summary's JSON in, a
``go.Figure`` out, no Streamlit — so the dashboard pages and the HTML reports draw the same charts.

Colours mean one thing everywhere: :data:`PHASE_COLOURS` (the GPUs page's phase bands), one colour
per cost category (:data:`COST_COLOURS`, productive ones in their phase's colour, stranded ones a
pale shade of it), and the trust labels' (:data:`TRUST_COLOURS`) written into every chart by
:func:`label_figure`.

The builders by subject, each importable from here: ``style`` (colours, trust labels, layout),
``text`` (numbers in words), ``bimodal``, ``cost`` (GPU-time and money), ``latency`` (latency, SLO
attainment, goodput).
"""

from dashboard.figures.bimodal import (
    activity_histogram_figure,
    bimodal_pool_rows,
    modes_in_words,
    sarle_text,
    verdict_text,
)
from dashboard.figures.cost import (
    GPU_TIME_COLOURS,
    MIN_LABEL_SHARE,
    OPTIONAL_GPU_TIME,
    annual_figure,
    cost_by_pool_figure,
    cost_categories,
    cost_over_time_figure,
    cost_stack,
    gpu_time_colours,
    gpu_time_figure,
    gpu_time_rows,
    period_text,
    pool_name,
)
from dashboard.figures.latency import (
    attainment_over_time_figure,
    goodput_sweep_figure,
    latency_over_time_figure,
    log_ticks,
)
from dashboard.figures.style import (
    COST_CATEGORIES,
    COST_COLOURS,
    COST_LABELS,
    ITL_COLOUR,
    MET_COLOUR,
    MISSED_COLOUR,
    MODE_LABEL_SPAN_PCT,
    OPTIONAL_COST,
    PERCENTILE_DASH,
    PHASE_COLOURS,
    SARLE_THRESHOLD,
    SM_COLOUR,
    TRUST_COLOURS,
    TRUST_ORDER,
    TTFT_COLOUR,
    UTIL_COLOUR,
    label_figure,
    ordered_labels,
    part_labels,
    trust_markup,
)
from dashboard.figures.text import (
    delta_text,
    figure_text,
    time_axis_title,
    usd_text,
)

__all__ = [
    "COST_CATEGORIES",
    "COST_COLOURS",
    "COST_LABELS",
    "GPU_TIME_COLOURS",
    "ITL_COLOUR",
    "MET_COLOUR",
    "MIN_LABEL_SHARE",
    "MISSED_COLOUR",
    "MODE_LABEL_SPAN_PCT",
    "OPTIONAL_COST",
    "OPTIONAL_GPU_TIME",
    "PERCENTILE_DASH",
    "PHASE_COLOURS",
    "SARLE_THRESHOLD",
    "SM_COLOUR",
    "TRUST_COLOURS",
    "TRUST_ORDER",
    "TTFT_COLOUR",
    "UTIL_COLOUR",
    "activity_histogram_figure",
    "annual_figure",
    "attainment_over_time_figure",
    "bimodal_pool_rows",
    "cost_by_pool_figure",
    "cost_categories",
    "cost_over_time_figure",
    "cost_stack",
    "delta_text",
    "figure_text",
    "goodput_sweep_figure",
    "gpu_time_colours",
    "gpu_time_figure",
    "gpu_time_rows",
    "label_figure",
    "latency_over_time_figure",
    "log_ticks",
    "modes_in_words",
    "ordered_labels",
    "part_labels",
    "period_text",
    "pool_name",
    "sarle_text",
    "time_axis_title",
    "trust_markup",
    "usd_text",
    "verdict_text",
]
