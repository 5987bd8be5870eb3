"""dashboard/page_settle.py: the settle script and the page list that bench/dashboard.py and
scripts/screens.py share."""

from __future__ import annotations

from dashboard.page_settle import APP, app_pages, settle_script, settled_for


def test_app_pages_are_the_view_files_in_app_order() -> None:
    pages = app_pages()
    assert pages and pages[0][0].endswith(".py")
    for file, title in pages:
        assert (APP.parent / "views" / file).is_file(), file
        assert title
    source = APP.read_text(encoding="utf-8")
    positions = [source.index(f'"{file}"') for file, _title in pages]
    assert positions == sorted(positions)


def test_settle_script_records_since_when_and_the_wait_holds_it() -> None:
    script = settle_script(interval_ms=50)
    assert script.startswith("setInterval(") and script.endswith("}, 50);")
    assert "window.__settled = performance.now()" in script and ".js-plotly-plot" in script
    assert settle_script(100).endswith("}, 100);")
    assert (
        settled_for(2000) == "() => window.__settled != null && performance.now() - window.__settled >= 2000"
    )
