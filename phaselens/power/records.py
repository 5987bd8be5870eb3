"""``power_calibrations`` rows (migration 15) and the ``power`` recommendation made from them.

A calibration row is one role's sweep: its key (GPU model, driver, engine fingerprint, phase), every
point, the reference, the noise, the cliff and the choice per mode. :func:`usable_calibrations`
reads back the newest row per role for a stack and marks every ``current`` row whose fingerprint no
longer matches the running stack ``stale`` (never used again). :func:`power_recommendation` turns the
choices of one mode into a ``recommendations`` row of kind ``power`` (the layout recommendations'
table, API and apply flow), with its predicted kWh and $ a year and its confidence.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from collector.store.updates import update_row
from phaselens.power.fingerprint import Fingerprint, stale_reason
from phaselens.power.plan import DEFAULT

HOURS_PER_YEAR = 8760.0
_JSON = ("reference", "cliff", "points", "trust", "details")


def new_id(prefix: str) -> str:
    return f"{prefix}-{int(time.time())}-{secrets.token_hex(3)}"


def calibration_row(
    *,
    node: str,
    source: str,
    target: str,
    fingerprint: Fingerprint,
    role: str,
    phase: str,
    result: dict[str, Any],
    analysis: dict[str, Any] | None,
    duration_s: float,
    trust: list[str],
    details: dict[str, Any],
) -> dict[str, Any]:
    """One role's sweep as a ``power_calibrations`` row (status ``current``, or ``incomplete`` when the
    sweep stopped early or measured no reference)."""
    complete = bool(result.get("complete")) and analysis is not None
    return {
        "calibration_id": new_id("cal"),
        "node": node,
        "ts_s": time.time(),
        "source": source,
        "target": target,
        **{k: v for k, v in fingerprint.as_dict().items()},
        "role": role,
        "phase": phase,
        "status": "current" if complete else "incomplete",
        "duration_s": duration_s,
        "noise_pct": analysis["noise_pct"] if analysis else None,
        "reference": analysis["reference"] if analysis else None,
        "cliff": analysis["cliff"] if analysis else None,
        "points": result["points"],
        "trust": trust,
        "details": details
        | {
            "workers": result.get("workers"),
            "stopped": result.get("stopped"),
            "choice": {k: v for k, v in (analysis or {}).items() if k not in ("reference", "cliff")},
            "confidence": calibration_confidence(analysis, trust),
        },
    }


def calibration_confidence(analysis: dict[str, Any] | None, trust: list[str]) -> dict[str, Any]:
    """How far one role's calibration can be trusted: ``low`` where its reference runs were host-bound
    (the client latency measured the host's CPU; the cliff then judged on the modelled time, or not
    called), or simulated; else by the noise between the reference runs (high ≤ 5 %, medium ≤ 15 %)."""
    if analysis is None:
        return {"level": "low", "reason": "no reference measured: no analysis"}
    if analysis.get("cliff_basis", "client") != "client":
        return {"level": "low", "reason": analysis.get("cliff_note") or "host-bound reference runs"}
    if "simulated" in trust:
        return {"level": "low", "reason": "simulated only: the GPU model's curves"}
    noise = analysis.get("noise_pct") or 0.0
    level = "high" if noise <= 5 else "medium" if noise <= 15 else "low"
    return {"level": level, "reason": f"latency noise {noise:.1f} % between the reference runs"}


def save_calibrations(store: Any, rows: list[dict[str, Any]]) -> list[str]:
    """Append the rows and commit them (run on the store's writer); their ids."""
    store.append("power_calibrations", rows)
    store.flush()
    return [r["calibration_id"] for r in rows]


def _decode(names: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(names, row, strict=True))
    for k in _JSON:
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


def list_calibrations(store: Any, *, target: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Stored calibrations, newest first (``target`` filters)."""
    where, params = ("WHERE target = ?", [target]) if target else ("", [])
    with store.reader() as cur:
        got = cur.execute(
            f"SELECT * FROM power_calibrations {where} ORDER BY ts_s DESC LIMIT ?", [*params, limit]
        )
        names = [d[0] for d in got.description]
        rows = got.fetchall()
    return [_decode(names, r) for r in rows]


def usable_calibrations(
    store: Any,
    target: str,
    current: dict[str, Fingerprint],
    *,
    writer: Callable[[Callable[[], Any]], Any] | None = None,
) -> tuple[dict[str, dict[str, Any]], list[dict[str, str]]]:
    """The newest ``current`` calibration per role of ``current`` (role → the running stack's
    fingerprint) for ``target``; every ``current`` row of those roles whose fingerprint differs is
    marked ``stale`` on the store (through ``writer``) and left out. (usable by role, the stale ones:
    id, role, reason)."""
    write = writer or (lambda fn: fn())
    usable: dict[str, dict[str, Any]] = {}
    stale: list[dict[str, str]] = []
    for row in list_calibrations(store, target=target, limit=10_000):
        role = row["role"]
        if role not in current or row["status"] != "current":
            continue
        why = stale_reason(row, current[role])
        if why is not None:
            cid = row["calibration_id"]
            write(lambda cid=cid: update_row(store, "power_calibrations", cid, {"status": "stale"}))
            stale.append({"calibration_id": cid, "role": role, "reason": why})
            continue
        usable.setdefault(role, row)  # newest first
    return usable, stale


def role_gpus(row: dict[str, Any]) -> int:
    """The GPUs a calibration's role runs on: ``details.gpus`` where the sweep knows it (a simulated
    layout's pool: replicas × TP), else one per worker of the live stack."""
    details = row.get("details") or {}
    return int(details.get("gpus") or len(details.get("workers") or []) or 1)


def annual_saving(power_w_change: float | None, gpus: int, prices: Any) -> dict[str, float | None]:
    """kWh and $ a year saved by ``power_w_change`` (W per GPU, negative = less power) on ``gpus`` GPUs
    at the same load, the facility's PUE and electricity price included."""
    if power_w_change is None:
        return {"kwh_per_year": None, "usd_per_year": None}
    kwh = -power_w_change * gpus * HOURS_PER_YEAR / 1000.0
    return {
        "kwh_per_year": round(kwh, 1),
        "usd_per_year": round(kwh * prices.pue * prices.electricity_usd_per_kwh, 2),
    }


def confidence(
    rows: dict[str, dict[str, Any]], mode: str, sim_check: dict[str, Any] | None
) -> dict[str, Any]:
    """How sure: measured (emulated/real) vs simulated only; the noise between the reference runs;
    host-bound points; and, where given, the GPU model's prediction of the same settings against what
    was measured (``sim_check``: role → predicted and measured tokens/J gain, %)."""
    simulated = any(r["source"] == "simulated" for r in rows.values())
    noise = max((r.get("noise_pct") or 0.0) for r in rows.values()) if rows else 0.0
    host_bound = sum(1 for r in rows.values() for p in r["points"] if p["figures"].get("host_bound"))
    bound_refs = {
        role: choice.get("cliff_note") or "host-bound reference runs"
        for role, r in rows.items()
        if (choice := (r.get("details") or {}).get("choice") or {}).get("cliff_basis", "client") != "client"
    }
    notes = []
    if simulated:
        level, text = "low", "simulated only: the GPU model's curves, not measured on this fleet"
    elif bound_refs:
        level = "low"
        text = "measured on a host-bound stack: " + "; ".join(f"{r}: {why}" for r, why in bound_refs.items())
    else:
        level = "high" if noise <= 5 else "medium" if noise <= 15 else "low"
        text = f"measured on the stack: latency noise {noise:.1f} % between the reference runs"
        if host_bound:
            level = "medium" if level == "high" else level
            notes.append(
                f"{host_bound} points host-bound (the host could not keep pace with the emulated GPU)"
            )
    worst = None
    if sim_check:
        errs = [abs(v["error_pp"]) for v in sim_check.values() if v.get("error_pp") is not None]
        worst = max(errs) if errs else None
        if worst is not None:
            text += f"; the GPU model predicts the tokens/J gain within {worst:.1f} points"
            if worst > 15 and level == "high":
                level = "medium"
    return {"level": level, "text": text, "noise_pct": noise, "model_vs_measured": sim_check, "notes": notes}


def power_recommendation(
    *,
    node: str,
    target: str,
    rows: dict[str, dict[str, Any]],
    mode: str,
    before: dict[str, dict[str, Any]],
    prices: Any,
    sim_check: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``recommendations`` row (kind ``power``) of ``mode``'s choice per role; ``before``: worker →
    its knobs now (what a rollback restores)."""
    settings: dict[str, Any] = {}
    current: dict[str, Any] = {}
    predicted: dict[str, Any] = {}
    kwh = usd = 0.0
    tpj_gains, lat_changes = [], []
    lines = []
    slo_ttft = slo_itl = None
    for role, row in rows.items():
        choice = row["details"]["choice"]
        m = choice["modes"][mode]
        workers = row["details"]["workers"] or []
        current[role] = {"workers": workers, "knobs": {w: before.get(w) for w in workers}}
        settings[role] = {
            "phase": row["phase"],
            "knob": m["knob"],
            "setting": m["setting"],
            "workers": workers,
            "calibration_id": row["calibration_id"],
        }
        slo = choice.get("slo") or {}
        slo_ttft = max(filter(None, [slo_ttft, slo.get("ttft_p99_s")]), default=None)
        slo_itl = max(filter(None, [slo_itl, slo.get("itl_p99_s")]), default=None)
        if m.get("keep_defaults"):
            lines.append(f"{role}: keep the defaults ({m['reason']})")
            continue
        saving = annual_saving(m.get("power_w_change"), role_gpus(row), prices)
        settings[role]["annual"] = saving
        kwh += saving["kwh_per_year"] or 0.0
        usd += saving["usd_per_year"] or 0.0
        if m.get("tokens_per_j_gain_pct") is not None:
            tpj_gains.append(m["tokens_per_j_gain_pct"])
        lat = [v for v in (m.get("latency_change_pct") or {}).values() if v is not None]
        lat_changes.append(max(lat) if lat else 0.0)
        f = m["figures"]
        predicted[role] = {
            k: f.get(k)
            for k in ("ttft_p90_s", "output_tokens_per_s_per_gpu", "j_per_token", "tokens_per_j", "power_w")
        }
        lines.append(
            f"{role} ({row['phase']}): {m['setting']['label']} — tokens/J {m['tokens_per_j_gain_pct']:+.1f} %, "
            f"power {m['power_w_change']:+.0f} W/GPU, phase latency "
            f"{max(lat) if lat else 0:+.1f} %"
        )
    changed = any(s["setting"].get("knob", DEFAULT) != DEFAULT for s in settings.values())
    conf = confidence(rows, mode, sim_check)
    trust = sorted({t for r in rows.values() for t in (r.get("trust") or [])})
    return {
        "recommendation_id": new_id("rec"),
        "node": node,
        "ts_s": time.time(),
        "kind": "power",
        "target": target,
        "current": current,
        "proposed": {"mode": mode, "settings": settings, "changes": changed},
        "rationale": f"{mode.upper()} mode: "
        + "; ".join(lines)
        + (f". Saves {kwh:,.0f} kWh (${usd:,.0f}) a year at the calibrated load." if changed else "."),
        "est_tokens_per_j_change_pct": max(tpj_gains) if tpj_gains else 0.0,
        "est_latency_change_pct": max(lat_changes) if lat_changes else 0.0,
        "est_cost_change_usd_per_h": -usd / HOURS_PER_YEAR,
        "status": "proposed",
        "details": {
            "inputs": {
                # the apply guard judges per-request TTFT and TPOT against these (serving.sim.summary.slo_meets)
                "slo": {"ttft_s": slo_ttft, "tpot_s": slo_itl, "target": 0.9},
                "calibrations": {r: row["calibration_id"] for r, row in rows.items()},
                "mode": mode,
            },
            "predicted": _merge_predicted(predicted),
            "annual": {"kwh_per_year": round(kwh, 1), "usd_per_year": round(usd, 2)},
            "modes": {r: row["details"]["choice"]["modes"] for r, row in rows.items()},
            "confidence": conf,
            "trust": trust,
            "gpu_models": {
                r: {"gpu_model": row["gpu_model"], "driver": row["driver"]} for r, row in rows.items()
            },
        },
    }


def _merge_predicted(by_role: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The stack-wide figures the apply compares after its guard window (the last role's measured
    point: every role's knob was measured with the others at their defaults)."""
    if not by_role:
        return None
    out: dict[str, Any] = {"by_role": by_role}
    for role in ("decode", "mixed", "prefill"):
        if role in by_role:
            out |= {
                k: v
                for k, v in by_role[role].items()
                if k in ("ttft_p90_s", "output_tokens_per_s_per_gpu", "j_per_token")
            }
            break
    return out
