"""Phase attribution on the live stack: a real 1P1D stack on emulated GPUs, a real collector."""

from __future__ import annotations

import signal
from pathlib import Path

import duckdb
import pytest

from analytics.attribution import STATES, phase_breakdown
from analytics.bimodal import bimodality, idle_split
from analytics.trust import EMULATED, HOST_BOUND, SIMULATED
from analytics.window import resolve_window
from serving.loadgen import run_load
from serving.trace import poisson_trace
from tests.collector.conftest import start_collector
from tests.collector.test_identity import iterations_caught_up
from tests.collector.test_service import rows, wait_for
from tests.serving.conftest import start_server, stop_server

pytestmark = pytest.mark.slow


def test_the_attribution_runs_on_a_live_emulated_stack_and_labels_host_bound_windows(tmp_path: Path) -> None:
    stack = start_server("--mode", "disaggregated", "--device", "emulated:h100-sxm")
    db = tmp_path / "live.duckdb"
    try:
        proc, url = start_collector(db, "--serving", stack.url, "--flush-interval", "0.2")
        try:
            wait_for(lambda: len(rows(url, "devices")) >= 2)
            report = run_load(
                stack.url, poisson_trace(20, 6, prompt_tokens=48, output_tokens=8, seed=3), progress=False
            )
            assert report.n_ok == 6
            wait_for(lambda: len(rows(url, "requests")) >= 6)
            wait_for(lambda: iterations_caught_up(url))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        stop_server(stack)

    con = duckdb.connect(str(db), read_only=True)
    lo, hi = con.execute("SELECT min(ts_s), max(ts_s) + 1 FROM gpu_samples").fetchone()
    w = resolve_window(con, start_s=lo, end_s=hi)
    pb = phase_breakdown(con, w)
    assert EMULATED in pb.trust.labels and SIMULATED not in pb.trust.labels
    assert set(pb.per_pool["role"]) == {"prefill", "decode"}
    roles = pb.per_gpu.set_index("role")
    assert roles.loc["prefill", "prefill_s"] > 0 and roles.loc["decode", "decode_s"] > 0
    for _, g in pb.per_gpu.iterrows():
        assert sum(g[f"frac_{s[:-2]}"] for s in STATES) == pytest.approx(1.0)
        assert sum(g[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(g["energy_j"], rel=1e-6)
    # host-bound exactly when the store says the emulated GPUs could not keep pace
    lagged = con.execute(
        "SELECT (SELECT count(*) FROM iterations WHERE lag_s > 0)"
        " + (SELECT count(*) FROM gpu_samples WHERE host_bound_pct > 0)"
    ).fetchone()[0]
    assert (HOST_BOUND in pb.trust.labels) == (lagged > 0)
    sp = idle_split(con, w, breakdown=pb)
    assert (HOST_BOUND in sp.trust.labels) == (lagged > 0)
    assert not bimodality(con, w).table.empty
