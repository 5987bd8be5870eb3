"""A recommendation of a stored window, through the real path: a scenario simulated into a real store
file, ``phaselens recommend --db F --dataset latest`` (the window's requests as the trace, its
measured figures as the confidence, the observed workload stored and named by the row), and the same
through a running collector (``POST /api/v1/recommendations`` with window fields, and the CLI's
``--collector``). The live stack's layout from its devices rows: tests/phaselens/apply/test_policy.py."""

from __future__ import annotations

import json

import duckdb
import httpx
import pytest

from analytics.recommend.window import layout_from_describe
from analytics.window import AnalyticsError
from phaselens.cli import main
from serving.sim.layout import parse_layout
from tests.collector.conftest import start_collector
from tests.collector.sources.conftest import http_server  # noqa: F401

SLO = ["--slo-ttft-ms", "500", "--slo-tpot-ms", "20", "--slice-requests", "40"]
TOKEN = "window-token"


@pytest.fixture(scope="module")
def scenario_db(tmp_path_factory):
    """60 Poisson requests of llama-3.1-8b on one H100 (chunk 2048), simulated into a store file."""
    db = tmp_path_factory.mktemp("rec-window") / "s.duckdb"
    rc = main(
        [
            "simulate", "--no-progress", "--poisson", "4", "--num-requests", "60", "--prompt-tokens", "64:256",
            "--output-tokens", "8:32", "--layout", "agg:1xh100-sxm:max_num_batched_tokens=2048",
            "--model", "llama-3.1-8b", "--sample-period-s", "5", "--db", str(db),
        ]
    )  # fmt: skip
    assert rc == 0
    con = duckdb.connect(str(db), read_only=True)
    sid, t0, t1 = con.execute("SELECT scenario_id, start_s, end_s FROM scenarios").fetchone()
    con.close()
    return db, sid, t0, t1


def _stored(db, rid: str) -> tuple[dict, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        names = ("target", "current", "details", "status")
        row = dict(zip(names, con.execute(
            "SELECT target, current, details, status FROM recommendations WHERE recommendation_id = ?", [rid]
        ).fetchone(), strict=True))  # fmt: skip
        wl = con.execute(
            "SELECT workload_id, kind, source, request_count FROM workloads ORDER BY ts_s"
        ).fetchall()
    finally:
        con.close()
    for k in ("current", "details"):
        row[k] = json.loads(row[k])
    return row, wl


def test_recommend_on_a_stored_scenario_window(scenario_db, capsys, monkeypatch):
    db, sid, t0, t1 = scenario_db
    monkeypatch.delenv("PHASELENS_API_URL", raising=False)
    for argv, text in (
        (["--db", str(db), "--dataset", "nope"], "unknown data set 'nope'"),
        (["--dataset", "latest"], "a stored window is read from --db FILE or through --collector URL"),
        (
            ["--db", str(db), "--dataset", "latest", "--poisson", "2"],
            "give a stored window (--since/--dataset) or a trace",
        ),
        (["--poisson", "2"], "give the current layout (--layout"),
    ):
        assert main(["recommend", *argv]) == 2, argv
        assert text in capsys.readouterr().err, argv
    assert main(["recommend", "--db", str(db), "--dataset", "latest", *SLO]) == 0
    out = capsys.readouterr().out
    assert f"trace: the 60 requests observed in {sid}" in out and "(simulated)" in out
    assert "current layout: agg:1xh100-sxm:max_num_batched_tokens=2048 — the layout the scenario ran" in out
    assert "model: llama-3.1-8b — the scenario's model" in out
    assert "dispatch delay: 0.0 ms — none: a simulated scenario" in out
    rid = out.rsplit(" as ", 1)[1].strip()
    row, workloads = _stored(db, rid)
    inputs = row["details"]["inputs"]
    assert row["target"] == f"scenario:{sid}" and row["status"] == "proposed"
    assert row["current"]["layout"] == "agg:1xh100-sxm:max_num_batched_tokens=2048"
    assert inputs["window"]["start_s"] == pytest.approx(t0) and inputs["window"]["end_s"] == pytest.approx(
        t1, abs=1e-3
    )
    assert inputs["trace"]["requests"] == 60 and inputs["model"] == "llama-3.1-8b"
    assert inputs["dispatch_delay_s"] == 0 and inputs["dispatch_delay"]["requests"] == 0
    observed = [w for w in workloads if w[1] == "observed"]
    assert [w[0] for w in observed] == [inputs["workload_id"]] and observed[0][2:] == ("requests", 60)
    assert inputs["from_window"]["synthesized_workload_id"] in [
        w[0] for w in workloads if w[1] == "synthesized"
    ]
    measured = row["details"]["measured"]
    assert measured["requests"] == 60 and measured["trust"] == "simulated" and measured["ttft_p90_s"] > 0
    conf = row["details"]["confidence"]
    # the scenario's own simulator replaying its own window: the figures agree
    assert conf["level"] == "high" and all(abs(v) < 1.0 for v in conf["replay_error_pct"].values())


def test_a_window_through_the_running_collector(scenario_db, tmp_path, capsys, monkeypatch):
    src, sid, _, _ = scenario_db
    db = tmp_path / "c.duckdb"
    db.write_bytes(src.read_bytes())
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    proc, url = start_collector(db, "--control-token", TOKEN, "--report-schedule", "off")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        body = {"dataset": sid, "slo_ttft_ms": 500, "slo_tpot_ms": 20}
        assert httpx.post(f"{url}/api/v1/recommendations", json=body).status_code == 401
        r = httpx.post(f"{url}/api/v1/recommendations", json=body, headers=auth, timeout=300)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["target"] == f"scenario:{sid}" and got["details"]["inputs"]["workload_id"].startswith(
            "wl-"
        )
        assert got["details"]["measured"]["requests"] == 60
        stored = httpx.get(f"{url}/api/v1/recommendations/{got['recommendation_id']}").json()
        assert stored["details"]["inputs"]["workload_id"] == got["details"]["inputs"]["workload_id"]
        ids = [w["workload_id"] for w in httpx.get(f"{url}/api/v1/workloads").json()["workloads"]]
        assert got["details"]["inputs"]["workload_id"] in ids
        for bad, param, text in (
            ({"dataset": "nope"}, "dataset", "unknown data set 'nope'"),
            ({"dataset": sid, "poisson": 3}, "poisson", "not both"),
            ({"since": "1h"}, None, "nothing to observe in the window (live"),  # live: nothing stored
        ):
            r = httpx.post(f"{url}/api/v1/recommendations", json=bad, headers=auth, timeout=60)
            err = r.json()["error"]
            assert (
                r.status_code == 400 and text in err["message"] and (param is None or err["param"] == param)
            ), err
        # the CLI through the collector: the search and the writes run there
        monkeypatch.setenv("PHASELENS_CONTROL_TOKEN", TOKEN)
        assert main(["recommend", "--collector", url, "--dataset", "latest", *SLO]) == 0
        out = capsys.readouterr().out
        assert "stored by the collector" in out and "workload stored: wl-" in out
        assert main(["recommend", "--collector", url, "--dataset", "latest", "--poisson", "2"]) == 2
        assert "not both" in capsys.readouterr().err
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_stored_layout_is_written_back_as_the_same_layout():
    for text in (
        "agg:8xh100-sxm:tp2",
        "2p1d:h200:prefill.tp=2:decode.tp=4:decode.max_num_seqs=64:kv_link=nvlink",
        "agg:2xh200:max_num_seqs=64:max_num_batched_tokens=4096:chunked_prefill=off:kv_blocks=900:gpu_memory_utilization=0.96",
    ):
        again = layout_from_describe(parse_layout(text).describe())
        assert {k: v for k, v in parse_layout(again).describe().items() if k != "name"} == {
            k: v for k, v in parse_layout(text).describe().items() if k != "name"
        }
    with pytest.raises(AnalyticsError):
        layout_from_describe({"gpu": "h100-sxm", "pools": [{"role": "prefill", "replicas": 1, "tp": 1}]})


def test_an_external_fleets_window_gives_a_synthesized_trace_labelled_estimated(http_server, tmp_path):  # noqa: F811
    """Engine histograms only (a vLLM page scraped by the collector's source into a real store): the
    trace is synthesized from the observed workload (estimated), nothing is measured per request, the
    layout must be given, the target is the fleet."""
    from analytics.recommend.search import SearchOptions
    from collector.store import Store
    from phaselens.recommend_window import recommend_window
    from tests.analytics.workload.conftest import known_trace
    from tests.analytics.workload.test_engine_histograms import T0_S, scrape_into_store

    trace = known_trace(1.0, seed=41)
    db = tmp_path / "fleet.duckdb"
    scrape_into_store(http_server, trace, db)
    window = {"start_s": T0_S - 60.0, "end_s": T0_S + 310.0, "slo_ttft_ms": 2000, "slo_tpot_ms": 50}
    with Store.open(db) as store:
        with pytest.raises(AnalyticsError, match="external fleet's layout is not in the store"):
            recommend_window(store, window)
        row = recommend_window(
            store,
            window | {"layout": "agg:1xh100-sxm", "model": "llama-3.1-8b"},
            options=SearchOptions(slice_requests=40, refine=0, max_hour_runs=2),
        )
    inputs = row["details"]["inputs"]
    how = inputs["from_window"]
    assert row["target"] == "fleet:live" and how["trace_trust"] == "estimated"
    assert "synthesized from the engine histograms" in how["trace"]
    assert abs(inputs["trace"]["requests"] - len(trace)) < 0.15 * len(trace)
    assert row["details"]["measured"] is None and row["details"]["confidence"]["level"] == "low"
    assert "no per-request latency" in how["measured_note"] and inputs["workload_id"].startswith("wl-")
    assert inputs["dispatch_delay_s"] == 0 and "none: an external fleet" in inputs["dispatch_delay"]["how"]
