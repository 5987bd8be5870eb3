"""The GPU between iterations: power, energy and SM clock of an idle GPU since its last kernel (boost
clock and elevated power through short gaps, true idle only after a sustained one), for floats or
numpy arrays; part of the GPU model (:mod:`serving.devices.gpu_model` re-exports it; equations in
docs/EMULATION.md)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from serving.devices.gpu_specs import GpuSpec, gpu_spec
from serving.devices.model_constants import DEFAULT_CONSTANTS, EmulationConstants

# --- the GPU between iterations ---------------------------------------------------------------------


def _voltage_factor(x: Any, c: EmulationConstants) -> Any:
    """``x V(x)^2``: the SM dynamic-power factor at clock fraction ``x`` (float or array)."""
    v = np.maximum(c.voltage_floor, c.voltage_offset + (1.0 - c.voltage_offset) * x)
    return x * v * v


def _gap_amp_scalar(spec: GpuSpec, c: EmulationConstants, x: float) -> float:
    v = max(c.voltage_floor, c.voltage_offset + (1.0 - c.voltage_offset) * x)
    return (spec.tdp_w - spec.idle_w) * c.gap_power * x * v * v


def _gap_power_scalar(spec: GpuSpec, s: float, c: EmulationConstants, x: float = 1.0) -> float:
    held = 1.0 if s < c.gap_hold_s else math.exp(-(s - c.gap_hold_s) / c.gap_decay_s)
    return spec.idle_w + _gap_amp_scalar(spec, c, x) * held


def _gap_energy_scalar(spec: GpuSpec, gap_s: float, c: EmulationConstants, x: float = 1.0) -> float:
    """The closed form of :func:`gap_energy_j` for one float (the per-iteration path)."""
    if gap_s <= 0.0:
        return 0.0
    held = min(gap_s, c.gap_hold_s)
    if gap_s > c.gap_hold_s:
        held += c.gap_decay_s * -math.expm1(-(gap_s - c.gap_hold_s) / c.gap_decay_s)
    return spec.idle_w * gap_s + _gap_amp_scalar(spec, c, x) * held


def _clock_x(spec: GpuSpec, sm_clock_mhz: Any) -> Any:
    if sm_clock_mhz is None:
        return 1.0
    if np.ndim(sm_clock_mhz) == 0:
        return float(sm_clock_mhz) / spec.max_sm_clock_mhz
    return np.asarray(sm_clock_mhz, dtype=float) / spec.max_sm_clock_mhz


def gap_power_w(
    gpu: str | GpuSpec,
    since_busy_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    sm_clock_mhz: Any = None,
) -> Any:
    """Power of an idle GPU ``since_busy_s`` seconds after its last kernel (float or numpy array).

    ``P = idle_w + D * gap_power * x V(x)^2 * h(s)``, ``h = 1`` through the hold
    (``s < gap_hold_s``), then ``exp(-(s - hold) / gap_decay_s)``. ``sm_clock_mhz`` is the clock
    held in the gap (default: the maximum; a locked range's top under a lock).
    """
    spec, c = gpu_spec(gpu), constants
    x = _clock_x(spec, sm_clock_mhz)
    if np.ndim(since_busy_s) == 0 and np.ndim(x) == 0:
        return _gap_power_scalar(spec, float(since_busy_s), c, x)
    s = np.asarray(since_busy_s, dtype=float)
    amp = (spec.tdp_w - spec.idle_w) * c.gap_power * _voltage_factor(x, c)
    held = np.where(s < c.gap_hold_s, 1.0, np.exp(-np.maximum(0.0, s - c.gap_hold_s) / c.gap_decay_s))
    return spec.idle_w + amp * held


def gap_energy_j(
    gpu: str | GpuSpec,
    gap_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    sm_clock_mhz: Any = None,
) -> Any:
    """Energy (J) of a whole idle gap of ``gap_s`` seconds right after a busy interval: the closed
    form of the integral of :func:`gap_power_w` from 0 to ``gap_s`` (float or numpy array)."""
    spec, c = gpu_spec(gpu), constants
    x = _clock_x(spec, sm_clock_mhz)
    if np.ndim(gap_s) == 0 and np.ndim(x) == 0:
        return _gap_energy_scalar(spec, float(gap_s), c, x)
    g = np.maximum(0.0, np.asarray(gap_s, dtype=float))
    amp = (spec.tdp_w - spec.idle_w) * c.gap_power * _voltage_factor(x, c)
    late = np.maximum(0.0, g - c.gap_hold_s)
    held = np.minimum(g, c.gap_hold_s) + c.gap_decay_s * -np.expm1(-late / c.gap_decay_s)
    return spec.idle_w * g + amp * held


def gap_sm_clock_mhz(
    gpu: str | GpuSpec,
    since_busy_s: Any,
    constants: EmulationConstants = DEFAULT_CONSTANTS,
    *,
    held_mhz: Any = None,
    idle_mhz: Any = None,
) -> Any:
    """SM clock of an idle GPU ``since_busy_s`` after its last kernel (float or numpy array): the
    held clock ``held_mhz`` (default the maximum) through the hold, then ``idle_mhz`` (default the
    lowest supported clock)."""
    spec = gpu_spec(gpu)
    held = float(spec.max_sm_clock_mhz) if held_mhz is None else held_mhz
    idle = float(spec.min_sm_clock_mhz) if idle_mhz is None else idle_mhz
    if np.ndim(since_busy_s) == 0 and np.ndim(held) == 0 and np.ndim(idle) == 0:
        return float(held if since_busy_s < constants.gap_hold_s else idle)
    s = np.asarray(since_busy_s, dtype=float)
    return np.where(s < constants.gap_hold_s, held, idle).astype(float)
