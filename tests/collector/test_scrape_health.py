"""Issue 20 items 3 and 6 through the real `phaselens collect` into a real DuckDB store: a trickling
exporter, a page over the size limit and duplicated series, seen in /health and in the tables."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.collector.conftest import start_collector
from tests.collector.sources.conftest import L4_PROM
from tests.collector.sources.slow_exporter import SlowExporter, wait_until
from tests.collector.sources.test_scrape_limits import BIG, RUNNING, VLLM, WAITING, duplicated

pytestmark = pytest.mark.slow


@pytest.fixture
def exporters() -> Iterator[dict[str, SlowExporter]]:
    made = {
        "slow": SlowExporter(L4_PROM, mode="trickle_body", trickle_s=1.0),
        "big": SlowExporter(VLLM + BIG, mode="chunked"),
        "dup": SlowExporter(
            duplicated(duplicated(VLLM, RUNNING, f"{RUNNING} 7"), WAITING, f"{WAITING} 9"), mode="ok"
        ),
    }
    yield made
    for e in made.values():
        e.close()


def health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=10).json()


def source(url: str, name: str) -> dict:
    return next(s for s in health(url)["sources"] if s["name"] == name)


def rows(url: str, table: str) -> list[dict]:
    r = httpx.get(f"{url}/api/v1/tables/{table}", params={"limit": 100_000}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["rows"]


@pytest.mark.timeout(180)
def test_slow_big_and_duplicating_exporters_through_the_collector(
    tmp_path: Path, exporters: dict[str, SlowExporter]
) -> None:
    slow, big, dup = exporters["slow"], exporters["big"], exporters["dup"]
    proc, url = start_collector(
        tmp_path / "scrape.duckdb",
        *("--node", "box-1", "--dcgm", slow.url, "--engine", big.url, "--engine", dup.url),
        *("--scrape-timeout-s", "1", "--max-page-bytes", str(1024 * 1024), "--max-backoff-s", "2"),
        *("--flush-interval", "0.2"),
    )
    names = {"slow": f"dcgm:{slow.url}", "big": f"engine:{big.url}", "dup": f"engine:{dup.url}"}
    try:
        # the trickling exporter: each scrape ends by its 1 s deadline, the source reads down
        wait_until(lambda: source(url, names["slow"])["timeouts"] >= 2)
        s = source(url, names["slow"])
        assert s["status"] == "down" and s["last_error"].startswith("timeout: "), s
        # ... and never holds up another source: the duplicating one is scraped every second meanwhile
        before, hung = dup.requests, slow.requests
        wait_until(lambda: slow.requests >= hung + 2)
        assert dup.requests >= before + 2 and source(url, names["slow"])["status"] == "down"
        # the page over the limit: counted, the source degraded with the reason
        wait_until(lambda: source(url, names["big"])["pages_too_large"] >= 1)
        b = source(url, names["big"])
        assert b["status"] == "degraded" and b["last_error"].startswith("page_too_large: "), b
        assert "over the limit of 1048576 bytes" in b["last_error"]
        assert max(big.sent) < len(big.page.encode()) / 2  # read no further than the limit
        # the duplicated series: counted and visible in /health; the source is ok
        wait_until(lambda: source(url, names["dup"])["duplicate_series"] >= 4)
        assert source(url, names["dup"])["status"] == "ok"
        assert health(url)["status"] == "degraded"

        # the pages are fixed: both sources read ok again within the backoff cap, the errors cleared
        slow.mode, big.mode, big.page = "ok", "ok", VLLM
        fixed_s = time.monotonic()

        def recovered() -> bool:
            by_name = {s["name"]: s for s in health(url)["sources"]}
            return all(
                by_name[names[k]]["status"] == "ok" and by_name[names[k]]["last_error"] is None
                for k in ("slow", "big")
            )

        wait_until(recovered, timeout_s=30)  # was 50 s and more: the backoff had grown to 32 s
        recovery_s = time.monotonic() - fixed_s
        print(f"recovered {recovery_s:.1f} s after the pages were fixed (backoff cap 2 s)")
        assert health(url)["status"] == "ok"
        wait_until(lambda: len(rows(url, "gpu_samples")) >= 1)

        # in the store: one value per natural key, the first of each duplicated series
        engine = rows(url, "engine_metrics")
        keys = Counter(
            (
                r["node"],
                r["endpoint"],
                r["engine"],
                r["ts_s"],
                r["metric"],
                json.dumps(r["labels"], sort_keys=True),
            )
            for r in engine
            if r["endpoint"] == dup.url
        )
        assert keys and max(keys.values()) == 1
        values = {(r["metric"], r["value"]) for r in engine if r["endpoint"] == dup.url}
        assert {v for m, v in values if m == "requests_running"} == {3.0}
        assert {v for m, v in values if m == "requests_waiting"} == {1.0}
        kinds = {(e["source"], e["kind"]) for e in rows(url, "ingest_errors")}
        assert {
            (names["slow"], "timeout"),
            (names["big"], "page_too_large"),
            (names["dup"], "duplicate_series"),
        } <= kinds
    finally:
        proc.terminate()
        proc.wait(timeout=30)
