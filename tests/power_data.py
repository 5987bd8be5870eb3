"""Test input for the Power page, its API and the report's energy section: calibration rows made
the way ``phaselens calibrate --simulate`` makes them (the real simulator sweeps the knobs, the real
choice picks the cliff and the modes, ``phaselens.power.records`` makes the rows), for a target the
test names, and a ``power`` recommendation from them."""

from __future__ import annotations

from typing import Any

from analytics.prices import load_prices
from phaselens.cli.calibrate import bounds_dict
from phaselens.power.choose import choose_modes
from phaselens.power.fingerprint import Fingerprint
from phaselens.power.load import LoadSpec
from phaselens.power.plan import plan_sweep
from phaselens.power.records import calibration_row, power_recommendation
from phaselens.power.simulate import sim_bounds, simulate_sweep

MODEL = "llama-3.1-70b"


def fingerprint(gpu: str = "NVIDIA H200 (emulated)", engine: str = "x", model: str = MODEL) -> Fingerprint:
    """An emulated GPU's engine fingerprint (``engine``: its version)."""
    return Fingerprint(gpu, "emulated", model, "bfloat16", 1, engine)


def calibration(
    target: str,
    role: str = "decode",
    *,
    layout: str = "1p1d:h200:gpu_memory_utilization=0.96",
    workers: list[str] | None = None,
    fp: Fingerprint | None = None,
    trust: list[str] | None = None,
    points: int = 3,
    model: str = MODEL,
) -> dict[str, Any]:
    """One role's simulated sweep of both knobs as a ``power_calibrations`` row (``trust`` as given,
    else simulated)."""
    roles, _ = sim_bounds(layout, model)
    plan = plan_sweep(
        {role: roles[role]}, knobs=["power_limit", "sm_clock"], points=points, point_s=20, settle_s=0
    )
    points_ = simulate_sweep(layout, model, plan, LoadSpec(rate_rps=3.0))[role]["points"]
    return calibration_row(
        node="test",
        source="simulated",
        target=target,
        fingerprint=fp or fingerprint(),
        role=role,
        phase=role,
        result={"points": points_, "complete": True, "workers": workers or ["worker-1"]},
        analysis=choose_modes(points_, role),
        duration_s=1.0,
        trust=trust or ["simulated"],
        details={"bounds": bounds_dict(roles[role][0][1]), "point_s": 20},
    )


def recommendation(target: str, rows: dict[str, dict[str, Any]], mode: str = "bal") -> dict[str, Any]:
    """The ``power`` recommendation of ``mode`` from ``rows`` (role → calibration row); the knobs
    before: the defaults."""
    before = {w: {"reset": True} for r in rows.values() for w in r["details"]["workers"]}
    return power_recommendation(
        node="test", target=target, rows=rows, mode=mode, before=before, prices=load_prices()
    )
