"""The real stack over HTTP: router + worker processes, aggregated and disaggregated."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import openai
import pytest

from serving.telemetry import TelemetryReader
from tests.serving.conftest import Server

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "phaselens measures prefill and decode", "a", "0123456789" * 8]


def complete(url: str, prompt: str, max_tokens: int = 12, **extra: object) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0} | extra
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def read_telemetry(url: str) -> list[dict]:
    reader = TelemetryReader()
    events: list[dict] = []
    while True:
        payload = httpx.get(f"{url}/v1/telemetry", params={"after": reader.query_param()}, timeout=30).json()
        batches = reader.accept(payload)
        if not batches:
            return events
        events += [e for b in batches for e in b["events"]]


async def stream_one(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict:
    """Stream a completion; return the text, chunk count and error (if the stream carried one)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    out = {"text": "", "chunks": 0, "error": None, "done": False}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]["message"]
                continue
            out["chunks"] += 1
            out["text"] += obj["choices"][0]["text"]
    return out


async def stream_many(url: str, n: int, max_tokens: int) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        return await asyncio.gather(*(stream_one(client, f"request {i} " * 4, max_tokens) for i in range(n)))


def test_completion_and_stream(aggregated_server: Server) -> None:
    url = aggregated_server.url
    body = complete(url, "Hello", max_tokens=10, ignore_eos=True)
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 10, "total_tokens": 16}
    assert body["choices"][0]["finish_reason"] == "length"
    streamed = asyncio.run(stream_many(url, 1, 10))[0]
    assert streamed["done"] and streamed["error"] is None
    assert streamed["chunks"] == 10


def test_openai_client(aggregated_server: Server) -> None:
    client = openai.OpenAI(base_url=f"{aggregated_server.url}/v1", api_key="unused")
    model = client.models.list().data[0].id
    assert model == "tiny"
    c = client.completions.create(model=model, prompt="Say hi", max_tokens=5, temperature=0)
    assert c.usage.completion_tokens <= 5 and c.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(chunks) - 1
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"prompt": "x" * 600, "max_tokens": 8}, "exceeds the model's context of 512"),
        ({"prompt": "hi", "max_tokens": 0}, "'max_tokens' must be at least 1"),
        ({"prompt": "hi", "max_tokens": 10_000}, "exceeds the model's context"),
        ({"prompt": "hi", "max_tokens": "ten"}, "'max_tokens' must be an integer"),
        ({"model": "llama-9000", "prompt": "hi"}, "model 'llama-9000' does not exist"),
        ({"max_tokens": 3}, "'prompt' must be a string"),
        ({"prompt": [1, 2, 99999]}, "outside the vocabulary"),
        ({"prompt": "hi", "temperature": -1}, "temperature must be >= 0"),
    ],
)
def test_bad_input_is_400(aggregated_server: Server, body: dict, needle: str) -> None:
    r = httpx.post(f"{aggregated_server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_malformed_body_is_400(aggregated_server: Server) -> None:
    r = httpx.post(
        f"{aggregated_server.url}/v1/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert httpx.get(f"{aggregated_server.url}/health").status_code == 200


def test_metrics_use_vllm_names(aggregated_server: Server) -> None:
    complete(aggregated_server.url, "metrics please", max_tokens=4, ignore_eos=True)
    text = httpx.get(f"{aggregated_server.url}/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert name in text, name
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    gen = families["vllm:generation_tokens"].samples
    assert sum(s.value for s in gen if s.name.endswith("_total")) >= 4


def test_aggregated_telemetry(aggregated_server: Server) -> None:
    complete(aggregated_server.url, "telemetry", max_tokens=7, ignore_eos=True)
    events = read_telemetry(aggregated_server.url)
    requests = [e for e in events if e["type"] == "request" and e["output_tokens"] == 7]
    assert requests, "the request event is published"
    req = requests[-1]
    assert len(req["token_ts_s"]) == 7 and req["token_ts_s"] == sorted(req["token_ts_s"])
    assert req["arrival_s"] <= req["prefill_start_s"] <= req["prefill_end_s"] == req["first_token_s"]
    assert req["prefill_worker"] == req["decode_worker"] and req["kv_transfer_bytes"] is None
    iterations = [e for e in events if e["type"] == "iteration"]
    assert {"prefill", "decode"} <= {e["phase"] for e in iterations}
    assert all(e["end_s"] >= e["start_s"] for e in iterations)


def test_control_api_needs_token(aggregated_server: Server) -> None:
    url = aggregated_server.url
    assert httpx.get(f"{url}/control/layout").status_code == 401
    assert httpx.get(f"{url}/control/layout", headers={"Authorization": "Bearer wrong"}).status_code == 401
    layout = aggregated_server.layout()
    assert layout["mode"] == "aggregated"
    assert [w["role"] for w in layout["workers"]] == ["mixed", "mixed"]


def test_cpu_device_knobs_are_not_supported(aggregated_server: Server) -> None:
    with aggregated_server.control() as c:
        knobs = c.get("/control/workers/worker-0/device").json()
        assert knobs["device"] == "cpu" and knobs["power_limit_w"] is None
        r = c.post("/control/workers/worker-0/device", json={"power_limit_w": 300})
        assert r.status_code == 501 and "does not support" in r.json()["error"]["message"]
        r = c.post("/control/workers/worker-0/device", json={"fan_speed": 3})
        assert r.status_code == 400 and "allowed" in r.json()["error"]["message"]
        assert c.get("/control/workers/worker-9/device").status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "body", "param", "needle"),
    [
        ("POST", "/control/workers", {"role": 5}, "role", "unknown role 5"),
        ("POST", "/control/workers", {"role": "mixed", "device": 5}, "device", "'device' must be a string"),
        ("POST", "/control/workers", {"role": "mixed", "colour": 1}, None, "unknown field(s) ['colour']"),
        ("POST", "/control/workers", b"[1, 2]", None, "must be a JSON object"),
        ("POST", "/control/workers/worker-0/role", {"role": ["decode"]}, "role", "unknown role"),
        (
            "POST",
            "/control/workers/worker-0/role",
            {"role": "decode", "force": "yes"},
            "force",
            "true or false",
        ),
        (
            "POST",
            "/control/workers/worker-0/role",
            {"role": "decode", "timeout_s": -1},
            "timeout_s",
            "(0, 3600]",
        ),
        (
            "POST",
            "/control/workers/worker-0/role",
            {"role": "decode", "timeout_s": None},
            "timeout_s",
            "seconds",
        ),
        (
            "POST",
            "/control/workers/worker-0/device",
            {"power_limit_w": "300"},
            "power_limit_w",
            "finite number",
        ),
        ("POST", "/control/workers/worker-0/device", b'{"power_limit_w": NaN}', "power_limit_w", "finite"),
        (
            "POST",
            "/control/workers/worker-0/device",
            b'{"sm_clock_min_mhz": 1e400, "sm_clock_max_mhz": 2}',
            "sm_clock_min_mhz",
            "finite number",
        ),
        (
            "POST",
            "/control/workers/worker-0/device",
            {"sm_clock_min_mhz": 1.5, "sm_clock_max_mhz": 2},
            "sm_clock_min_mhz",
            "whole number",
        ),
        ("POST", "/control/workers/worker-0/device", {"reset": "yes"}, "reset", "true or false"),
        ("DELETE", "/control/workers/worker-0?timeout_s=abc", None, "timeout_s", "number of seconds"),
        ("DELETE", "/control/workers/worker-0?timeout_s=inf", None, "timeout_s", "number of seconds"),
        ("DELETE", "/control/workers/worker-0?force=maybe", None, "force", "true or false"),
        ("DELETE", "/control/workers/worker-0?colour=1", None, None, "unknown query parameter(s) ['colour']"),
    ],
)
def test_control_api_bad_values_are_json_400_naming_the_field(
    aggregated_server: Server, method: str, path: str, body: object, param: str | None, needle: str
) -> None:
    with aggregated_server.control() as c:
        if isinstance(body, bytes):
            r = c.request(method, path, content=body, headers={"content-type": "application/json"})
        else:
            r = c.request(method, path, json=body)
    assert r.status_code == 400, r.text
    detail = r.json()["error"]
    assert needle in detail["message"] and detail["param"] == param, detail
    assert len(aggregated_server.layout()["workers"]) == 2  # nothing changed


def test_disaggregated_greedy_equals_aggregated(
    aggregated_server: Server, disaggregated_server: Server
) -> None:
    for prompt in PROMPTS:
        agg = complete(aggregated_server.url, prompt, max_tokens=16, ignore_eos=True, return_token_ids=True)
        dis = complete(
            disaggregated_server.url, prompt, max_tokens=16, ignore_eos=True, return_token_ids=True
        )
        assert len(agg["choices"][0]["token_ids"]) == 16
        assert dis["choices"][0]["token_ids"] == agg["choices"][0]["token_ids"], prompt
        assert dis["choices"][0]["text"] == agg["choices"][0]["text"], prompt
        assert dis["usage"] == agg["usage"]
    events = read_telemetry(disaggregated_server.url)
    reqs = [e for e in events if e["type"] == "request"]
    assert len(reqs) >= len(PROMPTS)
    for e in reqs:
        assert e["prefill_worker"] == "worker-0" and e["decode_worker"] == "worker-1"
        # bytes = 2 (K,V) x layers x prompt tokens x kv heads x head dim x 4 (fp32)
        assert e["kv_transfer_bytes"] == 2 * 4 * e["prompt_tokens"] * 4 * 32 * 4
        assert e["prefill_end_s"] <= e["kv_transfer_start_s"] <= e["kv_transfer_end_s"]
    text = httpx.get(f"{disaggregated_server.url}/metrics").text
    assert "phaselens:kv_transfer_bytes_total" in text


def test_role_change_and_scaling_without_dropping_requests() -> None:
    from tests.serving.conftest import start_server, stop_server

    server = start_server("--mode", "disaggregated", "--prefill-workers", "1", "--decode-workers", "2")
    try:

        async def scenario() -> tuple[list[dict], httpx.Response, httpx.Response]:
            load = asyncio.create_task(stream_many(server.url, 6, 300))
            headers = {"Authorization": "Bearer test-token"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as c:
                # wait (a loaded host prefills slowly) until requests are in flight on worker-2
                deadline = time.monotonic() + 60
                while True:
                    before = (await c.get("/control/layout")).json()["workers"]
                    if before[2]["inflight"] > 0 or time.monotonic() > deadline or load.done():
                        break
                    await asyncio.sleep(0.1)
                assert before[2]["inflight"] > 0, "the drained worker had requests in flight"
                role = await c.post("/control/workers/worker-2/role", json={"role": "prefill"})
                added = await c.post("/control/workers", json={"role": "decode"})
            return await load, role, added

        results, role, added = asyncio.run(scenario())
        assert role.status_code == 200, role.text
        assert added.status_code == 201, added.text
        assert all(r["done"] and r["error"] is None and r["chunks"] == 300 for r in results)
        roles = sorted(w["role"] for w in server.layout()["workers"])
        assert roles == ["decode", "decode", "prefill", "prefill"]
        with server.control() as c:
            removed = c.delete("/control/workers/worker-1")
            assert removed.status_code == 200
        assert [w["id"] for w in server.layout()["workers"]] == ["worker-0", "worker-2", "worker-3"]
        after = asyncio.run(stream_many(server.url, 3, 8))
        assert all(r["done"] and r["error"] is None for r in after)
        controls = [e for e in read_telemetry(server.url) if e["type"] == "control"]
        actions = [e["action"] for e in controls]
        assert {"set_role", "add_worker", "remove_worker"} <= set(actions)
        set_role = next(e for e in controls if e["action"] == "set_role")
        assert set_role["before"]["role"] == "decode" and set_role["after"]["role"] == "prefill"
    finally:
        stop_server(server)


def test_killed_worker_fails_only_its_requests() -> None:
    import os
    import signal

    from tests.serving.conftest import start_server, stop_server

    max_tokens = 400
    server = start_server("--mode", "aggregated", "--workers", "2")
    try:
        victim = server.layout()["workers"][0]

        async def scenario() -> list[dict]:
            load = asyncio.create_task(stream_many(server.url, 6, max_tokens))
            headers = {"Authorization": "Bearer test-token"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as c:
                for _ in range(200):  # until the victim is decoding some of the requests
                    await asyncio.sleep(0.1)
                    workers = (await c.get("/control/layout")).json()["workers"]
                    if workers[0]["inflight"] and workers[0]["stats"].get("running"):
                        break
            # Frozen mid-decode, its requests cannot finish before the kill, however fast this host
            # decodes; the other worker's go on meanwhile.
            os.kill(victim["pid"], signal.SIGSTOP)
            await asyncio.sleep(0.5)
            os.kill(victim["pid"], signal.SIGKILL)
            return await load

        results = asyncio.run(scenario())
        failed = [r for r in results if r["error"]]
        ok = [r for r in results if r["error"] is None]
        assert failed and ok, results
        assert all("died" in r["error"] for r in failed)
        assert all(r["chunks"] == max_tokens for r in ok)
        workers = {w["id"]: w for w in server.layout()["workers"]}
        assert workers[victim["id"]]["last_death"]["exitcode"] == -9  # dead, or already restarting
        assert complete(server.url, "still serving", max_tokens=4)["usage"]["completion_tokens"] >= 1
        assert "phaselens:worker_deaths_total 1.0" in httpx.get(f"{server.url}/metrics").text
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "llama-9"], "allowed: tiny, llama-3.2-1b, llama-3.1-8b, llama-3.1-70b"),
        (["--device", "cuda", "--workers", "2"], "2 workers asked for cuda:0, cuda:1 but no GPU was found"),
        (["--device", "tpu"], "expected 'cpu', 'cuda', 'cuda:N' or 'emulated:<gpu>'"),
        (["--workers", "0"], "number of workers must be >= 1"),
        (
            ["--mode", "disaggregated", "--workers", "2"],
            "--workers applies to --mode aggregated; use --prefill-workers and --decode-workers",
        ),
        (
            ["--decode-workers", "2"],
            "--decode-workers apply to --mode disaggregated; use --workers with --mode aggregated",
        ),
        (["--restart-delay-s", "0"], "restart delay must be a number of seconds > 0"),
        (
            ["--device-sample-interval-s", "0"],
            "--device-sample-interval-s must be a number of seconds in [0.01, 10], got 0",
        ),
    ],
)
def test_serve_start_errors_are_one_line(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "serving.cli", "serve", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_serve_on_a_used_port_fails_before_starting_workers() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "serving.cli", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=180,  # a hang guard: under load (2 xdist workers beside other work) startup took > 60 s
        )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"phaselens serve: error: port {port} on 127.0.0.1 is in use"], proc.stderr


# -- sampling parameters, stop strings and stop ids through the real stack ----------------------------


def _first_stop_token_count(ids: list[int], stop: str) -> int:
    """Tokens a server must consume before `stop` shows in the byte-decoded text."""
    from serving.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    return next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))


def _stop_candidate(text: str) -> str:
    """A 3-character piece of the middle of `text` without U+FFFD (spans 3+ byte tokens)."""
    for a in range(len(text) // 3, len(text) - 3):
        piece = text[a : a + 3]
        if "\ufffd" not in piece and text.find(piece) == a:
            return piece
    raise AssertionError(f"no usable stop string in {text!r}")


def _sse(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.mark.parametrize("chat", [False, True])
def test_stop_strings_cut_the_text_and_end_the_request(aggregated_server: Server, chat: bool) -> None:
    url = aggregated_server.url
    path = "/v1/chat/completions" if chat else "/v1/completions"
    base = {"max_tokens": 48, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    base |= {"messages": [{"role": "user", "content": "tell me"}]} if chat else {"prompt": "Once upon"}
    full = httpx.post(f"{url}{path}", json=base, timeout=120).json()
    text_key = (lambda c: c["message"]["content"]) if chat else (lambda c: c["text"])
    full_text, full_ids = text_key(full["choices"][0]), full["choices"][0]["token_ids"]
    stop = _stop_candidate(full_text)
    expected_text = full_text[: full_text.index(stop)]
    expected_tokens = _first_stop_token_count(full_ids, stop)
    assert expected_tokens < 48

    got = httpx.post(f"{url}{path}", json={**base, "stop": [stop, "never-there"]}, timeout=120).json()
    choice = got["choices"][0]
    assert text_key(choice) == expected_text
    assert choice["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == expected_tokens
    assert choice["token_ids"] == full_ids[:expected_tokens]

    body = {**base, "stop": stop, "stream_options": {"include_usage": True}}
    events = _sse(url, path, body)
    chunks, usage = events[:-1], events[-1]
    texts = [c["choices"][0]["delta"].get("content", "") if chat else c["choices"][0]["text"] for c in chunks]
    assert "".join(texts) == expected_text  # nothing of the stop string or after it leaks
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert usage["usage"]["completion_tokens"] == expected_tokens == len(chunks)


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_stop_token_ids_reach_the_engine_in_both_modes(
    aggregated_server: Server, disaggregated_server: Server, mode: str
) -> None:
    url = (aggregated_server if mode == "aggregated" else disaggregated_server).url
    sampled = {"max_tokens": 24, "ignore_eos": True, "return_token_ids": True, "temperature": 0.8, "seed": 7}
    ids = complete(url, "stop ids", **sampled)["choices"][0]["token_ids"]
    idx = next(i for i in range(2, len(ids)) if ids[i] not in ids[:i])  # decoded after the hand-off
    got = complete(url, "stop ids", **sampled, stop_token_ids=[ids[idx]])
    assert got["choices"][0]["token_ids"] == ids[: idx + 1]
    assert got["choices"][0]["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == idx + 1


def test_seeded_sampling_is_the_same_aggregated_and_disaggregated(
    aggregated_server: Server, disaggregated_server: Server
) -> None:
    def ids(url: str, **extra: object) -> list[int]:
        body = {"prompt": "seeded", "max_tokens": 16, "temperature": 0.8, "ignore_eos": True, **extra}
        r = httpx.post(f"{url}/v1/completions", json={**body, "return_token_ids": True}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    agg = ids(aggregated_server.url, seed=1234)
    dis = ids(disaggregated_server.url, seed=1234)
    assert dis == agg
    assert ids(disaggregated_server.url, seed=1234) == agg
    assert len(set(agg)) > 4  # it samples, not a greedy run
    assert ids(aggregated_server.url, seed=99) != agg
    unseeded = [ids(disaggregated_server.url) for _ in range(2)]
    assert unseeded[0] != unseeded[1]


@pytest.mark.parametrize(
    ("raw", "status", "param"),
    [
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": 1e-44}', 200, None),
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": 1e300}', 200, None),
        (b'{"prompt": "hi", "max_tokens": 4, "temperature": NaN}', 400, "temperature"),
        (b'{"prompt": "hi", "max_tokens": 4, "top_p": -Infinity}', 400, "top_p"),
        (b'{"prompt": "\\ud800", "max_tokens": 4}', 400, "prompt"),
    ],
)
def test_extreme_sampling_values_never_kill_a_worker(
    aggregated_server: Server, raw: bytes, status: int, param: str | None
) -> None:
    url = aggregated_server.url
    r = httpx.post(
        f"{url}/v1/completions", content=raw, headers={"content-type": "application/json"}, timeout=120
    )
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == param
    workers = aggregated_server.layout()["workers"]
    assert [w["state"] for w in workers] == ["ready", "ready"]
    assert "phaselens:worker_deaths_total 0.0" in httpx.get(f"{url}/metrics").text


def test_tiny_temperature_is_greedy(aggregated_server: Server) -> None:
    greedy = complete(aggregated_server.url, "tiny T", max_tokens=8, ignore_eos=True, return_token_ids=True)
    tiny = complete(
        aggregated_server.url,
        "tiny T",
        max_tokens=8,
        ignore_eos=True,
        return_token_ids=True,
        temperature=1e-44,
    )
    assert tiny["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"]


def test_unsupported_parameter_is_a_400_naming_it(aggregated_server: Server) -> None:
    client = openai.OpenAI(base_url=f"{aggregated_server.url}/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError, match="'logit_bias' is not supported"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logit_bias={"5": 10})
    with pytest.raises(openai.BadRequestError, match="'logprobs' is not supported"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2, logprobs=True
        )
    ok = client.completions.create(
        model="tiny", prompt="x", max_tokens=2, presence_penalty=0, user="me", stop=["zz"]
    )
    assert ok.usage.completion_tokens >= 1


def test_stop_string_aborts_the_request_on_its_worker() -> None:
    """After a stop-string match the worker stops generating: its decode steps stop well short of
    max_tokens. Iterations are paced to an emulated 70B decode (~40 ms) so the check counts steps,
    not time."""
    from tests.serving.conftest import start_server, stop_server

    server = start_server(
        "--workers", "1", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-70b",
        "--max-model-len", "512",
    )  # fmt: skip
    try:
        url = server.url
        probe = complete(url, "Once upon", max_tokens=48, ignore_eos=True)["choices"][0]["text"]
        stop = _stop_candidate(probe)
        got = complete(url, "Once upon", max_tokens=400, ignore_eos=True, stop=stop)
        assert got["choices"][0]["finish_reason"] == "stop"
        assert got["choices"][0]["text"] == probe[: probe.index(stop)]
        used = got["usage"]["completion_tokens"]
        assert used < 48
        for _ in range(1500):  # until the worker reports itself idle (stats refresh every 0.2 s)
            stats = server.layout()["workers"][0]["stats"]
            if stats.get("running") == 0 and stats.get("waiting") == 0:
                break
            time.sleep(0.1)
        events = read_telemetry(url)
        decode_steps = sum(e["decode_seqs"] for e in events if e["type"] == "iteration")
        assert decode_steps < 47 + used + 100, decode_steps  # not the 399 the request asked for
        req = [e for e in events if e["type"] == "request"][-1]
        assert req["finish_reason"] == "stop" and req["output_tokens"] == used
    finally:
        stop_server(server)


def test_a_request_that_cannot_be_sampled_fails_alone(tmp_path) -> None:
    """A checkpoint whose embedding of "!" is NaN: a prompt with "!" has no finite logit. That request
    gets a JSON 500 naming why; the worker process lives on and serves the next request."""
    import torch
    from safetensors.torch import save_file

    from tests.serving.conftest import start_server, stop_server

    d, f, kv, vocab = 32, 64, 16, 258
    g = torch.Generator().manual_seed(0)
    shapes = {
        "model.embed_tokens.weight": (vocab, d),
        "lm_head.weight": (vocab, d),
        "model.layers.0.self_attn.q_proj.weight": (d, d),
        "model.layers.0.self_attn.k_proj.weight": (kv, d),
        "model.layers.0.self_attn.v_proj.weight": (kv, d),
        "model.layers.0.self_attn.o_proj.weight": (d, d),
        "model.layers.0.mlp.gate_proj.weight": (f, d),
        "model.layers.0.mlp.up_proj.weight": (f, d),
        "model.layers.0.mlp.down_proj.weight": (d, f),
    }
    tensors = {k: torch.randn(s, generator=g) * 0.05 for k, s in shapes.items()}
    tensors |= {n: torch.ones(d) for n in ("model.norm.weight", "model.layers.0.input_layernorm.weight")}
    tensors["model.layers.0.post_attention_layernorm.weight"] = torch.ones(d)
    tensors["model.embed_tokens.weight"][ord("!")] = float("nan")
    folder = tmp_path / "nan-model"
    folder.mkdir()
    config = {
        "model_type": "llama", "vocab_size": vocab, "hidden_size": d, "intermediate_size": f,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rope_theta": 10_000.0, "eos_token_id": 257, "bos_token_id": 256,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    server = start_server("--model", str(folder), "--workers", "1")
    try:
        pid = server.layout()["workers"][0]["pid"]
        for temperature in (0.0, 0.8):
            body = {"prompt": "a!b", "max_tokens": 4, "temperature": temperature}
            r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 500, r.text
            assert "no finite logit" in r.json()["error"]["message"]
            ok = httpx.post(
                f"{server.url}/v1/completions", json={"prompt": "ab", "max_tokens": 1}, timeout=60
            )
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1
        (worker,) = server.layout()["workers"]
        assert worker["pid"] == pid and worker["state"] == "ready"
        assert "phaselens:worker_deaths_total 0.0" in httpx.get(f"{server.url}/metrics").text
    finally:
        stop_server(server)
