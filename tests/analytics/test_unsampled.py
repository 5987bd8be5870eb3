"""Sample gaps: time between a GPU's samples further apart than its gap threshold is ``unsampled`` —
its own state, never idle — in the intervals, the buckets, the phase breakdown, the idle split and
the cost; its energy (the counter's rise across the gap) is attributed to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from analytics.attribution import STATES, gpu_buckets, gpu_intervals, phase_breakdown
from analytics.bimodal import CATEGORIES, idle_split
from analytics.cost import PriceTable, cost_breakdown
from analytics.intervals import GAP_MIN_S, GAP_PERIODS
from analytics.power_model import gpu_key
from analytics.summary import format_summary, summarize
from analytics.window import Window
from tests.analytics.test_attribution import NODE, iteration, make_store, request, samples

START_S, END_S = 100.0, 400.0
GAP_FROM_S, GAP_TO_S = 200.0, 260.0  # GPU 0 has no sample strictly between these
WINDOW = Window(START_S, END_S + 1.0, "live")
KEY0 = gpu_key(NODE, "nvml", "cuda:0", 0)
KEY1 = gpu_key(NODE, "nvml", "cuda:1", 1)
IDLE_W, DECODE_W = 100.0, 250.0
# decode iterations of 0.5 s every 10 s on both GPUs (also while GPU 0 was not sampled)
DECODE_AT_S = [START_S + 0.2 + 10.0 * i for i in range(30)]
PRICES = PriceTable(gpu_usd_per_hour={"NVIDIA H100 80GB HBM3": 3.6}, electricity_usd_per_kwh=0.1, pue=1.0)

# GPU 1's figures before sample gaps were a state of their own (commit 9326ae2; GPU 1 has no gap):
# they must not change. Sample intervals and 1 s buckets give the same seconds on 1 s samples.
GPU1_BEFORE = {
    "interval_s": 300.0,
    "decode_s": 15.0,
    "idle_s": 285.0,
    "energy_j": 32_250.0,
    "energy_idle_j": 28_500.0,
    "energy_decode_j": 3_750.0,
}


def _gpu(idx: int) -> dict[str, Any]:
    return {"device": f"cuda:{idx}", "index": idx, "uuid": f"GPU-{'ab'[idx]}", "worker": f"w{idx}"}


def _counter_mj(ts: list[float]) -> list[int]:
    """The energy counter at each sample: IDLE_W all the time, DECODE_W − IDLE_W more while decoding
    (the GPU runs whether it is sampled or not)."""

    def joules_until(t: float) -> float:
        busy = sum(max(0.0, min(t, a + 0.5) - a) for a in DECODE_AT_S)
        return IDLE_W * (t - START_S) + (DECODE_W - IDLE_W) * busy

    return [1_000_000 + round(1000.0 * joules_until(t)) for t in ts]


EVERY_S = [START_S + i for i in range(int(END_S - START_S) + 1)]
GAPPED_S = [t for t in EVERY_S if not GAP_FROM_S < t < GAP_TO_S]


def gap_store(path: Path, gpus: tuple[int, ...] = (0, 1)) -> duckdb.DuckDBPyConnection:
    """GPUs sampled every second over [100, 400] s; GPU 0 not sampled between 200 and 260 s."""
    rows, its, reqs = [], [], []
    for idx, ts in ((0, GAPPED_S), (1, EVERY_S)):
        if idx not in gpus:
            continue
        g = _gpu(idx)
        rows += [{**r, **g} for r in samples(ts, _counter_mj(ts))]
        for n, a in enumerate(DECODE_AT_S):
            its.append({**iteration(a, a + 0.5, "decode", decode_seqs=4), "gpu_uuid": g["uuid"], "gpu_index": idx,
                        "worker": g["worker"]})  # fmt: skip
            reqs.append({**request(f"r{idx}-{n}", a, a + 0.5), "prefill_worker": g["worker"],
                         "decode_worker": g["worker"]})  # fmt: skip
    return make_store(path, {"gpu_samples": rows, "iterations": its, "requests": reqs})


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    c = gap_store(tmp_path_factory.mktemp("gaps") / "gaps.duckdb")
    yield c
    c.close()


def _row(df: Any, idx: int) -> Any:
    return df[df["index"] == idx].iloc[0]


# decode seconds of GPU 0 while sampled: the iterations at 200.2 .. 250.2 fall in the gap
GAP_DECODE_S = 0.5 * sum(1 for a in DECODE_AT_S if GAP_FROM_S < a < GAP_TO_S)
GAP_S = GAP_TO_S - GAP_FROM_S


# 30 s and 60 s buckets: cells partly inside the gap; 300 s: the whole gap inside one cell
@pytest.mark.parametrize("bucket_s", [0.0, 1.0, 2.0, None, 30.0, 60.0, 300.0])
def test_a_gap_is_unsampled_not_idle_and_its_energy_is_the_counters(con, bucket_s):
    pb = phase_breakdown(con, WINDOW, bucket_s=bucket_s)
    g0, g1 = _row(pb.per_gpu, 0), _row(pb.per_gpu, 1)
    assert g0["unsampled_s"] == pytest.approx(GAP_S)
    assert g0["interval_s"] == pytest.approx(300.0)  # the gap is in the GPU's time, as unsampled
    sampled_s = 300.0 - GAP_S
    busy_s = 15.0 - GAP_DECODE_S
    # idle: the sampled time without work (the work inside the gap is not known: not counted), also
    # on buckets wider than the gap threshold, whose edge cells are partly inside the gap
    assert g0["idle_s"] == pytest.approx(sampled_s - busy_s, abs=1e-6)
    assert g0["decode_s"] == pytest.approx(busy_s, abs=1e-6)
    assert g0["gap_s"] == pytest.approx(0.0, abs=1e-9)  # in flight only while decoding
    assert sum(g0[f"frac_{s[:-2]}"] for s in STATES) == pytest.approx(1.0)
    assert g0["frac_unsampled"] == pytest.approx(GAP_S / 300.0)
    # attributed energy: the counter's rise over the window, the gap's part to unsampled
    counter = _counter_mj([START_S, END_S])
    delta_j = (counter[1] - counter[0]) / 1000.0
    assert sum(g0[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(delta_j, rel=0.01)
    assert g0["energy_j"] == pytest.approx(delta_j, rel=1e-9)
    gap_j = (_counter_mj([GAP_TO_S])[0] - _counter_mj([GAP_FROM_S])[0]) / 1000.0
    assert g0["energy_unsampled_j"] == pytest.approx(gap_j, rel=1e-9)
    # GPU 1 (no gap) as before
    assert g1["unsampled_s"] == 0.0 and g1["energy_unsampled_j"] == 0.0
    if bucket_s in (0.0, 1.0):
        for col, before in GPU1_BEFORE.items():
            assert g1[col] == pytest.approx(before, rel=1e-9), col
    # the gap figures, from the same rows
    gap = pb.gaps[KEY0]
    assert (
        gap["gaps"] == 1 and gap["gap_s"] == pytest.approx(GAP_S) and gap["longest_s"] == pytest.approx(GAP_S)
    )
    period_s = (END_S - START_S) / (len(GAPPED_S) - 1)  # GPU 0's mean sampling period in the window
    assert gap["threshold_s"] == pytest.approx(max(GAP_MIN_S, GAP_PERIODS * period_s))
    assert KEY1 not in pb.gaps
    assert any(m.startswith(KEY0) and "not sampled for 60.0 s" in m and "not idle" in m for m in pb.missing)
    assert pb.to_dict()["sample_gaps"][KEY0]["gap_s"] == pytest.approx(GAP_S)


def test_a_gpu_without_gaps_is_unchanged_by_another_ones_gap(con, tmp_path):
    # GPU 1 alone, and beside GPU 0 with its gap: the same figures
    alone = gap_store(tmp_path / "alone.duckdb", gpus=(1,))
    both = _row(phase_breakdown(con, WINDOW, bucket_s=2.0).per_gpu, 1)
    one = _row(phase_breakdown(alone, WINDOW, bucket_s=2.0).per_gpu, 1)
    for col in ("interval_s", "idle_s", "decode_s", "gap_s", "energy_j", "energy_idle_j", "energy_decode_j"):
        assert both[col] == pytest.approx(one[col], rel=1e-12), col
    alone.close()


@pytest.mark.parametrize("rows", ["intervals", "buckets"])
def test_the_gap_rows_carry_the_unsampled_seconds_and_energy(con, rows):
    df = gpu_intervals(con, WINDOW) if rows == "intervals" else gpu_buckets(con, WINDOW, 1.0)
    g0 = df[df["index"] == 0]
    gap = g0[g0["unsampled_s"] > 0]
    assert len(gap) == 1
    r = gap.iloc[0]
    assert (
        (r["t0_s"], r["t1_s"]) == (GAP_FROM_S, GAP_TO_S) if rows == "intervals" else r["t0_s"] == GAP_FROM_S
    )
    assert r["unsampled_s"] == pytest.approx(GAP_S) and r["sample_gaps"] == 1
    # the sampled rest of the row holds its known work and idle time
    assert r["decode_s"] + r["gap_s"] + r["idle_s"] == pytest.approx(r["interval_s"] - GAP_S)
    # the bucket before the gap ends at its last sample: no gap cell absorbed into its idle time
    if rows == "buckets":
        before = g0[g0["t1_s"] == GAP_FROM_S]
        assert len(before) == 1 and before.iloc[0]["unsampled_s"] == 0.0
    # every row's states sum to its time
    assert (g0[list(STATES)].sum(axis=1) - g0["interval_s"]).abs().max() < 1e-9
    assert df[df["index"] == 1]["unsampled_s"].sum() == 0.0


def test_idle_split_and_cost_show_unsampled_time_apart_from_idle(con):
    pb = phase_breakdown(con, WINDOW, bucket_s=1.0)
    sp = idle_split(con, WINDOW, breakdown=pb)
    s0 = _row(sp.per_gpu, 0)
    assert s0["unsampled_s"] == pytest.approx(GAP_S)
    assert s0["idle_s"] == pytest.approx(300.0 - GAP_S - (15.0 - GAP_DECODE_S))
    assert sum(s0[f"frac_{c}"] for c in CATEGORIES) == pytest.approx(1.0)
    assert sum(s0[f"energy_{c}_j"] for c in CATEGORIES) == pytest.approx(s0["energy_j"], rel=1e-9)
    cost = cost_breakdown(con, WINDOW, PRICES, breakdown=pb)
    by_gpu = cost.by_gpu.set_index("gpu")
    c0, c1 = by_gpu.loc["GPU-a"], by_gpu.loc["GPU-b"]
    assert c0["unsampled_s"] == pytest.approx(GAP_S) and c1["unsampled_s"] == 0.0
    # idle $: the idle seconds only (GPU 0 idled 60 s less than GPU 1 by the figures, not 0 s)
    assert c0["idle_s"] == pytest.approx(s0["idle_s"])
    usd_per_j = PRICES.pue * PRICES.electricity_usd_per_kwh / 3.6e6
    assert c0["cost_usd_idle"] == pytest.approx(3.6 * c0["idle_s"] / 3600 + c0["energy_j_idle"] * usd_per_j)
    assert c0["cost_usd_unsampled"] == pytest.approx(
        3.6 * GAP_S / 3600 + c0["energy_j_unsampled"] * usd_per_j
    )
    assert c1["idle_s"] - c0["idle_s"] == pytest.approx(GAP_S - GAP_DECODE_S)
    assert c0["gpu_seconds"] == pytest.approx(300.0)  # the gap is still paid for
    total = cost.headline()
    parts = ("prefill", "stranded", "host_bound", "idle", "unsampled")
    assert sum(total[f"input_cost_usd_{k}"] for k in parts) == pytest.approx(total["input_cost_usd"])
    assert any("unsampled (no samples)" in n for n in cost.trust.notes), cost.trust.notes


def test_analyze_shows_unsampled_time_per_gpu_and_overall(con):
    summary = summarize(con, WINDOW, skip=frozenset({"bimodal"})).to_dict()
    assert summary["parts"]["phases"]["sample_gaps"][KEY0]["gap_s"] == pytest.approx(GAP_S)
    (pool,) = summary["parts"]["idle"]["per_pool"]
    assert pool["unsampled_s"] == pytest.approx(GAP_S) and pool["frac_unsampled"] == pytest.approx(
        GAP_S / 600
    )
    text = format_summary(summary)
    lines = text.splitlines()
    title = lines.index("Unsampled time (gaps in a GPU's samples: its own state, not idle)")
    assert lines[title + 2].split()[:4] == ["0", "60.0", "1", "60.0"]  # one node: GPU 0 by its index
    assert "overall: 60.0 s of 600.0 GPU-s unsampled (10.0 %)" in text
    header = next(line for line in text.splitlines() if line.strip().startswith("pool   GPUs"))
    assert header.split()[-3:] == ["unsampled", "energy", "kWh"]


@pytest.mark.parametrize("bucket_s", [0.0, 1.0, 60.0])
def test_without_a_counter_the_gaps_energy_is_integrated_power_flagged_estimated(tmp_path, bucket_s):
    rows = [{**r, **_gpu(0)} for r in samples(GAPPED_S, [None] * len(GAPPED_S), power_w=200.0)]
    c = make_store(tmp_path / "nocounter.duckdb", {"gpu_samples": rows})
    pb = phase_breakdown(c, WINDOW, bucket_s=bucket_s)
    g = pb.per_gpu.iloc[0]
    assert g["unsampled_s"] == pytest.approx(GAP_S)
    assert g["energy_unsampled_j"] == pytest.approx(200.0 * GAP_S)  # (P before + P after) / 2 × gap
    assert g["energy_j"] == pytest.approx(200.0 * 300.0)
    assert sum(g[f"energy_{s[:-2]}_j"] for s in STATES) == pytest.approx(g["energy_j"])
    assert "estimated" in pb.trust.labels
    c.close()
