"""Fleet charts of GPU metrics, the data side: which panels, TP groups and their colours, axis
ranges, from the JSON of ``GET /api/v1/analytics/gpu-series`` (per-GPU means per time bucket,
computed in the store). The charts themselves are SVG (:mod:`dashboard.figures.gpu_svg`).

Few GPUs (up to :data:`HEATMAP_ABOVE_GPUS`) are drawn as lines, one per tensor-parallel group (the
GPUs of one worker: a replica), the group's mean, so that a TP group is shown once; past that, a
GPU x time heatmap, its rows grouped by worker (the group labelled once, a rule between groups).
Lines take their pool's phase colour (:data:`PHASE_COLOURS`), a shade per group. Power carries its
limit as a step line within the axis (over the heatmap, a strip of its own above it). Axes are
fitted to the data: the time axis spans the buckets that hold samples, value axes the values.
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dashboard.figures.palette import NEUTRAL, PHASE_COLOURS, SIGNAL_COLOURS

HEATMAP_ABOVE_GPUS = 16
UNKNOWN_POOL_COLOUR = SIGNAL_COLOURS["pool_unknown"]
GIB = 1024.0**3
LIMIT_COLOUR = NEUTRAL["limit"]


@dataclass(frozen=True, slots=True)
class Panel:
    """One chart: ``metric`` of the series, its title, unit, the factor from the stored unit, and
    whether its axis starts at zero (activity, power) or fits the values' range (clock, temperature)."""

    metric: str
    title: str
    unit: str
    scale: float = 1.0
    from_zero: bool = True
    decimals: int = 1


PANELS: tuple[Panel, ...] = (
    Panel("sm_active_pct", "SM activity", "%"),
    Panel("tensor_active_pct", "Tensor core activity", "%"),
    Panel("dram_active_pct", "DRAM activity (memory bandwidth)", "%"),
    Panel("gpu_util_pct", "Utilization (a kernel running)", "%"),
    Panel("mem_used_bytes", "Memory used", "GiB", 1.0 / GIB, decimals=2),
    Panel("temperature_c", "Temperature", "°C", from_zero=False),
    Panel("sm_clock_mhz", "SM clock", "MHz", from_zero=False, decimals=0),
    Panel("power_w", "Power (dashed: the power limit)", "W", decimals=0),
)


@dataclass(frozen=True, slots=True)
class Group:
    """A tensor-parallel group: the GPUs (rows of the series) of one worker on one node; a GPU
    without a worker is a group of its own."""

    key: str
    label: str
    role: str | None
    rows: tuple[int, ...]
    colour: str
    short: str  # worker and pool: a heatmap's row label


def _gpu_range(indexes: Sequence[Any]) -> str:
    idx = sorted(int(i) for i in indexes if i is not None)
    if not idx:
        return ""
    if len(idx) == 1:
        return f"GPU {idx[0]}"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"GPUs {idx[0]}–{idx[-1]}"
    return "GPUs " + ", ".join(str(i) for i in idx)


def _shade(hex_colour: str, k: int, n: int) -> str:
    """The ``k``-th of ``n`` shades of a colour (darker to lighter), so that groups of one pool
    share its hue and stay apart."""
    r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    h, lightness, s = colorsys.rgb_to_hls(r, g, b)
    lightness = 0.30 + 0.42 * k / (n - 1) if n > 1 else min(lightness, 0.55)
    r, g, b = colorsys.hls_to_rgb(h, lightness, max(s, 0.45))
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def tp_groups(gpus: Sequence[Mapping[str, Any]], *, with_node: bool = False) -> list[Group]:
    """The series' GPUs as TP groups (same node and worker), in the series' order (pools, then
    workers), each labelled once: ``worker-3 · decode · GPUs 0–3 (TP 4)``."""
    order: list[tuple[str, str]] = []
    members: dict[tuple[str, str], list[int]] = {}
    for i, g in enumerate(gpus):
        key = (str(g.get("node")), str(g.get("worker")) if g.get("worker") else f"#gpu{g.get('key')}")
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(i)
    per_role: dict[str | None, list[tuple[str, str]]] = {}
    for key in order:
        per_role.setdefault(gpus[members[key][0]].get("role"), []).append(key)
    groups = []
    for key in order:
        rows = members[key]
        first = gpus[rows[0]]
        role = first.get("role")
        parts = [str(first.get("node"))] if with_node else []
        if first.get("worker"):
            parts.append(str(first["worker"]))
        if role:
            parts.append(str(role))
        parts.append(_gpu_range([gpus[r].get("index") for r in rows]) or str(first.get("device")))
        label = " · ".join(parts) + (f" (TP {len(rows)})" if len(rows) > 1 else "")
        base = PHASE_COLOURS.get(str(role), UNKNOWN_POOL_COLOUR) if role else UNKNOWN_POOL_COLOUR
        peers = per_role[role]
        colour = _shade(base, peers.index(key), len(peers))
        short = " · ".join(p for p in (first.get("worker"), role) if p) or label
        groups.append(Group("/".join(key), label, role, tuple(rows), colour, str(short)))
    return groups


def matrix(series: Mapping[str, Any], metric: str, rows: Sequence[int]) -> np.ndarray:
    """The values of ``metric`` for the series' GPUs ``rows`` (in that order), one column per
    bucket, NaN where a bucket has none."""
    values = series.get("series", {}).get(metric) or []
    out = np.full((len(rows), len(series.get("times_s") or [])), np.nan)
    for k, r in enumerate(rows):
        if r < len(values):
            out[k] = np.asarray([np.nan if v is None else v for v in values[r]], dtype=float)
    return out


def data_span(series: Mapping[str, Any]) -> slice:
    """The buckets from the first to the last that hold a sample (the time axis fitted to the data)."""
    samples = np.asarray(series.get("samples") or [[]], dtype=float)
    if samples.size == 0:
        return slice(0, 0)
    have = np.flatnonzero(np.nansum(samples, axis=0) > 0)
    return slice(int(have[0]), int(have[-1]) + 1) if have.size else slice(0, 0)


def fit_range(values: np.ndarray, from_zero: bool, limit: float | None = None) -> list[float] | None:
    """An axis range fitted to the finite ``values`` (and ``limit``), a little padding around them;
    from zero for quantities that start there. None without any value."""
    finite = values[np.isfinite(values)]
    if limit is not None and math.isfinite(limit):
        finite = np.append(finite, limit)
    if finite.size == 0:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    pad = max((hi - lo) * 0.06, abs(hi) * 0.02, 1e-9)
    return [0.0 if from_zero and lo >= 0 else lo - pad, hi + pad]


def use_heatmap(series: Mapping[str, Any]) -> bool:
    """A heatmap past :data:`HEATMAP_ABOVE_GPUS` GPUs, lines below."""
    return len(series.get("gpus") or []) > HEATMAP_ABOVE_GPUS


def legend_html(groups: Sequence[Group]) -> str:
    """The groups' colours as one HTML legend (the charts' lines share it)."""
    items = "".join(
        f"<span data-group='{g.key}' style='white-space:nowrap;margin-right:14px'>"
        f"<span style='display:inline-block;width:14px;height:3px;background:{g.colour};vertical-align:middle;"
        f"margin-right:5px'></span>{g.label}</span> "
        for g in groups
    )
    return f"<div class='pl-gpu-legend' style='font-size:13px;line-height:1.9'>{items}</div>"


def group_rows(series: Mapping[str, Any], groups: Sequence[Group]) -> pd.DataFrame:
    """One row per TP group: its GPUs and the window's means of each metric (means of its GPUs')."""
    means = series.get("means") or {}
    out = []
    for g in groups:
        row: dict[str, Any] = {"group": g.label, "pool": g.role or "—", "GPUs": len(g.rows)}
        for p in PANELS:
            vals = [means.get(p.metric, [])[r] for r in g.rows if r < len(means.get(p.metric, []))]
            vals = [float(v) for v in vals if v is not None]
            row[p.metric] = float(np.mean(vals)) * p.scale if vals else math.nan
        lims = [means.get("power_limit_w", [])[r] for r in g.rows if r < len(means.get("power_limit_w", []))]
        lims = [float(v) for v in lims if v is not None]
        row["power_limit_w"] = max(lims) if lims else math.nan
        out.append(row)
    return pd.DataFrame(out)
