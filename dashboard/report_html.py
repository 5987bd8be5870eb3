"""The efficiency report's page: one self-contained HTML file a platform team reads in the morning.

:func:`render_html` turns a report's summary JSON (``Summary.to_dict()`` plus the keys the report
adds: ``overview``, the headline figures against the previous period from
``analytics.overview.overview``, and ``histogram``, ``analytics.histogram``'s binned activity) into:

1. a title with the window, the data set and the trust labels (each label explained);
2. the headline figures against the previous period, and the sentence on where the money goes;
3. sections with the dashboard's own charts (``dashboard/figures.py``, the same builders): where
   the GPU-time goes by pool, bimodality per pool (histogram, modes, dip test in words),
   cost by pool and per hour with the annualised projection, latency percentiles and SLO
   attainment over time;
4. what is missing and why, then an appendix of the detailed tables, folded.

A window without data gets a short page saying so, with no chart. Every chart carries its trust
labels (``label_figure``). The page references nothing outside itself: Plotly's script stands as
:data:`PLOTLY_MARKER`, which :func:`standalone_html` replaces with the script inlined, once.
"""

from __future__ import annotations

import html
import json
import math
import time
from datetime import UTC, datetime
from typing import Any

PLOTLY_MARKER = "<!--phaselens:plotly.js-->"
_POOL_ORDER = {"prefill": 0, "decode": 1, "mixed": 2}
_UNITS = {
    "_pct": "%",
    "_s": "s",
    "_ms": "ms",
    "_w": "W",
    "_j": "J",
    "_kwh": "kWh",
    "_usd": "$",
    "_mhz": "MHz",
    "_bytes": "bytes",
}
_SHARE_PREFIXES = ("frac_", "share_")
_ID_COLUMNS = ("pool", "role", "scope", "worker", "gpu", "model", "metric", "name")
_TIME_COLUMNS = ("hour_s", "hour_start_s", "bucket_start_s", "start_s")
_WIDE_COLUMNS = 10  # a table wider than this, with at most _SIDEWAYS_ROWS rows, is shown on its side
_SIDEWAYS_ROWS = 12
_MAX_TABLE_ROWS = 200
_APPENDIX_PARTS = ("phases", "idle", "bimodal", "cost", "annual", "latency")
_SLO_TARGET = 0.9  # DistServe's goodput target, as on the Latency page

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:1.5rem auto;max-width:1100px;
color:#222;padding:0 1rem;line-height:1.45}
h1{font-size:1.55rem;margin-bottom:.3rem}
h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;font-size:1.3rem}
h3{margin:1.2rem 0 .3rem;font-size:1.05rem}.meta{color:#666;margin:.2rem 0}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.9rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:.6rem;padding:0 .55rem;margin-right:.3rem;font-size:.8rem;
font-weight:600;color:#fff;white-space:nowrap}
.measured{background:#2e7d32}.emulated{background:#e65100}.simulated{background:#6a1b9a}
.host-bound{background:#c62828}.estimated{background:#1565c0}
ul.labels{margin:.3rem 0;padding-left:0;list-style:none;color:#555;font-size:.9rem}
ul.labels li{margin:.15rem 0}
.lead{font-size:1.2rem;font-weight:600;margin:.8rem 0 .4rem}
.tiles{display:grid;grid-template-columns:repeat(4,1fr);gap:.6rem;margin:.6rem 0}
.tile{border:1px solid #ddd;border-radius:.4rem;padding:.5rem .7rem}
.tile .label{font-size:.85rem;color:#555}.tile .value{font-size:1.45rem;font-weight:600;margin:.1rem 0}
.tile .delta{font-size:.85rem}.tile .prev,.tile .why{font-size:.8rem;color:#777}
.better{color:#2e7d32}.worse{color:#c62828}.same{color:#666}.tile.nodata .value{color:#999}
.facts{margin:.2rem 0 1.2rem;padding-left:1.2rem;font-size:.92rem}.facts li{margin:.25rem 0}
.pool{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,1fr);gap:1rem;align-items:center}
.empty{background:#f4f6f8;border:1px solid #dde3ea;padding:.7rem 1rem;border-radius:.3rem}
.error{background:#fdecea;border:1px solid #f5c2c0;padding:.6rem 1rem;border-radius:.3rem}
details{margin:.4rem 0}details>summary{cursor:pointer;font-weight:600}
pre{background:#f7f7f7;padding:1rem;overflow:auto;font-size:.8rem}.wide{overflow-x:auto}
@media (max-width:800px){.tiles{grid-template-columns:repeat(2,1fr)}.pool{display:block}}
"""


# the folded JSON is filled in from the embedded copy when opened (the page holds it once)
_SHOW_JSON = (
    'document.getElementById("report-json").addEventListener("toggle",function(e){'
    'var p=e.target.querySelector("pre");if(!p.textContent){p.textContent=JSON.stringify('
    'JSON.parse(document.getElementById("phaselens-summary").textContent),null,1);}});'
)


def utc_text(ts_s: float | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """An epoch time as UTC text (``?`` when unknown)."""
    return "?" if ts_s is None else datetime.fromtimestamp(ts_s, UTC).strftime(fmt)


def standalone_html(body: str) -> str:
    """The stored page with Plotly's JavaScript inlined where the marker is: one file, offline."""
    if PLOTLY_MARKER not in body:
        return body
    from plotly.offline import get_plotlyjs

    script = get_plotlyjs().replace("</script", "<\\/script")
    return body.replace(PLOTLY_MARKER, f"<script>{script}</script>", 1)


def render_html(
    summary: dict[str, Any] | None,
    *,
    title: str,
    error: str | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
) -> str:
    """The report page of ``summary`` (the module's docstring says what it holds). Without an
    ``overview`` key the headline figures are computed from ``summary`` alone (no trend); without
    ``histogram`` the bimodality section has the dip test but no histogram."""
    from analytics.overview import overview as make_overview

    summary = summary or {}
    page = _Page()
    window = summary.get("window") or {}
    start_s = start_s if start_s is not None else _num(window.get("start_s"))
    end_s = end_s if end_s is not None else _num(window.get("end_s"))
    ov = summary.get("overview") or (make_overview(summary, None) if summary else None)
    out = [_header(summary, title, start_s, end_s)]
    if error:
        out.append(f'<p class="error"><b>No summary:</b> {_esc(error)}</p>')
    if summary and not error and _is_empty(summary, ov):
        out.append(
            '<p class="empty"><b>No data in this window.</b> No GPU time, GPU samples or finished '
            "requests were recorded between its start and end; the list below says what each analysis "
            "found missing. Check that the collector's sources were up (the dashboard's Health page) "
            "or make a report of a longer window.</p>"
        )
        out.append(_missing(summary, heading="Why"))
    elif summary:
        simulated = str(window.get("dataset") or "live") != "live"
        out += [
            _headline(ov),
            _gpu_time(page, ov),
            _bimodal(page, summary),
            _cost(page, summary, ov, simulated),
            _latency(page, summary, simulated),
            _missing(summary),
            _appendix(summary),
        ]
    data = json.dumps(summary, sort_keys=True, default=str, separators=(",", ":"))
    embedded = data.replace("</", "<\\/")  # JSON in a script element: no closing tag inside
    out.append(
        '<details id="report-json"><summary>The report\'s JSON</summary><pre></pre></details>'
        f'<script type="application/json" id="phaselens-summary">{embedded}</script>'
        f"<script>{_SHOW_JSON}</script>"
    )
    script = PLOTLY_MARKER if page.charts else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_esc(title)}</title>'
        f"<style>{_CSS}</style>{script}</head><body>{''.join(out)}</body></html>"
    )


class _Page:
    """The charts of one page: each figure becomes a div (its data inline, no script tag of its own)."""

    def __init__(self) -> None:
        self.charts = 0

    def chart(self, fig: Any) -> str:
        import plotly.io as pio

        div = pio.to_html(
            fig,
            include_plotlyjs=False,
            full_html=False,
            div_id=f"chart-{self.charts}",
            # no tool bar: it floats over the chart's top right, where its trust labels are
            config={"displaylogo": False, "responsive": True, "displayModeBar": False},
        )
        self.charts += 1
        return div


# -- the parts of the page ------------------------------------------------------------------------------


def _is_empty(summary: dict[str, Any], ov: dict[str, Any] | None) -> bool:
    hist = summary.get("histogram") or {}
    lat = (summary.get("parts") or {}).get("latency") or {}
    has_samples = any(g.get("samples") for g in hist.get("groups") or [])
    has_phases = bool(((summary.get("parts") or {}).get("phases") or {}).get("per_gpu"))
    return (
        bool((ov or {}).get("empty", True)) and not has_samples and not lat.get("requests") and not has_phases
    )


def _header(summary: dict[str, Any], title: str, start_s: float | None, end_s: float | None) -> str:
    from analytics.trust import MEANINGS
    from dashboard.figures import ordered_labels

    window = summary.get("window") or {}
    dataset = str(window.get("dataset") or "live")
    what = "live data" if dataset == "live" else f"simulated scenario {dataset} (virtual time)"
    duration = _duration(_num(window.get("duration_s")) or _span_s(start_s, end_s))
    trust = summary.get("trust") or {}
    labels = ordered_labels(trust.get("labels") or [])
    meanings = "".join(
        f"<li>{_badge(lb)} {_esc(MEANINGS.get(lb, ''))}</li>" for lb in labels if lb in MEANINGS
    )
    out = [
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta"><b>Window</b> {_esc(_range_text(start_s, end_s))} UTC'
        f"{_esc(f' ({duration})' if duration else '')}"
        f" · <b>data set</b> {_esc(what)} · generated {_esc(utc_text(time.time(), '%Y-%m-%d %H:%M'))} UTC"
        " by phaselens</p>",
    ]
    if labels:
        out.append(f'<ul class="labels">{meanings}</ul>')
    elif summary:
        out.append('<p class="meta">No trust labels: no analysis had data.</p>')
    return "".join(out)


def _headline(ov: dict[str, Any] | None) -> str:
    from analytics.overview import FIGURES
    from dashboard.figures import figure_text

    ov = ov or {}
    figures = ov.get("figures") or {}
    money = ov.get("money") or {}
    out = ["<section><h2>At a glance</h2>"]
    if money.get("sentence"):
        out.append(f'<p class="lead">{_esc(money["sentence"])}</p>')
    elif money.get("no_data"):
        out.append(f'<p class="meta">Where the money goes: {_esc(money["no_data"])}</p>')
    prev = ov.get("previous_window") or {}
    any_previous = any(f.get("previous") is not None for f in figures.values())
    if prev.get("start_s") is not None and any_previous:
        out.append(
            f'<p class="meta">Against the previous period of the same length: '
            f"{_esc(_range_text(prev['start_s'], prev.get('end_s')))} UTC.</p>"
        )
    elif prev.get("start_s") is not None:  # the period before had nothing to compare with
        out.append(
            f'<p class="meta">No trend: the previous period of the same length, '
            f"{_esc(_range_text(prev['start_s'], prev.get('end_s')))} UTC, has no data to compare.</p>"
        )
    else:
        why = next((f.get("previous_no_data") for f in figures.values() if f.get("previous_no_data")), None)
        why = str(why or "no previous period").removeprefix("no data: ")
        out.append(f'<p class="meta">No trend against a previous period: {_esc(why)}.</p>')
    tiles = []
    for spec in FIGURES:
        fig = figures.get(spec.key)
        if fig is None:
            continue
        value = fig.get("value")
        cls = "tile" if value is not None else "tile nodata"
        lines = [
            f'<div class="label">{_esc(fig["label"])}</div>',
            f'<div class="value">{_esc(figure_text(spec.key, value))}</div>',
        ]
        if value is None:
            lines.append(f'<div class="why">{_esc(str(fig.get("no_data") or "no data"))}</div>')
        else:
            lines.append(_delta_line(spec.key, fig) if any_previous else "")
            if fig.get("basis"):  # what it is over: the window's seconds, every request
                lines.append(f'<div class="prev">{_esc(str(fig["basis"]))}</div>')
            if fig.get("busy_value") is not None:  # output tokens/s while serving, by its own name
                busy = figure_text(spec.key, fig["busy_value"])
                lines.append(
                    f'<div class="prev" data-busy>{_esc(str(fig.get("busy_label")))}: {_esc(busy)}</div>'
                )
            if spec.key == "j_per_output_token" and fig.get("j_per_input_token") is not None:
                lines.append(
                    f'<div class="prev">per input token: {_esc(figure_text(spec.key, fig["j_per_input_token"]))}</div>'
                )
            lines.append(f"<div>{''.join(_badge(lb) for lb in fig.get('trust') or [])}</div>")
        tiles.append(f'<div class="{cls}" data-figure="{_esc(spec.key)}">{"".join(lines)}</div>')
    out.append(f'<div class="tiles">{"".join(tiles)}</div></section>')
    return "".join(out)


def _delta_line(key: str, fig: dict[str, Any]) -> str:
    from dashboard.figures import delta_text, figure_text

    text = delta_text(fig)
    if text is None:
        return '<div class="prev">no previous period to compare</div>'
    delta = float(fig["delta"])
    good = (delta > 0) == bool(fig.get("higher_is_better"))
    cls = "same" if delta == 0 else "better" if good else "worse"
    arrow = "▲" if delta > 0 else "▼" if delta < 0 else "="
    return (
        f'<div class="delta {cls}">{arrow} {_esc(text)}</div>'
        f'<div class="prev">previous: {_esc(figure_text(key, fig.get("previous")))}</div>'
    )


def _pools(keys: Any) -> list[str]:
    return sorted((str(k) for k in keys), key=lambda p: (_POOL_ORDER.get(p, 9), p))


def _gpu_time(page: _Page, ov: dict[str, Any] | None) -> str:
    from dashboard.figures import gpu_time_figure

    gt = (ov or {}).get("gpu_time") or {}
    out = ["<section><h2>Where the GPU-time goes</h2>"]
    if gt.get("shares") is None:
        out.append(f'<p class="empty">{_esc(str(gt.get("no_data") or "no data"))}</p></section>')
        return "".join(out)
    pools = _pools((gt.get("per_pool") or {}).keys())
    fig = gpu_time_figure(gt, pools, gt.get("trust") or [], with_fleet=True)
    out.append(page.chart(fig))
    out.append(
        f'<p class="meta">{_gpu_hours(gt.get("gpu_seconds"))} of GPU-time. Stranded: busy, but with the '
        "compute (decode) or the memory bandwidth (prefill) idle. Host-bound: the GPU waits on the host "
        "between iterations. Idle: no work.</p></section>"
    )
    return "".join(out)


def _bimodal(page: _Page, summary: dict[str, Any]) -> str:
    from dashboard.figures import activity_histogram_figure, bimodal_pool_rows, part_labels

    parts = summary.get("parts") or {}
    bimodal = parts.get("bimodal") or {}
    rows = bimodal_pool_rows(bimodal)
    hist = summary.get("histogram") or {}
    groups = [g for g in hist.get("groups") or [] if g.get("samples")]
    out = [
        "<section><h2>Bimodality per pool</h2>",
        '<p class="meta">A GPU that does both phases spends its time in two states: memory-bound decode '
        "(low SM activity) and compute-bound prefill (high). Bars: the share of the window's samples per bin "
        "(SM activity dark, utilization % red); dashed lines: the modes, peaks of the smoothed SM-activity "
        "histogram, with the share of samples on each side of the valley between them. Verdict: "
        f"{_esc(str(bimodal.get('rule') or 'no rule: no bimodality part in the summary'))}.</p>",
    ]
    why = (summary.get("missing") or {}).get("bimodal")
    if why:
        out.append(f'<p class="error">The dip test could not run: {_esc(str(why))}</p>')
    if not groups:
        out.append('<p class="empty">No GPU samples in this window: no histogram.</p>')
        out += [_facts(None, rows[p], p) for p in _pools(k for k in rows if k != "fleet")]
        out.append("</section>")
        return "".join(out)
    labels = set(part_labels(hist)) | set(part_labels(bimodal))
    pool_groups = [g for g in groups if g["pool"] != "fleet"]
    fleet = next((g for g in groups if g["pool"] == "fleet"), None)
    if fleet is not None and len(pool_groups) != 1:
        pool_groups.insert(0, fleet)
    for g in pool_groups:
        name = "All GPUs" if g["pool"] == "fleet" else f"{str(g['pool']).capitalize()} pool"
        row = rows.get(g["pool"])
        fig = activity_histogram_figure(g, hist.get("edges_pct") or [], row, title=name, labels=labels)
        out.append(f'<div class="pool"><div>{page.chart(fig)}</div>{_facts(g, row, g["pool"])}</div>')
    out.append("</section>")
    return "".join(out)


def _facts(group: dict[str, Any] | None, row: dict[str, Any] | None, pool: str) -> str:
    """A pool's bimodality in words: the verdict, Sarle's b as evidence, the modes, utilization
    against SM activity."""
    from dashboard.figures import modes_in_words, sarle_text, verdict_text

    row = row or {}
    items = [f"<b>Bimodal?</b> {_esc(verdict_text(row))}"]
    sarle = _num(row.get("sarle"))
    if sarle is not None:
        items.append(f"<b>Sarle's b</b> (supporting evidence, not the verdict): {_esc(sarle_text(sarle))}")
    modes = modes_in_words(row)
    if modes:
        items.append(f"<b>{modes[0]}:</b> {_esc(modes[1])}")
    util = _num(((group or {}).get("gpu_util") or {}).get("mean_pct"))
    sm = _num(((group or {}).get("sm_active") or {}).get("mean_pct"))
    if util is None:
        util = _num(row.get("util_pct"))
    if sm is None:
        sm = _num(row.get("mean_sm_pct"))
    if util is not None and sm is not None:
        items.append(
            f"<b>Busy but compute-idle:</b> mean utilization {util:.0f} % against mean SM activity {sm:.0f} % "
            f"({_plural(round(util - sm), 'point')})"
        )
    sp, sd = _num(row.get("sm_prefill_pct")), _num(row.get("sm_decode_pct"))
    if sp is not None and sd is not None:
        items.append(f"<b>SM activity in prefill / decode:</b> {_pct_text(sp)} / {_pct_text(sd)}")
    elif sp is not None or sd is not None:  # a pool of one phase
        phase, value = ("prefill", sp) if sp is not None else ("decode", sd)
        items.append(f"<b>SM activity in {phase}:</b> {_pct_text(value)}")
    if group:
        items.append(
            f"{_plural(int(group.get('gpus') or 0), 'GPU')}, {_plural(int(group.get('samples') or 0), 'sample')}"
        )
    head = "" if group else f"<h3>{_esc(pool.capitalize())} pool</h3>"
    return head + '<ul class="facts">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _cost(page: _Page, summary: dict[str, Any], ov: dict[str, Any] | None, simulated: bool) -> str:
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
    out = ["<section><h2>Where the money goes</h2>"]
    if not cost.get("by_pool"):
        why = (summary.get("missing") or {}).get("cost") or "no GPU time to price in this window"
        out.append(f'<p class="empty">No cost: {_esc(str(why))}</p></section>')
        return "".join(out)
    labels = part_labels(cost)
    t = cost.get("total") or {}
    requests = _num(t.get("requests"))
    out.append(
        f"<p>The window cost <b>{usd_text(t.get('cost_usd'))}</b> for {_gpu_hours(t.get('gpu_seconds'))} "
        f"(GPU time at list price plus energy × electricity × PUE; {', '.join(labels) or 'no data'}): "
        f"<b>{usd_text(t.get('usd_per_1m_tokens'))}</b> per 1M tokens all in (input + output) and "
        f"<b>{usd_text(t.get('usd_per_request'))}</b> per request ({_amount(requests or 0.0)} finished) — "
        "the figures to compare layouts and periods by. The industry figure (GPU $/h ÷ output tokens/s, GPU "
        f"time only): {usd_text(t.get('industry_usd_per_1m_output'))} per 1M output tokens; blended 3:1 "
        f"(input:output, as Artificial Analysis compares API prices): {usd_text(t.get('blended_usd_per_1m_tokens'))} "
        f"per 1M tokens. By side: {usd_text(t.get('usd_per_1m_input'))} per 1M input tokens and "
        f"{usd_text(t.get('usd_per_1m_output'))} per 1M output tokens (which side a pool's idle time is "
        "charged to depends on the layout).</p>"
    )
    by_pool = sorted(cost["by_pool"], key=lambda r: _POOL_ORDER.get(str(r.get("pool")), 9))
    out.append(page.chart(cost_by_pool_figure(by_pool, labels=labels)))
    if cost.get("by_hour"):
        fig = cost_over_time_figure(cost["by_hour"], labels=labels, simulated=simulated)
        out.append(page.chart(fig))
    total_usd = _num(t.get("cost_usd")) or 0.0
    # one unit per column, the one the window's total reads best in
    hours = (_num(t.get("gpu_seconds")) or 0.0) >= 3600
    energy_j = sum(_num(t.get(f"energy_j_{c}")) or 0.0 for c in COST_CATEGORIES)
    kwh = energy_j >= 3.6e6
    rows = []
    for c in cost_categories(t):
        usd = _num(t.get(f"cost_usd_{c}"))
        share = f"{100 * usd / total_usd:.1f} %" if usd is not None and total_usd > 0 else "—"
        seconds = _num(t.get(f"{c}_s")) or 0.0
        joules = _num(t.get(f"energy_j_{c}")) or 0.0
        rows.append(
            f"<tr><td>{_esc(COST_LABELS[c])}</td>"
            f'<td class="num">{_amount(seconds / 3600 if hours else seconds)}</td>'
            f'<td class="num">{_amount(joules / (3.6e6 if kwh else 3600))}</td>'
            f'<td class="num">{_esc(usd_text(usd))}</td><td class="num">{share}</td></tr>'
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
        f'<tr><td>{_esc(str(p.get("pool") or "—"))}</td><td class="num">{int(p.get("gpus") or 0)}</td>'
        f'<td class="num">{_amount((_num(p.get("span_s")) or 0.0) / 3600)}</td>'
        + "".join(f'<td class="num">{_share_text(p.get(f"{s}_share"))}</td>' for s, _ in states)
        + f"<td>{_esc(str(p.get('method') or '—'))}</td></tr>"
        for p in pools
    )
    head = "".join(f"<th>{name}</th>" for _, name in states)
    return (
        f"<h3>GPUs without phaselens telemetry: phase split, estimated {''.join(_badge(x) for x in labels)}</h3>"
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
                f"<li><b>{_esc(key)}</b>: ${float(table[key]):g} per GPU-hour — "
                f"{_esc(str(sources.get(key, 'no source given')))}</li>"
            )
    for key, what, unit in (("electricity_usd_per_kwh", "Electricity", " per kWh"), ("pue", "PUE", "")):
        v = _num(prices.get(key))
        if v is not None:
            money = f"${v:g}" if key != "pue" else f"{v:g}"
            lines.append(
                f"<li><b>{what}</b>: {money}{unit} — {_esc(str(sources.get(key, 'no source given')))}</li>"
            )
    return f'<p class="meta">Prices used:</p><ul class="meta">{"".join(lines)}</ul>' if lines else ""


def _latency(page: _Page, summary: dict[str, Any], simulated: bool) -> str:
    from analytics.latency import attainment_basis
    from dashboard.figures import attainment_over_time_figure, latency_over_time_figure, part_labels

    lat = (summary.get("parts") or {}).get("latency") or {}
    out = ["<section><h2>Latency and SLO attainment</h2>"]
    if not lat.get("requests"):
        why = (summary.get("missing") or {}).get("latency") or "no requests finished in this window"
        out.append(f'<p class="empty">No latency: {_esc(str(why))}</p></section>')
        return "".join(out)
    labels = part_labels(lat)
    att = lat.get("attainment") or {}
    slo = lat.get("slo") or {}
    ttft_ms, tpot_ms = (_num(slo.get("ttft_s")) or 0) * 1000, (_num(slo.get("tpot_s")) or 0) * 1000
    slo_text = f"TTFT ≤ {ttft_ms:g} ms, TPOT ≤ {tpot_ms:g} ms"
    out.append(
        f"<p><b>{_share_text(att.get('both'))}</b> of the requests met both SLOs ({_esc(slo_text)}): "
        f"{attainment_basis(lat)}. {_share_text(att.get('ttft'))} met the TTFT "
        f"SLO, {_share_text(att.get('tpot'))} the TPOT SLO.</p>"
    )
    rows = []
    names = {"ttft": "time to first token", "tpot": "time per output token", "itl": "inter-token latency"}
    names["e2e"] = "end to end"
    for key, name in names.items():
        p = (lat.get("percentiles") or {}).get(key) or {}
        if not p.get("n"):
            continue
        how = "from buckets (estimated)" if p.get("method") == "histogram" else "per request"
        cells = "".join(f'<td class="num">{_ms_text(p.get(f"{q}_s"))}</td>' for q in ("p50", "p90", "p99"))
        rows.append(
            f'<tr><td>{name}</td><td class="num">{int(p["n"]):,}</td>{cells}'
            f'<td class="num">{_ms_text(p.get("mean_s"))}</td><td>{how}</td></tr>'
        )
    if rows:
        out.append(
            "<table><tr><th>latency</th><th>values</th><th>p50</th><th>p90</th><th>p99</th><th>mean</th>"
            f"<th>method</th></tr>{''.join(rows)}</table>"
        )
    over = lat.get("over_time") or []
    if over:
        w = summary.get("window") or {}
        window_s = (float(w["start_s"]), float(w["end_s"])) if "start_s" in w and "end_s" in w else None
        common = {
            "labels": labels,
            "simulated": simulated,
            "bucket_s": lat.get("bucket_s"),
            "window_s": window_s,
        }
        fig = latency_over_time_figure(
            over, slo_ttft_s=slo.get("ttft_s"), slo_tpot_s=slo.get("tpot_s"), **common
        )
        out.append(page.chart(fig))
        fig = attainment_over_time_figure(over, target=_SLO_TARGET, slo_text=slo_text, **common)
        out.append(page.chart(fig))
        out.append(
            '<p class="meta">Requests are counted in the time bucket they arrived in; a request that '
            "failed misses the SLO.</p>"
        )
    out.append("</section>")
    return "".join(out)


def _missing(summary: dict[str, Any], heading: str = "What is missing") -> str:
    """The analyses' missing items (and the histogram's), each with its reason."""
    items = [(str(k), str(v)) for k, v in (summary.get("missing") or {}).items()]
    items += [("histogram", str(m)) for m in (summary.get("histogram") or {}).get("missing") or []]
    by_reason: dict[str, list[str]] = {}  # one line per reason, naming every analysis it stopped
    for key, why in items:
        names = by_reason.setdefault(why, [])
        if _what(key) not in names:
            names.append(_what(key))
    if not by_reason:
        return ""
    lis = "".join(f"<li><b>{_esc(', '.join(k))}</b>: {_esc(v)}</li>" for v, k in by_reason.items())
    return f"<section><h2>{_esc(heading)}</h2><ul>{lis}</ul></section>"


def _what(key: str) -> str:
    """``cost.0`` → ``cost``, ``phases.fits`` → ``phases, fits``."""
    head, _, tail = key.partition(".")
    return head if not tail or tail.isdigit() else f"{head}, {tail.replace('_', ' ')}"


def _appendix(summary: dict[str, Any]) -> str:
    """Each part's detailed tables, folded; the notes on how the figures were made."""
    parts = summary.get("parts") or {}
    window = summary.get("window")
    folds = []
    for name in [*_APPENDIX_PARTS, *(p for p in parts if p not in _APPENDIX_PARTS)]:
        part = parts.get(name)
        if not part:
            continue
        folds.append(
            f"<details><summary>{_esc(_humanize(name))}</summary>{_value(part, 3, window)}</details>"
        )
    notes = (summary.get("trust") or {}).get("notes") or []
    if notes:
        lis = "".join(f"<li>{_esc(str(n))}</li>" for n in notes)
        folds.append(
            f'<details><summary>How these figures were made</summary><ul class="meta">{lis}</ul></details>'
        )
    if not folds:
        return ""
    return "<section><h2>Appendix: the detailed tables</h2>" + "".join(folds) + "</section>"


# -- generic tables of the appendix -------------------------------------------------------------------


def _value(value: Any, depth: int, window: Any = None) -> str:
    if isinstance(value, dict):
        out = []
        trust = value.get("trust")
        if isinstance(trust, dict) and "labels" in trust:
            badges = "".join(_badge(lb) for lb in trust.get("labels") or [])
            out.append(f"<p>{badges}</p>" if badges else "")
        skip = {"trust"} | ({"window"} if window is not None and value.get("window") == window else set())
        scalars = {
            k: v for k, v in value.items() if k not in skip and not isinstance(v, dict) and not _is_table(v)
        }
        notes = {k: v for k, v in scalars.items() if isinstance(v, list) and k in ("notes", "missing")}
        scalars = {k: v for k, v in scalars.items() if k not in notes}
        if scalars:
            rows = "".join(f"<tr><th>{_esc(_humanize(k))}</th>{_cell(v, k)}</tr>" for k, v in scalars.items())
            out.append(f"<table>{rows}</table>")
        for k, items in notes.items():
            if items:
                lis = "".join(f"<li>{_esc(str(x))}</li>" for x in items)
                out.append(f'<p class="meta">{_esc(_humanize(k))}:</p><ul class="meta">{lis}</ul>')
        for k, v in value.items():
            if k in scalars or k in notes or k in skip or v in ({}, [], None):
                continue
            tag = f"h{min(depth + 1, 6)}"
            out.append(f"<{tag}>{_esc(_humanize(k))}</{tag}>{_value(v, depth + 1, window)}")
        return "".join(out)
    if _is_table(value):
        return _table(value)
    text, _ = _fmt(value)
    return f"<p>{_esc(text)}</p>"


def _table(rows: list[dict[str, Any]]) -> str:
    """A list of dicts as a table; a wide one with few rows turned on its side (a column per row)."""
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    if len(cols) > _WIDE_COLUMNS and len(rows) <= _SIDEWAYS_ROWS:
        head = "<th></th>" + "".join(f"<th>{_esc(_row_label(r, i))}</th>" for i, r in enumerate(rows))
        body = "".join(
            f"<tr><th>{_esc(_humanize(c))}</th>" + "".join(_cell(r.get(c), c) for r in rows) + "</tr>"
            for c in cols
        )
        return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'
    shown = rows[:_MAX_TABLE_ROWS]
    head = "".join(f"<th>{_esc(_humanize(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(row.get(c), c) for c in cols) + "</tr>" for row in shown)
    more = (
        f'<p class="meta">{len(rows) - len(shown):,} more rows in the JSON below.</p>'
        if len(rows) > len(shown)
        else ""
    )
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>{more}'


def _row_label(row: dict[str, Any], i: int) -> str:
    parts = [
        str(row[c])
        for c in _ID_COLUMNS
        if isinstance(row.get(c), str | int) and not isinstance(row.get(c), bool)
    ]
    for c in _TIME_COLUMNS:
        if _is_time(c, row.get(c)):
            parts.append(utc_text(float(row[c]), "%H:%M"))
    return " · ".join(parts[:2]) or f"#{i + 1}"


def _is_table(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _humanize(key: str) -> str:
    """``energy_per_token_j`` → ``Energy per token, J``; ``frac_idle`` → ``Idle, share``."""
    text = str(key)
    unit = ""
    if text.startswith(_SHARE_PREFIXES):
        text, unit = text.split("_", 1)[1], "share"
    else:
        for suffix, u in _UNITS.items():
            if text.endswith(suffix) and len(text) > len(suffix):
                text, unit = text[: -len(suffix)], u
                break
    text = text.replace("_", " ").strip()
    text = text[:1].upper() + text[1:]
    return f"{text}, {unit}" if unit else text


def _is_time(key: str, v: Any) -> bool:
    """An epoch-seconds field (``start_s``, ``hour_s``, ``bucket_start_s``, ...)."""
    return (
        isinstance(v, int | float)
        and not isinstance(v, bool)
        and key.endswith("_s")
        and (key[:-2].endswith(("start", "end", "hour", "ts", "time")) or key in ("hour_s", "ts_s"))
        and 1e9 < v < 1e11
    )


def _fmt(v: Any, key: str = "") -> tuple[str, bool]:
    """A cell's text and whether it is a number."""
    if isinstance(v, bool) or v is None:
        return ("—" if v is None else str(v).lower()), False
    if _is_time(key, v):
        return utc_text(float(v), "%Y-%m-%d %H:%M:%S"), False
    if isinstance(v, int):
        return f"{v:,}", True
    if isinstance(v, float):
        if not math.isfinite(v):
            return "—", False
        a = abs(v)
        text = f"{v:,.0f}" if a >= 1000 else f"{v:.3g}" if a >= 0.01 or a == 0 else f"{v:.2e}"
        return text, True
    if isinstance(v, list) and all(not isinstance(x, dict | list) for x in v):
        return ", ".join(_fmt(x)[0] for x in v) or "—", False
    if isinstance(v, dict | list):
        return json.dumps(v, default=str)[:300], False
    return str(v), False


def _cell(v: Any, key: str = "") -> str:
    text, num = _fmt(v, key)
    return f'<td class="num">{_esc(text)}</td>' if num else f"<td>{_esc(text)}</td>"


# -- small formatters -------------------------------------------------------------------------------------


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _badge(label: str) -> str:
    return f'<span class="badge {_esc(label)}">{_esc(label)}</span>'


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _range_text(start_s: float | None, end_s: float | None) -> str:
    """``2026-12-01 10:00 – 11:00``, with seconds when the range is shorter than an hour, and the
    end's date when it is another day."""
    short = start_s is not None and end_s is not None and end_s - start_s < 3600
    fmt = "%Y-%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M"
    same_day = (
        start_s is not None and end_s is not None and utc_text(start_s, "%j%Y") == utc_text(end_s, "%j%Y")
    )
    return f"{utc_text(start_s, fmt)} – {utc_text(end_s, fmt[9:] if same_day else fmt)}"


def _span_s(start_s: float | None, end_s: float | None) -> float | None:
    return end_s - start_s if start_s is not None and end_s is not None else None


def _duration(seconds: float | None) -> str:
    """``1 h``, ``24 h``, ``7 d``, ``90 min``, ``42 s``."""
    if seconds is None or seconds <= 0:
        return ""
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _gpu_hours(seconds: Any) -> str:
    """GPU-time to read: ``12.5 GPU-hours``, ``0.75 GPU-hours``, ``31.6 GPU-seconds``."""
    s = _num(seconds)
    if s is None:
        return "unknown GPU-time"
    if s < 360:
        return f"{s:.3g} GPU-seconds"
    h = s / 3600
    return f"{h:,.1f} GPU-hours" if h >= 10 else f"{h:.3g} GPU-hours"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _amount(v: float) -> str:
    """A table cell: ``0``, ``< 0.01``, ``3.14``, ``1,234``."""
    if v == 0:
        return "0"
    if abs(v) < 0.01:
        return "< 0.01"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:,.0f}"


def _pct_text(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f} %"


def _share_text(v: Any) -> str:
    x = _num(v)
    return "—" if x is None else f"{x:.1%}"


def _ms_text(v: Any) -> str:
    x = _num(v)
    if x is None:
        return "—"
    ms = x * 1000
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms"
