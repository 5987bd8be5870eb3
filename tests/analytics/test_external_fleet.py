"""An external fleet end to end: a real `phaselens collect` scrapes a real HTTP server serving the
recorded dcgm-exporter (NVIDIA L4) and vLLM `/metrics` pages, their counters advancing with wall
time, into a real DuckDB file; `phaselens analyze` (through the collector's API, then on the file)
gives GPU-hours, cost, J/token and an estimated phase split — no bundled-stack telemetry anywhere.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from analytics.cost import price_usage
from analytics.external import external_attribution
from analytics.external_cost import external_usage
from analytics.overview import overview
from analytics.summary import summarize
from analytics.window import Window
from phaselens.cli import main
from tests.analytics.test_cost import H100, NODE, PRICES, USD_PER_J, hand_store, make_store, sample  # noqa: F401
from tests.analytics.test_external import AGG_TIMES, fleet, pool_dcgm, pool_engines, window  # noqa: F401
from tests.collector.conftest import start_collector
from tests.collector.sources.conftest import DATA, L4_PROM, TEXT, LocalServer, http_server  # noqa: F401
from tests.conftest import stop_process
from tests.dashboard.views.conftest import open_page

VLLM_PROM = (DATA / "vllm-lmcache.prom").read_text()
PHASE_S = 2.0
# per 2 s phase, cycling: (prompt tokens/s, generated tokens/s, engine steps/s, requests/s)
PHASES = ((6000.0, 100.0, 10.0, 4.0), (0.0, 600.0, 60.0, 2.0), (0.0, 0.0, 0.0, 0.0))
SECONDS_PER = (1e-4, 5e-4, 5e-3)  # GPU-busy seconds per prompt token, generated token, step
IDLE_W, BUSY_W = 16.0, 55.0  # an L4: 16 W idle (the capture's reading), 72 W board limit
GPU_USD_PER_HOUR = 0.80  # the default price table has no L4: the test names its price


@dataclass
class Workload:
    """What the GPU and the engine did since ``t0``: cumulative counters and the current gauges."""

    t0: float
    last_dcgm: tuple[float, float] | None = None  # (time, busy seconds) at the last dcgm-exporter scrape

    def at(self, now: float) -> dict[str, float]:
        t = max(0.0, now - self.t0)
        total = {"prompt": 0.0, "gen": 0.0, "steps": 0.0, "requests": 0.0, "energy_j": 0.0, "busy_s": 0.0}
        k, busy = 0, 0.0
        while k * PHASE_S < t:
            dt = min(PHASE_S, t - k * PHASE_S)
            prompt, gen, steps, requests = PHASES[k % len(PHASES)]
            busy = min(1.0, prompt * SECONDS_PER[0] + gen * SECONDS_PER[1] + steps * SECONDS_PER[2])
            for key, rate in zip(
                ("prompt", "gen", "steps", "requests"), (prompt, gen, steps, requests), strict=True
            ):
                total[key] += rate * dt
            total["energy_j"] += (IDLE_W + BUSY_W * busy) * dt
            total["busy_s"] += busy * dt
            k += 1
        return total | {"busy": busy, "power_w": IDLE_W + BUSY_W * busy}


def _set(page: str, metric: str, value: float) -> str:
    """``page`` with every sample of ``metric`` set to ``value``."""
    out, n = re.subn(rf"^({re.escape(metric)}(?:\{{[^}}]*\}})?) \S+$", rf"\g<1> {value!r}", page, flags=re.M)
    assert n, metric
    return out


def _add(page: str, metric: str, increase: float) -> str:
    """``page`` with every sample of the counter ``metric`` raised by ``increase``."""

    def raise_(m: re.Match[str]) -> str:
        return f"{m[1]} {float(m[2]) + increase!r}"

    out, n = re.subn(rf"^({re.escape(metric)}(?:\{{[^}}]*\}})?) (\S+)$", raise_, page, flags=re.M)
    assert n, metric
    return out


def dcgm_page(w: Workload) -> str:
    now = time.monotonic()
    s = w.at(now)
    # GR_ENGINE_ACTIVE as DCGM gives it: the busy fraction averaged since its last reading
    t, busy_s = w.last_dcgm or (w.t0, 0.0)
    active = (s["busy_s"] - busy_s) / (now - t) if now > t else s["busy"]
    w.last_dcgm = (now, s["busy_s"])
    page = _add(L4_PROM, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", round(s["energy_j"] * 1000.0))
    page = _set(page, "DCGM_FI_DEV_POWER_USAGE", s["power_w"])
    page = _set(page, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", min(1.0, max(0.0, active)))
    return _set(page, "DCGM_FI_DEV_GPU_UTIL", float(round(100 * s["busy"])))


def vllm_page(w: Workload) -> str:
    s = w.at(time.monotonic())
    page = _add(VLLM_PROM, "vllm:prompt_tokens_total", s["prompt"])
    page = _add(page, "vllm:generation_tokens_total", s["gen"])
    page = _add(page, "vllm:iteration_tokens_total_count", s["steps"])
    return _add(page, "vllm:request_success_total", s["requests"] / 3)  # its three finished_reason series


@pytest.fixture
def external_fleet(http_server: LocalServer, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, str, Path]]:  # noqa: F811
    """A collector scraping the two pages (dcgm-exporter every 0.5 s, vLLM every 1 s) for ~12 s: two
    cycles of the three phases, ≥ 10 s of GPU samples (the checks want ≥ ~8 s)."""
    w = Workload(time.monotonic())
    dcgm = http_server.serve_text("/dcgm/metrics", "")
    http_server.routes["/dcgm/metrics"] = lambda _q: (200, dcgm_page(w), TEXT)
    vllm = http_server.serve_text("/vllm/metrics", "")
    http_server.routes["/vllm/metrics"] = lambda _q: (200, vllm_page(w), TEXT)
    db = tmp_path / "external.duckdb"
    proc, url = start_collector(
        db,
        *("--node", "gpu-node-1", "--dcgm", dcgm, "--engine", vllm),
        *("--dcgm-interval-s", "0.5", "--metrics-interval-s", "1", "--metrics-settle-s", "0"),
    )
    try:
        deadline = time.monotonic() + 120
        while http_server.hits.get("/vllm/metrics", 0) < 12 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2.0)  # the last scrapes flushed
        yield proc, url, db
    finally:
        stop_process(proc)


def _check(summary: dict, *, priced: bool = True) -> None:
    parts = summary["parts"]
    assert "external" in parts, summary["missing"]
    t = parts["cost"]["total"]
    assert t["gpu_hours"] > 0.002  # ≥ ~8 s of one GPU's samples
    assert t["j_per_token"] > 0 and t["j_per_output_token"] > 0
    assert t["input_tokens"] > 1000 and t["output_tokens"] > 100 and t["requests"] > 0
    if priced:
        assert t["cost_usd"] > 0 and t["usd_per_1m_tokens"] > 0 and t["usd_per_request"] > 0
    else:  # no default price for an L4: the dollars are undefined, and said so
        assert t["cost_usd"] is None and t["usd_per_1m_tokens"] is None
        assert any("no price for GPU NVIDIA L4" in n for n in parts["cost"]["trust"]["notes"])
    assert "estimated" in parts["cost"]["trust"]["labels"]
    assert "estimated" in parts["external"]["trust"]["labels"]
    (pool,) = parts["external"]["per_pool"]
    assert pool["pool"] == "mixed" and pool["method"] == "engine-metrics"
    assert pool["prefill_share"] > 0.02 and pool["decode_share"] > 0.1
    assert pool["idle_share"] > 0.1  # one phase in three does nothing
    assert t["prefill_s"] > 0 and t["decode_s"] > 0 and t["idle_s"] > 0
    # GPU-hours are the observed sample time, whole: the states add up to it
    assert t["gpu_seconds"] == pytest.approx(pool["span_s"], rel=1e-6)


def _metrics(url: str) -> dict[str, list]:
    """The collector's /metrics samples by family, once its GPU counters hold values (the first
    scrape starts the counting; new series show 0 for their first 4 intervals)."""
    deadline = time.monotonic() + 90
    while True:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        got = {f.name: f.samples for f in text_string_to_metric_families(text)}
        if any(s.value > 0 for s in got.get("phaselens_gpu_seconds", [])) or time.monotonic() > deadline:
            return got
        time.sleep(1.0)


def test_a_vllm_fleet_on_dcgm_exporter_gets_gpu_hours_cost_and_energy_per_token(
    external_fleet, capsys, monkeypatch, tmp_path
):
    proc, url, db = external_fleet
    price = ["--gpu-usd-per-hour", str(GPU_USD_PER_HOUR)]
    r = httpx.get(
        f"{url}/api/v1/analytics/summary",
        params={"since": "10m", "gpu_usd_per_hour": GPU_USD_PER_HOUR},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    _check(r.json())
    _check(
        httpx.get(f"{url}/api/v1/analytics/summary", params={"since": "10m"}, timeout=120).json(),
        priced=False,
    )

    assert main(["analyze", "--collector", url, "--since", "10m", *price]) == 0
    out = capsys.readouterr().out
    assert "GPUs without phaselens telemetry (measured, estimated" in out
    window_cost = re.search(r"window cost \$(\S+) for (\S+) GPU-h", out)
    assert window_cost and float(window_cost[1]) > 0 and float(window_cost[2]) > 0, out
    assert "per 1M tokens (input + output)" in out and "per request" in out

    # the overview (the dashboard's landing page): energy per token, the GPU-time bar; no stranded or
    # host-bound share (not split for these GPUs), and no $ (no L4 price by default): each says why
    ov = httpx.get(f"{url}/api/v1/analytics/overview", params={"since": "10m"}, timeout=120).json()
    fig = ov["figures"]
    assert fig["j_per_output_token"]["value"] > 0 and "estimated" in fig["j_per_output_token"]["trust"]
    assert (
        fig["stranded_share"]["value"] is None
        and "no phaselens telemetry" in fig["stranded_share"]["no_data"]
    )
    assert (
        fig["usd_per_1m_tokens"]["value"] is None and "without a price" in fig["usd_per_1m_tokens"]["no_data"]
    )
    assert fig["idle_share"]["value"] > 0.1
    assert ov["gpu_time"]["shares"]["productive_decode"] > 0 and ov["gpu_time"]["shares"]["idle"] > 0.1

    # Prometheus export: the estimated phase split's GPU-seconds, joules and tokens of the L4 under
    # dcgm-exporter's labels and the engine's model (no $ series: an L4 has no default price)
    m = _metrics(url)
    seconds: dict[str, float] = {}
    for s in m["phaselens_gpu_seconds"]:
        assert (s.labels["gpu"], s.labels["pool"], s.labels["model"]) == ("0", "mixed", "Qwen/Qwen3-8B")
        assert s.labels["Hostname"] == "i-030791dc5a37cd257" and s.labels["gpu_name"] == "NVIDIA L4"
        seconds[s.labels["category"]] = seconds.get(s.labels["category"], 0.0) + s.value
    total = sum(seconds.values())
    assert seconds["productive_prefill"] / total > 0.02 and seconds["productive_decode"] / total > 0.1
    joules = sum(s.value for s in m["phaselens_gpu_energy_joules"])
    output = sum(s.value for s in m["phaselens_tokens"] if s.labels["side"] == "output")
    assert joules > 0 and output > 0  # J per output token: their rates' ratio
    assert "phaselens_gpu_cost_dollars" not in m
    trust = {(s.labels["part"], s.labels["trust"]): s.value for s in m["phaselens_trust"]}
    assert trust[("cost", "estimated")] == 1.0 and trust[("gpu_time", "estimated")] == 1.0

    # the report: the cost section with the estimated split
    page = tmp_path / "report.html"
    assert main(["report", "--collector", url, "--since", "10m", "--out", str(page)]) == 0
    html = page.read_text()
    assert "GPUs without phaselens telemetry: phase split, estimated" in html
    assert '<span class="badge estimated">estimated</span>' in html
    assert re.search(r"The window cost <b>\S+</b> for [\d.]+ GPU-s", html)

    # the dashboard's Cost page (its GPU price input starts at $2/h where the table has none)
    monkeypatch.setenv("PHASELENS_API_URL", url)
    at = open_page("cost")
    assert not at.exception
    metrics = {x.label: x.value for x in at.metric}
    for label in ("Cost of the window", "Per 1M tokens, all in", "Per request"):
        assert metrics[label].startswith("$"), (label, metrics)
    assert "GPUs without phaselens telemetry: phase split, estimated" in [h.value for h in at.subheader]
    capsys.readouterr()

    stop_process(proc)  # the collector holds the file while it runs
    assert main(["analyze", "--db", str(db), "--since", "10m", "--json", *price]) == 0
    _check(json.loads(capsys.readouterr().out))


# -- a hand-built store: a bundled GPU and a dcgm-exporter GPU in one window ---------------------------


def test_a_bundled_gpu_and_a_dcgm_gpu_in_one_window_are_each_priced_their_way(
    hand_store: duckdb.DuckDBPyConnection,  # noqa: F811
    tmp_path: Path,
) -> None:
    """GPU-a runs the bundled stack (iterations, requests, tokens); GPU-x is only watched by
    dcgm-exporter, with no engine: it is priced busy-only from its samples (other busy + idle, its
    energy counter), and only it is in the ``external`` part; GPU-a's figures do not change."""
    window = Window(100.0, 104.5)
    alone = summarize(hand_store, window, prices=PRICES, skip=frozenset({"bimodal"})).to_dict()
    rows = [sample(100.0 + i, 1_000_000 + 300_000 * i) for i in range(5)]  # GPU-a, as in hand_store
    # GPU-x: 4 intervals of 1 s, busy 25/50/75/100 %, 200 W → 800 J on its counter
    dcgm = [
        {
            "node": NODE,
            "source": "dcgm:http://10.0.0.9:9400/metrics",
            "device": "nvidia1",
            "index": 1,
            "kind": "cuda",
            "uuid": "GPU-x",
            "name": H100,
            "emulated": False,
            "gr_engine_active_pct": 25.0 * i,
            "power_w": 200.0,
            "ts_s": 100.0 + i,
            "energy_mj": 5_000_000 + 200_000 * i,
        }
        for i in range(5)
    ]
    tables = {
        t: hand_store.execute(f"SELECT * FROM {t}").df().to_dict("records")
        for t in ("iterations", "requests", "tokens")
    }
    # the bundled stack's router, scraped as an engine on GPU-x's host: its tokens are GPU-a's, not GPU-x's
    router = [
        {
            "node": NODE,
            "endpoint": "http://10.0.0.9:8000/metrics",
            "engine": "phaselens",
            "ts_s": 100.0 + i,
            "metric": metric,
            "labels": {},
            "value": 500.0 * i,
        }
        for i in range(5)
        for metric in ("prompt_tokens_total", "generation_tokens_total")
    ]
    con = make_store(
        tmp_path / "both.duckdb", {"gpu_samples": [*rows, *dcgm], "engine_metrics": router, **tables}
    )
    try:
        both = summarize(con, window, prices=PRICES, skip=frozenset({"bimodal"})).to_dict()
    finally:
        con.close()
    ext = both["parts"]["external"]
    assert [g["uuid"] for g in ext["per_gpu"]] == ["GPU-x"] and ext["per_gpu"][0]["method"] == "busy-only"
    by_gpu = {r["gpu"]: r for r in both["parts"]["cost"]["by_gpu"]}
    x, a = by_gpu["GPU-x"], by_gpu["GPU-a"]
    assert x["gpu_seconds"] == pytest.approx(4.0) and x["estimated_s"] == pytest.approx(4.0)
    assert x["other_busy_s"] == pytest.approx(0.25 + 0.5 + 0.75 + 1.0)  # busy, but no engine to say in what
    assert x["idle_s"] == pytest.approx(4.0 - 2.5)
    assert x["energy_j"] == pytest.approx(800.0)
    assert x["cost_usd"] == pytest.approx(2.0 * 4 / 3600 + 800 * USD_PER_J)
    assert x["input_tokens"] == 0 and x["output_tokens"] == 0
    before = {r["gpu"]: r for r in alone["parts"]["cost"]["by_gpu"]}["GPU-a"]
    for key in ("gpu_seconds", "cost_usd", "decode_s", "stranded_decode_s", "input_tokens", "output_tokens"):
        assert a[key] == pytest.approx(before[key]), key
    assert a["estimated_s"] == 0
    total = both["parts"]["cost"]["total"]
    assert total["cost_usd"] == pytest.approx(a["cost_usd"] + x["cost_usd"])
    assert "estimated" in both["parts"]["cost"]["trust"]["labels"]
    # the overview: stranded and host-bound shares are of the GPU-time that has that split (GPU-a's)
    fig = overview(both, None)["figures"]
    assert fig["stranded_share"]["value"] == pytest.approx(
        (a["stranded_prefill_s"] + a["stranded_decode_s"]) / a["gpu_seconds"]
    )
    assert fig["idle_share"]["value"] == pytest.approx((a["idle_s"] + x["idle_s"]) / total["gpu_seconds"])


def test_a_disaggregated_fleet_counts_prompts_on_prefill_and_generated_tokens_on_decode(
    fleet,  # noqa: F811
) -> None:
    """Dynamo prefill and decode workers (vLLM pages with Dynamo labels): the prefill engine's
    prompt tokens are the input tokens and its one generated token per request is not output (the
    decode worker's is); each pool's GPU-time is priced on its own side."""
    con = fleet(AGG_TIMES, pool_dcgm, pool_engines())
    res = external_attribution(con, window(AGG_TIMES))
    usages = {u.pool: u for u in external_usage(res)}
    p, d = usages["prefill"], usages["decode"]
    assert (p.input_tokens, p.output_tokens) == (
        300.0,
        0.0,
    )  # prompt 100/interval; its 1 token/interval dropped
    assert (d.input_tokens, d.output_tokens) == (0.0, 120.0)  # generated 40/interval
    assert p.seconds["prefill"] == pytest.approx(9.0) and d.seconds["decode"] == pytest.approx(24.0)
    assert p.seconds["idle"] + p.seconds["prefill"] == pytest.approx(30.0) and p.estimated
    served = res.engines.set_index("endpoint")
    assert served.loc["http://10.0.0.5:8000/metrics", "served_output_tokens"] == 0
    assert served.loc["http://10.0.0.6:8000/metrics", "served_output_tokens"] == pytest.approx(120.0)
    b = price_usage(list(usages.values()), PRICES)
    pools = b.by_pool.set_index("pool")
    assert pools.loc["prefill", "usd_per_1m_input"] == pytest.approx(
        pools.loc["prefill", "cost_usd"] / 300 * 1e6
    )
    assert math.isnan(pools.loc["prefill", "usd_per_1m_output"])
    assert b.headline()["usd_per_1m_tokens"] == pytest.approx(b.headline()["cost_usd"] / 420 * 1e6)
