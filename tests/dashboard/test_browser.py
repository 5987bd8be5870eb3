"""The dashboard in headless Chromium (Debian's, driven by Playwright through its executable path;
``scripts/browser.sh`` installs it when missing): every page renders its charts with data, and a
screenshot of each lands in ``test-artifacts/dashboard/``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.dashboard.conftest import APP, ARTIFACTS, ROOT, Fleet, _stop
from tests.serving.conftest import free_port

CHARTS_DRAWN = """n => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return plots.length >= n && plots.every(p => [...p.querySelectorAll('.scatterlayer path.js-line')]
      .some(l => (l.getAttribute('d') || '').length > 200));
}"""


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium executable (installed by the project's own script when missing)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")
    try:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "browser.sh")], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        pytest.skip("scripts/browser.sh did not install chromium within 15 min")
    if done.returncode != 0:
        pytest.skip(f"no chromium for the browser test: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def dashboard_url(fleet: Fleet) -> Iterator[str]:
    """`streamlit run dashboard/app.py` reading the fleet's collector."""
    port = free_port()
    env = {**os.environ, "PHASELENS_API_URL": fleet.url, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "streamlit", "run", APP, "--server.headless=true", f"--server.port={port}"]
    cmd += [
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=viewer",
        "--server.fileWatcherType=none",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited: {proc.stderr.read()}")
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the dashboard did not start within 60 s")
            time.sleep(0.3)
        yield url
    finally:
        _stop(proc)


def test_every_page_renders_in_chromium(chromium: str, dashboard_url: str, fleet: Fleet):
    from playwright.sync_api import sync_playwright

    made = httpx.post(f"{fleet.url}/api/v1/reports", json={"dataset": fleet.scenarios["agg:2xh100-sxm"]})
    assert made.status_code == 200, made.text  # for the Reports page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2000})
            page.goto(f"{dashboard_url}/?dataset={fleet.scenarios['1p1d:h100-sxm']}")
            page.wait_for_function(CHARTS_DRAWN, arg=2, timeout=60_000)
            assert page.locator(".js-plotly-plot .layer-below .shapelayer path").count() > 0  # phase bands
            assert page.get_by_text("SIMULATED").count() >= 2  # the trust label in each chart
            assert page.get_by_text("Traceback").count() == 0
            page.wait_for_timeout(500)  # let the last chart settle before the picture
            page.screenshot(path=str(ARTIFACTS / "gpus.png"), full_page=True)

            page.get_by_role("link", name="Reports").click()
            page.get_by_text("Download HTML").wait_for(timeout=30_000)
            report = page.frame_locator("iframe").first
            report.get_by_text("Efficiency report").first.wait_for(timeout=30_000)
            assert page.get_by_text("Traceback").count() == 0
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "reports.png"), full_page=True)

            page.get_by_role("link", name="Health").click()
            page.get_by_text("Store writer").wait_for(timeout=30_000)
            page.get_by_text("Rows written", exact=True).wait_for(timeout=30_000)
            assert page.get_by_text("Traceback").count() == 0
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "health.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "gpus.png").stat().st_size > 10_000


def test_a_report_opens_offline_in_chromium(chromium: str, fleet: Fleet, tmp_path):
    """A report's page, saved to a file and opened with the network cut: it renders whole."""
    from playwright.sync_api import sync_playwright

    made = httpx.post(
        f"{fleet.url}/api/v1/reports", json={"dataset": fleet.scenarios["1p1d:h100-sxm"]}
    ).json()
    page_file = tmp_path / "report.html"
    page_file.write_text(httpx.get(f"{fleet.url}{made['url']}").text, encoding="utf-8")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            context = browser.new_context(offline=True, viewport={"width": 1200, "height": 1600})
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_file.as_uri())
            page.get_by_role("heading", name=made["title"]).wait_for(timeout=30_000)
            if page.locator(".js-plotly-plot").count():  # charts of shares, when the summary has them
                page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
