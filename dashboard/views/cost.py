"""Cost: where the money of the window goes — productive prefill and decode, stranded compute and
bandwidth, host-bound gaps and idle time — by pool and over time, the $/1M tokens, and the
annualised figure for a fleet size and prices the user sets.

Reads the ``cost`` and ``annual`` parts of ``GET /api/v1/analytics/summary`` (with ``fleet_gpus``
and the price parameters ``gpu_usd_per_hour``, ``electricity_usd_per_kwh``, ``pue``).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import common, compare, figures
from dashboard.page_trust import PageTrust

GPU_USD_RANGE = (0.0, 1000.0)  # analytics.reads.PRICE_PARAMS
KWH_USD_RANGE = (0.0, 10.0)
PUE_RANGE = (1.0, 5.0)


MODELED_SUFFIXES = (" (emulated)", " (simulated)")  # analytics.prices.MODELED_SUFFIXES


def gpu_prices(cost: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """Each GPU name of the window → (the price table's key that priced it, $/GPU-hour): its own
    entry, else the GPU an emulated or simulated one models (as analytics.prices.PriceTable does)."""
    table = (cost.get("prices") or {}).get("gpu_usd_per_hour") or {}
    out: dict[str, tuple[str, float]] = {}
    for name in {str(r.get("gpu_name")) for r in cost.get("by_gpu") or [] if r.get("gpu_name")}:
        keys = [name] + [name.removesuffix(s) for s in MODELED_SUFFIXES if name.endswith(s)]
        key = next((k for k in keys if k in table), None)
        if key is not None:
            out[name] = (key, float(table[key]))
    return out


def _window_gpu_price(summary: dict[str, Any]) -> float | None:
    """The $/GPU-hour the window's GPUs were priced at (one value when they share one)."""
    cost = (summary.get("parts") or {}).get("cost") or {}
    prices = {p for _, p in gpu_prices(cost).values()}
    return prices.pop() if len(prices) == 1 else None


def _price_controls(defaults: dict[str, Any], fleet_gpus: int) -> dict[str, Any]:
    """Fleet size (starts at the GPUs observed, as on the Overview) and prices (each starts at the
    service's price table)."""
    st.subheader("Fleet and prices")
    c1, c2, c3, c4 = st.columns(4)
    fleet = c1.number_input(
        "Fleet size, GPUs",
        min_value=1,
        max_value=1_000_000,
        value=fleet_gpus,
        step=8,
        key="cost_fleet",
    )
    gpu_default = defaults.get("gpu")
    gpu = c2.number_input(
        "GPU price, $ per GPU-hour",
        min_value=GPU_USD_RANGE[0],
        max_value=GPU_USD_RANGE[1],
        value=float(gpu_default) if gpu_default is not None else 2.0,
        step=0.1,
        format="%.2f",
        key="cost_gpu_usd",
        help="applied to every GPU of the window (the service's table prices each GPU model)",
    )
    kwh = c3.number_input(
        "Electricity, $ per kWh",
        min_value=KWH_USD_RANGE[0],
        max_value=KWH_USD_RANGE[1],
        value=float(defaults.get("kwh", 0.13)),
        step=0.01,
        format="%.3f",
        key="cost_kwh_usd",
    )
    pue = c4.number_input(
        "PUE (facility / IT energy)",
        min_value=PUE_RANGE[0],
        max_value=PUE_RANGE[1],
        value=float(defaults.get("pue", 1.56)),
        step=0.05,
        format="%.2f",
        key="cost_pue",
    )
    params: dict[str, Any] = {"fleet_gpus": int(fleet)}
    if gpu_default is None or not math.isclose(gpu, gpu_default):
        params["gpu_usd_per_hour"] = gpu
    if not math.isclose(kwh, float(defaults.get("kwh", kwh))):
        params["electricity_usd_per_kwh"] = kwh
    if not math.isclose(pue, float(defaults.get("pue", pue))):
        params["pue"] = pue
    return params


INDUSTRY_CAPTION = (
    "Industry $ per 1M output: GPU $ per hour ÷ output tokens per GPU-hour × 10⁶ — GPU time only, as GPU "
    "clouds and inference benchmarks quote it; from this window's GPU-hours at the GPU price under Prices used."
)
#: the window must hold at least this many clock hours for the per-hour cost chart to say anything
MIN_HOURS_FOR_CHART = 3
#: an energy below this reads "< 0.001 kWh" in the table, never 0.0000
MIN_KWH = 0.001


def _headline(total: dict[str, Any]) -> None:
    """The figures that compare layouts and periods first, then the per-side split."""
    c1, c2, c3, c4 = st.columns(4)
    c1.metric(
        "Cost of the window", figures.usd_text(total.get("cost_usd")), help="GPU time plus energy × PUE"
    )
    c2.metric(
        "Per 1M tokens, all in",
        figures.usd_text(total.get("usd_per_1m_tokens")),
        help="the window's cost ÷ (input + output tokens) × 10⁶: compare layouts and periods by this",
    )
    requests = total.get("requests")
    c3.metric(
        "Per request",
        figures.usd_text(total.get("usd_per_request")),
        help=f"the window's cost ÷ the {requests or 0:,.0f} requests finished in it",
    )
    c4.metric(
        "Industry $ per 1M output",
        figures.usd_text(total.get("industry_usd_per_1m_output")),
        help="GPU $/h ÷ (output tokens/s × 3600) × 10⁶: GPU time only, no energy, no split",
    )
    st.caption(INDUSTRY_CAPTION)
    d1, d2, d3, _ = st.columns(4)
    d1.metric(
        "Blended 3:1, per 1M tokens",
        figures.usd_text(total.get("blended_usd_per_1m_tokens")),
        help="(3 × $/1M input + $/1M output) ÷ 4, the blend Artificial Analysis compares API prices by; "
        "it inherits the input/output split",
    )
    side = "which side a pool's idle time is charged to depends on the layout: compare layouts all in"
    d2.metric("Per 1M input tokens", figures.usd_text(total.get("usd_per_1m_input")), help=side)
    d3.metric("Per 1M output tokens", figures.usd_text(total.get("usd_per_1m_output")), help=side)


def _external(summary: dict[str, Any], trust: PageTrust) -> None:
    """The estimated phase split of the GPUs without phaselens telemetry (dcgm-exporter + engine metrics)."""
    ext = (summary.get("parts") or {}).get("external") or {}
    pools = ext.get("per_pool") or []
    if not pools:
        return
    st.subheader("GPUs without phaselens telemetry: phase split, estimated")
    ext_labels = (ext.get("trust") or {}).get("labels") or []
    trust.add(ext_labels)
    if trust.differs(ext_labels):
        st.caption(f"Figures of this table: {', '.join(figures.ordered_labels(ext_labels))}")
    rows = [
        {
            "Pool": p.get("pool"),
            "GPUs": p.get("gpus"),
            "GPU-hours": (p.get("span_s") or 0.0) / 3600.0,
            **{name: 100.0 * (p.get(f"{s}_share") or 0.0) for s, name in _STATES},
            "Method": p.get("method"),
        }
        for p in pools
    ]
    pct = {name: st.column_config.NumberColumn(name, format="%.1f %%") for _, name in _STATES}
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={"GPU-hours": st.column_config.NumberColumn("GPU-hours", format="%.4f"), **pct},
    )
    st.caption(
        "From dcgm-exporter's busy time and the engines' own counters (vLLM, SGLang, Dynamo): an aggregated "
        "engine's busy time is split by a work model fitted on its prompt and generated tokens; a prefill or "
        "decode pool's is its phase. Tokens and requests are the engines' counters."
    )


_STATES = (("prefill", "Prefill"), ("decode", "Decode"), ("other_busy", "Other busy"), ("idle", "Idle"))


def _category_table(total: dict[str, Any]) -> None:
    cost = float(total.get("cost_usd") or 0.0)
    rows = []
    for c in figures.cost_categories(total):
        usd = total.get(f"cost_usd_{c}")
        if not total.get(f"{c}_s") and not total.get(f"energy_j_{c}") and not usd:
            continue  # a category without a GPU-second in the window: no row of zeros
        rows.append(
            {
                "Category": figures.COST_LABELS[c],
                "GPU time": (total.get(f"{c}_s") or 0.0) / 3600.0,
                "Energy": kwh_text((total.get(f"energy_j_{c}") or 0.0) / 3.6e6),
                "Cost": usd,
                "Share": 100.0 * usd / cost if isinstance(usd, int | float) and cost > 0 else None,
            }
        )
    st.dataframe(
        pd.DataFrame(rows),
        hide_index=True,
        width="stretch",
        column_config={
            "GPU time": st.column_config.NumberColumn("GPU time, GPU-hours", format="%.4f"),
            "Energy": st.column_config.TextColumn("Energy at the GPU, kWh"),
            "Cost": st.column_config.NumberColumn("Cost, US $", format="$%.4f"),
            "Share": st.column_config.NumberColumn("Share of cost", format="%.1f %%"),
        },
    )


def kwh_text(kwh: float) -> str:
    """Energy in kWh for the table: ``0.0421``, ``< 0.001`` (never a row of 0.0000), ``0`` for none."""
    if kwh <= 0:
        return "0"
    return f"< {MIN_KWH:g}" if kwh < MIN_KWH else f"{kwh:,.4f}"


def _cost_over_time(
    cost: dict[str, Any],
    sel: common.Selection,
    labels: list[str],
    trust: PageTrust,
    *,
    key: str = "cost_hour",
) -> None:
    """The cost over time: per period finer than the hour where the service summed one for the window
    (``by_period``), else per clock hour when the window holds enough of them to chart; else why not."""
    periods = cost.get("by_period") or []
    if cost.get("period_s") and len(periods) >= MIN_HOURS_FOR_CHART:
        trust.chart(
            figures.cost_over_time_figure(
                periods, labels=labels, simulated=sel.simulated, period_s=float(cost["period_s"])
            ),
            labels,
            width="stretch",
            key=key,
            config={"displaylogo": False},
        )
        return
    by_hour = cost.get("by_hour") or []
    hours = len({r.get("hour_start_s") for r in by_hour})
    if hours < MIN_HOURS_FOR_CHART:
        start_s, end_s = sel.window()
        d = end_s - start_s
        span = f"{d:,.0f}-second " if d < 120 else f"{d / 60:,.0f}-minute "
        st.info(
            f"Cost over time: the cost is priced per clock hour, and this {span}window lies in {hours} clock "
            f"hour{'s' if hours != 1 else ''} — too few bars to show a trend (it takes {MIN_HOURS_FOR_CHART}). "
            "The pool chart and the table below split the window's cost.",
            icon=":material/schedule:",
        )
        return
    trust.chart(
        figures.cost_over_time_figure(by_hour, labels=labels, simulated=sel.simulated),
        labels,
        width="stretch",
        key=key,
        config={"displaylogo": False},
    )


def _sources(cost: dict[str, Any]) -> None:
    """Where each price in use comes from (a default's citation, a file, this page's inputs)."""
    prices = cost.get("prices") or {}
    sources = prices.get("sources") or {}
    lines = [
        f"- **{key.removeprefix('NVIDIA ')}**: ${price:g} per GPU-hour — {sources.get(key, 'no source given')}"
        for key, price in sorted(set(gpu_prices(cost).values()))
    ]
    if isinstance(prices.get("electricity_usd_per_kwh"), int | float):
        lines.append(
            f"- **Electricity**: ${prices['electricity_usd_per_kwh']:g} per kWh — "
            f"{sources.get('electricity_usd_per_kwh', 'no source given')}"
        )
    if isinstance(prices.get("pue"), int | float):
        lines.append(f"- **PUE**: {prices['pue']:g} — {sources.get('pue', 'no source given')}")
    if lines:
        st.markdown("**Prices used**\n\n" + "\n".join(lines))


def render(sel: common.Selection, params: dict[str, Any], trust_slot: Any = None) -> None:
    """The page body for the chosen fleet size and prices."""
    trust = PageTrust(trust_slot)
    try:
        compare.body_or_compared(
            sel.compare,
            sel.compare_note,
            lambda: _body(sel, params, trust),
            lambda other: _compared(sel, other, params, trust),
        )
    finally:
        trust.render()


#: the figures compared, in the headline's order: (key of the cost total, label); lower is better
COMPARED = (
    ("cost_usd", "Cost of the window"),
    ("usd_per_1m_tokens", "Per 1M tokens, all in"),
    ("usd_per_request", "Per request"),
    ("industry_usd_per_1m_output", "Industry $ per 1M output"),
    ("blended_usd_per_1m_tokens", "Blended 3:1, per 1M tokens"),
    ("usd_per_1m_input", "Per 1M input tokens"),
    ("usd_per_1m_output", "Per 1M output tokens"),
)


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[compare.Row]:
    """The cost figures of windows A and B (two ``cost.total`` rows) as comparison rows."""

    def num(total: dict[str, Any], key: str) -> float | None:
        v = total.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else None

    return [
        compare.Row(
            key=key,
            label=label,
            a=num(a, key),
            b=num(b, key),
            a_text=figures.usd_text(a.get(key)),
            b_text=figures.usd_text(b.get(key)),
            higher_is_better=False,
        )
        for key, label in COMPARED
    ]


def _compared(
    sel: common.Selection, other: common.Selection, params: dict[str, Any], trust: PageTrust
) -> None:
    """Windows A and B side by side at the same prices: the cost figures with the change, then each
    window's cost by pool and over time."""
    with common.service_errors():
        a = common.analytics(sel, **params)
        b = common.analytics(other, **params)
    costs = [(s.get("parts") or {}).get("cost") or {} for s in (a, b)]
    for cost in costs:
        trust.add(figures.part_labels(cost), primary=True)
    st.caption(f"A: {common.describe_window(sel)} · B: {common.describe_window(other)} · the same prices")
    st.markdown(
        compare.table_html(compare_rows(costs[0].get("total") or {}, costs[1].get("total") or {}), "A", "B"),
        unsafe_allow_html=True,
    )
    left, right = compare.headers(common.describe_window(sel), common.describe_window(other))
    for col, s, cost, side in ((left, sel, costs[0], "a"), (right, other, costs[1], "b")):
        with col:
            if not cost.get("by_pool"):
                common.empty_window("GPU time to price", s)
                continue
            labels = figures.part_labels(cost)
            trust.chart(
                figures.cost_by_pool_figure(cost["by_pool"], labels=labels),
                labels,
                width="stretch",
                key=f"cost_pool_{side}",
                config={"displaylogo": False},
            )
            _cost_over_time(cost, s, labels, trust, key=f"cost_time_{side}")


def _body(sel: common.Selection, params: dict[str, Any], trust: PageTrust) -> None:
    with common.service_errors():
        summary = common.analytics(sel, **params)
    parts = summary.get("parts") or {}
    cost = parts.get("cost")
    if not cost or not cost.get("by_pool"):
        why = (summary.get("missing") or {}).get("cost")
        common.empty_window("GPU time to price", sel)
        if why:
            st.caption(f"Cost not computed: {why}")
        return
    labels = figures.part_labels(cost)
    trust.add(labels, primary=True)
    pools = common.pool_filter(sel)
    by_pool = [r for r in cost["by_pool"] if pools is None or (r.get("pool") or "unknown") in pools]
    total = cost.get("total") or {}
    _headline(total)
    left, right = st.columns(2)
    with left:
        trust.chart(
            figures.cost_by_pool_figure(by_pool, labels=labels),
            labels,
            width="stretch",
            key="cost_pool",
            config={"displaylogo": False},
        )
    with right:
        _cost_over_time(cost, sel, labels, trust)
    if pools is not None:
        st.caption(
            "The pool chart shows the selected pools; totals, hours and the projection cover every GPU."
        )
    _category_table(total)
    _external(summary, trust)
    annual = parts.get("annual")
    if annual:
        st.subheader("Annualised")
        sentence = str(annual.get("sentence") or "")
        st.markdown(
            f"**{sentence[:1].upper() + sentence[1:] if sentence.startswith('this') else sentence}.**"
        )
        trust.chart(
            figures.annual_figure(annual, labels=labels),
            labels,
            width="stretch",
            key="annual",
            config={"displaylogo": False},
        )
        st.caption(
            f"The window's cost per GPU-second ({annual.get('observed_gpu_hours', 0):.3f} GPU-hours observed) × "
            f"{annual.get('fleet_gpus')} GPUs × 8,760 h. Input side "
            f"{figures.usd_text(annual.get('input_usd_per_year'))} a year, output side {figures.usd_text(annual.get('output_usd_per_year'))}."
        )
    elif "annual" in (summary.get("missing") or {}):
        st.warning(f"No annual projection: {summary['missing']['annual']}")
    notes = (cost.get("trust") or {}).get("notes") or []
    if notes:
        with st.expander("How these figures were made"):
            st.markdown("\n".join(f"- {n}" for n in notes))
    _sources(cost)


with common.service_errors():
    sel = common.sidebar()
st.title("Cost")
st.caption(f"{common.describe_window(sel)} · where the GPU-hours' money goes, and what it comes to in a year")
trust_slot = st.empty()  # the page's trust badges, under its title (filled by the fragment)
with common.service_errors():  # the same read as the page's at default prices: answered once
    observed_gpus = max(1, len({g.key for g in sel.all_gpus}))
    base = common.analytics(sel, fleet_gpus=int(st.session_state.get("cost_fleet", observed_gpus)))
base_cost = (base.get("parts") or {}).get("cost") or {}
base_prices = base_cost.get("prices") or {}
chosen = _price_controls(
    {
        "gpu": _window_gpu_price(base),
        "kwh": base_prices.get("electricity_usd_per_kwh", 0.13),
        "pue": base_prices.get("pue", 1.56),
    },
    observed_gpus,
)


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel, chosen, trust_slot)


_live()
