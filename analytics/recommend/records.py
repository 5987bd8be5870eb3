"""Recommendations in the store: the ``recommendations`` row of a :class:`Recommendation` (the shared
contract of issue 22, docs/RECOMMENDATIONS.md), writing it (an older ``proposed`` row for the same
target becomes ``superseded``), listing and reading them back.

Writes run on the store's writer: the collector's writer thread (``Collector.submit``) or the
process holding the file (``phaselens recommend --db``).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from analytics.jsonable import json_safe
from analytics.recommend.choose import Recommendation
from analytics.recommend.inputs import RecommendError
from serving.sim.layout import parse_layout

STATUSES = ("proposed", "applied", "rolled_back", "dismissed", "superseded")
_JSON = ("current", "proposed", "details")


def new_id(now_s: float | None = None) -> str:
    """``rec-<unix seconds>-<6 hex>``."""
    return f"rec-{int(now_s if now_s is not None else time.time())}-{secrets.token_hex(3)}"


def _layout_json(text: str, model: str) -> dict[str, Any]:
    layout = parse_layout(text)
    return {"layout": text, "describe": layout.describe(), "model": model, "gpus": layout.gpus}


def recommendation_row(
    rec: Recommendation, *, node: str, target: str | None = None, now_s: float | None = None
) -> dict[str, Any]:
    """The ``recommendations`` row of ``rec`` (status ``proposed``)."""
    now = time.time() if now_s is None else now_s
    inputs = rec.inputs
    details = {
        "inputs": inputs.to_dict(),
        "predicted": rec.predicted,
        "current_predicted": rec.current_predicted,
        "measured": rec.measured,
        "confidence": rec.confidence,
        "bottleneck": rec.bottleneck,
        "candidates": rec.candidates,
        "same_budget": rec.result.same_budget.layout if rec.result.same_budget else None,
        "least_budget": rec.result.least_budget.layout if rec.result.least_budget else None,
        "stay": rec.stay,
        "search": {
            "wall_s": rec.result.wall_s,
            "simulations": rec.result.sims,
            "slice": rec.result.slice_desc,
            "notes": rec.result.notes,
        },
        "trust": rec.trust,
    }
    return {
        "recommendation_id": new_id(now),
        "node": node,
        "ts_s": now,
        "kind": "layout",
        "target": target or inputs.target,
        "current": _layout_json(inputs.current, inputs.model),
        "proposed": _layout_json(rec.proposed.layout, inputs.model),
        "rationale": rec.rationale,
        "est_tokens_per_j_change_pct": rec.est_tokens_per_j_change_pct,
        "est_latency_change_pct": rec.est_latency_change_pct,
        "est_cost_change_usd_per_h": rec.est_cost_change_usd_per_h,
        "status": "proposed",
        "details": json_safe(details),
    }


def save_recommendation(store: Any, row: dict[str, Any]) -> str:
    """Append ``row`` and commit it; older ``proposed`` rows for its target become ``superseded``
    (run on the store's writer). Returns the id."""
    store.append("recommendations", [row])
    store.flush()
    with store.transaction() as con:
        con.execute(
            "UPDATE recommendations SET status = 'superseded' "
            "WHERE kind = ? AND target = ? AND status = 'proposed' AND recommendation_id <> ?",
            [row["kind"], row["target"], row["recommendation_id"]],
        )
    return str(row["recommendation_id"])


_COLUMNS = (
    "recommendation_id, node, ts_s, kind, target, current, proposed, rationale, est_tokens_per_j_change_pct, "
    "est_latency_change_pct, est_cost_change_usd_per_h, status"
)


def _decode(names: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    item = dict(zip(names, row, strict=True))
    for k in _JSON:
        if isinstance(item.get(k), str):
            item[k] = json.loads(item[k])
    return item


def list_recommendations(store: Any, *, status: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Stored recommendations, newest first, without ``details`` (``status`` filters)."""
    if status is not None and status not in STATUSES:
        raise RecommendError(f"status must be one of {', '.join(STATUSES)}, got {status!r}", "status")
    where, params = ("WHERE status = ?", [status]) if status else ("", [])
    with store.reader() as cur:
        rows = cur.execute(
            f"SELECT {_COLUMNS} FROM recommendations {where} ORDER BY ts_s DESC LIMIT ?", [*params, limit]
        ).fetchall()
        names = [d[0] for d in cur.description]
    return [_decode(names, r) for r in rows]


def get_recommendation(store: Any, recommendation_id: str) -> dict[str, Any]:
    """One stored recommendation with its ``details``; RecommendError when none has that id."""
    with store.reader() as cur:
        row = cur.execute(
            f"SELECT {_COLUMNS}, details FROM recommendations WHERE recommendation_id = ?",
            [recommendation_id],
        ).fetchone()
        names = [d[0] for d in cur.description]
    if row is None:
        raise RecommendError(f"no recommendation {recommendation_id!r}", "recommendation_id")
    return _decode(names, row)
