"""Choose: the proposed layout, or staying as is, and the sentence that says why.

Rules, in order (``margin`` = the larger of ``min_gain_pct`` and the confidence's margin — the
replay error on the current layout, or the GPU model's documented error when nothing was measured):

1. the least budget meeting the SLOs over the whole trace uses fewer GPUs than the current layout
   and saves more than ``margin`` % of its all-in $/h → propose it;
2. the current layout misses the SLOs and the best at the budget meets them → propose that;
3. the best at the budget gains more than ``margin`` % goodput per GPU over the current → propose it;
4. else stay as is, saying why (the gain, or that no candidate meets the SLOs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analytics.recommend.confidence import confidence
from analytics.recommend.evaluate import METRICS, metrics
from analytics.recommend.inputs import RecommendInputs
from analytics.recommend.search import Scored, SearchOptions, SearchResult


@dataclass(slots=True)
class Recommendation:
    """A layout recommendation with its predictions, confidence and every candidate (all simulated)."""

    inputs: RecommendInputs
    result: SearchResult
    proposed: Scored
    stay: bool
    rationale: str
    confidence: dict[str, Any]
    predicted: dict[str, Any]
    current_predicted: dict[str, Any]
    measured: dict[str, Any] | None
    bottleneck: str
    est_cost_change_usd_per_h: float | None
    est_tokens_per_j_change_pct: float | None
    est_latency_change_pct: float | None
    candidates: list[dict[str, Any]] = field(default_factory=list)
    trust: str = "simulated"

    @property
    def current(self) -> Scored:
        return self.result.current

    def summary(self) -> dict[str, Any]:
        """The headline as JSON-able values."""
        return {
            "current": self.current.layout,
            "proposed": self.proposed.layout,
            "stay": self.stay,
            "rationale": self.rationale,
            "bottleneck": self.bottleneck,
            "confidence": self.confidence,
            "predicted": self.predicted,
            "current_predicted": self.current_predicted,
            "est_cost_change_usd_per_h": self.est_cost_change_usd_per_h,
            "est_tokens_per_j_change_pct": self.est_tokens_per_j_change_pct,
            "est_latency_change_pct": self.est_latency_change_pct,
            "same_budget": self.result.same_budget.layout if self.result.same_budget else None,
            "least_budget": self.result.least_budget.layout if self.result.least_budget else None,
            "search": {
                "wall_s": self.result.wall_s,
                "simulations": self.result.sims,
                "slice": self.result.slice_desc,
            },
            "trust": self.trust,
        }


def _metrics(s: Scored, copies: float) -> dict[str, Any]:
    ev = s.best_eval
    if ev is None:
        return {}
    return metrics(ev, goodput_rps_per_gpu=s.goodput_rps_per_gpu, fleet_copies=copies)


def _pct(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or not old:
        return None
    return (new / old - 1.0) * 100.0


def _pareto(rows: list[dict[str, Any]]) -> None:
    pts = [
        (i, r["output_tokens_per_s_per_gpu"], r["output_tokens_per_s_per_user"])
        for i, r in enumerate(rows)
        if r.get("output_tokens_per_s_per_gpu") is not None
        and r.get("output_tokens_per_s_per_user") is not None
    ]
    for r in rows:
        r["pareto"] = False
    for i, x, y in pts:
        rows[i]["pareto"] = not any((a >= x and b >= y and (a > x or b > y)) for j, a, b in pts if j != i)


def candidate_rows(result: SearchResult, inputs: RecommendInputs, copies: float) -> list[dict[str, Any]]:
    """Every candidate (the current layout first) with its METRICS, whether it meets the SLOs, its
    bottleneck, where it was evaluated or why it was pruned."""
    rows = []
    target = inputs.slo.target
    for s in [result.current, *[x for x in result.scored if x is not result.current]]:
        ev = s.best_eval
        row: dict[str, Any] = {
            "layout": s.layout,
            "current": s is result.current,
            "gpus": s.gpus,
            "gpu": s.gpu,
            "mode": s.mode,
            **(_metrics(s, copies) or dict.fromkeys(METRICS)),
            "meets_slo": s.meets(target),
            "bottleneck": ev.bottleneck if ev else None,
            "bottleneck_text": ev.bottleneck_text if ev else None,
            "evaluated_on": "trace" if s.hour else "slice" if s.slice_run else None,
            "pruned": s.pruned,
            "bound_rps_per_gpu": s.bound.rate_rps_per_gpu if s.bound else None,
        }
        rows.append(row)
    _pareto(rows)
    return rows


def choose(inputs: RecommendInputs, result: SearchResult, options: SearchOptions) -> Recommendation:
    """Apply the rules of the module docstring to a search's result."""
    target = inputs.slo.target
    cur = result.current
    copies = inputs.fleet_gpus / cur.gpus  # type: ignore[operator]
    cur_ev = cur.hour
    assert cur_ev is not None
    cur_m = _metrics(cur, copies)
    conf = confidence({**cur_m, "output_tokens_per_s": cur_ev.output_tokens_per_s}, inputs.measured)
    margin = max(options.min_gain_pct, float(conf["margin_pct"]))
    same, least = result.same_budget, result.least_budget
    g_cur = cur.goodput_rps_per_gpu or 0.0
    proposed, why = None, ""
    if least is not None and least.hour is not None and least.gpus < cur.gpus and least.hour.meets(target):
        saving = (cur_ev.usd_per_h - least.hour.usd_per_h) / cur_ev.usd_per_h * 100.0
        if saving > margin:
            proposed = least
            why = (
                f"{least.layout} meets the SLOs ({least.hour.attainment:.1%} ≥ {target:.0%}) on {least.gpus} GPUs "
                f"instead of {cur.gpus}: {saving:.0f} % less per hour (more than the {margin:.0f} % margin)"
            )
    if proposed is None and same is not None and same.hour is not None and same.hour.meets(target):
        g_same = same.goodput_rps_per_gpu or 0.0
        gain = (g_same / g_cur - 1.0) * 100.0 if g_cur > 0 else float("inf")
        if same is cur:
            pass
        elif not cur_ev.meets(target):
            proposed = same
            why = (
                f"the current layout misses the SLOs ({cur_ev.attainment:.1%} < {target:.0%}); {same.layout} meets "
                f"them ({same.hour.attainment:.1%}) on the same {same.gpus} GPUs"
            )
        elif gain > margin:
            proposed = same
            why = (
                f"{same.layout} carries {g_same / g_cur:.2f}× the goodput per GPU of the current layout "
                f"({g_same:.3f} vs {g_cur:.3f} req/s per GPU) on the same budget"
                if g_cur > 0
                else f"{same.layout} meets the SLOs where the current layout has no goodput"
            )
    stay = proposed is None
    if stay:
        proposed = cur
        why = _stay_reason(inputs, result, g_cur, margin)
    ev = proposed.hour or proposed.best_eval
    assert ev is not None
    why += f". Bottleneck of {'the current layout' if stay else 'the proposed layout'}: {ev.bottleneck_text}"
    pred = _metrics(proposed, copies)
    return Recommendation(
        inputs=inputs,
        result=result,
        proposed=proposed,
        stay=stay,
        rationale=why + ".",
        confidence=conf,
        predicted=pred,
        current_predicted=cur_m,
        measured=inputs.measured,
        bottleneck=ev.bottleneck,
        est_cost_change_usd_per_h=(ev.usd_per_h - cur_ev.usd_per_h) if ev.usd_per_h == ev.usd_per_h else None,
        est_tokens_per_j_change_pct=_pct(
            1 / pred["j_per_token"] if pred.get("j_per_token") else None,
            1 / cur_m["j_per_token"] if cur_m.get("j_per_token") else None,
        ),
        est_latency_change_pct=_pct(pred.get("ttft_p90_s"), cur_m.get("ttft_p90_s")),
        candidates=candidate_rows(result, inputs, copies),
    )


def _stay_reason(inputs: RecommendInputs, result: SearchResult, g_cur: float, margin: float) -> str:
    target = inputs.slo.target
    cur = result.current
    evaluated = [
        s for s in result.scored if s.goodput_rps_per_gpu is not None and s.gpus == inputs.gpu_budget
    ]
    disagg = max(
        (s for s in evaluated if s.mode == "disaggregated"), key=lambda s: s.goodput_rps_per_gpu, default=None
    )
    best = max(evaluated, key=lambda s: s.goodput_rps_per_gpu, default=None)
    if not any(s.meets(target) for s in [cur, *result.scored]):
        return (
            f"stay as is: no layout within {inputs.gpu_budget} GPUs meets the SLOs at {target:.0%} on this traffic "
            f"(the current layout: {cur.hour.attainment:.1%}); more GPUs or looser SLOs are needed"  # type: ignore[union-attr]
        )
    parts = [f"stay as is ({cur.mode})"]
    if best is not None and g_cur > 0:
        parts.append(
            f"the best alternative, {best.layout}, reaches {best.goodput_rps_per_gpu / g_cur:.2f}× the current goodput "
            f"per GPU, not more than the {margin:.0f} % margin"
        )
    if disagg is not None and g_cur > 0 and cur.mode == "aggregated":
        parts.append(
            f"splitting prefill and decode does not pay: the best disaggregated layout ({disagg.layout}) reaches "
            f"{disagg.goodput_rps_per_gpu / g_cur:.2f}× the current goodput per GPU"
        )
    return "; ".join(parts)


def recommend(
    inputs: RecommendInputs, options: SearchOptions | None = None, progress: Any = None
) -> Recommendation:
    """Check ``inputs``, search (``analytics.recommend.search``) and choose: the hook every caller
    (the CLI, the service API, bench/recommend.py, the AIConfigurator comparison) uses."""
    from analytics.recommend.search import search

    options = options or SearchOptions()
    inputs.check()
    return choose(inputs, search(inputs, options, progress), options)
