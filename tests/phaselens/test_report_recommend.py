"""The reports carry the best layout recommendation (issue 22, item 7): its annual saving and
confidence, whether the workload has drifted since it was made (stale), and the auto-apply decisions
of the window — on a real store: two simulated scenarios, a workload stored with `phaselens workload
--save`, a recommendation made with `phaselens recommend --db`, a decision written by the audit."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from analytics.reads import window_of
from analytics.window import scenarios
from collector.store import Store
from dashboard.figures import recommend as rf
from phaselens.apply.audit import Audit
from phaselens.cli import main
from phaselens.report_recommend import proposed_recommendations
from phaselens.reports import build_report

LIGHT = ["--poisson", "2", "--num-requests", "100", "--prompt-tokens", "64:256", "--output-tokens", "32:64"]
# three times the rate, prompts eight times as long: a workload the recommendation no longer fits
HEAVY = [
    "--poisson",
    "6",
    "--num-requests",
    "100",
    "--prompt-tokens",
    "1024:2048",
    "--output-tokens",
    "32:64",
]
MODEL = ["--model", "llama-3.1-8b", "--layout", "agg:1xh100-sxm"]


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str]:
    """(store file, light scenario, heavy scenario, recommendation id)."""
    db = tmp_path_factory.mktemp("report-rec") / "r.duckdb"
    ids = []
    for load in (LIGHT, HEAVY):
        assert main(["simulate", "--no-progress", "--db", str(db), *MODEL, *load]) == 0
        with Store.open(db, read_only=True) as store, store.reader() as cur:
            ids.append(scenarios(cur)[0]["scenario_id"])
    light, heavy = ids
    assert main(["workload", "--db", str(db), "--dataset", light, "--save"]) == 0
    assert main(["recommend", "--db", str(db), *MODEL, "--for", f"scenario:{light}", *LIGHT[:4]]) == 0
    with Store.open(db) as store:
        with store.reader() as cur:
            rec_id = cur.execute("SELECT recommendation_id FROM recommendations").fetchone()[0]
            window = window_of(cur, {"dataset": light})
        audit = Audit(store, "test-node")
        row = audit.row(
            "auto_apply_skip",
            actor="phaselens-auto-apply",
            target="stack:http://127.0.0.1:9",
            dry_run=False,
            status="applied",
            recommendation_id=rec_id,
            message="confidence low is under the floor medium",
        )
        row["ts_s"] = (window.start_s + window.end_s) / 2  # a decision inside the light scenario's window
        audit.append([row])
    return db, light, heavy, rec_id


def _report(db: Path, dataset: str) -> tuple[dict, str]:
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        report = build_report(cur, {"dataset": dataset})
    assert report.summary is not None, report.error
    return report.summary, report.body


def test_a_report_after_a_recommendation_carries_it_its_saving_and_the_decisions(store_file):
    db, light, _heavy, rec_id = store_file
    summary, body = _report(db, light)
    part = summary["recommendation"]
    assert part["best"]["recommendation_id"] == rec_id
    assert part["best"]["target"] == f"scenario:{light}" and part["best"]["current"] == "agg:1xh100-sxm"
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        (rec,) = proposed_recommendations(cur)
    assert part["annual_saving_usd"] == pytest.approx(rf.annual_saving_usd(rec))
    assert part["headline"] == rf.headline_text(rec) and part["headline"].startswith("Best recommendation: ")
    assert part["best"]["confidence"]["level"] in ("low", "medium", "high")
    # the workload the recommendation was made on (stored before it) against this window's: the same
    stale = part["staleness"]
    assert stale["checked"] and stale["stale"] is False and stale["score"] < 1, stale
    assert stale["workload_id"].startswith("wl-")
    assert [d["decision"] for d in part["auto_apply"]] == ["skipped"]
    assert part["auto_apply"][0]["why"] == "confidence low is under the floor medium"
    # the page says it all, near the top
    assert "<h2>Recommendation</h2>" in body and html.escape(part["headline"]) in body
    assert body.index("<h2>Recommendation</h2>") < body.index("Where the GPU-time goes")
    assert "confidence low is under the floor medium" in body and 'data-stale="false"' in body


def test_a_drifted_workload_makes_the_recommendation_stale(store_file):
    db, light, heavy, rec_id = store_file
    summary, body = _report(db, heavy)
    part = summary["recommendation"]
    # no recommendation for the heavy scenario: the light one's is shown, named as for it
    assert part["best"]["recommendation_id"] == rec_id
    assert f"for scenario:{light}" in part["headline"]
    stale = part["staleness"]
    assert stale["checked"] and stale["stale"] is True and stale["score"] >= 1, stale
    assert any(r.startswith("mean rate") and "(3." in r for r in stale["reasons"]), stale["reasons"]
    assert any(r.startswith("prompt lengths moved") for r in stale["reasons"])
    assert "STALE" in body and 'data-stale="true"' in body
    assert part["auto_apply"] == []  # the decision was in the light scenario's window


def test_no_recommendation_is_said_with_how_to_make_one(tmp_path):
    db = tmp_path / "empty.duckdb"
    assert main(["simulate", "--no-progress", "--db", str(db), *MODEL, *LIGHT]) == 0
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        sid = scenarios(cur)[0]["scenario_id"]
        report = build_report(cur, {"dataset": sid})
    part = report.summary["recommendation"]
    assert part["best"] is None and part["headline"] == rf.NO_RECOMMENDATION
    assert "No layout recommendation yet" in report.body and "phaselens recommend" in report.body
