"""`phaselens demo`, the README's first command, run as a user runs it (the real CLI as a subprocess on
free ports and a temporary store): every part comes up, the store fills, the simulated scenario is
merged, Ctrl-C stops every process, and a second run reuses the store."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from phaselens.demo import Child, DemoPlan, Supervisor, trace_span_text
from tests.conftest import ROOT, SIM_REQUESTS, DemoRun, _free_port

pytestmark = pytest.mark.slow
DEMO = [sys.executable, "-m", "phaselens.cli", "demo"]


def _grows(demo: DemoRun, table: str, start_s: float, at_least: int, timeout_s: float = 90.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (n := demo.count(table, start=start_s)) < at_least:
        assert time.monotonic() < deadline, (
            f"{table}: {n} rows since the start, wanted {at_least}\n{demo.output}"
        )
        time.sleep(1.0)
    return n


def test_every_part_comes_up_and_says_where(demo: DemoRun):
    demo.ensure_up()
    out = demo.output
    for part in ("serving is up", "collector is up", "dashboard is up"):
        assert part in out
    assert f"dashboard      {demo.dashboard_url}" in out
    assert f"collector API  {demo.collector_url}" in out
    assert f"serving API    {demo.serve_url}/v1" in out
    assert "emulated H100s" in out  # no GPU here: said, not hidden
    if "simulating" in out:  # the first run: the traffic it simulates is that of its requests
        assert (
            f"for the first {SIM_REQUESTS} requests of the trace ({trace_span_text(SIM_REQUESTS)} of" in out
        )
        assert "7 minutes" not in out
    assert httpx.get(f"{demo.dashboard_url}/_stcore/health", timeout=10).status_code == 200
    page = httpx.get(demo.dashboard_url, timeout=10)
    assert page.status_code == 200 and "<html" in page.text.lower()
    health = httpx.get(f"{demo.collector_url}/health", timeout=10).json()
    assert health["db_path"] == str(demo.db)
    assert httpx.get(f"{demo.serve_url}/health", timeout=10).json()["serving"]


def test_the_store_fills_with_live_rows_and_the_simulated_scenario(demo: DemoRun):
    demo.ensure_up()
    t0 = time.time()
    first = _grows(demo, "gpu_samples", t0, 20)
    _grows(demo, "gpu_samples", t0, first + 20)  # the emulated GPUs keep being sampled
    _grows(demo, "requests", t0, 3)  # the replay's requests, stored from the stack's telemetry
    scenario = demo.wait_for_scenario()
    assert scenario["label"] == "simulated"
    assert scenario["model"] == "llama-3.1-70b" and scenario["name"] == "agg:8xh100-sxm:tp2"
    assert scenario["trace"]["requests"] == 200
    demo.wait_for("simulated scenario stored", 60)
    assert f"?dataset={scenario['scenario_id']}" in demo.output
    assert demo.count("gpu_samples", node=f"sim:{scenario['scenario_id']}") > 0


def test_a_part_that_dies_is_restarted_and_counted(demo: DemoRun):
    demo.ensure_up()
    supervisor = psutil.Process(demo.proc.pid)
    (dashboard,) = [p for p in supervisor.children() if "streamlit" in " ".join(p.cmdline())]
    dashboard.kill()
    demo.wait_for("dashboard died (exit code -9; 1 so far); starting it again in 1 s", 30)
    demo.wait_for("dashboard is up again (restart 1)", 120)
    assert httpx.get(f"{demo.dashboard_url}/_stcore/health", timeout=10).status_code == 200


def test_ctrl_c_stops_every_process_and_a_second_run_reuses_the_store(demo: DemoRun):
    demo.ensure_up()
    scenario = demo.wait_for_scenario()
    demo.wait_for("simulated scenario stored", 60)  # the simulation's process has ended
    _grows(demo, "requests", 0, 1)
    supervisor = psutil.Process(demo.proc.pid)
    children = supervisor.children(recursive=True)
    # serving (router + 2 workers), collector, dashboard (and the replay's pass, unless between two)
    lines = [" ".join(c.cmdline()) for c in children]
    for part in ("phaselens.cli serve", "phaselens.cli collect", "streamlit run"):
        assert any(part in line for line in lines), lines
    assert len(children) >= 5, lines
    stopped_s = time.time()
    assert demo.stop(signal.SIGINT) == 0, demo.output
    assert "SIGINT received; stopping replay, dashboard, collector, serving" in demo.output
    assert "stopped (restarts: dashboard 1)" in demo.output
    assert "did not stop within" not in demo.output  # each child stopped on its signal, none killed
    assert "Traceback" not in demo.output
    left = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [(p.pid, p.cmdline()) for p in left]

    demo.start()  # the same command again: the same store
    out = demo.output
    assert f"store {demo.db} (reused: its rows stay)" in out
    assert f"simulated scenario {scenario['scenario_id']}" in out and "not simulated again" in out
    assert [s["scenario_id"] for s in demo.scenarios()] == [scenario["scenario_id"]]
    assert demo.count("requests", end=stopped_s) >= 1  # the first run's rows are still there
    assert demo.count("gpu_samples", end=stopped_s) > 0


def test_a_port_in_use_is_refused_naming_the_port_and_the_flag(tmp_path):
    free = ["--serve-port", str(_free_port()), "--dashboard-port", str(_free_port())]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [*DEMO, "--db", str(tmp_path / "d.duckdb"), *free, "--collector-port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert (
        f"port {port} (collector API) on 127.0.0.1 is in use; choose another with --collector-port"
        in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "d.duckdb").exists()  # refused before anything started


def test_a_part_that_cannot_come_up_ends_the_demo_with_its_reason(tmp_path):
    ports = ["--serve-port", str(_free_port()), "--collector-port", str(_free_port())]
    only_serving = ["--no-sim", "--no-dashboard", "--no-replay"]
    done = subprocess.run(
        [
            *DEMO,
            "--db",
            str(tmp_path / "d.duckdb"),
            *ports,
            "--device",
            "cuda:99",  # a well-formed spec (a bad one is refused before anything starts) of no GPU here
            *only_serving,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "error: serving exited with code 2 before it came up; the end of " in done.stderr
    assert "asked for cuda:99 but" in done.stderr  # the child's own reason
    assert "stopping serving" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "d.duckdb").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sim-requests", "0"], "--sim-requests must be in [1, 2000]"),
        (["--replay-time-scale", "0"], "--replay-time-scale must be in [0.1, 1000], got 0"),
        (["--exit-after", "-1"], "--exit-after must be in (0, 604800] s, got -1"),
        (["--serve-port", "70000"], "--serve-port must be in [1, 65535], got 70000"),
        (["--serve-port", "9", "--collector-port", "9"], "both ask for port 9; change --collector-port"),
        (["--device", "bogus"], "--device bogus: bad device spec 'bogus': expected 'cpu', 'cuda', 'cuda:N'"),
        (["--device", "cpu,emulated:h1"], "--device cpu,emulated:h1: bad device spec 'emulated:h1'"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(tmp_path, capsys, args, message):
    from phaselens.cli import main

    assert main(["demo", "--db", str(tmp_path / "d.duckdb"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no store, no logs


def _plan(where, *, replay: bool) -> DemoPlan:
    return DemoPlan(
        db=where / "x.duckdb",
        log_dir=where / "x-logs",
        serve_port=1,
        collector_port=2,
        dashboard_port=3,
        device="emulated:h100-sxm",
        device_note="",
        token="t",
        sim=False,
        dashboard=False,
        replay=replay,
        replay_time_scale=4.0,
        sim_requests=1,
        exit_after_s=None,
    )


def test_the_replay_walks_the_trace_window_by_window_and_wraps():
    from phaselens.demo import REPLAY_WINDOW_S, TRACE_SPAN_S, replay_argv

    plan = _plan(ROOT, replay=True)
    windows = int(TRACE_SPAN_S // REPLAY_WINDOW_S)

    def start_of(n: int) -> float:
        argv = replay_argv(plan, n)
        return float(argv[argv.index("--start") + 1])

    assert [start_of(n) for n in range(windows + 1)] == [
        *(k * REPLAY_WINDOW_S for k in range(windows)),
        0.0,
    ]
    argv = replay_argv(plan, 0)
    assert argv[argv.index("--time-scale") + 1] == "4"
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:1"


_SLOW_WEB = """
import runpy, sys, time
time.sleep(0.5)
sys.argv = ["http.server", sys.argv[1], "--bind", "127.0.0.1"]
runpy.run_module("http.server", run_name="__main__")
"""


def test_a_part_is_said_up_with_the_time_since_its_own_start(tmp_path):
    """The dashboard starts with the stack but was said up '(0.3 s)' after the stack and the collector:
    the time counted from the start of the wait, not of the part."""
    import io
    import re

    port = _free_port()
    web = Child(
        "web",
        # a part that is not up for at least 0.5 s after its start, whatever the machine's speed
        lambda _n: [sys.executable, "-c", _SLOW_WEB, str(port)],
        tmp_path / "web.log",
        health_url=f"http://127.0.0.1:{port}/",
        stop_signal=signal.SIGTERM,
    )
    out = io.StringIO()
    sup = Supervisor(_plan(tmp_path, replay=False), out=out)
    sup.children = {"web": web}
    web.start()
    try:
        began = time.monotonic()
        while not web.is_healthy():
            time.sleep(0.05)
        took = time.monotonic() - began  # no more than the time since its start
        sup._wait_healthy([web])
    finally:
        web.stop()
    said = float(re.search(r"web is up \((\d+\.\d) s\)", out.getvalue()).group(1))
    assert said >= round(took, 1), (said, took)
    assert took >= 0.5  # so a time counted from the start of the wait (later) would read less
