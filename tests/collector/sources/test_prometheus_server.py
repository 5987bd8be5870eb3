"""PrometheusQuerySource against a REAL Prometheus server scraping a local dcgm + vLLM exposition.

Needs the ``prometheus`` binary (Debian: ``apt-get install -y --no-install-recommends prometheus``);
skipped with that reason where it is absent.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from collector.sources import TABLE_ENGINE_METRICS, TABLE_GPU_SAMPLES, PrometheusQuerySource
from tests.collector.sources import expositions as ex
from tests.collector.sources.conftest import L4_PROM, TEXT, LocalServer, _handler
from tests.conftest import stop_process

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus binary not found (install: apt-get install -y --no-install-recommends prometheus)",
)
MIB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vllm(prompt: float) -> str:
    return ex.vllm(prompt=prompt, gen=1000, ttft=(2.0, 10), itl=(5.0, 990), e2e=(30.0, 10), finished=10)


@dataclass
class RealProm:
    url: str
    targets: LocalServer
    target: str  # host:port Prometheus scrapes

    def instant(self, query: str) -> list[dict]:
        # a query's answer waits for a loaded host (Prometheus beside collectors on 2 cores)
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=60)
        body = r.json()
        return body["data"]["result"] if body.get("status") == "success" else []

    def wait_for(self, query: str, pred=lambda res: bool(res), timeout_s: float = 120.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                res = self.instant(query)
                if pred(res):
                    return res
            except (httpx.HTTPError, ValueError):  # not up yet, or "Service Unavailable" while starting
                pass
            time.sleep(0.2)
        raise AssertionError(f"Prometheus never answered {query!r} as expected")


@pytest.fixture(scope="module")
def real_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealProm]:
    targets = LocalServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(targets))
    port = httpd.server_address[1]
    targets.url = f"http://127.0.0.1:{port}"
    targets.routes["/metrics"] = (200, L4_PROM, TEXT)
    targets.routes["/engine/metrics"] = (200, _vllm(100), TEXT)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    tmp: Path = tmp_path_factory.mktemp("prometheus")
    target = f"127.0.0.1:{port}"
    (tmp / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: dcgm\n    static_configs:\n      - targets: ['{target}']\n"
        f"  - job_name: vllm\n    metrics_path: /engine/metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    web = f"127.0.0.1:{_free_port()}"
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address={web}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = RealProm(f"http://{web}", targets, target)
    try:
        prom.wait_for('up{job="dcgm"} == 1')
        prom.wait_for("DCGM_FI_DEV_POWER_USAGE")
        prom.wait_for('{__name__="vllm:prompt_tokens_total"}')
        # A few scrapes, so the aligned query window (which ends on a whole step) holds data.
        prom.wait_for("count_over_time(DCGM_FI_DEV_POWER_USAGE[1m]) >= 3")
        prom.wait_for('count_over_time({__name__="vllm:prompt_tokens_total"}[1m]) >= 3')
        yield prom
    except AssertionError:
        log.flush()
        print((tmp / "prometheus.log").read_text()[-4000:])
        raise
    finally:
        stop_process(proc)
        log.close()
        httpd.shutdown()
        httpd.server_close()


def test_real_prometheus_dcgm_and_engine_series(real_prom: RealProm) -> None:
    src = PrometheusQuerySource(real_prom.url, step_s=1.0, lookback_s=30.0)
    try:
        assert src.available()
        result = src.poll()
        assert result.ok and not result.degraded, result.errors
        gpu = result.table_rows(TABLE_GPU_SAMPLES)
        assert gpu, "no gpu rows"
        r = gpu[-1]
        assert r["node"] == "i-030791dc5a37cd257"  # the Hostname label survives Prometheus
        assert r["source"] == f"prometheus:{real_prom.url}"
        assert (r["device"], r["uuid"], r["name"]) == (
            "cuda:0",
            "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
            "NVIDIA L4",
        )
        assert r["power_w"] == pytest.approx(16.365)
        assert r["energy_mj"] == 4_742_776
        assert r["sm_clock_mhz"] == 210 and r["temperature_c"] == 31.0
        assert r["mem_total_bytes"] == (22_563 + 470) * MIB
        assert len({x["ts_s"] for x in gpu}) == len(gpu)  # one row per GPU per timestamp
        eng = result.table_rows(TABLE_ENGINE_METRICS)
        prompt = [x for x in eng if x["metric"] == "prompt_tokens_total"]
        assert prompt and all(x["value"] == 100 for x in prompt)
        assert {x["endpoint"] for x in prompt} == {real_prom.target}
        assert {x["engine"] for x in eng} == {"vllm"}
        running = [x for x in eng if x["metric"] == "requests_running"]
        assert running[0]["labels"] == {"engine": "0", "model_name": ex.MODEL}

        # The engine processes 200 more prompt tokens; the next poll's per-second rates add up to them.
        real_prom.targets.routes["/engine/metrics"] = (200, _vllm(300), TEXT)
        real_prom.wait_for("vllm:prompt_tokens_total == 300")
        time.sleep(1.1)  # let the evaluation step that sees 300 close
        later = src.poll(force=True)
        assert later.ok, later.errors
        rates = [x for x in later.table_rows(TABLE_ENGINE_METRICS) if x["metric"] == "prompt_tokens_per_s"]
        assert sum(x["value"] for x in rates) == pytest.approx(200.0)  # step 1 s: rate x 1 s = tokens
    finally:
        src.close()


def test_real_prometheus_rejects_a_bad_query(real_prom: RealProm) -> None:
    src = PrometheusQuerySource(real_prom.url, step_s=1.0, lookback_s=10.0)
    src.queries["engine"] = "sum(("  # PromQL syntax error → status: error
    try:
        result = src.poll()
        assert result.ok
        assert result.error_count("query_error") == 1
        assert "bad_data" in result.errors[0].message
        assert result.table_rows(TABLE_GPU_SAMPLES)
        assert src.health().status == "degraded"
    finally:
        src.close()
