"""`POST /api/v1/import` and `GET /api/v1/scenarios` of a real collector process, while its writer
stores scraped rows: a simulated scenario's `phaselens store export` merged through the writer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from collector.client import CollectorImportError, import_into_collector
from collector.store import EXPORT_MANIFEST, LATEST_VERSION, Store
from tests.collector.conftest import start_collector
from tests.collector.sources.conftest import DATA, LocalServer, http_server  # noqa: F401
from tests.collector.store.conftest import add_simulated_scenario

pytestmark = pytest.mark.slow

T0 = 1_764_028_800.0  # 2025-11-25 00:00:00 UTC
TOKEN = "s3cret-import-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _simulated_export(tmp_path: Path, scenario_id: str) -> Path:
    """A second store holding one simulated scenario, exported by `phaselens store export`."""
    db = tmp_path / f"{scenario_id}.duckdb"
    with Store.open(db) as sim:
        add_simulated_scenario(sim, scenario_id, T0)
    out = tmp_path / f"export-{scenario_id}"
    export = subprocess.run(
        [sys.executable, "-m", "phaselens.cli", "store", "export", str(out), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert export.returncode == 0, export.stderr
    return out


def _import(url: str, body: object, headers: dict[str, str] | None = AUTH) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/import", json=body, headers=headers, timeout=120)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status
    return err["message"]


def test_a_simulated_export_is_merged_by_the_running_collector(
    tmp_path: Path,
    http_server: LocalServer,  # noqa: F811
) -> None:
    export = _simulated_export(tmp_path, "s1")
    engine_url = http_server.serve_text("/metrics", (DATA / "vllm-lmcache.prom").read_text())
    db = tmp_path / "main.duckdb"
    proc, url = start_collector(db, "--node", "box-1", "--engine", engine_url, "--control-token", TOKEN)
    try:
        # the writer is storing scrapes meanwhile: the import goes through it, not beside it
        deadline = time.monotonic() + 30
        while not httpx.get(f"{url}/health").json()["writer"]["rows_written"].get("engine_metrics"):
            assert time.monotonic() < deadline, "no scrape stored"
            time.sleep(0.2)

        r = _import(url, {"path": str(export)})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["path"] == str(export) and body["schema_version"] == LATEST_VERSION
        assert body["tables"] == {
            "devices": {"inserted": 2, "duplicates": 0},
            "gpu_samples": {"inserted": 20, "duplicates": 0},
            "iterations": {"inserted": 3, "duplicates": 0},
            "requests": {"inserted": 3, "duplicates": 0},
            "scenarios": {"inserted": 1, "duplicates": 0},
            "tokens": {"inserted": 12, "duplicates": 0},
        }
        assert body["inserted"] == 41 and body["duplicates"] == 0

        again = _import(url, {"path": str(export)})  # a second import adds nothing
        assert again.status_code == 200, again.text
        assert again.json()["inserted"] == 0
        assert again.json()["tables"]["gpu_samples"] == {"inserted": 0, "duplicates": 20}
        assert again.json()["duplicates"] == 41 and again.json()["tables"]["devices"]["duplicates"] == 2

        scenarios = httpx.get(f"{url}/api/v1/scenarios").json()
        assert [s["scenario_id"] for s in scenarios["scenarios"]] == ["s1"] and not scenarios["truncated"]
        s1 = scenarios["scenarios"][0]
        assert (s1["node"], s1["label"], s1["layout"]) == ("sim:s1", "simulated", {"prefill": 1, "decode": 1})
        assert s1["summary"]["requests_ok"] == 3 and s1["start_s"] == T0

        samples = httpx.get(f"{url}/api/v1/tables/gpu_samples", params={"node": "sim:s1"}).json()["rows"]
        assert len(samples) == 20 and all(s["emulated"] and s["source"] == "simulated" for s in samples)
        assert {s["uuid"] for s in samples} == {"GPU-emulated-s1-0", "GPU-emulated-s1-1"}

        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and health["writer"]["store_errors"] == 0, health
        assert health["writer"]["imports"] == 2 and health["writer"]["rows_imported"] == 41
        scraped = health["writer"]["rows_written"]["engine_metrics"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    with Store.open(db, read_only=True) as store:
        trust = store.query(
            "SELECT node, trust_label(node, source) AS trust, count(*) AS n FROM requests GROUP BY ALL"
        )
        assert trust.values.tolist() == [["sim:s1", "simulated", 3]]
        sim = store.query(
            "SELECT trust_label(node, source, emulated) AS trust, count(*) AS n FROM gpu_samples GROUP BY ALL"
        )
        assert sim.values.tolist() == [["simulated", 20]]
        # the scrapes stored around the import are all there, and measured
        measured = store.query("SELECT count(*) AS n FROM engine_metrics WHERE node <> 'sim:s1'")["n"][0]
        assert measured >= scraped > 0


def test_import_refuses_bad_tokens_and_bad_exports_and_the_service_stays_up(tmp_path: Path) -> None:
    export = _simulated_export(tmp_path, "s2")
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / EXPORT_MANIFEST).write_text(
        json.dumps({"format": "phaselens-parquet-export", "schema_version": LATEST_VERSION + 1, "rows": {}})
    )
    unknown = tmp_path / "unknown"
    (unknown / "future_table" / "date=2025-11-25").mkdir(parents=True)
    for f in (export / "requests").rglob("*.parquet"):
        (unknown / "future_table" / "date=2025-11-25" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")

    proc, url = start_collector(tmp_path / "main.duckdb", "--control-token", TOKEN)
    try:
        assert "bearer token" in _error(_import(url, {"path": str(export)}, headers=None), 401)
        wrong = _import(url, {"path": str(export)}, headers={"Authorization": "Bearer nope"})
        assert "bearer token" in _error(wrong, 401) and wrong.headers["www-authenticate"] == "Bearer"
        assert _error(_import(url, {"path": str(export)}, headers={"Authorization": TOKEN}), 401)

        assert "missing 'path'" in _error(_import(url, {}), 400)
        assert "unknown field(s) dir" in _error(_import(url, {"dir": "/x"}), 400)
        assert "non-empty string" in _error(_import(url, {"path": 3}), 400)
        assert "absolute path" in _error(_import(url, {"path": "relative/dir"}), 400)
        assert "JSON object" in _error(_import(url, ["/x"]), 400)
        bad_json = httpx.post(f"{url}/api/v1/import", content=b"{nope", headers=AUTH)
        assert "not valid JSON" in _error(bad_json, 400)
        refusals = {
            tmp_path / "missing": "it does not exist",
            tmp_path / "file": "it is a file",
            tmp_path / "empty": "is not a phaselens export",
            unknown: "does not know: future_table",
            newer: f"schema version {LATEST_VERSION + 1}, newer than",
        }
        for path, message in refusals.items():
            r = _import(url, {"path": str(path)})
            assert message in _error(r, 422), path
            assert r.json()["error"]["param"] == "path"

        assert httpx.get(f"{url}/api/v1/scenarios").json()["scenarios"] == []  # nothing half-imported
        assert httpx.get(f"{url}/api/v1/tables/requests").json()["rows"] == []
        assert "limit must be" in _error(httpx.get(f"{url}/api/v1/scenarios", params={"limit": 0}), 400)
        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "ok" and health["writer"]["imports"] == 0, health

        ok = _import(url, {"path": str(export)})  # and it still imports
        assert ok.status_code == 200 and ok.json()["tables"]["scenarios"]["inserted"] == 1, ok.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_without_a_token_the_endpoint_is_off_and_the_env_variable_turns_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = _simulated_export(tmp_path, "s3")
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    proc, url = start_collector(tmp_path / "off.duckdb")
    try:
        message = _error(_import(url, {"path": str(export)}), 403)
        assert "--control-token TOKEN" in message and "PHASELENS_CONTROL_TOKEN" in message
        with pytest.raises(CollectorImportError, match="answered 403: control endpoints are off") as refused:
            import_into_collector(url, export)
        assert refused.value.status == 403
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    monkeypatch.setenv("PHASELENS_CONTROL_TOKEN", TOKEN)
    proc, url = start_collector(tmp_path / "on.duckdb")
    try:
        assert import_into_collector(url, export)["inserted"] == 41  # token from the environment too
        with pytest.raises(CollectorImportError, match="answered 401") as wrong:
            import_into_collector(url, export, token="nope")
        assert wrong.value.status == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_collector_refuses_a_simulated_node_name(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "phaselens.cli",
            "collect",
            "--db",
            str(tmp_path / "x.duckdb"),
            "--node",
            "sim:x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "'sim:'" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "x.duckdb").exists()
