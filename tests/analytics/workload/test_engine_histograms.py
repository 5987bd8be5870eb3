"""An external vLLM fleet's workload from its engine metrics only: a real HTTP server serves vLLM's
/metrics page (the request_prompt_tokens / request_generation_tokens histograms with vLLM's buckets,
request_success_total, the prefix-cache counters) advancing as a known trace's requests finish; the
collector's own EngineScrapeSource scrapes it every 10 s (its clock stepped through the trace's time)
into a real store; the workload observed from the histograms has the trace's rate and lengths."""

from __future__ import annotations

import numpy as np
import pytest

from analytics.window import Window
from analytics.workload import ENGINE_HISTOGRAMS, describe_trace, observe, synthesize_trace, workload_drift
from collector.sources.prometheus import EngineScrapeSource
from collector.store import Store
from tests.analytics.workload.conftest import RATE_RPS, known_trace
from tests.collector.sources.conftest import TEXT, LocalServer, http_server  # noqa: F401

T0_S = 1_796_400_000.0
SCRAPE_S = 10.0
BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)  # vLLM's, as in the captured page
BASE = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
PREFIX_HIT_SHARE = 0.3


def _histogram(name: str, values: np.ndarray) -> list[str]:
    lines = [f"# HELP {name} {name}.", f"# TYPE {name} histogram"]
    for le in BUCKETS:
        lines.append(f'{name}_bucket{{{BASE},le="{float(le)}"}} {float((values <= le).sum())}')
    lines.append(f'{name}_bucket{{{BASE},le="+Inf"}} {float(len(values))}')
    lines.append(f"{name}_count{{{BASE}}} {float(len(values))}")
    lines.append(f"{name}_sum{{{BASE}}} {float(values.sum())}")
    return lines


def dynamo_frontend_page(trace, now_s: float) -> str:
    """A Dynamo frontend's page: the same requests as :func:`vllm_page`, under Dynamo's names."""
    done = [r for r in trace if T0_S + r.arrival_s <= now_s]
    prompt = np.array([r.prompt_tokens for r in done], dtype=float)
    output = np.array([r.output_tokens for r in done], dtype=float)
    page = "\n".join(
        [
            *_histogram("dynamo_frontend_input_sequence_tokens", prompt),
            *_histogram("dynamo_frontend_output_sequence_tokens", output),
        ]
    )
    return page.replace(BASE, 'model="llama-3.1-8b"') + "\n"


def vllm_page(trace, now_s: float) -> str:
    """vLLM's page at ``now_s``: every request of ``trace`` that arrived by then counted (a request's
    lengths are observed when it finishes; here, as it arrives: the test is of the reading)."""
    done = [r for r in trace if T0_S + r.arrival_s <= now_s]
    prompt = np.array([r.prompt_tokens for r in done], dtype=float)
    output = np.array([r.output_tokens for r in done], dtype=float)
    queried = float(prompt.sum())
    lines = [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{BASE},finished_reason="stop"}} {float(len(done))}',
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{BASE}}} {queried}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{BASE}}} {round(queried * PREFIX_HIT_SHARE)}",
        *_histogram("vllm:request_prompt_tokens", prompt),
        *_histogram("vllm:request_generation_tokens", output),
    ]
    return "\n".join(lines) + "\n"


def scrape_into_store(server: LocalServer, trace, db, pages=(vllm_page,)) -> None:
    """Scrape the pages (each at its own path) every 10 s of the trace's time (and once before it)
    into ``db``."""
    clock = {"now": T0_S - SCRAPE_S}
    sources = []
    for k, page in enumerate(pages):
        path = f"/{k}/metrics"
        server.routes[path] = lambda _q, page=page: (200, page(trace, clock["now"]), TEXT)
        sources.append(EngineScrapeSource(server.url + path, node="gpu-node-1", clock=lambda: clock["now"]))
    rows = []
    try:
        while clock["now"] <= T0_S + 300.0:
            for src in sources:
                res = src.poll(force=True)
                assert res.ok and not [e for e in res.errors if e.kind != "unmapped"], res.errors
                rows += res.table_rows("engine_metrics")
            clock["now"] += SCRAPE_S
    finally:
        for src in sources:
            src.close()
    with Store.open(db) as store:
        store.append("engine_metrics", rows)
        store.flush()


def _bucket_of(value: float) -> tuple[float, float]:
    edges = (0, *BUCKETS, np.inf)
    k = int(np.searchsorted(edges, value, side="left"))
    return edges[k - 1], edges[k]


def test_a_vllm_fleets_histograms_give_its_rate_lengths_and_prefix_reuse(http_server, tmp_path):  # noqa: F811
    found = {}
    for name, cv, seed in (("poisson", 1.0, 21), ("bursty", 3.0, 22)):
        trace = known_trace(cv, seed=seed)
        db = tmp_path / f"{name}.duckdb"
        scrape_into_store(http_server, trace, db)
        with Store.open(db, read_only=True) as store, store.reader() as con:
            w = observe(con, Window(T0_S - 60.0, T0_S + 310.0))
        found[name] = w
        assert w.source == ENGINE_HISTOGRAMS
        assert w.trust.labels == {"measured", "estimated"}
        assert any("independent" in n for n in w.trust.notes)
        assert w.request_count == len(trace)  # every increase of the histograms' count, none twice
        assert w.mean_rps == pytest.approx(RATE_RPS, rel=0.1)  # over the scraped span (300 s)
        assert not w.lengths.joint and w.lengths.pairs is None
        prompt = np.array([r.prompt_tokens for r in trace])
        output = np.array([r.output_tokens for r in trace])
        # means are exact (the histograms' _sum / _count); percentiles within the bucket holding the truth
        assert w.prompt_tokens.mean == pytest.approx(prompt.mean(), rel=1e-6)
        assert w.output_tokens.mean == pytest.approx(output.mean(), rel=1e-6)
        for q in (50, 90, 99):
            for stats, values in ((w.prompt_tokens, prompt), (w.output_tokens, output)):
                lo, hi = _bucket_of(np.percentile(values, q))
                assert lo <= getattr(stats, f"p{q}") <= hi, (name, q, lo, hi)
        assert w.prefix_reuse_ratio == pytest.approx(PREFIX_HIT_SHARE, abs=0.01)
        assert "vLLM prefix cache" in w.prefix_reuse_note
        # a trace synthesized from the histograms matches them
        syn = describe_trace(synthesize_trace(w, seed=5), start_s=w.start_s, duration_s=w.duration_s)
        assert not workload_drift(w, syn).stale
    # counts per 10 s scrape: Poisson's index of dispersion ≈ 1, Gamma gaps of CV 3 far above
    assert 0.5 < found["poisson"].dispersion_index < 1.8
    assert found["bursty"].dispersion_index > 3.0
    assert found["bursty"].burstiness_cv > 1.7 > found["poisson"].burstiness_cv


def test_behind_a_dynamo_frontend_each_request_counts_once(http_server, tmp_path):  # noqa: F811
    trace = known_trace(1.0, seed=23)
    db = tmp_path / "dynamo.duckdb"
    scrape_into_store(http_server, trace, db, pages=(dynamo_frontend_page, vllm_page))
    with Store.open(db, read_only=True) as store, store.reader() as con:
        w = observe(con, Window(T0_S - 60.0, T0_S + 310.0), source="engine_histograms")
    assert w.request_count == len(trace)  # the frontend's histograms alone, not the worker's as well
    assert any("Dynamo frontend" in n for n in w.trust.notes)
    assert w.prompt_tokens.mean == pytest.approx(np.mean([r.prompt_tokens for r in trace]), rel=1e-6)
    assert w.prefix_reuse_ratio == pytest.approx(PREFIX_HIT_SHARE, abs=0.01)  # the vLLM worker's cache
