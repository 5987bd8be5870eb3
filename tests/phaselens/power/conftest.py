"""A real emulated stack for the live calibration tests: ``phaselens serve`` disaggregated (one
prefill and one decode worker on emulated H200s modeling 70B), the control token of serving.testing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from analytics.prices import load_prices
from phaselens.power.choose import choose_modes
from phaselens.power.fingerprint import Fingerprint
from phaselens.power.load import LoadSpec
from phaselens.power.plan import plan_sweep
from phaselens.power.records import calibration_row, power_recommendation
from phaselens.power.simulate import sim_bounds, simulate_sweep
from serving.sim.live_compare import serve_args_emulated
from serving.testing import TOKEN, Server, start_server, stop_server

__all__ = ["TOKEN", "knobs", "power_rec", "reset_knobs"]

LAYOUT = "1p1d:h200:gpu_memory_utilization=0.96"


@pytest.fixture(scope="package")
def stack() -> Iterator[Server]:
    server = start_server(*serve_args_emulated(disaggregated=True))
    yield server
    stop_server(server)


def knobs(server: Server, worker: str) -> dict:
    """The worker's knob read (``GET /control/workers/{id}/device``)."""
    with server.control() as c:
        return c.get(f"/control/workers/{worker}/device").json()


def reset_knobs(server: Server) -> None:
    """Every worker back to the defaults, whatever a test left."""
    with server.control() as c:
        for w in c.get("/control/layout").json()["workers"]:
            c.post(f"/control/workers/{w['id']}/device", json={"reset": True}).raise_for_status()


def at_defaults(k: dict) -> bool:
    return k["power_limit_w"] == k["power_limit_default_w"] and k["locked_sm_clock_min_mhz"] is None


def post(server: Server, path: str, body: dict) -> httpx.Response:
    with server.control() as c:
        return c.post(path, json=body)


def power_rec(stack: Server, roles: tuple[str, ...] = ("decode",)) -> dict:
    """A power recommendation for the stack's decode worker (worker-1) — and its prefill worker
    (worker-0) when ``roles`` names it — made from a simulated calibration of the same GPU and model
    (test input: the live sweep is tested on its own)."""
    bounds, _ = sim_bounds(LAYOUT, "llama-3.1-70b")
    workers = {"prefill": "worker-0", "decode": "worker-1"}
    plan = plan_sweep(
        {r: bounds[r] for r in roles}, knobs=["sm_clock"], sm_clocks_mhz=[1440, 885], point_s=30, settle_s=0
    )
    swept = simulate_sweep(LAYOUT, "llama-3.1-70b", plan, LoadSpec(rate_rps=3.0))
    rows = {}
    for role in roles:
        points = swept[role]["points"]
        rows[role] = calibration_row(
            node="test",
            source="simulated",
            target=f"stack:{stack.url}",
            fingerprint=Fingerprint(
                "NVIDIA H200 (emulated)", "emulated", "llama-3.1-70b", "bfloat16", 1, "x"
            ),
            role=role,
            phase=role,
            result={"points": points, "complete": True, "workers": [workers[role]]},
            analysis=choose_modes(points, role),
            duration_s=1.0,
            trust=["simulated"],
            details={},
        )
    before = {w: knobs(stack, w) for w in workers.values()}
    # a loose guard: this test checks the plumbing, not the emulated latency on a loaded host
    rec = power_recommendation(
        node="test",
        target=f"stack:{stack.url}",
        rows=rows,
        mode="eff",
        before=before,
        prices=load_prices(),
    )
    rec["details"]["inputs"]["slo"] = {"ttft_s": 30.0, "tpot_s": 5.0, "target": 0.5}
    return rec
