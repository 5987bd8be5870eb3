"""The demo's dashboard in headless Chromium (Debian's, driven by Playwright through its executable path;
``scripts/browser.sh`` installs it when missing): the charts draw with live and simulated data, every
page of ``dashboard/app.py``'s ``PAGES`` renders without a Python exception (a screenshot of each lands
in ``test-artifacts/dashboard/``), a first visit of the Overview draws its GPU-time bar without fetching
Plotly, and a report made with ``phaselens report`` renders offline."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import DemoRun
from tests.dashboard.conftest import APP, ARTIFACTS, ROOT

pytestmark = pytest.mark.slow

REPORT = [sys.executable, "-m", "phaselens.cli", "report", "--collector"]
# at least n of the GPUs page's SVG panels drawn with a line (a TP group's)
GPU_LINES_DRAWN = """(n) => [...document.querySelectorAll('figure.pl-panel')].filter(
  p => [...p.querySelectorAll('polyline.pl-line')].some(l => (l.getAttribute('points') || '').length > 40)
).length >= n"""
# the script has finished its run (Streamlit shows its status widget while a run is in progress)
SETTLED = """() => document.querySelector('[data-testid="stMain"] [data-testid="stVerticalBlock"]') !== null
  && document.querySelector('[data-testid="stStatusWidget"]') === null"""


def _wait(page, script: str, what: str, arg: object = None, timeout_s: float = 180.0) -> None:
    """Wait until ``script`` holds on the page; else fail saying ``what`` (and keep a screenshot)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(script, arg=arg, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "timeout.png"), full_page=True)
        raise AssertionError(
            f"{what}: not within {timeout_s:g} s (test-artifacts/dashboard/timeout.png)"
        ) from None


def _new_context(browser: Any, **options: Any) -> Any:
    """A browser context whose clicks, waits and page loads wait as long as ``_wait`` does: Playwright's
    own 30 s (a click waits for its link to be actionable, a goto for the load event) ran out on a
    loaded host while the dashboard's script runs took their time."""
    context = browser.new_context(**options)
    context.set_default_timeout(180_000)
    context.set_default_navigation_timeout(180_000)
    return context


def dashboard_pages() -> list[tuple[str, str]]:
    """(file, title) of every page registered in dashboard/app.py's PAGES, read from its source (importing
    the app would run it), so pages added later are covered too."""
    tree = ast.parse(Path(APP).read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == "PAGES":
            return [(file, title) for file, title, _icon in ast.literal_eval(node.value)]
    raise AssertionError("dashboard/app.py defines no PAGES")


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
def browser(chromium: str) -> Iterator[Any]:
    """One headless Chromium for the module's tests (each opens its own context)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"], headless=True)
        try:
            yield launched
        finally:
            launched.close()


# the sidebar's link to the page titled ``arg`` is the current page
CURRENT_PAGE = """(title) => [...document.querySelectorAll('[data-testid="stSidebarNavLink"][aria-current="page"]')]
  .some(a => a.textContent.trim().endsWith(title))"""


def _python_errors(page) -> list[str]:
    """What the page shows of a Python exception (Streamlit's exception box, a traceback)."""
    shown = [page.locator('[data-testid="stException"]').all_inner_texts()]
    if page.get_by_text("Traceback (most recent call last)").count():
        shown.append(["a traceback"])
    return [text for texts in shown for text in texts]


@dataclass(frozen=True)
class Report:
    """A report of the demo's simulated scenario made with `phaselens report --out FILE`."""

    path: Path
    said: str


@pytest.fixture(scope="module")
def report(demo: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> Report:
    demo.ensure_up()
    scenario = demo.wait_for_scenario()
    out = tmp_path_factory.mktemp("report") / "report.html"
    done = subprocess.run(
        [
            *REPORT,
            demo.collector_url,
            f"--token={demo.token}",  # a token may start with "-"
            "--dataset",
            scenario["scenario_id"],
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return Report(out, done.stdout)


def test_every_page_renders_in_chromium(browser, demo: DemoRun, report: Report):
    """(``report`` is for the Reports page.)"""
    scenario = demo.wait_for_scenario()
    pages = dashboard_pages()
    assert {"gpus.py", "reports.py", "health.py"} <= {file for file, _title in pages}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = _new_context(browser, viewport={"width": 1400, "height": 2000})
    try:
        page = context.new_page()
        # live data first: the emulated prefill and decode GPUs, charted as they are sampled
        page.goto(f"{demo.dashboard_url}/gpus")  # the Overview is the default page
        _wait(page, GPU_LINES_DRAWN, "the live GPUs' charts drawn with data", 4)
        # the trust block is filled after the page's body (dashboard.page_trust.render_with_trust): the
        # charts can be drawn while the run is still going, longest on a loaded host
        _wait(page, SETTLED, "the live GPUs page: its script run finished")
        assert page.get_by_text("emulated", exact=True).count() == 1  # the page's trust label, once
        assert not _python_errors(page)
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "live-gpus.png"), full_page=True)

        # the simulated fleet: 8 GPUs (4 TP groups), labelled simulated; its data set carries over
        page.goto(f"{demo.dashboard_url}/gpus?dataset={scenario['scenario_id']}")
        _wait(page, GPU_LINES_DRAWN, "the simulated fleet's 8 charts (one per metric) drawn", 8)
        _wait(page, SETTLED, "the simulated fleet's GPUs page: its script run finished")
        assert page.get_by_text("simulated", exact=True).count() == 1
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "sim-gpus.png"), full_page=True)
        for file, title in pages:
            nav = page.locator('[data-testid="stSidebarNav"]')
            nav.get_by_role("link", name=title, exact=True).click()
            _wait(page, CURRENT_PAGE, f"page {title}: the current page", title)
            page.wait_for_timeout(500)  # its run has started; charts and iframes draw after it
            _wait(page, SETTLED, f"page {title}: its script run finished")
            errors = _python_errors(page)
            page.screenshot(path=str(ARTIFACTS / f"{file.removesuffix('.py')}.png"), full_page=True)
            assert not errors, f"page {title} ({file}) shows a Python exception: {errors}"
    finally:
        context.close()
    for file, _title in pages:
        assert (ARTIFACTS / f"{file.removesuffix('.py')}.png").stat().st_size > 10_000


# the Overview drawn: eight tiles with values and the GPU-time bar's segments laid out
OVERVIEW_DRAWN = """() => {
  const values = [...document.querySelectorAll('[data-testid="stMetricValue"]')];
  const segs = [...document.querySelectorAll('.pl-gpu-time .pl-seg')];
  return values.length >= 8 && values.every(v => v.textContent.trim())
      && segs.length >= 3 && segs.every(s => s.getBoundingClientRect().width > 0);
}"""
BAR = """() => [...document.querySelectorAll('.pl-gpu-time .pl-seg')].map(
  s => [s.dataset.key, Number(s.dataset.share), s.textContent, s.title, s.getBoundingClientRect().width])"""
SCRIPTS = """() => performance.getEntriesByType('resource').map(r => r.name).filter(n => n.includes('.js'))"""
# where the GPU-time bar ends (px from the top of the page), and the tile values cut short (an ellipsis)
FOLD = """() => [document.querySelector('.pl-gpu-time .pl-bar').getBoundingClientRect().bottom + window.scrollY,
  [...document.querySelectorAll('[data-testid="stMetricValue"]')].filter(v =>
    [v, ...v.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1)).map(v => v.textContent)]"""


def test_the_overview_draws_its_bar_without_plotly(browser, demo: DemoRun):
    """A first visit of the Overview (a fresh browser context): the GPU-time bar is HTML with its
    segments' shares, labels and hover titles, the page never fetches Plotly's bundle (nor the emoji
    library, which a clock time in a caption would pull in). On a 1280 × 800 laptop screen the bar is
    above the fold and no tile's value is cut short (issue 25: "1,218 toke…", the bar below the fold)."""
    scenario = demo.ensure_up().wait_for_scenario()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = _new_context(browser, viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(f"{demo.dashboard_url}/?dataset={scenario['scenario_id']}")
        _wait(page, OVERVIEW_DRAWN, "the Overview's tiles and GPU-time bar")
        _wait(page, SETTLED, "the Overview's script run finished")  # its trust block is filled last
        segments = page.evaluate(BAR)
        assert sum(share for _k, share, *_ in segments) == pytest.approx(1.0, abs=1e-3)
        widths = {key: width for key, _s, _t, _title, width in segments}
        bar_width = page.locator(".pl-gpu-time .pl-bar").first.bounding_box()["width"]
        for key, share, text, title, width in segments:
            assert width == pytest.approx(share * bar_width, abs=2.0), (key, widths)
            assert text in ("", f"{100 * share:.0f} %") and title.endswith("of GPU-time (all GPUs)")
        assert page.locator(".pl-gpu-time [data-testid=trust]").count() == 0  # said once, by the page's block
        block = page.get_by_text("Figures on this page:")
        assert block.count() == 1 and "simulated" in block.inner_text()
        assert page.get_by_text("share of GPU-time, %").count() == 1
        bar_bottom_px, cut = page.evaluate(FOLD)
        assert bar_bottom_px <= 800 and not cut, (bar_bottom_px, cut)
        assert page.get_by_text(re.compile(r"\d\d:\d\d:\d\d UTC")).count() >= 1  # escaped colons show
        assert not _python_errors(page)
        page.wait_for_timeout(1000)  # anything else the page would fetch
        fetched = page.evaluate(SCRIPTS)
        assert not [n for n in fetched if "PlotlyChart" in n or "remark-emoji" in n], fetched
        page.screenshot(path=str(ARTIFACTS / "overview-first-visit.png"), full_page=True)
    finally:
        context.close()


# both windows drawn: the comparison table's A and B cells filled, two GPU-time bars laid out
COMPARE_DRAWN = """() => {
  const cells = [...document.querySelectorAll('table.pl-compare td.pl-a, table.pl-compare td.pl-b')];
  const bars = [...document.querySelectorAll('.pl-gpu-time .pl-bar')];
  return cells.length >= 16 && cells.every(c => c.textContent.trim())
      && bars.length === 2 && bars.every(b => b.getBoundingClientRect().width > 0)
      && document.querySelector('[data-testid="stStatusWidget"]') === null;
}"""
SLIDER = """() => [...document.querySelectorAll('[data-testid="stSidebar"] [data-testid="stSliderThumbValue"]')]
  .map(s => parseFloat(s.textContent.replace(/,/g, '')))"""


def test_a_link_with_a_range_and_a_compare_opens_that_view(browser, demo: DemoRun):
    """A shared link (``?dataset=&range=&compare=previous``) in a fresh browser: the sidebar holds the
    link's range, the Overview shows A and B side by side (the comparison table, both GPU-time bars) and
    the URL keeps the range and the comparison."""
    scenario = demo.wait_for_scenario()
    sid = scenario["scenario_id"]
    dur = float(scenario["end_s"]) - float(scenario["start_s"])
    a, b = round(dur / 2, 1), round(dur, 1)
    context = _new_context(browser, viewport={"width": 1400, "height": 1600})
    try:
        page = context.new_page()
        page.goto(f"{demo.dashboard_url}/?dataset={sid}&range={a:g}-{b:g}&compare=previous")
        _wait(page, COMPARE_DRAWN, "the Overview's A and B columns")
        assert page.evaluate(SLIDER) == pytest.approx([a, b], abs=0.05)  # the link's range, in the sidebar
        assert page.locator("table.pl-compare td.pl-change").count() == 8  # a change per tile
        assert page.get_by_text("the period before", exact=False).count() >= 1  # B named
        assert f"range={a:g}-{b:g}" in page.url and "compare=previous" in page.url
        assert not _python_errors(page)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "overview-compare.png"), full_page=True)
    finally:
        context.close()


def test_a_report_renders_offline_in_chromium(browser, report: Report):
    """`phaselens report --out FILE` opened with the network cut and every request watched: the page
    asks for nothing outside itself, and its Plotly charts draw."""
    page_file = report.path
    assert f"page {page_file}" in report.said
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = _new_context(browser, offline=True, viewport={"width": 1200, "height": 1600})
    try:
        outside: list[str] = []

        def block(route) -> None:
            url = route.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                route.continue_()
            else:
                outside.append(url)
                route.abort()

        context.route("**/*", block)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(page_file.as_uri())
        page.get_by_text("Efficiency report").first.wait_for(timeout=30_000)
        assert page.locator(".js-plotly-plot").count() > 0, "the report has no Plotly chart"
        page.wait_for_function(
            "() => [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'))",
            timeout=30_000,
        )
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        assert not errors, errors
        assert not outside, f"the report asked for external URLs: {outside}"
    finally:
        context.close()


# the Recommendations page drawn: its Pareto chart with points, the current layout named in it
PARETO_DRAWN = """() => [...document.querySelectorAll('.js-plotly-plot')].some(
  p => p.querySelectorAll('.scatterlayer .point').length >= 3 && p.textContent.includes('current layout'))"""


def test_the_recommendations_page_shows_one_and_its_dry_run_plan(browser, demo: DemoRun):
    """A recommendation for the demo's stack (1 prefill + 1 decode emulated H100s) made through the
    running collector with `phaselens recommend --collector`: the page draws its Pareto chart (the
    current layout marked, labelled simulated), the candidates, the confidence; Apply shows the
    dry-run plan from the stack's layout (nothing changes: the execution is tests/phaselens/apply's)."""
    demo.ensure_up()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "phaselens.cli",
            "recommend",
            "--collector",
            demo.collector_url,
            f"--token={demo.token}",
            "--for",
            f"stack:{demo.serve_url}",
            "--layout",
            "1p1d:h100-sxm",
            "--model",
            "llama-3.1-8b",
            "--poisson",
            "2",
            "--num-requests",
            "60",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rec = json.loads(done.stdout)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    context = _new_context(browser, viewport={"width": 1400, "height": 2400})
    try:
        page = context.new_page()
        page.goto(f"{demo.dashboard_url}/recommendations")
        _wait(page, PARETO_DRAWN, "the Pareto chart with the current layout", timeout_s=120)
        _wait(page, SETTLED, "the page's script run finished")
        assert page.get_by_text("SIMULATED").count() >= 1  # the trust label in the chart
        assert page.get_by_text(rec["recommendation_id"]).count() >= 1
        assert page.get_by_text("Confidence", exact=False).count() >= 1
        assert page.locator('[data-testid="stDataFrame"]').count() >= 1  # the candidates
        page.get_by_role("button", name="Apply…").click()
        page.get_by_text("Dry-run plan").wait_for(timeout=60_000)
        _wait(page, SETTLED, "the dry run's script run finished")
        plan = page.locator('[data-testid="stCode"]').first.inner_text()
        assert f"stack {demo.serve_url}: 1 prefill + 1 decode → " in plan, plan
        assert page.get_by_role("button", name="Execute this plan").count() == 1
        assert not _python_errors(page)
        page.screenshot(path=str(ARTIFACTS / "recommendations-dry-run.png"), full_page=True)
    finally:
        context.close()


# the GPUs page drawn: n SVG panels, each with a heatmap's image or a line, and the script run over
GPU_PANELS_DRAWN = """(n) => {
  const panels = [...document.querySelectorAll('figure.pl-panel')];
  return panels.length === n && panels.every(p => p.querySelector('svg image, svg polyline.pl-line'))
    && document.querySelector('[data-testid="stStatusWidget"]') === null;
}"""
# per panel: its title, mode, the heatmap's group labels, and the panel's drawn size
GPU_PANELS = """() => [...document.querySelectorAll('figure.pl-panel')].map(p => [
  p.querySelector('figcaption').textContent, p.dataset.mode,
  [...p.querySelectorAll('text.pl-group')].map(t => t.textContent),
  p.querySelector('svg').getBoundingClientRect().height,
])"""


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_gpus_page_of_a_64_gpu_fleet_in_chromium(browser, tmp_path):
    """A simulated 64-GPU fleet (8 replicas of TP 8): one chart per metric, each a GPU x time heatmap
    whose rows are grouped by worker (each TP group labelled once), no chart per GPU. Its own small
    collector and dashboard: merging a scenario into the demo's would change the newest scenario its
    tests read."""
    from dashboard.figures.gpus import PANELS
    from phaselens.testing import start_collector
    from tests.conftest import _free_port, stop_process

    db = tmp_path / "fleet64.duckdb"
    sim = [
        sys.executable,
        "-m",
        "phaselens.cli",
        "simulate",
        "--no-progress",
        "--layout",
        "agg:64xh100-sxm:tp8",
    ]
    done = subprocess.run([*sim, "--limit", "60", "--db", str(db)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sid = re.search(r"scenario (\S+): ", done.stdout).group(1)
    collector, url = start_collector(db)
    port = _free_port()
    streamlit = [sys.executable, "-m", "streamlit", "run", APP, "--server.headless=true"]
    streamlit += [
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
    ]
    env = {**os.environ, "PHASELENS_API_URL": url}
    dash = subprocess.Popen(
        streamlit, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not _answers(f"{base}/_stcore/health"):
            assert dash.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.3)
        context = _new_context(browser, viewport={"width": 1400, "height": 2600})
        try:
            page = context.new_page()
            page.goto(f"{base}/gpus?dataset={sid}")
            _wait(page, GPU_PANELS_DRAWN, "the 64 GPUs' charts, one per metric", len(PANELS))
            _wait(page, SETTLED, "the 64 GPUs page's script run finished")  # its trust block is filled last
            panels = page.evaluate(GPU_PANELS)
            titles = [t for t, *_ in panels]
            assert titles == [f"{p.title}, {p.unit}" for p in PANELS], titles
            assert {mode for _t, mode, *_ in panels} == {"heatmap"}  # 64 GPUs: heatmaps, not 64 lines
            for title, _mode, groups, height in panels:
                assert groups == [f"worker-{i} · mixed" for i in range(8)], (
                    title,
                    groups,
                )  # each TP group once
                assert 150 < height < 450, (title, height)  # a panel, not a 600 px stack per GPU
            assert page.locator(".js-plotly-plot").count() == 0
            assert page.get_by_text("64 GPUs in 8 TP groups", exact=False).count() == 1
            assert page.get_by_text("simulated", exact=True).count() == 1  # the trust label, once
            assert not _python_errors(page)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "gpus-64.png"), full_page=True)
        finally:
            context.close()
    finally:
        stop_process(dash)
        stop_process(collector)


# the Power page drawn: two curve charts (a role's power limit and clock window), one naming its cliff
POWER_DRAWN = """() => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return plots.filter(p => p.textContent.includes('tokens/J and latency')).length >= 2
    && plots.some(p => p.textContent.includes('cliff:') && p.querySelectorAll('.scatterlayer .point').length >= 3);
}"""


def test_the_power_page_draws_the_curves_and_the_dry_run_plan(browser, demo: DemoRun, tmp_path):
    """A calibration of the demo stack's decode worker (made by the simulator's sweep of the same GPU,
    with the stack's own fingerprint: tests/power_data.py) and its power recommendation in a store
    of their own, read by a second collector that watches the demo's stack with its token: the Power
    page draws the decode curves against the power limit and the clock window with the cliff named,
    labelled simulated, the setpoints per mode, and Apply… shows the dry-run plan from the live
    stack's knobs (nothing changes: the execution is tests/dashboard/views/test_power.py's)."""
    from collector.store import Store
    from phaselens.apply.stack import StackClient
    from phaselens.power.run import read_stack
    from phaselens.testing import start_collector
    from tests.conftest import _free_port, stop_process
    from tests.power_data import calibration, recommendation

    demo.ensure_up()
    with StackClient(demo.serve_url, demo.token) as c:
        seen = read_stack(c, ["decode"])
    workers = [w for w, _b in seen["roles"]["decode"]]
    target = f"stack:{demo.serve_url}"
    cal = calibration(
        target,
        "decode",
        layout="1p1d:h100-sxm",
        model="llama-3.1-8b",
        workers=workers,
        fp=seen["fingerprints"]["decode"],
    )
    rec = recommendation(target, {"decode": cal})
    assert rec["proposed"]["changes"], rec["rationale"]
    db = tmp_path / "power.duckdb"
    with Store.open(db) as store:
        store.append("power_calibrations", [cal])
        store.append("recommendations", [rec])
        store.flush()
    collector, url = start_collector(
        db, "--serving", demo.serve_url, "--control-token", demo.token, "--report-schedule", "off"
    )
    port = _free_port()
    streamlit = [sys.executable, "-m", "streamlit", "run", APP, "--server.headless=true"]
    streamlit += [
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
    ]
    env = {**os.environ, "PHASELENS_API_URL": url, "PHASELENS_CONTROL_TOKEN": demo.token}
    dash = subprocess.Popen(
        streamlit, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not _answers(f"{base}/_stcore/health"):
            assert dash.poll() is None and time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.3)
        context = _new_context(browser, viewport={"width": 1400, "height": 2600})
        try:
            page = context.new_page()
            page.goto(f"{base}/power")
            _wait(page, POWER_DRAWN, "the Power page's curves with the cliff", timeout_s=120)
            _wait(page, SETTLED, "the page's script run finished")
            block = page.get_by_text("Figures on this page:")
            assert block.count() == 1 and "simulated" in block.inner_text()  # the trust label, once
            assert page.get_by_text("Setpoints per phase and mode").count() == 1
            assert page.get_by_text(rec["recommendation_id"], exact=False).count() >= 1
            page.get_by_role("button", name="Apply…").click()
            page.get_by_text("Dry-run plan").wait_for(timeout=60_000)
            _wait(page, SETTLED, "the dry run's script run finished")
            plan = page.locator('[data-testid="stCode"]').first.inner_text()
            setting = rec["proposed"]["settings"]["decode"]["setting"]["label"]
            assert f"set {workers[0]} (decode) to {setting}" in plan, plan
            assert page.get_by_role("button", name="Execute this plan").count() == 1
            assert not _python_errors(page)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "power-dry-run.png"), full_page=True)
        finally:
            context.close()
    finally:
        stop_process(dash)
        stop_process(collector)
