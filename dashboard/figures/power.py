"""Power calibrations and ``power`` recommendations (docs/POWER.md) as the Power page and the reports
show them: each role's calibration curves (tokens/J and latency against the power limit or the SM-clock
window, the cliff marked, the modes' settings named), the setpoints per phase and mode with their
kWh and $ a year, the guard's releases, and realised tokens/J and latency before/after. Pure functions: a row in (as
``GET /api/v1/power/calibrations``, ``GET /api/v1/recommendations/{id}`` and ``GET /api/v1/actions``
give it), a figure, rows or text out. Every figure carries its calibration's trust label: emulated
devices ``emulated``, a simulated sweep ``simulated``, real NVML ``measured``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.figures.palette import NEUTRAL, PHASE_COLOURS, STATUS_COLOURS
from dashboard.figures.style import ITL_COLOUR, PERCENTILE_DASH, TTFT_COLOUR, apply_layout, label_figure
from dashboard.figures.text import as_float, signed_pct_text, whole_number_text, whole_usd_text

MODES = ("perf", "bal", "eff")
MODE_NAMES = {"perf": "PERF", "bal": "BAL", "eff": "EFF"}
KNOB_NAMES = {"power_limit": "power limit", "sm_clock": "SM-clock window", "default": "defaults"}
AXIS_TITLES = {"power_limit": "power limit, W", "sm_clock": "SM clock window's top, MHz"}
LATENCIES = (("ttft", 50), ("ttft", 99), ("itl", 50), ("itl", 99))
CLIFF_COLOUR = STATUS_COLOURS["missed"]  # where latency starts to rise: past it the SLO is at risk
REFERENCE_COLOUR = NEUTRAL["ink"]  # the defaults
NO_CALIBRATION = (
    "No power calibration yet: sweep the stack's power limits and SM-clock windows with "
    "`phaselens calibrate --url ROUTER --token T --execute --db FILE` (the collector stopped, or on a "
    "copy), or a layout not deployed with `phaselens calibrate --simulate LAYOUT --db FILE`."
)


def _num(v: Any) -> float | None:
    x = as_float(v)
    return None if x != x else x


def trust_of(cal: Mapping[str, Any]) -> list[str]:
    """The calibration's trust labels (emulated, measured or simulated; host-bound where points were)."""
    got = cal.get("trust") or []
    return [str(t) for t in got] or (["simulated"] if cal.get("source") == "simulated" else ["measured"])


def modes_of(cal: Mapping[str, Any]) -> dict[str, Any]:
    """The calibration's choice per mode (``details.choice.modes``)."""
    return dict(((((cal.get("details") or {}).get("choice")) or {}).get("modes")) or {})


def knobs_swept(cal: Mapping[str, Any]) -> list[str]:
    """The knobs with at least one point other than the defaults, power limit first."""
    got = {str((p.get("setting") or {}).get("knob")) for p in cal.get("points") or []}
    return [k for k in ("power_limit", "sm_clock") if k in got]


def setting_x(setting: Mapping[str, Any], knob: str, bounds: Mapping[str, Any] | None = None) -> float | None:
    """Where a setting sits on ``knob``'s axis: its power limit (W) or its clock window's top (MHz);
    the defaults at the default power limit or the highest clock (from the stored ``bounds``)."""
    k = setting.get("knob") or "default"
    if k == knob == "power_limit":
        return _num(setting.get("power_limit_w"))
    if k == knob == "sm_clock":
        return _num(setting.get("sm_clock_max_mhz"))
    if k == "default":
        b = bounds or {}
        return _num(b.get("power_default_w") if knob == "power_limit" else b.get("sm_clock_max_mhz"))
    return None


def _is(setting: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    return (setting or {}).get("label") == (other or {}).get("label")


def curve_points(cal: Mapping[str, Any], knob: str) -> list[dict[str, Any]]:
    """The points of ``knob`` (and the defaults where the bounds place them) as ``x`` and figures,
    ordered along the axis."""
    bounds = (cal.get("details") or {}).get("bounds") or {}
    out = []
    for p in cal.get("points") or []:
        s = p.get("setting") or {}
        if (s.get("knob") or "default") not in (knob, "default"):
            continue
        x = setting_x(s, knob, bounds)
        if x is not None:
            out.append({"x": x, "setting": s, "figures": p.get("figures") or {}})
    return sorted(out, key=lambda p: p["x"])


def cliff_of(cal: Mapping[str, Any], knob: str) -> dict[str, Any] | None:
    """The cliff of ``knob`` (the first setting, going down, whose phase latency rose beyond noise)."""
    return (cal.get("cliff") or {}).get(knob)


def curve_figure(cal: Mapping[str, Any], knob: str) -> go.Figure:
    """Tokens/J (top) and TTFT / ITL p50 and p99 (bottom, ms) against ``knob``'s setting for one
    role's calibration: the defaults a diamond, the cliff a vertical line, each mode's setting named
    on the tokens/J curve; labelled with the calibration's trust."""
    role, phase = str(cal.get("role") or "?"), str(cal.get("phase") or cal.get("role") or "mixed")
    colour = PHASE_COLOURS.get(phase, PHASE_COLOURS["mixed"])
    pts = curve_points(cal, knob)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07, row_heights=[0.42, 0.58])
    hover = [
        f"{p['setting'].get('label')}<br>tokens/J {_num(p['figures'].get('tokens_per_j')) or 0:.4g} · "
        f"{_num(p['figures'].get('power_w')) or 0:.0f} W/GPU"
        + (" · host-bound" if p["figures"].get("host_bound") else "")
        for p in pts
    ]
    fig.add_trace(
        go.Scatter(
            x=[p["x"] for p in pts],
            y=[_num(p["figures"].get("tokens_per_j")) for p in pts],
            mode="lines+markers",
            name=f"{phase} tokens/J",
            line={"color": colour, "width": 2.5},
            marker={"color": colour, "size": 7},
            text=hover,
            hovertemplate="%{text}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for metric, pct in LATENCIES:
        ys = [_num(p["figures"].get(f"{metric}_p{pct}_s")) for p in pts]
        fig.add_trace(
            go.Scatter(
                x=[p["x"] for p in pts],
                y=[None if y is None else y * 1e3 for y in ys],
                mode="lines+markers",
                name=f"{metric.upper()} p{pct}",
                line={"color": TTFT_COLOUR if metric == "ttft" else ITL_COLOUR, "dash": PERCENTILE_DASH[pct]},
                marker={"size": 5},
                hovertemplate=f"{metric.upper()} p{pct} %{{y:.1f}} ms<extra></extra>",
            ),
            row=2,
            col=1,
        )
    ref = [p for p in pts if (p["setting"].get("knob") or "default") == "default"]
    if ref:
        fig.add_trace(
            go.Scatter(
                x=[p["x"] for p in ref],
                y=[_num(p["figures"].get("tokens_per_j")) for p in ref],
                mode="markers",
                name="defaults (the reference)",
                marker={
                    "symbol": "diamond-open",
                    "size": 13,
                    "color": REFERENCE_COLOUR,
                    "line": {"width": 2},
                },
                hovertemplate="defaults: tokens/J %{y:.4g}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    cliff = cliff_of(cal, knob)
    cliff_x = setting_x((cliff or {}).get("setting") or {}, knob)
    if cliff_x is not None:
        fig.add_vline(x=cliff_x, line={"color": CLIFF_COLOUR, "dash": "dash", "width": 1.5}, row="all", col=1)
        fig.add_annotation(
            name="cliff",
            x=cliff_x,
            y=1.0,
            xref="x",
            yref="paper",
            text=f"cliff: {cliff['setting'].get('label')}, latency +{_num(cliff.get('rise_pct')) or 0:.0f} %",
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font={"color": CLIFF_COLOUR, "size": 11},
            bgcolor=NEUTRAL["label_bg"],
        )
    _mark_modes(fig, cal, knob, pts)
    apply_layout(
        fig,
        f"{role} ({phase}) — {KNOB_NAMES.get(knob, knob)}: tokens/J and latency",
        height=460,
        legend_y=-0.16,
    )
    fig.update_yaxes(title_text="tokens/J", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="latency, ms", row=2, col=1, rangemode="tozero")
    fig.update_xaxes(title_text=AXIS_TITLES.get(knob, knob), row=2, col=1)
    return label_figure(fig, trust_of(cal))


def _mark_modes(fig: go.Figure, cal: Mapping[str, Any], knob: str, pts: list[dict[str, Any]]) -> None:
    """Each mode's setting on this knob named above its tokens/J point (modes sharing one, together)."""
    names: dict[str, list[str]] = {}
    for mode, m in modes_of(cal).items():
        if m.get("keep_defaults") or m.get("knob") != knob:
            continue
        names.setdefault(str((m.get("setting") or {}).get("label")), []).append(MODE_NAMES.get(mode, mode))
    for p in pts:
        got = names.get(str(p["setting"].get("label")))
        y = _num(p["figures"].get("tokens_per_j"))
        if got and y is not None:
            fig.add_annotation(
                name="mode",
                x=p["x"],
                y=y,
                xref="x",
                yref="y",
                text="<b>" + " · ".join(got) + "</b>",
                showarrow=True,
                arrowhead=0,
                ax=0,
                ay=-26,
                font={"size": 11, "color": NEUTRAL["ink_dark"]},
                bgcolor=NEUTRAL["label_bg"],
            )


def _phase_latency_change(m: Mapping[str, Any], phase: str) -> float | None:
    keys = {"prefill": ("ttft_p50_s", "ttft_p99_s"), "decode": ("itl_p50_s", "itl_p99_s")}.get(
        phase, ("ttft_p50_s", "itl_p50_s", "ttft_p99_s", "itl_p99_s")
    )
    got = [_num((m.get("latency_change_pct") or {}).get(k)) for k in keys]
    got = [g for g in got if g is not None]
    return max(got) if got else None


def status_text(cal: Mapping[str, Any]) -> str:
    """``current``, ``STALE — why (not offered)`` or ``incomplete``."""
    if cal.get("stale"):
        return f"STALE — {cal.get('stale_reason') or 'the stack changed'} (not offered)"
    return str(cal.get("status") or "?")


def setpoint_rows(cals: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per calibration and mode: the phase, the knob and setting, the tokens/J, power and phase
    latency changes, the kWh and $ a year it saves on the role's GPUs, the confidence and whether
    the calibration is usable (a stale one is shown, marked, and not offered)."""
    rows = []
    for cal in cals:
        annual = cal.get("annual_by_mode") or {}
        conf = (cal.get("confidence") or {}).get("level") or "—"
        for mode in MODES:
            a, m = annual.get(mode) or {}, modes_of(cal).get(mode) or {}
            if not a and not m:
                continue
            keep = bool(a.get("keep_defaults", m.get("keep_defaults")))
            rows.append(
                {
                    "Role": cal.get("role"),
                    "Phase": cal.get("phase"),
                    "Mode": MODE_NAMES[mode],
                    "Knob": KNOB_NAMES.get(str(a.get("knob") or m.get("knob")), "—"),
                    "Setting": "keep the defaults" if keep else (a.get("setting") or "—"),
                    "Tokens/J": "—" if keep else signed_pct_text(a.get("tokens_per_j_gain_pct")),
                    "Power, W/GPU": "—" if keep else _w(a.get("power_w_change")),
                    "Phase latency": "—"
                    if keep
                    else signed_pct_text(_phase_latency_change(m, str(cal.get("phase")))),
                    "kWh/yr saved": whole_number_text(a.get("kwh_per_year")),
                    "$/yr saved": whole_usd_text(a.get("usd_per_year")),
                    "Confidence": conf,
                    "Status": status_text(cal),
                    "Trust": ", ".join(trust_of(cal)),
                    "Calibration": cal.get("calibration_id"),
                }
            )
    return rows


def _w(v: Any) -> str:
    x = _num(v)
    return "—" if x is None else f"{x:+.0f} W"


def newest_per_role(cals: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The newest calibration per (target, role) among complete ones (the list is newest first);
    incomplete ones only where a role has nothing else."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for cal in sorted(cals, key=lambda c: c.get("status") == "incomplete"):
        out.setdefault((str(cal.get("target")), str(cal.get("role"))), dict(cal))
    order = {"prefill": 0, "decode": 1, "mixed": 2}
    return sorted(out.values(), key=lambda c: (str(c.get("target")), order.get(str(c.get("role")), 9)))


# -- power recommendations -----------------------------------------------------------------------------


def stale_calibrations(rec: Mapping[str, Any], cals: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the recommendation must not be offered: each of its calibrations that is stale (``cals``:
    id → the calibration as the service lists it)."""
    ids = (((rec.get("details") or {}).get("inputs") or {}).get("calibrations")) or {}
    out = []
    for role, cid in ids.items():
        cal = cals.get(str(cid))
        if cal is not None and cal.get("stale"):
            out.append(f"{role}: calibration {cid} is stale — {cal.get('stale_reason')}")
    return out


def setting_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recommendation's setting per role: knob, setting, workers and its saving a year."""
    rows = []
    for role, s in (((rec.get("proposed") or {}).get("settings")) or {}).items():
        annual = s.get("annual") or {}
        rows.append(
            {
                "Role": role,
                "Phase": s.get("phase"),
                "Knob": KNOB_NAMES.get(str(s.get("knob")), str(s.get("knob"))),
                "Setting": (s.get("setting") or {}).get("label") or "defaults",
                "Workers": ", ".join(s.get("workers") or []),
                "kWh/yr saved": whole_number_text(annual.get("kwh_per_year")),
                "$/yr saved": whole_usd_text(annual.get("usd_per_year")),
                "Calibration": s.get("calibration_id"),
            }
        )
    return rows


def best_power_recommendation(recs: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The proposed power recommendation saving the most a year (its ``est_cost_change_usd_per_h``),
    else the newest power one."""
    power = [dict(r) for r in recs if r.get("kind") == "power"]
    proposed = [r for r in power if r.get("status") == "proposed"]
    if proposed:
        return min(proposed, key=lambda r: _num(r.get("est_cost_change_usd_per_h")) or 0.0)
    return power[0] if power else None


# -- what was applied: the guard, realised before/after ------------------------------------------------


def guard_rows(actions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The guard's verdicts on applied power settings, newest first: each guard window of an apply
    (passed or breached) and each lane the runtime guard released (``power_release``: which lane,
    why, the window's figures)."""
    rows = []
    for r in actions:
        action = r.get("action")
        if action not in ("guard", "power_release") or r.get("dry_run"):
            continue
        after, before = r.get("after") or {}, r.get("before") or {}
        if action == "power_release":
            window = before.get("window") or {}
            what = f"{after.get('role')} lane released"
        else:
            window = after.get("figures") or after
            what = "guard window " + ("passed" if r.get("status") == "applied" else "breached")
        att = _num(window.get("slo_attainment"))
        rows.append(
            {
                "ts_s": r.get("ts_s"),
                "Event": what,
                "Status": r.get("status"),
                "SLO attainment": "—" if att is None else f"{100 * att:.1f} %",
                "Requests": window.get("requests"),
                "Why": (r.get("message") or "").split("\n")[0],
                "Recommendation": r.get("recommendation_id"),
            }
        )
    return sorted(rows, key=lambda x: -(_num(x["ts_s"]) or 0.0))


def released_lanes(actions: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Lane (role) → why, of every lane the runtime guard released (``power_release`` applied)."""
    return {
        str((r.get("after") or {}).get("role")): (r.get("message") or "").split("\n")[0]
        for r in actions
        if r.get("action") == "power_release" and r.get("status") == "applied"
    }


# -- realised energy per token: the collector's measurements before and after the change -------------

MAX_AFTER_S = 3600.0  # the longest window compared on each side of the change
PHASE_ENERGY = (
    ("prefill", "prefill tokens/J (input tokens)", "j_per_input_token"),
    ("decode", "decode tokens/J (output tokens)", "j_per_output_token"),
)


def change_windows(actions: Iterable[Mapping[str, Any]], now_s: float) -> dict[str, float] | None:
    """The windows that compare an applied power setting with what ran before, from its audit rows:
    ``after`` from the first knob set (``set_device`` applied, not a dry run) to the rollback (or a
    released lane, or ``now_s``; at most :data:`MAX_AFTER_S`), ``before`` as long, just before the
    change. None when nothing was set or the after window is under a second."""
    rows = sorted((r for r in actions if not r.get("dry_run")), key=lambda r: _num(r.get("ts_s")) or 0.0)
    sets = [
        r for r in rows if r.get("action") == "set_device" and r.get("status") in ("applied", "rolled_back")
    ]
    if not sets:
        return None
    change = float(sets[0]["ts_s"])
    ends = [
        float(r["ts_s"])
        for r in rows
        if r.get("action") in ("rollback", "power_release") and (_num(r.get("ts_s")) or 0.0) > change
    ]
    end = min([now_s, change + MAX_AFTER_S, *ends])
    if end - change < 1.0:
        return None
    return {"before_start_s": change - (end - change), "change_s": change, "after_end_s": end}


LATENCY_ROWS = (("ttft", 50), ("ttft", 99), ("itl", 50), ("itl", 99))


def realised_rows(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Tokens per joule per phase and TTFT / ITL p50 and p99 before and after the change, each with
    its change, better or worse: from the analytics summaries of the two windows (the cost part's J per
    input / output token, the latency part's percentiles of the window's requests)."""

    def part(s: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
        return ((s or {}).get("parts") or {}).get(name) or {}

    def tpj(s: Mapping[str, Any] | None, key: str) -> float | None:
        j = _num((part(s, "cost").get("total") or {}).get(key))
        return 1.0 / j if j else None

    def ms(s: Mapping[str, Any] | None, metric: str, pct: int) -> float | None:
        v = _num(((part(s, "latency").get("percentiles") or {}).get(metric) or {}).get(f"p{pct}_s"))
        return None if v is None else v * 1e3

    figures = [(what, tpj(before, key), tpj(after, key), True) for _p, what, key in PHASE_ENERGY]
    figures += [
        (f"{m.upper()} p{pct}, ms", ms(before, m, pct), ms(after, m, pct), False) for m, pct in LATENCY_ROWS
    ]
    rows = []
    for what, b, a, higher in figures:
        change = (a / b - 1) * 100 if a is not None and b else None
        rows.append(
            {
                "Figure": what,
                "Before": "—" if b is None else f"{b:.4g}",
                "After": "—" if a is None else f"{a:.4g}",
                "Change": signed_pct_text(change),
                "": "—"
                if change is None or abs(change) < 0.05
                else "better"
                if (change > 0) == higher
                else "worse",
            }
        )
    return rows


def summary_trust(summary: Mapping[str, Any] | None) -> list[str]:
    """The labels of a summary's cost and latency parts (where the energy and the requests come from)."""
    parts = (summary or {}).get("parts") or {}
    return sorted(
        {
            str(t)
            for name in ("cost", "latency")
            for t in (((parts.get(name) or {}).get("trust") or {}).get("labels") or [])
        }
    )
