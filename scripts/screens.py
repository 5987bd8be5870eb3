"""Screenshots of every dashboard page, for the docs (docs/screens/): on a stored scenario, or on
the live demo.

    python -m phaselens.cli simulate --layout 8p8d:h100-sxm:tp4 --poisson 1.0 --num-requests 3600 \\
        --db /tmp/fleet64.duckdb
    PYTHONPATH=. .venv/bin/python scripts/screens.py /tmp/fleet64.duckdb --suffix 64 [--compare]
    PYTHONPATH=. .venv/bin/python scripts/screens.py --demo [--live-s 60]

On a store: starts a collector on it and the dashboard on that (both real processes, on free ports,
stopped at the end), opens each page on the store's newest scenario and writes
``docs/screens/<page>-<suffix>.png``; with ``--compare`` also the Overview, Cost and Latency pages
comparing the scenario's second half with its first (``<page>-compare-<suffix>.png``).

``--demo``: starts the demo as README.md's demo command does (``phaselens demo``: the emulated
serving stack, the collector with its store, the looping trace replay, the simulated 8-GPU fleet and
the dashboard; on free ports, a store in a temporary directory), lets the replay run ``--live-s``
seconds after everything is up (and the simulated fleet is stored), then writes every page on the
live data (``<page>-live.png``) and on the simulated fleet (``<page>-sim-8.png``), and stops the demo
(SIGINT, as Ctrl-C: it stops every child it started; ``--exit-after`` bounds it if this script dies).

The pages are ``dashboard/app.py``'s ``PAGES`` (read from its source), so a new page is shot without
a change here. Each page is opened in a fresh 1280 px wide browser context in headless Chromium
(``scripts/browser.sh`` installs Debian's), waited for until its script run is over and its charts are
drawn, and saved as a full-page PNG with a 256-colour palette (a few hundred kB at most).
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dashboard.page_settle import APP, app_pages, settle_script, settled_for  # noqa: E402
from phaselens.testing import start_collector  # noqa: E402
from serving.testing import free_port  # noqa: E402

OUT = ROOT / "docs" / "screens"
WIDTH_PX = 1280
SETTLE = settle_script(interval_ms=100)  # what settled means: dashboard/page_settle.py
FULL_HEIGHT = """() => Math.max(...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stMain"] *')]
  .filter(e => e.scrollHeight > e.clientHeight + 1).map(e => e.scrollHeight), window.innerHeight)"""
MAX_HEIGHT_PX = 6000
SETTLE_HOLD_MS = 2000  # settled this long: the run is over, not between two of its steps


def chromium() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "browser.sh")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"no chromium: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def save_png(png: bytes, path: Path) -> int:
    """``png`` written to ``path`` with a 256-colour palette, optimised; its size in bytes."""
    from PIL import Image

    with Image.open(io.BytesIO(png)) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        small.save(path, format="PNG", optimize=True)
    return path.stat().st_size


def shoot(browser: object, url: str, path: Path) -> float:
    """Open ``url`` in a fresh context, wait until it settled, write a full-page screenshot; seconds."""
    ctx = browser.new_context(viewport={"width": WIDTH_PX, "height": 1200})  # type: ignore[attr-defined]
    try:
        ctx.add_init_script(SETTLE)
        page = ctx.new_page()
        t = time.perf_counter()
        page.goto(url, timeout=300_000)
        page.wait_for_function(
            settled_for(SETTLE_HOLD_MS),
            timeout=300_000,
            polling=200,
        )
        took = time.perf_counter() - t
        if page.locator('[data-testid="stException"]').count():
            raise SystemExit(f"{url}: the page shows a Python exception")
        # the page scrolls inside Streamlit's main block, not the document: the viewport grows to it
        tall = page.evaluate(FULL_HEIGHT)
        if tall > page.viewport_size["height"]:
            page.set_viewport_size({"width": WIDTH_PX, "height": min(int(tall) + 40, MAX_HEIGHT_PX)})
            page.wait_for_timeout(1500)  # charts and images redraw at the new size
        save_png(page.screenshot(full_page=True, timeout=120_000), path)
        return took
    finally:
        ctx.close()


def shoot_pages(browser: object, base: str, query: str, suffix: str, names: list[str] | None = None) -> None:
    """Every page of PAGES (or those in ``names``) at ``base`` with ``query``, as ``<page>-<suffix>.png``."""
    OUT.mkdir(parents=True, exist_ok=True)
    for file, title in app_pages():
        name = file.removesuffix(".py")
        if names is not None and name not in names:
            continue
        out = OUT / f"{name}-{suffix}.png"
        took = shoot(browser, f"{base}/{'' if name == 'overview' else name}?{query}", out)
        print(
            f"{title}: {out.relative_to(ROOT)} ({took:.1f} s, {out.stat().st_size / 1e3:.0f} kB)", flush=True
        )


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"{what} did not answer {url}")
        time.sleep(0.5)


def start_dashboard(api: str) -> tuple[subprocess.Popen, str]:
    """The Streamlit dashboard of this tree on a free port, reading ``api``; (process, URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless=true"]
    cmd += [f"--server.port={port}", "--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    env = {**os.environ, "PHASELENS_API_URL": api}
    dash = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/_stcore/health", dash, "the dashboard", 120.0)
    return dash, base


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> None:
    """Stop ``proc`` (``sig``, then SIGKILL after ``timeout_s``)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def store_main(args: argparse.Namespace) -> int:
    """Every page on the store's newest scenario (and the compare views with ``--compare``)."""
    from playwright.sync_api import sync_playwright

    collector, api = start_collector(args.store)
    dash = None
    try:
        dash, base = start_dashboard(api)
        scenario = httpx.get(f"{api}/api/v1/scenarios", timeout=30).json()["scenarios"][0]
        sid = scenario["scenario_id"]
        dur = float(scenario["end_s"]) - float(scenario["start_s"])
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"], headless=True)
            try:
                shoot_pages(browser, base, f"dataset={sid}", args.suffix)
                if args.compare:
                    half = round(dur / 2, 1)
                    query = f"dataset={sid}&range={half:g}-{round(dur, 1):g}&compare=previous"
                    names = ["overview", "cost", "latency"]
                    shoot_pages(browser, base, query, f"compare-{args.suffix}", names)
            finally:
                browser.close()
    finally:
        for proc in (dash, collector):
            if proc is not None:
                stop(proc)
    return 0


def demo_main(args: argparse.Namespace) -> int:
    """Every page of the running demo: its live data and its simulated fleet; the demo stopped after."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="phaselens-screens-") as tmp:
        ports = {name: free_port() for name in ("serve", "collector", "dashboard")}
        cmd = [sys.executable, "-m", "phaselens.cli", "demo", "--db", str(Path(tmp) / "demo.duckdb")]
        cmd += ["--serve-port", str(ports["serve"]), "--collector-port", str(ports["collector"])]
        cmd += ["--dashboard-port", str(ports["dashboard"]), "--exit-after", str(args.live_s + 900)]
        log = open(Path(tmp) / "demo.out", "w")  # noqa: SIM115 (closed below, after the demo)
        demo = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        api, base = f"http://127.0.0.1:{ports['collector']}", f"http://127.0.0.1:{ports['dashboard']}"
        try:
            t = time.monotonic()
            wait_http(f"{api}/health", demo, "the demo's collector")
            wait_http(f"{base}/_stcore/health", demo, "the demo's dashboard")
            # every part up (the serving stack last): the demo says "running ..." and the replay starts
            while "phaselens demo: running" not in (Path(tmp) / "demo.out").read_text():
                if demo.poll() is not None or time.monotonic() - t > 300:
                    raise SystemExit("the demo did not come up within 300 s")
                time.sleep(1.0)
            t = time.monotonic()
            print(f"demo up; the simulated fleet and {args.live_s:g} s of replay", flush=True)
            deadline = time.monotonic() + 300
            sid = None
            while sid is None and time.monotonic() < deadline and demo.poll() is None:
                found = httpx.get(f"{api}/api/v1/scenarios", timeout=30).json()["scenarios"]
                sid = found[0]["scenario_id"] if found else None
                time.sleep(2.0)
            if sid is None:
                raise SystemExit("the demo stored no simulated scenario within 300 s")
            time.sleep(max(0.0, args.live_s - (time.monotonic() - t)))
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"], headless=True)
                try:
                    shoot_pages(browser, base, "dataset=live&range=5m", "live")
                    shoot_pages(browser, base, f"dataset={sid}", "sim-8")
                finally:
                    browser.close()
        finally:
            stop(demo, signal.SIGINT, 90.0)  # as Ctrl-C: the demo stops each child it started
            log.close()
            if demo.returncode not in (0, None):
                print((Path(tmp) / "demo.out").read_text()[-2000:], file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path, nargs="?", help="a phaselens store with a simulated scenario")
    ap.add_argument("--suffix", default="64", help="file name suffix (default 64: <page>-64.png)")
    ap.add_argument("--compare", action="store_true", help="also the compare views")
    ap.add_argument(
        "--demo", action="store_true", help="start the demo and shoot its live data and simulated fleet"
    )
    ap.add_argument(
        "--live-s", type=float, default=60.0, help="--demo: seconds of live data before the shots"
    )
    args = ap.parse_args(argv)
    if args.demo == (args.store is not None):
        ap.error("give a STORE or --demo (one of them)")
    if not 10.0 <= args.live_s <= 3600.0:
        ap.error(f"--live-s must be in [10, 3600] seconds, got {args.live_s:g}")
    return demo_main(args) if args.demo else store_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
