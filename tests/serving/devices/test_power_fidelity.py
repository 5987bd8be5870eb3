"""Busy power of the GPU model against published power figures (issue 23 point 3;
serving/devices/power_fidelity.py, docs/FIDELITY.md "Power"): the protocol's sets, the target on the
calibration and validation units with the known misses named, the shipped constants as the fit, this
project's H200 windows, the power cap (the clock drops only where the phase's power exceeds the cap;
token time unchanged) and a collective's power following its data movement. The test set is not
scored here (bench/fidelity_power.py --score-test, once)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from serving.config import preset
from serving.devices import gap_power_w, predict_iteration
from serving.devices import power_fidelity as pf
from serving.devices.gpu_model import DEFAULT_CONSTANTS
from serving.devices.published import LLAMA2_70B, decode_work, prefill_work
from serving.devices.published_power import (
    PCAP_LIMIT_W,
    PCAP_PROMPT_RATIO,
    PCAP_TOKEN_RATIO,
    TEST_UNITS,
    UNITS,
)

#: calibration / validation units beyond 15 % on a figure, with the reason (docs/FIDELITY.md, "Power")
KNOWN_MISSES = {
    # a short prompt (154 ms): the CSV's peak sits near the decode level, as if the reading averaged
    # the prompt with the decode steps after it; the model's peak is the prompt iteration's own power
    # (the A100 TP 4 128-token prompt missed too until the refit on the merged v3 timing, 2026-12-05)
    ("a100-80gb", 8, 1024, 1, 128): "peak",
    # decode after a 4096-token prompt: the model's K/V reads (per query head, gqa_unaware_attention)
    # raise its HBM traffic and power with the context; the measured average falls instead
    ("a100-80gb", 8, 4096, 1, 128): "avg",
}
#: this project's H200 windows beyond 15 %: the host-bound eager engine's decode at a locked clock reads
#: 197-267 W with the GPU busy 58-70 % of the window, which under the modeled gap power would need a
#: decode busy power above the compute-bound prefill's at the same clock (258 W at 990 MHz)
KNOWN_H200_MISSES = {
    ("run2", "decode", "sm 1410 MHz"),
    ("run2", "decode", "sm 990 MHz"),
    ("engine", "decode", "sm 990 MHz"),
}


def test_the_test_units_are_the_protocol_rule_and_stay_out_of_the_open_sets() -> None:
    """TEST_UNITS is the rule's output over every power unit (per hardware and TP, sha256 order, the
    first half rounded up: 90 of 171), and no test unit is calibrated on or validated against."""
    assert len(UNITS) == 171 and len(TEST_UNITS) == 90
    assert set(TEST_UNITS) == pf.test_rule(list(UNITS))
    s = pf.sets()
    assert not (set(s["calibration"]) | set(s["validation"])) & set(TEST_UNITS)
    assert len(s["calibration"]) >= 3 * len(pf.FITTED)  # >= 3 calibration units per fitted constant
    # what is left out carries no power reading at all (0 of TDP in both columns): every H100 one
    assert all(UNITS[u] == (0.0, 0.0) for u in s["not recorded"])
    assert {u[0] for u in s["not recorded"]} >= {"h100-80gb", "h100-80gb-pcap"}


@pytest.mark.parametrize("role", ["calibration", "validation"])
def test_busy_power_meets_10pct_median_with_only_the_named_misses(role: str) -> None:
    """Target: busy power median |error| <= 10 % (peak and average together) on each open set; every
    figure beyond 15 % is a named miss, and each named miss still misses (the list stays honest)."""
    rows = pf.score(pf.sets()[role])
    assert pf.summary(rows)["median"] <= pf.TARGET
    beyond = {(r["unit"], key) for r in rows for key in ("peak", "avg") if abs(r[f"{key}_error"]) > 0.15}
    named = {(u, key) for u, key in KNOWN_MISSES.items() if u in pf.sets()[role]}
    assert beyond == named


def test_shipped_power_constants_are_the_fit_of_the_calibration_units() -> None:
    comm, hbm_a100 = pf.fit(pf.sets()["calibration"])
    assert comm == pytest.approx(DEFAULT_CONSTANTS.comm_power, abs=0.02)
    assert hbm_a100 == pytest.approx(DEFAULT_CONSTANTS.hbm_power_for("a100-sxm-80gb"), abs=0.02)
    assert DEFAULT_CONSTANTS.hbm_power_for("h200") == DEFAULT_CONSTANTS.hbm_power  # Hopper: the v1 value


def test_h200_windows_within_15pct_except_the_locked_clock_decode_ones() -> None:
    rows = pf.h200_windows()
    beyond = {(r["file"], r["phase"], r["knob"]) for r in rows if abs(r["error"]) > 0.15}
    assert beyond == KNOWN_H200_MISSES
    gpu_bound = [r for r in rows if r["phase"] == "prefill" and r["util"] >= 0.95]
    assert max(abs(r["error"]) for r in gpu_bound) <= 0.08


def test_the_cap_lowers_the_clock_only_where_the_phase_exceeds_it_and_token_time_holds() -> None:
    """Under 490 W (70 % of the H100's TDP, the CSV's capped H100): a prompt phase whose busy power at
    full clock exceeds the cap runs slower at a lower clock, one under it is untouched; decode never
    exceeds it, so token time is unchanged (the CSV: 1.00x on every open pair)."""
    assert PCAP_LIMIT_W == 490.0 and PCAP_TOKEN_RATIO == (1.0, 1.0) and PCAP_PROMPT_RATIO == (1.3, 1.3)
    cap = pf.cap_behaviour()
    for p in cap["prompts"]:
        if p["busy_w"] > PCAP_LIMIT_W + 1:
            assert p["capped_mhz"] < 1980 and 1.0 < p["ratio"] <= 1.4, p
        elif p["busy_w"] < PCAP_LIMIT_W - 1:
            assert p["capped_mhz"] == 1980 and p["ratio"] == pytest.approx(1.0), p
    assert any(p["ratio"] > 1.1 for p in cap["prompts"])  # the compute-bound TP 2 prompts
    assert all(t["busy_w"] < PCAP_LIMIT_W for t in cap["tokens"])
    assert cap["token_ratio_max"] <= 1.01


def test_capped_prefill_slows_as_this_projects_h200_measured() -> None:
    """The measured capped prefill (docs/gpu run2: llama-3.1-8b 4096 tokens, 107.8 ms uncapped, 121.7 ms
    at 497 W, 148.7 ms at 350 W): the model's slowdown within 8 % of each ratio (the tolerance of
    test_h200_prefill_rows_of_run2_within_tolerance)."""
    shape = preset("llama-3.1-8b")

    def t(cap: float | None) -> float:
        return predict_iteration(
            "h200", shape, prefill_work(4096), power_limit_w=cap, profile="phaselens-eager"
        ).time_s

    assert t(497) / t(None) == pytest.approx(121.669 / 107.772, rel=0.08)
    assert t(350) / t(None) == pytest.approx(148.72 / 107.772, rel=0.08)


def test_a_collectives_power_follows_its_data_movement() -> None:
    """A TP 8 prefill spends most of its busy time in all-reduces: priced as data movement (SMs copying
    and reducing, the message through HBM) it draws well above the waiting power v2 gave it (322-355 W)
    and the GPU's gap power; a decode step's all-reduces are per-call latency (ring steps), priced as a
    wait, so per-GPU decode power falls with TP as the A100 averages do (0.74 / 0.60 / 0.43 of TDP)."""
    work = prefill_work(4096)
    est = predict_iteration("h100-sxm", LLAMA2_70B, work, tp=8, link="nvlink", profile="splitwise-2023")
    assert est.comm_s > 0.5 * est.busy_s
    assert est.power_w > 0.75 * 700
    waiting = replace(DEFAULT_CONSTANTS, comm_power=DEFAULT_CONSTANTS.latency_power, comm_hbm_passes=0.0)
    idle_comm = predict_iteration(
        "h100-sxm", LLAMA2_70B, work, tp=8, link="nvlink", profile="splitwise-2023", constants=waiting
    )
    assert est.power_w - idle_comm.power_w > 150.0
    assert idle_comm.power_w > gap_power_w("h100-sxm", 0.0)
    decode_w = [
        predict_iteration(
            "a100-sxm-80gb", LLAMA2_70B, decode_work(1, 576), tp=tp, link="nvlink3", profile="splitwise-2023"
        ).power_w
        for tp in (2, 4, 8)
    ]
    assert decode_w[0] > decode_w[1] > decode_w[2]
    assert decode_w == pytest.approx([0.74 * 400, 0.60 * 400, 0.43 * 400], rel=0.12)


def test_h200_decode_in_the_published_range_up_to_batch_32() -> None:
    """arXiv 2605.11999: H200 decode draws 137-300 W. The model's llama-3.1-8b decode (vllm) busy power
    at batch 1-32 lies in it; batch 64 (328 W) is above it (docs/EMULATION.md, known)."""
    rows = {r["batch"]: r["busy_w"] for r in pf.h200_decode_range()}
    assert all(137 <= rows[b] <= 300 for b in (1, 8, 32))
    assert rows[64] > 300
