"""``phaselens export``: from a layout, and from a recommendation stored in a real store file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from collector.store import Store
from phaselens.cli import main
from tests.collector.conftest import start_collector
from tests.conftest import stop_process

RID = "rec-1764900000-a1b2c3"


def test_export_a_layout_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dgd.yaml"
    code = main(
        ["export", "--layout", "3p1d:h100-sxm:tp2", "--model", "llama-3.1-70b", "--format", "dynamo",
         "--out", str(out), "--namespace", "llm", "--image", "registry.local/dynamo-vllm:1.3.0"]
    )  # fmt: skip
    assert code == 0
    assert "DynamoGraphDeployment llama-3-1-70b-3p1d-h100-sxm" in capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    assert doc["metadata"]["namespace"] == "llm"
    worker = doc["spec"]["services"]["VllmPrefillWorker"]
    assert worker["replicas"] == 3 and worker["extraPodSpec"]["mainContainer"]["image"].startswith(
        "registry.local/"
    )


def test_export_to_stdout_and_check_against_a_crd_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.phaselens.export.test_crd import TOY_CRD

    assert (
        main(["export", "--layout", "agg:8xh100-sxm:tp4", "--model", "llama-3.1-70b", "--format", "grove"])
        == 0
    )
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["kind"] == "PodCliqueSet"
    crd = tmp_path / "crd.yaml"
    crd.write_text(yaml.safe_dump(TOY_CRD))
    code = main(["export", "--layout", "agg:8xh100-sxm:tp4", "--model", "llama-3.1-70b", "--format", "grove",
                 "--validate", str(crd)])  # fmt: skip
    assert code == 2
    assert "kind: 'PodCliqueSet' is not 'Widget'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layout", "3p1d:h100-sxm:tp2", "--format", "dynamo"], "--layout needs --model"),
        (["--format", "dynamo"], "give a recommendation ID, or --layout LAYOUT --model MODEL"),
        (["--layout", "agg:h100-sxm", "--model", "llama-3.1-70b", "--format", "grove"], "NxGPU"),
        ([RID, "--layout", "agg:8xh100-sxm", "--format", "grove"], "not both"),
        ([RID, "--format", "grove", "--collector", "http://127.0.0.1:9"], "cannot reach the collector"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("phaselens export: error: ") and message in err


def _store_recommendation(db: Path) -> None:
    with Store.open(db) as store:
        store.append(
            "recommendations",
            [{
                "recommendation_id": RID, "node": "n1", "ts_s": 1764900000.0, "kind": "layout",
                "target": "fleet:test", "status": "proposed", "rationale": "prefill is the bottleneck",
                "current": {"layout": "agg:8xh100-sxm:tp2", "model": "llama-3.1-70b", "gpus": 8},
                "proposed": {"layout": "3p1d:h100-sxm:tp2", "describe": {}, "model": "llama-3.1-70b", "gpus": 8},
                "details": {"trust": "simulated"},
            }],
        )  # fmt: skip
        store.flush()


def test_export_a_stored_recommendation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "store.duckdb"
    _store_recommendation(db)
    out = tmp_path / "pcs.yaml"
    assert main(["export", RID, "--db", str(db), "--format", "grove", "--out", str(out)]) == 0
    assert f"from recommendation {RID}" in capsys.readouterr().out
    doc = yaml.safe_load(out.read_text())
    cliques = {c["name"]: c["spec"]["replicas"] for c in doc["spec"]["template"]["cliques"]}
    assert cliques == {"frontend": 1, "prefill": 3, "decode": 1}
    assert doc["metadata"]["annotations"]["phaselens.io/recommendation-id"] == RID
    assert main(["export", "rec-0-000000", "--db", str(db), "--format", "grove"]) == 2
    assert "no recommendation 'rec-0-000000'" in capsys.readouterr().err
    assert main(["export", RID, "--db", str(tmp_path / "none.duckdb"), "--format", "grove"]) == 2
    assert "no such store file" in capsys.readouterr().err
    assert json.loads(json.dumps(doc))  # plain data all through


def test_export_a_recommendation_through_the_running_collector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip(
        "phaselens.recommend_api",
        reason="the collector serves /api/v1/recommendations/{id} once issue 22's routes are in",
    )
    db = tmp_path / "store.duckdb"
    _store_recommendation(db)
    proc, url = start_collector(db, "--report-schedule", "off")
    try:
        out = tmp_path / "dgd.yaml"
        assert main(["export", RID, "--collector", url, "--format", "dynamo", "--out", str(out)]) == 0
        assert f"from recommendation {RID}" in capsys.readouterr().out
        services = yaml.safe_load(out.read_text())["spec"]["services"]
        assert (
            services["VllmPrefillWorker"]["replicas"] == 3 and services["VllmDecodeWorker"]["replicas"] == 1
        )
        assert main(["export", "rec-0-000000", "--collector", url, "--format", "dynamo"]) == 2
        assert "answered 404: no recommendation 'rec-0-000000'" in capsys.readouterr().err
    finally:
        stop_process(proc)
