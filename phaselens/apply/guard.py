"""The guard: what a window of the live stack's traffic measured, and whether it breaches the SLOs.

Source: the router's request telemetry (``GET /v1/telemetry``, one event per finished request with
its arrival, token times and status; :mod:`phaselens.apply.stack`) and the devices' energy counters
(``GET /v1/devices``). A window's latency figures come from the requests that arrived in it and had
finished when it was read (after ``settle_s``); its throughput from the tokens generated inside it.
SLO attainment is :func:`serving.sim.summary.slo_meets` over those requests (TTFT and TPOT, a failed
request misses), so the guard judges the live stack as the simulator judges a layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analytics.trust import EMULATED, HOST_BOUND
from serving.sim.summary import SloSpec, slo_meets

DEFAULT_GUARD_S = 30.0
HOST_BOUND_SHARE = 0.05  # a window with more lagged emulated iterations is labelled host-bound
DEFAULT_MAX_ERROR_RATE = 0.05
# the figures of a window compared against details.predicted (realised vs predicted)
COMPARED = ("goodput_rps_per_gpu", "output_tokens_per_s_per_gpu", "ttft_p90_s", "tpot_p90_s", "j_per_token")


@dataclass(frozen=True, slots=True)
class GuardSpec:
    """A guard window's length and what breaches it: SLO attainment under ``target`` (of requests
    meeting both ``slo`` bounds) or an error rate over ``max_error_rate``; a window with fewer than
    ``min_requests`` finished requests is not judged (passes, said so)."""

    window_s: float = DEFAULT_GUARD_S
    slo: SloSpec = field(default_factory=SloSpec)
    target: float = 0.9
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    min_requests: int = 1

    def describe(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "slo": {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s, "target": self.target},
            "max_error_rate": self.max_error_rate,
            "min_requests": self.min_requests,
        }


def slo_of(details: dict[str, Any] | None) -> tuple[SloSpec, float]:
    """The SLOs a recommendation was made for (``details.inputs.slo``), else the simulator's defaults."""
    slo = ((details or {}).get("inputs") or {}).get("slo") or {}
    base = SloSpec()
    spec = SloSpec(
        ttft_s=float(slo.get("ttft_s") or base.ttft_s), tpot_s=float(slo.get("tpot_s") or base.tpot_s)
    )
    return spec, float(slo.get("target") or 0.9)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def measure(
    events: list[dict[str, Any]],
    start_s: float,
    end_s: float,
    *,
    slo: SloSpec,
    gpus: int,
    energy_j: float | None = None,
    trust: str = EMULATED,
    host_bound_share: float | None = None,
) -> dict[str, Any]:
    """The window [start_s, end_s)'s figures (METRICS of the recommendation contract, plus counts).
    ``host_bound_share``: the emulated iterations of the window the host could not keep pace with;
    over :data:`HOST_BOUND_SHARE` the figures are labelled host-bound as well."""
    window_s = max(end_s - start_s, 1e-9)
    arrived = [e for e in events if start_s <= e["arrival_s"] < end_s and e.get("status") != "aborted"]
    ok = [e for e in arrived if e.get("status") == "ok"]
    errors = len(arrived) - len(ok)
    ttft, tpot = [], []
    for e in arrived:
        ts = e.get("token_ts_s") or []
        ttft.append(ts[0] - e["arrival_s"] if ts else math.nan)
        tpot.append((ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 else math.nan)
    met = slo_meets(
        np.asarray(ttft), np.asarray(tpot), np.asarray([e.get("status") == "ok" for e in arrived]), slo
    )
    tokens = sum(1 for e in events for t in (e.get("token_ts_s") or []) if start_s <= t < end_s)
    ok_ttft = [t for t, e in zip(ttft, arrived, strict=True) if e.get("status") == "ok" and not math.isnan(t)]
    ok_tpot = [t for t in tpot if not math.isnan(t)]
    per_gpu = max(gpus, 1)
    return {
        "window_s": round(window_s, 3),
        "start_s": start_s,
        "end_s": end_s,
        "gpus": gpus,
        "requests": len(arrived),
        "errors": errors,
        "error_rate": errors / len(arrived) if arrived else None,
        "slo_attainment": float(met.mean()) if len(arrived) else None,
        "goodput_rps_per_gpu": float(met.sum()) / window_s / per_gpu,
        "output_tokens": tokens,
        "output_tokens_per_s_per_gpu": tokens / window_s / per_gpu,
        "ttft_p50_s": _pct(ok_ttft, 50),
        "ttft_p90_s": _pct(ok_ttft, 90),
        "ttft_p99_s": _pct(ok_ttft, 99),
        "tpot_p50_s": _pct(ok_tpot, 50),
        "tpot_p90_s": _pct(ok_tpot, 90),
        "tpot_p99_s": _pct(ok_tpot, 99),
        "energy_j": energy_j,
        "j_per_token": energy_j / tokens if energy_j is not None and tokens else None,
        "host_bound_share": host_bound_share,
        "trust": [trust, HOST_BOUND] if (host_bound_share or 0) > HOST_BOUND_SHARE else [trust],
    }


def judge(metrics: dict[str, Any], spec: GuardSpec) -> tuple[bool, str]:
    """(passed, why) of a guard window's figures."""
    n = metrics["requests"]
    if n < spec.min_requests:
        return True, f"not judged: {n} requests finished in the window (fewer than {spec.min_requests})"
    err, att = metrics["error_rate"] or 0.0, metrics["slo_attainment"] or 0.0
    if err > spec.max_error_rate:
        return (
            False,
            f"error rate {err:.1%} over {spec.max_error_rate:.1%} ({metrics['errors']} of {n} requests)",
        )
    if att < spec.target:
        return False, (
            f"SLO attainment {att:.1%} under {spec.target:.0%} (TTFT ≤ {spec.slo.ttft_s * 1e3:g} ms, "
            f"TPOT ≤ {spec.slo.tpot_s * 1e3:g} ms; {n} requests)"
        )
    return True, f"SLO attainment {att:.1%} ≥ {spec.target:.0%}, error rate {err:.1%} ({n} requests)"


def realised_vs_predicted(realised: dict[str, Any], predicted: dict[str, Any] | None) -> dict[str, Any]:
    """Each compared figure: realised, predicted and the error (realised − predicted) / predicted, %."""
    out: dict[str, Any] = {}
    for key in COMPARED:
        r, p = realised.get(key), (predicted or {}).get(key)
        err = (r - p) / p * 100.0 if isinstance(r, int | float) and isinstance(p, int | float) and p else None
        out[key] = {"realised": r, "predicted": p, "error_pct": None if err is None else round(err, 2)}
    errs = [abs(v["error_pct"]) for v in out.values() if v["error_pct"] is not None]
    return {"figures": out, "worst_error_pct": max(errs) if errs else None}


def comparison_text(cmp: dict[str, Any]) -> str:
    """A table of realised vs predicted."""
    lines = [f"  {'figure':<30}{'realised':>12}{'predicted':>12}{'error':>9}"]
    for key, v in cmp["figures"].items():
        r, p, e = v["realised"], v["predicted"], v["error_pct"]
        fmt = lambda x: "—" if x is None else f"{x:.4g}"  # noqa: E731
        lines.append(f"  {key:<30}{fmt(r):>12}{fmt(p):>12}{'—' if e is None else f'{e:+.1f}%':>9}")
    if cmp["worst_error_pct"] is not None:
        lines.append(f"  worst |error| {cmp['worst_error_pct']:.1f}%")
    return "\n".join(lines)
