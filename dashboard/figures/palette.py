"""Every colour of the dashboard, the HTML reports and the Grafana dashboard, defined once.

One colour means one thing, everywhere:

- **phases** (:data:`PHASE_COLOURS`): prefill amber, decode green, mixed (an aggregated pool that runs
  both) olive, idle grey, host (the GPU waiting on the host: host-bound) purple. A pool, a phase's
  GPU-time, a phase's cost and the latency that phase bounds (TTFT: prefill, TPOT/ITL: decode) take it.
- **waste** (:data:`WASTE_COLOURS`): red shades, for stranded GPU-time only (decode's idle compute red,
  prefill's idle bandwidth a pale red). Red means stranded and nothing else.
- **SLO status** (:data:`STATUS_COLOURS`): met teal, missed crimson; a candidate that misses grey.
- **trust labels** (:data:`TRUST_COLOURS`, the badge colour Streamlit knows and the hex of the same):
  measured green, emulated orange, simulated blue, host-bound the host purple (the same thing as the
  host-bound GPU-time), estimated grey, unvalidated (a GPU or dtype the model was never checked on) dark yellow.
- **device signals** on the GPUs and Bimodal pages: SM activity navy, utilization slate; the power
  limit and reference lines in ink greys (:data:`NEUTRAL`), never a category colour.

Modules name colours only through here (``tests/dashboard/test_palette.py`` fails on a colour literal
anywhere else in ``dashboard/`` or in ``phaselens/grafana_dashboard.py``).
"""

from __future__ import annotations

PHASE_COLOURS = {
    "prefill": "#f5a623",
    "decode": "#4caf50",
    "mixed": "#9e9d24",
    "idle": "#b0b7c3",
    "host": "#7e57c2",
}
WASTE_COLOURS = {"stranded_decode": "#c62828", "stranded_prefill": "#ef9a9a"}
STATUS_COLOURS = {"met": "#00897b", "missed": "#ad1457", "not_a_choice": "#9e9e9e"}
#: trust label (analytics/trust.py) -> (Streamlit badge colour, hex)
TRUST_COLOURS = {
    "measured": ("green", "#2e7d32"),
    "emulated": ("orange", "#e65100"),
    "simulated": ("blue", "#1565c0"),
    "host-bound": ("violet", PHASE_COLOURS["host"]),
    "estimated": ("gray", "#616161"),
    "unvalidated": ("yellow", "#8d6e00"),
}
#: the cost / GPU-time categories of analytics/cost.py
COST_COLOURS = {
    "prefill": PHASE_COLOURS["prefill"],
    "decode": PHASE_COLOURS["decode"],
    "stranded_prefill": WASTE_COLOURS["stranded_prefill"],
    "stranded_decode": WASTE_COLOURS["stranded_decode"],
    "host_bound": PHASE_COLOURS["host"],
    "other_busy": "#cdbfe6",  # a paler host purple: busy with work the engine does not report
    "idle": PHASE_COLOURS["idle"],
    "unsampled": "#e4e7ec",  # paler than idle: time with no data, not waste
}
SIGNAL_COLOURS = {
    "sm_active": "#1f2a44",  # SM activity (navy)
    "gpu_util": "#78909c",  # utilization (slate)
    "ttft": PHASE_COLOURS["prefill"],  # the first token waits on prefill
    "itl": "#388e3c",  # token gaps are decode steps: a darker decode green, readable as a line
    "pool_unknown": "#5c6b8a",  # a GPU without a pool
}
#: greys and whites: text, grids, axes, reference lines, backgrounds (no meaning of their own)
NEUTRAL = {
    "white": "#ffffff",
    "ink": "#31333f",  # Streamlit's text colour
    "ink_dark": "#1f2430",
    "body": "#222222",
    "reference": "#555555",  # SLO and target lines
    "reference_light": "#888888",
    "limit": "#333333",  # the power limit
    "muted": "#666666",
    "faint": "#777777",
    "faint_text": "#999999",
    "tick": "#6b6f76",
    "axis": "#9aa0a6",
    "grid": "#eeeeee",
    "grid_svg": "#e8e8e8",
    "missing": "#f1f1f1",  # a heatmap cell without samples
    "no_value": "#cccccc",
    "rule": "#dddddd",
    "swatch_border": "#d0d4da",
    "track": "#f0f2f6",  # a bar's background
    "header": "#f5f5f5",
    "code": "#f7f7f7",
    "empty_bg": "#f4f6f8",
    "empty_border": "#dde3ea",
    "error_bg": "#fdecea",
    "error_border": "#f5c2c0",
    "label_bg": "rgba(255,255,255,0.85)",  # behind a label drawn over a chart
}
#: a change for the better / worse (the Overview's and reports' deltas, the compare columns)
DELTA_COLOURS = {"better": STATUS_COLOURS["met"], "worse": STATUS_COLOURS["missed"], "same": NEUTRAL["muted"]}


def colour_meanings() -> dict[str, str]:
    """Every category colour (phases, waste, status, trust, signals, the cost categories not a phase's)
    and what it means: a colour used for two meanings is a bug (tested)."""
    out: dict[str, str] = {}

    def put(colour: str, meaning: str) -> None:
        out.setdefault(colour.lower(), meaning)

    for k, c in PHASE_COLOURS.items():
        put(c, f"phase {k}")
    for k, c in WASTE_COLOURS.items():
        put(c, f"waste {k}")
    for k, c in STATUS_COLOURS.items():
        put(c, f"status {k}")
    for k, (_n, c) in TRUST_COLOURS.items():
        put(c, f"trust {k}")
    for k, c in COST_COLOURS.items():
        put(c, f"cost {k}")
    for k, c in SIGNAL_COLOURS.items():
        put(c, f"signal {k}")
    return out
