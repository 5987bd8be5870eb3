"""From a role's measured points to its cliff and its setting in each mode (no torch, no HTTP).

A point is ``{"setting": Setting.as_dict(), "figures": {...}}`` with the figures of
:func:`phaselens.power.live.point_figures` / :func:`phaselens.power.simulate.sim_figures`:
``output_tokens_per_s``, ``ttft_p50_s``/``p99``, ``itl_p50_s``/``p99``, ``power_w`` (per GPU of the
role), ``tokens_per_j`` (the phase's tokens per joule of the role's GPUs: prompt tokens for prefill,
output tokens for decode and mixed).

- **Reference**: the defaults, measured first and last; the figures are their mean and **noise** is
  how far the two differ in the phase's latency (TTFT p50 for prefill, ITL p50 for decode, the larger
  of the two for mixed).
- **Cliff** per knob: going down from the top, the first setting whose phase latency rises beyond
  noise: above the slower of the two reference runs by more than ``min_rise_pct``
  (:func:`rise_threshold_pct`, expressed as a rise over the reference mean).
- **Modes**: a setting is *accepted* only if its throughput is ≥ (1 − ε) × the reference's and its
  ITL p99 and TTFT p99 are within the SLO; **PERF** also needs no measurable slowdown (the phase
  latency within the threshold, p50 and p99); **BAL** takes the best tokens/J of the accepted;
  **EFF** the best tokens/J within a looser bound (ε × ``eff_eps_factor``, SLO ×
  ``eff_slo_factor``). The defaults are always a candidate: when nothing beats them, keep them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from phaselens.power.plan import DEFAULT, KNOBS, Setting

MODES = ("perf", "bal", "eff")
LATENCY_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


@dataclass(frozen=True, slots=True)
class ChooseOptions:
    """ε, the SLO (None: the reference's p99 × (1 + ``slo_headroom``)), the noise floor and EFF's looser bound."""

    eps: float = 0.05
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    slo_headroom: float = 0.25
    min_rise_pct: float = 5.0
    eff_eps_factor: float = 2.0
    eff_slo_factor: float = 1.5

    def check(self) -> None:
        from phaselens.power.plan import CalibrateError

        if not 0 <= self.eps < 1:
            raise CalibrateError(f"--eps must be in [0, 1), got {self.eps:g}")
        for name in ("slo_ttft_s", "slo_itl_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise CalibrateError(f"{name} must be a number > 0, got {v!r}")
        if not 0 <= self.min_rise_pct <= 100:
            raise CalibrateError(f"--min-rise-pct must be in [0, 100], got {self.min_rise_pct:g}")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _rise_pct(value: Any, ref: Any) -> float | None:
    v, r = _num(value), _num(ref)
    return None if v is None or r is None or r <= 0 else (v / r - 1.0) * 100.0


def phase_latency_keys(phase: str) -> tuple[str, ...]:
    """The latencies a phase's knob moves: TTFT for prefill, ITL for decode, both for mixed."""
    return {"prefill": ("ttft_p50_s",), "decode": ("itl_p50_s",)}.get(phase, ("ttft_p50_s", "itl_p50_s"))


def reference_of(points: list[dict[str, Any]], phase: str) -> tuple[dict[str, Any], float]:
    """The mean figures of the default points and the noise (%): how far the phase latency of the
    first and the last differ, relative to the smaller."""
    refs = [p["figures"] for p in points if p["setting"].get("knob", DEFAULT) == DEFAULT]
    if not refs:
        raise ValueError("no reference (default settings) point was measured")
    keys = {k for f in refs for k in f}
    mean: dict[str, Any] = {}
    for k in keys:
        vals = [_num(f.get(k)) for f in refs]
        vals = [v for v in vals if v is not None]
        mean[k] = sum(vals) / len(vals) if vals else refs[0].get(k)
    noise = 0.0
    if len(refs) >= 2:
        for k in phase_latency_keys(phase):
            a, b = _num(refs[0].get(k)), _num(refs[-1].get(k))
            if a and b:
                noise = max(noise, abs(a - b) / min(a, b) * 100.0)
    return mean, noise


def rise_threshold_pct(
    points: list[dict[str, Any]], ref: dict[str, Any], phase: str, floor_pct: float
) -> float:
    """The rise over the reference mean that is beyond noise: above the slower of the reference runs
    by more than ``floor_pct`` (with one reference, or two that agree: ``floor_pct``)."""
    refs = [p["figures"] for p in points if p["setting"].get("knob", DEFAULT) == DEFAULT]
    out = floor_pct
    for k in phase_latency_keys(phase):
        vals = [v for v in (_num(f.get(k)) for f in refs) if v is not None]
        mean = _num(ref.get(k))
        if vals and mean:
            out = max(out, (max(vals) * (1 + floor_pct / 100.0) / mean - 1.0) * 100.0)
    return out


def slowdown_pct(figures: dict[str, Any], ref: dict[str, Any], phase: str) -> float | None:
    """The phase latency's rise over the reference, % (the largest of the phase's keys)."""
    rises = [_rise_pct(figures.get(k), ref.get(k)) for k in phase_latency_keys(phase)]
    rises = [r for r in rises if r is not None]
    return max(rises) if rises else None


def find_cliffs(
    points: list[dict[str, Any]], ref: dict[str, Any], phase: str, threshold_pct: float
) -> dict[str, Any]:
    """Per knob swept: the first setting (from the top down) whose phase latency rose beyond
    ``threshold_pct``, with its rise; ``None`` for a knob that never crossed it."""
    out: dict[str, Any] = {}
    for knob in KNOBS:
        swept = [p for p in points if p["setting"].get("knob") == knob]
        if not swept:
            continue
        out[knob] = None
        for p in swept:
            rise = slowdown_pct(p["figures"], ref, phase)
            if rise is not None and rise > threshold_pct:
                out[knob] = {"setting": p["setting"], "rise_pct": round(rise, 2)}
                break
    return out


def slo_of(ref: dict[str, Any], o: ChooseOptions) -> dict[str, float | None]:
    """The SLO the choice holds to: given, else the reference's p99 × (1 + headroom)."""

    def derive(given: float | None, key: str) -> float | None:
        if given is not None:
            return given
        v = _num(ref.get(key))
        return None if v is None else v * (1 + o.slo_headroom)

    return {"ttft_p99_s": derive(o.slo_ttft_s, "ttft_p99_s"), "itl_p99_s": derive(o.slo_itl_s, "itl_p99_s")}


def _why_not(
    f: dict[str, Any], ref: dict[str, Any], eps: float, slo: dict[str, float | None], factor: float
) -> str | None:
    """Why a point is not accepted under (ε, SLO × factor), else None."""
    tput, rtput = _num(f.get("output_tokens_per_s")), _num(ref.get("output_tokens_per_s"))
    if f.get("failed"):
        return f"{f['failed']} requests failed"
    if tput is None or rtput is None or tput < (1 - eps) * rtput:
        return f"throughput {tput or 0:.4g} tok/s under (1 − {eps:g}) × {rtput or 0:.4g}"
    for key, bound in slo.items():
        v = _num(f.get(key))
        if bound is not None and (v is None or v > bound * factor):
            return f"{key} {v if v is not None else float('nan'):.4g} s over {bound * factor:.4g} s"
    return None


def choose_modes(
    points: list[dict[str, Any]], phase: str, options: ChooseOptions = ChooseOptions()
) -> dict[str, Any]:
    """The reference, noise, cliffs and the setting of each mode for one role's points."""
    ref, noise = reference_of(points, phase)
    threshold = rise_threshold_pct(points, ref, phase, options.min_rise_pct)
    slo = slo_of(ref, options)
    ref_tpj = _num(ref.get("tokens_per_j"))
    ref_power = _num(ref.get("power_w"))
    rated = []
    for p in points:
        if p["setting"].get("knob", DEFAULT) == DEFAULT:
            continue
        f = p["figures"]
        rise = slowdown_pct(f, ref, phase)
        p99_rise = max(
            (
                r
                for r in (
                    _rise_pct(f.get(k.replace("p50", "p99")), ref.get(k.replace("p50", "p99")))
                    for k in phase_latency_keys(phase)
                )
                if r is not None
            ),
            default=None,
        )
        rated.append((p, rise, p99_rise))
    modes: dict[str, Any] = {}
    for mode in MODES:
        eps = options.eps * (options.eff_eps_factor if mode == "eff" else 1.0)
        factor = options.eff_slo_factor if mode == "eff" else 1.0
        best: tuple[float, dict[str, Any]] | None = None
        rejected = []
        for p, rise, p99_rise in rated:
            f = p["figures"]
            why = _why_not(f, ref, eps, slo, factor)
            if why is None and mode == "perf" and ((rise or 0) > threshold or (p99_rise or 0) > threshold):
                why = f"slower: phase latency +{max(rise or 0, p99_rise or 0):.1f} % (threshold {threshold:.1f} %)"
            tpj = _num(f.get("tokens_per_j"))
            if why is None and (tpj is None or ref_tpj is None or tpj <= ref_tpj):
                why = "no tokens/J gain over the defaults"
            if why is not None:
                rejected.append({"setting": p["setting"]["label"], "why": why})
                continue
            assert tpj is not None
            if best is None or tpj > best[0]:
                best = (tpj, p)
        if best is None:
            modes[mode] = {
                "setting": Setting().as_dict(),
                "knob": DEFAULT,
                "keep_defaults": True,
                "reason": "no setting beats the defaults within the bounds",
                "rejected": rejected,
            }
            continue
        tpj, p = best
        f = p["figures"]
        power = _num(f.get("power_w"))
        modes[mode] = {
            "setting": p["setting"],
            "knob": p["setting"]["knob"],
            "keep_defaults": False,
            "figures": f,
            "tokens_per_j_gain_pct": round((tpj / ref_tpj - 1) * 100, 2) if ref_tpj else None,
            "power_w_change": round(power - ref_power, 2)
            if power is not None and ref_power is not None
            else None,
            "latency_change_pct": {
                k: None if (r := _rise_pct(f.get(k), ref.get(k))) is None else round(r, 2)
                for k in LATENCY_KEYS
            },
            "throughput_change_pct": _rise_pct(f.get("output_tokens_per_s"), ref.get("output_tokens_per_s")),
            "rejected": rejected,
        }
    return {
        "reference": ref,
        "noise_pct": round(noise, 2),
        "threshold_pct": round(threshold, 2),
        "slo": slo,
        "cliff": find_cliffs(points, ref, phase, threshold),
        "modes": modes,
        "options": {
            "eps": options.eps,
            "eff_eps": options.eps * options.eff_eps_factor,
            "eff_slo_factor": options.eff_slo_factor,
            "min_rise_pct": options.min_rise_pct,
        },
    }


def beyond_loosest(figures: dict[str, Any], ref: dict[str, Any], phase: str, options: ChooseOptions) -> bool:
    """True when a point is past every mode's bound (EFF's): going further down the knob is pointless."""
    slo = slo_of(ref, options)
    eps = options.eps * options.eff_eps_factor
    return _why_not(figures, ref, eps, slo, options.eff_slo_factor) is not None and (
        (slowdown_pct(figures, ref, phase) or 0) > options.min_rise_pct
    )
