"""Layouts on B200 / GB200 and with FP8 weights and KV run, and say they are unvalidated (issue 23
point 5); bad dtypes are refused before anything runs."""

from __future__ import annotations

import pytest

from serving.config import preset
from serving.sim.layout import LayoutError, check_layout, parse_layout
from serving.sim.simulator import Simulation
from serving.sim.summary import format_table, summarize
from serving.trace import poisson_trace

SHAPE = preset("llama-3.1-8b")


def _summary(layout: str):
    trace = poisson_trace(4.0, 30, seed=5)
    return summarize(Simulation(parse_layout(layout), SHAPE, trace, start_s=1.8e9, scenario="dt").run())


def test_fp8_on_b200_runs_faster_than_bf16_on_h200_and_is_labelled_unvalidated() -> None:
    h200, b200 = _summary("agg:1xh200"), _summary("agg:1xb200:dtype=fp8")
    assert h200.trust == "simulated" and b200.trust == "simulated, unvalidated"
    assert b200.tpot_p50_s < h200.tpot_p50_s  # 8 TB/s and half the weight bytes
    text = format_table([h200, b200])
    assert "UNVALIDATED: agg:1xb200:dtype=fp8" in text and "agg:1xh200 run" not in text
    assert parse_layout("agg:1xb200:dtype=fp8").describe()["dtype"] == "fp8"


def test_fp8_holds_twice_the_kv_and_bad_dtypes_are_refused() -> None:
    bf16 = check_layout(parse_layout("agg:1xh200"), SHAPE)["mixed"]
    fp8 = check_layout(parse_layout("agg:1xh200:dtype=fp8"), SHAPE)["mixed"]
    assert fp8 > 2 * bf16  # one byte per KV element, and 8 GB of weights freed
    with pytest.raises(LayoutError, match="unknown dtype 'int4'; allowed: bf16, fp8"):
        parse_layout("agg:1xh200:dtype=int4")
    with pytest.raises(LayoutError, match="no FP8 tensor cores"):
        check_layout(parse_layout("agg:1xa100-sxm-80gb:dtype=fp8"), SHAPE)
