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
    assert main(["recommend", *ARGS, "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "no such store file" in capsys.readouterr().err and not (tmp_path / "none.duckdb").exists()
