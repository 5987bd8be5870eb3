"""The Bimodal page in AppTest, against a real collector on a simulated fleet."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Fleet
from tests.dashboard.conftest import plotly_values as _values
from tests.dashboard.views.conftest import AGG, DISAGG, figures_of, open_page, texts


def _bimodal_rows(fleet: Fleet, sid: str) -> dict:
    body = httpx.get(f"{fleet.url}/api/v1/analytics/summary", params={"dataset": sid}, timeout=120).json()
    return {r["role"]: r for r in body["parts"]["bimodal"]["table"] if r["scope"] == "pool"}


def _rule(fleet: Fleet, sid: str) -> str:
    body = httpx.get(f"{fleet.url}/api/v1/analytics/summary", params={"dataset": sid}, timeout=120).json()
    return body["parts"]["bimodal"]["rule"]


def _gpu_rows(fleet: Fleet, sid: str) -> list[dict]:
    body = httpx.get(f"{fleet.url}/api/v1/analytics/summary", params={"dataset": sid}, timeout=120).json()
    return [r for r in body["parts"]["bimodal"]["table"] if r["scope"] == "gpu"]


def _peaks(y: list[float]) -> list[int]:
    """Bins higher than both neighbours, holding at least 5 % of the samples."""
    padded = [0.0, *y, 0.0]
    return [
        i
        for i in range(len(y))
        if padded[i + 1] >= 5 and padded[i + 1] > padded[i] and padded[i + 1] > padded[i + 2]
    ]


def test_an_aggregated_run_shows_two_modes_and_the_utilization_gap(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[AGG]
    at = open_page("bimodal", sid)
    assert not at.exception
    (fig,) = figures_of(at)  # one pool: mixed
    assert fig["layout"]["title"]["text"] == "Mixed pool — bimodal (dip p < 0.001, two modes)"
    sm = next(t for t in fig["data"] if t["name"].startswith("SM activity"))
    shares = _values(sm["y"])
    assert sum(shares) == pytest.approx(100.0)
    low, high = _peaks(shares)[0], _peaks(shares)[-1]
    assert high - low >= 5  # two modes at least 10 points of SM activity apart ...
    assert min(shares[low + 1 : high]) < 0.1 * min(shares[low], shares[high])  # ... with a valley between
    row = _bimodal_rows(dashboard_env, sid)["mixed"]
    # the same modes as the API's row, to a hundredth of a point (DuckDB's parallel sums may order differently)
    assert sorted(s["x0"] for s in fig["layout"]["shapes"]) == pytest.approx(
        [row["mode_low_pct"], row["mode_high_pct"]], abs=0.01
    )
    assert not [a for a in fig["layout"]["annotations"] if a.get("name") == "trust"]  # the block says it
    assert fig["layout"]["xaxis"]["title"]["text"].startswith("SM activity or utilization, %")
    util, smact = (float(m.value.removesuffix(" %")) for m in at.metric[:2])
    assert [m.label for m in at.metric[:2]] == ["Mean utilization", "Mean SM activity"]
    assert util > smact + 20  # busy by utilization, compute mostly idle
    text = texts(at)
    assert "**Bimodal?** bimodal (dip p < 0.001, two modes)" in text and "Busy but compute-idle" in text
    assert row["verdict"] == "bimodal (dip p < 0.001, two modes)"  # the page shows the API's verdict
    assert "**Sarle's b** (supporting evidence, not the verdict)" in text
    assert f"Verdict: {_rule(dashboard_env, sid)}" in text  # the rule, as the API states it
    assert text.count(":blue-badge[simulated]") == 1


def test_a_disaggregated_run_per_pool_and_the_pool_filter(dashboard_env: Fleet):
    sid = dashboard_env.scenarios[DISAGG]
    at = open_page("bimodal", sid)
    assert not at.exception
    titles = [f["layout"]["title"]["text"] for f in figures_of(at)]
    assert [t.split(" — ")[0] for t in titles] == ["All GPUs", "Prefill pool", "Decode pool"]
    table = at.dataframe[0].value
    assert len(table) == 2 and set(table["Pool"]) == {"prefill", "decode"}
    rows = _gpu_rows(dashboard_env, sid)
    assert sorted(table["Bimodal?"]) == sorted(r["verdict"] for r in rows)  # the API's verdicts, as they are
    at.sidebar.multiselect(key=f"pools_{sid}").select("decode").run()
    assert not at.exception
    titles = [f["layout"]["title"]["text"] for f in figures_of(at)]
    assert len(titles) == 1 and titles[0].startswith("Decode pool")


def test_the_roofline_table_shows_the_api_s_mfu_mbu_and_stranded_time(dashboard_env: Fleet):
    """Issue 23: MFU / MBU per pool and phase and the stranded GPU-seconds, beside the activities,
    with their trust labels, as the summary's roofline part computed them."""
    sid = dashboard_env.scenarios[DISAGG]
    body = httpx.get(
        f"{dashboard_env.url}/api/v1/analytics/summary", params={"dataset": sid}, timeout=120
    ).json()
    part = body["parts"]["roofline"]
    at = open_page("bimodal", sid)
    assert not at.exception
    table, stranded = at.dataframe[1].value, at.dataframe[2].value
    for r in part["table"]:
        if r["scope"] != "pool":
            continue
        row = table[(table["pool"] == f"{r['role']} pool") & (table["phase"] == r["phase"])].iloc[0]
        assert row["MFU"] == f"{100 * r['mfu']:.1f} %" and row["MBU"] == f"{100 * r['mbu']:.1f} %"
        assert row["trust"] == "simulated"
    decode = stranded[stranded["pool"] == "decode pool"].iloc[0]
    want = next(s for s in part["stranded"] if s["role"] == "decode")
    assert decode["stranded compute, GPU-s"] == f"{want['stranded_compute_s']:,.2f}"
    assert "Stranded compute = decode GPU-seconds × (1 − MFU of decode)" in texts(at)
