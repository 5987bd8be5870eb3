"""Clients that leave and load beyond capacity, over real HTTP against the real stack.

A client that goes away aborts its request (streaming or not, aggregated or disaggregated): the
worker stops decoding it, its KV blocks are freed and it is stored `aborted`. Beyond
--max-waiting-requests new requests get 429 with Retry-After; a body over the limit gets 413.

Iterations are paced to an emulated 70B decode (~40 ms a step), so a long request runs for many
seconds and the checks count decode steps and tokens, not time.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.conftest import Server, start_server, stop_server
from tests.serving.test_server import read_telemetry

pytestmark = pytest.mark.slow

MAX_TOKENS = 480  # ~20 s of emulated 70B decode; a departed client's request must stop far short of it
EMULATED = ("--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-70b", "--max-model-len", "512")


@pytest.fixture(scope="module")
def agg() -> Iterator[Server]:
    server = start_server(
        "--workers", "1", *EMULATED, "--max-num-seqs", "2", "--max-waiting-requests", "4",
        "--max-request-body-mb", "0.25",
    )  # fmt: skip
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def disagg() -> Iterator[Server]:
    server = start_server("--mode", "disaggregated", *EMULATED, "--max-num-seqs", "1")  # default bound: 1
    yield server
    stop_server(server)


def _body(prompt: str, **extra: object) -> dict:
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **extra}


def wait_idle(server: Server, timeout_s: float = 120.0) -> list[dict]:
    """Poll the workers' engine stats (sent every 0.2 s) until nothing runs or waits and no KV block
    is in use; return the workers. The bound only detects a hang."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = server.layout()["workers"]
        stats = [w["stats"] for w in workers]
        if all(
            s.get("running") == 0 and s.get("waiting") == 0 and s.get("kv_blocks_used") == 0 for s in stats
        ):
            return workers
        assert time.monotonic() < deadline, f"workers not idle after {timeout_s} s: {stats}"
        time.sleep(0.1)


def request_events_after(url: str, t0_s: float, n: int = 1, timeout_s: float = 120.0) -> list[dict]:
    """The `request` telemetry events of requests that arrived after `t0_s`, once there are `n`."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = [e for e in read_telemetry(url) if e["type"] == "request" and e["arrival_s"] >= t0_s]
        if len(events) >= n:
            return events
        assert time.monotonic() < deadline, f"{len(events)} of {n} request events after {timeout_s} s"
        time.sleep(0.25)


def decode_steps_after(url: str, t0_s: float) -> int:
    return sum(
        e["decode_seqs"] for e in read_telemetry(url) if e["type"] == "iteration" and e["start_s"] >= t0_s
    )


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a /metrics sample's values over the series matching `labels`."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def assert_aborted_and_freed(server: Server, t0_s: float) -> dict:
    """The one request since `t0_s` was stored aborted, stopped far short of MAX_TOKENS, and every
    worker is idle with its KV blocks free."""
    (event,) = request_events_after(server.url, t0_s)
    assert event["status"] == "aborted", event
    assert event["finish_reason"] == "abort" and event["error"] == "client disconnected", event
    assert event["output_tokens"] < MAX_TOKENS // 2, event
    wait_idle(server)
    assert decode_steps_after(server.url, t0_s) < MAX_TOKENS // 2  # the worker stopped decoding it
    assert metric(server.url, "vllm:kv_cache_usage_perc") == 0
    return event


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_departed_non_streaming_client_aborts_its_request(agg: Server, disagg: Server, mode: str) -> None:
    server = agg if mode == "aggregated" else disagg
    t0 = time.time()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up after 1 s and closes its connection
        httpx.post(f"{server.url}/v1/completions", json=_body("departed client"), timeout=1.0)
    event = assert_aborted_and_freed(server, t0)
    if mode == "disaggregated":
        assert event["prefill_worker"] != event["decode_worker"]
    assert metric(server.url, "vllm:request_success_total", finished_reason="abort") >= 1


@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_departed_streaming_client_is_stored_aborted(agg: Server, disagg: Server, mode: str) -> None:
    server = agg if mode == "aggregated" else disagg
    t0 = time.time()
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=_body("streaming client", stream=True), timeout=120
    ) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: ")
            if chunks == 5:
                break  # leaving the block closes the connection mid-stream
    event = assert_aborted_and_freed(server, t0)
    assert event["output_tokens"] >= 5


def test_waiting_queue_is_bounded_429_with_retry_after(agg: Server) -> None:
    """--max-num-seqs 2, --max-waiting-requests 4: six requests are admitted (two run, four wait), the
    seventh gets 429; /health is degraded meanwhile; the rejection is counted and stored."""
    url = agg.url
    t0 = time.time()

    async def scenario() -> tuple[list[int], httpx.Response, dict, dict]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c, contextlib.AsyncExitStack() as streams:
            admitted = []
            for i in range(6):  # one at a time: each is in flight before the next is sent
                body = _body(f"queued request {i}", stream=True)
                r = await streams.enter_async_context(c.stream("POST", "/v1/completions", json=body))
                admitted.append(r.status_code)
            rejected = await c.post("/v1/completions", json=_body("one too many"))
            health = (await c.get("/health")).json()
            layout = (await c.get("/control/layout", headers={"Authorization": "Bearer test-token"})).json()
        return admitted, rejected, health, layout  # leaving the stack closed the six streams

    admitted, rejected, health, layout = asyncio.run(scenario())
    assert admitted == [200] * 6
    assert rejected.status_code == 429, rejected.text
    assert rejected.headers["Retry-After"] == "1"
    error = rejected.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 429
    assert "overloaded: 4 requests are waiting (the bound is 4" in error["message"]
    assert health["status"] == "degraded", health
    assert any("admission queue 4/4 waiting requests" in r for r in health["reasons"]), health
    assert health["admission"] == {
        "waiting_requests": 4,
        "max_waiting_requests": 4,
        "max_body_bytes": 262_144,
        "rejected": {"queue_full": 1, "body_too_large": health["admission"]["rejected"]["body_too_large"]},
    }
    assert layout["workers"][0]["inflight"] == 6
    assert metric(url, "phaselens:requests_rejected_total", reason="queue_full") == 1
    events = request_events_after(url, t0, n=7)
    (stored,) = [e for e in events if e["finish_reason"] == "rejected"]
    assert stored["status"] == "error" and stored["output_tokens"] == 0 and "overloaded" in stored["error"]
    assert sorted(e["status"] for e in events if e is not stored) == ["aborted"] * 6  # the six left
    wait_idle(agg)
    after = httpx.get(f"{url}/health", timeout=30).json()
    assert after["status"] == "ok", after
    ok = httpx.post(f"{url}/v1/completions", json={**_body("served again"), "max_tokens": 2}, timeout=120)
    assert ok.status_code == 200, ok.text


def test_default_bound_is_one_batch_per_entry_worker_disaggregated(disagg: Server) -> None:
    """1P1D with --max-num-seqs 1 and no --max-waiting-requests: the bound is 1. One request decodes,
    a second waits for the decode worker (its KV handed off), a third gets 429."""
    url = disagg.url
    t0 = time.time()

    async def scenario() -> tuple[httpx.Response, dict]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c, contextlib.AsyncExitStack() as streams:
            for i in range(2):
                body = _body(f"pair request {i}", stream=True)
                r = await streams.enter_async_context(c.stream("POST", "/v1/completions", json=body))
                assert r.status_code == 200
            deadline = time.monotonic() + 60
            while metric(url, "vllm:num_requests_waiting") < 1:  # the decode worker reports it waiting
                assert time.monotonic() < deadline, "the second request never showed as waiting"
                await asyncio.sleep(0.1)
            rejected = await c.post("/v1/completions", json=_body("third"))
            health = (await c.get("/health")).json()
        return rejected, health

    rejected, health = asyncio.run(scenario())
    assert rejected.status_code == 429, rejected.text
    assert "1 requests are waiting (the bound is 1," in rejected.json()["error"]["message"]
    assert health["status"] == "degraded" and any("admission queue 1/1" in r for r in health["reasons"])
    events = request_events_after(url, t0, n=3)
    assert sorted(e["status"] for e in events) == ["aborted", "aborted", "error"]
    wait_idle(disagg)
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"


def test_request_body_over_the_limit_is_413(agg: Server) -> None:
    """--max-request-body-mb 0.25: a bigger body gets 413 (declared length or chunked), never read whole."""
    url = agg.url
    before = metric(url, "phaselens:requests_rejected_total", reason="body_too_large")
    big = b'{"prompt": "' + b"x" * 300_000 + b'", "max_tokens": 1}'
    r = httpx.post(f"{url}/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["code"] == 413 and error["type"] == "invalid_request_error"
    assert "request body is 300,031 bytes; the limit is 262,144 bytes" in error["message"]

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(big), 65_536):
            yield big[i : i + 65_536]

    r = httpx.post(f"{url}/v1/chat/completions", content=chunked(), timeout=30)
    assert r.status_code == 413, r.text
    assert "over the limit of 262,144 bytes" in r.json()["error"]["message"]
    assert metric(url, "phaselens:requests_rejected_total", reason="body_too_large") == before + 2
    under = httpx.post(f"{url}/v1/completions", json={"prompt": "x" * 200_000, "max_tokens": 1}, timeout=30)
    assert under.status_code == 400 and "context" in under.json()["error"]["message"]  # read and parsed
    assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-waiting-requests", "0"], "max waiting requests must be >= 1, got 0"),
        (["--max-request-body-mb", "0"], "max request body must be at least 1 KiB, got 0 bytes"),
    ],
)
def test_admission_flags_are_checked(args: list[str], needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "serving.cli", "serve", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
