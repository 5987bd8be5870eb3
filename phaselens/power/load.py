"""The steady load each calibration point runs under: the observed workload of a stored window
(its mean rate and its joint prompt/output lengths, :func:`analytics.workload.synthesize_trace` with
the rate curve flattened — a point must see the same load as the reference, not the hour's swings),
or Poisson arrivals with uniform lengths when no window is given."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from phaselens.power.plan import CalibrateError
from serving.trace import TraceRequest, poisson_trace


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """``workload`` (an :class:`analytics.workload.Workload`) at ``rate_scale`` × its mean rate, else
    Poisson ``rate_rps`` with prompts in ``prompt_tokens`` and outputs in ``output_tokens``."""

    workload: Any = None
    rate_scale: float = 1.0
    rate_rps: float = 2.0
    prompt_tokens: tuple[int, int] = (64, 512)
    output_tokens: tuple[int, int] = (16, 64)
    seed: int = 0

    def check(self) -> None:
        rate = self.rate
        if not (math.isfinite(rate) and 0 < rate <= 1000):
            raise CalibrateError(f"the load's rate must be in (0, 1000] req/s, got {rate:g}")

    @property
    def rate(self) -> float:
        return self.rate_rps if self.workload is None else float(self.workload.mean_rps) * self.rate_scale

    def describe(self) -> dict[str, Any]:
        if self.workload is None:
            return {
                "source": "poisson",
                "rate_rps": self.rate_rps,
                "prompt_tokens": list(self.prompt_tokens),
                "output_tokens": list(self.output_tokens),
                "seed": self.seed,
            }
        w = self.workload
        return {
            "source": "observed",
            "window": dict(w.window),
            "rate_rps": self.rate,
            "rate_scale": self.rate_scale,
            "prompt_tokens_mean": w.prompt_tokens.mean,
            "output_tokens_mean": w.output_tokens.mean,
            "seed": self.seed,
        }

    def text(self) -> str:
        d = self.describe()
        if d["source"] == "poisson":
            return (
                f"Poisson {self.rate_rps:g} req/s, prompts {self.prompt_tokens[0]}-{self.prompt_tokens[1]}, "
                f"outputs {self.output_tokens[0]}-{self.output_tokens[1]} tokens"
            )
        return (
            f"the observed workload ({d['window'].get('dataset', 'live')}): {self.rate:.3g} req/s steady, "
            f"prompts {d['prompt_tokens_mean']:.0f} / outputs {d['output_tokens_mean']:.0f} tokens on average"
        )


def steady_trace(spec: LoadSpec, duration_s: float) -> list[TraceRequest]:
    """The requests of one point: the same for every point of a sweep (same seed)."""
    if spec.workload is None:
        n = max(1, round(spec.rate_rps * duration_s))
        trace = poisson_trace(
            spec.rate_rps,
            n,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            seed=spec.seed,
        )
        return [r for r in trace if r.arrival_s < duration_s] or trace[:1]
    from analytics.workload import synthesize_trace
    from analytics.workload.model import RateCurve

    w = spec.workload
    flat = replace(w, rate_curve=RateCurve(w.rate_curve.start_s, duration_s, [float(w.mean_rps)]))
    trace = synthesize_trace(flat, duration_s=duration_s, rate_scale=spec.rate_scale, seed=spec.seed)
    if not trace:
        raise CalibrateError(
            f"the observed rate {w.mean_rps:.3g} req/s × {spec.rate_scale:g} gives no request in {duration_s:g} s: "
            "give a longer --point-s or a larger --rate-scale"
        )
    return trace
