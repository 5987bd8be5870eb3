"""Calibrate the GPU model's engine profiles on the calibration units of the published measurements
(serving/devices/fidelity_sets.py: published.py's sources and every Splitwise unit): each profile's free
parameters (:data:`FITS`) minimise the squared log error over that profile's calibration points
(Nelder-Mead in log space); the GPU's kernel latency (``kernel_latency_cycles``) is fitted first on this
project's H200 decode-vs-clock rows. :data:`SET_FROM_PUBLISHED` names the constants set from a published
figure instead of fitted. :func:`leave_one_out` refits without each calibration point and predicts it.
``PROFILES`` in serving/devices/engine_profiles.py ship the fitted values (rounded);
bench/fidelity_table.py refits and prints both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from serving.devices.fidelity_sets import POINTS
from serving.devices.gpu_model import DEFAULT_CONSTANTS, PROFILES, EmulationConstants, EngineProfile
from serving.devices.published import Point

# Free parameters per profile: (EngineProfile field, start, low, high). gemm_h100 / gemm_a100 are the
# factors in the profile's gemm_efficiency_by_gpu; gpu.gemm_a100 is the A100's own GEMM efficiency in
# the GPU model (EmulationConstants.gemm_efficiency_by_gpu), which every engine on an A100 uses.
FITS: dict[str, list[tuple[str, float, float, float]]] = {
    "vllm": [("step_s", 1e-3, 1e-5, 1e-2), ("allreduce_overhead_s", 5e-6, 1e-7, 1e-4)],
    "splitwise-2023": [
        ("kernels_per_layer", 40.0, 1.0, 200.0),
        ("per_seq_s", 3e-4, 1e-6, 5e-3),
        ("allreduce_bandwidth_scale", 0.5, 0.05, 1.0),
        ("allreduce_step_scale", 2.0, 0.5, 20.0),
        ("fallback_allreduce_bandwidth_scale", 0.3, 0.02, 1.0),
        ("prefill_floor_cycles_per_layer", 1e6, 1e3, 1e8),
        ("gpu.gemm_a100", 0.75, 0.3, 0.95),
    ],
    "turbomind-0.1": [
        ("allreduce_overhead_s", 2e-5, 1e-7, 5e-4),
        ("kernels_per_layer", 8.0, 0.5, 200.0),
        ("per_prefill_seq_s", 5e-3, 1e-5, 0.1),
    ],
    "trtllm-0.5": [("per_prefill_seq_s", 5e-3, 1e-5, 5e-2), ("allreduce_overhead_s", 2e-5, 1e-7, 5e-4)],
}


#: constants set from a published figure, not fitted: (profile, constant, value, the figure)
SET_FROM_PUBLISHED: list[tuple[str, str, str, str]] = [
    (
        "splitwise-2023",
        "custom_allreduce_max_bytes",
        "48 MiB",
        "CUSTOM_AR_SIZE_THRESHOLD = 50331648 (FasterTransformer custom_ar_kernels.h; TensorRT-LLM)",
    ),
]

MIN_UNITS_PER_CONSTANT = 3


def with_params(profile: EngineProfile, names: Sequence[str], values: Sequence[float]) -> EngineProfile:
    """``profile`` with the named parameters set (``gemm_<gpu>`` entries set gemm_efficiency_by_gpu;
    ``gpu.*`` entries are GPU-model constants, see :func:`constants_with_params`)."""
    fields: dict[str, Any] = {}
    gemm = dict(profile.gemm_efficiency_by_gpu)
    for name, value in zip(names, values, strict=True):
        if name.startswith("gpu."):
            continue
        if name == "gemm_h100":
            gemm["h100-sxm"] = value
        elif name == "gemm_a100":
            gemm["a100-sxm-80gb"] = value
        else:
            fields[name] = value
    return replace(profile, gemm_efficiency_by_gpu=tuple(sorted(gemm.items())), **fields)


def constants_with_params(
    constants: EmulationConstants, names: Sequence[str], values: Sequence[float]
) -> EmulationConstants:
    """``constants`` with the ``gpu.*`` parameters among ``names`` set (``gpu.gemm_a100``: the A100's
    GEMM efficiency)."""
    gemm = dict(constants.gemm_efficiency_by_gpu)
    for name, value in zip(names, values, strict=True):
        if name == "gpu.gemm_a100":
            gemm["a100-sxm-80gb"] = value
    return replace(constants, gemm_efficiency_by_gpu=tuple(sorted(gemm.items())))


def nelder_mead(
    f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.3, iters: int = 300
) -> list[float]:
    """Minimise ``f`` from ``x0`` (a plain Nelder-Mead simplex; no dependency beyond the stdlib)."""
    n = len(x0)
    simplex = [list(x0)] + [[x0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    scores = [f(p) for p in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=scores.__getitem__)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(t: float, worst: list[float] = worst, centroid: list[float] = centroid) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centroid, worst, strict=True)]

        refl = toward(-1.0)
        fr = f(refl)
        if fr < scores[0]:
            exp = toward(-2.0)
            fe = f(exp)
            simplex[-1], scores[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < scores[-2]:
            simplex[-1], scores[-1] = refl, fr
        else:
            con = toward(0.5)
            fc = f(con)
            if fc < scores[-1]:
                simplex[-1], scores[-1] = con, fc
            else:  # shrink toward the best
                best = simplex[0]
                simplex = [best] + [
                    [b + 0.5 * (q - b) for b, q in zip(best, p, strict=True)] for p in simplex[1:]
                ]
                scores = [scores[0]] + [f(p) for p in simplex[1:]]
        if max(scores) - min(scores) < 1e-10:
            break
    return simplex[min(range(n + 1), key=scores.__getitem__)]


def _loss(points: Sequence[Point], profile: EngineProfile, constants: EmulationConstants) -> float:
    return sum(math.log1p(p.error(profile, constants)) ** 2 for p in points)


def calibration_points(profile: str) -> list[Point]:
    """The calibration points of ``profile``."""
    return [p for p in POINTS if p.profile == profile and p.role == "calibration"]


def units_per_constant() -> dict[str, tuple[int, int]]:
    """Per fitted profile: (calibration points, fitted constants); the protocol wants >= 3 points each."""
    return {name: (len(calibration_points(name)), len(spec)) for name, spec in FITS.items()}


def fit_kernel_latency_cycles() -> float:
    """The per-kernel latency (SM cycles) that best fits this project's H200 decode-vs-clock rows."""
    rows = [p for p in calibration_points("phaselens-eager") if p.metric == "busy"]
    prof = PROFILES["phaselens-eager"]

    def loss(x: list[float]) -> float:
        c = replace(DEFAULT_CONSTANTS, kernel_latency_cycles=math.exp(x[0]))
        return _loss(rows, prof, c)

    return math.exp(nelder_mead(loss, [math.log(DEFAULT_CONSTANTS.kernel_latency_cycles)], iters=80)[0])


def fit_profile(
    name: str,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    points: Sequence[Point] | None = None,
    start: EngineProfile | None = None,
    iters: int = 600,
) -> tuple[EngineProfile, EmulationConstants]:
    """Refit ``name``'s free parameters (``FITS``) on its calibration points (or ``points``): the
    profile and the GPU-model constants (changed only by ``gpu.*`` parameters). ``start``: a profile
    whose values start the simplex (default: FITS' starts)."""
    spec = FITS[name]
    names = [s[0] for s in spec]
    lows = [math.log(s[2]) for s in spec]
    highs = [math.log(s[3]) for s in spec]
    rows = list(points) if points is not None else calibration_points(name)
    base = PROFILES[name]
    x0 = [math.log(s[1]) for s in spec]
    if start is not None:
        x0 = [math.log(_value_of(start, constants, n)) for n in names]

    def loss(x: list[float]) -> float:
        clipped = [min(max(v, lo), hi) for v, lo, hi in zip(x, lows, highs, strict=True)]
        penalty = sum((v - c) ** 2 for v, c in zip(x, clipped, strict=True))
        values = [math.exp(v) for v in clipped]
        prof = with_params(base, names, values)
        return _loss(rows, prof, constants_with_params(constants, names, values)) + penalty

    x = nelder_mead(loss, x0, step=0.3 if start is None else 0.1, iters=iters)
    values = [math.exp(min(max(v, lo), hi)) for v, lo, hi in zip(x, lows, highs, strict=True)]
    return with_params(base, names, values), constants_with_params(constants, names, values)


def _value_of(profile: EngineProfile, constants: EmulationConstants, name: str) -> float:
    if name == "gpu.gemm_a100":
        return constants.gemm_efficiency_for("a100-sxm-80gb")
    if name == "gemm_h100":
        return profile.gemm_scale("h100-sxm")
    if name == "gemm_a100":
        return profile.gemm_scale("a100-sxm-80gb")
    return float(getattr(profile, name))


def leave_one_out(name: str, iters: int = 150) -> list[tuple[Point, float]]:
    """For each calibration point of ``name``: refit without it (starting from the shipped profile) and
    return its error under that refit."""
    rows = calibration_points(name)
    out = []
    for i, p in enumerate(rows):
        prof, consts = fit_profile(name, points=rows[:i] + rows[i + 1 :], start=PROFILES[name], iters=iters)
        out.append((p, p.error(prof, consts)))
    return out
