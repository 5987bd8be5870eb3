"""The report's energy section (``summary["energy"]``, made by ``phaselens/report_energy.py``): energy
per token per phase (prefill J per input token, decode J per output token, all-in and busy, tokens/J;
overall and per pool), the saving realised by applied power settings and the saving available from
the best proposed one, in kWh, $ and tokens/J, each with its trust labels."""

from __future__ import annotations

from typing import Any

from dashboard.figures.text import signed_pct_text, whole_usd_text
from dashboard.report_html.text import badge, esc, number_or_none, ordered_pools, utc_text

_PHASES = (
    ("prefill", "J per input token", "j_per_input_token", "j_per_input_token_busy", "input_tokens_per_j"),
    ("decode", "J per output token", "j_per_output_token", "j_per_output_token_busy", "output_tokens_per_j"),
)


def _f(v: Any, digits: int = 3) -> str:
    x = number_or_none(v)
    return "—" if x is None else f"{x:.{digits}g}"


def _kwh(v: Any) -> str:
    x = number_or_none(v)
    return "—" if x is None else f"{x:,.0f} kWh"


def _badges(labels: Any) -> str:
    return "".join(badge(str(lb)) for lb in labels or [])


def _phase_table(per: dict[str, Any]) -> str:
    total = per.get("total") or {}
    rows = "".join(
        f"<tr><td>{phase}</td><td>{what}</td><td class='num' data-key='{key}'>{_f(total.get(key))}</td>"
        f"<td class='num'>{_f(total.get(busy))}</td><td class='num'>{_f(total.get(tpj))}</td></tr>"
        for phase, what, key, busy, tpj in _PHASES
    )
    out = (
        "<table><tr><th>phase</th><th>per</th><th>J/token, all-in</th><th>J/token, busy</th>"
        f"<th>tokens/J</th></tr>{rows}</table>"
    )
    pools = {str(p.get("pool")): p for p in per.get("by_pool") or []}
    if len(pools) > 1:
        rows = "".join(
            f"<tr><td>{esc(pool)}</td><td class='num'>{_f(pools[pool].get('j_per_input_token'))}</td>"
            f"<td class='num'>{_f(pools[pool].get('j_per_output_token'))}</td>"
            f"<td class='num'>{_f(pools[pool].get('j_per_token'))}</td></tr>"
            for pool in ordered_pools(pools)
        )
        out += (
            "<table><tr><th>pool</th><th>J per input token</th><th>J per output token</th>"
            f"<th>J per token</th></tr>{rows}</table>"
        )
    return out


def _realised(items: list[dict[str, Any]]) -> str:
    if not items:
        return "<p class='meta'>No power setting is applied (none applied, or each was rolled back).</p>"
    rows = []
    for r in items:
        released = "".join(f"<li>{esc(str(x))}</li>" for x in r.get("released") or [])
        phases = r.get("phases") or {}
        cells = "".join(
            f"<td class='num' data-phase='{phase}'>{_f((phases.get(phase) or {}).get('j_per_token_before'))} → "
            f"{_f((phases.get(phase) or {}).get('j_per_token_after'))} "
            f"({signed_pct_text((phases.get(phase) or {}).get('tokens_per_j_change_pct'))} tokens/J)</td>"
            for phase in ("prefill", "decode")
        )
        rows.append(
            f"<tr data-rec='{esc(str(r.get('recommendation_id')))}'><td>{esc(str(r.get('recommendation_id')))} "
            f"({esc(str(r.get('mode') or '?')).upper()}), set {esc(utc_text(r.get('change_s')))} UTC, "
            f"{number_or_none(r.get('window_s')) or 0:,.0f} s each side</td>{cells}"
            f"<td class='num'>{_kwh(r.get('kwh_per_year'))}</td><td class='num'>{whole_usd_text(r.get('usd_per_year'))}</td>"
            f"<td>{_badges(r.get('trust'))} a year: {_badges(r.get('annual_trust'))}"
            + (f"<ul>{released}</ul>" if released else "")
            + "</td></tr>"
        )
    return (
        "<table><tr><th>applied setting</th><th>prefill J per input token, before → after</th>"
        "<th>decode J per output token, before → after</th><th>a year</th><th>$ a year</th><th>trust</th></tr>"
        + "".join(rows)
        + "</table><p class='meta'>The live GPUs' energy per token (all-in) after the change against as long "
        "just before it; a year: the J/token saved × the after window's token rates × 8,760 h (an "
        "extrapolation).</p>"
    )


def _available(part: dict[str, Any] | None) -> str:
    best = (part or {}).get("best")
    passed = (part or {}).get("passed_over") or []
    out = []
    if best:
        conf = best.get("confidence") or {}
        out.append(
            f"<p class='available' data-rec='{esc(str(best.get('recommendation_id')))}'>{_badges(best.get('trust'))} "
            f"<b>Available if applied</b>: {esc(str(best.get('recommendation_id')))} "
            f"({esc(str(best.get('mode') or '?')).upper()}, for {esc(str(best.get('target')))}) saves "
            f"<b>{_kwh(best.get('kwh_per_year'))}</b> and <b>{whole_usd_text(best.get('usd_per_year'))}</b> a year, "
            f"tokens/J {signed_pct_text(best.get('tokens_per_j_change_pct'))}, phase latency "
            f"{signed_pct_text(best.get('latency_change_pct'))}; confidence {esc(str(conf.get('level') or '—'))}: "
            f"{esc(str(conf.get('text') or ''))}.</p>"
            f"<p class='meta'>{esc(str(best.get('rationale') or ''))}</p>"
        )
    else:
        out.append(
            "<p class='meta'>No proposed power recommendation to apply (<code>phaselens calibrate --execute</code> "
            "makes one).</p>"
        )
    if passed:
        items = "".join(
            f"<li>{esc(str(p.get('recommendation_id')))}: {esc(str(p.get('why')))}</li>" for p in passed
        )
        out.append(
            f"<p class='meta'>Not offered (made from a calibration no longer current):</p><ul>{items}</ul>"
        )
    return "".join(out)


def energy_section(summary: dict[str, Any]) -> str:
    """The section; empty when the summary has no energy part (a report made before it)."""
    part = summary.get("energy")
    if not isinstance(part, dict):
        why = (summary.get("missing") or {}).get("energy")
        return (
            f'<section><h2>Energy</h2><p class="empty">Not available: {esc(str(why))}</p></section>'
            if why
            else ""
        )
    per = part.get("per_phase") or {}
    prices = part.get("prices") or {}
    return "".join(
        [
            '<section id="energy"><h2>Energy</h2>',
            f"<h3>Energy per token, per phase</h3><p>{_badges(per.get('trust'))} all-in: with the phase's share "
            "of idle and overhead energy; busy: the phase's own energy only</p>",
            _phase_table(per),
            "<h3>Power settings: realised</h3>",
            _realised(part.get("realised") or []),
            "<h3>Power settings: available</h3>",
            _available(part.get("available")),
            f"<p class='meta'>$ at {number_or_none(prices.get('electricity_usd_per_kwh')) or 0:g} $/kWh, PUE "
            f"{number_or_none(prices.get('pue')) or 0:g}.</p>",
            "</section>",
        ]
    )
