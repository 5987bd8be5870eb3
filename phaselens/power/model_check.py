"""The confidence of a power recommendation: the GPU model's prediction of the chosen settings
against what the calibration measured. The stack's layout (its roles, one GPU each, phaselens
serve's engine settings and KV blocks) is simulated under the same steady load at the defaults and
with each role's chosen setting; the tokens/J gain the model predicts is compared with the measured
one (percentage points), and the phase latency's change likewise."""

from __future__ import annotations

from typing import Any

from phaselens.power.choose import slowdown_pct
from phaselens.power.load import LoadSpec, steady_trace
from phaselens.power.plan import Setting
from serving.config import ConfigError, model_config_for
from serving.devices.gpu_specs import GPU_SPECS
from serving.sim.layout import LayoutError, check_layout, parse_layout
from serving.sim.live_compare import ENGINE_OPTIONS
from serving.sim.simulator import Simulation, SimulationError

_UTILIZATIONS = (0.9, 0.96)  # as analytics.recommend.window: 0.96 lets 70B fit one H200


def gpu_key(gpu_model: str) -> str | None:
    """The GPU spec key of an NVML name (``NVIDIA H200 (emulated)`` → ``h200``), None if unknown."""
    name = gpu_model.removesuffix(" (emulated)").removesuffix(" (simulated)")
    return next((k for k, s in GPU_SPECS.items() if s.name == name), None)


def stack_layout(roles: dict[str, int], gpu: str, model: str, kv_blocks: int | None) -> str | None:
    """The simulator's layout of a bundled stack (one GPU per worker), or None when none fits."""
    if roles.get("mixed"):
        head = f"agg:{roles['mixed']}x{gpu}"
    elif roles.get("prefill") and roles.get("decode"):
        head = f"{roles['prefill']}p{roles['decode']}d:{gpu}"
    else:
        return None
    kv = f":kv_blocks={kv_blocks}" if kv_blocks else ""
    for util in _UTILIZATIONS:
        text = f"{head}:{ENGINE_OPTIONS}{kv}:gpu_memory_utilization={util:g}"
        try:
            check_layout(parse_layout(text), model_config_for(model))
            return text
        except (LayoutError, ConfigError):
            continue
    return None


def model_check(
    rows: dict[str, dict[str, Any]],
    mode: str,
    layout: str | None,
    load: LoadSpec | None,
    point_s: float,
) -> dict[str, Any] | None:
    """Per role with a chosen setting: the measured and the predicted tokens/J gain and phase-latency
    change, % and the error in points; None when the stack has no simulator layout or load."""
    from phaselens.power.simulate import sim_figures

    if layout is None or load is None:
        return None
    trace = steady_trace(load, point_s)
    out: dict[str, Any] = {}
    ref_cache: dict[str, Any] = {}
    for role, row in rows.items():
        m = row["details"]["choice"]["modes"][mode]
        if m.get("keep_defaults"):
            continue
        shape = model_config_for(row["model"])
        setting = Setting.from_dict(m["setting"])
        try:
            if "ref" not in ref_cache:
                ref_cache["ref"] = Simulation(parse_layout(layout), shape, trace, scenario="check").run()
            got = Simulation(
                parse_layout(layout + setting.layout_options(role)), shape, trace, scenario="check"
            ).run()
        except (LayoutError, SimulationError) as e:
            out[role] = {"error": str(e)}
            continue
        ref_f = sim_figures(ref_cache["ref"], role, row["phase"])
        f = sim_figures(got, role, row["phase"])
        predicted = (f["tokens_per_j"] / ref_f["tokens_per_j"] - 1) * 100 if ref_f["tokens_per_j"] else None
        measured = m.get("tokens_per_j_gain_pct")
        out[role] = {
            "setting": setting.label(),
            "tokens_per_j_gain_pct": {"measured": measured, "predicted": _r(predicted)},
            "phase_latency_change_pct": {
                "measured": _r(slowdown_pct(m["figures"], row["reference"], row["phase"])),
                "predicted": _r(slowdown_pct(f, ref_f, row["phase"])),
            },
            "error_pp": _r(predicted - measured) if predicted is not None and measured is not None else None,
            "layout": layout,
        }
    return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)
