"""The GPUs page's panels (dashboard/figures/gpus.py, gpu_svg.py) from series shaped as the service
answers them: TP groups once, lines or a heatmap by GPU count, the power limit inside its axis, axes
fitted to the data, gaps left as gaps."""

from __future__ import annotations

import re

import pytest

from dashboard.figures.gpu_svg import nice_ticks, panel_svg, panels_html, time_ticks
from dashboard.figures.gpus import HEATMAP_ABOVE_GPUS, PANELS, group_rows, tp_groups

T0 = 1_796_000_000.0
POWER = next(p for p in PANELS if p.metric == "power_w")
CLOCK = next(p for p in PANELS if p.metric == "sm_clock_mhz")


def _series(gpus: int, tp: int, buckets: int = 10, *, gap_at: int | None = None) -> dict:
    """``gpus`` GPUs in workers of ``tp`` (first half prefill, second decode), power rising per bucket."""
    workers = gpus // tp
    meta = [
        {
            "key": f"n|s|d|{i}",
            "node": "n",
            "source": "s",
            "device": "d",
            "index": i,
            "worker": f"worker-{i // tp}",
            "role": "prefill" if i // tp < workers / 2 else "decode",
        }
        for i in range(gpus)
    ]
    power = [[100.0 + 10 * b + i for b in range(buckets)] for i in range(gpus)]
    if gap_at is not None:
        for row in power:
            row[gap_at] = None
    series = {m: [[50.0] * buckets for _ in range(gpus)] for m in (p.metric for p in PANELS)}
    series["power_w"] = power
    series["power_limit_w"] = [[700.0] * buckets for _ in range(gpus)]
    series["sm_clock_mhz"] = [[1200.0 + 50 * (b % 3) for b in range(buckets)] for _ in range(gpus)]
    samples = [[10.0] * buckets for _ in range(gpus)]
    if gap_at is not None:
        for row in samples:
            row[gap_at] = 0.0
    means = {m: [50.0] * gpus for m in series} | {"power_limit_w": [700.0] * gpus}
    return {
        "bucket_s": 1.0,
        "max_points": 6000,
        "times_s": [T0 + b for b in range(buckets)],
        "gpus": meta,
        "series": series,
        "samples": samples,
        "means": means,
    }


def test_tp_groups_are_labelled_once_in_pool_colours():
    s = _series(8, 2)
    groups = tp_groups(s["gpus"])
    assert [g.label for g in groups] == [
        "worker-0 · prefill · GPUs 0–1 (TP 2)",
        "worker-1 · prefill · GPUs 2–3 (TP 2)",
        "worker-2 · decode · GPUs 4–5 (TP 2)",
        "worker-3 · decode · GPUs 6–7 (TP 2)",
    ]
    assert [g.rows for g in groups] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert len({g.colour for g in groups}) == 4  # a shade per group within its pool's hue
    table = group_rows(s, groups)
    assert list(table["GPUs"]) == [2, 2, 2, 2] and set(table["power_limit_w"]) == {700.0}


def test_few_gpus_are_lines_one_per_group_with_the_limit_inside_the_axis():
    s = _series(4, 2, gap_at=5)
    svg = panel_svg(s, POWER, tp_groups(s["gpus"]), simulated=True)
    assert "data-mode='lines'" in svg
    assert re.findall(r"data-group='([^']+)'", svg) == [
        "worker-0 · prefill · GPUs 0–1 (TP 2)",
        "worker-0 · prefill · GPUs 0–1 (TP 2)",  # the gap at bucket 5 splits each line in two
        "worker-1 · decode · GPUs 2–3 (TP 2)",
        "worker-1 · decode · GPUs 2–3 (TP 2)",
    ]
    assert "data-limit-w='700'" in svg
    y_min, y_max = (float(v) for v in re.search(r"data-y-min='([^']+)' data-y-max='([^']+)'", svg).groups())
    assert y_min == 0 and 700 < y_max < 760  # the limit within the axis, no more
    xs = [float(p.split(",")[0]) for pts in re.findall(r"points='([^']+)'", svg) for p in pts.split()]
    assert max(xs) <= 640 - 14 + 0.1  # nothing drawn past the plot area
    assert "virtual time, UTC (simulated)" in svg
    clock = panel_svg(s, CLOCK, tp_groups(s["gpus"]), simulated=False)
    assert float(re.search(r"data-y-min='([^']+)'", clock).group(1)) > 1000  # fitted, not from zero
    assert ">time, UTC<" in clock


def test_many_gpus_are_a_heatmap_with_each_group_labelled_once():
    gpus = HEATMAP_ABOVE_GPUS + 4  # 20 GPUs, 5 workers of TP 4
    s = _series(gpus, 4)
    grid, drawn = panels_html(s, PANELS, tp_groups(s["gpus"]), simulated=True)
    assert drawn == len(PANELS) and grid.count("data-mode='heatmap'") == len(PANELS)
    labels = re.findall(r"class='pl-group'[^>]*>([^<]+)<", grid)
    assert labels == [f"worker-{w} · {'prefill' if w < 2.5 else 'decode'}" for w in range(5)] * len(PANELS)
    assert grid.count("data:image/png;base64,") == len(PANELS)
    assert grid.count("class='pl-limit'") == 1  # the power panel's strip above its heatmap


def test_a_metric_no_gpu_has_is_left_out():
    s = _series(2, 1)
    s["series"]["tensor_active_pct"] = [[None] * 10, [None] * 10]
    grid, drawn = panels_html(s, PANELS, tp_groups(s["gpus"]), simulated=False)
    assert drawn == len(PANELS) - 1 and "tensor_active_pct" not in grid


@pytest.mark.parametrize(
    ("lo", "hi", "want"),
    [
        (0, 10, [0, 2, 4, 6, 8, 10]),
        (0, 760, [0, 200, 400, 600]),
        (34.2, 37.1, [35, 36, 37]),
    ],
)
def test_nice_ticks(lo, hi, want):
    assert nice_ticks(lo, hi) == pytest.approx(want)


def test_time_ticks_fit_the_span():
    ticks, fmt = time_ticks(T0, T0 + 30)
    assert fmt == "%H:%M:%S" and 3 <= len(ticks) <= 7
    ticks, fmt = time_ticks(T0, T0 + 3600)
    assert fmt == "%H:%M" and ticks[1] - ticks[0] == 600
