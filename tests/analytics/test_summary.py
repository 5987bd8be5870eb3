"""`phaselens analyze` and the service's summary endpoint, on a real simulated store."""

from __future__ import annotations

import json

import httpx
import pytest

from collector.cli import main
from tests.collector.conftest import start_collector

TOKEN = "analyze-token"


@pytest.fixture(scope="module")
def sim_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("analyze") / "sim.duckdb"
    rc = main(
        [
            "simulate",
            "--no-progress",
            "--layout",
            "agg:2xh100-sxm",
            "--layout",
            "1p1d:h100-sxm",
            "--limit",
            "300",
            "--db",
            str(db),
        ]
    )
    assert rc == 0
    return db


def _analyze(capsys, *args):
    rc = main(["analyze", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_analyze_prints_every_part_of_a_scenario_labelled_simulated(sim_db, capsys):
    rc, out, err = _analyze(capsys, "--dataset", "latest", "--db", str(sim_db))
    assert rc == 0, err
    assert "trust: simulated" in out
    for title in (
        "GPU time by phase",
        "Where the GPU time goes",
        "SM activity: bimodal?",
        "Cost per token",
        "$/1M output tokens",
        "Latency (ms)",
        "SLO attainment",
        "Power model per GPU",
    ):
        assert title in out, out
    rc, out, _ = _analyze(capsys, "--dataset", "latest", "--db", str(sim_db), "--json")
    summary = json.loads(out)
    assert summary["window"]["dataset"] != "live"
    assert "simulated" in summary["trust"]["labels"]
    assert set(summary["parts"]) == {"phases", "idle", "bimodal", "cost", "latency"}


def test_the_live_data_set_of_a_simulated_store_is_empty_not_mixed(sim_db, capsys):
    rc, out, _ = _analyze(capsys, "--db", str(sim_db), "--since", "30d", "--json")
    assert rc == 0
    summary = json.loads(out)
    assert "simulated" not in summary["trust"]["labels"]  # live never includes scenario rows


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "soon"], "is not a time span"),
        (["--dataset", "no-such-scenario"], "unknown data set 'no-such-scenario'"),
        (["--slo-ttft-ms", "-5"], "slo_ttft_ms must be > 0"),
        (["--fleet-gpus", "0"], "fleet_gpus must be >= 1"),
    ],
)
def test_bad_arguments_are_named(sim_db, capsys, args, says):
    rc, _, err = _analyze(capsys, *args, "--db", str(sim_db))
    assert rc == 2 and says in err


def test_the_collector_serves_the_same_summary(sim_db, tmp_path, capsys):
    db = tmp_path / "copy.duckdb"
    db.write_bytes(sim_db.read_bytes())
    proc, url = start_collector(db, "--control-token", TOKEN)
    try:
        resp = httpx.get(f"{url}/api/v1/analytics/summary", params={"dataset": "latest"}, timeout=120)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert "simulated" in body["trust"]["labels"] and body["parts"]
        bad = httpx.get(f"{url}/api/v1/analytics/summary", params={"colour": "red"}, timeout=30)
        assert bad.status_code == 400 and "colour" in bad.json()["error"]["message"]
        bad = httpx.get(f"{url}/api/v1/analytics/summary", params={"since": "-1h"}, timeout=30)
        assert bad.status_code == 400
        rc, out, err = _analyze(capsys, "--dataset", "latest", "--collector", url)
        assert rc == 0, err
        assert "Cost per token" in out
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_second_cursor_changes_no_figure(sim_db):
    """Token counts and latency run on a second cursor beside the interval table; one cursor, in
    turn (beside=False), gives the same summary (floats to 1e-9: DuckDB's parallel sums)."""
    import duckdb

    from analytics.cli import run_summary

    con = duckdb.connect(str(sim_db), read_only=True)
    try:
        params = {"dataset": "latest"}
        beside = run_summary(con.cursor(), params)
        serial = run_summary(con.cursor(), params, beside=False)
    finally:
        con.close()
    assert set(beside["seconds"]) == set(serial["seconds"]) >= {"phases", "cost", "latency"}
    assert beside["missing"] == serial["missing"] and beside["trust"] == serial["trust"]
    _assert_close(beside["parts"], serial["parts"], "parts")


#: figures that differ between two runs of the same code (cancellation in DuckDB's unordered sums of
#: squares: docs/BENCHMARKS.md, "analytics"): R² and RMSE of flat or exact fits, moments of a constant
_DEGENERATE = {"r2", "rmse_j", "skewness", "kurtosis", "std_sm_pct"}


def _assert_close(a, b, path):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), path
        for k in a:
            if k not in _DEGENERATE:
                _assert_close(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-15, nan_ok=True), path
    else:
        assert a == b, path
