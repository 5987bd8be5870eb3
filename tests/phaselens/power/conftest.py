"""A real emulated stack for the live calibration tests: ``phaselens serve`` disaggregated (one
prefill and one decode worker on emulated H200s modeling 70B), the control token of serving.testing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from serving.sim.live_compare import serve_args_emulated
from serving.testing import TOKEN, Server, start_server, stop_server

__all__ = ["TOKEN", "knobs", "reset_knobs"]


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
