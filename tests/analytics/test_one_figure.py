"""One figure, one definition, every surface: SLO attainment counts failed requests (simulate, analyze
text and JSON, goodput, the overview API, /metrics, the report); output tokens/s is the window
average (the rate while serving only under its own name); one bimodality verdict (the text, the API
JSON, the dashboard's words, the report). On a real simulated store of bursty traffic with requests
that fail, served by a real collector, and on a real store of SM activity samples."""

from __future__ import annotations

import contextlib
import html
import io
import json
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from analytics.bimodal_stats import BIMODAL_RULE, bimodal_verdict
from analytics.summary import format_summary, summarize
from analytics.window import Window
from collector.store import Store
from dashboard import figures
from dashboard.report_html.bimodal import pool_facts
from phaselens.cli import main
from phaselens.metrics_counters import count_step
from phaselens.overview import compute_overview
from phaselens.reports import build_report
from tests.analytics.test_bimodal import _store_with_sm
from tests.collector.conftest import start_collector
from tests.conftest import stop_process

TOO_LONG = 200_000  # prompt tokens: more than llama-3.1-8b's context, refused at admission


def _trace(path: Path) -> Path:
    """Two bursts of 10 requests a minute apart, every other one too long for the model: 20 requests,
    10 fail. The stack serves ~2 s of the ~61 s: the window average is far below the busy rate."""
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for burst_s in (0, 60):
        for i in range(10):
            prompt = TOO_LONG if i % 2 else 300
            rows.append(f"2023-11-16 18:{15 + burst_s // 60:02d}:00.{i}000000,{prompt},60")
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def bursty(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("one_figure")
    trace, db, js = _trace(d / "bursty.csv"), d / "bursty.duckdb", d / "sim.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        sim = ["simulate", "--no-progress", "--layout", "agg:1xh100-sxm", "--trace", str(trace)]
        rc = main([*sim, "--db", str(db), "--json-out", str(js)])
    assert rc == 0
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        (sid,) = cur.execute("SELECT scenario_id FROM scenarios").fetchone()
    return {
        "dir": d,
        "trace": trace,
        "db": db,
        "sid": sid,
        "out": buf.getvalue(),
        "json": json.loads(js.read_text()),
    }


def _analyze(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert main(["analyze", *args]) == 0
    return capsys.readouterr().out


def test_failed_requests_miss_the_slo_on_every_surface(bursty: dict, capsys, tmp_path: Path) -> None:
    db, sid = str(bursty["db"]), bursty["sid"]
    # simulate: the table and the JSON, with the denominator
    (sim,) = bursty["json"]
    assert (sim["requests"], sim["failed"], sim["slo_met"]) == (20, 10, 10)
    assert sim["slo_attainment"] == 0.5  # was 1.0: the finished requests only
    assert "50.0% (10 of 20; 10 failed)" in bursty["out"]
    # analyze: text and JSON
    text = _analyze(capsys, "--db", db, "--dataset", sid)
    assert "SLO attainment (TTFT ≤ 2,000 ms and TPOT ≤ 100 ms): 50.0 % (10 of 20 requests; 10 failed" in text
    summary = json.loads(_analyze(capsys, "--db", db, "--dataset", sid, "--json"))
    lat = summary["parts"]["latency"]
    assert lat["attainment"]["both"] == 0.5 and lat["by_status"] == {"error": 10, "ok": 10}
    # goodput (the simulator at every rate): the same 0.5, no patch around the summary
    out_json = tmp_path / "goodput.json"
    capsys.readouterr()
    goodput = ["goodput", "--layout", "agg:1xh100-sxm", "--trace", str(bursty["trace"]), "--max-evals", "3"]
    rc = main([*goodput, "--json", str(out_json)])
    assert rc == 0
    sweep = json.loads(out_json.read_text())["sweep"]
    assert sweep and all(m["attainment"] == 0.5 and m["failed"] == 10 for m in sweep)
    # the report of the same window, and the overview and /metrics of the collector serving the store
    with Store.open(bursty["db"], read_only=True) as store, store.reader() as cur:
        report = build_report(cur, {"dataset": sid})
        result = compute_overview(cur, {"dataset": sid})
    assert report.summary["overview"]["figures"]["slo_attainment"]["value"] == 0.5
    assert '<div class="prev">10 of 20 requests; 10 failed, each a miss</div>' in report.body
    assert "<b>50.0%</b> of the requests met both SLOs" in report.body
    assert "10 of 20 requests; 10 failed, each a miss." in report.body
    # /metrics: the counters of the same window (requests and those meeting the SLO) give the same 0.5
    w = result.current["window"]
    with Store.open(bursty["db"], read_only=True) as store, store.reader() as cur:
        step = count_step(cur, w["start_s"], w["end_s"], request_settle_s=0.0, dataset=sid)
    met = step.increments[("phaselens_requests_slo_met", ("both",))]
    assert met / step.increments[("phaselens_requests", ())] == 0.5
    copy = tmp_path / "served.duckdb"
    shutil.copy(bursty["db"], copy)
    proc, url = start_collector(copy)
    try:
        body = httpx.get(f"{url}/api/v1/analytics/overview", params={"dataset": sid}, timeout=120).json()
    finally:
        stop_process(proc)
    assert body["figures"]["slo_attainment"]["value"] == 0.5
    assert body["figures"]["slo_attainment"]["basis"] == "10 of 20 requests; 10 failed, each a miss"


def test_aborted_and_rejected_requests_are_misses_in_the_store(tmp_path: Path) -> None:
    from analytics.latency import SloSpec, latency_summary
    from tests.analytics.test_attribution import make_store, request

    statuses = ["ok", "ok", "aborted", "rejected", "error", None]
    con = make_store(
        tmp_path / "statuses.duckdb",
        {
            "requests": [
                request(f"r{i}", 100.0 + i, 100.5 + i, first_token_s=100.1 + i, status=st)
                for i, st in enumerate(statuses)
            ]
        },
    )
    s = latency_summary(con, Window(99.0, 110.0), SloSpec(ttft_s=1.0, tpot_s=1.0))
    assert (s.requests, s.ok, s.failed) == (6, 2, 4)
    assert s.attainment["both"] == pytest.approx(2 / 6) and s.attainment["met"] == 2
    assert s.by_status == {"aborted": 1, "error": 1, "none": 1, "ok": 2, "rejected": 1}
    text = format_summary({"window": Window(99.0, 110.0).describe(), "parts": {"latency": s.to_dict()}})
    assert "33.3 % (2 of 6 requests; 4 failed, each a miss)" in text


def test_the_headline_tokens_per_s_is_the_window_average_on_every_surface(bursty: dict, capsys) -> None:
    db, sid = str(bursty["db"]), bursty["sid"]
    summary = json.loads(_analyze(capsys, "--db", db, "--dataset", sid, "--json"))
    t = summary["parts"]["throughput"]
    assert t["observed_s"] == pytest.approx(summary["window"]["duration_s"], rel=0.02)
    assert t["output_tokens_per_s"] == pytest.approx(t["output_tokens"] / t["observed_s"])
    assert t["output_tokens"] == 10 * 60  # the ten requests that were served
    # bursty: the rate while serving is several times the window average, and named as what it is
    assert t["output_tokens_per_s_busy"] > 5 * t["output_tokens_per_s"]
    text = _analyze(capsys, "--db", db, "--dataset", sid)
    (printed,) = re.findall(r"^Output tokens/s \(window average\): ([\d.,]+) ", text, re.M)
    assert "\n  tokens/s while serving (busy time): " in text
    with Store.open(bursty["db"], read_only=True) as store, store.reader() as cur:
        result = compute_overview(cur, {"dataset": sid})
        report = build_report(cur, {"dataset": sid})
    fig = result.overview["figures"]["output_tokens_per_s"]
    assert fig["value"] == pytest.approx(t["output_tokens_per_s"], rel=1e-12)
    assert fig["busy_value"] == pytest.approx(t["output_tokens_per_s_busy"], rel=1e-12)
    # the Overview tile, the report's tile and `analyze` print one number
    tile = figures.figure_text("output_tokens_per_s", fig["value"])
    assert tile == f"{printed} tokens/s"
    assert f'<div class="value">{tile}</div>' in report.body
    assert "tokens/s while serving (busy time): " in report.body
    # /metrics: the output tokens counted over the same window are the headline's numerator
    w = result.current["window"]
    with Store.open(bursty["db"], read_only=True) as store, store.reader() as cur:
        step = count_step(cur, w["start_s"], w["end_s"], dataset=sid)
    counted = sum(
        v
        for (name, labels), v in step.increments.items()
        if name == "phaselens_tokens" and labels[-1] == "output"
    )
    assert counted == pytest.approx(t["output_tokens"], rel=1e-12)


def test_a_window_wider_than_the_data_does_not_dilute_the_headline(bursty: dict, capsys) -> None:
    """An hour's window over a minute of data (a collector started late, a scenario looked at in a
    wider window): the headline is over the seconds the GPUs were observed, so it equals the cost
    part's output tokens/s per GPU × GPUs, on the same page -- not tokens ÷ the whole window."""
    db, sid = str(bursty["db"]), bursty["sid"]
    narrow = json.loads(_analyze(capsys, "--db", db, "--dataset", sid, "--json"))
    w = narrow["window"]
    args = ("--db", db, "--dataset", sid, "--start-s", str(w["start_s"] - 3000), "--end-s", str(w["end_s"]))
    wide = json.loads(_analyze(capsys, *args, "--json"))
    t, cost = wide["parts"]["throughput"], wide["parts"]["cost"]
    assert wide["window"]["duration_s"] > 40 * t["observed_s"]
    assert t["output_tokens_per_s"] == pytest.approx(
        narrow["parts"]["throughput"]["output_tokens_per_s"], rel=1e-6
    )
    per_gpu = cost["total"]["output_tokens_per_s_per_gpu"]
    assert t["output_tokens_per_s"] == pytest.approx(per_gpu * len(cost["by_gpu"]), rel=1e-9)
    assert "with its GPUs observed" in _analyze(capsys, *args)


@pytest.mark.parametrize(
    ("p", "high", "verdict"),
    [
        (0.0, 60.0, (True, "bimodal (dip p < 0.001, two modes)")),
        (0.0, None, (False, "not bimodal (dip p < 0.001 but one mode)")),
        (0.42, 60.0, (False, "not bimodal (two peaks but dip p = 0.42)")),
        (0.042, None, (False, "not bimodal (dip p = 0.042 but one mode)")),
        (0.42, None, (False, "not bimodal (dip p = 0.42, one mode)")),
        (None, None, (None, "not tested: too few or constant values")),
    ],
)
def test_the_bimodality_rule_by_hand(p, high, verdict) -> None:
    assert bimodal_verdict(p, high) == verdict
    assert bimodal_verdict(p, high, no_spread=True) == (None, "not defined: constant / no spread")


def test_a_significant_dip_with_one_mode_is_not_bimodal_on_any_surface(tmp_path: Path) -> None:
    # SM activity reported in whole percent around 22.6 %: the ties make the dip test reject one
    # mode (p < 0.001) although the histogram has one peak -- the decode pool that read "bimodal: yes"
    # beside "one mode at 22.6 %"
    values = np.clip(np.round(np.random.default_rng(5).normal(22.6, 3.0, 1000)), 0, 100)
    con = _store_with_sm(tmp_path, values, "whole-percent.duckdb")
    summary = summarize(con, Window(100.0, 300.0)).to_dict()
    bimodal = summary["parts"]["bimodal"]
    assert bimodal["rule"] == BIMODAL_RULE
    rows = [r for r in bimodal["table"] if r["scope"] in ("fleet", "pool", "gpu")]
    for row in rows:
        assert row["dip_p_value"] < 0.001 and row["mode_high_pct"] is None
        assert row["bimodal"] is False and row["verdict"] == "not bimodal (dip p < 0.001 but one mode)"
    text = format_summary(summary)
    assert text.count(BIMODAL_RULE) == 1  # the rule, stated once
    table = text[text.index("SM activity: bimodal?") :].split("\n\n")[0]
    assert re.search(r"^  \S+ .* no  one: 2\d\.\d %$", table, re.M)  # the pool: "no" beside one mode
    assert " yes " not in table
    pool = next(r for r in rows if r["scope"] == "pool")
    # the dashboard's words and the report's are the API's verdict, not re-derived
    assert figures.verdict_text(pool) == pool["verdict"]
    fig = figures.activity_histogram_figure(
        {"sm_active": {"counts": [1], "n": 1, "mean_pct": 22.6}},
        [0, 100],
        pool,
        title="Decode pool",
        labels=[],
    )
    assert fig.layout.title.text == f"Decode pool — {pool['verdict']}"
    assert f"<b>Bimodal?</b> {html.escape(pool['verdict'])}</li>" in pool_facts(None, pool, "decode")
