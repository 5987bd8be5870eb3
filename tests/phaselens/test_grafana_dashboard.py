"""The Grafana dashboard and the alert rule of docs/grafana/ are the ones phaselens/grafana_dashboard.py
generates (grafanalib's typed panels), with the dashboard's palette, the variables every per-GPU
query filters on, and annotations from control actions. Their queries run against a real Prometheus in
tests/phaselens/test_metrics_export.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from dashboard.figures.style import COST_COLOURS, PHASE_COLOURS, TRUST_COLOURS
from phaselens import grafana_dashboard as gd
from phaselens.metrics_counters import CATEGORY_LABEL

PROMTOOL = shutil.which("promtool")


def test_the_committed_files_are_the_generated_ones(capsys: pytest.CaptureFixture[str]):
    assert gd.main(["--check"]) == 0, capsys.readouterr().err
    assert json.loads(gd.DASHBOARD_PATH.read_text()) == gd.build()


def test_check_names_a_stale_file(tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]):
    stale = tmp_path / "phaselens.json"
    stale.write_text("{}")
    monkeypatch.setattr(gd, "DASHBOARD_PATH", stale)
    monkeypatch.setattr(gd, "ROOT", tmp_path)
    assert gd.main(["--check"]) == 1
    assert "phaselens.json: not the generated file" in capsys.readouterr().err


def test_variables_filter_every_per_gpu_query():
    dash = gd.build()
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["datasource", "node", "pool", "gpu", "model"]
    ds = dash["templating"]["list"][0]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    for v in dash["templating"]["list"][1:]:
        assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
        assert v["datasource"]["uid"] == "${datasource}"
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    per_gpu = re.compile(
        r"phaselens_(gpu_seconds|gpu_energy_joules|gpu_cost_dollars|tokens)_total\{([^}]*)\}"
    )
    for p in panels:
        assert p["title"] and p["description"] and p["datasource"]["uid"] == "${datasource}"
        assert p["targets"]
        for t in p["targets"]:
            for _name, selector in per_gpu.findall(t["expr"]):
                for label, var in (
                    ("Hostname", "node"),
                    ("pool", "pool"),
                    ("UUID", "gpu"),
                    ("model", "model"),
                ):
                    assert f'{label}=~"${var}"' in selector, (p["title"], t["expr"])


def _overrides(panel: dict) -> dict[str, str]:
    out = {}
    for o in panel["fieldConfig"]["overrides"]:
        for prop in o["properties"]:
            if prop["id"] == "color":
                out[o["matcher"]["options"]] = prop["value"]["fixedColor"]
    return out


def test_categories_and_pools_have_the_pages_colours():
    dash = gd.build()
    by_title = {p["title"]: p for p in dash["panels"]}
    for title in ("GPU-time by category", "Cost by category, $ per hour", "Power by category"):
        colours = _overrides(by_title[title])
        assert colours == {label: COST_COLOURS[cat] for cat, label in CATEGORY_LABEL.items()}, title
        assert by_title[title]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (trust,) = by_title["Trust of the figures"]["fieldConfig"]["overrides"]
    (mapping,) = next(p["value"] for p in trust["properties"] if p["id"] == "mappings")
    assert {k: v["color"] for k, v in mapping["options"].items()} == {
        k: v[1] for k, v in TRUST_COLOURS.items()
    }
    pools = _overrides(by_title["Stranded share per pool"])
    assert {k: pools[k] for k in ("prefill", "decode", "mixed")} == {
        k: PHASE_COLOURS[k] for k in ("prefill", "decode", "mixed")
    }


def test_annotations_come_from_control_actions_and_the_alert_rule_is_valid():
    dash = gd.build()
    exprs = [a["expr"] for a in dash["annotations"]["list"]]
    assert any("phaselens_control_actions_total" in e for e in exprs)
    assert any("phaselens_control_events_total" in e for e in exprs)
    rules = gd.ALERTS_PATH.read_text()
    assert f"> {gd.STRANDED_USD_PER_H_ALERT:g}\n" in rules and "PhaselensStrandedDollarsPerHourHigh" in rules
    if PROMTOOL is None:
        pytest.skip("promtool not found (apt-get install prometheus)")
    check = subprocess.run([PROMTOOL, "check", "rules", str(gd.ALERTS_PATH)], capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 1 rules found" in check.stdout, check.stdout + check.stderr
