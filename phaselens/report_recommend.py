"""The reports' recommendation part (issue 22, item 7): the current best layout recommendation and
what it saves a year at its SLOs, whether the workload has drifted since it was made (so that it is
stale), and the auto-apply policy's decisions in the report's window.

Staleness: the workload the recommendation was made on — the stored workload named by its
``details.inputs.workload_id``, else the newest stored observed workload before it
(``analytics.workload.stored``) — against the workload observed in the report's window
(``analytics.workload.observe``), by ``analytics.workload.workload_drift`` (stale at a score ≥ 1,
with a sentence per component). Read on the report's connection (the store's reader).
"""

from __future__ import annotations

import json
from typing import Any

from dashboard.figures import recommend as rf

_COLUMNS = (
    "recommendation_id, ts_s, kind, target, current, proposed, rationale, est_tokens_per_j_change_pct, "
    "est_latency_change_pct, est_cost_change_usd_per_h, status, details"
)
DECISIONS = ("auto_apply", "auto_apply_skip")


def _decode(names: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    item = dict(zip(names, row, strict=True))
    for k in ("current", "proposed", "details"):
        if isinstance(item.get(k), str):
            item[k] = json.loads(item[k])
    return item


def proposed_recommendations(con: Any) -> list[dict[str, Any]]:
    """Every proposed layout recommendation (details included), newest first."""
    got = con.execute(
        f"SELECT {_COLUMNS} FROM recommendations WHERE kind = 'layout' AND status = 'proposed' ORDER BY ts_s DESC"
    )
    names = [d[0] for d in got.description]
    return [_decode(names, r) for r in got.fetchall()]


def staleness(con: Any, rec: dict[str, Any], window: Any, dataset: str) -> dict[str, Any]:
    """Whether ``rec`` was made on a workload the report's ``window`` has drifted from: ``checked``,
    ``stale``, ``score``, ``reasons``, ``workload_id`` (the one compared with) and ``text``."""
    from analytics.window import AnalyticsError
    from analytics.workload import observe, workload_drift
    from analytics.workload.stored import latest_observed, load_workload

    inputs = rf.details_of(rec).get("inputs") or {}
    wid = inputs.get("workload_id")
    try:
        if wid:
            old = load_workload(con, str(wid))
        else:
            found = latest_observed(con, dataset=dataset, before_s=float(rec["ts_s"]) + 1e-6)
            if found is None:
                found = latest_observed(con, before_s=float(rec["ts_s"]) + 1e-6)
            if found is None:
                return {
                    "checked": False,
                    "stale": None,
                    "text": "not checked: no stored workload to compare with (the recommendation names none, and "
                    "none was stored before it: `phaselens workload --save` stores one)",
                }
            wid, old = found
        new = observe(con, window)
    except AnalyticsError as e:
        return {"checked": False, "stale": None, "workload_id": wid, "text": f"not checked: {e}"}
    drift = workload_drift(old, new)
    verdict = (
        f"STALE: the workload has drifted since the recommendation was made (score {drift.score:.2f} ≥ 1); "
        "make a new one"
        if drift.stale
        else f"still current: the workload has not drifted enough to matter (score {drift.score:.2f} < 1)"
    )
    return {
        "checked": True,
        "stale": drift.stale,
        "score": drift.score,
        "reasons": drift.reasons,
        "workload_id": wid,
        "text": verdict,
    }


def decisions_in(con: Any, start_s: float, end_s: float) -> list[dict[str, Any]]:
    """The auto-apply policy's decisions (applied, skipped and why) in ``[start_s, end_s)``, oldest first."""
    rows = con.execute(
        "SELECT ts_s, action, recommendation_id, dry_run, message FROM actions "
        "WHERE action IN ('auto_apply', 'auto_apply_skip') AND ts_s >= ? AND ts_s < ? ORDER BY ts_s",
        [start_s, end_s],
    ).fetchall()
    return [
        {
            "ts_s": r[0],
            "decision": "applied" if r[1] == "auto_apply" else "skipped",
            "recommendation_id": r[2],
            "dry_run": bool(r[3]),
            "why": r[4],
        }
        for r in rows
    ]


def recommendation_part(con: Any, params: dict[str, Any], window: Any) -> dict[str, Any]:
    """The part (module docstring): ``best`` (id, target, layouts, SLOs, confidence, rationale, or
    None), ``annual_saving_usd``, ``headline`` (the Overview's sentence), ``staleness`` and
    ``auto_apply`` (the decisions in the window)."""
    dataset = str(params.get("dataset") or "live")
    recs = proposed_recommendations(con)
    best = rf.best_recommendation(recs, dataset)
    part: dict[str, Any] = {
        "best": None,
        "annual_saving_usd": None,
        "headline": rf.headline_text(None),
        "staleness": None,
        "auto_apply": decisions_in(con, window.start_s, window.end_s),
        "trust": ["simulated"],
    }
    if best is None:
        return part
    rec = dict(best)
    target = str(rec.get("target") or "")
    other = None if rf.is_for_dataset(target, dataset) else target
    conf = rf.details_of(rec).get("confidence") or {}
    part |= {
        "best": {
            "recommendation_id": rec["recommendation_id"],
            "ts_s": rec["ts_s"],
            "target": target,
            "current": rf.current_layout(rec),
            "proposed": rf.proposed_layout(rec),
            "stay": rf.is_stay(rec),
            "rationale": rec.get("rationale"),
            "slo": rf.slo_text(rec),
            "confidence": {"level": conf.get("level"), "text": rf.confidence_text(rec)},
            "fleet_gpus": (rf.details_of(rec).get("inputs") or {}).get("fleet_gpus"),
        },
        "annual_saving_usd": rf.annual_saving_usd(rec),
        "headline": rf.headline_text(rec, target_note=other),
        "staleness": staleness(con, rec, window, dataset),
    }
    return part
