"""Time the dashboard's Overview on a 1,000,000-sample store: first full render in headless
Chromium, and the API latency behind it (p50/p95), against the uncached summary as baseline.

The store is ``bench/analytics_data.py``'s synthetic fleet (64 emulated H100s, 100 ms samples) at
1 M GPU samples and 100,000 requests, placed so that its 26 minutes end now (the live "last hour"
window holds all of it; the hour before is empty). The real collector serves it (``phaselens
collect --no-nvml``), the real Streamlit dashboard reads the collector, and Debian's chromium,
driven by Playwright, opens the Overview in a fresh browser context each time.

Just over 600 lines: one bench with two measurements (the Overview on a 1 M-sample store, every page at
64 GPUs) sharing its browser and collector plumbing.

Timed, in the same run:

* **baseline**: ``GET /api/v1/analytics/summary?since=3600s`` — one uncached summary of the window;
* **overview, cold**: ``GET /api/v1/analytics/overview`` for a window no earlier call asked for
  (the service computes the window's summary and the previous period's, then the overview);
* **overview, cached**: the same request again within the service's live TTL;
* **overview, rolling**: ``?since=3600s`` (what the page asks) — the newest result of that live
  window while it is younger than 5 min (``LIVE_STALE_S``), recomputed in the background;
* **first render**: from ``page.goto`` until the page shows eight metric tiles with values, the
  sentence on where the money goes and the GPU-time bar drawn (:data:`OVERVIEW_DRAWN`: at least three
  of its segments laid out with a width, whether the bar is HTML or, in older trees, Plotly's), in a
  fresh browser context: after a quiet spell (nobody asked for :data:`QUIET_S`: the service answers
  its newest result at once and recomputes in the background) and warm (another visitor a few seconds
  before), with when the title, the tiles and the chart appeared (where the time goes) and the
  JavaScript the page fetched.

With ``--baseline-tree DIR`` (another checkout of this repository, e.g. ``git archive <commit> | tar -x
-C DIR``) a second dashboard runs from that tree against the same collector, and the visits alternate
between the two (A B B A ...), so that both see the same host load.

    PYTHONPATH=. .venv/bin/python bench/dashboard.py [--store /tmp/phaselens-dash.duckdb] [--repeats 5]
        [--baseline-tree /tmp/phaselens-old]

``--page gpus`` times the GPUs page instead, on a simulated 64-GPU fleet (``phaselens simulate
--layout 8p8d:h100-sxm:tp4``, Poisson arrivals for one hour of virtual time: 2.3 M GPU samples at
100 ms): the settled page (every chart drawn with its data, Streamlit's run finished) in a fresh
browser context, first visit of the page after the dashboard started and served one visit of the
Health page (``cold``: the page's caches empty, the service computes the series) and a second
visit (``warm``), with the JSON the page's API read took
(``GET /api/v1/analytics/gpu-series``). With ``--baseline-tree`` (e.g. ``git archive <main> | tar -x
-C DIR``) the old page, one chart per GPU from the raw samples, is timed in the same run on the same
collector, and the ratio printed:

    PYTHONPATH=. .venv/bin/python bench/dashboard.py --page gpus --repeats 3 --baseline-tree /tmp/phaselens-old

``--page all`` times every page of ``dashboard/app.py``'s PAGES on the same simulated 64-GPU hour
(the scenario's whole span): **cold** = the first visit of each page, in PAGES order, in a fresh
browser context, after a fresh collector and a fresh dashboard started on the store (one visit of
the Health page first, for Streamlit's imports): nothing of the scenario is cached anywhere when the
first page opens; a later page finds what the service computed for an earlier one (as a person
clicking through the pages does). **settled**: the page's title drawn, Streamlit's run over (no
status widget, no spinner), every Plotly chart drawn, and all of that unchanged for 1 s; the time
is from ``page.goto`` to the start of that quiet second. With ``--baseline-tree`` the old tree runs
the same sequence on a collector of its own, alternating (new old, old new, ...), and the ratio of
each page's p50 is printed. A service that computes the newest scenario's Overview when it starts
(phaselens/summary_warm.py) does so while the dashboard starts: each run prints how long after the
collector's start the first page opened and how long the service's warm-up took, since that is what
a first visit then finds computed:

    PYTHONPATH=. .venv/bin/python bench/dashboard.py --page all --repeats 2 --baseline-tree /tmp/phaselens-old
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

from dashboard.page_settle import app_pages, settle_script, settled_for  # noqa: E402
from phaselens.overview import LIVE_STALE_S, LIVE_TTL_S  # noqa: E402

SAMPLES = 1_000_000
REQUESTS = 100_000
TARGET_S = 3.0
QUIET_S = 30.0  # the quiet spell before a "cold" visit
# Recorded in the page every 10 ms: when (ms since navigation) each part of the Overview appeared.
# the GPU-time bar is drawn: three segments with a width (the HTML bar), or Plotly's bar paths
BAR_DRAWN = """(document.querySelectorAll('.pl-gpu-time .pl-seg').length >= 3
    && [...document.querySelectorAll('.pl-gpu-time .pl-seg')].every(s => s.getBoundingClientRect().width > 0))
  || document.querySelectorAll('.js-plotly-plot .barlayer .point path').length >= 3"""
# Recorded in the page every 10 ms: when (ms since navigation) each part of the Overview appeared.
MILESTONES = f"""setInterval(() => {{
  const ms = window.__ms = window.__ms || {{}};
  const mark = (k, c) => {{ if (!(k in ms) && c) ms[k] = performance.now(); }};
  mark('title', [...document.querySelectorAll('h1')].some(h => h.textContent.includes('Overview')));
  const v = [...document.querySelectorAll('[data-testid="stMetricValue"]')];
  mark('tiles', v.length >= 8 && v.every(x => x.textContent.trim()));
  mark('chart', {BAR_DRAWN});
}}, 10);"""
OVERVIEW_DRAWN = f"""() => {{
  const values = [...document.querySelectorAll('[data-testid="stMetricValue"]')];
  const sentence = [...document.querySelectorAll('h4')].some(h => h.textContent.includes('/yr'));
  return values.length >= 8 && values.every(v => v.textContent.trim() && !v.textContent.includes('no data'))
      && sentence && ({BAR_DRAWN});
}}"""
# the JavaScript the page fetched: count, bytes (decoded) and whether Plotly's bundle was among them
SCRIPTS = """() => {
  const js = performance.getEntriesByType('resource').filter(r => r.name.split('?')[0].endsWith('.js'));
  return [js.length, js.reduce((a, r) => a + (r.decodedBodySize || 0), 0),
          js.some(r => r.name.includes('PlotlyChart'))];
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
    if not xs:
        return "no runs (n=0)"
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
    ap.add_argument(
        "--baseline-tree",
        type=Path,
        help="another checkout of this repository: its dashboard is visited alternately with this one",
    )
    ap.add_argument(
        "--page", choices=("overview", "gpus", "all"), default="overview", help="the page(s) to time"
    )
    ap.add_argument(
        "--keep-store",
        action="store_true",
        help="--page gpus/all: use --store as it is when it already holds a scenario (no new simulation)",
    )
    args = ap.parse_args()
    if args.page == "gpus":
        return gpus_main(args)
    if args.page == "all":
        return pages_main(args)

    span_s = (SAMPLES // GPUS) * PERIOD_S
    t = time.perf_counter()
    counts = build(args.store, samples=SAMPLES, requests=REQUESTS, t0=time.time() - span_s - 1.0)
    print(f"store {args.store}: built in {time.perf_counter() - t:.1f} s: {counts}")

    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    collect = [sys.executable, "-m", "phaselens.cli", "collect", "--db", str(args.store), "--port", str(port)]
    collect += ["--no-nvml", "--report-schedule", "off", "--metrics-interval-s", "3600"]
    collector = subprocess.Popen(collect, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trees = {"new": ROOT} | ({"old": args.baseline_tree.resolve()} if args.baseline_tree else {})
    dashboards = {name: _dashboard(tree, api) for name, tree in trees.items()}
    try:
        _wait_http(f"{api}/health", collector, "the collector")
        for name, (url, proc) in dashboards.items():
            _wait_http(f"{url}/_stcore/health", proc, f"the dashboard ({name})")
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
        renders = _browser(
            args.chromium, {name: url for name, (url, _proc) in dashboards.items()}, args.repeats
        )
    finally:
        for proc in [*(p for _url, p in dashboards.values()), collector]:
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
    print(f"(the service answers a live window's newest result while it is < {LIVE_STALE_S:g} s old)")
    for tree, (cold_r, warm_r) in renders.items():
        where = f" [{tree}: {trees[tree]}]" if len(renders) > 1 else ""
        print(f"first full render, cold (nobody looked for {QUIET_S:g} s){where}: {_pcts(cold_r)}")
        print(f"first full render, warm (another visitor a few seconds before){where}: {_pcts(warm_r)}")
        for name, xs in (("cold", cold_r), ("warm", warm_r)):
            verdict = "met" if p50(xs) < TARGET_S else "NOT met"
            print(f"target: overview < {TARGET_S:g} s, {name}{where}: {verdict} (p50 {p50(xs):.2f} s)")
    if "old" in renders:
        for i, name in enumerate(("cold", "warm")):
            ratio = p50(renders["new"][i]) / p50(renders["old"][i])
            print(f"ratio new / old first render, {name} (p50): {ratio:.2f}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def _dashboard(tree: Path, api: str) -> tuple[str, subprocess.Popen]:
    """The Streamlit dashboard of the checkout at ``tree`` on a free port, reading ``api``."""
    port = _free_port()
    env = {**os.environ, "PHASELENS_API_URL": api, "PYTHONPATH": str(tree)}
    run = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(tree / "dashboard" / "app.py"),
        "--server.headless=true",
    ]
    run += [f"--server.port={port}", "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    proc = subprocess.Popen(run, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f"http://127.0.0.1:{port}", proc


def _visit(
    browser: object,
    url: str,
    marks: dict[str, list[float]] | None = None,
    scripts: list[tuple[int, int, bool]] | None = None,
) -> float:
    """Seconds from navigation until :data:`OVERVIEW_DRAWN`, in a fresh browser context; appends
    when each of :data:`MILESTONES` appeared (s since navigation) to ``marks`` and the JavaScript
    fetched (:data:`SCRIPTS`) to ``scripts``."""
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
        if scripts is not None:
            scripts.append(tuple(page.evaluate(SCRIPTS)))
        return dt
    finally:
        ctx.close()


def _browser(chromium: str, urls: dict[str, str], repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """First full renders of each dashboard in ``urls`` (cold, warm): ``cold`` after nobody asked
    for :data:`QUIET_S` (every cache of the dashboard has expired; the service answers its newest
    result, younger than LIVE_STALE_S, and recomputes in the background), ``warm`` right after
    another visitor (a new session). With two dashboards their visits alternate (A B B A ...).
    Prints when the title, the tiles and the chart appeared (p50 over the visits) and the JavaScript
    each page fetched."""
    from playwright.sync_api import sync_playwright

    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in urls}
    marks = {(name, kind): {} for name in urls for kind in ("cold", "warm")}
    scripts: dict[str, list[tuple[int, int, bool]]] = {name: [] for name in urls}
    order = list(urls)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            for url in urls.values():
                _visit(browser, url)  # starts Streamlit's script runner and its imports
            for i in range(repeats):
                for name in order if i % 2 == 0 else order[::-1]:
                    cold, warm = out[name]
                    time.sleep(QUIET_S + 1.0)
                    cold.append(_visit(browser, urls[name], marks[(name, "cold")], scripts[name]))
                    time.sleep(LIVE_TTL_S + 0.5)  # past the plain cache: a recomputation is due
                    warm.append(_visit(browser, urls[name], marks[(name, "warm")], scripts[name]))
        finally:
            browser.close()
    for (name, kind), got in marks.items():
        parts = ", ".join(
            f"{k} {statistics.median(v):.2f} s"
            for k, v in sorted(got.items(), key=lambda kv: statistics.median(kv[1]))
        )
        print(f"first render [{name}], {kind}: appeared at (p50, s since navigation): {parts}")
    for name, got in scripts.items():
        n = statistics.median(c for c, _b, _p in got)
        mb = statistics.median(b for _c, b, _p in got) / 1e6
        plotly = sum(p for _c, _b, p in got)
        print(
            f"JavaScript fetched [{name}] (p50 per visit): {n:.0f} files, {mb:.2f} MB; Plotly bundle in {plotly} of {len(got)} visits"
        )
    return out


# -- the GPUs page -------------------------------------------------------------------------------------

GPUS_LAYOUT = "8p8d:h100-sxm:tp4"  # 64 GPUs: 8 prefill and 8 decode replicas of TP 4
GPUS_REQUESTS = 3600  # Poisson at 1 req/s: one hour of virtual time
# the page settled: at least n charts each drawn with its data — the new page's SVG panels (a
# heatmap's image or a line), the old page's Plotly charts (all laid out, those in the viewport
# drawn with their lines) — and Streamlit's run over (its status widget gone)
GPUS_SETTLED = """(n) => {
  const svg = [...document.querySelectorAll('figure.pl-panel')].filter(p =>
    p.querySelector('image') || p.querySelector('polyline.pl-line'));
  // Plotly (the old page) draws a chart's traces once it scrolls into view: all n laid out, and
  // those in view drawn with their lines
  const plotly = [...document.querySelectorAll('.js-plotly-plot')].filter(p => p.querySelector('.main-svg'));
  const inView = plotly.filter(p => p.getBoundingClientRect().bottom <= window.innerHeight);
  const drawn = inView.length > 0 && inView.every(p => [...p.querySelectorAll('.scatterlayer path.js-line')]
    .some(l => (l.getAttribute('d') || '').length > 200));
  const plots = svg.length ? svg : (drawn ? plotly : []);
  return plots.length >= n && document.querySelector('[data-testid="stStatusWidget"]') === null
      && document.querySelector('[data-testid="stException"]') === null;
}"""
CHARTS = {"new": 8, "old": 16}  # the new page: one chart per metric; the old one: a chart per GPU, 16 at most


def _simulate_fleet(store: Path) -> str:
    """The 64-GPU hour, simulated into ``store`` (replaced); its scenario id."""
    for p in (store, Path(str(store) + ".wal")):
        p.unlink(missing_ok=True)
    run = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--layout", GPUS_LAYOUT]
    run += ["--poisson", "1.0", "--num-requests", str(GPUS_REQUESTS), "--db", str(store)]
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"phaselens simulate failed: {done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("scenario "))
    print(line)
    return line.split()[1].rstrip(":")


def _gpus_visit(browser: object, url: str, charts: int) -> float:
    """Seconds from navigation until the GPUs page settled (:data:`GPUS_SETTLED`), fresh context."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 2600})  # type: ignore[attr-defined]
    try:
        page = ctx.new_page()
        t = time.perf_counter()
        page.goto(url, timeout=600_000)
        page.wait_for_function(GPUS_SETTLED, arg=charts, timeout=600_000)
        return time.perf_counter() - t
    finally:
        ctx.close()


def _warm_up(browser: object, url: str) -> None:
    """One visit of the Health page: Streamlit's script runner, its imports and the sidebar's reads
    happen here, not in the first timed visit (as a dashboard already in use has them)."""
    ctx = browser.new_context()  # type: ignore[attr-defined]
    try:
        page = ctx.new_page()
        page.goto(f"{url}/health", timeout=600_000)
        page.get_by_role("heading", name="Health").first.wait_for(timeout=120_000)
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"stStatusWidget\"]') === null", timeout=120_000
        )
    finally:
        ctx.close()


def gpus_main(args: argparse.Namespace) -> int:
    """The GPUs page at 64 GPUs x 1 h of 100 ms samples: new vs old (``--baseline-tree``)."""
    from playwright.sync_api import sync_playwright

    store = (
        args.store.with_name("phaselens-gpus64.duckdb")
        if args.store.name == "phaselens-dash.duckdb"
        else args.store
    )
    t = time.perf_counter()
    sid = _simulate_fleet(store)
    print(f"store {store}: simulated in {time.perf_counter() - t:.1f} s")
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    collect = [sys.executable, "-m", "phaselens.cli", "collect", "--db", str(store), "--port", str(port)]
    collect += ["--no-nvml", "--report-schedule", "off", "--metrics-interval-s", "3600"]
    collector = subprocess.Popen(collect, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trees = {"new": ROOT} | ({"old": args.baseline_tree.resolve()} if args.baseline_tree else {})
    cold: dict[str, list[float]] = {name: [] for name in trees}
    warm: dict[str, list[float]] = {name: [] for name in trees}
    api_s: list[float] = []
    try:
        _wait_http(f"{api}/health", collector, "the collector")
        with httpx.Client(base_url=api, timeout=300) as client:
            params = {"dataset": sid, "max_points": 6000}
            _timed_get(client, "/api/v1/analytics/gpu-series", params)  # DuckDB's caches
            for _ in range(args.repeats):
                api_s.append(_timed_get(client, "/api/v1/analytics/gpu-series", params))
            body = client.get("/api/v1/analytics/gpu-series", params=params)
            got = body.json()
            print(
                f"gpu-series: {len(got['gpus'])} GPUs x {len(got['times_s'])} buckets of {got['bucket_s']:g} s "
                f"= {got['points_per_metric']:,} values per metric, {len(body.content) / 1e6:.2f} MB JSON"
            )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"], headless=True)
            try:
                for i in range(args.repeats):
                    for name in list(trees) if i % 2 == 0 else list(trees)[::-1]:
                        url, proc = _dashboard(trees[name], api)
                        try:
                            _wait_http(f"{url}/_stcore/health", proc, f"the dashboard ({name})")
                            _warm_up(browser, url)
                            page = f"{url}/gpus?dataset={sid}"
                            cold[name].append(_gpus_visit(browser, page, CHARTS[name]))
                            warm[name].append(_gpus_visit(browser, page, CHARTS[name]))
                            print(
                                f"  visit {i + 1} [{name}]: cold {cold[name][-1]:.2f} s, warm {warm[name][-1]:.2f} s"
                            )
                        finally:
                            proc.terminate()
                            proc.wait(30)
            finally:
                browser.close()
    finally:
        collector.terminate()
        try:
            collector.wait(30)
        except subprocess.TimeoutExpired:
            collector.kill()
    p50 = statistics.median
    print(f"service GET /api/v1/analytics/gpu-series (64 GPUs, 1 h, 2.3 M samples): {_pcts(api_s)}")
    for name in trees:
        where = f" [{name}: {trees[name]}]"
        print(
            f"GPUs page settled, cold (first visit after the dashboard started){where}: {_pcts(cold[name])}"
        )
        print(f"GPUs page settled, warm (second visit){where}: {_pcts(warm[name])}")
    verdict = "met" if p50(cold["new"]) < TARGET_S else "NOT met"
    print(
        f"target: GPUs page < {TARGET_S:g} s at 64 GPUs x 1 h, cold: {verdict} (p50 {p50(cold['new']):.2f} s)"
    )
    if "old" in trees:
        for kind, got in (("cold", cold), ("warm", warm)):
            print(f"ratio new / old settled, {kind} (p50): {p50(got['new']) / p50(got['old']):.3f}")
    print(f"load average (1, 5, 15 min) at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


# -- every page -------------------------------------------------------------------------------------

PAGE_SETTLE_HOLD_MS = 1000
PAGE_SETTLE = settle_script(interval_ms=50)


def _page_visit(browser: object, url: str) -> float:
    """Seconds from navigation until the page settled (:func:`dashboard.page_settle.settle_script`, held
    :data:`PAGE_SETTLE_HOLD_MS`), in a fresh browser context."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1400})  # type: ignore[attr-defined]
    try:
        ctx.add_init_script(PAGE_SETTLE)
        page = ctx.new_page()
        page.goto(url, timeout=600_000)
        page.wait_for_function(
            settled_for(PAGE_SETTLE_HOLD_MS),
            timeout=600_000,
            polling=100,
        )
        if page.locator('[data-testid="stException"]').count():
            raise SystemExit(f"{url}: the page shows a Python exception")
        return float(page.evaluate("() => window.__settled")) / 1000.0
    finally:
        ctx.close()


def pages_main(args: argparse.Namespace) -> int:
    """Every page at 64 GPUs x 1 h, cold (fresh collector and dashboard): new vs old tree."""
    from playwright.sync_api import sync_playwright

    store = (
        args.store.with_name("phaselens-gpus64.duckdb")
        if args.store.name == "phaselens-dash.duckdb"
        else args.store
    )
    sid = None
    if args.keep_store and store.exists():
        import duckdb

        with duckdb.connect(str(store), read_only=True) as con:
            row = con.execute("SELECT scenario_id FROM scenarios ORDER BY created_s DESC LIMIT 1").fetchone()
        sid = row[0] if row else None
        print(f"store {store}: kept, scenario {sid}")
    if sid is None:
        t = time.perf_counter()
        sid = _simulate_fleet(store)
        print(f"store {store}: simulated in {time.perf_counter() - t:.1f} s")
    trees = {"new": ROOT} | ({"old": args.baseline_tree.resolve()} if args.baseline_tree else {})
    names = [file.removesuffix(".py") for file, _title in app_pages()]
    got: dict[str, dict[str, list[float]]] = {t: {n: [] for n in names} for t in trees}
    loads: list[float] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"], headless=True)
        try:
            for i in range(args.repeats):
                for tree in list(trees) if i % 2 == 0 else list(trees)[::-1]:
                    port = _free_port()
                    api = f"http://127.0.0.1:{port}"
                    collect = [sys.executable, "-m", "phaselens.cli", "collect", "--db", str(store)]
                    collect += ["--port", str(port), "--no-nvml", "--report-schedule", "off"]
                    collect += ["--metrics-interval-s", "3600"]
                    env = {**os.environ, "PYTHONPATH": str(trees[tree])}
                    started = time.perf_counter()
                    collector = subprocess.Popen(
                        collect,
                        cwd=trees[tree],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    url, proc = _dashboard(trees[tree], api)
                    try:
                        _wait_http(f"{api}/health", collector, "the collector")
                        _wait_http(f"{url}/_stcore/health", proc, f"the dashboard ({tree})")
                        _warm_up(browser, url)
                        line = [
                            f"(first page {time.perf_counter() - started:.1f} s after the collector started)"
                        ]
                        for name in names:
                            path = "" if name == "overview" else name
                            got[tree][name].append(_page_visit(browser, f"{url}/{path}?dataset={sid}"))
                            line.append(f"{name} {got[tree][name][-1]:.1f}")
                        loads.append(os.getloadavg()[0])
                        warm = httpx.get(f"{api}/health", timeout=30).json().get("summary_warm")
                        if warm:  # the service's Overview computed ahead (phaselens/summary_warm.py)
                            line.append(f"service warm-up {warm.get('state')} in {warm.get('took_s')} s")
                        print(f"  run {i + 1} [{tree}] cold, s: {', '.join(line)} (load {loads[-1]:.1f})")
                    finally:
                        for pr in (proc, collector):
                            pr.terminate()
                            try:
                                pr.wait(30)
                            except subprocess.TimeoutExpired:
                                pr.kill()
        finally:
            browser.close()
    p50 = statistics.median
    for tree in trees:
        print(f"[{tree}: {trees[tree]}]")
        for name in names:
            xs = got[tree][name]
            verdict = "met" if p50(xs) < TARGET_S else "NOT met"
            ratio = ""
            if tree == "new" and "old" in trees:
                ratio = f"; new / old {p50(xs) / p50(got['old'][name]):.2f}"
            print(f"  {name:16s} settled, cold: {_pcts(xs)}; target < {TARGET_S:g} s: {verdict}{ratio}")
        worst = max(names, key=lambda n: p50(got[tree][n]))
        print(f"  worst page [{tree}]: {worst}, p50 {p50(got[tree][worst]):.2f} s")
    print(
        f"load average (1 min) after each run: {', '.join(f'{x:.1f}' for x in loads)} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
