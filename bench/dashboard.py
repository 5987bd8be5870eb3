"""Time the dashboard's Overview on a 1,000,000-sample store: first full render in headless
Chromium, and the API latency behind it (p50/p95), against the uncached summary as baseline.

The store is ``bench/analytics_data.py``'s synthetic fleet (64 emulated H100s, 100 ms samples) at
1 M GPU samples and 100,000 requests, placed so that its 26 minutes end now (the live "last hour"
window holds all of it; the hour before is empty). The real collector serves it (``phaselens
collect --no-nvml``), the real Streamlit dashboard reads the collector, and Debian's chromium,
driven by Playwright, opens the Overview in a fresh browser context each time.

Timed, in the same run:

* **baseline**: ``GET /api/v1/analytics/summary?since=3600s`` — one uncached summary of the window;
* **overview, cold**: ``GET /api/v1/analytics/overview`` for a window no earlier call asked for
  (the service computes the window's summary and the previous period's, then the overview);
* **overview, cached**: the same request again within the service's live TTL;
* **overview, rolling**: ``?since=3600s`` (what the page asks) — the newest result of that live
  window while it is younger than 5 min (``LIVE_STALE_S``), recomputed in the background;
* **first render**: from ``page.goto`` until the page shows eight metric tiles with values, the
  sentence on where the money goes and the GPU-time bar drawn (:data:`OVERVIEW_DRAWN`), in a fresh
  browser context: after a quiet spell (nobody asked for :data:`QUIET_S`: the service answers its
  newest result at once and recomputes in the background) and warm (another visitor a few seconds
  before), with when the title, the tiles and the chart appeared (where the time goes).

    PYTHONPATH=. .venv/bin/python bench/dashboard.py [--store /tmp/phaselens-dash.duckdb] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import httpx  # noqa: E402
from analytics_data import GPUS, PERIOD_S, build  # noqa: E402

from collector.overview import LIVE_STALE_S, LIVE_TTL_S  # noqa: E402

SAMPLES = 1_000_000
REQUESTS = 100_000
TARGET_S = 3.0
QUIET_S = 30.0  # the quiet spell before a "cold" visit
# Recorded in the page every 10 ms: when (ms since navigation) each part of the Overview appeared.
MILESTONES = """setInterval(() => {
  const ms = window.__ms = window.__ms || {};
  const mark = (k, c) => { if (!(k in ms) && c) ms[k] = performance.now(); };
  mark('title', [...document.querySelectorAll('h1')].some(h => h.textContent.includes('Overview')));
  const v = [...document.querySelectorAll('[data-testid="stMetricValue"]')];
  mark('tiles', v.length >= 8 && v.every(x => x.textContent.trim()));
  mark('chart', document.querySelectorAll('.js-plotly-plot .barlayer .point path').length >= 3);
}, 10);"""
OVERVIEW_DRAWN = """() => {
  const values = [...document.querySelectorAll('[data-testid="stMetricValue"]')];
  const bars = document.querySelectorAll('.js-plotly-plot .barlayer .point path');
  const sentence = [...document.querySelectorAll('h4')].some(h => h.textContent.includes('/yr'));
  return values.length >= 8 && values.every(v => v.textContent.trim() && !v.textContent.includes('no data'))
      && bars.length >= 3 && sentence;
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{what} did not answer {url} within {timeout_s:g} s")


def _pcts(xs: list[float]) -> str:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"p50 {statistics.median(xs):.3f} s, p95 {p95:.3f} s (n={len(xs)})"


def _timed_get(client: httpx.Client, path: str, params: dict) -> float:
    t = time.perf_counter()
    r = client.get(path, params=params)
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"GET {path} answered {r.status_code}: {r.text[:300]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, default=Path("/tmp/phaselens-dash.duckdb"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()

    span_s = (SAMPLES // GPUS) * PERIOD_S
    t = time.perf_counter()
    counts = build(args.store, samples=SAMPLES, requests=REQUESTS, t0=time.time() - span_s - 1.0)
    print(f"store {args.store}: built in {time.perf_counter() - t:.1f} s: {counts}")

    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    collect = [sys.executable, "-m", "collector.cli", "collect", "--db", str(args.store), "--port", str(port)]
    collect += ["--no-nvml", "--report-schedule", "off", "--metrics-interval-s", "3600"]
    collector = subprocess.Popen(collect, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dash_port = _free_port()
    dash = f"http://127.0.0.1:{dash_port}"
    env = {**os.environ, "PHASELENS_API_URL": api, "PYTHONPATH": str(ROOT)}
    run = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "dashboard" / "app.py"),
        "--server.headless=true",
    ]
    run += [f"--server.port={dash_port}", "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    streamlit = subprocess.Popen(run, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"{api}/health", collector, "the collector")
        _wait_http(f"{dash}/_stcore/health", streamlit, "the dashboard")
        with httpx.Client(base_url=api, timeout=300) as client:
            deadline = time.monotonic() + 300  # the /metrics export's first computation, out of the way
            while 'result="ok"} 1.0' not in client.get("/metrics").text and time.monotonic() < deadline:
                time.sleep(0.5)
            base = [_timed_get(client, "/api/v1/analytics/summary", {"since": "3600s"})]
            cold, cached = [], []
            for i in range(args.repeats):
                base.append(_timed_get(client, "/api/v1/analytics/summary", {"since": "3600s"}))
                end = time.time() + 0.001 * i  # a window no earlier call asked for: computed
                params = {"start_s": end - 3600.0, "end_s": end}
                cold.append(_timed_get(client, "/api/v1/analytics/overview", params))
                cached.append(_timed_get(client, "/api/v1/analytics/overview", params))
            rolling = []
            for _ in range(args.repeats):
                rolling.append(_timed_get(client, "/api/v1/analytics/overview", {"since": "3600s"}))
                time.sleep(LIVE_TTL_S + 0.5)
        cold_r, warm_r = _browser(args.chromium, dash, args.repeats)
    finally:
        for proc in (streamlit, collector):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    base = base[1:]  # the first summary warms DuckDB's caches
    p50 = statistics.median
    print(f"baseline  GET /api/v1/analytics/summary (uncached, one summary): {_pcts(base)}")
    print(f"overview  GET /api/v1/analytics/overview, cold (two summaries): {_pcts(cold)}")
    print(f"overview  GET /api/v1/analytics/overview, cached:               {_pcts(cached)}")
    print(f"ratio cold overview / summary (p50): {p50(cold) / p50(base):.2f}")
    print(f"ratio cached overview / summary (p50): {p50(cached) / p50(base):.4f}")
    print(
        f"overview  GET /api/v1/analytics/overview?since=3600s, rolling (newest result): {_pcts(rolling[1:])}"
    )
    print(f"first full render, cold (nobody looked for {QUIET_S:g} s): {_pcts(cold_r)}")
    print(f"first full render, warm (another visitor a few seconds before): {_pcts(warm_r)}")
    print(f"(the service answers a live window's newest result while it is < {LIVE_STALE_S:g} s old)")
    for name, xs in (("cold", cold_r), ("warm", warm_r)):
        verdict = "met" if p50(xs) < TARGET_S else "NOT met"
        print(f"target: overview < {TARGET_S:g} s, {name}: {verdict} (p50 {p50(xs):.2f} s)")
    return 0


def _visit(browser: object, url: str, marks: dict[str, list[float]] | None = None) -> float:
    """Seconds from navigation until :data:`OVERVIEW_DRAWN`, in a fresh browser context; appends
    when each of :data:`MILESTONES` appeared (s since navigation) to ``marks``."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1400})  # type: ignore[attr-defined]
    try:
        ctx.add_init_script(MILESTONES)
        page = ctx.new_page()
        t = time.perf_counter()
        page.goto(f"{url}/?dataset=live")
        page.wait_for_function(OVERVIEW_DRAWN, timeout=180_000)
        dt = time.perf_counter() - t
        if page.get_by_text("Traceback").count():
            raise SystemExit("the Overview showed a Traceback")
        if marks is not None:
            page.wait_for_timeout(50)  # the marks' next tick
            for k, v in (page.evaluate("() => window.__ms || {}") or {}).items():
                marks.setdefault(k, []).append(v / 1000.0)
        return dt
    finally:
        ctx.close()


def _browser(chromium: str, url: str, repeats: int) -> tuple[list[float], list[float]]:
    """First full renders: ``cold`` after nobody asked for :data:`QUIET_S` (every cache of the
    dashboard has expired; the service answers its newest result, younger than LIVE_STALE_S, and
    recomputes in the background), ``warm`` right after another visitor (a new session). Prints
    when the title, the tiles and the chart appeared (p50 over the visits)."""
    from playwright.sync_api import sync_playwright

    cold, warm = [], []
    marks: dict[str, dict[str, list[float]]] = {"cold": {}, "warm": {}}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            _visit(browser, url)  # starts Streamlit's script runner and its imports
            for _ in range(repeats):
                time.sleep(QUIET_S + 1.0)
                cold.append(_visit(browser, url, marks["cold"]))
                time.sleep(LIVE_TTL_S + 0.5)  # past the plain cache: a recomputation is due
                warm.append(_visit(browser, url, marks["warm"]))
        finally:
            browser.close()
    for name, got in marks.items():
        parts = ", ".join(
            f"{k} {statistics.median(v):.2f} s"
            for k, v in sorted(got.items(), key=lambda kv: statistics.median(kv[1]))
        )
        print(f"first render, {name}: appeared at (p50, s since navigation): {parts}")
    return cold, warm


if __name__ == "__main__":
    sys.exit(main())
