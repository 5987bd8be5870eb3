"""`phaselens workload` and the service's /api/v1/workload: a trace simulated into a real store file,
observed next to its synthesized twin on the file and through a running collector, stored with
--save, the trace written with --trace-out and replayed by `phaselens simulate --trace`."""

from __future__ import annotations

import json
import re

import duckdb
import httpx
import pytest

from phaselens.cli import main
from serving.trace import load_azure_trace
from tests.analytics.workload.conftest import known_trace, simulate_into
from tests.collector.conftest import start_collector
from tests.conftest import stop_process

TOKEN = "workload-token"


@pytest.fixture(scope="module")
def store_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("wl-cli")
    trace = known_trace(1.0, seed=31)
    db = root / "s.duckdb"
    simulate_into(trace, db, root / "t.csv")
    return db, len(trace)


def _run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["workload", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_cli_shows_observed_next_to_synthesized_stores_both_and_writes_a_replayable_trace(
    store_file, tmp_path, capsys
):
    db, n = store_file
    csv = tmp_path / "synth.csv"
    rc, out, err = _run(capsys, "--db", str(db), "--dataset", "latest", "--save", "--trace-out", str(csv))
    assert rc == 0, err
    assert "observed" in out and "synthesized" in out and "match: yes" in out
    assert re.search(rf"^requests +{n:,} +[\d,]+$", out, re.M), out
    assert "inter-arrival CV" in out and "prompt tokens p50 / p90 / p99" in out
    assert "prefix reuse: not known" in out
    assert out.count("simulated") >= 2  # both sides' trust labels
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT workload_id, kind, source, observed_id, request_count, mean_rps, trust->'labels' "
        "FROM workloads ORDER BY kind"
    ).fetchall()
    con.close()
    (obs_id, kind_o, src_o, _, count_o, rate_o, _), (_, kind_s, src_s, link, count_s, rate_s, labels_s) = rows
    assert (kind_o, src_o, count_o) == ("observed", "requests", n)
    assert (kind_s, src_s, link) == ("synthesized", "trace", obs_id)
    assert rate_s == pytest.approx(rate_o, rel=0.15) and json.loads(labels_s) == ["simulated"]
    assert f"stored: observed {obs_id}" in out
    trace = load_azure_trace(csv)
    assert len(trace) == count_s and f"trace: {count_s} requests written" in out
    rc = main(
        [
            "simulate",
            "--no-progress",
            "--trace",
            str(csv),
            "--limit",
            "40",
            "--layout",
            "agg:1xh100-sxm",
            "--no-store",
        ]
    )
    assert rc == 0
    capsys.readouterr()
    rc, out, err = _run(capsys, "--db", str(db), "--dataset", "latest", "--json", "--seed", "3")
    body = json.loads(out)
    assert rc == 0 and body["observed"]["request_count"] == n and body["synthesis"]["seed"] == 3


def test_bad_input_is_refused_with_the_reason(store_file, tmp_path, capsys):
    db, _ = store_file
    cases = [
        (["--db", str(db), "--dataset", "nope"], "unknown data set 'nope'"),
        (["--db", str(db), "--since", "0"], "time span since='0' must be > 0"),
        (["--db", str(db)], "nothing to observe in the window"),  # live: only simulated rows here
        (["--db", str(db), "--dataset", "latest", "--seed", "x"], "seed must be a whole number"),
        (["--db", str(db), "--dataset", "latest", "--rate-scale", "0"], "rate_scale must be a number in (0"),
        (["--db", str(tmp_path / "none.duckdb")], "no such store file"),
        (["--db", str(db), "--trace-out", str(tmp_path)], "--trace-out"),
    ]
    for args, says in cases:
        rc, _, err = _run(capsys, *args)
        assert rc == 2 and says in err, (args, err)


def test_the_service_api_computes_stores_and_lists_workloads(store_file, capsys):
    db, n = store_file
    proc, url = start_collector(db, "--control-token", TOKEN)
    try:
        r = httpx.get(f"{url}/api/v1/workload", params={"dataset": "latest", "seed": 2}, timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["observed"]["request_count"] == n and body["observed"]["source"] == "requests"
        assert body["synthesized"]["trust"]["labels"] == ["simulated"] and body["match"]["stale"] is False
        assert len(body["observed"]["rate_curve"]["rps"]) >= 2 and len(body["observed"]["hourly_rps"]) == 24
        for params, param in (
            ({"dataset": "nope"}, "dataset"),
            ({"bogus": "1"}, "bogus"),
            ({"since": "-1h"}, "since"),
            ({"start_s": "1e400"}, "start_s"),
            ({"dataset": "latest", "seed": "-1"}, "seed"),
            ({"dataset": "latest", "duration_s": "nan"}, "duration_s"),
            ({"dataset": "latest", "source": "logs"}, "source"),
        ):
            r = httpx.get(f"{url}/api/v1/workload", params=params, timeout=60)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert httpx.post(f"{url}/api/v1/workload", json={"dataset": "latest"}, timeout=60).status_code == 401
        before = len(httpx.get(f"{url}/api/v1/workloads", timeout=30).json()["workloads"])
        rc, out, err = _run(capsys, "--collector", url, "--dataset", "latest", "--save", "--token", TOKEN)
        assert rc == 0 and "stored: observed wl-" in out, err
        listed = httpx.get(f"{url}/api/v1/workloads", params={"limit": 50}, timeout=30).json()["workloads"]
        assert len(listed) == before + 2
        assert {w["kind"] for w in listed[:2]} == {"observed", "synthesized"}
        assert httpx.get(f"{url}/api/v1/workloads", params={"kind": "x"}, timeout=30).status_code == 400
        rc, _, err = _run(capsys, "--collector", url, "--dataset", "latest", "--save")
        assert rc == 2 and "control token" in err
    finally:
        stop_process(proc)
