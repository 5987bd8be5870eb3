"""The report page on a real simulated scenario (a prefill and a decode pool): each section with the
dashboard's charts and data, the headline equal to the overview's pure function, an empty window as a
short page without charts, and nothing that reaches outside the file."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from analytics.histogram import activity_histogram
from analytics.overview import FIGURES, overview
from analytics.reads import run_summary
from analytics.window import resolve_window
from collector.store import Store
from dashboard.figures import figure_text
from dashboard.report_html import PLOTLY_MARKER, render_html, standalone_html
from phaselens.overview import SKIP_PARTS
from phaselens.reports import build_report

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = (
    "At a glance",
    "Where the GPU-time goes",
    "Bimodality per pool",
    "Where the money goes",
    "Latency and SLO attainment",
    "Appendix: the detailed tables",
)


class _Page(HTMLParser):
    """What a test reads of a page: headings, tiles' values by figure, every src / href, scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.tiles: dict[str, list[str]] = {}
        self.links: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self._in: str | None = None
        self._tile: str | None = None
        self._div_class: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("src", "href", "action", "poster", "data"):
            if a.get(key):
                self.links.append(str(a[key]))
        if tag == "script":
            self.scripts.append(a)
        if tag == "h2":
            self._in = "h2"
            self.h2.append("")
        if tag == "div":
            self._div_class.append(a.get("class"))
            if a.get("data-figure"):
                self._tile = str(a["data-figure"])
                self.tiles[self._tile] = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in = None
        if tag == "div" and self._div_class:
            self._div_class.pop()

    def handle_data(self, data: str) -> None:
        if self._in == "h2":
            self.h2[-1] += data
        if self._tile and self._div_class and self._div_class[-1] == "value":
            self.tiles[self._tile].append(data)


def _parse(page: str) -> _Page:
    p = _Page()
    p.feed(page)
    return p


def _charts(page: str) -> dict[str, tuple[list[dict], dict]]:
    """Each chart's traces and layout, read back from Plotly's ``newPlot`` calls."""
    dec = json.JSONDecoder()
    out = {}
    for chunk in page.split("Plotly.newPlot(")[1:]:
        div, i = dec.raw_decode(chunk.lstrip())
        rest = chunk.lstrip()[i:].lstrip(", \n")
        data, j = dec.raw_decode(rest)
        layout, _ = dec.raw_decode(rest[j:].lstrip(", \n"))
        out[div] = (data, layout)
    return out


def _title(layout: dict) -> str:
    t = layout.get("title") or {}
    return t.get("text", "") if isinstance(t, dict) else str(t)


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("report_html") / "sim.duckdb"
    cmd = [sys.executable, "-m", "phaselens.cli", "simulate", "--no-progress", "--limit", "40"]
    done = subprocess.run(
        [*cmd, "--layout", "1p1d:h100-sxm", "--db", str(db)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture(scope="module")
def made(store_file: Path):
    """A report of the scenario's second half (so that the first half is its previous period), and
    the same analyses run directly on the same store."""
    with Store.open(store_file, read_only=True) as store, store.reader() as cur:
        sc_id, start_s, end_s = cur.execute("SELECT scenario_id, start_s, end_s FROM scenarios").fetchone()
        mid = (start_s + end_s) / 2
        report = build_report(cur, {"dataset": sc_id, "start_s": mid})
        assert report.start_s == mid and report.end_s == pytest.approx(end_s, abs=1.0)
        end_s = report.end_s  # the window the report resolved (the scenario's last sample)
        params = {"dataset": sc_id, "start_s": mid, "end_s": end_s}
        current = run_summary(cur, params)
        previous = run_summary(cur, params | {"start_s": mid - (end_s - mid), "end_s": mid}, skip=SKIP_PARTS)
        window = resolve_window(cur, dataset=sc_id, start_s=mid, end_s=end_s)
        hist = activity_histogram(cur, window).to_dict()
        empty = build_report(cur, {"dataset": "live", "start_s": 1_700_000_000.0, "end_s": 1_700_003_600.0})
    return report, overview(current, previous), hist, empty


def test_every_section_has_its_data(made):
    report, _want, _hist, _empty = made
    assert report.error is None
    page = _parse(report.body)
    for section in SECTIONS:
        assert section in page.h2, (section, page.h2)
    assert page.h2.index("At a glance") < page.h2.index("Where the GPU-time goes")
    assert "<details><summary>Phases</summary>" in report.body  # the tables, folded at the end
    assert report.body.index("Appendix: the detailed tables") > report.body.index("Latency and SLO")
    assert "No data in this window" not in report.body
    charts = _charts(standalone_html(report.body))
    titles = [_title(layout) for _data, layout in charts.values()]
    for want in (
        "Where the money goes, by pool",
        "Cost over time",
        "Annualised: $",
        "Latency percentiles over time",
        "SLO attainment over time",
    ):
        assert any(t.startswith(want) for t in titles), (want, titles)
    gpu_time = next(data for data, layout in charts.values() if not _title(layout))  # the GPU-time bar
    assert {tuple(t["y"]) for t in gpu_time} == {("all GPUs", "prefill pool", "decode pool")}
    # every chart says how far its numbers can be trusted, in the chart itself
    for div, (_data, layout) in charts.items():
        texts = " ".join(a.get("text", "") for a in layout.get("annotations") or [])
        assert "SIMULATED" in texts, div


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return None if value != value else round(value, 9)  # NaN compares unequal to itself
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_nothing_covers_the_trust_labels_of_a_chart(made):
    """The labels sit above each chart's top right: no legend shares that line (the GPU-time bar's did,
    hiding its last entries) and no tool bar floats over it."""
    report = made[0]
    page = standalone_html(report.body)
    charts = _charts(page)
    assert len(charts) >= 6
    for div, (_data, layout) in charts.items():
        legend = layout.get("legend") or {}
        if layout.get("showlegend") is not False and legend.get("orientation") == "h":
            assert legend.get("y", 0) < 0 and legend.get("yanchor") == "top", (div, legend)
    dec = json.JSONDecoder()
    for chunk in page.split("Plotly.newPlot(")[1:]:
        rest = chunk.lstrip()
        for _ in range(3):  # the div, the traces, the layout; then the config
            _obj, i = dec.raw_decode(rest)
            rest = rest[i:].lstrip(", \n")
        config, _ = dec.raw_decode(rest)
        assert config.get("displayModeBar") is False, config


def test_the_histograms_are_the_histogram_of_the_same_window_with_both_modes(made):
    report, _want, hist, _empty = made
    # stored with the summary (means to 1e-9: DuckDB sums floats in no fixed order)
    assert _rounded(report.summary["histogram"]["groups"]) == _rounded(hist["groups"])
    charts = _charts(standalone_html(report.body))
    pools = {g["pool"]: g for g in hist["groups"]}
    assert {"prefill", "decode"} <= set(pools)
    for pool in ("prefill", "decode"):
        data, layout = next(
            (d, lay) for d, lay in charts.values() if _title(lay).startswith(f"{pool.capitalize()} pool — ")
        )
        row = next(
            r
            for r in report.summary["parts"]["bimodal"]["table"]
            if r.get("role") == pool and r["scope"] == "pool"
        )
        assert _title(layout) == f"{pool.capitalize()} pool — {row['verdict']}"  # the analytics' verdict
        bars = {t["name"].split(" (")[0]: t for t in data if t["type"] == "bar"}
        counts = pools[pool]["sm_active"]["counts"]
        assert bars["SM activity"]["y"] == pytest.approx([100 * c / sum(counts) for c in counts])
        names = [t["name"] for t in data]
        two = row["mode_high_pct"] is not None
        assert ("mode (low)" in names and "mode (high)" in names) if two else "mode (one)" in names
        modes = [s for s in layout.get("shapes") or [] if s.get("type") == "line"]
        assert len(modes) == (2 if two else 1)  # the modes, marked
    body = report.body
    assert body.count("<b>Bimodal?</b>") >= 2 and ("<b>Modes:</b>" in body or "<b>One mode:</b>" in body)
    assert f"Verdict: {html.escape(report.summary['parts']['bimodal']['rule'])}." in body  # the rule, once


def test_the_headline_figures_equal_the_overview_of_the_two_periods(made):
    report, want, _hist, _empty = made
    got = report.summary["overview"]["figures"]
    for f in FIGURES:
        for field in ("value", "previous", "delta"):
            assert got[f.key][field] == pytest.approx(want["figures"][f.key][field], rel=1e-9), (f.key, field)
    tiles = _parse(report.body).tiles
    assert set(tiles) == {f.key for f in FIGURES}
    for f in FIGURES:
        assert "".join(tiles[f.key]) == figure_text(f.key, want["figures"][f.key]["value"]), f.key
    assert want["figures"]["output_tokens_per_s"]["delta"] is not None  # a trend against the first half
    assert "vs previous period" in report.body and "Against the previous period" in report.body
    assert want["money"]["sentence"] and want["money"]["sentence"] in report.body


def test_the_json_summary_keeps_its_keys(made):
    report, _want, _hist, _empty = made
    assert {"window", "trust", "parts", "missing", "seconds"} <= set(report.summary)
    assert {"overview", "histogram"} <= set(report.summary)


def test_the_page_references_nothing_outside_itself(made):
    from plotly.offline import get_plotlyjs

    report, *_ = made
    full = standalone_html(report.body)
    assert report.body.count(PLOTLY_MARKER) == 1 and PLOTLY_MARKER not in full
    page = _parse(full)
    assert page.links == []  # no src, no href: no CDN, no external URL, no link at all
    assert all(not s.get("src") for s in page.scripts)
    bundle = get_plotlyjs()
    assert full.count(bundle[:2000].replace("</script", "<\\/script")) == 1  # plotly.js inlined once
    assert "cdn.plot.ly" not in full.replace(bundle.replace("</script", "<\\/script"), "")


def test_an_empty_window_is_a_short_page_saying_so(made):
    *_, empty = made
    assert empty.error is None
    body = empty.body
    assert "No data in this window" in body
    assert PLOTLY_MARKER not in body and "Plotly.newPlot" not in body  # no empty charts
    h2 = _parse(body).h2
    assert "At a glance" not in h2 and "Bimodality per pool" not in h2
    assert h2 == ["Why"]  # what each analysis found missing, nothing else but the folded JSON
    assert "<b>phases, idle</b>: no GPU sample intervals" in body  # one line per reason
    assert standalone_html(body) == body


def test_a_summary_without_report_keys_still_renders_its_headline():
    """An older stored summary (no overview, no histogram): headline from the summary alone."""
    summary = {
        "window": {
            "dataset": "live",
            "start_s": 1_796_000_000.0,
            "end_s": 1_796_003_600.0,
            "duration_s": 3600.0,
        },
        "trust": {"labels": ["emulated"], "notes": []},
        "parts": {"latency": {"requests": 0, "trust": {"labels": ["emulated"]}}},
        "missing": {"cost": "no GPU time in the window"},
    }
    body = render_html(summary, title="old")
    assert "No data in this window" in body and "no GPU time in the window" in body


def test_the_title_names_the_model_the_layout_and_the_window(made, store_file):
    report, *_, empty = made
    with Store.open(store_file, read_only=True) as store, store.reader() as cur:
        model = cur.execute("SELECT model FROM scenarios").fetchone()[0]
    assert report.title.startswith(f"Efficiency report · {model} on 1p1d:h100-sxm · simulated scenario ")
    assert report.title.endswith(" s)") and " UTC (" in report.title  # the window and its length
    assert report.summary["scope"]["layout"] == "1p1d:h100-sxm" and report.summary["scope"]["model"] == model
    # a live window without the stack's workers says what it knows: no model, no layout
    assert empty.title == "Efficiency report · live stack · 2023-11-14 22:13 – 23:13 UTC (1 h)"


def test_the_appendix_labels_every_field_with_words_and_units(made):
    report, *_ = made
    appendix = report.body.split("Appendix: the detailed tables")[1].split('id="report-json"')[0]
    labels = set(re.findall(r"<th>([^<]*)</th>", appendix)) | set(re.findall(r"<h[3-6]>([^<]*)</h", appendix))
    assert {"TTFT p99 (s)", "Energy, decode (J)", "Decode (%)", "Output tokens per second"} <= labels, labels
    assert [lb for lb in labels if "_" in lb or "j " in lb.lower() or lb.lower().endswith(" j")] == []
    assert re.search(r"<td class=\"num\">[\d.]+ (s|ms)</td>", report.body)  # latency cells carry their unit


def test_the_roofline_section_shows_mfu_mbu_and_stranded_time_with_labels(made):
    """Issue 23: the report's roofline section is the summary's roofline part, with trust badges."""
    report, _want, _hist, _empty = made
    assert "Against the roofline" in _parse(report.body).h2
    part = json.loads(
        html.unescape(re.search(r'id="phaselens-summary">(.*?)</script>', report.body, re.S).group(1))
    )["parts"]["roofline"]
    section = report.body[report.body.index("<h2>Against the roofline</h2>") :]
    section = section[: section.index("</section>")]
    for r in part["table"]:
        if r["scope"] == "pool":
            assert f"{100 * r['mfu']:.1f} %" in section and f"{100 * r['mbu']:.1f} %" in section
    for s in part["stranded"]:
        if s.get("stranded_compute_s") is not None:
            assert f"{s['stranded_compute_s']:,.2f}" in section
    assert '<span class="badge simulated">simulated</span>' in section
