"""Recommendation rows per the issue-22 contract, for the apply tests and bench/apply_live.py (test
input: the recommender writes these in production)."""

from __future__ import annotations

import secrets
import time
from typing import Any

from serving.sim.layout import parse_layout


def recommendation_row(
    stack_url: str,
    current: str,
    proposed: str,
    *,
    slo: dict[str, float] | None = None,
    predicted: dict[str, Any] | None = None,
    status: str = "proposed",
    kind: str = "layout",
    confidence: str = "high",
    saving_usd_per_h: float = 1.0,
    node: str = "test",
) -> dict[str, Any]:
    """A ``recommendations`` row for the bundled stack at ``stack_url``: ``current`` → ``proposed``."""
    cur, prop = parse_layout(current), parse_layout(proposed)
    return {
        "recommendation_id": f"rec-{int(time.time())}-{secrets.token_hex(3)}",
        "node": node,
        "ts_s": time.time(),
        "kind": kind,
        "target": f"stack:{stack_url}",
        "current": {"layout": current, "describe": cur.describe()},
        "proposed": {
            "layout": proposed,
            "describe": prop.describe(),
            "model": "llama-3.1-70b",
            "gpus": prop.gpus,
        },
        "rationale": "test input",
        "est_tokens_per_j_change_pct": 10.0,
        "est_latency_change_pct": -10.0,
        "est_cost_change_usd_per_h": -saving_usd_per_h,  # a saving is a negative change
        "status": status,
        "details": {
            "inputs": {"slo": slo or {"ttft_s": 5.0, "tpot_s": 0.5, "target": 0.9}},
            "predicted": predicted,
            "current_predicted": None,
            "measured": None,
            "confidence": {"level": confidence, "replay_error_pct": {}, "text": "test input"},
            "bottleneck": "mixed",
            "candidates": [],
            "trust": "simulated",
        },
    }
