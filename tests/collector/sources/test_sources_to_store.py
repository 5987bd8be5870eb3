"""Every source's real output through the real Store, by the collector's own write path.

No hand-built rows: each source polls a real endpoint (a real dcgm-exporter scrape, vLLM/LMCache and
Dynamo captures served over HTTP, a real Prometheus, the scripted fake NVML standing in for a GPU,
the real serving stack) and :meth:`Collector.write_results` stores the poll results as the writer
thread does. Each table must then hold the rows, with no ``store_rejected`` in ``ingest_errors``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.service import Collector, CollectorSettings
from collector.sources import (
    TABLE_ENGINE_METRICS,
    TABLE_GPU_SAMPLES,
    DcgmSource,
    EngineScrapeSource,
    PrometheusQuerySource,
    Source,
    SourceResult,
)
from collector.sources.local_gpus import LocalGpuSource
from collector.sources.serving_stack import ServingDevicesSource, ServingTelemetrySource
from collector.store import Store
from serving.devices import nvml as nvml_module
from tests.collector.sources.conftest import DATA, L4_PROM, FakeClock, LocalServer
from tests.collector.sources.test_prometheus_server import PROMETHEUS, RealProm, real_prom  # noqa: F401
from tests.serving.devices.fake_nvml import FakeGpu, FakeNvml

NODE = "node-1"
Ingest = Callable[..., list[SourceResult]]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "phaselens.duckdb")
    yield s
    s.close()


@pytest.fixture
def ingest(store: Store) -> Iterator[Ingest]:
    """``ingest(source, polls=1, between=callable)``: poll and store through the collector's writer path."""
    made: list[Collector] = []

    def run(source: Source, polls: int = 1, between: Callable[[], None] | None = None) -> list[SourceResult]:
        settings = CollectorSettings(db_path=str(store.path), node=NODE, nvml=False)
        collector = Collector(settings, store, sources=[source])
        made.append(collector)
        results = []
        for i in range(polls):
            if i and between is not None:
                between()
            result = source.poll(force=True)
            assert result.ok, result.errors
            results.append(result)
            collector.write_results([result])
        return results

    yield run
    for c in made:
        for s in c.sources:
            s.close()


def count(store: Store, sql: str, params: list | None = None) -> int:
    return int(store.query(sql, params or []).iloc[0, 0])


def assert_stored_without_rejection(store: Store, source: Source, results: list[SourceResult]) -> None:
    """Every row the source produced is in its table; nothing was rejected; the source is healthy."""
    produced: dict[str, int] = {}
    for r in results:
        for table in {*r.rows, *r.columns}:
            produced[table] = produced.get(table, 0) + len(r.table_rows(table))
    assert produced and all(produced.values()), produced
    rejected = store.query("SELECT * FROM ingest_errors WHERE kind = 'store_rejected'")
    assert rejected.empty, rejected.to_dict("records")
    if TABLE_GPU_SAMPLES in produced:
        n = count(store, "SELECT count(*) FROM gpu_samples WHERE source = ?", [source.name])
        assert n == produced[TABLE_GPU_SAMPLES]
    if TABLE_ENGINE_METRICS in produced:
        endpoints = sorted({row["endpoint"] for r in results for row in r.table_rows(TABLE_ENGINE_METRICS)})
        n = count(store, "SELECT count(*) FROM engine_metrics WHERE list_contains(?, endpoint)", [endpoints])
        assert n == produced[TABLE_ENGINE_METRICS]
    h = source.health()
    assert h.status == "ok" and h.store_rejected_rows == 0, h


def test_dcgm_l4_scrape_lands_in_gpu_samples(
    store: Store, ingest: Ingest, http_server: LocalServer, clock: FakeClock
) -> None:
    src = DcgmSource(http_server.serve_text("/metrics", L4_PROM), node=NODE, clock=clock)
    results = ingest(src)
    assert_stored_without_rejection(store, src, results)
    row = store.query("SELECT * FROM gpu_samples_full").to_dict("records")[0]
    assert (row["node"], row["exporter_hostname"], row["uuid"]) == (
        NODE,
        "i-030791dc5a37cd257",
        "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
    )
    assert row["power_w"] == pytest.approx(16.365) and row["gr_engine_active_pct"] == 0.0
    unmapped = store.query("SELECT message, count FROM ingest_errors WHERE kind = 'unmapped'")
    assert len(unmapped) == 8 and set(unmapped["count"]) == {1}  # one row per DCGM field left out
    assert any(m.startswith("DCGM_FI_DEV_DEC_UTIL:") for m in unmapped["message"])


def test_dcgm_mig_scrape_lands_with_instances_and_power_once(
    store: Store, ingest: Ingest, http_server: LocalServer, clock: FakeClock
) -> None:
    body = (DATA / "dcgm-exporter-a30-mig.prom").read_text()
    src = DcgmSource(http_server.serve_text("/metrics", body), node=NODE, clock=clock)
    assert_stored_without_rejection(store, src, ingest(src))
    per_gpu = store.query(
        "SELECT coalesce(parent_uuid, uuid) AS gpu, sum(power_w) AS w, count(*) AS n FROM gpu_samples_full "
        "GROUP BY 1"
    ).to_dict("records")
    assert len(per_gpu) == 1 and per_gpu[0]["n"] == 4 and per_gpu[0]["w"] == pytest.approx(70.37)


def test_engine_metrics_from_vllm_lmcache_and_dynamo_worker_captures(
    store: Store, ingest: Ingest, http_server: LocalServer, clock: FakeClock
) -> None:
    for path in ("vllm-lmcache.prom", "dynamo-vllm-worker.prom"):
        url = http_server.serve_text(f"/{path}", (DATA / path).read_text())
        src = EngineScrapeSource(url, clock=clock)
        results = ingest(src, polls=2, between=lambda: clock.advance(5.0))
        assert_stored_without_rejection(store, src, results)
    engines = store.query("SELECT engine, count(*) AS n FROM engine_metrics GROUP BY 1 ORDER BY 1")
    assert engines["engine"].tolist() == ["dynamo_worker", "lmcache", "vllm"]
    cap = store.query(
        "SELECT value, labels->>'dynamo_component' AS component FROM engine_metrics "
        "WHERE metric = 'kv_blocks_total' AND engine = 'dynamo_worker'"
    ).to_dict("records")
    assert cap == [{"value": 4381.0, "component": "backend"}] * 2  # labels are a JSON object, not a string
    assert count(store, "SELECT count(*) FROM engine_metrics WHERE json_type(labels) <> 'OBJECT'") == 0
    rates = count(store, "SELECT count(*) FROM engine_metrics WHERE metric LIKE '%\\_per\\_s' ESCAPE '\\'")
    assert rates > 0  # the second scrape's per-interval rows are stored too


def test_local_nvml_samples_land_in_gpu_samples(
    store: Store, ingest: Ingest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvml_module, "_import_pynvml", lambda: FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-two")]))
    src = LocalGpuSource(node=NODE)
    assert_stored_without_rejection(store, src, ingest(src, polls=3))
    assert count(store, "SELECT count(DISTINCT device) FROM gpu_samples") == 2


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not found")
def test_prometheus_query_path_lands_gpu_and_engine_rows(
    store: Store,
    ingest: Ingest,
    real_prom: RealProm,  # noqa: F811
) -> None:
    src = PrometheusQuerySource(real_prom.url, step_s=1.0, lookback_s=30.0)
    results = ingest(src)
    assert_stored_without_rejection(store, src, results)
    assert count(store, "SELECT count(*) FROM engine_metrics WHERE engine = 'vllm'") > 0
    assert count(store, "SELECT count(*) FROM gpu_samples WHERE power_w IS NOT NULL") > 0


@pytest.mark.slow
def test_serving_stack_telemetry_and_devices_land(store: Store, ingest: Ingest) -> None:
    from serving.loadgen import run_load
    from serving.trace import poisson_trace
    from tests.serving.conftest import start_server, stop_server

    server = start_server("--mode", "aggregated", "--device", "emulated:h100-sxm")
    try:
        report = run_load(
            server.url, poisson_trace(20, 4, prompt_tokens=32, output_tokens=8, seed=1), progress=False
        )
        assert report.n_ok == 4
        telemetry = ServingTelemetrySource(server.url, node=NODE)
        devices = ServingDevicesSource(server.url, node=NODE)
        # the workers' last telemetry batches reach the router's ring a moment after the load (a fixed
        # 1 s wait was not always enough on a loaded host): read on until the 4 requests are stored
        deadline = time.monotonic() + 60
        read = {telemetry: ingest(telemetry), devices: ingest(devices)}
        while count(store, "SELECT count(*) FROM requests") < 4 or not count(
            store, "SELECT count(*) FROM iterations"
        ):
            assert time.monotonic() < deadline, "the 4 requests' telemetry did not reach the router in 60 s"
            time.sleep(0.1)
            read[telemetry] += ingest(telemetry)
        rejected = store.query("SELECT * FROM ingest_errors WHERE kind = 'store_rejected'")
        assert rejected.empty, rejected.to_dict("records")
        for src, results in read.items():
            assert src.health().status == "ok" and sum(r.n_rows for r in results) > 0
    finally:
        stop_server(server)
    assert count(store, "SELECT count(*) FROM requests") == 4
    assert count(store, "SELECT count(*) FROM iterations") > 0
    assert count(store, "SELECT count(*) FROM gpu_samples_full WHERE emulated") > 0


class _BrokenSource(Source):
    """A source with a bug: its rows carry a column the table does not have (as engine rows once did)."""

    def _discover(self) -> bool:
        return True

    def _collect(self, now_s: float, result: SourceResult) -> None:
        result.add_rows(
            TABLE_ENGINE_METRICS,
            [
                {
                    "node": NODE,
                    "endpoint": "e",
                    "ts_s": now_s,
                    "metric": "m",
                    "labels": {},
                    "value": 1.0,
                    "worker": "w0",
                }
            ],
        )


def test_store_rejections_are_the_sources_errors_and_make_health_degraded(
    store: Store, clock: FakeClock
) -> None:
    src = _BrokenSource("broken", clock=clock)
    collector = Collector(
        CollectorSettings(db_path=str(store.path), node=NODE, nvml=False), store, sources=[src]
    )
    collector.write_results([src.poll(force=True)])
    h = src.health()
    assert (h.status, h.errors_total, h.store_rejected_rows) == ("degraded", 1, 1)
    assert h.last_error.startswith("store_rejected:") and "worker" in h.last_error
    health = collector.health()
    assert health["status"] == "degraded"
    assert health["sources"][0]["store_rejected_rows"] == 1
    rejected = store.query("SELECT source, count FROM ingest_errors WHERE kind = 'store_rejected'")
    assert rejected.to_dict("records") == [{"source": "broken", "count": 1}]
    # The next poll succeeds, but its rows are refused again: the source stays degraded.
    clock.advance(1.0)
    collector.write_results([src.poll(force=True)])
    assert src.health().status == "degraded" and src.health().errors_total == 2
    # A minute after the last refusal (no rows refused since), a clean poll reads ok again.
    clock.advance(61.0)
    src.poll(force=True)
    assert src.health().status == "ok"
