"""`phaselens analyze` and the service's summary endpoint, on a real simulated store."""

from __future__ import annotations

import json

import httpx
import pytest

from phaselens.cli import main
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
    assert set(summary["parts"]) == {
        "phases",
        "idle",
        "bimodal",
        "roofline",
        "cost",
        "latency",
        "serving",
        "throughput",
    }


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
        (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be a finite number of milliseconds > 0"),
        (["--fleet-gpus", "0"], "fleet_gpus must be >= 1"),
        (["--since", "inf"], "time span since='inf' must be > 0 and at most 36500d"),
        (["--since", "0"], "time span since='0' must be > 0"),
        (["--start-s", "-5"], "--start-s -5 is 1969-12-31 23:59:55 UTC: give UTC epoch seconds from 2000 on"),
        (["--start-s", "1796185000", "--end-s", "3600"], "--end-s 3600 is 1970-01-01 01:00:00 UTC"),
        (["--start-s", "nan"], "--start-s must be finite"),
        (
            ["--gpus", "some"],
            "--gpus must be a whole number of GPU rows >= 0 (0: the pools only) or 'all', got 'some'",
        ),
        (
            ["--gpus", "-1"],
            "--gpus must be a whole number of GPU rows >= 0 (0: the pools only) or 'all', got '-1'",
        ),
        (["--gpus", "2.5"], "or 'all', got '2.5'"),
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
                "table": [
                    {"scope": "pool", "role": "decode", "n": 10, "dip_p_value": 0.0, "bimodal": True}
                    | {
                        "mode_low_pct": 0.00708,
                        "mode_high_pct": 49.83,
                        "weight_low": 0.848,
                        "weight_high": 0.152,
                    },
                    {"scope": "pool", "role": "prefill", "n": 10, "dip_p_value": 0.5, "bimodal": False}
                    | {"mode_low_pct": 12.345, "mode_high_pct": None, "weight_low": 1.0, "weight_high": 0.0},
                ]
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
    assert decode_row.endswith("0.0 % (84.8 %) / 49.8 % (15.2 %)")  # modes to a tenth of a point
    prefill_row = next(line for line in out.splitlines() if line.strip().startswith("prefill"))
    assert prefill_row.endswith("one: 12.3 %")
    assert (
        "$/1M output tokens $4.31  = decode $1.07 + stranded $35.6 + host-bound $0.117 + idle $0.00160" in out
    )
    assert "window cost $1,234 for" in out
    assert "(TTFT ≤ 2,000 ms and TPOT ≤ 100 ms)" in out


# -- the text of a fleet: per-GPU rows capped, GPUs in natural order, repeated messages grouped ---------

NODES = {"node-a": 12, "node-b": 8}  # 20 GPUs; node-a's indices reach 10 and 11 (after 1 as strings)
BOUND_NOTE = "prefill power at its bound 700 W (the GPU's power limit): the unbounded fit exceeds what the GPU can draw"
NO_SPREAD = "constant / no spread (SM activity std 0.00 points < 0.5): bimodality not defined"


def _key(node: str, i: int) -> str:
    return f"{node}|nvml|cuda:{i}|{i}"


def fleet_summary() -> dict:
    """The JSON form of a summary of 20 GPUs on two nodes, its per-GPU entries in string order:
    node-a's mixed pool is bimodal, node-b's decode pool is not; GPU node-a/10 and node-b/3 disagree
    with their pool, node-a/2 and node-b/7 have the largest dips; node-b/0's R² is undefined and
    node-a/11, node-b/5 and node-a/3 fit worst."""
    keys = sorted(_key(node, i) for node, n in NODES.items() for i in range(n))
    dips = {_key("node-a", 2): 0.5, _key("node-b", 7): 0.4, _key("node-a", 10): 0.01, _key("node-b", 3): 0.02}
    differs = {_key("node-a", 10), _key("node-b", 3)}
    r2 = {_key("node-b", 0): None, _key("node-a", 11): 0.2, _key("node-b", 5): 0.5, _key("node-a", 3): 0.6}
    table = [
        {"scope": "pool", "role": "mixed", "n": 1000, "dip": 0.3, "dip_p_value": 0.0, "bimodal": True},
        {"scope": "pool", "role": "decode", "n": 800, "dip": 0.01, "dip_p_value": 0.9, "bimodal": False},
    ]
    poor = "power model fits poorly on 4 of 20 GPUs"
    fits, missing = {}, {"phases.0": poor, "idle.0": poor}
    for k in keys:
        mixed = k.startswith("node-a")
        table.append(
            {
                "scope": "gpu",
                "role": "mixed" if mixed else "decode",
                "gpu": k,
                "n": 50,
                "dip": dips.get(k, 0.1),
                "dip_p_value": 0.5,
                "bimodal": mixed != (k in differs),
            }
        )
        notes = [BOUND_NOTE] if mixed else []
        if k in r2 and r2[k] is None:
            notes.append("R² undefined: interval energies do not vary")
        fits[k] = {
            "coef_w": {"prefill": 700.0, "decode": 300.0, "idle": 100.0},
            "r2": r2.get(k, 0.99),
            "notes": notes,
            "bound_w": 700.0,
            "bound_source": "the GPU's power limit",
        }
    for i in range(3):
        missing[f"bimodal.{i}"] = f"pool decode hour from 2026-11-30 0{i}:00:00 UTC: {NO_SPREAD}"
    for i, k in enumerate(k for k in keys if k.startswith("node-b")):
        missing[f"bimodal.{3 + i}"] = f"GPU {k}: {NO_SPREAD}"
    missing["latency.0"] = "no request finished in the window"
    return {
        "window": {"dataset": "live", "start_s": 1796185700.0, "end_s": 1796189300.0, "duration_s": 3600.0},
        "trust": {"labels": ["emulated"], "notes": []},
        "parts": {"bimodal": {"table": table}, "phases": {"fits": fits}},
        "missing": missing,
    }


def _section(text: str, title: str) -> list[str]:
    """The lines of one section of the text: from its title to the next blank line."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(at, len(lines)) if not lines[i]), len(lines))
    return lines[at + 1 : end]


def _gpus_of(section: list[str]) -> list[str]:
    """The GPU labels of a table's per-GPU rows (the bimodality's ``GPU x (pool)``, the fits' first column)."""
    rows = [line.split() for line in section if line.startswith("    GPU ")]
    if rows:
        return [r[1] for r in rows]
    return [line.split()[0] for line in section[1:] if line.startswith("  node-")]


def test_a_fleets_text_shows_the_notable_gpus_in_natural_order_and_says_what_it_left_out():
    from analytics.summary import format_summary

    text = format_summary(fleet_summary(), gpu_rows=4)
    bimodal = _section(text, "SM activity: bimodal?")
    # the two that disagree with their pool, then the two largest dips; node by node, 2 before 10
    assert _gpus_of(bimodal) == ["node-a/2", "node-a/10", "node-b/3", "node-b/7"]
    assert [line.split()[0] for line in bimodal[1:3]] == ["mixed", "decode"]  # every pool row stays
    assert bimodal[-1] == (
        "  … 16 of 20 GPUs left out; shown: the GPUs whose verdict differs from their pool's, then the"
        " largest dip; --gpus all (or --json) lists every one"
    )
    power = _section(text, "Power model per GPU")
    assert _gpus_of(power)[:4] == ["node-a/3", "node-a/11", "node-b/0", "node-b/5"]  # undefined R² first
    assert "  … 16 of 20 GPUs left out; shown: the lowest R²; --gpus all (or --json) lists every one" in power


def test_all_gpus_and_none_of_them():
    from analytics.summary import format_summary

    natural = [f"{node}/{i}" for node, n in NODES.items() for i in range(n)]
    text = format_summary(fleet_summary(), gpu_rows=None)
    assert _gpus_of(_section(text, "SM activity: bimodal?")) == natural
    assert _gpus_of(_section(text, "Power model per GPU")) == natural
    assert "left out" not in text
    pools_only = format_summary(fleet_summary(), gpu_rows=0)
    assert _gpus_of(_section(pools_only, "SM activity: bimodal?")) == []
    assert "  … 20 of 20 GPUs left out; --gpus all (or --json) lists every one" in pools_only
    power = _section(pools_only, "Power model per GPU")  # its title stays over its notes
    assert any("GPUs node-a/0–11 (12): prefill power at its bound" in line for line in power)


def test_notes_and_missing_messages_that_differ_only_by_gpu_or_hour_are_one_line_each():
    from analytics.summary import format_summary

    text = format_summary(fleet_summary())
    assert f"  GPUs node-a/0–11 (12): {BOUND_NOTE}" in text.splitlines()
    assert "  GPU node-b/0: R² undefined: interval energies do not vary" in text.splitlines()
    assert text.count(BOUND_NOTE) == 1
    missing = _section(text, "Missing or not computed:")
    assert missing == [
        "  phases.0, idle.0: power model fits poorly on 4 of 20 GPUs",
        "  bimodal.0–2: pool decode hours from 2026-11-30 00:00:00 UTC to 02:00:00 UTC (3): " + NO_SPREAD,
        "  bimodal.3–10: GPUs node-b/0–7 (8): " + NO_SPREAD,
        "  latency.0: no request finished in the window",
    ]


def test_the_unsampled_table_is_capped_most_unsampled_first_and_notes_name_gpus_by_label():
    from analytics.summary import format_summary

    summary = fleet_summary()
    keys = list(summary["parts"]["phases"]["fits"])
    gap_s = {_key("node-b", 6): 90.0, _key("node-a", 10): 80.0, _key("node-a", 1): 70.0}
    summary["parts"]["phases"]["sample_gaps"] = {
        k: {"gap_s": gap_s.get(k, 10.0), "gaps": 1, "longest_s": gap_s.get(k, 10.0), "threshold_s": 5.0}
        for k in keys
    }
    summary["parts"]["phases"]["per_gpu"] = [{"gpu": k, "interval_s": 3600.0} for k in keys]
    worst = f"{_key('node-a', 11)} (R² 0.2), {_key('node-b', 5)} (R² 0.5), {_key('node-a', 3)} (R² 0.6)"
    summary["missing"]["phases.0"] = summary["missing"]["idle.0"] = (
        f"power model fits poorly on 4 of 20 GPUs (R² 0.2–0.6; lowest: {worst})"
    )
    text = format_summary(summary, gpu_rows=3)
    gaps = _section(text, "Unsampled time")
    assert [line.split()[0] for line in gaps[1:4]] == ["node-a/1", "node-a/10", "node-b/6"]  # natural order
    assert gaps[4] == (
        "  … 17 of 20 GPUs left out; shown: the most unsampled time; --gpus all (or --json) lists every one"
    )
    assert "overall: 410.0 s of 72,000.0 GPU-s unsampled (0.6 %)" in gaps[5]  # every GPU counted
    assert len(_section(format_summary(summary, gpu_rows=None), "Unsampled time")) == 1 + 20 + 1
    pools_only = _section(format_summary(summary, gpu_rows=0), "Unsampled time")
    assert pools_only[0].startswith("  … 20 of 20 GPUs left out") and "overall:" in pools_only[1]
    missing = _section(text, "Missing or not computed:")
    assert missing[0] == (
        "  phases.0, idle.0: power model fits poorly on 4 of 20 GPUs (R² 0.2–0.6;"
        " lowest: GPU node-a/11 (R² 0.2), GPU node-b/5 (R² 0.5), GPU node-a/3 (R² 0.6))"
    )
    summary["trust"]["notes"] = [f"{_key('node-b', 2)}: 0.04 s of prefill is too little to fit"]
    assert (
        "  note: GPU node-b/2: 0.04 s of prefill is too little to fit" in format_summary(summary).splitlines()
    )


def test_one_nodes_gpus_go_by_their_index_unless_two_share_it():
    from analytics.summary import GpuNames, format_summary

    summary = fleet_summary()
    fits = summary["parts"]["phases"]["fits"]
    summary["parts"] = {"phases": {"fits": {k: f for k, f in fits.items() if k.startswith("node-a")}}}
    summary["missing"] = {}
    power = _section(format_summary(summary, gpu_rows=None), "Power model per GPU")
    assert [line.split()[0] for line in power[1:13]] == [str(i) for i in range(12)]
    assert f"  GPUs 0–11 (12): {BOUND_NOTE}" in power
    names = GpuNames(["n|nvml|cuda:0|0", "n|dcgm|cuda:0|0", "n|nvml|cuda:1|1"])
    assert names.label("n|dcgm|cuda:0|0") == "n|dcgm|cuda:0|0"  # index 0 twice: the whole key
    assert names.label("n|nvml|cuda:1|1") == "1"
    assert names.listing(["n|nvml|cuda:0|0", "n|nvml|cuda:1|1", "n|dcgm|cuda:0|0"]) == (
        "GPUs 1, n|dcgm|cuda:0|0, n|nvml|cuda:0|0 (3)"
    )


def test_analyze_caps_the_gpu_rows_and_the_json_keeps_every_one(sim_db, capsys):
    rc, out, err = _analyze(capsys, "--dataset", "latest", "--db", str(sim_db), "--gpus", "1")
    assert rc == 0, err
    assert "  … 1 of 2 GPUs left out; shown: the lowest R²; --gpus all (or --json) lists every one" in out
    rc, out, _ = _analyze(capsys, "--dataset", "latest", "--db", str(sim_db), "--gpus", "all")
    assert rc == 0 and "left out" not in out
    assert [line.split()[0] for line in _section(out, "Power model per GPU")[1:]][:2] == ["0", "1"]
    rc, out, _ = _analyze(capsys, "--dataset", "latest", "--db", str(sim_db), "--gpus", "1", "--json")
    assert len(json.loads(out)["parts"]["phases"]["fits"]) == 2


def test_analyze_of_a_two_node_store_names_gpus_by_node_and_index(tmp_path, capsys):
    from tests.analytics.test_attribution import iteration, make_store, samples

    t0_s = 1796185700.0
    rows, its = [], []
    for node in ("node-b", "node-a"):  # each GPU busy decoding at a constant SM activity and power
        for i in range(3):
            g = {
                "node": node,
                "device": f"cuda:{i}",
                "index": i,
                "uuid": f"GPU-{node}-{i}",
                "worker": f"{node}-{i}",
            }
            ts = [t0_s + s for s in range(61)]
            rows += [{**r, **g} for r in samples(ts, [1_000_000 + 200_000 * s for s in range(61)])]
            its += [{**iteration(t, t + 1.0, "decode", decode_seqs=4), "node": node, "gpu_uuid": g["uuid"],
                     "gpu_index": i, "worker": g["worker"]} for t in ts[:-1]]  # fmt: skip
    db = tmp_path / "two-nodes.duckdb"
    make_store(db, {"gpu_samples": rows, "iterations": its}).close()
    window = ["--db", str(db), "--start-s", str(t0_s), "--end-s", str(t0_s + 60.0)]
    rc, out, err = _analyze(capsys, *window, "--gpus", "2")
    assert rc == 0, err
    assert _gpus_of(_section(out, "SM activity: bimodal?")) == ["node-a/0", "node-a/1"]
    assert "  … 4 of 6 GPUs left out; shown: the lowest R²; --gpus all (or --json) lists every one" in out
    no_spread = next(line for line in _section(out, "Missing or not computed:") if "GPUs" in line)
    assert no_spread.startswith(
        "  bimodal.5, 7, …, 15: GPUs node-a/0–2, node-b/0–2 (6): constant / no spread"
    )
    rc, out, _ = _analyze(capsys, *window, "--json")
    gpu_messages = [m for m in json.loads(out)["missing"].values() if m.startswith("GPU node-")]
    assert len(gpu_messages) == 12  # the JSON keeps every GPU's message
