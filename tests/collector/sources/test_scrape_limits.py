"""Issue 20 items 3 and 6: a scrape has one deadline and a page size limit; duplicated series are
counted and the first kept. Real sockets: an exporter that trickles, one that sends too much, one
that repeats series, against the real source classes (the collector and store: test_service.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from collector.sources import (
    TABLE_ENGINE_METRICS,
    TABLE_GPU_SAMPLES,
    Backoff,
    DcgmSource,
    EngineScrapeSource,
    PrometheusQuerySource,
)
from collector.sources.backoff import DEFAULT_MAX_BACKOFF_S
from collector.sources.base import Source
from collector.sources.http import HttpClient
from collector.sources.serving_stack import _JsonClient
from tests.collector.sources import expositions as ex
from tests.collector.sources.conftest import L4_PROM, FakeClock, closed_port_url
from tests.collector.sources.slow_exporter import SlowExporter, trickle_total_s

VLLM = ex.vllm(prompt=100, gen=1000, ttft=(2.0, 10), itl=(5.0, 990), e2e=(30.0, 10), finished=10)
L4_POWER = 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",pci_bus_id="00000000:31:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="i-030791dc5a37cd257",DCGM_FI_DRIVER_VERSION="580.105.08"}'
RUNNING = 'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"}'


@pytest.fixture
def exporters() -> Iterator[list[SlowExporter]]:
    made: list[SlowExporter] = []
    yield made
    for e in made:
        e.close()


@pytest.fixture
def sources() -> Iterator[list[Source]]:
    made: list[Source] = []
    yield made
    for s in made:
        s.close()


def make(kind: str, url: str, clock: FakeClock, made: list[Source], **kw) -> Source:
    cls = DcgmSource if kind == "dcgm" else EngineScrapeSource
    backoff = Backoff(base_s=1.0, max_s=8.0, jitter=0.0)
    made.append(cls(url, clock=clock, backoff=backoff, interval_s=1.0, **kw))
    return made[-1]


def page_of(kind: str) -> str:
    return L4_PROM if kind == "dcgm" else VLLM


def table_of(kind: str) -> str:
    return TABLE_GPU_SAMPLES if kind == "dcgm" else TABLE_ENGINE_METRICS


# -- one deadline per scrape ------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dcgm", "engine"])
@pytest.mark.parametrize("mode", ["trickle_body", "trickle_headers"])
def test_a_trickling_exporter_ends_the_scrape_by_its_deadline_then_recovers(
    kind: str, mode: str, exporters, sources, clock: FakeClock
) -> None:
    exporter = SlowExporter(page_of(kind), mode=mode, trickle_s=0.5)  # one byte every 0.5 s
    exporters.append(exporter)
    src = make(kind, exporter.url, clock, sources, timeout_s=1.5)
    started = time.monotonic()
    result = src.poll()
    took = time.monotonic() - started
    # the page would take over 20 minutes to trickle in (per-read timeouts never fire on it)
    assert trickle_total_s(exporter) > 1200 and took < 30, took
    assert not result.ok and [e.kind for e in result.errors] == ["timeout"]
    assert "1.5 s deadline" in result.errors[0].message
    h = src.health()
    assert (h.status, h.timeouts, h.consecutive_failures) == ("down", 1, 1)
    assert h.last_error.startswith("timeout: ")
    # the page is fixed: the retry after the backoff (1 s here) reads it and clears the error
    exporter.mode = "ok"
    clock.t = h.next_attempt_s
    result = src.poll()
    assert result.ok and result.table_rows(table_of(kind)), result.errors
    h = src.health()
    assert (h.status, h.consecutive_failures, h.timeouts) == ("ok", 0, 1)
    assert h.last_error is None or h.last_error.startswith("unmapped: ")  # a first scrape's note
    clock.advance(1.0)
    assert src.poll().ok and src.health().last_error is None


def test_the_json_client_of_the_serving_stack_holds_the_deadline_too(exporters) -> None:
    exporter = SlowExporter('{"devices": []}', mode="trickle_body", trickle_s=1.0)
    exporters.append(exporter)
    client = _JsonClient(exporter.url.removesuffix("/metrics"), timeout_s=1.0)
    with pytest.raises(Exception, match="1 s deadline") as err:
        client.get("/metrics", "devices")
    assert err.value.kind == "timeout"
    exporter.mode = "ok"
    assert client.get("/metrics", "devices") == {"devices": []}
    client.close()


# -- a maximum page size ----------------------------------------------------------------------------

BIG = "# padding\n" * (1_600_000)  # 16 MB of comment lines: a valid page, far over the limit


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["dcgm", "engine"])
@pytest.mark.parametrize("mode", ["declared", "chunked"])
def test_a_page_over_the_size_limit_is_counted_and_degrades_the_source(
    kind: str, mode: str, exporters, sources, clock: FakeClock
) -> None:
    limit = 1024 * 1024
    exporter = SlowExporter(page_of(kind) + BIG, mode=mode)
    exporters.append(exporter)
    src = make(kind, exporter.url, clock, sources, max_page_bytes=limit)
    result = src.poll()
    assert not result.ok and [(e.kind, e.severity) for e in result.errors] == [("page_too_large", "error")]
    assert f"over the limit of {limit} bytes" in result.errors[0].message
    h = src.health()
    assert (h.status, h.pages_too_large, h.timeouts, h.consecutive_failures) == ("degraded", 1, 0, 0)
    assert h.last_error.startswith("page_too_large: ")
    assert h.next_attempt_s == clock.t + 1.0  # the endpoint answers: polled again at its interval
    # read no further than the limit: the exporter could hand over only a part of its 16 MB
    time.sleep(0.5)
    assert exporter.sent[0] < len(exporter.page) / 2, exporter.sent
    # fixed: the next scrape is good, the status ok and the error gone; the count stays
    exporter.mode, exporter.page = "ok", page_of(kind)
    clock.advance(1.0)
    result = src.poll()
    assert result.ok and result.table_rows(table_of(kind)), result.errors
    h = src.health()
    assert (h.status, h.pages_too_large) == ("ok", 1)
    assert h.last_error is None or h.last_error.startswith("unmapped: ")  # a first scrape's note
    clock.advance(1.0)
    assert src.poll().ok and src.health().last_error is None


def test_a_page_at_the_limit_is_read(exporters) -> None:
    body = "x" * 1000
    exporter = SlowExporter(body, mode="chunked")
    exporters.append(exporter)
    assert HttpClient(exporter.url, timeout_s=5, max_body_bytes=1000).get() == (200, bytearray(body.encode()))
    with pytest.raises(Exception, match="over the limit of 999 bytes") as err:
        HttpClient(exporter.url, timeout_s=5, max_body_bytes=999).get()
    assert err.value.kind == "page_too_large"


def test_http_client_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match=r"http\(s\)://host"):
        HttpClient("ftp://x/metrics", timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        HttpClient("http://x/metrics", timeout_s=0)
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1"):
        HttpClient("http://x/metrics", timeout_s=1, max_body_bytes=0)


# -- duplicated series ------------------------------------------------------------------------------


def duplicated(page: str, line_start: str, *extra: str) -> str:
    """``page`` with ``extra`` lines right after the sample line starting with ``line_start``."""
    lines = page.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(line_start))
    return "\n".join([*lines[: i + 1], *extra, *lines[i + 1 :]]) + "\n"


def test_dcgm_keeps_the_first_of_duplicated_series_and_counts_the_rest(
    exporters, sources, clock: FakeClock
) -> None:
    pod = L4_POWER.replace("}", ',pod="vllm-0",namespace="serving"}')
    page = duplicated(L4_PROM, L4_POWER, f"{L4_POWER} 99.0", f"{pod} 98.0")
    exporter = SlowExporter(page)
    exporters.append(exporter)
    src = make("dcgm", exporter.url, clock, sources)
    result = src.poll()
    (row,) = result.table_rows(TABLE_GPU_SAMPLES)
    assert row["power_w"] == pytest.approx(16.365)  # the first, in page order
    (dup,) = [e for e in result.errors if e.kind == "duplicate_series"]
    assert (dup.count, dup.severity) == (2, "warning") and "DCGM_FI_DEV_POWER_USAGE" in dup.message
    assert src.health_details()["duplicate_series"] == 2
    assert src.health().status == "ok"  # one value kept: nothing the row needs was lost


def test_engine_keeps_the_first_of_duplicated_series_and_counts_the_rest(
    exporters, sources, clock: FakeClock
) -> None:
    job = WAITING.replace("{", '{job="other",')  # the same series once the job label is dropped
    page = duplicated(VLLM, RUNNING, f"{RUNNING} 7")
    page = duplicated(page, WAITING, f"{job} 9")
    exporter = SlowExporter(page)
    exporters.append(exporter)
    src = make("engine", exporter.url, clock, sources)
    for _ in range(2):  # the second scrape has deltas: one per key too
        result = src.poll(force=True)
        rows = result.table_rows(TABLE_ENGINE_METRICS)
        keys = [(r["engine"], r["metric"], str(sorted(r["labels"].items()))) for r in rows]
        assert len(keys) == len(set(keys))  # never two values under one key
        running = [r["value"] for r in rows if r["metric"] == "requests_running"]
        waiting = [r["value"] for r in rows if r["metric"] == "requests_waiting"]
        assert (running, waiting) == ([3.0], [1.0])  # the first of each
        (dup,) = [e for e in result.errors if e.kind == "duplicate_series"]
        assert (dup.count, dup.severity) == (2, "warning")
        clock.advance(5)
    assert src.health_details()["duplicate_series"] == 4
    assert src.health().status == "ok"


def test_an_injected_httpx_client_is_read_with_the_same_size_limit(sources, clock: FakeClock) -> None:
    """The in-process transport of bench/ingest.py and the external validation: same limit."""
    pages = {"page": L4_PROM + BIG}

    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=pages["page"])

    client = httpx.Client(transport=httpx.MockTransport(serve))
    src = make("dcgm", "http://dcgm:9400/metrics", clock, sources, client=client, max_page_bytes=1 << 20)
    result = src.poll()
    assert [e.kind for e in result.errors] == ["page_too_large"] and src.health().status == "degraded"
    pages["page"] = L4_PROM
    clock.advance(1.0)
    assert src.poll().table_rows(TABLE_GPU_SAMPLES) and src.health().status == "ok"
    client.close()


@pytest.mark.timeout(60)
def test_the_prometheus_query_source_holds_the_deadline_and_sends_its_headers(
    exporters, sources, clock: FakeClock
) -> None:
    empty = '{"status": "success", "data": {"resultType": "matrix", "result": []}}'
    exporter = SlowExporter(empty, mode="trickle_body", trickle_s=0.5)
    exporters.append(exporter)
    base = exporter.url.removesuffix("/metrics")
    backoff = Backoff(base_s=1.0, max_s=8.0, jitter=0.0)
    src = PrometheusQuerySource(
        base, clock=clock, backoff=backoff, timeout_s=1.0, headers={"X-Scope-OrgID": "team-a"}
    )
    sources.append(src)
    result = src.poll()
    assert [e.kind for e in result.errors] == ["timeout"] and src.health().status == "down"
    assert b"\r\nX-Scope-OrgID: team-a" in exporter.last_request
    exporter.mode = "ok"
    clock.t = src.health().next_attempt_s
    assert src.poll().ok and src.health().status == "ok" and src.health().last_error is None
    with pytest.raises(ValueError, match="no line breaks"):
        PrometheusQuerySource(base, headers={"X-Evil": "a\r\nHost: b"})


def test_a_failed_source_is_retried_within_the_default_backoff_cap(sources, clock: FakeClock) -> None:
    """The delays grow 1, 2, 4, 8 s and stop at 10 s (±10 % within it): a peer back after a long
    outage is read again within 10 s (the uncapped 300 s had left sources down 50 s and more)."""
    src = DcgmSource(closed_port_url(), clock=clock)
    sources.append(src)
    delays = []
    for _ in range(9):
        assert src.poll().errors[0].kind == "unreachable"
        delays.append(src.health().next_attempt_s - clock.t)
        clock.t = src.health().next_attempt_s
    assert src.backoff.max_s == DEFAULT_MAX_BACKOFF_S == 10.0
    assert all(abs(d - e) <= 0.1 * e + 1e-9 for d, e in zip(delays, [1, 2, 4, 8], strict=False)), delays
    assert all(9.0 - 1e-6 <= d <= 10.0 + 1e-6 for d in delays[4:]), delays


def test_an_injected_client_of_the_query_source_sends_its_headers_within_the_size_limit(
    sources, clock: FakeClock
) -> None:
    """Issue 21: the query source reads an injected httpx client through the same HttpClient: its
    headers go with each request (the caller's client is left as it was) and an answer over the
    limit is dropped as ``page_too_large`` (it was read whole, without a limit)."""
    seen: list[httpx.Request] = []
    answer = {"body": '{"status": "success", "data": {"resultType": "matrix", "result": []}}'}

    def serve(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=answer["body"])

    client = httpx.Client(transport=httpx.MockTransport(serve))
    backoff = Backoff(base_s=1.0, max_s=8.0, jitter=0.0)
    src = PrometheusQuerySource(
        "http://prom:9090", clock=clock, backoff=backoff, client=client, headers={"X-Scope-OrgID": "team-a"}
    )
    sources.append(src)
    assert src.poll().ok and src.health().status == "ok"
    assert seen and all(r.headers["X-Scope-OrgID"] == "team-a" for r in seen)
    assert "X-Scope-OrgID" not in client.headers
    answer["body"] = answer["body"].replace("[]", "[" + " " * 2_000_000 + "]")
    src2 = PrometheusQuerySource("http://prom:9090", clock=clock, client=client, max_body_bytes=1 << 20)
    sources.append(src2)
    result = src2.poll()
    assert [e.kind for e in result.errors] == ["page_too_large"] and src2.health().status == "degraded"
    client.close()
