"""The Power page's figures and rows (dashboard/figures/power.py) on calibrations made by the real
simulator sweep (tests/power_data.py): the curves against each knob with the cliff and the modes
marked and the trust label written in, the setpoints per mode with their annual saving, stale ones
marked, the guard's releases and realised before/after."""

from __future__ import annotations

import pytest

from dashboard.figures import power as pf
from tests.power_data import calibration, recommendation

TARGET = "stack:http://127.0.0.1:9"


@pytest.fixture(scope="module")
def cal() -> dict:
    return calibration(TARGET, "decode")


def _annotations(fig, name: str) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.name == name]


def test_the_clock_curve_marks_the_cliff_the_modes_and_the_defaults(cal: dict) -> None:
    fig = pf.curve_figure(cal, "sm_clock")
    cliff = cal["cliff"]["sm_clock"]
    assert cliff is not None  # the simulator's decode slows at a low clock
    (text,) = _annotations(fig, "cliff")
    assert cliff["setting"]["label"] in text
    vlines = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1]
    assert [s.x0 for s in vlines] == [cliff["setting"]["sm_clock_max_mhz"]] * 2  # through both panels
    tpj = next(t for t in fig.data if t.name == "decode tokens/J")
    swept = [p for p in cal["points"] if p["setting"]["knob"] in ("sm_clock", "default")]
    assert len(tpj.x) == len(swept) and list(tpj.x) == sorted(tpj.x)
    assert max(tpj.x) == cal["details"]["bounds"]["sm_clock_max_mhz"]  # the defaults: the highest clock
    assert {t.name for t in fig.data} >= {
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "defaults (the reference)",
    }
    modes = " ".join(_annotations(fig, "mode"))
    for mode, m in cal["details"]["choice"]["modes"].items():
        if m["knob"] == "sm_clock":
            assert pf.MODE_NAMES[mode] in modes
    assert any("SIMULATED" in t for t in _annotations(fig, "trust"))


def test_each_knob_has_its_own_axis_and_the_label_follows_the_calibration(cal: dict) -> None:
    assert pf.knobs_swept(cal) == ["power_limit", "sm_clock"]
    fig = pf.curve_figure(cal | {"trust": ["emulated", "host-bound"]}, "power_limit")
    assert fig.layout.xaxis2.title.text == "power limit, W"
    xs = next(t for t in fig.data if t.name == "decode tokens/J").x
    assert max(xs) == cal["details"]["bounds"]["power_default_w"]
    (label,) = _annotations(fig, "trust")
    assert "EMULATED" in label and "HOST-BOUND" in label and "SIMULATED" not in label


def test_setpoints_per_mode_carry_the_saving_and_a_stale_calibration_is_marked(cal: dict) -> None:
    annual = {
        m: {
            "knob": v["knob"],
            "setting": v["setting"]["label"],
            "keep_defaults": v["keep_defaults"],
            "tokens_per_j_gain_pct": v.get("tokens_per_j_gain_pct"),
            "power_w_change": v.get("power_w_change"),
            "kwh_per_year": 123.4,
            "usd_per_year": 25.0,
        }
        for m, v in cal["details"]["choice"]["modes"].items()
    }
    rows = pf.setpoint_rows(
        [cal | {"annual_by_mode": annual, "usable": True, "confidence": {"level": "low"}}]
    )
    assert [r["Mode"] for r in rows] == ["PERF", "BAL", "EFF"]
    bal = rows[1]
    assert bal["Setting"] == cal["details"]["choice"]["modes"]["bal"]["setting"]["label"]
    assert bal["kWh/yr saved"] == "123" and bal["$/yr saved"] == "$25" and bal["Status"] == "current"
    assert bal["Trust"] == "simulated" and bal["Tokens/J"].startswith("+")
    stale = pf.setpoint_rows(
        [cal | {"annual_by_mode": annual, "stale": True, "stale_reason": "engine changed"}]
    )
    assert all(
        r["Status"].startswith("STALE — engine changed") and "not offered" in r["Status"] for r in stale
    )


def test_a_recommendation_from_a_stale_calibration_is_not_offered(cal: dict) -> None:
    rec = recommendation(TARGET, {"decode": cal})
    cid = cal["calibration_id"]
    assert pf.stale_calibrations(rec, {cid: cal | {"stale": False}}) == []
    (why,) = pf.stale_calibrations(rec, {cid: cal | {"stale": True, "stale_reason": "driver changed"}})
    assert cid in why and "driver changed" in why
    (row,) = pf.setting_rows(rec)
    assert row["Role"] == "decode" and row["Workers"] == "worker-1" and row["kWh/yr saved"] != "—"
    assert (
        pf.best_power_recommendation([{"kind": "layout", "status": "proposed"}, rec])["recommendation_id"]
        == (rec["recommendation_id"])
    )


def test_the_guard_rows() -> None:
    """The rows as the apply runner and the power guard write them (phaselens/apply/runner.py's
    ``guard``, phaselens/apply/power_guard.py's ``power_release``)."""
    actions = [
        {
            "ts_s": 1.0,
            "action": "guard",
            "status": "applied",
            "dry_run": False,
            "after": {"requests": 4, "slo_attainment": 1.0, "passed": True},
            "message": "SLO attainment 100.0 %",
            "recommendation_id": "r",
        },
        {
            "ts_s": 2.0,
            "action": "power_release",
            "status": "applied",
            "dry_run": False,
            "before": {"window": {"requests": 5, "slo_attainment": 0.2}},
            "after": {"role": "decode"},
            "message": "decode lane breached (SLO attainment 20.0 % under 90 %): its knob released to the defaults",
            "recommendation_id": "r",
        },
        {"ts_s": 3.0, "action": "guard", "status": "planned", "dry_run": True, "recommendation_id": "r"},
    ]
    got = pf.guard_rows(actions)
    assert [r["Event"] for r in got] == ["decode lane released", "guard window passed"]
    assert got[0]["SLO attainment"] == "20.0 %" and "breached" in got[0]["Why"]
    assert list(pf.released_lanes(actions)) == ["decode"]


def test_the_change_windows_and_the_energy_per_phase_before_and_after() -> None:
    rows = [
        {"ts_s": 100.0, "action": "set_device", "status": "planned", "dry_run": True},
        {"ts_s": 200.0, "action": "set_device", "status": "applied", "dry_run": False},
        {"ts_s": 230.0, "action": "realised", "status": "applied", "dry_run": False},
    ]
    assert pf.change_windows(rows, 260.0) == {
        "before_start_s": 140.0,
        "change_s": 200.0,
        "after_end_s": 260.0,
    }
    rolled = [*rows, {"ts_s": 250.0, "action": "rollback", "status": "applied", "dry_run": False}]
    assert pf.change_windows(rolled, 900.0)["after_end_s"] == 250.0  # the setting ended there
    assert pf.change_windows(rows, 1e6)["after_end_s"] == 200.0 + pf.MAX_AFTER_S
    assert pf.change_windows(rows[:1], 300.0) is None  # a dry run set nothing

    def summary(j_in, j_out, ttft_p50_s):
        return {
            "parts": {
                "cost": {
                    "total": {"j_per_input_token": j_in, "j_per_output_token": j_out},
                    "trust": {"labels": ["emulated"]},
                },
                "latency": {
                    "percentiles": {"ttft": {"p50_s": ttft_p50_s}},
                    "trust": {"labels": ["emulated", "host-bound"]},
                },
            }
        }

    got = {r["Figure"]: r for r in pf.realised_rows(summary(0.5, 4.0, 0.1), summary(0.5, 3.2, 0.11))}
    decode = got["decode tokens/J (output tokens)"]
    assert (decode["Before"], decode["After"], decode["Change"], decode[""]) == (
        "0.25",
        "0.3125",
        "+25.0 %",
        "better",
    )
    assert got["prefill tokens/J (input tokens)"][""] == "—"
    ttft = got["TTFT p50, ms"]
    assert (ttft["Before"], ttft["After"], ttft[""]) == ("100", "110", "worse")
    assert got["ITL p99, ms"]["Before"] == "—"
    assert pf.realised_rows(None, summary(None, 3.2, None))[1]["Before"] == "—"
    assert pf.summary_trust(summary(1, 1, 1)) == ["emulated", "host-bound"]
