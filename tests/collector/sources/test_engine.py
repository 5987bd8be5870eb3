"""Engine /metrics scrapes (vLLM, SGLang, Dynamo, phaselens router) → engine_metrics rows and deltas."""

from __future__ import annotations

import pytest

from collector.sources import TABLE_ENGINE_METRICS, Backoff, EngineScrapeSource
from collector.sources.prometheus import ENGINE_ROW_COLUMNS
from tests.collector.sources import expositions as ex
from tests.collector.sources.conftest import DATA, FakeClock, LocalServer, closed_port_url


def rows_of(result) -> list[dict]:
    assert result.ok, result.errors
    return result.rows.get(TABLE_ENGINE_METRICS, [])


def find(rows: list[dict], metric: str, _engine: str | None = None, **labels: str) -> list[dict]:
    out = []
    for r in rows:
        lab = r["labels"]
        same_engine = _engine is None or r["engine"] == _engine
        if same_engine and r["metric"] == metric and all(lab.get(k) == v for k, v in labels.items()):
            out.append(r)
    return out


def value(rows: list[dict], metric: str, _engine: str | None = None, **labels: str) -> float:
    found = find(rows, metric, _engine, **labels)
    assert len(found) == 1, (metric, labels, found)
    return found[0]["value"]


@pytest.fixture
def engine(http_server: LocalServer, clock: FakeClock):
    made: list[EngineScrapeSource] = []

    def make(body: str, **kw) -> EngineScrapeSource:
        url = http_server.serve_text("/metrics", body)
        made.append(EngineScrapeSource(url, clock=clock, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_vllm_rows_deltas_and_counter_reset(engine, http_server: LocalServer, clock: FakeClock) -> None:
    src = engine(
        ex.vllm(prompt=100, gen=1000, ttft=(2.0, 10), itl=(5.0, 990), e2e=(30.0, 10), finished=10),
        interval_s=10.0,
    )
    assert src.available() and src.detected_engines == {"vllm"}
    first = rows_of(src.poll())
    r0 = find(first, "requests_running")[0]
    assert tuple(r0) == ENGINE_ROW_COLUMNS
    assert (r0["node"], r0["endpoint"], r0["engine"], r0["ts_s"]) == (
        "127.0.0.1",
        f"{http_server.url}/metrics",
        "vllm",
        1_000.0,
    )
    assert r0["labels"] == {"engine": "0", "model_name": ex.MODEL}
    assert value(first, "requests_running") == 3
    assert value(first, "requests_waiting") == 1
    assert value(first, "kv_cache_usage_ratio") == 0.25
    assert value(first, "prompt_tokens_total") == 100
    assert value(first, "generation_tokens_total") == 1000
    assert value(first, "requests_total", finished_reason="stop") == 10
    assert value(first, "ttft_seconds_sum") == 2.0 and value(first, "ttft_seconds_count") == 10
    assert value(first, "ttft_seconds_bucket", le="+Inf") == 10
    assert len(find(first, "ttft_seconds_bucket")) == 5
    # The deprecated time_per_output_token histogram does not double the ITL rows.
    assert value(first, "itl_seconds_sum") == 5.0
    assert value(first, "e2e_seconds_count") == 10
    # No previous scrape → no per-interval rows; no python_* metrics; no _created samples.
    assert not [r for r in first if r["metric"].endswith(("_per_s", "_mean"))]
    assert not [r for r in first if "python" in r["metric"] or "created" in r["metric"]]
    assert {r["engine"] for r in first} == {"vllm"}

    # Second scrape 10 s later.
    http_server.serve_text(
        "/metrics",
        ex.vllm(prompt=300, gen=1500, ttft=(5.0, 20), itl=(7.5, 1490), e2e=(50.0, 20), finished=20),
    )
    clock.advance(5)
    assert src.poll().skipped  # interval_s not over yet
    clock.advance(5)
    second = rows_of(src.poll())
    assert {r["ts_s"] for r in second} == {1_010.0}
    assert value(second, "prompt_tokens_per_s") == pytest.approx(20.0)
    assert value(second, "generation_tokens_per_s") == pytest.approx(50.0)
    assert value(second, "requests_per_s", finished_reason="stop") == pytest.approx(1.0)
    assert value(second, "ttft_seconds_mean") == pytest.approx(0.3)  # (5.0 - 2.0) / (20 - 10)
    assert value(second, "ttft_seconds_count_per_s") == pytest.approx(1.0)
    assert value(second, "itl_seconds_mean") == pytest.approx(0.005)  # 2.5 s / 500 tokens
    assert value(second, "e2e_seconds_mean") == pytest.approx(2.0)
    assert find(second, "ttft_seconds_mean")[0]["labels"] == {
        "engine": "0",
        "model_name": ex.MODEL,
    }

    # The engine restarted: counters start again from zero.
    http_server.serve_text(
        "/metrics", ex.vllm(prompt=50, gen=80, ttft=(0.6, 2), itl=(0.4, 78), e2e=(3.0, 2), finished=2)
    )
    clock.advance(10)
    result = src.poll()
    third = rows_of(result)
    assert value(third, "prompt_tokens_per_s") == pytest.approx(5.0)  # 50 new tokens over 10 s
    assert value(third, "generation_tokens_per_s") == pytest.approx(8.0)
    assert value(third, "ttft_seconds_mean") == pytest.approx(0.3)  # 0.6 / 2
    assert value(third, "ttft_seconds_count_per_s") == pytest.approx(0.2)
    assert result.error_count("counter_reset") == 6  # 3 counters + 3 histograms
    assert {e.severity for e in result.errors} == {"info"}
    h = src.health()
    assert h.status == "ok" and h.errors_total == 1  # a restart is not a fault; python_gc_* unmapped once
    assert src.health_details() == {"unmapped_families": 1, "duplicate_series": 0}


def test_sglang_names(engine, http_server: LocalServer, clock: FakeClock) -> None:
    src = engine(ex.sglang(prompt=8_128_902, gen=7_557_572, ttft=(100.0, 400), tpot=(30.0, 1000)))
    first = rows_of(src.poll())
    assert {r["engine"] for r in first} == {"sglang"}
    assert value(first, "prompt_tokens_total") == 8_128_902
    assert value(first, "kv_cache_usage_ratio") == 0.28
    assert value(first, "requests_running") == 5
    assert value(first, "requests_waiting") == 2
    assert value(first, "requests_total") == 40
    assert value(first, "itl_seconds_count") == 1000  # time_per_output_token is per-token here
    assert value(first, "e2e_seconds_sum") == 12.0
    assert value(first, "cache_hit_rate") == 0.0075  # unmapped sglang metric passes through
    assert find(first, "ttft_seconds_sum")[0]["labels"] == {
        "model_name": ex.MODEL,
        "tp_rank": "0",
    }
    http_server.serve_text(
        "/metrics", ex.sglang(prompt=8_129_902, gen=7_559_572, ttft=(104.0, 410), tpot=(32.0, 2000))
    )
    clock.advance(4)
    second = rows_of(src.poll(force=True))
    assert value(second, "prompt_tokens_per_s") == pytest.approx(250.0)
    assert value(second, "generation_tokens_per_s") == pytest.approx(500.0)
    assert value(second, "ttft_seconds_mean") == pytest.approx(0.4)
    assert value(second, "itl_seconds_mean") == pytest.approx(0.002)


def test_dynamo_frontend_names_and_token_totals_from_sequence_histograms(
    engine, http_server: LocalServer, clock: FakeClock
) -> None:
    src = engine(ex.dynamo(isl=(10_000, 10), osl=(2_000, 10), ttft=(1.5, 10)))
    first = rows_of(src.poll())
    assert {r["engine"] for r in first} == {"dynamo", "dynamo_worker"}
    assert value(first, "requests_running", "dynamo") == 7
    assert value(first, "requests_waiting") == 0
    assert value(first, "requests_total", status="success") == 10
    assert value(first, "e2e_seconds_sum") == 20.0
    assert value(first, "input_sequence_tokens_sum") == 10_000
    assert value(first, "prompt_tokens_total") == 10_000
    assert value(first, "generation_tokens_total") == 2_000
    # dynamo_component_* is a worker, not the frontend: its own engine, never summed with the frontend
    (worker,) = find(first, "requests_running", "dynamo_worker")
    assert worker["labels"] == {"dynamo_component": "backend"}
    http_server.serve_text("/metrics", ex.dynamo(isl=(16_000, 14), osl=(2_800, 14), ttft=(2.3, 14)))
    clock.advance(2)
    second = rows_of(src.poll(force=True))
    assert value(second, "prompt_tokens_per_s") == pytest.approx(3_000.0)
    assert value(second, "generation_tokens_per_s") == pytest.approx(400.0)
    assert value(second, "ttft_seconds_mean") == pytest.approx(0.2)
    assert value(second, "input_sequence_tokens_mean") == pytest.approx(1_500.0)
    assert value(second, "requests_per_s", status="success") == pytest.approx(2.0)


def test_phaselens_router_exposition(engine) -> None:
    from serving.metrics import ServingMetrics

    m = ServingMetrics("tiny", pool=lambda: None)
    m.ttft.labels("tiny").observe(0.25)
    m.ttft.labels("tiny").observe(0.75)
    m.prompt_tokens.labels("tiny").inc(12)
    m.generation_tokens.labels("tiny").inc(30)
    m.kv_bytes.labels("tiny").inc(4096)
    src = engine(m.render().decode())
    rows = rows_of(src.poll())
    assert src.detected_engines == {"phaselens"}
    assert value(rows, "ttft_seconds_count", model_name="tiny") == 2
    assert value(rows, "ttft_seconds_sum", model_name="tiny") == pytest.approx(1.0)
    assert value(rows, "prompt_tokens_total", model_name="tiny") == 12
    assert value(rows, "generation_tokens_total", model_name="tiny") == 30
    assert value(rows, "kv_transfer_bytes_total", model_name="tiny") == 4096  # phaselens:* pass through
    assert {r["engine"] for r in rows} == {"phaselens"}


def test_engine_filter_and_passthrough_off(engine) -> None:
    body = ex.vllm(prompt=1, gen=2, ttft=(0.1, 1), itl=(0.1, 1), e2e=(0.1, 1), finished=1) + ex.sglang(
        prompt=3, gen=4, ttft=(0.1, 1), tpot=(0.1, 1)
    )
    rows = rows_of(engine(body, engine="sglang", passthrough=False, include_buckets=False).poll())
    assert {r["engine"] for r in rows} == {"sglang"}
    assert not find(rows, "cache_hit_rate")
    assert not [r for r in rows if r["metric"].endswith("_bucket")]
    with pytest.raises(ValueError):
        EngineScrapeSource("http://127.0.0.1:1/metrics", engine="tgi")


def test_malformed_engine_lines_are_counted_and_the_rest_kept(engine) -> None:
    body = ex.vllm(prompt=100, gen=1000, ttft=(2.0, 10), itl=(5.0, 990), e2e=(30.0, 10), finished=10)
    body = body.replace(
        "# HELP vllm:num_requests_waiting",
        'vllm:num_requests_running{engine="0" oops\nvllm:num_requests_waiting{engine="1"} lots\n'
        "# HELP vllm:num_requests_waiting",
    )
    body += 'vllm:kv_cache_usage_perc{engine="2"} NaN\n'
    src = engine(body)
    result = src.poll()
    rows = rows_of(result)
    assert result.error_count("malformed_line") == 1
    assert result.error_count("non_numeric") == 1
    assert result.error_count("non_finite") == 1
    assert value(rows, "prompt_tokens_total") == 100
    assert src.health().status == "degraded"


def test_unreachable_engine_is_down_with_backoff(clock: FakeClock) -> None:
    src = EngineScrapeSource(closed_port_url(), clock=clock, backoff=Backoff(base_s=2, jitter=0.0))
    assert src.available() is False
    r = src.poll()
    assert not r.ok and r.errors[0].kind == "unreachable"
    h = src.health()
    assert (h.status, h.next_attempt_s) == ("down", 1_002.0)
    clock.advance(2)
    src.poll()
    assert src.health().next_attempt_s == 1_006.0
    src.close()


def test_clock_backwards_drops_the_engine_scrape(engine, clock: FakeClock) -> None:
    src = engine(ex.vllm(prompt=1, gen=2, ttft=(0.1, 1), itl=(0.1, 1), e2e=(0.1, 1), finished=1))
    assert rows_of(src.poll())
    clock.t -= 5
    result = src.poll(force=True)
    assert result.error_count("clock_backwards") == 1 and rows_of(result) == []


def test_delta_tracker_forgets_series_that_went_away() -> None:
    from collector.sources.base import SourceResult
    from collector.sources.prometheus import DeltaTracker, EnginePoint

    t = DeltaTracker(stale_after_s=100.0)
    res = SourceResult("x", 0.0)
    for i in range(50):  # a new pod label every scrape
        t.update(
            "e",
            float(i),
            [EnginePoint("vllm", "prompt_tokens", "counter", "_total", {"pod": str(i)}, 1.0)],
            res,
        )
    t.update("e", 1_000.0, [], res)
    assert len(t) == 0


def test_vllm_with_lmcache_capture(engine, clock: FakeClock) -> None:
    src = engine((DATA / "vllm-lmcache.prom").read_text())
    result = src.poll()
    rows = rows_of(result)
    assert {r["engine"] for r in rows} == {"vllm", "lmcache"}
    assert not [r for r in rows if "created" in r["metric"]]  # *_created: metadata, skipped
    # KV usage and capacity (vLLM writes its block count as a label of cache_config_info)
    assert value(rows, "kv_cache_usage_ratio", "vllm") == pytest.approx(0.4187)
    (cap,) = find(rows, "kv_blocks_total", "vllm")
    assert cap["value"] == 4381 and cap["labels"] == {"engine": "0"}
    assert value(rows, "requests_total", finished_reason="length") == 212
    assert value(rows, "queue_seconds_sum") == pytest.approx(96.2)
    # LMCache: hit tokens, usage, retrieve/store latency
    assert value(rows, "retrieve_requested_tokens_total", "lmcache") == 1_842_112
    assert value(rows, "retrieve_hit_tokens_total", "lmcache") == 822_016
    assert value(rows, "retrieve_hit_ratio", "lmcache") == pytest.approx(0.4462)
    assert value(rows, "local_cache_usage_bytes", "lmcache") == 8_589_934_592
    assert value(rows, "retrieve_seconds_sum", "lmcache") == pytest.approx(38.2)
    assert value(rows, "retrieve_seconds_count", "lmcache") == 1695
    assert value(rows, "num_lookup_requests_total", "lmcache") == 1702  # passes through
    lm = find(rows, "retrieve_hit_tokens_total")[0]["labels"]
    assert lm == {"model_name": "Qwen/Qwen3-8B", "role": "worker", "worker_id": "0", "world_size": "1"}
    # The process's own families have no place in engine_metrics: counted, each by name, not dropped
    found = {e.message.split(":")[0] for e in result.errors if e.kind == "unmapped"}
    assert found == {
        "python_gc_objects_collected",
        "python_info",
        "process_virtual_memory_bytes",
        "process_cpu_seconds",
    }
    assert all(e.severity == "warning" for e in result.errors)
    assert src.health().status == "ok"


def test_dynamo_worker_capture(engine) -> None:
    src = engine((DATA / "dynamo-vllm-worker.prom").read_text())
    result = src.poll()
    rows = rows_of(result)
    assert {r["engine"] for r in rows} == {"dynamo_worker", "vllm"}
    w = "dynamo_worker"
    assert value(rows, "kv_blocks_used", w) == 3120
    assert value(rows, "kv_blocks_total", w) == 4381
    assert value(rows, "kv_cache_usage_ratio", w) == pytest.approx(0.7122)
    assert value(rows, "prefix_cache_hit_ratio", w) == pytest.approx(0.3318)
    assert value(rows, "requests_running", w) == 9
    req = find(rows, "requests_total", w)[0]
    assert req["value"] == 2231
    assert req["labels"] == {
        "dynamo_component": "backend",
        "dynamo_endpoint": "generate",
        "dynamo_namespace": "dynamo",
        "model": "qwen/qwen3-8b",
    }
    assert value(rows, "request_duration_seconds_sum", w) == pytest.approx(15542.6)
    assert value(rows, "request_duration_seconds_count", w) == 2222
    assert value(rows, "request_bytes_total", w) == 9_134_722  # the rest passes through
    assert value(rows, "system_uptime_seconds", w) == pytest.approx(8123.4)
    assert value(rows, "kv_cache_usage_ratio", "vllm") == pytest.approx(0.7122)
    assert {e.message.split(":")[0] for e in result.errors if e.kind == "unmapped"} == {
        "python_gc_objects_collected"
    }


def test_families_an_engine_filter_leaves_out_are_counted(engine, clock: FakeClock) -> None:
    src = engine((DATA / "dynamo-vllm-worker.prom").read_text(), engine="vllm")
    result = src.poll()
    assert {r["engine"] for r in rows_of(result)} == {"vllm"}
    found = {e.message.split(":")[0] for e in result.errors if e.kind == "unmapped"}
    assert "dynamo_component_kvstats_active_blocks" in found and "dynamo_component_requests" in found
    assert len(found) == 12  # 11 dynamo_component_* families + python_gc_objects_collected
    clock.advance(10)
    assert src.poll(force=True).errors == []  # once per family per hour
    assert src.health_details() == {"unmapped_families": 12, "duplicate_series": 0}
