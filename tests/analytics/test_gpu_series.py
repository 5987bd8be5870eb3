"""GPU metrics bucketed in the store (analytics/gpu_series.py) on a real store of the synthetic 64-GPU
fleet (100 ms samples): bounded values per metric, bucket means equal to the raw samples' own means,
the same figures once older samples are folded into the 10 s rollup, and bad input named."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analytics.gpu_series import BUCKET_STEPS_S, SERIES_METRICS, bucket_s_for, gpu_series
from analytics.window import AnalyticsError, Window
from collector.store import Store
from collector.store.retention import rollup
from collector.store.synthetic import GPUS, PERIOD_S, T0, build

SPAN_S = 60.0
WINDOW = Window(T0, T0 + SPAN_S, "live")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Store]:
    """The fleet's first minute twice: raw, and with its first 30 s folded into the 10 s rollup."""
    out = {}
    for name in ("raw", "rolled"):
        path = tmp_path_factory.mktemp(name) / "s.duckdb"
        build(path, samples=GPUS * round(SPAN_S / PERIOD_S), requests=200)
        out[name] = Store.open(path)
    done = rollup(out["rolled"], 0.0, now_s=T0 + 30.0)
    assert done.buckets_written == GPUS * 3 and done.raw_rows_deleted > GPUS * 290
    yield out
    for store in out.values():
        store.close()


def _nan(rows: list[list[float | None]]) -> np.ndarray:
    return np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=float)


def _buckets(bucket_s: float) -> int:
    """Buckets of ``bucket_s`` aligned to epoch multiples that WINDOW touches."""
    return int(WINDOW.end_s // bucket_s - WINDOW.start_s // bucket_s) + (WINDOW.end_s % bucket_s > 0)


def _raw(store: Store) -> pd.DataFrame:
    return store.query(f"SELECT * FROM gpu_samples WHERE ts_s >= {WINDOW.start_s} AND ts_s < {WINDOW.end_s}")


@pytest.mark.parametrize("max_points", [100, 640, 6_000, 50_000])
def test_values_per_metric_are_bounded_by_max_points(stores, max_points):
    with stores["raw"].reader() as con:
        s = gpu_series(con, WINDOW, max_points=max_points)
    assert len(s.gpus) == GPUS
    assert s.points_per_metric <= max_points
    assert all(
        len(rows) == GPUS and all(len(r) == len(s.times_s) for r in rows) for rows in s.series.values()
    )
    raw = _raw(stores["raw"])
    first, last = raw["ts_s"].min(), raw["ts_s"].max()
    narrower = [b for b in BUCKET_STEPS_S if b < s.bucket_s]
    if narrower:  # the narrowest bucket that fits the samples' span: the next narrower one would not
        assert bucket_s_for(first, last + 1e-3, GPUS, max_points) == s.bucket_s
        assert _buckets(narrower[-1]) * GPUS > max_points
    # the buckets cover the samples, from the first to the last
    assert s.times_s[0] <= first < s.times_s[0] + s.bucket_s
    assert s.times_s[-1] <= last < s.times_s[-1] + s.bucket_s


def test_max_buckets_caps_the_time_buckets_per_gpu(stores):
    with stores["raw"].reader() as con:
        s = gpu_series(con, WINDOW, max_points=200_000, max_buckets=20)
        assert s.bucket_s == 5.0 and len(s.times_s) == 12  # 2 s buckets would be 30 > 20
        assert (
            gpu_series(con, WINDOW, max_points=200_000).bucket_s == 0.1
        )  # uncapped: the samples' own period
        with pytest.raises(
            AnalyticsError, match=r"max_buckets must be a whole number in \[10, 200000\]"
        ) as e:
            gpu_series(con, WINDOW, max_buckets=5)
        assert e.value.param == "max_buckets"


def test_bucket_means_equal_the_raw_samples_means(stores):
    with stores["raw"].reader() as con:
        s = gpu_series(con, WINDOW, max_points=2_000)  # 64 GPUs x 30 buckets of 2 s
    assert s.bucket_s == 2.0 and len(s.times_s) == 30
    raw = _raw(stores["raw"])
    raw["b"] = (np.round(raw["ts_s"] * 1000).astype(np.int64) // 2000) * 2.0
    key = raw["node"] + "|" + raw["source"] + "|" + raw["device"] + "|" + raw["index"].astype(str)
    expected = raw.assign(key=key).groupby(["key", "b"])
    col = {t: i for i, t in enumerate(s.times_s)}
    for gi, gpu in enumerate(s.gpus[:: GPUS // 8]):  # eight of them, every pool
        row = s.gpus.index(gpu)
        for metric in ("sm_active_pct", "dram_active_pct", "power_w", "mem_used_bytes", "sm_clock_mhz"):
            want = expected[metric].mean().loc[gpu["key"]]
            got = [s.series[metric][row][col[b]] for b in want.index]
            assert got == pytest.approx(want.to_numpy(), abs=1e-3, rel=1e-9), (gi, metric)
            mean = raw.loc[key == gpu["key"], metric].mean()
            assert s.means[metric][row] == pytest.approx(mean, rel=1e-9)
        assert sum(s.samples[row]) == (key == gpu["key"]).sum() > 0.99 * SPAN_S / PERIOD_S
    assert {g["role"] for g in s.gpus} == {"prefill", "decode", "mixed"}
    assert [g["role"] for g in s.gpus][:16] == ["prefill"] * 16  # ordered by pool, then worker
    assert s.gpus[0]["worker"] == "worker-32" and s.gpus[1]["worker"] == "worker-33"
    assert s.sources == ["gpu_samples"] and s.trust.to_dict()["labels"] == ["emulated"]


def test_samples_folded_into_the_rollup_give_the_same_figures(stores):
    with stores["raw"].reader() as con:
        raw = gpu_series(con, WINDOW, max_points=400)  # 64 x 6 buckets of 10 s
    with stores["rolled"].reader() as con:
        rolled = gpu_series(con, WINDOW, max_points=400)
    assert raw.bucket_s == rolled.bucket_s == 10.0
    assert rolled.sources == ["gpu_samples", "gpu_samples_10s"] and raw.sources == ["gpu_samples"]
    assert [g["key"] for g in rolled.gpus] == [g["key"] for g in raw.gpus]
    for metric in ("sm_active_pct", "tensor_active_pct", "power_w", "temperature_c", "power_limit_w"):
        assert np.allclose(
            _nan(rolled.series[metric]), _nan(raw.series[metric]), atol=2e-3, equal_nan=True
        ), metric
        assert np.allclose(rolled.means[metric], raw.means[metric], rtol=1e-9), metric
    assert rolled.samples == raw.samples
    # a window wholly in the rolled-up part is read from the rollup alone
    with stores["rolled"].reader() as con:
        old = gpu_series(con, Window(T0, T0 + 30.0, "live"), max_points=400)
    assert old.sources == ["gpu_samples_10s"] and len(old.gpus) == GPUS


def test_an_empty_window_and_bad_input_are_named(stores):
    with stores["raw"].reader() as con:
        empty = gpu_series(con, Window(T0 - 600.0, T0 - 300.0, "live"))
        assert empty.gpus == [] and empty.missing == ["no GPU samples in the window"]
        assert set(empty.to_dict()["series"]) == set(SERIES_METRICS)
        for bad in (99, "many", 10**9):
            with pytest.raises(
                AnalyticsError, match=r"max_points must be a whole number in \[100, 200000\]"
            ) as e:
                gpu_series(con, WINDOW, max_points=bad)  # type: ignore[arg-type]
            assert e.value.param == "max_points"
    assert bucket_s_for(0.0, 400 * 86_400.0, 64, 6_000) >= 86_400.0 * 4  # past the steps: whole days
    assert math.ceil(400 / (bucket_s_for(0.0, 400 * 86_400.0, 64, 6_000) / 86_400.0)) * 64 <= 6_000
