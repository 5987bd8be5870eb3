"""The runtime power guard on the real emulated stack: after a power recommendation is applied, a lane
that breaches its SLO on live traffic has its knob released to the defaults, audited, and the
recommendation becomes rolled_back; a recommendation that is not applied is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.recommend.records import save_recommendation
from collector.store import Store
from phaselens.apply.audit import Audit
from phaselens.cli import main
from serving.loadgen import run_load
from serving.testing import Server
from serving.trace import poisson_trace

from .conftest import TOKEN, at_defaults, knobs, power_rec, reset_knobs


def test_a_breaching_lane_is_released_to_the_defaults(
    stack: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_knobs(stack)
    db = tmp_path / "s.duckdb"
    rec = power_rec(stack)
    rid = rec["recommendation_id"]
    rec["details"]["inputs"]["slo"] = {"ttft_s": 30.0, "tpot_s": 1e-6, "target": 0.9}  # no decode meets it
    with Store.open(db) as store:
        save_recommendation(store, rec)
    assert main(["power-guard", rid, "--db", str(db), "--token", TOKEN, "--once"]) == 2
    assert "only an applied one is guarded" in capsys.readouterr().err
    # applied with no traffic: its own guard window is not judged
    assert (
        main(
            [
                "apply",
                rid,
                "--db",
                str(db),
                "--token",
                TOKEN,
                "--execute",
                "--guard-s",
                "1",
                "--settle-s",
                "0.2",
            ]
        )
        == 0
    )
    assert not at_defaults(knobs(stack, "worker-1"))
    capsys.readouterr()
    run_load(
        stack.url, poisson_trace(4.0, 12, prompt_tokens=(32, 128), output_tokens=16, seed=5), progress=False
    )
    rc = main(["power-guard", rid, "--db", str(db), "--token", TOKEN, "--once", "--window-s", "8"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "decode (worker-1): BREACH: knob released: SLO attainment 0.0%" in out
    assert at_defaults(knobs(stack, "worker-1"))
    with Store.open(db) as store:
        audit = Audit(store, "t")
        (row,) = [a for a in audit.actions(recommendation_id=rid) if a["action"] == "power_release"]
        status = audit.recommendation(rid)["status"]
    assert row["status"] == "applied" and row["before"]["window"]["requests"] > 0
    assert row["before"]["knobs"]["worker-1"]["locked_sm_clock_max_mhz"] is not None
    assert status == "rolled_back"
