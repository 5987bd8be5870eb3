"""Issue 25, "no contradictions": the Overview, Latency, Cost and Bimodal pages show the figures
``phaselens analyze`` prints for the same window (the CLI run as a process against the same
collector), and the Overview's waste sentence states its tile's value on the tile's base."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from streamlit.testing.v1 import AppTest

from analytics.overview import headline
from dashboard import figures
from tests.conftest import Fleet
from tests.dashboard.conftest import APP
from tests.dashboard.conftest import plotly_values as _values
from tests.dashboard.views.conftest import DISAGG, figures_of, open_page


def _analyze(fleet: Fleet, dataset: str) -> dict:
    """``phaselens analyze --json`` of a whole scenario, through the running collector."""
    cmd = [sys.executable, "-m", "phaselens.cli", "analyze", "--collector", fleet.url, "--dataset", dataset]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=180, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def analyzed(request: pytest.FixtureRequest) -> dict:
    fleet: Fleet = request.getfixturevalue("fleet")
    return _analyze(fleet, fleet.scenarios[DISAGG])


def test_overview_tiles_and_sentence_agree_with_analyze(dashboard_env: Fleet, analyzed: dict):
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["dataset"] = dashboard_env.scenarios[DISAGG]
    at.run()
    assert not at.exception
    tiles = {m.label: m.value for m in at.metric}
    want = headline(analyzed)  # the CLI's summary, turned into the tiles by the overview's own rules
    total = analyzed["parts"]["cost"]["total"]
    assert tiles["Output tokens/s"] == f"{want['output_tokens_per_s'][0]:,.0f}"
    assert tiles["$ per 1M tokens, all in"] == figures.usd_text(total["usd_per_1m_tokens"])
    assert tiles["$ per request"] == figures.usd_text(total["usd_per_request"])
    stranded = (total["stranded_prefill_s"] + total["stranded_decode_s"]) / total["gpu_seconds"]
    assert tiles["Stranded GPU-time"] == f"{100 * stranded:.1f} %"
    # every tile: the others from analyze's totals by hand (no phaselens telemetry missing here)
    assert not total.get("estimated_s")
    assert tiles["Host-bound GPU-time"] == f"{100 * total['host_bound_s'] / total['gpu_seconds']:.1f} %"
    assert tiles["Idle GPU-time"] == f"{100 * total['idle_s'] / total['gpu_seconds']:.1f} %"
    assert tiles["J per output token"] == f"{total['j_per_output_token']:.3g} J"
    both = analyzed["parts"]["latency"]["attainment"]["both"]
    assert tiles["SLO attainment"] == f"{100 * both:.1f} %"
    # the sentence of where the money goes states one tile's value, on that tile's base
    sentence = next(m.value for m in at.markdown if "of GPU-time is" in m.value)
    share = sentence.split("**")[-1].strip().split(" of GPU-time is ")[0]
    named = {
        "stranded": "Stranded GPU-time",
        "host-bound": "Host-bound GPU-time",
        "idle": "Idle GPU-time",
    }
    what = sentence.split(" of GPU-time is ")[1]
    tile = next(label for word, label in named.items() if what.startswith(word))
    assert share == tiles[tile]
    caption = "\n".join(c.value for c in at.caption)
    assert "No trend shown: the previous period would start before the scenario does" in caption
    assert "no data: " not in caption.split("No trend shown:")[1].splitlines()[0]


def test_latency_page_agrees_with_analyze(dashboard_env: Fleet, analyzed: dict):
    at = open_page("latency", dashboard_env.scenarios[DISAGG])
    assert not at.exception
    lat = analyzed["parts"]["latency"]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Meeting both SLOs"] == f"{lat['attainment']['both']:.1%}"
    assert shown["Meeting the TPOT SLO"] == f"{lat['attainment']['tpot']:.1%}"
    table = at.dataframe[0].value.set_index("Latency")
    e2e = lat["percentiles"]["e2e"]["p50_s"]
    assert e2e >= 1.0  # a long request: the table reads it in s, not thousands of ms
    assert table.loc["End to end", "p50"] == f"{e2e:,.2f} s"
    chart = figures_of(at)[0]
    traces = {t["name"]: t for t in chart["data"]}
    for name, key in (("TPOT p99", "tpot_p99_s"), ("TTFT p90", "ttft_p90_s")):
        want = [r[key] * 1000 for r in lat["over_time"] if isinstance(r[key], int | float)]
        got = _values(traces[name]["y"])
        assert [g for g in got if isinstance(g, float) and g == g] == pytest.approx(
            [w for w in want if w > 0]
        )


def test_cost_page_agrees_with_analyze(dashboard_env: Fleet, analyzed: dict):
    at = open_page("cost", dashboard_env.scenarios[DISAGG])
    assert not at.exception
    total = analyzed["parts"]["cost"]["total"]
    shown = {m.label: m.value for m in at.metric}
    assert shown["Cost of the window"] == figures.usd_text(total["cost_usd"])
    assert shown["Per 1M tokens, all in"] == figures.usd_text(total["usd_per_1m_tokens"])
    assert shown["Industry $ per 1M output"] == figures.usd_text(total["industry_usd_per_1m_output"])
    pools = next(f for f in figures_of(at) if f["layout"]["title"]["text"].startswith("Where the money goes"))
    bars = [_values(t["y"]) for t in pools["data"] if t["type"] == "bar"]
    by_pool = [sum(col[i] for col in bars) for i in range(len(bars[0]))]
    assert by_pool == pytest.approx([r["cost_usd"] for r in analyzed["parts"]["cost"]["by_pool"]])
    energy = list(at.dataframe[0].value["Energy"])  # shown as "Energy at the GPU, kWh"
    # issue 25: rows of 0.0000 kWh; a category's sliver of energy reads "< 0.001", none reads 0
    assert "< 0.001" in energy and not [v for v in energy if v.startswith("0.000")]
    categories = list(at.dataframe[0].value["Category"])
    assert "unsampled (no samples)" not in categories  # no GPU-second of it here: no row of zeros
    # a scenario of minutes: the cost over time per period finer than the hour (issue 25), its bars
    # (every category stacked) summing to analyze's total for the window, one bar per period
    cost = analyzed["parts"]["cost"]
    period = cost["period_s"]
    assert period is not None and period < 3600 and len(cost["by_period"]) >= 3
    over = next(f for f in figures_of(at) if f["layout"]["title"]["text"].startswith("Cost over time"))
    assert (
        over["layout"]["title"]["text"] == f"Cost over time, by category (per {figures.period_text(period)})"
    )
    bars = [_values(t["y"]) for t in over["data"] if t["type"] == "bar"]
    per_bucket = [sum(col[i] for col in bars) for i in range(len(bars[0]))]
    assert len(per_bucket) == len(cost["by_period"])
    assert sum(per_bucket) == pytest.approx(total["cost_usd"], rel=1e-9)
    assert per_bucket == pytest.approx([r["cost_usd"] for r in cost["by_period"]])


def test_bimodal_page_agrees_with_analyze(dashboard_env: Fleet, analyzed: dict):
    """Each pool's chart title (verdict), its modes and the per-GPU verdicts are analyze's."""
    at = open_page("bimodal", dashboard_env.scenarios[DISAGG])
    assert not at.exception
    table = analyzed["parts"]["bimodal"]["table"]
    pools = {r["role"]: r for r in table if r["scope"] == "pool"}
    charts = {f["layout"]["title"]["text"].split(" — ")[0]: f for f in figures_of(at)}
    for role, row in pools.items():
        fig = charts[f"{role.capitalize()} pool"]
        assert fig["layout"]["title"]["text"] == f"{role.capitalize()} pool — {row['verdict']}"
        marked = sorted(s["x0"] for s in fig["layout"].get("shapes", []))
        modes = [m for m in (row.get("mode_low_pct"), row.get("mode_high_pct")) if m is not None]
        if len(marked) == len(set(modes)) == 2:  # two modes marked: analyze's, to a hundredth of a point
            assert marked == pytest.approx(sorted(modes), abs=0.01)
    gpus = at.dataframe[0].value
    assert sorted(gpus["Bimodal?"]) == sorted(r["verdict"] for r in table if r["scope"] == "gpu")
