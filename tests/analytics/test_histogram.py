"""Binned SM activity and utilization % per pool: a hand-counted store, bin edges, bad input."""

from __future__ import annotations

import math

import pytest

from analytics.histogram import activity_histogram, check_bin_pct
from analytics.trust import EMULATED, HOST_BOUND, MEASURED
from analytics.window import AnalyticsError, Window
from tests.analytics.test_attribution import make_store, samples

WINDOW = Window(100.0, 200.0, "live")


def _gpu(device: str, index: int, role: str, sm: list[float | None], util: list[float | None], **cols):
    rows = samples([100.0 + i for i in range(len(sm))], [None] * len(sm), **cols)
    for r, s, u in zip(rows, sm, util, strict=True):
        r.update(device=device, index=index, uuid=f"GPU-{device}", role=role, sm_active_pct=s, gpu_util_pct=u)
    return rows


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    # a prefill GPU: SM 80, 85, 100 (100 falls in the last bin), util 99 ×3
    # a decode GPU: SM 10, 12, 15, None (no SM value: not counted), util 90, 95, 95, 95; emulated, one lagged
    prefill = _gpu("cuda:0", 0, "prefill", [80.0, 85.0, 100.0], [99.0, 99.0, 99.0])
    decode = _gpu("cuda:1", 1, "decode", [10.0, 12.0, 15.0, None], [90.0, 95.0, 95.0, 95.0], emulated=True)
    decode[0]["host_bound_pct"] = 12.0
    outside = _gpu("cuda:0", 0, "prefill", [50.0], [50.0])
    outside[0]["ts_s"] = 250.0  # after the window
    store = make_store(
        tmp_path_factory.mktemp("hist") / "h.duckdb", {"gpu_samples": prefill + decode + outside}
    )
    yield store
    store.close()


def test_counts_per_pool_and_fleet_by_hand(con):
    h = activity_histogram(con, WINDOW, bin_pct=10.0)
    assert h.edges_pct == [10.0 * i for i in range(11)]
    assert [g["pool"] for g in h.groups] == ["fleet", "prefill", "decode"]
    pre, dec, fleet = h.group("prefill"), h.group("decode"), h.group("fleet")
    assert pre["gpus"] == 1 and pre["samples"] == 3 and dec["samples"] == 4
    assert pre["sm_active"]["counts"] == [0] * 8 + [2, 1]  # 80, 85 → bin 8; 100 → the last bin
    assert dec["sm_active"]["counts"] == [0, 3] + [0] * 8  # 10, 12, 15 → bin 1; the None is left out
    assert dec["gpu_util"]["counts"] == [0] * 9 + [4]
    assert fleet["sm_active"]["counts"] == [
        a + b for a, b in zip(pre["sm_active"]["counts"], dec["sm_active"]["counts"], strict=True)
    ]
    assert fleet["gpus"] == 2 and fleet["samples"] == 7
    assert pre["sm_active"]["mean_pct"] == pytest.approx(265.0 / 3)
    assert dec["sm_active"]["mean_pct"] == pytest.approx(37.0 / 3) and dec["sm_active"]["n"] == 3
    assert dec["gpu_util"]["mean_pct"] == pytest.approx(93.75)
    assert h.trust.labels == {MEASURED, EMULATED, HOST_BOUND}


def test_json_form_and_finer_bins(con):
    d = activity_histogram(con, WINDOW, bin_pct=2.5).to_dict()
    assert d["bin_pct"] == 2.5 and len(d["edges_pct"]) == 41
    dec = next(g for g in d["groups"] if g["pool"] == "decode")
    assert len(dec["sm_active"]["counts"]) == 40
    assert dec["sm_active"]["counts"][4] == 2 and dec["sm_active"]["counts"][6] == 1  # 10, 12 | 15
    assert d["trust"]["labels"] == ["measured", "emulated", "host-bound"]


def test_an_empty_window_says_so(con):
    h = activity_histogram(con, Window(300.0, 400.0, "live"))
    assert h.groups == [] and h.missing == ["no GPU samples in the window"]


@pytest.mark.parametrize("bad", ["3", "0", "-2", "nan", "abc", None, 100])
def test_bin_width_must_be_one_of_the_allowed(bad):
    with pytest.raises(AnalyticsError, match=r"bin_pct must be one of 1, 2, 2\.5, 5, 10"):
        check_bin_pct(bad)
    assert check_bin_pct("2.5") == 2.5 and not math.isnan(check_bin_pct(5))
