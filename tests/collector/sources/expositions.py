"""Engine /metrics expositions written the way vLLM, SGLang and the Dynamo frontend write them."""

from __future__ import annotations

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_BUCKETS = ("0.01", "0.1", "1.0", "10.0", "+Inf")


def _lbl(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def gauge(name: str, labels: dict[str, str], value: float) -> str:
    return f"# HELP {name} g\n# TYPE {name} gauge\n{name}{{{_lbl(labels)}}} {value}\n"


def counter(name: str, labels: dict[str, str], value: float, created: bool = True) -> str:
    out = f"# HELP {name}_total c\n# TYPE {name}_total counter\n{name}_total{{{_lbl(labels)}}} {value}\n"
    if created:  # prometheus_client writes a _created gauge next to every counter
        out += (
            f"# HELP {name}_created c\n# TYPE {name}_created gauge\n{name}_created{{{_lbl(labels)}}} 1.7e9\n"
        )
    return out


def histogram(name: str, labels: dict[str, str], total: float, count: float) -> str:
    out = f"# HELP {name} h\n# TYPE {name} histogram\n"
    for i, le in enumerate(_BUCKETS):  # made-up but cumulative bucket counts ending at count
        n = count if le == "+Inf" else round(count * (i + 1) / (len(_BUCKETS) + 1))
        out += f"{name}_bucket{{{_lbl({'le': le, **labels})}}} {n}\n"
    out += f"{name}_count{{{_lbl(labels)}}} {count}\n{name}_sum{{{_lbl(labels)}}} {total}\n"
    return out


def vllm(
    *,
    prompt: float,
    gen: float,
    ttft: tuple[float, float],
    itl: tuple[float, float],
    e2e: tuple[float, float],
    finished: float,
    running: float = 3,
    waiting: float = 1,
    kv: float = 0.25,
) -> str:
    lab = {"engine": "0", "model_name": MODEL}
    return (
        "# HELP python_gc_objects_collected_total Objects collected during gc\n"
        "# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 12345.0\n'
        + gauge("vllm:num_requests_running", lab, running)
        + gauge("vllm:num_requests_waiting", lab, waiting)
        + gauge("vllm:kv_cache_usage_perc", lab, kv)
        + counter("vllm:prompt_tokens", lab, prompt)
        + counter("vllm:generation_tokens", lab, gen)
        + counter("vllm:request_success", {**lab, "finished_reason": "stop"}, finished)
        + histogram("vllm:time_to_first_token_seconds", lab, *ttft)
        + histogram("vllm:inter_token_latency_seconds", lab, *itl)
        # The deprecated name of the same histogram, still exported by some versions: must not double.
        + histogram("vllm:time_per_output_token_seconds", lab, itl[0] * 100, itl[1])
        + histogram("vllm:e2e_request_latency_seconds", lab, *e2e)
    )


def sglang(*, prompt: float, gen: float, ttft: tuple[float, float], tpot: tuple[float, float]) -> str:
    lab = {"model_name": MODEL, "tp_rank": "0"}
    return (
        counter("sglang:prompt_tokens", lab, prompt, created=False)
        + counter("sglang:generation_tokens", lab, gen, created=False)
        + counter("sglang:num_requests", lab, 40, created=False)
        + gauge("sglang:token_usage", lab, 0.28)
        + gauge("sglang:cache_hit_rate", lab, 0.0075)
        + gauge("sglang:num_running_reqs", lab, 5)
        + gauge("sglang:num_queue_reqs", lab, 2)
        + histogram("sglang:time_to_first_token_seconds", lab, *ttft)
        + histogram("sglang:time_per_output_token_seconds", lab, *tpot)
        + histogram("sglang:e2e_request_latency_seconds", lab, 12.0, 4)
    )


def dynamo(*, isl: tuple[float, float], osl: tuple[float, float], ttft: tuple[float, float]) -> str:
    lab = {"model": "qwen/qwen3-0.6b"}
    req = {**lab, "endpoint": "chat_completions", "request_type": "stream", "status": "success"}
    return (
        counter("dynamo_frontend_requests", req, isl[1], created=False)
        + gauge("dynamo_frontend_inflight_requests", lab, 7)
        + gauge("dynamo_frontend_queued_requests", lab, 0)
        + histogram("dynamo_frontend_time_to_first_token_seconds", lab, *ttft)
        + histogram("dynamo_frontend_inter_token_latency_seconds", lab, 0.5, 100)
        + histogram("dynamo_frontend_request_duration_seconds", lab, 20.0, isl[1])
        + histogram("dynamo_frontend_input_sequence_tokens", lab, *isl)
        + histogram("dynamo_frontend_output_sequence_tokens", lab, *osl)
        + gauge("dynamo_component_inflight_requests", {"dynamo_component": "backend"}, 7)
    )
