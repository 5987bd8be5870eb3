"""How far a workload has moved from another: :func:`workload_drift`.

Three distances, each against its threshold; the score is the largest distance / threshold, and a
score of 1 or more makes a recommendation computed on the old workload **stale**:

==============  =================================================  ==========================
component       distance                                            stale at
==============  =================================================  ==========================
rate            ``|log2(new mean rate / old mean rate)|``           ≥ log2 1.5 (1.5× either way)
prompt, output  Wasserstein-1 distance of the token-count           ≥ 0.5 doublings (a typical
                distributions on a log2 scale (in doublings)        length √2 = 1.41× longer)
burstiness      ``|log2(new burstiness CV / old)|``                 ≥ log2 1.5
==============  =================================================  ==========================

The same workload drawn twice scores about 0.1 (sampling noise); a doubled rate about 1.7, prompts
twice as long about 2 (docs/RECOMMENDATIONS.md, "Workload").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analytics.workload.model import Workload

THRESHOLDS: dict[str, float] = {
    "rate": math.log2(1.5),
    "prompt": 0.5,
    "output": 0.5,
    "burstiness": math.log2(1.5),
}
_GRID = np.arange(0.0, 26.0, 1.0 / 64)  # log2 tokens: 1 to 64 M


@dataclass(frozen=True, slots=True)
class Drift:
    """``score`` (the largest distance / threshold), ``stale`` (score ≥ 1), the distance per
    component (None when one side lacks it) and a sentence per component."""

    score: float
    stale: bool
    distances: dict[str, float | None]
    reasons: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "stale": self.stale,
            "distances": dict(self.distances),
            "thresholds": dict(THRESHOLDS),
            "reasons": list(self.reasons),
        }


def _log2_cdf(edges: list[float], counts: np.ndarray) -> np.ndarray | None:
    """The CDF of a length histogram on :data:`_GRID`, mass spread evenly in log2 inside each bin."""
    total = counts.sum()
    if total <= 0:
        return None
    cdf = np.zeros_like(_GRID)
    for k, c in enumerate(counts):
        if c <= 0:
            continue
        lo, hi = edges[k], edges[k + 1]
        hi_l = math.log2(hi) if math.isfinite(hi) else math.log2(max(lo, 1.0)) + 1.0
        lo_l = math.log2(lo) if lo > 0 else hi_l - 1.0
        width = max(hi_l - lo_l, 1e-9)
        cdf += c * np.clip((_GRID - lo_l) / width, 0.0, 1.0)
    return cdf / total


def length_distance(old: Workload, new: Workload, axis: str) -> float | None:
    """Wasserstein-1 distance between the two workloads' ``axis`` (prompt | output) token counts on
    a log2 scale: how many doublings the distribution moved, on average."""
    a = _log2_cdf(*old.lengths.marginal(axis))
    b = _log2_cdf(*new.lengths.marginal(axis))
    if a is None or b is None:
        return None
    return float(np.abs(a - b).sum() * (_GRID[1] - _GRID[0]))


def _log_ratio(old: float | None, new: float | None) -> float | None:
    if not old or not new or old <= 0 or new <= 0:
        return None
    return abs(math.log2(new / old))


def workload_drift(old: Workload, new: Workload) -> Drift:
    """How far ``new`` has moved from ``old`` (see the module's table), with the reasons."""
    d: dict[str, float | None] = {
        "rate": _log_ratio(old.mean_rps, new.mean_rps),
        "prompt": length_distance(old, new, "prompt"),
        "output": length_distance(old, new, "output"),
        "burstiness": _log_ratio(old.burstiness_cv, new.burstiness_cv),
    }
    reasons = []
    if d["rate"] is not None:
        reasons.append(
            f"mean rate {old.mean_rps:.3g} → {new.mean_rps:.3g} req/s ({new.mean_rps / old.mean_rps:.2f}×; "
            "stale at 1.5× either way)"
        )
    else:
        reasons.append("mean rate: not comparable (no requests on one side)")
    for axis in ("prompt", "output"):
        s_old, s_new = getattr(old, f"{axis}_tokens"), getattr(new, f"{axis}_tokens")
        if d[axis] is None:
            reasons.append(f"{axis} lengths: not comparable (no length distribution on one side)")
            continue
        median = ""
        if s_old.p50 and s_new.p50:
            median = f", median {s_old.p50:.0f} → {s_new.p50:.0f} tokens"
        reasons.append(
            f"{axis} lengths moved {d[axis]:.2f} doublings{median} (stale at {THRESHOLDS[axis]:.2f})"
        )
    if d["burstiness"] is not None:
        reasons.append(
            f"burstiness CV {old.burstiness_cv:.2f} → {new.burstiness_cv:.2f} (stale at 1.5× either way)"
        )
    else:
        reasons.append("burstiness: not comparable (too few arrivals on one side)")
    score = max((v / THRESHOLDS[k] for k, v in d.items() if v is not None), default=0.0)
    return Drift(float(score), score >= 1.0, d, reasons)
