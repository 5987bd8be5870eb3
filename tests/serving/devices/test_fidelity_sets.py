"""The v3 fidelity protocol (serving/devices/fidelity_sets.py, docs/FIDELITY.md "Protocol"): the fixed
test set and the rule that regenerates it, every llama2-70b Splitwise unit in exactly one set, the
calibration rule, the regenerating script of the committed medians, the targets on the calibration and
validation sets with every miss named, the fit's points per constant and leave-one-out. Nothing here is
timed; the errors are recomputed from the committed figures with the shipped profiles."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from serving.devices import PROFILES, calibration, fidelity_sets, published, published_splitwise
from serving.devices import splitwise_csv as splitwise_units

UNCAPPED = ("h100-80gb", "a100-80gb")


def test_test_set_is_regenerated_by_its_rule() -> None:
    """The committed TEST_UNITS are exactly what the hash rule over the unseen units gives (206 units:
    38 TTFT, 78 TPOT, 90 power), so nobody can have picked them."""
    units = fidelity_sets.TEST_UNITS
    assert len(units) == len(set(units)) == 206
    assert set(units) == fidelity_sets.test_units_by_rule()
    by_figure = {f: sum(1 for u in units if u[0] == f) for f in ("ttft", "tpot", "power")}
    assert by_figure == {"ttft": 38, "tpot": 78, "power": 90}
    assert not set(units) & fidelity_sets.SEEN_V2


def test_every_unit_is_in_exactly_one_set_and_calibration_follows_its_rule() -> None:
    points = fidelity_sets.SPLITWISE_POINTS
    keys = [fidelity_sets.unit_of(p) for p in points]
    assert len(keys) == len(set(keys)) == len(published_splitwise.TTFT_MS) + len(published_splitwise.TPOT_MS)
    assert len(published_splitwise.TTFT_MS) == 117 and len(published_splitwise.TPOT_MS) == 171
    roles = {k: p.role for k, p in zip(keys, points, strict=True)}
    assert set(roles.values()) == {"calibration", "validation", "test", "excluded"}
    test = set(fidelity_sets.TEST_UNITS)
    for k, role in roles.items():
        if k in fidelity_sets.ANOMALIES:
            assert role == "excluded" and fidelity_sets.ANOMALIES[k]
        elif k in test:
            assert role == "test"
        elif role == "calibration":
            assert k[1] in UNCAPPED  # the capped H100 never calibrates (its timing is the power model's)
    assert {k for k, r in roles.items() if r == "calibration"} == set(
        fidelity_sets.calibration_units_by_rule()
    )
    assert sum(r == "calibration" for r in roles.values()) == 66
    # the capped units run at 490 W through the public model, the others at the TDP
    for p in points:
        hw = fidelity_sets.unit_of(p)[1]
        assert p.power_limit_w == (490.0 if hw == "h100-80gb-pcap" else None)


def test_excluded_units_are_anomalous_in_the_data_itself() -> None:
    """TP 2 with 64 prompts: the prompt time is far below that of 32 prompts and the token time falls."""
    ttft, tpot = published_splitwise.TTFT_MS, published_splitwise.TPOT_MS
    for hw in fidelity_sets.HARDWARE:
        assert ttft[hw, 2, 512, 64] < 0.2 * ttft[hw, 2, 512, 32]
        assert tpot[hw, 2, 512, 64, 128] < tpot[hw, 2, 512, 32, 128]
        assert ttft[hw, 4, 512, 64] > 1.8 * ttft[hw, 4, 512, 32]  # not so at TP 4
    assert {k[2:] for k in fidelity_sets.ANOMALIES} == {(2, 512, 64), (2, 512, 64, 128)}


def test_splitwise_module_is_regenerated_from_a_csv_and_skips_the_blind_rows(tmp_path: Path) -> None:
    """serving/devices/splitwise_csv.py (bench/splitwise_units.py): per-unit medians of the llama2-70b rows; bloom-176b rows are not read
    (a bloom row with garbage in every other column does not break it); a wrong file is a clear error."""
    path = tmp_path / "perf_model.csv"
    cols = "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,e2e_time,tensor_parallel"
    rows = [
        ["llama2-70b", "h100-80gb", 128, 1, 128, 0, 0, t, 30.0 + i, 0, 2]
        for i, t in enumerate((50.0, 40.0, 60.0))
    ]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols.split(","))
        w.writerows(rows)
        w.writerow(["bloom-176b", "x", "y", "z", "w", "", "", "", "", "", ""])
    ttft, tpot, peak, _avg = splitwise_units.medians(path)
    assert ttft == {("h100-80gb", 2, 128, 1): 50.0} and tpot == {("h100-80gb", 2, 128, 1, 128): 31.0}
    assert peak == {("h100-80gb", 2, 128, 1, 128): 0.0}
    text = splitwise_units.render(path)
    assert '("h100-80gb", 2, 128, 1): 50.0,' in text and "PEAK_POWER_FRAC" in text
    empty = tmp_path / "other.csv"
    empty.write_text(cols + "\n")
    with pytest.raises(SystemExit, match="no llama2-70b rows"):
        splitwise_units.medians(empty)


def _errors(role: str, figure: str, hardware: tuple[str, ...]) -> dict[tuple, float]:
    out = {}
    for p in fidelity_sets.SPLITWISE_POINTS:
        key = fidelity_sets.unit_of(p)
        if p.role == role and key[0] == figure and key[1] in hardware:
            out[key] = p.error()
    return out


@pytest.mark.parametrize("role", ["calibration", "validation"])
def test_tpot_meets_the_targets_on_calibration_and_validation(role: str) -> None:
    """TPOT: median |error| <= 7 %, p90 <= 15 % on every GPU (the capped H100 too: token time does not
    change under the cap, and the model does not change it either)."""
    errs = _errors(role, "tpot", tuple(fidelity_sets.HARDWARE))
    s = fidelity_sets.error_stats(errs.values())
    assert s["n"] >= 30
    assert s["median"] <= fidelity_sets.TARGET_MEDIAN and s["p90"] <= fidelity_sets.TARGET_P90, s


@pytest.mark.parametrize("role", ["calibration", "validation"])
def test_ttft_meets_the_median_target_and_every_miss_beyond_15pct_is_named(role: str) -> None:
    """TTFT on the uncapped GPUs: median |error| <= 7 %; every unit beyond 15 % (the p90 target is not
    met on validation) is in KNOWN_MISSES with its reason, and every named unit of the set still misses;
    the p90 of the units not named meets 15 %."""
    errs = _errors(role, "ttft", UNCAPPED)
    s = fidelity_sets.error_stats(errs.values())
    assert s["median"] <= fidelity_sets.TARGET_MEDIAN, s
    misses = {k for k, e in errs.items() if abs(e) > 0.15}
    named = {k for k in fidelity_sets.KNOWN_MISSES if k in errs}
    assert misses == named, {k: f"{errs[k]:+.1%}" for k in misses ^ named}
    rest = fidelity_sets.error_stats(e for k, e in errs.items() if k not in named)
    assert rest["p90"] <= fidelity_sets.TARGET_P90, rest


@pytest.mark.parametrize("role", ["validation", "test"])
def test_capped_h100_prompts_are_only_too_fast_for_the_named_reason(role: str) -> None:
    """The 490 W units: the model is only ever faster than measured (it does not slow a capped prefill:
    the power model's part, CAPPED_TTFT_REASON); once the power model binds they should move toward 0."""
    errs = _errors(role, "ttft", ("h100-80gb-pcap",))
    assert len(errs) >= 17 and fidelity_sets.CAPPED_TTFT_REASON
    assert all(-0.35 < e < 0 for e in errs.values()), {k: f"{e:+.1%}" for k, e in errs.items()}


def test_test_set_tpot_meets_the_targets() -> None:
    """Scored once (2026-12-05 05:05 UTC, docs/FIDELITY.md): TPOT on every test unit of every source,
    median |error| <= 7 % and p90 <= 15 % (2.5 % / 7.0 %)."""
    errs = [p.error() for p in fidelity_sets.POINTS if p.role == "test" and p.metric == "tpot"]
    s = fidelity_sets.error_stats(errs)
    assert s["n"] == 89
    assert s["median"] <= fidelity_sets.TARGET_MEDIAN and s["p90"] <= fidelity_sets.TARGET_P90, s


def test_test_set_ttft_misses_the_targets_only_for_the_named_reasons() -> None:
    """TTFT on the test set does NOT meet the targets (median 19.1 %, p90 25.8 %: docs/FIDELITY.md). The
    misses are named: every uncapped Splitwise test unit beyond 15 % is an A100 batch of prompts in
    KNOWN_MISSES, and the capped H100's (CAPPED_TTFT_REASON) are all too fast; without those two groups the
    rest meets both targets."""
    errs = {
        (p.source, fidelity_sets.unit_of(p) or (p.shape, p.what)): p.error()
        for p in fidelity_sets.POINTS
        if p.role == "test" and p.metric == "ttft"
    }
    everything = fidelity_sets.error_stats(errs.values())
    assert everything["n"] == 39
    assert everything["median"] > fidelity_sets.TARGET_MEDIAN  # the known miss, stated, not hidden
    uncapped = {k: e for k, e in errs.items() if k[0] != "splitwise" or k[1][1] in UNCAPPED}
    misses = {k[1] for k, e in uncapped.items() if abs(e) > 0.15}
    named = {k for k in fidelity_sets.KNOWN_MISSES if ("splitwise", k) in uncapped}
    assert misses == named, misses ^ named
    rest = fidelity_sets.error_stats(e for k, e in uncapped.items() if k[1] not in named)
    assert rest["median"] <= fidelity_sets.TARGET_MEDIAN and rest["p90"] <= fidelity_sets.TARGET_P90, rest


def test_fitted_constants_have_three_calibration_points_each_or_are_named() -> None:
    per = calibration.units_per_constant()
    assert per["splitwise-2023"][0] >= calibration.MIN_UNITS_PER_CONSTANT * per["splitwise-2023"][1]
    assert per["vllm"] == (6, 2)
    # the known gap: TRT-LLM v0.5 published three fp16 rows for two constants (docs/FIDELITY.md)
    assert per["trtllm-0.5"] == (3, 2)
    assert any(f == "custom_allreduce_max_bytes" for _, f, _, _ in calibration.SET_FROM_PUBLISHED)


def test_shipped_profiles_are_the_fit_of_their_calibration_points() -> None:
    for name, rel in (("vllm", 0.05), ("splitwise-2023", 0.05)):
        fitted, consts = calibration.fit_profile(name)
        shipped = PROFILES[name]
        for field, *_ in calibration.FITS[name]:
            if field == "gpu.gemm_a100":
                got = consts.gemm_efficiency_for("a100-sxm-80gb")
                want = published.DEFAULT_CONSTANTS.gemm_efficiency_for("a100-sxm-80gb")
            else:
                got, want = getattr(fitted, field), getattr(shipped, field)
            assert got == pytest.approx(want, rel=rel), (name, field)


def test_leave_one_out_refits_without_the_point_and_predicts_it() -> None:
    """On the small TRT-LLM profile: each left-out point is predicted by a fit that did not see it, so
    its error is larger than in the full fit (where 2 constants nearly fit 3 points)."""
    res = calibration.leave_one_out("trtllm-0.5", iters=120)
    assert [p.what for p, _ in res] == [p.what for p in calibration.calibration_points("trtllm-0.5")]
    full = {p.what: abs(p.error()) for p in calibration.calibration_points("trtllm-0.5")}
    assert all(math.isfinite(e) for _, e in res)
    assert max(abs(e) for _, e in res) > max(full.values())
