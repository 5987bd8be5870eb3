"""A layout recommendation (its ``recommendations`` row with ``details``, docs/RECOMMENDATIONS.md) as
the Recommendations page, the Overview and the reports show it: the Pareto chart of its candidates,
the candidate and impact tables' rows, and the sentences (the SLOs, the confidence, the headline).
Pure functions: a row in, a figure, rows or text out; every figure is the simulator's and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from dashboard.figures.palette import NEUTRAL, STATUS_COLOURS
from dashboard.figures.style import TRUST_COLOURS, apply_layout, label_figure
from dashboard.figures.text import as_float, usd_text

MEETS_COLOUR = STATUS_COLOURS["met"]  # a candidate meeting the SLOs
MISSES_COLOUR = STATUS_COLOURS["not_a_choice"]  # one that misses them (grey: not a choice)
CURRENT_COLOUR = NEUTRAL["ink"]  # the layout running now
CHOSEN_COLOUR = TRUST_COLOURS["simulated"][1]  # the proposal: a simulated figure, in its colour
HOURS_PER_YEAR = 8760.0
NO_RECOMMENDATION = (
    "No layout recommendation yet: make one on the Recommendations page (Make a recommendation, with "
    "your SLOs) or with `phaselens recommend --layout L --collector URL`."
)


def details_of(rec: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict((rec or {}).get("details") or {})


def _num(v: Any) -> float | None:
    x = as_float(v)
    return None if x != x else x


def plotted_candidates(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The candidates that have both axes of the Pareto chart (simulated ones, not pruned unseen)."""
    out = []
    for c in details_of(rec).get("candidates") or []:
        x, y = _num(c.get("output_tokens_per_s_per_user")), _num(c.get("output_tokens_per_s_per_gpu"))
        if x is not None and y is not None and x > 0 and y > 0:
            out.append(dict(c))
    return out


def current_layout(rec: Mapping[str, Any]) -> str | None:
    return ((rec.get("current") or {}) if isinstance(rec.get("current"), dict) else {}).get("layout")


def proposed_layout(rec: Mapping[str, Any]) -> str | None:
    return ((rec.get("proposed") or {}) if isinstance(rec.get("proposed"), dict) else {}).get("layout")


def is_stay(rec: Mapping[str, Any]) -> bool:
    """The recommendation is to keep the current layout."""
    d = details_of(rec)
    return bool(d.get("stay")) or (
        proposed_layout(rec) is not None and proposed_layout(rec) == current_layout(rec)
    )


def _hover(c: Mapping[str, Any]) -> str:
    att = _num(c.get("slo_attainment"))
    ttft, tpot = _num(c.get("ttft_p90_s")), _num(c.get("tpot_p90_s"))
    return (
        f"{c.get('layout')}<br>{c.get('gpus')} GPUs · "
        f"{'meets' if c.get('meets_slo') else 'misses'} the SLOs"
        + (f" ({100 * att:.1f} %)" if att is not None else "")
        + (f"<br>TTFT p90 {1e3 * ttft:.0f} ms" if ttft is not None else "")
        + (f" · TPOT p90 {1e3 * tpot:.1f} ms" if tpot is not None else "")
        + f"<br>bottleneck: {c.get('bottleneck') or '—'} · on the {c.get('evaluated_on') or 'bound'}"
    )


def pareto_figure(rec: Mapping[str, Any]) -> go.Figure:
    """Output tokens/s per GPU (y) against tokens/s per user (x) of every simulated candidate: those
    meeting the SLOs filled green, those missing them open grey, the Pareto front dotted, the current
    layout and the chosen one marked and named; labelled SIMULATED."""
    cands = plotted_candidates(rec)
    cur, chosen = current_layout(rec), proposed_layout(rec)
    fig = go.Figure()
    for meets, name, colour, symbol in (
        (True, "meets the SLOs", MEETS_COLOUR, "circle"),
        (False, "misses the SLOs", MISSES_COLOUR, "circle-open"),
    ):
        group = [c for c in cands if bool(c.get("meets_slo")) is meets]
        if not group:
            continue
        fig.add_trace(
            go.Scatter(
                x=[c["output_tokens_per_s_per_user"] for c in group],
                y=[c["output_tokens_per_s_per_gpu"] for c in group],
                mode="markers",
                name=name,
                marker={
                    "color": colour,
                    "size": 9,
                    "symbol": symbol,
                    "line": {"width": 1.5, "color": colour},
                },
                text=[_hover(c) for c in group],
                hovertemplate="%{text}<extra></extra>",
            )
        )
    front = sorted((c for c in cands if c.get("pareto")), key=lambda c: c["output_tokens_per_s_per_user"])
    if len(front) >= 2:
        fig.add_trace(
            go.Scatter(
                x=[c["output_tokens_per_s_per_user"] for c in front],
                y=[c["output_tokens_per_s_per_gpu"] for c in front],
                mode="lines",
                name="Pareto front",
                line={"color": NEUTRAL["faint"], "dash": "dot", "width": 1.5},
                hoverinfo="skip",
            )
        )
    for layout, name, colour, symbol in (
        (cur, "current layout", CURRENT_COLOUR, "diamond-open"),
        (chosen, "recommended" if chosen != cur else "recommended (stay as is)", CHOSEN_COLOUR, "star"),
    ):
        point = next((c for c in cands if c.get("layout") == layout), None)
        if point is None:
            continue
        fig.add_trace(
            go.Scatter(
                x=[point["output_tokens_per_s_per_user"]],
                y=[point["output_tokens_per_s_per_gpu"]],
                mode="markers+text",
                name=name,
                marker={
                    "color": colour,
                    "size": 18,
                    "symbol": symbol,
                    "line": {"width": 2.5, "color": colour},
                },
                text=[name.split(" (")[0]],
                textposition="top center" if symbol == "star" else "bottom center",
                textfont={"color": colour, "size": 12},
                hovertext=[_hover(point)],
                hovertemplate="%{hovertext}<extra></extra>",
            )
        )
    apply_layout(fig, "Output tokens/s per GPU vs per user, per candidate layout", height=440, legend_y=-0.2)
    fig.update_xaxes(title_text="output tokens/s per user (1 / median TPOT)", rangemode="tozero")
    fig.update_yaxes(title_text="output tokens/s per GPU", rangemode="tozero")
    if not cands:
        fig.add_annotation(
            text="no candidate was simulated", xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False
        )
    return label_figure(fig, [str(details_of(rec).get("trust") or "simulated")])


def _ms(v: Any, digits: int = 0) -> str:
    x = _num(v)
    return "—" if x is None else f"{1e3 * x:,.{digits}f}"


def _fmt(v: Any, digits: int = 1) -> str:
    x = _num(v)
    if x is None:
        return "—"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.{digits}f}"


def candidate_rows(rec: Mapping[str, Any], *, include_pruned: bool = False) -> list[dict[str, Any]]:
    """One row per candidate for a table (the simulated ones; ``include_pruned``: those dropped by
    the capacity bound too, with the reason): the chosen and current marked, the figures in units."""
    cur, chosen = current_layout(rec), proposed_layout(rec)
    rows = []
    for c in details_of(rec).get("candidates") or []:
        seen = c.get("evaluated_on")
        if not seen and not include_pruned:
            continue
        mark = " · ".join(
            m
            for m, on in (("recommended", c.get("layout") == chosen), ("current", c.get("layout") == cur))
            if on
        )
        att = _num(c.get("slo_attainment"))
        rows.append(
            {
                "": mark,
                "Layout": c.get("layout"),
                "GPUs": c.get("gpus"),
                "Meets SLOs": {True: "yes", False: "no"}.get(c.get("meets_slo"), "—"),
                "Goodput, req/s/GPU": _fmt(c.get("goodput_rps_per_gpu"), 3),
                "Tokens/s/GPU": _fmt(c.get("output_tokens_per_s_per_gpu")),
                "Tokens/s/user": _fmt(c.get("output_tokens_per_s_per_user")),
                "TTFT p90, ms": _ms(c.get("ttft_p90_s")),
                "TPOT p90, ms": _ms(c.get("tpot_p90_s"), 1),
                "SLO attainment": "—" if att is None else f"{100 * att:.1f} %",
                "$/1M tokens": usd_text(c.get("usd_per_1m_tokens")),
                "J/token": _fmt(c.get("j_per_token"), 2),
                "Pareto": "yes" if c.get("pareto") else "",
                "Bottleneck": c.get("bottleneck") or c.get("pruned") or "—",
                "Simulated on": seen or "bound only",
            }
        )
    return rows


#: the predicted impact's figures: (key, what, how to write it, lower is better)
IMPACT = (
    ("usd_per_year", "$ a year (fleet)", usd_text, True),
    ("usd_per_1m_tokens", "$ per 1M tokens, all in", usd_text, True),
    ("j_per_token", "J per token", lambda v: _fmt(v, 3), True),
    ("ttft_p90_s", "TTFT p90, ms", lambda v: _ms(v), True),
    ("tpot_p90_s", "TPOT p90, ms", lambda v: _ms(v, 1), True),
    ("goodput_rps_per_gpu", "Goodput, req/s per GPU", lambda v: _fmt(v, 3), False),
    (
        "slo_attainment",
        "SLO attainment",
        lambda v: "—" if _num(v) is None else f"{100 * float(v):.1f} %",
        False,
    ),
)


def impact_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chosen layout's predicted figures against the current layout's (both simulated over the
    same trace) and, where measured, what was measured on the current layout."""
    d = details_of(rec)
    pred, cur, meas = d.get("predicted") or {}, d.get("current_predicted") or {}, d.get("measured") or {}
    rows = []
    for key, what, fmt, _lower in IMPACT:
        p, c = _num(pred.get(key)), _num(cur.get(key))
        change = "—"
        if p is not None and c is not None and c:
            change = f"{100 * (p - c) / abs(c):+.1f} %"
        rows.append(
            {
                "Figure": what,
                "Current layout (simulated)": fmt(c),
                "Recommended (simulated)": fmt(p),
                "Change": change,
                "Measured now": fmt(meas.get(key)) if meas.get(key) is not None else "—",
            }
        )
    return rows


def annual_saving_usd(rec: Mapping[str, Any]) -> float | None:
    """What the recommendation saves a year at the SLOs for the fleet it was made for: the current
    layout's simulated $/year minus the proposal's (else −``est_cost_change_usd_per_h`` × 8,760 h
    for one copy of the layout); negative when it costs more (e.g. to meet the SLOs at all)."""
    d = details_of(rec)
    p = _num((d.get("predicted") or {}).get("usd_per_year"))
    c = _num((d.get("current_predicted") or {}).get("usd_per_year"))
    if p is not None and c is not None:
        return c - p
    change = _num(rec.get("est_cost_change_usd_per_h"))
    return None if change is None else -change * HOURS_PER_YEAR


def _secs(s: float) -> str:
    return f"{s:g} s" if s >= 1 else f"{1e3 * s:g} ms"


def slo_text(rec: Mapping[str, Any]) -> str:
    """``TTFT ≤ 1 s and TPOT ≤ 30 ms for 90 % of requests`` (the SLOs it was made for)."""
    slo = (details_of(rec).get("inputs") or {}).get("slo") or {}
    parts = []
    if _num(slo.get("ttft_s")) is not None:
        parts.append(f"TTFT ≤ {_secs(float(slo['ttft_s']))}")
    if _num(slo.get("tpot_s")) is not None:
        parts.append(f"TPOT ≤ {_secs(float(slo['tpot_s']))}")
    target = _num(slo.get("target"))
    text = " and ".join(parts) or "the SLOs"
    return text + (f" for {100 * target:.0f} % of requests" if target is not None else "")


REPLAY_NAMES = {"ttft_p90": "TTFT p90", "tpot_p90": "TPOT p90", "output_tokens_per_s": "tokens/s"}


def confidence_text(rec: Mapping[str, Any]) -> str:
    """``medium: replay error TTFT p90 +12 %, TPOT p90 −3 %, tokens/s +1 % — <the recommender's
    sentence>`` (``low: not checked ...`` when nothing was measured)."""
    conf = details_of(rec).get("confidence") or {}
    level = str(conf.get("level") or "unknown")
    errors = conf.get("replay_error_pct") or {}
    shown = [f"{REPLAY_NAMES.get(k, k)} {float(v):+.0f} %" for k, v in errors.items() if _num(v) is not None]
    text = level + (": replay error " + ", ".join(shown) if shown else ": replay error not measured")
    return text + (f" — {conf['text']}" if conf.get("text") else "")


def headline_text(rec: Mapping[str, Any] | None, *, target_note: str | None = None) -> str:
    """The Overview's and the reports' headline of the best recommendation: ``Best recommendation:
    save $41,000/yr at your SLOs (TTFT ≤ 1 s and TPOT ≤ 30 ms for 90 % of requests) with 2p2d:...
    — confidence medium``; staying as is, or costing more to meet the SLOs, said as such; with no
    recommendation, that there is none and how to make one."""
    if rec is None:
        return NO_RECOMMENDATION
    level = str((details_of(rec).get("confidence") or {}).get("level") or "unknown")
    slo = slo_text(rec)
    where = f" for {target_note}" if target_note else ""
    if is_stay(rec):
        return (
            f"Best recommendation{where}: stay as is ({current_layout(rec)}): no change saves money at your "
            f"SLOs ({slo}) — confidence {level}"
        )
    saving = annual_saving_usd(rec)
    layout = proposed_layout(rec)
    if saving is None:
        money = "change the layout (saving not known) at"
    elif saving >= 0:
        money = f"save {usd_text(saving)}/yr at"
    else:
        money = f"spend {usd_text(-saving)}/yr more to meet"
    return f"Best recommendation{where}: {money} your SLOs ({slo}) with {layout} — confidence {level}"


def is_for_dataset(target: str, dataset: str | None) -> bool:
    """A recommendation's ``target`` is about the data set (``live``: a ``stack:`` or ``fleet:``
    target; a scenario id: ``scenario:<id>``; None: any)."""
    if dataset is None:
        return True
    if dataset == "live":
        return target.startswith(("stack:", "fleet:"))
    return target == f"scenario:{dataset}"


def best_recommendation(
    recs: Iterable[Mapping[str, Any]], dataset: str | None = None
) -> Mapping[str, Any] | None:
    """The proposed layout recommendation (list rows, no details needed) that saves the most per
    hour, newest first among equals; those for ``dataset`` (``live``: a ``stack:`` or ``fleet:``
    target; a scenario id: ``scenario:<id>``) before any other. None when none is proposed."""
    proposed = [r for r in recs if r.get("status") == "proposed" and r.get("kind", "layout") == "layout"]
    own = [r for r in proposed if is_for_dataset(str(r.get("target") or ""), dataset)]
    pool: Sequence[Mapping[str, Any]] = own or proposed
    if not pool:
        return None
    return max(
        pool, key=lambda r: (-(_num(r.get("est_cost_change_usd_per_h")) or 0.0), _num(r.get("ts_s")) or 0.0)
    )


def guard_text(guard: Mapping[str, Any] | None) -> str:
    """An apply's guard (``GuardSpec.describe()``) in words: ``a 30 s window after each step; it breaches
    under 90 % of requests meeting TTFT ≤ 1 s and TPOT ≤ 30 ms, or over 5 % errors (judged from 1
    request)``."""
    g = dict(guard or {})
    slo = g.get("slo") or {}
    meets = slo_text({"details": {"inputs": {"slo": {k: slo.get(k) for k in ("ttft_s", "tpot_s")}}}})
    target, err = _num(slo.get("target")), _num(g.get("max_error_rate"))
    window = _num(g.get("window_s"))
    return (
        (f"a {window:g} s window after each step" if window is not None else "a window after each step")
        + (
            f"; it breaches under {100 * target:.0f} % of requests meeting {meets}"
            if target is not None
            else ""
        )
        + (f", or over {100 * err:g} % errors" if err is not None else "")
        + (
            f" (judged from {g['min_requests']} request{'s' if g['min_requests'] != 1 else ''}; "
            "fewer: not judged)"
            if g.get("min_requests") is not None
            else ""
        )
        + "; a breach rolls every applied step back"
    )
