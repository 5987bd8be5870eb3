"""Tests for serving.loadgen against a small real HTTP server (FastAPI + uvicorn in a thread).

The server speaks the OpenAI completions SSE format with fixed delays, so timing assertions use
generous bounds only. It rejects some requests by their max_tokens so error counting can be tested.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serving.loadgen import (
    LoadGenError,
    add_load_arguments,
    build_report,
    build_trace,
    emulation_during,
    fetch_model,
    format_report,
    latency_stats,
    main_load,
    percentile,
    run_load,
    synthetic_prompt,
)
from serving.trace import TraceRequest

# ------------------------------------------------------------------------------------- test server


@dataclass
class FakeLLM:
    """Behaviour and records of the test server."""

    first_token_delay_s: float = 0.05
    token_delay_s: float = 0.02
    reject_400: set[int] = field(default_factory=set)  # max_tokens values answered with 400
    reject_503: set[int] = field(default_factory=set)  # ... with 503
    hang: set[int] = field(default_factory=set)  # ... never finish
    send_usage: bool = True
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def make_app(llm: FakeLLM) -> FastAPI:
    """An OpenAI-compatible completions endpoint emitting one SSE chunk per token."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "test-model", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        llm.received.append((time.perf_counter(), body))
        n = int(body["max_tokens"])
        if n in llm.reject_400:
            return error(400, f"max_tokens {n} is not allowed here", "invalid_request_error")
        if n in llm.reject_503:
            return error(503, "server overloaded", "overloaded")
        prompt_tokens = len(body["prompt"]) + 1
        include_usage = llm.send_usage and body.get("stream_options", {}).get("include_usage")
        return StreamingResponse(stream(n, prompt_tokens, include_usage), media_type="text/event-stream")

    async def stream(n: int, prompt_tokens: int, include_usage: bool) -> AsyncIterator[str]:
        llm.in_flight += 1
        llm.max_in_flight = max(llm.max_in_flight, llm.in_flight)
        try:
            await asyncio.sleep(llm.first_token_delay_s)
            if n in llm.hang:
                await asyncio.sleep(30)
            for i in range(n):
                if i:
                    await asyncio.sleep(llm.token_delay_s)
                yield sse({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]})
            if include_usage:
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                }
                yield sse({"id": "c", "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"
        finally:
            llm.in_flight -= 1

    return app


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


@contextmanager
def serve(llm: FakeLLM) -> Iterator[str]:
    """Run the app on 127.0.0.1 (free port) in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(make_app(llm), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "test server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def llm() -> FakeLLM:
    return FakeLLM()


@pytest.fixture
def url(llm: FakeLLM) -> Iterator[str]:
    with serve(llm) as base_url:
        yield base_url


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------- statistics


def test_percentile_matches_linear_interpolation() -> None:
    data = [float(x) for x in range(1, 101)]
    assert percentile(data, 50) == pytest.approx(50.5)
    assert percentile(data, 90) == pytest.approx(90.1)
    assert percentile(data, 99) == pytest.approx(99.01)
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(data, 101)


def test_latency_stats_in_ms() -> None:
    s = latency_stats([0.010, 0.020, 0.030, 0.040])
    assert s.n == 4
    assert s.p50_ms == pytest.approx(25.0)
    assert s.p90_ms == pytest.approx(37.0)
    assert s.p99_ms == pytest.approx(39.7)
    assert s.mean_ms == pytest.approx(25.0)
    empty = latency_stats([])
    assert empty.n == 0 and math.isnan(empty.p50_ms) and math.isnan(empty.mean_ms)


def test_build_report_counts_only_ok_requests() -> None:
    from serving.loadgen import RequestResult

    ok = RequestResult(0, 0.0, 10, 4, sent_s=0.0, status="ok", ttft_s=0.1, e2e_s=0.4, itl_s=[0.1, 0.1, 0.1])
    ok.prompt_tokens, ok.completion_tokens = 10, 4
    bad = RequestResult(1, 0.5, 10, 4, sent_s=0.5, status="http 400", error="nope", http_status=400)
    report = build_report("u", "m", [ok, bad], duration_s=2.0, clipped=1)
    assert (report.n_ok, report.n_failed, report.clipped) == (1, 1, 1)
    assert report.request_throughput_rps == pytest.approx(0.5)
    assert report.output_tokens_per_s == pytest.approx(2.0)
    assert report.total_tokens_per_s == pytest.approx(7.0)
    assert report.ttft.p50_ms == pytest.approx(100.0)
    assert report.itl.n == 3
    assert report.errors == ["#1 http 400: nope"]
    json.dumps(report.to_dict(), allow_nan=False)  # NaN-free JSON


def test_load_report_shows_the_host_bound_share_of_emulated_iterations() -> None:
    """The run's share is the difference of each emulated worker's lag counters after and before."""
    before = {
        "worker-0": {
            "device": "emulated:h100-sxm",
            "iterations": 10,
            "lagged_iterations": 4,
            "lag_s_total": 1.0,
        }
    }
    after = {
        "worker-0": {
            "device": "emulated:h100-sxm",
            "models_shape": "llama-3.1-8b",
            "iterations": 110,
            "lagged_iterations": 79,
            "lag_s_total": 4.5,
        },
        "worker-1": {
            "device": "emulated:h100-sxm",
            "models_shape": "llama-3.1-8b",
            "iterations": 20,
            "lagged_iterations": 0,
            "lag_s_total": 0.0,
        },
    }
    during = emulation_during(before, after)
    assert during[0] == {
        "worker": "worker-0",
        "device": "emulated:h100-sxm",
        "models_shape": "llama-3.1-8b",
        "iterations": 100,
        "lagged_iterations": 75,
        "lag_s": 3.5,
        "host_bound_fraction": 0.75,
    }
    assert (during[1]["iterations"], during[1]["host_bound_fraction"]) == (20, 0.0)
    assert emulation_during(before, None) is None
    report = build_report("u", "m", [], duration_s=1.0)
    assert "host-bound" not in format_report(report)
    report.emulation = during
    text = format_report(report)
    assert "emulated GPUs (modeled, not measured)" in text
    assert (
        "worker-0   emulated:h100-sxm modeling llama-3.1-8b: 100 iterations, 75 host-bound (75.0 %), lag 3.50 s"
        in text
    )


def test_synthetic_prompt_exact_ascii_deterministic() -> None:
    for n in (1, 2, 7, 100, 5000):
        p = synthetic_prompt(n, index=3, seed=1)
        assert len(p) == n and p.isascii()
        assert p == synthetic_prompt(n, index=3, seed=1)
    assert synthetic_prompt(0, 1) == ""
    assert synthetic_prompt(200, 1) != synthetic_prompt(200, 2)
    assert synthetic_prompt(200, 1, seed=0) != synthetic_prompt(200, 1, seed=1)


# -------------------------------------------------------------------------------- against server


def test_streams_and_measures_tokens_and_latencies(llm: FakeLLM, url: str) -> None:
    reqs = [TraceRequest(0.0, 10, 5), TraceRequest(0.05, 20, 3), TraceRequest(0.1, 300, 8)]
    report = run_load(url, reqs, progress=False)
    assert report.model == "test-model"
    assert (report.n_ok, report.n_failed) == (3, 0)
    for req, res in zip(reqs, report.results, strict=True):
        assert res.ok and res.usage_reported
        assert res.prompt_tokens == req.prompt_tokens  # prompt = prompt_tokens - 1 chars + BOS
        assert res.completion_tokens == req.output_tokens
        assert len(res.itl_s) == req.output_tokens - 1
        assert 0.04 <= res.ttft_s < 2.0
        assert res.e2e_s >= res.ttft_s + sum(res.itl_s) - 1e-6
    all_itl = [x for r in report.results for x in r.itl_s]
    assert 0.01 <= statistics.median(all_itl) < 1.0
    assert report.ttft.n == 3 and report.itl.n == 13
    assert report.completion_tokens_total == 16
    assert report.output_tokens_per_s == pytest.approx(16 / report.duration_s)
    bodies = sorted((b for _, b in llm.received), key=lambda b: b["max_tokens"])
    assert [len(b["prompt"]) for b in bodies] == [19, 9, 299]
    for b in bodies:
        assert b["model"] == "test-model"
        assert b["stream"] is True and b["ignore_eos"] is True
        assert b["stream_options"] == {"include_usage": True}
    assert "TTFT" in format_report(report)


def test_requests_are_not_sent_before_their_arrival(llm: FakeLLM, url: str) -> None:
    arrivals = [0.0, 0.25, 0.5, 0.75]
    report = run_load(url, [TraceRequest(a, 4, 2) for a in arrivals], progress=False)
    assert report.n_ok == 4
    for res in report.results:
        assert res.sent_s >= res.arrival_s
        assert res.sent_s < res.arrival_s + 0.5  # and not wildly late
    seen = sorted(t for t, _ in llm.received)
    for i, a in enumerate(arrivals):
        assert seen[i] - seen[0] >= a - 0.05  # server-side receipt keeps the spacing
    assert report.duration_s >= 0.75


def test_arrivals_out_of_order_are_sent_in_time_order(llm: FakeLLM, url: str) -> None:
    reqs = [TraceRequest(0.3, 4, 1), TraceRequest(0.0, 4, 2)]
    report = run_load(url, reqs, progress=False)
    assert report.n_ok == 2
    assert report.results[0].sent_s >= 0.3 > report.results[1].sent_s
    assert [b["max_tokens"] for _, b in llm.received] == [2, 1]


def test_errors_are_counted_and_do_not_stop_the_run(llm: FakeLLM, url: str) -> None:
    llm.reject_400 = {7}
    llm.reject_503 = {9}
    outputs = [3, 7, 3, 9, 7, 3]
    report = run_load(url, [TraceRequest(0.01 * i, 5, n) for i, n in enumerate(outputs)], progress=False)
    assert (report.n_requests, report.n_ok, report.n_failed) == (6, 3, 3)
    statuses = [r.status for r in report.results]
    assert statuses == ["ok", "http 400", "ok", "http 503", "http 400", "ok"]
    assert report.results[1].http_status == 400
    assert report.results[1].error == "max_tokens 7 is not allowed here"
    assert report.results[3].error == "server overloaded"
    assert len(report.errors) == 3 and report.errors[0].startswith("#1 http 400")
    assert report.ttft.n == 3  # failed requests do not enter latency stats
    text = format_report(report)
    assert "3 failed" in text and "server overloaded" in text


def test_token_count_falls_back_to_chunks_without_usage(llm: FakeLLM, url: str) -> None:
    llm.send_usage = False
    report = run_load(url, [TraceRequest(0.0, 12, 6)], progress=False)
    res = report.results[0]
    assert res.ok and not res.usage_reported
    assert res.completion_tokens == 6
    assert res.prompt_tokens == 12


def test_timeout_counts_as_failure(llm: FakeLLM, url: str) -> None:
    llm.hang = {4}
    report = run_load(url, [TraceRequest(0.0, 5, 4), TraceRequest(0.0, 5, 2)], timeout_s=0.5, progress=False)
    assert [r.status for r in report.results] == ["timeout", "ok"]
    assert report.n_failed == 1


def test_max_concurrency_caps_requests_in_flight(llm: FakeLLM, url: str) -> None:
    llm.token_delay_s = 0.01
    report = run_load(url, [TraceRequest(0.0, 5, 5) for _ in range(6)], max_concurrency=2, progress=False)
    assert report.n_ok == 6
    assert llm.max_in_flight <= 2
    assert max(r.sent_s for r in report.results) > 0.05  # later ones waited for a slot


def test_progress_bar_goes_to_stderr(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_load(url, [TraceRequest(0.0, 5, 2)], progress=True)
    assert report.n_ok == 1
    captured = capsys.readouterr()
    assert "1/1" in captured.err and captured.out == ""


def test_unreachable_server() -> None:
    base = f"http://127.0.0.1:{free_port()}"
    report = run_load(base, [TraceRequest(0.0, 5, 2), TraceRequest(0.0, 5, 2)], model="m", progress=False)
    assert report.n_failed == 2 and report.n_ok == 0
    assert all(r.status == "exception" and "Connect" in (r.error or "") for r in report.results)
    ttft_row = next(line for line in format_report(report).splitlines() if line.strip().startswith("TTFT"))
    assert ttft_row.split()[1:] == ["0", "-", "-", "-", "-"]  # NaN latencies print as '-'
    with pytest.raises(LoadGenError, match="cannot reach"):
        run_load(base, [TraceRequest(0.0, 5, 2)], progress=False)


def test_fetch_model_from_server(url: str) -> None:
    import httpx

    async def go() -> str:
        async with httpx.AsyncClient() as client:
            return await fetch_model(client, url)

    assert asyncio.run(go()) == "test-model"


# ----------------------------------------------------------------------------------------------- CLI


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="phaselens load")
    add_load_arguments(parser)
    return parser.parse_args(argv)


def test_cli_poisson_writes_json(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "report.json"
    argv = f"--url {url} --poisson 50 --num-requests 4 --prompt-tokens 8 --output-tokens 2:3 --no-progress"
    args = parse([*argv.split(), "--json", str(out)])
    assert main_load(args) == 0
    data = json.loads(out.read_text())
    assert data["n_ok"] == 4 and data["n_failed"] == 0 and len(data["results"]) == 4
    assert all(r["prompt_tokens"] == 8 and 2 <= r["completion_tokens"] <= 3 for r in data["results"])
    assert "4 ok" in capsys.readouterr().out


def test_cli_trace_reports_clipping(llm: FakeLLM, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = (
        f"--url {url} --limit 3 --time-scale 0.01 --max-prompt-tokens 64 --max-output-tokens 4 --no-progress"
    )
    args = parse(argv.split())
    assert main_load(args) == 0
    captured = capsys.readouterr()
    assert "3 clipped" in captured.err  # before the run
    assert "3 clipped" in captured.out  # in the report
    assert sorted(len(b["prompt"]) for _, b in llm.received) == [63, 63, 63]
    assert all(b["max_tokens"] == 4 for _, b in llm.received)


def test_cli_exits_1_when_any_request_failed(
    llm: FakeLLM, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    llm.reject_400 = {3}  # one of the four requests (output tokens 3) is rejected
    argv = f"--url {url} --poisson 50 --num-requests 4 --prompt-tokens 8 --output-tokens 2:4 --no-progress"
    args = parse(argv.split())
    trace_outputs = [r.output_tokens for r in build_trace(args)[0]]
    n_bad = trace_outputs.count(3)
    assert 0 < n_bad < 4, trace_outputs
    assert main_load(args) == 1
    assert f"{n_bad} of 4 requests failed" in capsys.readouterr().err
    assert main_load(parse([*argv.split(), "--max-failure-rate", str(n_bad / 4)])) == 0
    assert main_load(parse([*argv.split(), "--max-failure-rate", str(n_bad / 4 - 0.01)])) == 1
    llm.reject_400 = {2, 3, 4}
    assert main_load(parse([*argv.split(), "--max-failure-rate", "1"])) == 1  # none succeeded


def test_cli_unreachable_returns_1(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--url", f"http://127.0.0.1:{free_port()}", "--poisson", "100", "--num-requests", "2"])
    assert main_load(args) == 1
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--poisson", "0"], "expected a number > 0, got '0'"),
        (["--poisson", "fast"], "expected a number > 0"),
        (["--limit", "0"], "expected an integer >= 1"),
        (["--max-concurrency", "-2"], "expected an integer >= 1"),
        (["--prompt-tokens", "9:3"], "expected N or MIN:MAX"),
        (["--max-failure-rate", "1.5"], "expected a number in [0, 1]"),
        (["--max-failure-rate", "nan"], "expected a number in [0, 1]"),
        (["--trace", "x.csv", "--poisson", "3"], "not allowed with argument"),
    ],
)
def test_cli_bad_values(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--poisson", "3", "--limit", "5"], "--limit apply to a trace, not to --poisson"),
        (["--poisson", "3", "--time-scale", "0.5"], "--time-scale apply to a trace"),
        (["--num-requests", "5"], "--num-requests apply to --poisson only"),
        (["--trace", "/nonexistent/t.csv"], "no such file"),
    ],
)
def test_cli_options_that_do_not_fit(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main_load(parse(argv))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_bad_trace_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,x,1\n")
    assert main_load(parse(["--trace", str(path)])) == 2
    assert "t.csv:2: ContextTokens 'x' is not an integer" in capsys.readouterr().err


# ------------------------------------------------------------------------------- stopping a run


def _signal_self_after(delay_s: float, sig: int = signal.SIGTERM) -> threading.Timer:
    timer = threading.Timer(delay_s, os.kill, args=(os.getpid(), sig))
    timer.start()
    return timer


def test_sigterm_stops_sending_and_lets_requests_in_flight_finish(
    llm: FakeLLM, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    llm.token_delay_s = 0.05  # ~1 s per request: some are in flight when the signal comes
    argv = f"--url {url} --poisson 4 --num-requests 40 --prompt-tokens 8 --output-tokens 20 --no-progress"
    timer = _signal_self_after(1.5)
    try:
        assert main_load(parse(argv.split())) == 0  # a stop is not a failure
    finally:
        timer.cancel()
    out = capsys.readouterr().out
    sent = len(llm.received)
    assert 0 < sent < 40
    assert f"{sent} sent, {sent} ok, 0 failed" in out
    assert f"stopped early: {40 - sent} not sent" in out
    assert llm.in_flight == 0  # every request sent was answered to its end, none cut off


def test_requests_still_in_flight_after_the_grace_are_cancelled(llm: FakeLLM, url: str) -> None:
    llm.hang = {7}
    reqs = [TraceRequest(arrival_s=0.0, prompt_tokens=4, output_tokens=7)]
    reqs += [TraceRequest(arrival_s=30.0 + i, prompt_tokens=4, output_tokens=2) for i in range(3)]
    timer = _signal_self_after(0.5, signal.SIGINT)
    try:
        report = run_load(url, reqs, progress=False, stop_grace_s=0.3)
    finally:
        timer.cancel()
    assert report.n_requests == 1 and report.not_sent == 3 and report.n_failed == 1
    assert report.results[0].status == "cancelled"
