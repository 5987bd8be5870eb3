"""A live stack window's recommendation replays with the front end's dispatch delay: a real emulated
stack, a real collector storing its requests and iterations, ``phaselens recommend --db F --since``
— the delay measured from the window's rows (the median wait of the requests that found their worker
idle), stored in ``details.inputs`` and said in the output, and the current layout's replay (the
confidence) closer to the measured TTFT p90 than the same replay without it."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import duckdb
import pytest

from analytics.reads import window_of
from analytics.recommend.evaluate import simulate
from analytics.workload import requests_trace
from phaselens.cli import main
from phaselens.testing import start_collector
from serving.config import model_config_for
from serving.loadgen import run_load
from serving.sim.layout import parse_layout
from serving.sim.summary import summarize
from serving.testing import Server
from serving.trace import poisson_trace
from tests.conftest import stop_process

from .conftest import reset_layout

SLO = ["--slo-ttft-ms", "1000", "--slo-tpot-ms", "50", "--slice-requests", "30"]


def _since(t0: float) -> str:
    """A window reaching back just past ``t0``: the module's stack served other tests' requests
    before, and a new collector stores what its telemetry ring still holds of them."""
    return f"{math.ceil(time.time() - t0) + 1}s"


def _stored_requests(db_url: str, t0: float) -> int:
    import httpx

    body = httpx.get(f"{db_url}/api/v1/workload", params={"since": _since(t0)}, timeout=30).json()
    return int((body.get("observed") or {}).get("request_count") or 0)


def test_a_live_windows_replay_adds_the_measured_dispatch_delay(
    stack: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_layout(stack)
    db = tmp_path / "s.duckdb"
    proc, url = start_collector(db, "--serving", stack.url, "--report-schedule", "off")
    try:
        time.sleep(1.0)  # subscribed to the stack's telemetry
        trace = poisson_trace(4.0, 20, prompt_tokens=(64, 256), output_tokens=(8, 24), seed=7)
        t0 = time.time() - 0.5
        run_load(stack.url, trace, progress=False)
        deadline = time.monotonic() + 120  # the telemetry's way to the store, on a loaded host too
        while _stored_requests(url, t0) < len(trace) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _stored_requests(url, t0) == len(trace)
        time.sleep(1.5)  # the iterations' last batch flushed
    finally:
        stop_process(proc)

    assert main(["recommend", "--db", str(db), "--since", _since(t0), *SLO, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    inputs, details = row["details"]["inputs"], row["details"]
    delay_s = inputs["dispatch_delay_s"]
    assert row["target"] == f"stack:{stack.url.rstrip('/')}"
    assert 0 < delay_s < 1.0 and 0 < inputs["dispatch_delay"]["requests"] <= len(trace)
    assert inputs["dispatch_delay"]["of_requests"] == len(trace)

    # the same replay of the current layout without the delay
    con = duckdb.connect(str(db), read_only=True)
    try:
        window = window_of(con, {"start_s": inputs["window"]["start_s"], "end_s": inputs["window"]["end_s"]})
        replay = requests_trace(con, window)
    finally:
        con.close()
    assert len(replay) == len(trace)
    without_s = summarize(
        simulate(parse_layout(inputs["current"]), model_config_for(inputs["model"]), replay)
    ).ttft_p90_s
    with_s = details["current_predicted"]["ttft_p90_s"]
    measured_s = details["measured"]["ttft_p90_s"]
    assert with_s > without_s  # the delay is in the stored replay
    assert with_s - without_s == pytest.approx(delay_s, rel=0.5, abs=2e-3)  # queueing may shift it a little
    error_with = details["confidence"]["replay_error_pct"]["ttft_p90"]
    error_without = (without_s - measured_s) / measured_s * 100.0
    assert error_with == pytest.approx((with_s - measured_s) / measured_s * 100.0)
    # the replay moves toward the measurement only where it was below it: the delay (sub-ms here)
    # adds to the simulated TTFT, so the error changes by about delay / measured, either way
    assert error_with - error_without == pytest.approx(delay_s / measured_s * 100.0, rel=0.5, abs=0.5)

    # the text output says it
    assert main(["recommend", "--db", str(db), "--since", _since(t0), *SLO]) == 0
    out = capsys.readouterr().out
    assert f"dispatch delay: {delay_s * 1e3:.1f} ms — the median wait from arrival to first scheduling" in out
