"""Cost and energy per token: the price table, hand-computed cost splits, the store path, simulated data."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from analytics.bimodal import idle_split
from analytics.cost import (
    ATTRIBUTION_CATEGORY,
    CATEGORIES,
    GpuHourUsage,
    PriceError,
    PriceTable,
    cost_breakdown,
    load_prices,
    mig_share,
    price_usage,
    token_counts,
)
from analytics.prices import DEFAULT_GPU_USD_PER_HOUR, DEFAULT_SOURCES
from analytics.window import Window, resolve_window, scenarios
from collector.store import Store

H100 = "NVIDIA H100 80GB HBM3"

# -- the price table ----------------------------------------------------------------------------------


def test_defaults_have_a_source_each() -> None:
    p = load_prices()
    assert p.gpu_price(H100) == 2.00
    assert p.gpu_price("NVIDIA H200") == 2.60
    assert p.gpu_price("NVIDIA A100-SXM4-80GB") == 1.49
    for key in [*DEFAULT_GPU_USD_PER_HOUR, "electricity_usd_per_kwh", "pue"]:
        assert DEFAULT_SOURCES[key] and p.sources[key] == DEFAULT_SOURCES[key]
    assert p.pue >= 1.0 and p.electricity_usd_per_kwh > 0


def test_modeled_gpus_are_priced_as_the_gpu_they_model_unless_named() -> None:
    p = load_prices(gpu_usd_per_hour={"NVIDIA H200 (emulated)": 0.5})
    assert p.gpu_price(H100 + " (simulated)") == 2.00
    assert p.gpu_price(H100 + " (emulated)") == 2.00
    assert p.gpu_price("NVIDIA H200 (emulated)") == 0.5
    assert p.gpu_price("NVIDIA L4") is None
    assert p.gpu_price(None) is None


def test_toml_file_then_arguments_override(tmp_path: Path) -> None:
    f = tmp_path / "prices.toml"
    f.write_text('pue = 1.2\nelectricity_usd_per_kwh = 0.08\n[gpu_usd_per_hour]\n"NVIDIA L4" = 0.8\n')
    p = load_prices(f, pue=1.1)
    assert (p.pue, p.electricity_usd_per_kwh) == (1.1, 0.08)
    assert p.gpu_price("NVIDIA L4") == 0.8 and p.gpu_price(H100) == 2.00  # merged into the defaults
    assert p.sources["pue"] == "argument" and p.sources["NVIDIA L4"] == f"file {f}"


def test_json_file(tmp_path: Path) -> None:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"gpu_usd_per_hour": {H100: 3.5}}))
    assert load_prices(f).gpu_price(H100) == 3.5


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"gpu_usd_per_hr": {}}, ["gpu_usd_per_hr", "allowed", "gpu_usd_per_hour"]),
        ({"gpu_usd_per_hour": {H100: -1}}, [H100, ">= 0"]),
        ({"electricity_usd_per_kwh": "cheap"}, ["electricity_usd_per_kwh", ">= 0"]),
        ({"pue": 0.9}, ["pue", ">= 1"]),
        ({"gpu_usd_per_hour": 2.0}, ["gpu_usd_per_hour", "table"]),
        ({"electricity_usd_per_kwh": math.inf}, ["electricity_usd_per_kwh", "finite"]),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(kwargs: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(PriceError) as e:
        load_prices(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text("pue = = 1")
    with pytest.raises(PriceError, match="not valid TOML"):
        load_prices(bad)
    with pytest.raises(PriceError, match="cannot be read"):
        load_prices(tmp_path / "missing.toml")
    yaml = tmp_path / "p.yaml"
    yaml.write_text("pue: 1")
    with pytest.raises(PriceError, match=r"\.toml or \.json"):
        load_prices(yaml)
    unknown = tmp_path / "u.json"
    unknown.write_text('{"discount": 0.3}')
    with pytest.raises(PriceError, match="'discount'"):
        load_prices(unknown)


# -- the cost math, by hand ---------------------------------------------------------------------------

PRICES = PriceTable(gpu_usd_per_hour={H100: 2.0}, electricity_usd_per_kwh=0.10, pue=1.5)
USD_PER_J = 1.5 * 0.10 / 3.6e6
# one H100 for one hour
SECONDS = {"prefill": 900.0, "decode": 1800.0, "stranded_decode": 600.0, "host_bound": 180.0, "idle": 120.0}
ENERGY = {"prefill": 540e3, "decode": 540e3, "stranded_decode": 180e3, "host_bound": 36e3, "idle": 9.6e3}


def hand_usage(**kw: Any) -> GpuHourUsage:
    args: dict[str, Any] = {
        "gpu": "GPU-a",
        "gpu_name": H100,
        "hour_start_s": 0.0,
        "seconds": dict(SECONDS),
        "energy_j": dict(ENERGY),
        "input_tokens": 1e6,
        "output_tokens": 2e5,
        "pool": "mixed",
        "model": "llama-3.1-70b",
        "node": "n1",
    }
    return GpuHourUsage(**(args | kw))


def test_hand_cost_split() -> None:
    b = price_usage([hand_usage()], PRICES)
    h = b.headline()
    cost = {c: 2.0 * SECONDS.get(c, 0) / 3600 + ENERGY.get(c, 0) * USD_PER_J for c in CATEGORIES}
    assert cost["prefill"] == pytest.approx(0.5 + 0.0225)
    assert cost["stranded_decode"] == pytest.approx(1 / 3 + 0.0075)
    share_in = 900 / (900 + 1800 + 600)  # prefill-side busy / busy
    inp = cost["prefill"] + (cost["host_bound"] + cost["idle"]) * share_in
    out = cost["decode"] + cost["stranded_decode"] + (cost["host_bound"] + cost["idle"]) * (1 - share_in)
    assert h["usd_per_1m_input"] == pytest.approx(inp / 1e6 * 1e6)
    assert h["usd_per_1m_output"] == pytest.approx(out / 2e5 * 1e6)
    assert h["usd_per_1m_input_prefill"] == pytest.approx(cost["prefill"])
    assert h["usd_per_1m_input_stranded"] == 0.0
    assert h["usd_per_1m_output_stranded"] == pytest.approx(cost["stranded_decode"] * 5)
    assert h["usd_per_1m_output_idle"] == pytest.approx(cost["idle"] * (1 - share_in) * 5)
    # the split sums to the total: every dollar is on one side
    assert h["input_cost_usd"] + h["output_cost_usd"] == pytest.approx(sum(cost.values()))
    assert h["cost_usd"] == pytest.approx(sum(cost.values()))
    assert sum(h[f"usd_per_1m_output_{k}"] for k in ("decode", "stranded", "host_bound", "idle")) == (
        pytest.approx(h["usd_per_1m_output"])
    )
    # the industry figure: $2/h ÷ (200k tok/h / 3600 × 3600) × 1e6 = $10 per 1M output tokens
    assert h["output_tokens_per_s_per_gpu"] == pytest.approx(2e5 / 3600)
    assert h["industry_usd_per_1m_output"] == pytest.approx(10.0)
    assert h["industry_usd_per_1m_tokens"] == pytest.approx(2.0 / 1.2e6 * 1e6)
    # energy per token per phase
    assert h["j_per_input_token_busy"] == pytest.approx(0.54)
    assert h["j_per_output_token_busy"] == pytest.approx((540e3 + 180e3) / 2e5)
    e_over = (36e3 + 9.6e3) * share_in
    assert h["j_per_input_token"] == pytest.approx((540e3 + e_over) / 1e6)
    assert h["input_tokens_per_j"] == pytest.approx(1e6 / (540e3 + e_over))
    assert h["j_per_token"] == pytest.approx(sum(ENERGY.values()) / 1.2e6)


def test_zero_tokens_give_nan_not_zero_or_inf() -> None:
    b = price_usage([hand_usage(input_tokens=0, output_tokens=0)], PRICES)
    h = b.headline()
    for k in ("usd_per_1m_input", "usd_per_1m_output", "industry_usd_per_1m_output", "j_per_output_token"):
        assert math.isnan(h[k]), k
    assert h["cost_usd"] > 0  # the GPU still cost money


def test_empty_usage_says_so() -> None:
    b = price_usage([], PRICES)
    assert math.isnan(b.headline()["usd_per_1m_output"])
    assert any("no GPU time" in n for n in b.trust.notes)
    with pytest.raises(PriceError, match="no GPU time"):
        b.annualised(8)


def test_unpriced_gpu_is_nan_and_named() -> None:
    b = price_usage([hand_usage(), hand_usage(gpu="GPU-b", gpu_name="NVIDIA L4")], PRICES)
    assert math.isnan(b.headline()["cost_usd"])
    by_gpu = b.by_gpu.set_index("gpu")
    assert by_gpu.loc["GPU-a", "cost_usd"] > 0 and math.isnan(by_gpu.loc["GPU-b", "cost_usd"])
    assert any("NVIDIA L4" in n and "gpu_usd_per_hour" in n for n in b.trust.notes)


def test_idle_gpu_of_a_pool_goes_to_that_pools_side() -> None:
    idle = {"idle": 3600.0}
    u = [
        hand_usage(gpu="p", pool="prefill", seconds=idle, energy_j={}, input_tokens=0, output_tokens=0),
        hand_usage(gpu="d", pool="decode", seconds=idle, energy_j={}, input_tokens=0, output_tokens=0),
    ]
    lines = price_usage(u, PRICES).lines.set_index("gpu")
    assert lines.loc["p", "input_cost_usd"] == pytest.approx(2.0) and lines.loc["p", "output_cost_usd"] == 0
    assert lines.loc["d", "output_cost_usd"] == pytest.approx(2.0) and lines.loc["d", "input_cost_usd"] == 0


def test_groups_sum_to_the_total() -> None:
    u = [
        hand_usage(),
        hand_usage(gpu="GPU-b", pool="decode", hour_start_s=3600.0, input_tokens=0),
        hand_usage(gpu="GPU-c", gpu_name="NVIDIA H200 (simulated)", pool="prefill", output_tokens=0),
    ]
    b = price_usage(u, load_prices())
    total = b.headline()["cost_usd"]
    for table in (b.by_model, b.by_pool, b.by_gpu, b.by_hour):
        assert table["cost_usd"].sum() == pytest.approx(total)
    assert set(b.by_pool["pool"]) == {"mixed", "decode", "prefill"}
    assert b.by_gpu.set_index("gpu").loc["GPU-c", "gpu_cost_usd"] == pytest.approx(2.60)


def test_annualised_projection() -> None:
    b = price_usage([hand_usage()], PRICES)
    a = b.annualised(64)
    one_hour = {c: 2.0 * SECONDS.get(c, 0) / 3600 + ENERGY.get(c, 0) * USD_PER_J for c in CATEGORIES}
    assert a.usd_per_year["stranded_decode"] == pytest.approx(one_hour["stranded_decode"] * 64 * 8760)
    assert a.usd_per_year["idle"] == pytest.approx(one_hour["idle"] * 64 * 8760)
    assert a.total_usd_per_year == pytest.approx(sum(one_hour.values()) * 64 * 8760)
    assert a.input_usd_per_year + a.output_usd_per_year == pytest.approx(a.total_usd_per_year)
    s = a.sentence()
    assert s.startswith("llama-3.1-70b on 64 H100 80GB HBM3s at this profile")
    assert "stranded decode compute" in s and "idle" in s
    assert a.to_dict()["sentence"] == s
    with pytest.raises(PriceError, match="fleet_gpus"):
        b.annualised(0)


def test_bad_usage_rows_are_refused() -> None:
    with pytest.raises(PriceError, match="unknown categories"):
        hand_usage(seconds={"busy": 1.0})
    with pytest.raises(PriceError, match=">= 0"):
        hand_usage(energy_j={"idle": -5.0})


# -- from a hand-built store --------------------------------------------------------------------------

NODE = "n1"


def make_store(path: Path, tables: dict[str, list[dict[str, Any]]]) -> duckdb.DuckDBPyConnection:
    with Store.open(path) as store:
        for table, rows in tables.items():
            if rows:
                store.append(table, rows)
    return duckdb.connect(str(path), read_only=True)


def sample(ts: float, energy_mj: int) -> dict[str, Any]:
    return {
        "node": NODE,
        "source": "nvml",
        "device": "cuda:0",
        "index": 0,
        "kind": "cuda",
        "uuid": "GPU-a",
        "name": H100,
        "emulated": False,
        "worker": "w0",
        "role": "mixed",
        "sm_active_pct": 50.0,
        "gpu_util_pct": 90.0,
        "power_w": 300.0,
        "ts_s": ts,
        "energy_mj": energy_mj,
    }


def iteration(start_s: float, end_s: float, phase: str, **cols: Any) -> dict[str, Any]:
    return {"node": NODE, "source": "worker-0", "worker": "w0", "gpu_uuid": "GPU-a", "gpu_index": 0} | {
        "start_s": start_s,
        "end_s": end_s,
        "phase": phase,
        **cols,
    }


@pytest.fixture
def hand_store(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    reqs = [
        {
            "node": NODE,
            "source": "router",
            "request_id": rid,
            "arrival_s": a,
            "prefill_end_s": a + 0.5,
            "first_token_s": a + 0.5,
            "finish_s": a + 2.0,
            "prompt_tokens": p,
            "output_tokens": 3,
            "prefill_worker": "w0",
            "decode_worker": "w0",
            "status": "ok",
        }
        for rid, a, p in (("r1", 100.1, 400), ("r2", 101.2, 600))
    ]
    toks = [
        {
            "node": NODE,
            "request_id": rid,
            "idx": i,
            "ts_s": a + 0.5 + 0.5 * i,
            "itl_s": None if i == 0 else 0.5,
        }
        for rid, a in (("r1", 100.1), ("r2", 101.2))
        for i in range(3)
    ]
    con = make_store(
        tmp_path / "cost.duckdb",
        {
            # 4 s of samples, 300 W → 1200 J on the counter
            "gpu_samples": [sample(100.0 + i, 1_000_000 + 300_000 * i) for i in range(5)],
            "iterations": [
                iteration(100.1, 100.6, "prefill", prefill_tokens=400),
                iteration(100.7, 101.1, "decode", decode_seqs=1),
                iteration(101.2, 101.7, "prefill", prefill_tokens=600),
                iteration(101.8, 103.0, "decode", decode_seqs=2),
            ],
            "requests": reqs,
            "tokens": toks,
        },
    )
    yield con
    con.close()


def test_token_counts_reconcile_with_requests(hand_store: duckdb.DuckDBPyConnection) -> None:
    t = token_counts(hand_store, Window(100.0, 104.5))
    assert t["input_tokens"].sum() == 1000 and t["output_tokens"].sum() == 6
    assert set(t["gpu_uuid"]) == {"GPU-a"}


@pytest.mark.parametrize("stored_worker", ["none", "all", "half"])
def test_output_tokens_are_counted_per_node_request_and_hour(tmp_path: Path, stored_worker: str) -> None:
    """Each token counts in the hour it was generated, for its request's node and worker: requests
    inside one hour, across one hour boundary and over three hours, and a request id used on two
    nodes (the per-request-id shortcut must not merge or misplace any of them). Tokens stored with
    their worker (the store's writer keeps it) and without (rows from before: joined to their
    requests) count alike, also mixed in one window."""
    hour = 3600.0
    spans = [  # node, request id, first token, finish, worker
        ("n1", "r1", 10 * hour + 100, 10 * hour + 200, "w0"),  # one hour; the same id on n2
        ("n1", "r2", 10 * hour + 3500, 11 * hour + 100, "w0"),  # across one hour boundary
        ("n1", "r3", 10 * hour + 1800, 12 * hour + 1800, "w1"),  # over three hours
        ("n1", "r4", 12 * hour + 100, 12 * hour + 400, "w1"),
        ("n2", "r1", 11 * hour + 3590, 12 * hour + 10, "w2"),  # across a boundary, on another node
        ("n2", "r5", 11 * hour + 3000, 11 * hour + 3300, "w2"),
    ]
    reqs, toks, expected = [], [], {}
    for node, rid, first, finish, worker in spans:
        reqs.append(
            {"node": node, "source": "router", "request_id": rid, "arrival_s": first - 1.0,
             "prefill_end_s": first, "first_token_s": first, "finish_s": finish, "prompt_tokens": 10,
             "prefill_worker": worker, "decode_worker": worker, "status": "ok"}
        )  # fmt: skip
        for i, ts in enumerate(range(int(first), int(finish) + 1, 7)):
            toks.append({"node": node, "request_id": rid, "idx": i, "ts_s": float(ts), "itl_s": 7.0})
            if stored_worker == "all" or (stored_worker == "half" and i % 2):
                toks[-1]["worker"] = worker
            key = (node, worker, math.floor(ts / hour) * hour)
            expected[key] = expected.get(key, 0) + 1
    con = make_store(tmp_path / "tokens.duckdb", {"requests": reqs, "tokens": toks})
    try:
        t = token_counts(con, Window(10 * hour, 13 * hour))
    finally:
        con.close()
    got = t[t["output_tokens"] > 0].groupby(["node", "worker", "hour_start_s"])["output_tokens"].sum()
    assert {k: int(v) for k, v in got.items()} == expected
    assert t["output_tokens"].sum() == len(toks)


def test_cost_breakdown_from_the_store(hand_store: duckdb.DuckDBPyConnection) -> None:
    b = cost_breakdown(hand_store, Window(100.0, 104.5), PRICES)
    h = b.headline()
    assert h["gpu_seconds"] == pytest.approx(4.0)
    assert h["energy_j"] == pytest.approx(1200.0, rel=0.01)  # the counter's rise
    assert h["cost_usd"] == pytest.approx(2.0 * 4 / 3600 + 1200 * USD_PER_J, rel=1e-3)
    assert h["input_tokens"] == 1000 and h["output_tokens"] == 6
    assert b.tokens["input_tokens_served"] == b.tokens["input_tokens_counted"] == 1000
    assert b.tokens["output_tokens_served"] == b.tokens["output_tokens_counted"] == 6
    assert h["input_cost_usd"] + h["output_cost_usd"] == pytest.approx(h["cost_usd"])
    assert h["prefill_s"] == pytest.approx(1.0) and h["decode_s"] + h["stranded_decode_s"] == pytest.approx(
        1.6
    )
    assert b.by_gpu["gpu"].tolist() == ["GPU-a"] and b.by_pool["pool"].tolist() == ["mixed"]
    assert b.by_hour["cost_usd"].sum() == pytest.approx(h["cost_usd"])
    json.dumps(b.to_dict())  # JSON-ready (NaN → null)


def test_cost_breakdown_of_an_empty_window(hand_store: duckdb.DuckDBPyConnection) -> None:
    b = cost_breakdown(hand_store, Window(500.0, 600.0), PRICES)
    assert math.isnan(b.headline()["usd_per_1m_output"])
    assert any("no GPU" in n for n in b.trust.notes)


# -- on simulated data --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    db = tmp_path_factory.mktemp("sim") / "sim.duckdb"
    cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--model", "llama-3.1-8b"]
    cmd += ["--layout", "agg:2xh100-sxm", "--layout", "1p1d:h100-sxm", "--duration", "120", "--db", str(db)]
    subprocess.run(cmd, check=True, capture_output=True)
    con = duckdb.connect(str(db), read_only=True)
    yield con
    con.close()


def test_simulated_costs_reconcile(sim_store: duckdb.DuckDBPyConnection) -> None:
    by_name = {s["name"]: s["scenario_id"] for s in scenarios(sim_store)}
    for name, sid in by_name.items():
        w = resolve_window(sim_store, dataset=sid)
        # [start, end) ends at the scenario's last event: widen it so the last token is inside
        b = cost_breakdown(sim_store, Window(w.start_s, w.end_s + 1.0, sid))
        h = b.headline()
        assert "simulated" in b.trust.labels
        assert b.tokens["output_tokens_counted"] == pytest.approx(b.tokens["output_tokens_served"])
        assert b.tokens["input_tokens_counted"] == pytest.approx(b.tokens["input_tokens_served"])
        served = sim_store.execute(
            "SELECT sum(output_tokens) FROM requests WHERE node = ? AND status = 'ok'", ["sim:" + sid]
        ).fetchone()[0]
        assert h["output_tokens"] == served, name  # every token of the run is in the window
        assert h["input_cost_usd"] + h["output_cost_usd"] == pytest.approx(h["cost_usd"])
        assert 0 < h["usd_per_1m_input"] < h["usd_per_1m_output"]
        assert b.annualised(64).total_usd_per_year == pytest.approx(
            h["cost_usd"] / h["gpu_seconds"] * 64 * 3600 * 8760
        )
        # the same GPU time and energy per category as helper A's idle split
        split = idle_split(sim_store, Window(w.start_s, w.end_s + 1.0, sid))
        for ours, theirs in ATTRIBUTION_CATEGORY.items():
            assert h[f"{ours}_s"] == pytest.approx(split.per_gpu[f"{theirs}_s"].sum(), rel=1e-9)
            assert h[f"energy_j_{ours}"] == pytest.approx(split.per_gpu[f"energy_{theirs}_j"].sum(), rel=1e-9)
        if name.startswith("1p1d"):
            pools = b.by_pool.set_index("pool")
            assert math.isnan(pools.loc["prefill", "usd_per_1m_output"])  # a prefill pool makes no output
            assert math.isnan(pools.loc["decode", "usd_per_1m_input"])


def test_mig_instances_are_priced_by_their_slices() -> None:
    assert mig_share("1g.10gb") == pytest.approx(1 / 7)
    assert mig_share("3g.40gb") == pytest.approx(3 / 7)
    assert mig_share("7g.80gb") == 1.0
    assert mig_share(None) == 1.0 and mig_share("weird") == 1.0
    b = price_usage([hand_usage(gpu_share=mig_share("1g.10gb"), energy_j={})], PRICES)
    assert b.headline()["gpu_cost_usd"] == pytest.approx(2.0 / 7)
    with pytest.raises(PriceError, match="gpu_share"):
        hand_usage(gpu_share=0.0)
