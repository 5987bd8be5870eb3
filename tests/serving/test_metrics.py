"""The router's Prometheus histograms carry vLLM's bucket bounds (serving/metrics.py holds the one copy
of them; analytics/external_validation.py's vLLM pages use the same constants)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import VLLM_TTFT_BUCKETS_S, ServingMetrics


def test_router_latency_histograms_use_vllms_ttft_bounds_up_to_80_s() -> None:
    metrics = ServingMetrics("m", lambda: None)
    for hist in (metrics.ttft, metrics.itl, metrics.e2e, metrics.queue):
        hist.labels("m").observe(0.05)
    text = metrics.render().decode()
    bounds: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                bounds.setdefault(fam.name, []).append(float(s.labels["le"]))
    expected = [b for b in VLLM_TTFT_BUCKETS_S if b <= 80.0] + [float("inf")]
    assert len(expected) == 20 and expected[0] == 0.001
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert bounds[name] == expected, name
