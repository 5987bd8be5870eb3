"""The reports' energy section (phaselens/report_energy.py, dashboard/report_html/energy.py) on a real
store: a disaggregated scenario simulated with `phaselens simulate --db`, power calibrations made by
the simulator's sweep and power recommendations from them (tests/power_data.py). Energy per token
per phase is the cost analysis's; the saving available is the best recommendation made from
calibrations still current (one from a stale calibration is not offered). The realised saving of an
applied setting is tested after a real apply in tests/dashboard/views/test_power.py."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from analytics.window import scenarios
from collector.store import Store
from phaselens.cli import main
from phaselens.reports import build_report
from tests.power_data import calibration, fingerprint, recommendation

SIM = ["--model", "llama-3.1-8b", "--layout", "1p1d:h100-sxm", "--poisson", "2", "--num-requests", "80"]
TARGET = "stack:http://127.0.0.1:9"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict, dict]:
    """(store, scenario id, the recommendation offered, the one from a stale calibration)."""
    db = tmp_path_factory.mktemp("report-energy") / "e.duckdb"
    assert main(["simulate", "--no-progress", "--db", str(db), *SIM]) == 0
    decode = calibration(TARGET, "decode", workers=["worker-1"])
    old = calibration(TARGET, "decode", workers=["worker-1"], fp=fingerprint(engine="old"))
    old["status"] = "stale"  # as usable_calibrations marks one whose fingerprint no longer matches
    good = recommendation(TARGET, {"decode": decode})
    stale = recommendation(TARGET, {"decode": old})
    assert good["proposed"]["changes"] and stale["proposed"]["changes"]
    with Store.open(db) as store:
        store.append("power_calibrations", [decode, old])
        store.append("recommendations", [good, stale])
        store.flush()
        with store.reader() as cur:
            sid = scenarios(cur)[0]["scenario_id"]
    return db, sid, good, stale


def test_the_report_has_energy_per_phase_and_the_saving_available(made) -> None:
    db, sid, good, stale = made
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        report = build_report(cur, {"dataset": sid})
    part = report.summary["energy"]
    total = report.summary["parts"]["cost"]["total"]
    per = part["per_phase"]
    assert per["total"]["j_per_input_token"] == pytest.approx(total["j_per_input_token"])
    assert per["total"]["j_per_output_token"] == pytest.approx(total["j_per_output_token"])
    assert per["total"]["j_per_input_token"] > 0 and per["total"]["j_per_output_token"] > 0
    assert {p["pool"] for p in per["by_pool"]} >= {"prefill", "decode"}
    assert per["trust"] == ["simulated"]
    assert part["realised"] == []  # nothing applied
    best = part["available"]["best"]
    assert best["recommendation_id"] == good["recommendation_id"]
    assert best["kwh_per_year"] == good["details"]["annual"]["kwh_per_year"] > 0
    assert best["usd_per_year"] == good["details"]["annual"]["usd_per_year"]
    assert best["tokens_per_j_change_pct"] == pytest.approx(good["est_tokens_per_j_change_pct"])
    assert best["trust"] == ["simulated"] and best["confidence"]["level"] == "low"
    (passed,) = part["available"]["passed_over"]
    assert passed["recommendation_id"] == stale["recommendation_id"] and "is stale" in passed["why"]
    page = html.unescape(report.body)
    section = page[page.index('<section id="energy">') :]
    section = section[: section.index("</section>")]
    assert "Energy per token, per phase" in section and 'class="badge simulated"' in section
    assert f"data-rec='{good['recommendation_id']}'" in section
    assert f"{good['details']['annual']['kwh_per_year']:,.0f} kWh" in section
    assert stale["recommendation_id"] in section and "Not offered" in section
    assert "No power setting is applied" in section


def test_prices_given_to_the_report_price_the_saving(made) -> None:
    db, sid, _good, _stale = made
    with Store.open(db, read_only=True) as store, store.reader() as cur:
        report = build_report(cur, {"dataset": sid, "electricity_usd_per_kwh": 0.5, "pue": 1.0})
    assert report.summary["energy"]["prices"] == {"electricity_usd_per_kwh": 0.5, "pue": 1.0}
