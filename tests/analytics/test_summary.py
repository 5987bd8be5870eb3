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
    assert set(summary["parts"]) == {"phases", "idle", "bimodal", "cost", "latency", "serving"}


def test_the_live_data_set_of_a_simulated_store_is_empty_not_mixed(sim_db, capsys):
    rc, out, _ = _analyze(capsys, "--db", str(sim_db), "--since", "30d", "--json")
    assert rc == 0
    summary = json.loads(out)
    assert "simulated" not in summary["trust"]["labels"]  # live never includes scenario rows
    # ... and says what the store does hold: the scenarios to name with --dataset
    ids = [s["scenario_id"] for s in scenarios_of(sim_db)]
    hint = summary["missing"]["window"]
    assert "--dataset latest" in hint and all(i in hint for i in ids) and "2 simulated scenario(s)" in hint
    rc, out, _ = _analyze(capsys, "--db", str(sim_db), "--since", "30d")
    assert rc == 0 and "trust: no data" in out and "--dataset latest" in out
    top = out.splitlines()[:3]  # said right under the trust line, not only at the end
    assert top[1] == "trust: no data" and "--dataset latest" in top[2]


def scenarios_of(db):
    import duckdb

    from analytics.window import scenarios

    with duckdb.connect(str(db), read_only=True) as con:
        return scenarios(con)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "soon"], "is not a time span"),
        (["--dataset", "no-such-scenario"], "unknown data set 'no-such-scenario'"),
        (["--slo-ttft-ms", "-5"], "slo_ttft_ms must be > 0"),
        (["--fleet-gpus", "0"], "fleet_gpus must be >= 1"),
        (["--since", "inf"], "time span 'inf' must be finite"),
        (["--since", "0"], "time span '0' must be > 0"),
        (["--start-s", "-5"], "--start-s -5 is 1969-12-31 23:59:55 UTC: give UTC epoch seconds from 2000 on"),
        (["--start-s", "1796185000", "--end-s", "3600"], "--end-s 3600 is 1970-01-01 01:00:00 UTC"),
        (["--start-s", "nan"], "--start-s must be finite"),
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


def test_format_summary_prints_p_values_money_and_slos_one_way():
    from analytics.summary import format_summary

    summary = {
        "window": {"dataset": "live", "start_s": 1796185700.0, "end_s": 1796186100.0, "duration_s": 400.0},
        "trust": {"labels": ["emulated"], "notes": []},
        "parts": {
            "bimodal": {
                "table": [{"scope": "pool", "role": "decode", "n": 10, "dip_p_value": 0.0, "bimodal": True}]
            },
            "cost": {
                "total": {
                    "usd_per_1m_output": 4.3149,
                    "usd_per_1m_output_decode": 1.0712,
                    "usd_per_1m_output_stranded": 35.591,
                    "usd_per_1m_output_host_bound": 0.11662,
                    "usd_per_1m_output_idle": 0.0016012,
                    "cost_usd": 1234.4,
                }
            },
            "latency": {"slo": {"ttft_s": 2.0, "tpot_s": 0.1}, "attainment": {"both": 0.9}, "requests": 10},
        },
        "missing": {},
    }
    out = format_summary(summary)
    decode_row = next(line for line in out.splitlines() if line.strip().startswith("decode"))
    assert "< 0.001" in decode_row and " 0 " not in decode_row
    assert (
        "$/1M output tokens $4.31  = decode $1.07 + stranded $35.6 + host-bound $0.117 + idle $0.00160" in out
    )
    assert "window cost $1,234 for" in out
    assert "(TTFT ≤ 2,000 ms and TPOT ≤ 100 ms)" in out
