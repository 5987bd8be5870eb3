"""One colour language (issue 25): every colour is defined once, in dashboard/figures/palette.py, and
means one thing; no other module of the dashboard, the reports or the Grafana dashboard writes a
colour literal (a hex colour, rgb()/rgba(), or a Streamlit badge colour for a trust label)."""

from __future__ import annotations

import re

from dashboard.figures import palette
from dashboard.figures.style import COST_COLOURS, PHASE_COLOURS, TRUST_COLOURS
from tests.dashboard.conftest import ROOT

HEX = re.compile(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b")
RGB = re.compile(r"\brgba?\(\s*\d")
BADGE = re.compile(
    r":(green|orange|violet|blue|red|gray|grey)-badge\[(measured|emulated|simulated|host-bound|estimated)\]"
)
# every module that draws: the dashboard (pages, figures, reports) and the Grafana dashboard
DRAWING = [*sorted((ROOT / "dashboard").rglob("*.py")), ROOT / "phaselens" / "grafana_dashboard.py"]


def _code_lines(path):
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), 1)


def test_no_module_but_the_palette_writes_a_colour():
    found = []
    for path in DRAWING:
        if path.name == "palette.py":
            continue
        for n, line in _code_lines(path):
            # f-string placeholders like {x:#x} never match: a colour literal does
            for pattern in (HEX, RGB, BADGE):
                m = pattern.search(line)
                # rgb() built from computed numbers (the heatmap's viridis stops) names no colour
                if m and not (pattern is RGB and "rgb({r:" in line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not found, "colours outside dashboard/figures/palette.py:\n" + "\n".join(found)


def test_a_phase_colour_is_not_written_in_a_figure_module():
    phase_hexes = {c.lower() for c in PHASE_COLOURS.values()}
    for path in (ROOT / "dashboard" / "figures").glob("*.py"):
        if path.name == "palette.py":
            continue
        text = path.read_text(encoding="utf-8").lower()
        assert not [c for c in phase_hexes if c in text], path.name


def test_each_colour_means_one_thing():
    """Phases, waste, SLO status, trust labels and device signals each have their own colours; the only
    shared ones are by design: host-bound (the trust label and the GPU-time), a phase and its cost
    category, TTFT in prefill's colour."""
    meanings: dict[str, list[str]] = {}
    groups = {
        "phase": palette.PHASE_COLOURS,
        "waste": palette.WASTE_COLOURS,
        "status": palette.STATUS_COLOURS,
        "trust": {k: hex_ for k, (_badge, hex_) in palette.TRUST_COLOURS.items()},
        "signal": palette.SIGNAL_COLOURS,
    }
    for group, colours in groups.items():
        for key, colour in colours.items():
            meanings.setdefault(colour.lower(), []).append(f"{group} {key}")
    shared = {c: m for c, m in meanings.items() if len(m) > 1}
    assert shared == {
        palette.PHASE_COLOURS["host"]: ["phase host", "trust host-bound"],
        palette.PHASE_COLOURS["prefill"]: ["phase prefill", "signal ttft"],
    }
    # red is for stranded GPU-time only; host-bound is one colour, mixed another
    assert palette.STATUS_COLOURS["missed"] not in palette.WASTE_COLOURS.values()
    assert COST_COLOURS["host_bound"] == TRUST_COLOURS["host-bound"][1] != PHASE_COLOURS["mixed"]
    assert palette.SIGNAL_COLOURS["gpu_util"] not in palette.WASTE_COLOURS.values()
    # the Streamlit badge colours of the trust labels are distinct too
    badges = [badge for badge, _hex in palette.TRUST_COLOURS.values()]
    assert len(set(badges)) == len(badges)


def test_the_report_styles_its_trust_badges_and_deltas_from_the_palette():
    from dashboard.report_html.page import _CSS

    for label, (_badge, hex_) in palette.TRUST_COLOURS.items():
        assert f".{label}{{background:{hex_}}}" in _CSS
    assert f".worse{{color:{palette.DELTA_COLOURS['worse']}}}" in _CSS
