"""Downsampled samples and phase bands of the GPUs page, on hand-made rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard.timeline import bands_from_samples, downsample, iterations_of_gpu, phase_bands


def _iters(
    *rows: tuple[float, float, str], node: str = "n", worker: str = "w0", uuid: str = "G0"
) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"node": node, "worker": worker, "gpu_uuid": uuid, "start_s": s, "end_s": e, "phase": p}
            for s, e, p in rows
        ]
    )


def test_phase_bands_follow_the_dominant_phase_and_merge_neighbours():
    # 0-10 s in 10 slices: prefill fills 0-2 s, decode 4-7 s (and a bit of prefill at 5 s), idle elsewhere
    it = _iters((0.0, 2.0, "prefill"), (4.0, 5.0, "decode"), (5.0, 5.2, "prefill"), (5.2, 7.0, "decode"))
    bands = phase_bands(it, 0.0, 10.0, slices=10)
    assert [(b.start_s, b.end_s, b.phase) for b in bands] == [
        (0.0, 2.0, "prefill"),
        (2.0, 4.0, "idle"),
        (4.0, 7.0, "decode"),
        (7.0, 10.0, "idle"),
    ]


def test_a_long_iteration_spreads_over_the_slices_it_covers():
    bands = phase_bands(_iters((1.0, 9.0, "decode")), 0.0, 10.0, slices=10)
    assert [b.phase for b in bands] == ["idle", "decode", "idle"]
    assert (bands[1].start_s, bands[1].end_s) == (1.0, 9.0)


def test_a_sliver_of_work_is_idle():
    bands = phase_bands(_iters((0.0, 0.04, "decode")), 0.0, 10.0, slices=10)  # 4 % of the first second
    assert [b.phase for b in bands] == ["idle"]


def test_downsample_averages_per_bucket_and_keeps_the_power_limit_maximum():
    samples = pd.DataFrame(
        {
            "ts_s": [0.1, 0.2, 0.3, 5.5],
            "sm_active_pct": [10.0, 20.0, 30.0, 90.0],
            "gpu_util_pct": [100.0, 100.0, 100.0, 100.0],
            "power_w": [100.0, 200.0, 300.0, 650.0],
            "sm_clock_mhz": [1980, 1980, 1980, 1755],
            "power_limit_w": [700.0, 700.0, 650.0, 650.0],
        }
    )
    out = downsample(samples, 0.0, 10.0, points=10)
    assert list(out["n"]) == [3, 1]
    assert out["sm_active_pct"].tolist() == [20.0, 90.0] and out["power_w"].tolist() == [200.0, 650.0]
    assert out["power_limit_w"].tolist() == [700.0, 650.0]
    assert out["time_s"].tolist() == [pytest.approx(0.5), 5.5]  # bucket middle; a lone sample its own time


def test_downsample_breaks_the_line_where_nothing_was_sampled():
    # sampled every 0.5 s, then not for 60 s (the collector was stopped), then again
    ts = [*np.arange(0.0, 30.0, 0.5), *np.arange(90.0, 120.0, 0.5)]
    samples = pd.DataFrame({"ts_s": ts, "power_w": 75.0})
    out = downsample(samples, 0.0, 120.0, points=120, break_gaps=True)
    hole = out[out["n"] == 0]
    assert len(hole) == 1 and 30.0 < hole["time_s"].iloc[0] < 90.0 and hole["power_w"].isna().all()
    assert out["time_s"].is_monotonic_increasing and int(out["n"].sum()) == len(ts)
    # a source sampled every 30 s (dcgm-exporter's refresh) is sparse, not broken
    sparse = pd.DataFrame({"ts_s": np.arange(0.0, 3600.0, 30.0), "power_w": 75.0})
    assert (downsample(sparse, 0.0, 3600.0, break_gaps=True)["n"] > 0).all()


def test_iterations_of_a_gpu_by_uuid_else_by_its_workers():
    it = pd.concat([_iters((0, 1, "decode"), uuid="G0"), _iters((0, 1, "prefill"), worker="w1", uuid="G2")])
    assert iterations_of_gpu(it, "G0", "n", {"w0"})["phase"].tolist() == ["decode"]
    # a tensor-parallel peer of G2 (no iteration names it): its worker's iterations
    assert iterations_of_gpu(it, "G3", "n", {"w1"})["phase"].tolist() == ["prefill"]
    assert iterations_of_gpu(it, "G0", "other-node", {"w0"}).empty


def test_bands_from_samples_mark_busy_slices_with_the_gpus_pool():
    samples = pd.DataFrame({"ts_s": [0.5, 1.5, 2.5, 3.5], "gpu_util_pct": [0.0, 80.0, 90.0, 1.0]})
    bands = bands_from_samples(samples, "decode", 0.0, 4.0, slices=4)
    assert [(b.start_s, b.end_s, b.phase) for b in bands] == [
        (0.0, 1.0, "idle"),
        (1.0, 3.0, "decode"),
        (3.0, 4.0, "idle"),
    ]
    assert {b.phase for b in bands_from_samples(samples, None, 0.0, 4.0, slices=4)} == {"idle", "mixed"}
