"""Per-GPU timelines for the GPUs page: samples averaged into a few hundred buckets, and the
engine's phases (prefill / decode / mixed / idle) as bands over time. Plain pandas/numpy, no
Streamlit, so that the numbers can be checked on their own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

SAMPLE_COLUMNS = ("sm_active_pct", "gpu_util_pct", "power_w", "sm_clock_mhz")
IDLE_BELOW = 0.05  # a slice where the GPU ran iterations less than this share of the time is idle
PHASES = ("prefill", "decode", "mixed")
IDLE = "idle"


@dataclass(frozen=True, slots=True)
class Band:
    """``[start_s, end_s)`` in which the GPU was mostly in ``phase`` (or idle)."""

    start_s: float
    end_s: float
    phase: str


def downsample(
    samples: pd.DataFrame, start_s: float, end_s: float, points: int = 600, *, break_gaps: bool = False
) -> pd.DataFrame:
    """One GPU's samples averaged per bucket of ``(end_s - start_s) / points`` (the power limit: its
    maximum); a bucket holding no sample is left out. Columns: ``time_s`` (bucket middle) and
    :data:`SAMPLE_COLUMNS` + ``power_limit_w``, ``n`` (samples averaged).

    ``break_gaps``: where no sample came for longer than three buckets and three sampling periods
    (the median spacing of the samples), e.g. while the collector was stopped, a row of NaN values
    (``n`` 0) in the middle of the hole, so that a line chart breaks there instead of drawing a
    straight line across time nothing was sampled."""
    cols = [c for c in (*SAMPLE_COLUMNS, "power_limit_w") if c in samples]
    if samples.empty:
        return pd.DataFrame(columns=["time_s", *cols, "n"])
    width = max((end_s - start_s) / points, 1e-6)
    ts = samples["ts_s"].to_numpy(dtype=float)
    bucket = np.floor((ts - start_s) / width).astype(np.int64)
    frame = samples[cols].apply(pd.to_numeric, errors="coerce").assign(_b=bucket)
    agg = {c: "mean" for c in cols if c != "power_limit_w"}
    if "power_limit_w" in cols:
        agg["power_limit_w"] = "max"
    out = frame.groupby("_b").agg(agg)
    out["n"] = frame.groupby("_b").size()
    # a bucket of one sample keeps the sample's own time; a fuller one its middle
    first_ts = pd.Series(ts).groupby(bucket).first()
    middle = start_s + (out.index.to_numpy(dtype=float) + 0.5) * width
    out.insert(
        0, "time_s", np.where(out["n"].to_numpy() == 1, first_ts.reindex(out.index).to_numpy(), middle)
    )
    out = out.reset_index(drop=True)
    if break_gaps and len(out) > 1:
        period = float(np.median(np.diff(np.sort(ts))))
        times = out["time_s"].to_numpy(dtype=float)
        holes = np.flatnonzero(np.diff(times) > 3 * max(width, period))
        if holes.size:
            gaps = pd.DataFrame({"time_s": (times[holes] + times[holes + 1]) / 2, "n": 0})
            out = pd.concat([out, gaps], ignore_index=True).sort_values("time_s", kind="stable")
            out = out.reset_index(drop=True)
    return out


def phase_bands(iterations: pd.DataFrame, start_s: float, end_s: float, slices: int = 240) -> list[Band]:
    """One GPU's iterations as phase bands: the window cut in ``slices`` slices, each coloured by
    the phase that took most of its busy time, or idle when iterations ran less than
    :data:`IDLE_BELOW` of it; neighbours of the same phase merged."""
    if end_s <= start_s:
        return []
    width = (end_s - start_s) / slices
    busy = np.zeros((len(PHASES), slices))
    if not iterations.empty:
        s = np.clip(iterations["start_s"].to_numpy(dtype=float), start_s, end_s)
        e = np.clip(iterations["end_s"].to_numpy(dtype=float), start_s, end_s)
        phase = iterations["phase"].astype(str).to_numpy()
        for k, name in enumerate(PHASES):
            mask = phase == name
            if mask.any():
                _spread(busy[k], s[mask], e[mask], start_s, width)
    share = busy.sum(axis=0) / width
    dominant = np.array(PHASES)[busy.argmax(axis=0)]
    labels = np.where(share < IDLE_BELOW, IDLE, dominant)
    return _bands_of(labels, start_s, width)


def _spread(out: np.ndarray, s: np.ndarray, e: np.ndarray, origin_s: float, width: float) -> None:
    """Add each interval ``[s, e)``'s time to the slices it overlaps (an interval longer than a
    slice spreads over several)."""
    n = len(out)
    first = np.minimum(np.floor((s - origin_s) / width).astype(np.int64), n - 1)
    last = np.minimum(np.floor((e - origin_s) / width).astype(np.int64), n - 1)
    same = first == last
    np.add.at(out, first[same], e[same] - s[same])
    for a, b, i0, i1 in zip(s[~same], e[~same], first[~same], last[~same], strict=True):
        edges = origin_s + np.arange(i0, i1 + 2) * width
        lo = np.maximum(edges[:-1], a)
        hi = np.minimum(edges[1:], b)
        out[i0 : i1 + 1] += np.maximum(hi - lo, 0.0)


def iterations_of_gpu(
    iterations: pd.DataFrame, uuid: str | None, node: str, workers: set[str]
) -> pd.DataFrame:
    """The iterations that ran on one GPU: those naming its UUID; when none do (a tensor-parallel
    GPU other than the worker's first, or rows from before ``gpu_uuid``), those of the workers that
    owned it in the window."""
    if iterations.empty:
        return iterations
    on_node = iterations[iterations["node"] == node]
    if uuid and "gpu_uuid" in on_node:
        mine = on_node[on_node["gpu_uuid"] == uuid]
        if not mine.empty:
            return mine
    return on_node[on_node["worker"].isin(workers)]


def bands_from_samples(
    samples: pd.DataFrame, role: str | None, start_s: float, end_s: float, slices: int = 240
) -> list[Band]:
    """Phase bands of a window too long to read every iteration: busy where the GPU's mean
    utilization in the slice is at least :data:`IDLE_BELOW`, coloured by the GPU's role (a
    prefill or decode pool; mixed otherwise), idle elsewhere."""
    if end_s <= start_s or samples.empty:
        return []
    width = (end_s - start_s) / slices
    col = (
        "gpu_util_pct"
        if "gpu_util_pct" in samples and samples["gpu_util_pct"].notna().any()
        else "sm_active_pct"
    )
    ts = samples["ts_s"].to_numpy(dtype=float)
    idx = np.clip(np.floor((ts - start_s) / width).astype(np.int64), 0, slices - 1)
    util = pd.to_numeric(samples[col], errors="coerce").fillna(0.0).to_numpy() / 100.0
    total = np.bincount(idx, weights=util, minlength=slices)
    count = np.bincount(idx, minlength=slices)
    mean = np.divide(total, count, out=np.zeros(slices), where=count > 0)
    busy_phase = role if role in ("prefill", "decode") else "mixed"
    labels = np.where((count > 0) & (mean >= IDLE_BELOW), busy_phase, IDLE)
    return _bands_of(labels, start_s, width)


def _bands_of(labels: np.ndarray, start_s: float, width: float) -> list[Band]:
    """One band per run of equal labels over slices of ``width`` seconds from ``start_s``."""
    bands: list[Band] = []
    run_start = 0
    slices = len(labels)
    for i in range(1, slices + 1):
        if i == slices or labels[i] != labels[run_start]:
            bands.append(Band(start_s + run_start * width, start_s + i * width, str(labels[run_start])))
            run_start = i
    return bands
