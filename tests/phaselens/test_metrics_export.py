"""GET /metrics of a real collector on a real store with live (emulated) data: the Prometheus text
format, values equal to the analytics summary of the same window, cheap scrapes, the failure path,
and a real Prometheus scraping it and answering every PromQL query of docs/grafana/phaselens.json.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.service import Collector, CollectorSettings
from collector.store import Store
from collector.store.synthetic import build, t0_ending_now
from phaselens.metrics_export import DERIVED_HELP, MetricsExporter
from phaselens.overview import OverviewCache, OverviewService
from tests.collector.conftest import start_collector
from tests.collector.sources.conftest import L4_PROM, TEXT, LocalServer, _handler
from tests.collector.sources.test_prometheus_server import PROMETHEUS, RealProm, _free_port
from tests.conftest import stop_process

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docs" / "grafana" / "phaselens.json"
PROM_DOC = ROOT / "docs" / "PROMETHEUS.md"
TRUST = {"measured", "emulated", "simulated", "host-bound", "estimated"}


@dataclass
class Live:
    url: str
    db_copy: Path  # the same store before the collector opened it (for in-process tests)
    target: str  # host:port of the collector


def _build_live_store(path: Path) -> None:
    """64 emulated GPUs, 60 s of 100 ms samples ending now, 2,000 requests (collector/store/synthetic.py)."""
    build(path, samples=38_400, requests=2000, t0=t0_ending_now(38_400))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("metrics")
    db = tmp / "live.duckdb"
    _build_live_store(db)
    shutil.copy(db, tmp / "copy.duckdb")
    dcgm = LocalServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(dcgm))
    dcgm.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    dcgm.routes["/metrics"] = (200, L4_PROM, TEXT)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    # one computation at start, none after it for an hour: every later scrape reads that one
    proc, url = start_collector(db, "--dcgm", f"{dcgm.url}/metrics", "--metrics-interval-s", "3600")
    try:
        deadline = time.monotonic() + 120
        while 'phaselens_derived_computations_total{result="ok"} 1.0' not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the derived figures were never computed"
            time.sleep(0.3)
        yield Live(url, tmp / "copy.duckdb", url.removeprefix("http://"))
    finally:
        proc.terminate()
        proc.wait(20)
        httpd.shutdown()
        httpd.server_close()


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict, name: str, **labels: str) -> float:
    family = name.removesuffix("_total") if name.endswith("_total") else name
    got = [
        s.value
        for s in fams[family].samples
        if s.name == name and all(s.labels.get(k, "") == v for k, v in labels.items())
    ]
    assert len(got) == 1, f"{name}{labels}: {len(got)} samples"
    return got[0]


def test_exposition_is_prometheus_text_with_help_type_and_trust(live: Live):
    r = httpx.get(f"{live.url}/metrics")
    assert r.status_code == 200
    assert "version=0.0.4" in r.headers["content-type"]
    text = r.text
    assert re.search(r"^# HELP phaselens_phase_time_ratio .+$", text, re.M)
    assert re.search(r"^# TYPE phaselens_phase_time_ratio gauge$", text, re.M)
    assert re.search(r"^# TYPE phaselens_ingest_rows_total counter$", text, re.M)
    fams = _families(text)
    for name in DERIVED_HELP:
        assert name in fams, f"{name} not exported"
        fam = fams[name]
        assert fam.type == "gauge" and fam.documentation
        for s in fam.samples:
            labels = set(s.labels["trust"].split(","))
            assert labels <= TRUST and labels, s
    # per GPU, per pool and for the fleet
    scopes = {s.labels["scope"] for s in fams["phaselens_phase_time_ratio"].samples}
    assert scopes == {"gpu", "pool"}
    assert {s.labels["scope"] for s in fams["phaselens_cost_per_million_tokens_dollars"].samples} == {
        "fleet",
        "pool",
        "gpu",
    }
    pools = {s.labels["pool"] for s in fams["phaselens_phase_time_ratio"].samples}
    assert {"prefill", "decode", "mixed"} <= pools
    # the collector's own health: the dcgm source is up and its rows were written
    up = fams["phaselens_source_up"].samples
    assert len(up) == 1 and up[0].labels["source"].startswith("dcgm")
    assert _value(fams, "phaselens_derived_up") == 1.0
    assert _value(fams, "phaselens_derived_window_seconds") == 300.0


def test_every_exported_family_is_documented(live: Live):
    doc = PROM_DOC.read_text()
    for name in _families(httpx.get(f"{live.url}/metrics").text):
        shown = name + "_total" if f"{name}_total" in doc else name
        assert f"`{shown}`" in doc, f"{shown} missing from docs/PROMETHEUS.md"


def test_values_equal_the_summary_of_the_same_window(live: Live):
    fams = _families(httpx.get(f"{live.url}/metrics").text)
    start = _value(fams, "phaselens_derived_window_start_timestamp_seconds")
    end = _value(fams, "phaselens_derived_window_end_timestamp_seconds")
    assert end - start == pytest.approx(300.0)
    summary = httpx.get(
        f"{live.url}/api/v1/analytics/summary", params={"start_s": start, "end_s": end}, timeout=120
    ).json()
    parts = summary["parts"]
    for pool in ("prefill", "decode", "mixed"):
        row = next(p for p in parts["phases"]["per_pool"] if p["role"] == pool)
        got = _value(fams, "phaselens_phase_time_ratio", scope="pool", pool=pool, phase="decode")
        assert got == pytest.approx(row["frac_decode"], rel=1e-9)
        host = _value(fams, "phaselens_phase_time_ratio", scope="pool", pool=pool, phase="host_bound")
        assert host == pytest.approx(row["frac_host"] + row["frac_gap"], rel=1e-9)
        idle = next(p for p in parts["idle"]["per_pool"] if p["role"] == pool)
        got = _value(fams, "phaselens_stranded_compute_ratio", scope="pool", pool=pool)
        assert got == pytest.approx(idle["frac_stranded_compute"], rel=1e-9)
        cost = next(p for p in parts["cost"]["by_pool"] if p["pool"] == pool)
        if cost["usd_per_1m_input"] is not None:
            got = _value(
                fams, "phaselens_cost_per_million_tokens_dollars", scope="pool", pool=pool, kind="input"
            )
            assert got == pytest.approx(cost["usd_per_1m_input"], rel=1e-9)
    decode_pool = next(p for p in parts["idle"]["per_pool"] if p["role"] == "decode")
    assert decode_pool["frac_stranded_compute"] > 0.3  # decode GPUs at 18 % SM activity: mostly stranded
    gpu = next(p for p in parts["phases"]["per_gpu"] if p["uuid"] == "GPU-bench-50")
    got = _value(fams, "phaselens_phase_time_ratio", scope="gpu", gpu="GPU-bench-50", phase="decode")
    assert got == pytest.approx(gpu["frac_decode"], rel=1e-9)
    slo = parts["latency"]["attainment"]["both"]
    assert _value(fams, "phaselens_slo_attainment_ratio", slo="both") == pytest.approx(slo, rel=1e-9)


def test_a_scrape_never_recomputes(live: Live):
    before = _families(httpx.get(f"{live.url}/metrics").text)
    for _ in range(20):
        text = httpx.get(f"{live.url}/metrics").text
    after = _families(text)
    for result in ("ok", "error"):
        n0 = _value(before, "phaselens_derived_computations_total", result=result)
        assert _value(after, "phaselens_derived_computations_total", result=result) == n0
    assert _value(after, "phaselens_derived_computations_total", result="ok") == 1.0
    last = "phaselens_derived_last_success_timestamp_seconds"
    assert _value(after, last) == _value(before, last)


def test_a_failed_computation_keeps_the_last_figures_and_says_so(live: Live):
    store = Store.open(live.db_copy)
    collector = Collector(CollectorSettings(db_path=str(live.db_copy)), store, sources=[])
    exporter = MetricsExporter(
        collector, OverviewService(store, lambda: 0), window_s=300.0, interval_s=3600.0
    )
    assert exporter.refresh()
    good = _families(exporter.render().decode())
    decode = _value(good, "phaselens_phase_time_ratio", scope="pool", pool="decode", phase="decode")
    store.close()  # the next computation cannot read the store
    exporter.overviews.cache = OverviewCache()  # no cached answer to fall back on
    assert not exporter.refresh()
    fams = _families(exporter.render().decode())
    assert _value(fams, "phaselens_derived_up") == 0.0
    assert _value(fams, "phaselens_derived_computations_total", result="error") == 1.0
    assert _value(fams, "phaselens_derived_computations_total", result="ok") == 1.0
    kept = _value(fams, "phaselens_phase_time_ratio", scope="pool", pool="decode", phase="decode")
    assert kept == decode  # what was known is still exported
    assert "closed" in (exporter.snapshot.last_error or "")


def test_grafana_dashboard_is_importable_json():
    dash = json.loads(GRAFANA.read_text())
    assert dash["uid"] and dash["title"]
    variables = dash["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for p in panels:
        assert p["title"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"] and all(t["expr"] for t in p["targets"])
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not found (apt-get install prometheus)")
def test_real_prometheus_scrapes_and_every_grafana_query_returns_data(live: Live, tmp_path: Path) -> None:
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: phaselens\n    static_configs:\n      - targets: ['{live.target}']\n"
    )
    web = f"127.0.0.1:{_free_port()}"
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={web}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    prom = RealProm(f"http://{web}", LocalServer(url=""), live.target)
    try:
        prom.wait_for('up{job="phaselens"} == 1', timeout_s=60)
        prom.wait_for("count_over_time(phaselens_derived_up[1m]) >= 3", timeout_s=60)
        res = prom.wait_for('phaselens_phase_time_ratio{scope="pool", pool="decode", phase="decode"}')
        fams = _families(httpx.get(f"{live.url}/metrics").text)
        want = _value(fams, "phaselens_phase_time_ratio", scope="pool", pool="decode", phase="decode")
        assert float(res[0]["value"][1]) == pytest.approx(want, rel=1e-9)
        assert res[0]["metric"]["trust"] == "emulated"
        dash = json.loads(GRAFANA.read_text())
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                got = prom.wait_for(target["expr"], timeout_s=30)
                assert got, f"{panel['title']}: {target['expr']} returned nothing"
    except AssertionError:
        log.flush()
        print((tmp_path / "prometheus.log").read_text()[-4000:])
        raise
    finally:
        stop_process(proc)
        log.close()


def test_label_values_are_escaped_and_read_back_whole(tmp_path: Path):
    """A pool name with a quote, a backslash and a newline survives the text format."""
    from phaselens.metrics_export import derived_samples

    odd = 'de"co\\de\npool'
    summary = {
        "parts": {
            "phases": {
                "per_pool": [{"role": odd, "frac_decode": 0.75, "frac_prefill": 0.25}],
                "trust": {"labels": ["measured", "estimated"]},
            }
        }
    }
    samples = derived_samples(summary, {})
    assert {s.labels["phase"] for s in samples} == {"decode", "prefill"}  # no made-up zeros for the rest
    with Store.open(tmp_path / "s.duckdb") as store:
        collector = Collector(CollectorSettings(db_path=str(tmp_path / "s.duckdb")), store, sources=[])
        exporter = MetricsExporter(collector, OverviewService(store, lambda: 0))
        exporter.snapshot.samples = samples  # rendered as a scrape renders the last computation
        text = exporter.render().decode()
    lines = [line for line in text.splitlines() if line.startswith("phaselens_phase_time_ratio{")]
    assert len(lines) == 2 and all('\\"' in ln and "\\n" in ln and "\\\\" in ln for ln in lines)
    fams = _families(text)
    got = {
        s.labels["phase"]: (s.labels["pool"], s.labels["trust"], s.value)
        for s in fams["phaselens_phase_time_ratio"].samples
    }
    assert got == {"decode": (odd, "measured,estimated", 0.75), "prefill": (odd, "measured,estimated", 0.25)}


def test_export_window_and_interval_flags_and_bad_values_are_named():
    from phaselens.cli import build_parser
    from phaselens.cli.collect import collect_settings

    parse = build_parser().parse_args
    s = collect_settings(parse(["collect"]))
    assert (s.metrics_window_s, s.metrics_interval_s) == (300.0, 15.0)
    s = collect_settings(parse(["collect", "--metrics-window-s", "900", "--metrics-interval-s", "30"]))
    assert (s.metrics_window_s, s.metrics_interval_s) == (900.0, 30.0)
    with pytest.raises(ValueError, match=r"--metrics-window-s must be in \[10, 86400\] s, got 5"):
        collect_settings(parse(["collect", "--metrics-window-s", "5"]))
    with pytest.raises(ValueError, match=r"--metrics-interval-s must be in \[1, 3600\] s, got 0"):
        collect_settings(parse(["collect", "--metrics-interval-s", "0"]))


def test_nothing_is_computed_until_someone_scrapes(live: Live, tmp_path: Path):
    db = tmp_path / "idle.duckdb"
    shutil.copy(live.db_copy, db)
    with Store.open(db) as store:
        collector = Collector(CollectorSettings(db_path=str(db)), store, sources=[])
        exporter = MetricsExporter(
            collector, OverviewService(store, lambda: 0), window_s=300.0, interval_s=3600.0
        )
        exporter.start()
        try:
            time.sleep(1.5)  # the idle thread wakes every second: it found no scrape
            assert exporter.snapshot.ok_total == 0 and exporter.snapshot.error_total == 0
            first = _families(exporter.render().decode())  # the first scrape: nothing known yet ...
            assert _value(first, "phaselens_derived_up") == 0.0
            assert "phaselens_phase_time_ratio" not in first
            deadline = time.monotonic() + 120
            while exporter.snapshot.ok_total == 0:  # ... and it starts the computation
                assert time.monotonic() < deadline, "a scrape did not start the computation"
                time.sleep(0.1)
            assert "phaselens_phase_time_ratio" in _families(exporter.render().decode())
        finally:
            exporter.stop()
