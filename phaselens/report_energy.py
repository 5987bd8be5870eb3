"""The reports' energy part (issue 24, item 5): energy per token per phase in the report's window, and
what the per-phase power settings save — realised by those applied, or available if the best proposed
one were applied — in kWh, $ and tokens/J.

- **Per phase** (the summary's cost part, ``analytics.cost``): prefill J per input token and decode J per
  output token, all-in (with the phase's share of idle and overhead energy) and busy (the phase's own
  energy only), the tokens per joule, overall and per pool; the cost part's trust labels.
- **Realised**: each applied ``power`` recommendation, from its audit rows: the live GPUs' energy per
  token per phase (the cost analysis of the collector's measurements) from the change (its first knob
  set) to the report's end, a rollback or a released lane (at most an hour) against as long just
  before it; the tokens/J change per phase and a year of the energy saved at the after window's token
  rates (kWh, × PUE × $/kWh for $). The change carries the measurements' labels (``emulated`` or
  ``measured``), the year is an extrapolation (``estimated``). A lane the runtime guard released is
  named.
- **Available**: the best proposed ``power`` recommendation made only from calibrations the store still
  holds current: its predicted kWh and $ a year, tokens/J and latency change, confidence and trust.

Read on the report's connection (the store's reader), like ``phaselens/report_recommend.py``.
"""

from __future__ import annotations

import json
from typing import Any

from analytics.prices import load_prices

SECONDS_PER_YEAR = 8760.0 * 3600.0
PHASE_FIGURES = (
    "j_per_input_token",
    "j_per_input_token_busy",
    "input_tokens_per_j",
    "j_per_output_token",
    "j_per_output_token_busy",
    "output_tokens_per_j",
    "j_per_token",
)
_PRICE_KEYS = ("electricity_usd_per_kwh", "pue")


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x and abs(x) != float("inf") else None


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v


def per_phase(summary: dict[str, Any]) -> dict[str, Any]:
    """Energy per token per phase, overall (``total``) and per pool (``by_pool``), from the cost part."""
    cost = (summary.get("parts") or {}).get("cost") or {}
    total = cost.get("total") or {}
    pools = [
        {"pool": p.get("pool")} | {k: _num(p.get(k)) for k in PHASE_FIGURES}
        for p in cost.get("by_pool") or []
        if p.get("pool") is not None
    ]
    return {
        "total": {k: _num(total.get(k)) for k in PHASE_FIGURES},
        "by_pool": pools,
        "trust": list(((cost.get("trust") or {}).get("labels")) or []),
    }


def _power_recs(con: Any, status: str) -> list[dict[str, Any]]:
    got = con.execute(
        "SELECT recommendation_id, ts_s, target, proposed, rationale, est_tokens_per_j_change_pct, "
        "est_latency_change_pct, est_cost_change_usd_per_h, status, details FROM recommendations "
        "WHERE kind = 'power' AND status = ? ORDER BY ts_s DESC",
        [status],
    )
    names = [d[0] for d in got.description]
    out = []
    for r in got.fetchall():
        item = dict(zip(names, r, strict=True))
        item["proposed"], item["details"] = _json(item["proposed"]), _json(item["details"]) or {}
        out.append(item)
    return out


def _phase_energy(con: Any, start_s: float, end_s: float, params: dict[str, Any]) -> dict[str, Any]:
    """The live data's J per input / output token and token counts over [start_s, end_s) (the cost
    analysis), with its trust labels."""
    from analytics.reads import run_summary

    prices = {k: params[k] for k in _PRICE_KEYS if params.get(k) is not None}
    summary = run_summary(con, {"dataset": "live", "start_s": start_s, "end_s": end_s} | prices)
    cost = (summary.get("parts") or {}).get("cost") or {}
    total = cost.get("total") or {}
    return {
        k: _num(total.get(k))
        for k in ("j_per_input_token", "j_per_output_token", "input_tokens", "output_tokens")
    } | {"trust": list(((cost.get("trust") or {}).get("labels")) or [])}


def realised(con: Any, prices: Any, params: dict[str, Any], end_s: float) -> list[dict[str, Any]]:
    """Per applied power recommendation: the energy per token per phase after the change against as
    long before it (the collector's measurements of the live GPUs, ``dashboard.figures.power.
    change_windows`` of its audit rows, up to ``end_s``), the tokens/J change and a year of it."""
    from dashboard.figures.power import change_windows

    out = []
    for rec in _power_recs(con, "applied"):
        rid = rec["recommendation_id"]
        got = con.execute(
            "SELECT ts_s, action, status, dry_run, after, message FROM actions WHERE recommendation_id = ? "
            "ORDER BY ts_s",
            [rid],
        ).fetchall()
        rows = [
            {
                "ts_s": r[0],
                "action": r[1],
                "status": r[2],
                "dry_run": bool(r[3]),
                "after": _json(r[4]),
                "message": r[5],
            }
            for r in got
        ]
        windows = change_windows(rows, end_s)
        if windows is None:
            continue
        before = _phase_energy(con, windows["before_start_s"], windows["change_s"], params)
        after = _phase_energy(con, windows["change_s"], windows["after_end_s"], params)
        span_s = windows["after_end_s"] - windows["change_s"]
        phases, saved_j_per_s = {}, 0.0
        for phase, key, tokens in (
            ("prefill", "j_per_input_token", "input_tokens"),
            ("decode", "j_per_output_token", "output_tokens"),
        ):
            jb, ja = before[key], after[key]
            rate = (after[tokens] or 0.0) / span_s
            phases[phase] = {
                "j_per_token_before": jb,
                "j_per_token_after": ja,
                "tokens_per_j_change_pct": (jb / ja - 1) * 100 if jb and ja else None,
                "tokens_per_s": rate,
            }
            if jb and ja:
                saved_j_per_s += (jb - ja) * rate
        kwh = (
            saved_j_per_s * SECONDS_PER_YEAR / 3.6e6
            if any(p["j_per_token_after"] for p in phases.values())
            else None
        )
        released = [
            f"{(r['after'] or {}).get('role')} lane released {_utc(r['ts_s'])} UTC: {(r['message'] or '').splitlines()[0]}"
            for r in rows
            if r["action"] == "power_release" and r["status"] == "applied"
        ]
        out.append(
            {
                "recommendation_id": rid,
                "target": rec["target"],
                "mode": (rec["proposed"] or {}).get("mode"),
                "change_s": windows["change_s"],
                "window_s": span_s,
                "phases": phases,
                "kwh_per_year": kwh,
                "usd_per_year": None if kwh is None else kwh * prices.pue * prices.electricity_usd_per_kwh,
                "trust": sorted(set(before["trust"]) | set(after["trust"])),
                "annual_trust": ["estimated"],
                "released": released,
            }
        )
    return out


def _utc(ts_s: Any) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(float(ts_s), UTC).strftime("%Y-%m-%d %H:%M")


def available(con: Any) -> dict[str, Any] | None:
    """The best proposed power recommendation whose calibrations are all still current (the most $ a
    year), with why the others were passed over; None when there is none."""
    status = {
        r[0]: r[1] for r in con.execute("SELECT calibration_id, status FROM power_calibrations").fetchall()
    }
    usable, passed = [], []
    for rec in _power_recs(con, "proposed"):
        ids = ((rec["details"].get("inputs") or {}).get("calibrations")) or {}
        bad = [
            f"{role}: calibration {cid} is {status.get(cid, 'gone')}"
            for role, cid in ids.items()
            if status.get(cid) != "current"
        ]
        if bad:
            passed.append({"recommendation_id": rec["recommendation_id"], "why": "; ".join(bad)})
        elif (rec["proposed"] or {}).get("changes", True):
            usable.append(rec)
    if not usable:
        return {"best": None, "passed_over": passed} if passed else None
    best = max(usable, key=lambda r: _num((r["details"].get("annual") or {}).get("usd_per_year")) or 0.0)
    d = best["details"]
    conf = d.get("confidence") or {}
    return {
        "best": {
            "recommendation_id": best["recommendation_id"],
            "ts_s": best["ts_s"],
            "target": best["target"],
            "mode": (best["proposed"] or {}).get("mode"),
            "rationale": best["rationale"],
            "kwh_per_year": _num((d.get("annual") or {}).get("kwh_per_year")),
            "usd_per_year": _num((d.get("annual") or {}).get("usd_per_year")),
            "tokens_per_j_change_pct": _num(best["est_tokens_per_j_change_pct"]),
            "latency_change_pct": _num(best["est_latency_change_pct"]),
            "confidence": {"level": conf.get("level"), "text": conf.get("text")},
            "trust": list(d.get("trust") or []),
        },
        "passed_over": passed,
    }


def energy_part(con: Any, params: dict[str, Any], summary: dict[str, Any], end_s: float) -> dict[str, Any]:
    """The part (module docstring): ``per_phase``, ``realised`` (changes made before ``end_s``, the
    report's end), ``available`` and the ``prices`` used."""
    prices = load_prices(**{k: float(params[k]) for k in _PRICE_KEYS if params.get(k) is not None})
    return {
        "per_phase": per_phase(summary),
        "realised": realised(con, prices, params, end_s),
        "available": available(con),
        "prices": {"electricity_usd_per_kwh": prices.electricity_usd_per_kwh, "pue": prices.pue},
    }
