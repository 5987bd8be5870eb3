"""Simulator mode: a layout not deployed is swept with the GPU model under the same bounds; the cliff
is where the phase's latency first rises beyond the threshold, and each mode's choice holds to its
bounds (asserted as behaviour, not watts: the GPU model's power under caps may change)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.store import Store
from phaselens.cli import main
from phaselens.power.choose import ChooseOptions, choose_modes, slowdown_pct
from phaselens.power.load import LoadSpec
from phaselens.power.plan import CalibrateError, plan_sweep
from phaselens.power.simulate import sim_bounds, simulate_sweep

LAYOUT = "1p1d:h200:gpu_memory_utilization=0.96"


@pytest.fixture(scope="module")
def decode_points() -> list[dict]:
    roles, _ = sim_bounds(LAYOUT, "llama-3.1-70b")
    plan = plan_sweep(
        {"decode": roles["decode"]},
        knobs=["sm_clock"],
        sm_clocks_mhz=[1440, 885, 345],
        point_s=30,
        settle_s=0,
    )
    return simulate_sweep(LAYOUT, "llama-3.1-70b", plan, LoadSpec(rate_rps=3.0))["decode"]["points"]


def test_the_cliff_is_the_first_clock_window_where_decode_latency_rises(decode_points: list[dict]) -> None:
    out = choose_modes(decode_points, "decode")
    ref, threshold = out["reference"], out["threshold_pct"]
    cliff = out["cliff"]["sm_clock"]
    assert cliff is not None, "locking decode's clock at 345 MHz must slow its tokens"
    swept = [p for p in decode_points if p["setting"]["knob"] == "sm_clock"]
    at = next(i for i, p in enumerate(swept) if p["setting"] == cliff["setting"])
    assert all(slowdown_pct(p["figures"], ref, "decode") <= threshold for p in swept[:at])
    assert slowdown_pct(swept[at]["figures"], ref, "decode") > threshold
    assert out["noise_pct"] == 0.0  # the simulator repeats itself exactly


def test_each_mode_holds_to_its_bounds(decode_points: list[dict]) -> None:
    o = ChooseOptions(eps=0.05)
    out = choose_modes(decode_points, "decode", o)
    ref, modes, slo = out["reference"], out["modes"], out["slo"]
    gains = {}
    for mode, m in modes.items():
        if m["keep_defaults"]:
            gains[mode] = 0.0
            continue
        f = m["figures"]
        eps = o.eps * (o.eff_eps_factor if mode == "eff" else 1)
        factor = o.eff_slo_factor if mode == "eff" else 1
        assert f["output_tokens_per_s"] >= (1 - eps) * ref["output_tokens_per_s"]
        assert f["itl_p99_s"] <= slo["itl_p99_s"] * factor and f["ttft_p99_s"] <= slo["ttft_p99_s"] * factor
        assert f["tokens_per_j"] > ref["tokens_per_j"]
        if mode == "perf":
            assert slowdown_pct(f, ref, "decode") <= out["threshold_pct"]
        gains[mode] = m["tokens_per_j_gain_pct"]
    assert gains["perf"] <= gains["bal"] <= gains["eff"]


def test_a_tighter_slo_never_picks_a_slower_setting(decode_points: list[dict]) -> None:
    loose = choose_modes(decode_points, "decode", ChooseOptions(slo_itl_s=10.0, slo_ttft_s=100.0))["modes"][
        "bal"
    ]
    ref = choose_modes(decode_points, "decode")["reference"]
    tight = choose_modes(
        decode_points, "decode", ChooseOptions(slo_itl_s=ref["itl_p99_s"] * 1.0001, slo_ttft_s=100.0)
    )["modes"]["bal"]
    if not tight["keep_defaults"]:
        assert tight["figures"]["itl_p99_s"] <= ref["itl_p99_s"] * 1.0001
        assert tight["tokens_per_j_gain_pct"] <= loose["tokens_per_j_gain_pct"]


def test_cli_simulate_stores_simulated_calibrations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    rc = main(
        [
            "calibrate",
            "--simulate",
            LAYOUT,
            "--knobs",
            "power_limit",
            "--points",
            "2",
            "--point-s",
            "20",
            "--db",
            str(db),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "simulated calibration of" in out and "prefill:" in out and "decode:" in out and "BAL" in out
    with Store.open(db) as store:
        rows = store.query("SELECT role, source, status, trust, gpu_model, driver FROM power_calibrations")
    assert sorted(rows["role"]) == ["decode", "prefill"]
    assert set(rows["source"]) == {"simulated"} and set(rows["status"]) == {"current"}
    assert all("simulated" in t for t in rows["trust"]) and set(rows["driver"]) == {"simulated"}


def test_cli_simulate_recommends_for_the_pools_gpus_and_the_script_exports_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layout not deployed gets a power recommendation too (for clusters: exported as an nvidia-smi
    script); its yearly saving counts every GPU of each pool (replicas x TP), not one per pool."""
    from analytics.prices import load_prices
    from phaselens.power.records import annual_saving

    db = tmp_path / "s.duckdb"
    layout = "2p3d:h200:tp2:gpu_memory_utilization=0.96"
    args = ["calibrate", "--simulate", layout, "--knobs", "sm_clock", "--points", "2", "--db", str(db)]
    assert main(args) == 0
    out = capsys.readouterr().out
    (rid,) = [w for line in out.splitlines() if line.startswith("recommendation ") for w in line.split()[1:2]]
    with Store.open(db) as store:
        rec = store.query("SELECT kind, target, status, proposed FROM recommendations")
        cals = store.query("SELECT role, details FROM power_calibrations")
    assert list(rec["kind"]) == ["power"] and list(rec["status"]) == ["proposed"]
    assert rec["target"][0] == f"sim:{layout}"
    gpus = {r: json.loads(d)["gpus"] for r, d in zip(cals["role"], cals["details"], strict=True)}
    assert gpus == {"prefill": 4, "decode": 6}
    settings = json.loads(rec["proposed"][0])["settings"]
    prices = load_prices()
    for role, s in settings.items():
        if "annual" in s:
            mode = json.loads(cals["details"][list(cals["role"]).index(role)])["choice"]["modes"]["bal"]
            assert s["annual"] == annual_saving(mode["power_w_change"], gpus[role], prices)
    if json.loads(rec["proposed"][0])["changes"]:
        assert f"phaselens export {rid} --format nvidia-smi" in out
        script = tmp_path / "power.sh"
        assert main(["export", rid, "--format", "nvidia-smi", "--db", str(db), "--out", str(script)]) == 0
        assert "nvidia-smi -i" in script.read_text()


def test_a_layout_that_cannot_run_or_that_sets_knobs_is_refused() -> None:
    with pytest.raises(CalibrateError, match="use tp"):
        sim_bounds("1p1d:h200", "llama-3.1-70b")  # 70B does not fit one H200 at 0.9 memory
    with pytest.raises(CalibrateError, match="already sets"):
        sim_bounds(LAYOUT + ":decode.power_limit_w=400", "llama-3.1-70b")
    assert main(["calibrate", "--simulate", LAYOUT, "--power-limits", "800"]) == 2


def test_the_load_is_the_observed_workload_of_a_stored_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.analytics.workload.conftest import known_trace, simulate_into

    trace = known_trace(1.0, seed=7)
    db = tmp_path / "s.duckdb"
    simulate_into(trace, db, tmp_path / "t.csv")
    capsys.readouterr()
    args = ["calibrate", "--simulate", LAYOUT, "--roles", "decode", "--knobs", "sm_clock", "--points", "1"]
    assert main([*args, "--point-s", "30", "--dataset", "latest", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "under the observed workload (" in out
    with Store.open(db) as store:
        details = store.query("SELECT details FROM power_calibrations").iat[0, 0]
    load = json.loads(details)["load"]
    duration = max(r.arrival_s for r in trace) - min(r.arrival_s for r in trace)
    assert load["source"] == "observed" and load["rate_rps"] == pytest.approx(len(trace) / duration, rel=0.15)
    assert main([*args, "--dataset", "nope", "--db", str(db)]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--eps", "2"], "--eps must be in [0, 1)"),
        (["--point-s", "0"], "--point-s must be in [1, 3600]"),
        (["--rate", "0"], "the load's rate must be in (0, 1000]"),
        (["--max-minutes", "0"], "--max-minutes must be in (0, 1440]"),
        (["--knobs", "fan"], "unknown knob 'fan'"),
        (["--roles", "router"], "--roles router: the layout's roles are prefill, decode"),
        (["--sm-clocks", "100"], "SM clock 100 MHz is outside [345, 1980] MHz"),
        (["--slo-itl-ms", "-1"], "slo_itl_s must be a number > 0"),
    ],
)
def test_bad_input_is_refused_naming_what_is_allowed(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--simulate", LAYOUT, *args]) == 2
    assert says in capsys.readouterr().err


def test_the_live_stack_needs_its_control_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    assert main(["calibrate", "--url", "http://127.0.0.1:9"]) == 2
    assert "control token is required" in capsys.readouterr().err
    assert main(["calibrate", "--url", "http://127.0.0.1:9", "--token", "t"]) == 2
    assert "cannot reach the serving stack at http://127.0.0.1:9" in capsys.readouterr().err


def test_a_mixed_pool_is_judged_on_both_latencies() -> None:
    layout = "agg:1xh200:gpu_memory_utilization=0.96"
    roles, _ = sim_bounds(layout, "llama-3.1-70b")
    assert list(roles) == ["mixed"]
    plan = plan_sweep(roles, knobs=["sm_clock"], sm_clocks_mhz=[885, 345], point_s=20, settle_s=0)
    points = simulate_sweep(layout, "llama-3.1-70b", plan, LoadSpec(rate_rps=2.0))["mixed"]["points"]
    out = choose_modes(points, "mixed")
    ref = out["reference"]
    for p in points[1:]:  # the slowdown of a mixed pool is the worse of its TTFT and ITL rises
        f = p["figures"]
        rises = [(f[k] / ref[k] - 1) * 100 for k in ("ttft_p50_s", "itl_p50_s")]
        assert slowdown_pct(f, ref, "mixed") == pytest.approx(max(rises))
    assert out["cliff"]["sm_clock"] is not None  # 345 MHz slows a pool that prefills too
