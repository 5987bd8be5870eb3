"""`phaselens calibrate` on a real emulated stack (1 prefill + 1 decode H200 modeling 70B): the dry
run changes nothing, a setting the device would refuse is refused before it is tried, a short sweep
finds the decode cliff where its latency rises and restores the defaults, the calibration and a
``power`` recommendation are stored; a calibration whose fingerprint no longer matches the stack is
marked stale and not used; the recommendation applies through phaselens apply and rolls back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.store import Store
from phaselens.apply.audit import Audit
from phaselens.cli import main
from phaselens.power.choose import CLIENT, MODELED, slowdown_pct
from phaselens.power.fingerprint import Fingerprint
from phaselens.power.records import calibration_row, save_calibrations
from serving.testing import Server

from .conftest import TOKEN, at_defaults, knobs, reset_knobs

SHORT = [
    "--point-s",
    "2",
    "--settle-s",
    "0.2",
    "--rate",
    "3",
    "--prompt-tokens",
    "64:256",
    "--output-tokens",
    "16:32",
]


@pytest.fixture(autouse=True)
def _defaults(stack: Server) -> None:
    reset_knobs(stack)


def calibrate(stack: Server, *args: str) -> int:
    return main(["calibrate", "--url", stack.url, "--token", TOKEN, *SHORT, *args])


def test_dry_run_prints_the_plan_and_changes_nothing(
    stack: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert calibrate(stack, "--points", "2") == 0
    out = capsys.readouterr().out
    assert "dry run: nothing changed" in out and "prefill (worker-0" in out and "decode (worker-1" in out
    assert "NVIDIA H200 (emulated) (driver emulated), llama-3.1-70b bfloat16 TP 1" in out
    assert at_defaults(knobs(stack, "worker-0")) and at_defaults(knobs(stack, "worker-1"))


def test_a_setting_outside_the_bounds_is_refused_before_it_is_tried(
    stack: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert calibrate(stack, "--execute", "--roles", "decode", "--power-limits", "450,900") == 2
    err = capsys.readouterr().err
    assert (
        "power limit 900 W is outside [200, 700] W of worker-1 (emulated:h200): refused before trying it"
        in err
    )
    k = knobs(stack, "worker-1")
    assert at_defaults(k)  # 450 W, which the device accepts, was not tried either
    assert calibrate(stack, "--roles", "router") == 2
    assert "the stack's roles are prefill, decode" in capsys.readouterr().err


def test_sweep_finds_the_prefill_cliff_restores_stores_recommends_applies_and_rolls_back(
    stack: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    rc = calibrate(
        stack,
        "--execute",
        "--roles",
        "prefill",
        "--knobs",
        "sm_clock",
        "--sm-clocks",
        "1155,345",
        "--db",
        str(db),
        # the choice on this loaded host: 2 s points carry ±10 % throughput noise; SLOs this apply's guard meets
        "--eps",
        "0.2",
        "--slo-ttft-ms",
        "10000",
        "--slo-itl-ms",
        "1000",
        # long prompts: a compute-bound prefill at 345 MHz takes seconds, beyond a loaded host's noise
        "--prompt-tokens",
        "512:1024",
        "--rate",
        "2",
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "knobs restored to what they were before the sweep (the defaults)" in out
    assert at_defaults(knobs(stack, "worker-1")) and at_defaults(knobs(stack, "worker-0"))
    with Store.open(db) as store:
        audit = Audit(store, "test")
        (row,) = store.query("SELECT * FROM power_calibrations").to_dict("records")
        (act,) = [a for a in audit.actions() if a["action"] == "calibrate"]
        rec = store.query("SELECT recommendation_id, kind, status FROM recommendations").to_dict("records")
    assert (row["role"], row["phase"], row["status"], row["source"]) == (
        "prefill",
        "prefill",
        "current",
        "live",
    )
    assert (row["gpu_model"], row["driver"], row["model"], row["tp"]) == (
        "NVIDIA H200 (emulated)",
        "emulated",
        "llama-3.1-70b",
        1,
    )
    assert act["status"] == "applied" and act["after"]["restored"]["restored"] is True
    # the cliff: the first clock window whose prefill latency rose beyond the threshold (a
    # compute-bound prefill at 345 MHz is several times slower). On a quiet host judged on the client's
    # TTFT; where the host is so loaded that the reference runs were host-bound (the host's CPU, not
    # the modelled GPU, set the pace), on the emulated GPU's modelled time, and the record says so
    points, cliff = json.loads(row["points"]), json.loads(row["cliff"])
    details = json.loads(row["details"])
    ref, threshold = json.loads(row["reference"]), details["choice"]["threshold_pct"]
    basis = details["choice"]["cliff_basis"]
    refs_bound = any(p["figures"]["host_bound"] for p in points if p["setting"]["knob"] == "default")
    assert basis == (MODELED if refs_bound else CLIENT), out
    if refs_bound:
        assert details["confidence"]["level"] == "low" and "host-bound" in json.loads(row["trust"])
    assert cliff["sm_clock"] is not None, out
    swept = [p for p in points if p["setting"]["knob"] == "sm_clock"]
    at = next(i for i, p in enumerate(swept) if p["setting"] == cliff["sm_clock"]["setting"])
    assert slowdown_pct(swept[at]["figures"], ref, "prefill", basis) > threshold
    assert all(slowdown_pct(p["figures"], ref, "prefill", basis) <= threshold for p in swept[:at])
    assert [r["kind"] for r in rec] == ["power"] and rec[0]["status"] == "proposed"
    rid = rec[0]["recommendation_id"]

    # a calibration of another engine version is stale: marked so and not used; the current one is
    stale = calibration_row(
        node="test",
        source="live",
        target=f"stack:{stack.url}",
        fingerprint=Fingerprint(
            row["gpu_model"], row["driver"], row["model"], row["dtype"], 1, "phaselens 0.0.1"
        ),
        role="prefill",
        phase="prefill",
        result={"points": points, "complete": True, "workers": ["worker-0"]},
        analysis=details["choice"] | {"reference": ref, "cliff": cliff},
        duration_s=1.0,
        trust=["emulated"],
        details={},
    )
    with Store.open(db) as store:
        save_calibrations(store, [stale])
    assert calibrate(stack, "--recommend", "--roles", "prefill", "--db", str(db)) == 0
    out = capsys.readouterr().out
    assert f"stale: {stale['calibration_id']} (prefill)" in out and "engine_version 'phaselens 0.0.1'" in out
    with Store.open(db) as store:
        status = dict(store.query("SELECT calibration_id, status FROM power_calibrations").values.tolist())
        newest = Audit(store, "t").recommendation(
            store.query("SELECT recommendation_id FROM recommendations ORDER BY ts_s DESC LIMIT 1").iat[0, 0]
        )
    assert status == {row["calibration_id"]: "current", stale["calibration_id"]: "stale"}
    assert newest["details"]["inputs"]["calibrations"] == {"prefill": row["calibration_id"]}
    rid = newest["recommendation_id"]
    setting = newest["proposed"]["settings"]["prefill"]["setting"]
    if setting["knob"] == "default":
        why = newest["details"]["modes"]["prefill"]["bal"]["rejected"]
        pytest.skip(f"the emulated prefill GPU gained no tokens/J within the SLO in this run ({why})")

    # predicted kWh and $ a year, and the confidence: the GPU model's prediction against the measurement
    annual = newest["proposed"]["settings"]["prefill"]["annual"]
    assert annual["kwh_per_year"] is not None
    assert annual["usd_per_year"] == pytest.approx(annual["kwh_per_year"] * 1.56 * 0.13, abs=0.02)
    check = newest["details"]["confidence"]["model_vs_measured"]["prefill"]
    assert check["tokens_per_j_gain_pct"]["predicted"] is not None and check["error_pp"] is not None
    assert newest["details"]["confidence"]["level"] in ("high", "medium", "low")

    # apply through phaselens apply (dry run first), then roll back: the defaults come back
    assert main(["apply", rid, "--db", str(db), "--token", TOKEN]) == 0
    assert at_defaults(knobs(stack, "worker-0"))
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
    k = knobs(stack, "worker-0")
    assert k["locked_sm_clock_max_mhz"] == setting.get("sm_clock_max_mhz") and k[
        "power_limit_w"
    ] == setting.get("power_limit_w", k["power_limit_default_w"])
    assert main(["rollback", rid, "--db", str(db), "--token", TOKEN]) == 0
    assert at_defaults(knobs(stack, "worker-0"))
    with Store.open(db) as store:
        acts = Audit(store, "t").actions(recommendation_id=rid)
    assert [a["action"] for a in acts if not a["dry_run"]][:2] == ["apply", "set_device"]
    assert acts[-1]["action"] == "rollback" and acts[-1]["status"] == "applied"


def test_stale_calibration_alone_is_never_used(
    stack: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    fp = Fingerprint(
        "NVIDIA H200 (emulated)", "emulated", "llama-3.1-8b", "bfloat16", 1, "phaselens 0.1.0 / emulated vllm"
    )
    point = {"setting": {"knob": "default", "label": "default"}, "figures": {"output_tokens_per_s": 1.0}}
    row = calibration_row(
        node="t",
        source="live",
        target=f"stack:{stack.url}",
        fingerprint=fp,
        role="decode",
        phase="decode",
        result={"points": [point], "complete": True, "workers": ["worker-1"]},
        analysis={"reference": {}, "cliff": {}, "noise_pct": 0.0, "modes": {}},
        duration_s=1.0,
        trust=["emulated"],
        details={},
    )
    with Store.open(db) as store:
        save_calibrations(store, [row])
    assert calibrate(stack, "--recommend", "--roles", "decode", "--db", str(db)) == 2
    out, err = capsys.readouterr()
    assert "model 'llama-3.1-8b' → 'llama-3.1-70b'" in out and "no current calibration of decode" in err
    with Store.open(db) as store:
        assert store.query("SELECT status FROM power_calibrations").iat[0, 0] == "stale"
        assert store.query("SELECT count(*) AS n FROM recommendations").iat[0, 0] == 0
