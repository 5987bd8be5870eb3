"""PrometheusQuerySource against a real local HTTP server answering like the Prometheus HTTP API."""

from __future__ import annotations

import json

import pytest

from collector.sources import TABLE_ENGINE_METRICS, TABLE_GPU_SAMPLES, Backoff, PrometheusQuerySource
from tests.collector.sources.conftest import FakeClock, LocalServer, closed_port_url

MIB = 1024 * 1024
GPU_LABELS = {
    "gpu": "0",
    "UUID": "GPU-aaaa",
    "device": "nvidia0",
    "modelName": "NVIDIA H100 80GB HBM3",
    "hostname": "node-a",
    "instance": "10.0.0.5:9400",
    "job": "dcgm",
    "pod": "vllm-0",
    "namespace": "llm",
    "container": "vllm",
}


def matrix(series: list[tuple[dict, list[tuple[float, str]]]], warnings: list[str] | None = None) -> tuple:
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": m, "values": [[t, v] for t, v in vals]} for m, vals in series],
        },
    }
    if warnings:
        body["warnings"] = warnings
    return 200, json.dumps(body), "application/json"


def error(status: int = 400, kind: str = "bad_data", msg: str = "parse error") -> tuple:
    return status, json.dumps({"status": "error", "errorType": kind, "error": msg}), "application/json"


def dcgm_series(ts: list[float]) -> list:
    return [
        (
            {"__name__": "DCGM_FI_DEV_POWER_USAGE", **GPU_LABELS},
            [(t, f"{300 + i}.5") for i, t in enumerate(ts)],
        ),
        ({"__name__": "DCGM_FI_PROF_SM_ACTIVE", **GPU_LABELS}, [(t, "0.25") for t in ts]),
        ({"__name__": "DCGM_FI_DEV_FB_USED", **GPU_LABELS}, [(t, "1000") for t in ts]),
        ({"__name__": "DCGM_FI_DEV_FB_FREE", **GPU_LABELS}, [(t, "80000") for t in ts]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **GPU_LABELS}, [(t, "9223372036854775794") for t in ts]),
    ]


class FakeProm:
    """Routes /api/v1/query_range by query, remembering the windows asked for."""

    def __init__(self, server: LocalServer) -> None:
        self.calls: list[dict] = []
        self.dcgm = lambda q: matrix(dcgm_series([945.0, 960.0, 975.0]))
        self.engine = lambda q: matrix([])
        server.routes["/api/v1/query_range"] = self
        server.routes["/api/v1/query"] = matrix([])
        self.url = server.url

    def __call__(self, q: dict) -> tuple:
        self.calls.append({k: v[0] for k, v in q.items()})
        return self.dcgm(q) if "DCGM_FI_" in q["query"][0] else self.engine(q)


@pytest.fixture
def prom(http_server: LocalServer) -> FakeProm:
    return FakeProm(http_server)


def source(prom: FakeProm, clock: FakeClock, **kw) -> PrometheusQuerySource:
    kw.setdefault("step_s", 15.0)
    kw.setdefault("lookback_s", 60.0)
    return PrometheusQuerySource(prom.url, clock=clock, **kw)


def test_dcgm_series_become_one_row_per_gpu_per_timestamp(prom: FakeProm, clock: FakeClock) -> None:
    src = source(prom, clock)
    assert src.available()
    result = src.poll()
    assert result.ok and result.errors == [], result.errors
    rows = result.table_rows(TABLE_GPU_SAMPLES)
    assert [r["ts_s"] for r in rows] == [945.0, 960.0, 975.0]
    r = rows[0]
    assert r["source"] == f"prometheus:{prom.url}"
    assert (r["node"], r["device"], r["uuid"], r["name"]) == (
        "node-a",
        "cuda:0",
        "GPU-aaaa",
        "NVIDIA H100 80GB HBM3",
    )
    assert (r["k8s_pod"], r["k8s_namespace"], r["k8s_container"]) == ("vllm-0", "llm", "vllm")
    assert [x["power_w"] for x in rows] == [300.5, 301.5, 302.5]
    assert r["sm_active_pct"] == 25.0
    assert r["mem_used_bytes"] == 1000 * MIB and r["mem_total_bytes"] == 81_000 * MIB
    assert r["temperature_c"] is None  # blank sentinel
    assert (r["kind"], r["emulated"]) == ("cuda", False)
    # Window: lookback 60 s from t=1000, aligned to the 15 s step.
    dcgm_call = next(c for c in prom.calls if "DCGM_FI_" in c["query"])
    assert (float(dcgm_call["start"]), float(dcgm_call["end"]), float(dcgm_call["step"])) == (
        945.0,
        990.0,
        15.0,
    )


def test_windows_follow_on_and_catch_up(prom: FakeProm, clock: FakeClock) -> None:
    src = source(prom, clock, max_points=3, engines=False)
    assert src.window(1_000.0) == (945.0, 975.0)  # 4 steps due, 3 per poll
    src.poll()
    clock.t = 1_031.0
    assert src.window(clock.t) == (990.0, 1_020.0)
    src.poll(force=True)
    assert src.window(clock.t) is None  # nothing new yet
    assert src.poll(force=True).ok
    assert [float(c["start"]) for c in prom.calls] == [945.0, 990.0]


def test_rows_already_read_are_not_repeated(prom: FakeProm, clock: FakeClock) -> None:
    src = source(prom, clock, engines=False)
    assert len(src.poll().table_rows(TABLE_GPU_SAMPLES)) == 3
    clock.advance(15)  # the fake server answers the same three points again
    assert src.poll().table_rows(TABLE_GPU_SAMPLES) == []


def test_node_falls_back_to_instance_host(prom: FakeProm, clock: FakeClock) -> None:
    labels = {k: v for k, v in GPU_LABELS.items() if k != "hostname"}
    prom.dcgm = lambda q: matrix([({"__name__": "DCGM_FI_DEV_POWER_USAGE", **labels}, [(960.0, "100")])])
    (row,) = source(prom, clock, engines=False).poll().table_rows(TABLE_GPU_SAMPLES)
    assert row["node"] == "10.0.0.5"


def test_one_query_rejected_is_partial_and_degraded(prom: FakeProm, clock: FakeClock) -> None:
    prom.engine = lambda q: error(422, "execution", "query processing would load too many samples")
    src = source(prom, clock)
    result = src.poll()
    assert result.ok
    assert result.error_count("query_error") == 1
    assert "too many samples" in result.errors[0].message
    assert len(result.table_rows(TABLE_GPU_SAMPLES)) == 3
    assert src.health().status == "degraded"


def test_every_query_rejected_is_down_with_backoff(prom: FakeProm, clock: FakeClock) -> None:
    prom.dcgm = prom.engine = lambda q: error(503, "unavailable", "TSDB not ready")
    src = source(prom, clock, backoff=Backoff(base_s=3, jitter=0.0))
    result = src.poll()
    assert not result.ok and result.errors[0].kind == "query_error"
    assert "TSDB not ready" in result.errors[0].message
    h = src.health()
    assert (h.status, h.next_attempt_s) == ("down", 1_003.0)


def test_warnings_bad_values_and_bad_series_are_counted(prom: FakeProm, clock: FakeClock) -> None:
    series = dcgm_series([960.0])
    series.append(({"__name__": "DCGM_FI_DEV_GPU_UTIL", **GPU_LABELS}, [(960.0, "abc"), (975.0, "50")]))
    body = json.loads(matrix(series, warnings=["partial response: store 10.0.0.9 unreachable"])[1])
    body["data"]["result"].append({"values": [[960.0, "1"]]})  # no metric
    prom.dcgm = lambda q: (200, json.dumps(body), "application/json")
    result = source(prom, clock, engines=False).poll()
    assert result.ok
    assert result.error_count("partial_data") == 1
    assert result.error_count("non_numeric") == 1
    assert result.error_count("bad_response") == 1
    rows = result.table_rows(TABLE_GPU_SAMPLES)
    assert [(r["ts_s"], r["gpu_util_pct"]) for r in rows] == [(960.0, None), (975.0, 50.0)]


def test_not_a_matrix_is_counted(prom: FakeProm, clock: FakeClock) -> None:
    prom.engine = lambda q: (
        200,
        json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}),
        "application/json",
    )
    result = source(prom, clock).poll()
    assert result.ok and result.error_count("bad_response") == 1


def test_engine_series_become_engine_rows_with_deltas(prom: FakeProm, clock: FakeClock) -> None:
    inst = {"instance": "10.0.0.7:8000", "job": "vllm", "model_name": "m"}
    prom.engine = lambda q: matrix(
        [
            (
                {"__name__": "vllm:prompt_tokens_total", **inst},
                [(945.0, "100"), (960.0, "400"), (975.0, "40")],
            ),
            ({"__name__": "vllm:time_to_first_token_seconds_sum", **inst}, [(945.0, "1"), (960.0, "4")]),
            ({"__name__": "vllm:time_to_first_token_seconds_count", **inst}, [(945.0, "10"), (960.0, "20")]),
            ({"__name__": "vllm:num_requests_running", **inst}, [(945.0, "4")]),
            (
                {"__name__": "sglang:token_usage", "instance": "10.0.0.8:30000", "job": "sglang"},
                [(945.0, "0.5")],
            ),
        ]
    )
    src = source(prom, clock, dcgm=False)
    result = src.poll()
    assert result.ok, result.errors
    rows = result.table_rows(TABLE_ENGINE_METRICS)

    def at(ts: float, metric: str) -> float:
        (r,) = [
            r for r in rows if r["ts_s"] == ts and r["metric"] == metric and r["endpoint"] == "10.0.0.7:8000"
        ]
        return r["value"]

    assert at(945.0, "prompt_tokens_total") == 100
    assert at(960.0, "prompt_tokens_per_s") == pytest.approx(20.0)
    assert at(975.0, "prompt_tokens_per_s") == pytest.approx(40 / 15)  # counter reset
    assert at(960.0, "ttft_seconds_mean") == pytest.approx(0.3)
    assert at(945.0, "requests_running") == 4
    r = next(r for r in rows if r["metric"] == "requests_running")
    assert (r["node"], r["engine"], r["labels"]) == ("10.0.0.7", "vllm", {"model_name": "m"})
    (sg,) = [r for r in rows if r["engine"] == "sglang"]
    assert (sg["metric"], sg["value"], sg["endpoint"]) == ("kv_cache_usage_ratio", 0.5, "10.0.0.8:30000")
    assert result.error_count("counter_reset") == 1


def test_unreachable_server_is_down(clock: FakeClock) -> None:
    src = PrometheusQuerySource(closed_port_url(""), clock=clock, backoff=Backoff(base_s=1, jitter=0.0))
    assert src.available() is False
    result = src.poll()
    assert not result.ok and result.errors[0].kind == "unreachable"
    assert src.health().status == "down"
    src.close()
