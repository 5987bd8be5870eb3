"""The cost section: the window's cost and per-token figures, cost by pool and per hour, the
categories' table, the annual projection, the GPUs without telemetry and the prices used."""

from __future__ import annotations

from typing import Any

from dashboard.report_html.charts import Page
from dashboard.report_html.text import (
    POOL_ORDER,
    amount_text,
    badge,
    esc,
    gpu_hours_text,
    no_data_section,
    number_or_none,
    share_text,
)


def cost_section(page: Page, summary: dict[str, Any], ov: dict[str, Any] | None, simulated: bool) -> str:
    """Where the money goes: the totals in words, the charts, the categories' table, the annual projection, the GPUs without telemetry and the prices."""
    from dashboard.figures import (
        COST_CATEGORIES,
        COST_LABELS,
        annual_figure,
        cost_by_pool_figure,
        cost_categories,
        cost_over_time_figure,
        part_labels,
        usd_text,
    )

    parts = summary.get("parts") or {}
    cost = parts.get("cost") or {}
    heading = "Where the money goes"
    if not cost.get("by_pool"):
        return no_data_section(heading, summary, "cost", "no GPU time to price in this window")
    out = [f"<section><h2>{heading}</h2>"]
    labels = part_labels(cost)
    t = cost.get("total") or {}
    requests = number_or_none(t.get("requests"))
    out.append(
        f"<p>The window cost <b>{usd_text(t.get('cost_usd'))}</b> for {gpu_hours_text(t.get('gpu_seconds'))} "
        f"(GPU time at list price plus energy × electricity × PUE; {', '.join(labels) or 'no data'}): "
        f"<b>{usd_text(t.get('usd_per_1m_tokens'))}</b> per 1M tokens all in (input + output) and "
        f"<b>{usd_text(t.get('usd_per_request'))}</b> per request ({amount_text(requests or 0.0)} finished) — "
        "the figures to compare layouts and periods by. The industry figure (GPU $/h ÷ output tokens/s, GPU "
        f"time only): {usd_text(t.get('industry_usd_per_1m_output'))} per 1M output tokens; blended 3:1 "
        f"(input:output, as Artificial Analysis compares API prices): {usd_text(t.get('blended_usd_per_1m_tokens'))} "
        f"per 1M tokens. By side: {usd_text(t.get('usd_per_1m_input'))} per 1M input tokens and "
        f"{usd_text(t.get('usd_per_1m_output'))} per 1M output tokens (which side a pool's idle time is "
        "charged to depends on the layout).</p>"
    )
    by_pool = sorted(cost["by_pool"], key=lambda r: POOL_ORDER.get(str(r.get("pool")), 9))
    out.append(page.chart(cost_by_pool_figure(by_pool, labels=labels)))
    if cost.get("period_s") and len(cost.get("by_period") or []) >= 2:  # finer than the hour
        fig = cost_over_time_figure(
            cost["by_period"], labels=labels, simulated=simulated, period_s=float(cost["period_s"])
        )
        out.append(page.chart(fig))
    elif cost.get("by_hour"):
        fig = cost_over_time_figure(cost["by_hour"], labels=labels, simulated=simulated)
        out.append(page.chart(fig))
    total_usd = number_or_none(t.get("cost_usd")) or 0.0
    # one unit per column, the one the window's total reads best in
    hours = (number_or_none(t.get("gpu_seconds")) or 0.0) >= 3600
    energy_j = sum(number_or_none(t.get(f"energy_j_{c}")) or 0.0 for c in COST_CATEGORIES)
    kwh = energy_j >= 3.6e6
    rows = []
    for c in cost_categories(t):
        usd = number_or_none(t.get(f"cost_usd_{c}"))
        share = f"{100 * usd / total_usd:.1f} %" if usd is not None and total_usd > 0 else "—"
        seconds = number_or_none(t.get(f"{c}_s")) or 0.0
        joules = number_or_none(t.get(f"energy_j_{c}")) or 0.0
        rows.append(
            f"<tr><td>{esc(COST_LABELS[c])}</td>"
            f'<td class="num">{amount_text(seconds / 3600 if hours else seconds)}</td>'
            f'<td class="num">{amount_text(joules / (3.6e6 if kwh else 3600))}</td>'
            f'<td class="num">{esc(usd_text(usd))}</td><td class="num">{share}</td></tr>'
        )
    out.append(
        f"<table><tr><th>category</th><th>GPU time, {'GPU-hours' if hours else 'GPU-seconds'}</th>"
        f"<th>energy at the GPU, {'kWh' if kwh else 'Wh'}</th>"
        f"<th>cost, US $</th><th>share of cost</th></tr>{''.join(rows)}</table>"
    )
    annual = _annual(parts, ov)
    if annual is not None:
        fleet = int(annual["fleet_gpus"])
        scale = "the fleet size asked for" if parts.get("annual") else "the fleet size observed"
        out.append(
            f"<h3>Annualised</h3><p>At this window's cost profile, {fleet:,} GPUs ({scale}) running for a "
            f"year cost <b>{usd_text(annual['total_usd_per_year'])}</b> (the window's cost per GPU-second "
            "× GPUs × 8,760 h).</p>"
        )
        out.append(page.chart(annual_figure(annual, labels=labels)))
    out.append(_external(parts.get("external") or {}))
    out.append(_prices(cost))
    out.append("</section>")
    return "".join(out)


def _external(ext: dict[str, Any]) -> str:
    """The estimated phase split of the GPUs without phaselens telemetry (nothing where none)."""
    pools = ext.get("per_pool") or []
    if not pools:
        return ""
    labels = (ext.get("trust") or {}).get("labels") or []
    states = (("prefill", "prefill"), ("decode", "decode"), ("other_busy", "other busy"), ("idle", "idle"))
    rows = "".join(
        f'<tr><td>{esc(str(p.get("pool") or "—"))}</td><td class="num">{int(p.get("gpus") or 0)}</td>'
        f'<td class="num">{amount_text((number_or_none(p.get("span_s")) or 0.0) / 3600)}</td>'
        + "".join(f'<td class="num">{share_text(p.get(f"{s}_share"))}</td>' for s, _ in states)
        + f"<td>{esc(str(p.get('method') or '—'))}</td></tr>"
        for p in pools
    )
    head = "".join(f"<th>{name}</th>" for _, name in states)
    return (
        f"<h3>GPUs without phaselens telemetry: phase split, estimated {''.join(badge(x) for x in labels)}</h3>"
        "<p>From dcgm-exporter's busy time and energy and the engines' own counters (vLLM, SGLang, Dynamo): "
        "an aggregated engine's busy time is split by a work model fitted on its tokens, a pool's is its "
        "phase; tokens and requests are the engines' counters.</p>"
        f"<table><tr><th>pool</th><th>GPUs</th><th>GPU-hours</th>{head}<th>method</th></tr>{rows}</table>"
    )


def _annual(parts: dict[str, Any], ov: dict[str, Any] | None) -> dict[str, Any] | None:
    """The annual projection to draw: the summary's own (``fleet_gpus`` asked), else the overview's
    at the fleet size observed; None when neither has one."""
    annual = parts.get("annual") or {}
    if isinstance(annual.get("usd_per_year"), dict) and annual.get("fleet_gpus"):
        return annual
    money = (ov or {}).get("money") or {}
    per = money.get("usd_per_year")
    if not isinstance(per, dict) or not money.get("fleet_gpus"):
        return None
    values = [v for v in per.values() if isinstance(v, int | float)]
    if not values:
        return None
    return {"fleet_gpus": money["fleet_gpus"], "usd_per_year": per, "total_usd_per_year": sum(values)}


def _prices(cost: dict[str, Any]) -> str:
    """Where each price in use comes from (the GPU models of the window, electricity, PUE)."""
    prices = cost.get("prices") or {}
    sources = prices.get("sources") or {}
    table = prices.get("gpu_usd_per_hour") or {}
    used = {str(r.get("gpu_name")) for r in cost.get("by_gpu") or [] if r.get("gpu_name")}
    lines = []
    for name in sorted(used):
        keys = [name] + [name.removesuffix(s) for s in (" (emulated)", " (simulated)") if name.endswith(s)]
        key = next((k for k in keys if k in table), None)
        if key is not None:
            lines.append(
                f"<li><b>{esc(key)}</b>: ${float(table[key]):g} per GPU-hour — "
                f"{esc(str(sources.get(key, 'no source given')))}</li>"
            )
    for key, what, unit in (("electricity_usd_per_kwh", "Electricity", " per kWh"), ("pue", "PUE", "")):
        v = number_or_none(prices.get(key))
        if v is not None:
            money = f"${v:g}" if key != "pue" else f"{v:g}"
            lines.append(
                f"<li><b>{what}</b>: {money}{unit} — {esc(str(sources.get(key, 'no source given')))}</li>"
            )
    return f'<p class="meta">Prices used:</p><ul class="meta">{"".join(lines)}</ul>' if lines else ""
