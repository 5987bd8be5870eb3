"""Screenshots of every dashboard page on a store, for the docs (docs/screens/).

    python -m phaselens.cli simulate --layout 8p8d:h100-sxm:tp4 --poisson 1.0 --num-requests 3600 \\
        --db /tmp/fleet64.duckdb
    PYTHONPATH=. .venv/bin/python scripts/screens.py /tmp/fleet64.duckdb --suffix 64

Starts a collector on the store and the dashboard on it (both real processes, on free ports, stopped at
the end), opens each page of ``dashboard/app.py``'s PAGES on the store's newest scenario in headless
Chromium (``scripts/browser.sh`` installs it), waits until the page's script run is over and its charts
are drawn, and writes ``docs/screens/<page>-<suffix>.png``; with ``--compare`` also the Overview, Cost
and Latency pages comparing the scenario's second half with its first (``<page>-compare-<suffix>.png``).
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from phaselens.testing import start_collector  # noqa: E402
from serving.testing import free_port  # noqa: E402

APP = ROOT / "dashboard" / "app.py"
OUT = ROOT / "docs" / "screens"
# the run is over (no status widget), no exception, and every Plotly chart and SVG panel drawn
SETTLED = """() => document.querySelector('[data-testid="stMain"] [data-testid="stVerticalBlock"]') !== null
  && document.querySelector('[data-testid="stStatusWidget"]') === null
  && [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'))"""


def pages() -> list[tuple[str, str]]:
    """(file, title) of dashboard/app.py's PAGES, read from its source."""
    for node in ast.parse(APP.read_text(encoding="utf-8")).body:
        target = node.target if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [None])[0]
        if getattr(target, "id", None) == "PAGES" and node.value is not None:  # type: ignore[attr-defined]
            return [(f, t) for f, t, _icon in ast.literal_eval(node.value)]  # type: ignore[attr-defined]
    raise SystemExit("dashboard/app.py defines no PAGES")


def chromium() -> str:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "browser.sh")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"no chromium: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def shoot(browser: object, url: str, path: Path) -> float:
    """Open ``url`` in a fresh context, wait until it settled, write a full-page screenshot; seconds."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1400})  # type: ignore[attr-defined]
    try:
        page = ctx.new_page()
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_timeout(1500)  # the run starts after the websocket opens
        page.wait_for_function(SETTLED, timeout=300_000)
        page.wait_for_timeout(1000)  # iframes and SVG images paint after the run
        took = time.perf_counter() - t
        if page.locator('[data-testid="stException"]').count():
            raise SystemExit(f"{url}: the page shows a Python exception")
        page.screenshot(path=str(path), full_page=True)
        return took
    finally:
        ctx.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path, help="a phaselens store with a simulated scenario")
    ap.add_argument("--suffix", default="64", help="file name suffix (default 64: <page>-64.png)")
    ap.add_argument("--compare", action="store_true", help="also the compare views")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    collector, api = start_collector(args.store)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless=true",
        f"--server.port={port}",
    ]
    cmd += ["--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
    env = {**os.environ, "PHASELENS_API_URL": api}
    dash = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or dash.poll() is not None:
                raise SystemExit("the dashboard did not start")
            time.sleep(0.3)
        scenario = httpx.get(f"{api}/api/v1/scenarios", timeout=30).json()["scenarios"][0]
        sid = scenario["scenario_id"]
        dur = float(scenario["end_s"]) - float(scenario["start_s"])
        OUT.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"], headless=True)
            try:
                for file, title in pages():
                    name = file.removesuffix(".py")
                    path = "" if name == "overview" else name
                    out = OUT / f"{name}-{args.suffix}.png"
                    took = shoot(browser, f"{base}/{path}?dataset={sid}", out)
                    print(f"{title}: {out.relative_to(ROOT)} ({took:.1f} s)")
                if args.compare:
                    half = round(dur / 2, 1)
                    query = f"dataset={sid}&range={half:g}-{round(dur, 1):g}&compare=previous"
                    for name in ("overview", "cost", "latency"):
                        out = OUT / f"{name}-compare-{args.suffix}.png"
                        path = "" if name == "overview" else name
                        took = shoot(browser, f"{base}/{path}?{query}", out)
                        print(f"{name} compare: {out.relative_to(ROOT)} ({took:.1f} s)")
            finally:
                browser.close()
    finally:
        for proc in (dash, collector):
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
