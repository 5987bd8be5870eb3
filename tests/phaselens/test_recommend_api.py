"""The stored recommendation round-trips: ``phaselens recommend --db`` writes the row, a collector on
that store serves it (GET list, GET one), ``POST /api/v1/recommendations`` makes one through the
running collector (the older one for the same target superseded), bad input is a 400 naming it."""

from __future__ import annotations

import json

import httpx

from collector.store import Store
from phaselens.cli import main
from tests.collector.conftest import start_collector

ARGS = [
    "--layout", "agg:1xh100-sxm", "--model", "llama-3.1-8b", "--slo-ttft-ms", "500", "--slo-tpot-ms", "20",
    "--poisson", "20", "--num-requests", "40", "--prompt-tokens", "32:128", "--output-tokens", "4:16",
    "--slice-requests", "40",
]  # fmt: skip


def test_a_recommendation_is_stored_and_served(tmp_path, capsys):
    db = tmp_path / "r.duckdb"
    Store.open(db).close()
    assert main(["recommend", *ARGS, "--db", str(db), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    rid = row["recommendation_id"]
    assert rid.startswith("rec-") and row["kind"] == "layout" and row["status"] == "proposed"
    assert row["details"]["trust"] == "simulated" and row["details"]["inputs"]["slo"]["tpot_s"] == 0.02
    proc, url = start_collector(db, "--report-schedule", "off")
    try:
        listed = httpx.get(f"{url}/api/v1/recommendations").json()["recommendations"]
        assert [r["recommendation_id"] for r in listed] == [rid] and "details" not in listed[0]
        got = httpx.get(f"{url}/api/v1/recommendations/{rid}").json()
        assert got["proposed"]["layout"] == row["proposed"]["layout"]
        assert got["details"]["candidates"][0]["layout"] == "agg:1xh100-sxm"
        assert got["details"]["confidence"]["level"] in ("high", "medium", "low")
        assert httpx.get(f"{url}/api/v1/recommendations/nope").status_code == 404
        assert httpx.get(f"{url}/api/v1/recommendations", params={"status": "maybe"}).status_code == 400
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
        assert (
            set(paths["/api/v1/recommendations"]) == {"get", "post"}
            and "/api/v1/recommendations/{recommendation_id}" in paths
        )
        garbled = httpx.post(
            f"{url}/api/v1/recommendations",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert garbled.status_code == 400 and "not valid JSON" in garbled.json()["error"]["message"]
        listed = httpx.post(f"{url}/api/v1/recommendations", json=["agg:1xh100-sxm"])
        assert listed.status_code == 400 and "must be a JSON object" in listed.json()["error"]["message"]
        bad = httpx.post(f"{url}/api/v1/recommendations", json={"layout": "agg:1xb300", "poisson": 2})
        assert bad.status_code == 400 and "unknown GPU" in bad.json()["error"]["message"]
        # through the collector: the search runs there, the older proposal for the target is superseded
        assert main(["recommend", *ARGS, "--collector", url]) == 0
        out = capsys.readouterr().out
        assert "SIMULATED layout recommendation" in out and "confidence: LOW" in out
        by = {
            r["recommendation_id"]: r["status"]
            for r in httpx.get(f"{url}/api/v1/recommendations").json()["recommendations"]
        }
        assert by[rid] == "superseded" and sorted(by.values()) == ["proposed", "superseded"]
        assert [
            r["recommendation_id"]
            for r in httpx.get(f"{url}/api/v1/recommendations", params={"status": "superseded"}).json()[
                "recommendations"
            ]
        ] == [rid]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_bad_cli_input_is_refused(tmp_path, capsys):
    assert main(["recommend", *ARGS, "--allow-gpu", "b300"]) == 2
    assert "unknown GPU b300" in capsys.readouterr().err
    assert main(["recommend", *ARGS, "--slo-tpot-ms", "0"]) == 2
    assert (
        "slo_tpot_ms (--slo-tpot-ms) must be a finite number of milliseconds > 0, got 0"
        in capsys.readouterr().err
    )
    small = ["--layout", "agg:2xh100-sxm:tp2", "--gpu-budget", "1", "--poisson", "2", "--num-requests", "5"]
    assert main(["recommend", *small]) == 2
    assert "a budget of 1 GPU(s) is too small for llama-3.1-70b on h100-sxm" in capsys.readouterr().err
    assert main(["recommend", *ARGS, "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no such store file" in capsys.readouterr().err and not (tmp_path / "none.duckdb").exists()


def test_one_search_at_a_time_and_the_control_token(tmp_path, monkeypatch):
    """Two POSTs at once: one makes the recommendation, the other gets 409; with a control token a
    POST without it is refused before anything runs."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    proc, url = start_collector(tmp_path / "t.duckdb", "--control-token", "tok-1", "--report-schedule", "off")
    body = {
        "layout": "agg:2xh100-sxm",
        "model": "llama-3.1-8b",
        "slo_ttft_ms": 500,
        "slo_tpot_ms": 15,
        "poisson": 7,
        "num_requests": 60,
        "prompt_tokens": [7000, 8000],
        "output_tokens": [32, 64],
    }
    auth = {"Authorization": "Bearer tok-1"}
    try:
        assert httpx.post(f"{url}/api/v1/recommendations", json=body).status_code == 401
        with ThreadPoolExecutor(2) as pool:
            got = list(
                pool.map(
                    lambda _: httpx.post(
                        f"{url}/api/v1/recommendations", json=body, headers=auth, timeout=300
                    ),
                    range(2),
                )
            )
        assert sorted(r.status_code for r in got) == [200, 409]
        busy = next(r for r in got if r.status_code == 409)
        assert "one runs at a time" in busy.json()["error"]["message"]
        listed = httpx.get(f"{url}/api/v1/recommendations").json()["recommendations"]
        assert len(listed) == 1 and listed[0]["target"] == "scenario:trace"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
