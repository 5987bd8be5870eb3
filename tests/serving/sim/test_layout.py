"""Layout strings and the checks that refuse a layout before anything runs."""

import pytest

from serving.config import preset
from serving.sim.layout import LayoutError, check_layout, parse_layout


def test_aggregated_layout_splits_gpus_into_tp_replicas():
    layout = parse_layout("agg:8xh100-sxm:tp2")
    assert layout.mode == "aggregated"
    assert layout.gpu == "h100-sxm"
    (pool,) = layout.pools
    assert (pool.role, pool.replicas, pool.tp) == ("mixed", 4, 2)
    assert layout.gpus == 8


def test_disaggregated_layout_with_per_role_knobs():
    layout = parse_layout(
        "3p1d:h100-sxm:tp2:decode.tp=4:decode.power_limit_w=450:prefill.sm_clock_mhz=990-1980:kv_link=nvlink"
    )
    assert layout.mode == "disaggregated"
    prefill, decode = layout.pool("prefill"), layout.pool("decode")
    assert (prefill.replicas, prefill.tp, prefill.sm_clock_mhz, prefill.power_limit_w) == (
        3,
        2,
        (990, 1980),
        None,
    )
    assert (decode.replicas, decode.tp, decode.power_limit_w) == (1, 4, 450.0)
    assert layout.kv_link == "nvlink"
    assert layout.gpus == 3 * 2 + 4


def test_a_name_can_prefix_the_layout():
    assert parse_layout("today=agg:2xh200").name == "today"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("agg:8xb300", "unknown GPU 'b300'; allowed: h100-sxm"),
        ("mesh:8xh100-sxm", "neither agg nor XpYd"),
        ("agg:h100-sxm", "NxGPU"),
        ("agg:6xh100-sxm:tp4", "6 GPUs do not split into replicas of tp 4"),
        ("agg:8xh100-sxm:colour=red", "unknown option 'colour'"),
        ("3p1d:h100-sxm:mixed.tp=2", "names role 'mixed'; this layout has prefill, decode"),
        ("3p1d:h100-sxm:kv_link=carrier-pigeon", "unknown link 'carrier-pigeon'"),
        ("3p1d:h100-sxm:tp=two", "tp='two' is not a valid value"),
        ("0p1d:h100-sxm", "prefill pool needs at least one replica"),
        ("agg", "expected MODE:GPU"),
    ],
)
def test_bad_layout_strings_say_what_is_wrong(text, says):
    with pytest.raises(LayoutError, match=None) as err:
        parse_layout(text)
    assert says in str(err.value)


def test_a_model_that_does_not_fit_is_refused_before_running():
    with pytest.raises(LayoutError) as err:
        check_layout(parse_layout("agg:1xh100-sxm"), preset("llama-3.1-70b"))
    assert "mixed pool" in str(err.value)
    check_layout(parse_layout("agg:2xh100-sxm:tp2"), preset("llama-3.1-70b"))  # fits at TP 2


def test_tp_must_divide_the_heads():
    with pytest.raises(LayoutError):
        check_layout(parse_layout("agg:3xh100-sxm:tp3"), preset("llama-3.1-8b"))


def test_knobs_outside_the_gpu_bounds_are_refused():
    shape = preset("llama-3.1-8b")
    with pytest.raises(LayoutError, match=r"power_limit_w 900 W is outside \[200, 700\] W"):
        check_layout(parse_layout("1p1d:h100-sxm:decode.power_limit_w=900"), shape)
    with pytest.raises(LayoutError, match="sm_clock_mhz 100-1980 is not a range within"):
        check_layout(parse_layout("1p1d:h100-sxm:prefill.sm_clock_mhz=100-1980"), shape)


def test_kv_capacity_per_replica_is_returned_by_role():
    capacity = check_layout(parse_layout("1p1d:h100-sxm:decode.tp=2"), preset("llama-3.1-8b"))
    assert capacity["decode"] > capacity["prefill"] > 0  # two GPUs' memory hold more KV
