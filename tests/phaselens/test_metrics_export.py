"""GET /metrics of a real collector on a real store with live (emulated) data: the Prometheus text
format (promtool check metrics clean), counters that add up to the analytics summary of the span they
counted, restarts that neither lose nor double-count, cheap scrapes, the failure path, and a real
Prometheus scraping two collectors: a counter summed across them is their total, and every query of
the Grafana dashboard and of the alert rule (docs/grafana/, phaselens/grafana_dashboard.py) returns
series.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.service import Collector, CollectorSettings
from collector.store import Store
from collector.store.synthetic import NODE, build, t0_ending_now
from phaselens.metrics_counters import COUNTERS, REQUEST_SETTLE_S, Step, state_path
from phaselens.metrics_export import BORN_HOLD_STEPS, MetricsExporter
from phaselens.testing import start_collector
from tests.collector.sources.conftest import L4_PROM, TEXT, LocalServer, _handler
from tests.collector.sources.test_prometheus_server import PROMETHEUS, RealProm, _free_port
from tests.conftest import stop_process

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "docs" / "grafana" / "phaselens.json"
ALERTS = ROOT / "docs" / "grafana" / "phaselens-alerts.yml"
PROM_DOC = ROOT / "docs" / "PROMETHEUS.md"
PROMTOOL = shutil.which("promtool")  # Debian's prometheus package ships it beside prometheus
TRUST = {"measured", "emulated", "simulated", "host-bound", "estimated"}
SAMPLES = 12_800  # 64 emulated GPUs x 20 s of 100 ms samples
AGO_S = 160.0  # the data ends this long before now: settled, and its requests too (REQUEST_SETTLE_S)
ACTIONS = (("apply", "applied", False), ("apply", "planned", True), ("rollback", "applied", False))
HOST = "bench-host"
# steps of 60 s: the data in one, its requests in the next (test_a_restart_... splits the data itself)
COUNT_ARGS = ("--metrics-interval-s", "1", "--metrics-window-s", "60")
# a test's own scrape of a collector: httpx's default 5 s is short for a collector busy counting on a
# loaded host (the two-collector test: 5 processes and Prometheus on 2 cores)
SCRAPE_S = 60.0


@dataclass
class Data:
    db: Path
    t0: float
    end_s: float  # the last sample


@dataclass
class Live:
    url: str
    data: Data
    db_copy: Path  # the same store before the collector opened it (for in-process tests)
    target: str  # host:port of the collector


def _build(path: Path) -> Data:
    """64 emulated GPUs, 20 s of 100 ms samples ending AGO_S ago, 700 requests, three control
    actions and two control events (collector/store/synthetic.py), and a saved cursor just before
    the data (and its requests' settle lag), so that a collector on it counts all of it."""
    t0 = t0_ending_now(SAMPLES) - AGO_S
    build(path, samples=SAMPLES, requests=700, t0=t0)
    with Store.open(path) as store, store.transaction() as con:
        # as a dcgm-exporter reports its own host name (a pod's, under Kubernetes): Hostname is that
        con.execute("UPDATE devices SET exporter_hostname = ?", [HOST])
        for i, (action, status, dry_run) in enumerate(ACTIONS):
            con.execute(
                "INSERT INTO actions (action_id, node, ts_s, actor, action, dry_run, status, rolled_back) "
                "VALUES (?, 'bench', ?, 'test', ?, ?, ?, FALSE)",
                [f"act-{i}", t0 + 10 + i, action, dry_run, status],
            )
        for i, action in enumerate(("set_role", "add_worker")):
            con.execute(
                "INSERT INTO control_events (node, source, ts_s, action) VALUES ('bench', 'stack', ?, ?)",
                [t0 + 20 + i, action],
            )
    data = Data(path, t0, t0 + SAMPLES // 64 * 0.1)
    _save_cursor(path, t0)
    return data


def _save_cursor(db: Path, t0: float) -> None:
    state = state_path(db)
    assert state is not None
    # requests are counted REQUEST_SETTLE_S behind the GPU data: theirs from before t0 on too
    state.write_text(json.dumps({"counted_until_s": math.floor(t0 - 2)}))


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


def _sum(fams: dict, name: str, **labels: str) -> float:
    family = name.removesuffix("_total")
    if family not in fams:
        return 0.0
    return sum(
        s.value
        for s in fams[family].samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _wait_counted(url: str, data: Data, timeout_s: float = 120, *, born: bool = True) -> dict:
    """Scrape until the counters have passed the data's end (and its requests' settle lag); with
    ``born``, until the series found then show their values too."""
    deadline = time.monotonic() + timeout_s
    while True:
        fams = _families(httpx.get(f"{url}/metrics", timeout=SCRAPE_S).text)
        if "phaselens_counters_end_timestamp_seconds" in fams:
            end = _value(fams, "phaselens_counters_end_timestamp_seconds")
            if end > data.end_s + REQUEST_SETTLE_S + 1:
                if not born:
                    return fams
                # new series are born at 0 for BORN_HOLD_STEPS intervals (1 s here), then have their values
                time.sleep(BORN_HOLD_STEPS + 0.5)
                return _families(httpx.get(f"{url}/metrics", timeout=SCRAPE_S).text)
        assert time.monotonic() < deadline, "the counters never caught up with the data"
        time.sleep(0.3)


@pytest.fixture(scope="module")
def source_data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    tmp = tmp_path_factory.mktemp("metrics-data")
    return _build(tmp / "source.duckdb")


def _copy(data: Data, to: Path) -> Data:
    shutil.copy(data.db, to)
    _save_cursor(to, data.t0)
    return Data(to, data.t0, data.end_s)


@contextmanager
def _dcgm() -> Iterator[str]:
    """A dcgm-exporter page (the L4 capture) on a local port: its /metrics URL."""
    dcgm = LocalServer(url="")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(dcgm))
    dcgm.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    dcgm.routes["/metrics"] = (200, L4_PROM, TEXT)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"{dcgm.url}/metrics"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def live(source_data: Data, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("metrics")
    data = _copy(source_data, tmp / "live.duckdb")
    shutil.copy(data.db, tmp / "copy.duckdb")
    with _dcgm() as dcgm:
        proc, url = start_collector(data.db, "--dcgm", dcgm, *COUNT_ARGS)
        try:
            _wait_counted(url, data)
            yield Live(url, data, tmp / "copy.duckdb", url.removeprefix("http://"))
        finally:
            stop_process(proc)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not found (apt-get install prometheus ships it)")
def test_exposition_is_promtool_clean(live: Live):
    text = httpx.get(f"{live.url}/metrics", timeout=SCRAPE_S).text
    assert "phaselens_gpu_seconds_total{" in text
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)  # type: ignore[list-item]
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_exposition_is_prometheus_text_with_dcgm_gpu_labels(live: Live):
    r = httpx.get(f"{live.url}/metrics", timeout=SCRAPE_S)
    assert r.status_code == 200
    assert "version=0.0.4" in r.headers["content-type"]
    text = r.text
    for name in COUNTERS:
        assert re.search(rf"^# TYPE {name}_total counter$", text, re.M), name
        assert re.search(rf"^# HELP {name}_total .+$", text, re.M), name
    fams = _families(text)
    seconds = fams["phaselens_gpu_seconds"].samples
    bench = [s for s in seconds if s.labels["Hostname"] == HOST]
    assert {s.labels["UUID"] for s in bench} == {f"GPU-bench-{i}" for i in range(64)}
    for s in bench:  # dcgm-exporter's labels: gpu is the index, UUID the UUID
        assert s.labels["gpu"] == s.labels["UUID"].removeprefix("GPU-bench-")
        assert s.labels["pool"] in {"prefill", "decode", "mixed"}
        assert s.labels["gpu_name"].startswith("NVIDIA H100")
    # no series without a pool: energy and cost are per GPU and pool, aggregates are PromQL sums
    for name in ("phaselens_gpu_energy_joules", "phaselens_gpu_cost_dollars", "phaselens_tokens"):
        assert all(s.labels["pool"] for s in fams[name].samples), name
    assert {s.labels["category"] for s in seconds} == {
        "productive_prefill",
        "stranded_bandwidth",
        "productive_decode",
        "stranded_compute",
        "host_bound",
        "other_busy",
        "idle",
        "unsampled",
    }
    # trust: one boolean series per part and label, whatever the labels are
    trust = fams["phaselens_trust"].samples
    assert {(s.labels["part"], s.labels["trust"]) for s in trust} == {
        (p, t) for p in ("gpu_time", "cost", "requests") for t in TRUST
    }
    assert _value(fams, "phaselens_trust", part="gpu_time", trust="emulated") == 1.0
    assert _value(fams, "phaselens_trust", part="gpu_time", trust="measured") == 0.0
    up = fams["phaselens_source_up"].samples
    assert len(up) == 1 and up[0].labels["source"].startswith("dcgm")
    assert _value(fams, "phaselens_derived_up") == 1.0


def test_every_exported_family_is_documented(live: Live):
    doc = PROM_DOC.read_text()
    for name, fam in _families(httpx.get(f"{live.url}/metrics", timeout=SCRAPE_S).text).items():
        shown = name + "_total" if fam.type == "counter" else name
        assert f"`{shown}`" in doc, f"{shown} missing from docs/PROMETHEUS.md"


def test_counters_add_up_to_the_summary_of_the_span_they_counted(live: Live):
    fams = _families(httpx.get(f"{live.url}/metrics", timeout=SCRAPE_S).text)
    start = _value(fams, "phaselens_counters_start_timestamp_seconds")
    assert start < live.data.t0
    summary = httpx.get(
        f"{live.url}/api/v1/analytics/summary",
        params={
            "start_s": start,
            "end_s": _value(fams, "phaselens_counters_end_timestamp_seconds"),
            "node": NODE,
        },
        timeout=120,
    ).json()
    total = summary["parts"]["cost"]["total"]
    total = total[0] if isinstance(total, list) else total
    got = _sum(fams, "phaselens_gpu_seconds_total", Hostname=HOST)
    assert got == pytest.approx(total["gpu_seconds"], rel=1e-6)  # no sample interval lost at a step
    got = _sum(fams, "phaselens_gpu_energy_joules_total", Hostname=HOST)
    assert got == pytest.approx(total["energy_j"], rel=1e-3)
    got = _sum(fams, "phaselens_gpu_cost_dollars_total", Hostname=HOST)
    assert got == pytest.approx(total["cost_usd"], rel=1e-3)
    for side in ("input", "output"):
        got = _sum(fams, "phaselens_tokens_total", Hostname=HOST, side=side)
        assert got == pytest.approx(total[f"{side}_tokens"], rel=1e-9)
    stranded = _sum(fams, "phaselens_gpu_seconds_total", Hostname=HOST, category="stranded_compute")
    assert stranded == pytest.approx(total["stranded_decode_s"], rel=1e-3)
    decode_pool = next(p for p in summary["parts"]["cost"]["by_pool"] if p["pool"] == "decode")
    got = _sum(fams, "phaselens_gpu_seconds_total", pool="decode", category="stranded_compute")
    assert got == pytest.approx(decode_pool["stranded_decode_s"], rel=1e-3)
    assert got / _sum(fams, "phaselens_gpu_seconds_total", pool="decode") > 0.3  # decode at 18 % SM
    attainment = summary["parts"]["latency"]["attainment"]
    assert _value(fams, "phaselens_requests_total") == attainment["requests"] == 700
    assert _value(fams, "phaselens_requests_slo_met_total", slo="both") == attainment["met"]
    for action, status, dry_run in ACTIONS:
        labels = {"action": action, "status": status, "dry_run": str(dry_run).lower()}
        assert _value(fams, "phaselens_control_actions_total", **labels) == 1.0
    assert _value(fams, "phaselens_control_events_total", action="set_role") == 1.0


def _exporter(db: Path, **kw: float) -> tuple[Store, MetricsExporter]:
    store = Store.open(db)
    collector = Collector(CollectorSettings(db_path=str(db)), store, sources=[])
    exporter = MetricsExporter(collector, window_s=kw.pop("window_s", 100.0), interval_s=3600.0, **kw)
    exporter.snapshot.totals.hold_s = 0.0  # new series with their values at once
    return store, exporter


def test_a_restart_resumes_where_the_last_process_stopped(live: Live, tmp_path: Path):
    """Counting in two processes (the second started from the first's saved cursor, its counters
    from 0: a counter reset) gives the totals of counting in one."""
    whole_db, split_db = tmp_path / "whole.duckdb", tmp_path / "split.duckdb"
    for db in (whole_db, split_db):
        _copy(Data(live.db_copy, live.data.t0, live.data.end_s), db)
    now = live.data.end_s + REQUEST_SETTLE_S + 60

    def count(db: Path, until_s: float) -> dict:
        store, exporter = _exporter(db, window_s=1000.0)
        try:
            assert exporter.refresh(now_s=until_s) and exporter.snapshot.end_s == math.floor(until_s - 30)
            return dict(exporter.snapshot.totals.sums)
        finally:
            store.close()

    whole = count(whole_db, now)
    first = count(split_db, live.data.t0 + 40)  # stops in the middle of the data
    second = count(split_db, now)  # a new process: from the saved cursor
    for (name, labels), v in whole.items():
        if name in ("phaselens_gpu_seconds", "phaselens_tokens") or name.startswith("phaselens_requests"):
            both = first.get((name, labels), 0.0) + second.get((name, labels), 0.0)
            assert both == pytest.approx(v, rel=1e-6, abs=1e-6), (name, labels)
    total = sum(v for (n, _), v in whole.items() if n == "phaselens_gpu_seconds")
    assert sum(v for (n, _), v in first.items() if n == "phaselens_gpu_seconds") < total / 2
    for name in ("phaselens_gpu_energy_joules", "phaselens_gpu_cost_dollars"):
        # each window fits its own power model: the split between categories moves, their sum does not
        both = sum(v for (n, _), v in [*first.items(), *second.items()] if n == name)
        assert both == pytest.approx(sum(v for (n, _), v in whole.items() if n == name), rel=1e-6), name


def test_a_cursor_that_cannot_be_saved_is_not_left_stale(live: Live, tmp_path: Path):
    db = tmp_path / "c.duckdb"
    _copy(Data(live.db_copy, live.data.t0, live.data.end_s), db)
    store, exporter = _exporter(db, window_s=10.0)
    try:
        state = exporter.state_file
        assert state is not None and state.exists()
        assert exporter.refresh()  # counted 10 s: the cursor saved
        assert json.loads(state.read_text())["counted_until_s"] == exporter.snapshot.end_s
        state.with_name(state.name + ".tmp").mkdir()  # the next save cannot write its temporary file
        assert exporter.refresh()  # the counting goes on ...
        assert not state.exists()  # ... and no stale cursor is left for a restart to count from again
    finally:
        store.close()


def test_a_scrape_never_counts(live: Live, tmp_path: Path):
    db = tmp_path / "s.duckdb"
    _copy(Data(live.db_copy, live.data.t0, live.data.end_s), db)
    store, exporter = _exporter(db)
    try:
        assert exporter.refresh()
        exporter.render()  # series are born at 0: the first scrape shows them at 0
        before = exporter.render()
        for _ in range(20):
            after = exporter.render()
        fams = _families(after.decode())
        assert _value(fams, "phaselens_derived_computations_total", result="ok") == 1.0
        assert _sum(fams, "phaselens_gpu_seconds_total") == _sum(
            _families(before.decode()), "phaselens_gpu_seconds_total"
        )
    finally:
        store.close()


def test_a_failed_step_counts_nothing_and_says_so(live: Live, tmp_path: Path):
    db = tmp_path / "f.duckdb"
    _copy(Data(live.db_copy, live.data.t0, live.data.end_s), db)
    store, exporter = _exporter(db)
    assert exporter.refresh()
    cursor = exporter.snapshot.end_s
    exporter.render()  # series are born at 0: the first scrape shows them at 0
    good = _families(exporter.render().decode())
    store.close()  # the next step cannot read the store
    assert not exporter.refresh()
    fams = _families(exporter.render().decode())
    assert _value(fams, "phaselens_derived_up") == 0.0
    assert _value(fams, "phaselens_derived_computations_total", result="error") == 1.0
    assert _value(fams, "phaselens_derived_computations_total", result="ok") == 1.0
    assert exporter.snapshot.end_s == cursor  # retried from the same point: nothing skipped
    assert _sum(fams, "phaselens_gpu_seconds_total") == _sum(good, "phaselens_gpu_seconds_total")
    assert "closed" in (exporter.snapshot.last_error or "")


def test_counters_never_decrease_and_label_values_are_escaped(tmp_path: Path):
    """A step whose share of a category came out negative lowers nothing; a pool name with a quote,
    a backslash and a newline survives the text format."""
    odd = 'de"co\\de\npool'
    key = ("phaselens_gpu_seconds", ("n", "0", "GPU-x", "", odd, "", "idle"))
    with Store.open(tmp_path / "s.duckdb") as store:
        collector = Collector(CollectorSettings(db_path=str(tmp_path / "s.duckdb")), store, sources=[])
        exporter = MetricsExporter(collector)
        totals = exporter.snapshot.totals
        totals.add(Step(0, 1, {key: 5.0}), now_s=time.time())
        assert totals.hold_s == BORN_HOLD_STEPS * 15.0
        assert "} 0.0" in exporter.render().decode()  # born at 0 ...
        totals.add(Step(1, 2, {key: -1.0}), now_s=time.time())
        totals.release(time.time() + totals.hold_s)
        assert totals.exported[key] == 4.0  # ... its value once it has been shown at 0 long enough
        for inc in (0.5, 2.0):
            totals.add(Step(0, 1, {key: inc}), now_s=time.time())
        assert totals.sums[key] == 6.5 and totals.exported[key] == 6.5
        totals.add(Step(1, 2, {key: -0.25}), now_s=time.time())
        assert totals.exported[key] == 6.5  # the running maximum: never lower
        text = exporter.render().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("phaselens_gpu_seconds_total{")]
    assert len(lines) == 1 and '\\"' in lines[0] and "\\n" in lines[0] and "\\\\" in lines[0]
    (s,) = _families(text)["phaselens_gpu_seconds"].samples
    assert s.labels["pool"] == odd and s.value == 6.5


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
    assert collect_settings(parse(["collect"])).metrics_settle_s == 30.0
    assert collect_settings(parse(["collect", "--metrics-settle-s", "0"])).metrics_settle_s == 0.0
    with pytest.raises(ValueError, match=r"--metrics-settle-s must be in \[0, 3600\] s, got -1"):
        collect_settings(parse(["collect", "--metrics-settle-s", "-1"]))


def test_nothing_is_counted_until_someone_scrapes(live: Live, tmp_path: Path):
    db = tmp_path / "idle.duckdb"
    _copy(Data(live.db_copy, live.data.t0, live.data.end_s), db)
    store, exporter = _exporter(db, window_s=1000.0)
    exporter.start()
    try:
        time.sleep(1.5)  # the idle thread wakes every second: it found no scrape
        assert exporter.snapshot.ok_total == 0 and exporter.snapshot.error_total == 0
        first = _families(exporter.render().decode())  # the first scrape: nothing counted yet ...
        assert _value(first, "phaselens_derived_up") == 0.0
        assert "phaselens_gpu_seconds" not in first
        deadline = time.monotonic() + 120
        while exporter.snapshot.ok_total == 0:  # ... and it starts the counting
            assert time.monotonic() < deadline, "a scrape did not start the counting"
            time.sleep(0.1)
        assert "phaselens_gpu_seconds" in _families(exporter.render().decode())
    finally:
        exporter.stop()
        store.close()


# -- a real Prometheus ----------------------------------------------------------------------------


def _dashboard_queries(**values: str) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target, variable and annotation of the dashboard, with the
    variables set to ``values`` (default All: ``.*``) and Grafana's rate interval to a minute."""
    dash = json.loads(GRAFANA.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for v in dash["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"])
        if m:  # a variable's values: the series it reads must exist with the label
            out.append((f"variable {v['name']}", f"count by ({m[2]}) ({m[1]})"))
    for a in dash["annotations"]["list"]:
        if a.get("expr"):
            out.append((f"annotation {a['name']}", a["expr"].replace("[2m]", "[10m]")))
    subst = {"$__rate_interval": "1m"} | {
        f"${v}": values.get(v, ".*") for v in ("node", "pool", "gpu", "model")
    }
    for k, v in subst.items():
        out = [(w, q.replace(k, v)) for w, q in out]
    return out


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not found (apt-get install prometheus)")
def test_prometheus_sums_two_collectors_and_every_dashboard_query_returns_series(
    source_data: Data, tmp_path: Path
) -> None:
    # the alert's threshold lowered, so that it fires on the test fleet's stranded $ an hour
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"\) > [0-9.]+\n", ") > 0\n", ALERTS.read_text()).replace("for: 15m", "for: 0s"))
    web = f"127.0.0.1:{_free_port()}"
    procs: list[subprocess.Popen] = []
    urls = []
    log = (tmp_path / "prometheus.log").open("w")
    dcgm = _dcgm()
    try:
        dcgm_url = dcgm.__enter__()
        for name in ("a", "b"):  # two collectors, each on its own copy of the store (one step each)
            data = _copy(source_data, tmp_path / f"{name}.duckdb")
            proc, url = start_collector(data.db, "--dcgm", dcgm_url, "--metrics-interval-s", "1")
            procs.append(proc)
            urls.append(url)
        targets = ", ".join(f"'{u.removeprefix('http://')}'" for u in urls)
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{rules}']\n"
            f"scrape_configs:\n  - job_name: phaselens\n    static_configs:\n      - targets: [{targets}]\n"
        )
        procs.append(
            subprocess.Popen(
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
        )
        prom = RealProm(f"http://{web}", LocalServer(url=""), "")
        prom.wait_for('count(up{job="phaselens"} == 1) == 2', timeout_s=120)
        for url in urls:
            _wait_counted(url, source_data, born=False)
        time.sleep(BORN_HOLD_STEPS + 0.5)  # both collectors' new series have their values
        each = [_families(httpx.get(f"{url}/metrics", timeout=SCRAPE_S).text) for url in urls]
        # the stores' GPUs (the dcgm L4 keeps counting live: left out)
        want = sum(_sum(f, "phaselens_gpu_seconds_total", Hostname=HOST) for f in each)
        assert want == pytest.approx(2 * _sum(each[0], "phaselens_gpu_seconds_total", Hostname=HOST))
        # the sum over both collectors' series is their total (each scraped after it caught up)
        res = prom.wait_for(
            f'sum(phaselens_gpu_seconds_total{{Hostname="{HOST}"}})',
            pred=lambda r: bool(r) and float(r[0]["value"][1]) == pytest.approx(want, rel=1e-9),
            timeout_s=120,
        )
        assert float(res[0]["value"][1]) == pytest.approx(want, rel=1e-9)
        per = prom.instant("sum by (instance) (phaselens_tokens_total)")
        assert len(per) == 2
        for where, query in _dashboard_queries():
            got = prom.wait_for(query, timeout_s=120)
            assert got, f"{where}: {query} returned nothing"
            if where in ("Output tokens/s", "$ per 1M tokens (all in)", "Stranded $ per hour"):
                assert float(got[0]["value"][1]) > 0, f"{where}: {query} = {got}"
        # one node, pool and GPU picked (GPU-bench-50 is a decode GPU): the per-GPU panels still answer
        for where, query in _dashboard_queries(node=HOST, pool="decode", gpu="GPU-bench-50"):
            if "GPU-bench-50" in query:
                assert prom.wait_for(query, timeout_s=120), f"{where}: {query} returned nothing"
        none = _dashboard_queries(pool="prefill", gpu="GPU-bench-50")  # a decode GPU is in no prefill pool
        assert not prom.instant(next(q for w, q in none if w == "GPU-time by category"))
        prom.wait_for('ALERTS{alertname="PhaselensStrandedDollarsPerHourHigh", alertstate="firing"}')
    except AssertionError:
        log.flush()
        print((tmp_path / "prometheus.log").read_text()[-4000:])
        raise
    finally:
        for proc in reversed(procs):
            stop_process(proc)
        dcgm.__exit__(None, None, None)
        log.close()


def test_gpu_series_carry_the_model_the_stack_serves(tmp_path: Path):
    """The ``model`` label of a live stack's GPU series is the model the stack serves: its router's
    ``start`` control event (``after.model``, what ``/v1/models`` names) at or before the window;
    before any such event it stays empty, and two stacks serving different models leave it empty
    (the label is per window, not a guess)."""
    from phaselens.metrics_counters import _gpu_rows

    db = tmp_path / "m.duckdb"
    t0 = t0_ending_now(640) - AGO_S
    build(db, samples=640, requests=20, t0=t0)
    end_s = t0 + 10

    def models() -> set[str]:
        with Store.open(db) as store, store.transaction() as con:
            return {labels[5] for (_, labels) in _gpu_rows(con, t0, end_s, None)}

    assert models() == {""}
    start = "INSERT INTO control_events (node, source, ts_s, action, after, actor) VALUES (?, ?, ?, 'start', ?, 'cli')"
    with Store.open(db) as store, store.transaction() as con:
        con.execute(start, [NODE, "router", t0 - 60, json.dumps({"workers": [], "model": "tiny-old"})])
        con.execute(start, [NODE, "router", t0 - 5, json.dumps({"workers": [], "model": "tiny"})])
        con.execute(start, [NODE, "router", end_s + 60, json.dumps({"workers": [], "model": "later"})])
    assert models() == {"tiny"}  # the newest start before the window's end
    with Store.open(db) as store, store.transaction() as con:
        con.execute(start, [NODE, "router-b", t0, json.dumps({"model": "llama-3.1-8b"})])
    assert models() == {""}
