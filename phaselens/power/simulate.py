"""The calibration sweep in the simulator, for fleets and layouts not deployed: the same plan (the
GPU's power-limit range and supported clocks, from its spec, are the bounds), each point a
simulation of the layout with the knob on one role's pool (``ROLE.power_limit_w=W`` /
``ROLE.sm_clock_mhz=LOW-HIGH``) under the same steady trace. Every figure is **simulated** (the GPU
model, virtual time)."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np

from phaselens.power.choose import ChooseOptions, combination_brackets, knee_brackets
from phaselens.power.fingerprint import Fingerprint
from phaselens.power.load import LoadSpec, steady_trace
from phaselens.power.plan import (
    Bounds,
    CalibrateError,
    RolePlan,
    Setting,
    SweepPlan,
    order_points,
    refine_settings,
)
from serving.config import ConfigError, model_config_for
from serving.devices.gpu_specs import gpu_spec
from serving.sim.layout import LayoutError, check_layout, parse_layout
from serving.sim.samples import CumulativeCounters
from serving.sim.simulator import Simulation, SimulationError
from serving.sim.summary import summarize


def sim_bounds(layout_text: str, shape: str) -> tuple[dict[str, list[tuple[str, Bounds]]], Any]:
    """The roles of a layout (each pool one 'worker' entry with the GPU's bounds) and the layout;
    CalibrateError for a layout that cannot run the model."""
    try:
        layout = parse_layout(layout_text)
        check_layout(layout, model_config_for(shape))
    except (LayoutError, ConfigError) as e:
        raise CalibrateError(f"--simulate: {e}") from e
    spec = gpu_spec(layout.gpu)
    b = Bounds(
        device=f"simulated:{spec.key}",
        power_min_w=spec.min_power_limit_w,
        power_max_w=spec.tdp_w,
        power_default_w=spec.tdp_w,
        clocks_mhz=tuple(spec.supported_sm_clocks_mhz()),
        where=f"the {spec.name} of layout {layout_text}",
    )
    for p in layout.pools:
        if p.power_limit_w is not None or p.sm_clock_mhz is not None:
            raise CalibrateError(
                f"--simulate {layout_text}: its {p.role} pool already sets power_limit_w/sm_clock_mhz; "
                "give the layout at its defaults (the sweep sets the knobs)"
            )
    return {p.role: [(f"{p.role} pool ({p.replicas}×tp{p.tp})", b)] for p in layout.pools}, layout


def sim_fingerprint(layout: Any, shape: str, role: str) -> Fingerprint:
    """The simulated GPU (its model stands in for the driver) and the engine it models."""
    spec = gpu_spec(layout.gpu)
    pool = layout.pool(role)
    try:
        v = f"phaselens {version('phaselens')}"
    except PackageNotFoundError:
        v = "phaselens (not installed)"
    return Fingerprint(
        gpu_model=f"{spec.name} (simulated)",
        driver="simulated",
        model=model_config_for(shape).name,
        dtype="bfloat16",
        tp=pool.tp if pool else None,
        engine_version=f"{v} / simulated {layout.profile}",
    )


def _role_energy_j(result: Any, role: str) -> float:
    spec = gpu_spec(result.layout.gpu)
    total = 0.0
    for replica in result.replicas:
        if replica.role != role:
            continue
        locked = replica.pool.sm_clock_mhz
        cum = CumulativeCounters(replica.intervals, spec, locked[1] if locked else None)
        total += float(cum.at(np.asarray([result.duration_s]))["energy"][0]) * len(replica.gpus)
    return total


def sim_figures(result: Any, role: str, phase: str) -> dict[str, Any]:
    """A simulated point's figures, named as a live point's (phaselens.power.live.point_figures)."""
    s = summarize(result)
    role_e = _role_energy_j(result, role)
    st = result.stats
    e2e = np.frombuffer(st.finish_s, dtype=np.float64) - np.frombuffer(st.arrival_s, dtype=np.float64)
    gpus = sum(p.gpus for p in result.layout.pools if p.role == role)
    phase_tokens = s.input_tokens if phase == "prefill" else s.output_tokens
    duration = max(s.duration_s, 1e-9)
    nan = lambda v: None if v != v else float(v)  # noqa: E731
    return {
        "requests": s.requests,
        "failed": s.failed,
        "duration_s": round(duration, 3),
        "output_tokens_per_s": s.output_tokens_per_s,
        "output_tokens_per_s_per_gpu": s.output_tokens_per_s_per_gpu,
        "ttft_p50_s": nan(s.ttft_p50_s),
        "ttft_p90_s": nan(s.ttft_p90_s),
        "ttft_p99_s": nan(s.ttft_p99_s),
        "itl_p50_s": nan(s.itl_p50_s),
        "itl_p99_s": nan(s.itl_p99_s),
        "e2e_p50_s": nan(s.e2e_p50_s),
        "e2e_mean_s": float(e2e.mean()) if len(e2e) else None,
        "energy_j": role_e,
        "power_w": role_e / duration / max(gpus, 1),
        "phase_tokens": phase_tokens,
        "tokens_per_j": phase_tokens / role_e if role_e else None,
        "j_per_token": s.energy_j / s.output_tokens if s.output_tokens else None,
        "host_bound_share": None,
        "host_bound": False,
    }


def simulate_sweep(
    layout_text: str,
    shape: str,
    plan: SweepPlan,
    load: LoadSpec,
    *,
    on_note: Callable[[str], None] | None = None,
    trace: list[Any] | None = None,
    options: ChooseOptions | None = None,
) -> dict[str, dict[str, Any]]:
    """Every role's points, simulated (the reference is simulated once: the simulator has no noise).
    ``trace``: these requests at every point instead of ``load``'s steady trace (bench/power_control.py
    calibrates on the conversation trace it then replays). With ``plan.refine``, up to that many
    finer settings per knob near each mode's knee under ``options`` (:func:`knee_brackets`) and, where
    ``options`` has an end-to-end bound, a second pass of up to that many per knob and role around
    the roles' joint choice (:func:`combination_brackets`)."""
    note = on_note or (lambda s: None)
    trace = list(trace) if trace is not None else steady_trace(load, plan.point_s)
    try:
        shape_cfg = model_config_for(shape)
    except ConfigError as e:
        raise CalibrateError(f"--model: {e}") from e
    out: dict[str, dict[str, Any]] = {}
    for role in plan.roles:
        swept = _unique(role)
        points = [_simulate_point(layout_text, shape_cfg, trace, role, s, note) for s in swept]
        if plan.refine:
            brackets = knee_brackets(points, role.phase, options or ChooseOptions())
            finer = refine_settings(role.bounds, brackets, plan.refine, swept)
            points += [
                _simulate_point(layout_text, shape_cfg, trace, role, s, note) | {"refined": "knee"}
                for s in finer
            ]
            points = order_points(points)
        out[role.role] = {"points": points, "complete": True, "stopped": None, "workers": list(role.workers)}
    if plan.refine and options is not None and options.max_e2e_slowdown is not None:
        # a second pass around the roles' joint choice: up to plan.refine more per knob and role
        brackets = combination_brackets(
            {r.role: (r.phase, out[r.role]["points"]) for r in plan.roles}, options
        )
        for role in plan.roles:
            points = out[role.role]["points"]
            done = [Setting.from_dict(p["setting"]) for p in points]
            finer = refine_settings(role.bounds, brackets.get(role.role, {}), plan.refine, done)
            if finer:
                note(f"{role.role}: refining around the joint choice: {', '.join(f.label() for f in finer)}")
            points += [
                _simulate_point(layout_text, shape_cfg, trace, role, f, note) | {"refined": "joint"}
                for f in finer
            ]
            out[role.role]["points"] = order_points(points)
    return out


def _simulate_point(
    layout_text: str,
    shape_cfg: Any,
    trace: list[Any],
    role: RolePlan,
    setting: Setting,
    note: Callable[[str], None],
) -> dict[str, Any]:
    text = layout_text + setting.layout_options(role.role)
    try:
        result = Simulation(parse_layout(text), shape_cfg, trace, scenario="calibrate").run()
    except (LayoutError, SimulationError) as e:
        raise CalibrateError(f"simulating {text}: {e}") from e
    figures = sim_figures(result, role.role, role.phase)
    note(
        f"{role.role}: {setting.label():<22} simulated: {figures['output_tokens_per_s']:.1f} tok/s, "
        f"{figures['power_w']:.0f} W/GPU, {figures['tokens_per_j'] or 0:.3g} tok/J"
    )
    return {"setting": setting.as_dict(), "figures": figures}


def _unique(role: RolePlan) -> list[Setting]:
    """The role's settings without the closing reference (a simulation repeats itself exactly)."""
    seen: list[Setting] = []
    for s in role.settings:
        if s not in seen:
            seen.append(s)
    return seen
