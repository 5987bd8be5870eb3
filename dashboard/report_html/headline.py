"""The report's top: the title with the window and the trust labels, the headline figures against
the previous period, and where the GPU-time goes."""

from __future__ import annotations

import time
from typing import Any

from dashboard.report_html.charts import Page
from dashboard.report_html.text import (
    badge,
    duration_text,
    esc,
    gpu_hours_text,
    number_or_none,
    ordered_pools,
    range_text,
    span_between_s,
    utc_text,
)


def header_html(summary: dict[str, Any], title: str, start_s: float | None, end_s: float | None) -> str:
    """The title, the window, the data set and each trust label with its meaning."""
    from analytics.trust import MEANINGS
    from dashboard.figures import ordered_labels

    window = summary.get("window") or {}
    dataset = str(window.get("dataset") or "live")
    what = "live data" if dataset == "live" else f"simulated scenario {dataset} (virtual time)"
    duration = duration_text(number_or_none(window.get("duration_s")) or span_between_s(start_s, end_s))
    trust = summary.get("trust") or {}
    labels = ordered_labels(trust.get("labels") or [])
    meanings = "".join(f"<li>{badge(lb)} {esc(MEANINGS.get(lb, ''))}</li>" for lb in labels if lb in MEANINGS)
    out = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta"><b>Window</b> {esc(range_text(start_s, end_s))} UTC'
        f"{esc(f' ({duration})' if duration else '')}"
        f" · <b>data set</b> {esc(what)}{_scope_text(summary.get('scope') or {})} · generated {esc(utc_text(time.time(), '%Y-%m-%d %H:%M'))} UTC"
        " by phaselens</p>",
    ]
    if labels:
        out.append(f'<ul class="labels">{meanings}</ul>')
    elif summary:
        out.append('<p class="meta">No trust labels: no analysis had data.</p>')
    return "".join(out)


def _scope_text(scope: dict[str, Any]) -> str:
    """`` · model M · layout L`` (the whole layout string) for what is known, escaped."""
    out = ""
    if scope.get("model"):
        out += f" · <b>model</b> {esc(str(scope['model']))}"
    layout = scope.get("layout_full") or scope.get("layout")
    if layout:
        out += f" · <b>layout</b> <code>{esc(str(layout))}</code>"
    return out


def headline_section(ov: dict[str, Any] | None) -> str:
    """At a glance: where the money goes in one sentence and the headline figures' tiles, against the previous period."""
    from analytics.overview import FIGURES
    from dashboard.figures import figure_text

    ov = ov or {}
    figures = ov.get("figures") or {}
    money = ov.get("money") or {}
    out = ["<section><h2>At a glance</h2>"]
    if money.get("sentence"):
        out.append(f'<p class="lead">{esc(money["sentence"])}</p>')
    elif money.get("no_data"):
        out.append(f'<p class="meta">Where the money goes: {esc(money["no_data"])}</p>')
    prev = ov.get("previous_window") or {}
    any_previous = any(f.get("previous") is not None for f in figures.values())
    if prev.get("start_s") is not None and any_previous:
        out.append(
            f'<p class="meta">Against the previous period of the same length: '
            f"{esc(range_text(prev['start_s'], prev.get('end_s')))} UTC.</p>"
        )
    elif prev.get("start_s") is not None:  # the period before had nothing to compare with
        out.append(
            f'<p class="meta">No trend: the previous period of the same length, '
            f"{esc(range_text(prev['start_s'], prev.get('end_s')))} UTC, has no data to compare.</p>"
        )
    else:
        why = next((f.get("previous_no_data") for f in figures.values() if f.get("previous_no_data")), None)
        why = str(why or "no previous period").removeprefix("no data: ")
        out.append(f'<p class="meta">No trend against a previous period: {esc(why)}.</p>')
    tiles = []
    for spec in FIGURES:
        fig = figures.get(spec.key)
        if fig is None:
            continue
        value = fig.get("value")
        cls = "tile" if value is not None else "tile nodata"
        lines = [
            f'<div class="label">{esc(fig["label"])}</div>',
            f'<div class="value">{esc(figure_text(spec.key, value))}</div>',
        ]
        if value is None:
            lines.append(f'<div class="why">{esc(str(fig.get("no_data") or "no data"))}</div>')
        else:
            lines.append(_delta_line(spec.key, fig) if any_previous else "")
            if fig.get("basis"):  # what it is over: the window's seconds, every request
                lines.append(f'<div class="prev">{esc(str(fig["basis"]))}</div>')
            if fig.get("busy_value") is not None:  # output tokens/s while serving, by its own name
                busy = figure_text(spec.key, fig["busy_value"])
                lines.append(
                    f'<div class="prev" data-busy>{esc(str(fig.get("busy_label")))}: {esc(busy)}</div>'
                )
            if spec.key == "j_per_output_token" and fig.get("j_per_input_token") is not None:
                lines.append(
                    f'<div class="prev">per input token: {esc(figure_text(spec.key, fig["j_per_input_token"]))}</div>'
                )
            lines.append(f"<div>{''.join(badge(lb) for lb in fig.get('trust') or [])}</div>")
        tiles.append(f'<div class="{cls}" data-figure="{esc(spec.key)}">{"".join(lines)}</div>')
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
        f'<div class="delta {cls}">{arrow} {esc(text)}</div>'
        f'<div class="prev">previous: {esc(figure_text(key, fig.get("previous")))}</div>'
    )


def gpu_time_section(page: Page, ov: dict[str, Any] | None) -> str:
    """Where the GPU-time goes: a bar per pool and all GPUs."""
    from dashboard.figures import gpu_time_figure

    gt = (ov or {}).get("gpu_time") or {}
    out = ["<section><h2>Where the GPU-time goes</h2>"]
    if gt.get("shares") is None:
        out.append(f'<p class="empty">{esc(str(gt.get("no_data") or "no data"))}</p></section>')
        return "".join(out)
    pools = ordered_pools((gt.get("per_pool") or {}).keys())
    fig = gpu_time_figure(gt, pools, gt.get("trust") or [], with_fleet=True)
    out.append(page.chart(fig))
    out.append(
        f'<p class="meta">{gpu_hours_text(gt.get("gpu_seconds"))} of GPU-time. Stranded: busy, but with the '
        "compute (decode) or the memory bandwidth (prefill) idle. Host-bound: the GPU waits on the host "
        "between iterations. Idle: no work.</p></section>"
    )
    return "".join(out)
