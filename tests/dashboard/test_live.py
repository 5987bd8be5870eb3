"""The dashboard on live data: an emulated serving stack, a collector reading it, a little load."""

from __future__ import annotations

import time

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.figures.gpus import PANELS
from serving.loadgen import run_load
from serving.trace import poisson_trace
from tests.collector.conftest import start_collector
from tests.conftest import stop_process
from tests.dashboard.conftest import APP
from tests.serving.conftest import start_server, stop_server

pytestmark = pytest.mark.slow


def test_live_emulated_gpus_are_charted_and_labelled_emulated(tmp_path, monkeypatch):
    stack = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    proc = None
    try:
        proc, url = start_collector(
            tmp_path / "live.duckdb", "--serving", stack.url, "--report-schedule", "off"
        )
        report = run_load(
            stack.url, poisson_trace(20, 8, prompt_tokens=64, output_tokens=12, seed=3), progress=False
        )
        assert report.n_ok == 8
        deadline = time.monotonic() + 30
        while len(httpx.get(f"{url}/api/v1/tables/iterations", params={"limit": 10}).json()["rows"]) < 10:
            assert time.monotonic() < deadline, "the collector stored no iterations"
            time.sleep(0.3)
        monkeypatch.setenv("PHASELENS_API_URL", url)
        at = AppTest.from_file(APP, default_timeout=60)
        at.switch_page("views/gpus.py")  # the default page is the Overview
        at.run()
        assert not at.exception
        assert at.sidebar.selectbox(key="dataset").value == "live"  # live GPUs: the default data set
        at.sidebar.selectbox(key="live_range").set_value("last 5 minutes").run()
        grid = "".join(m.value for m in at.markdown if "pl-panel" in m.value)
        assert grid.count("<figure class='pl-panel'") == len(PANELS)  # one chart per metric
        # the prefill and the decode worker's GPU: a line each, on every chart; times in UTC
        assert grid.count("class='pl-line' data-group=") >= 2 * len(PANELS)
        assert grid.count(">time, UTC<") == len(PANELS)
        texts = "\n".join(m.value for m in at.markdown)
        assert texts.count(":orange-badge[emulated]") == 1  # the page's trust label, shown once
        at.switch_page("views/health.py").run()
        sources = at.dataframe[0].value
        assert len(sources) == 1 and set(sources["Status"]) == {"ok"}  # serving:URL, one read
    finally:
        if proc is not None:
            stop_process(proc)
        stop_server(stack)
