"""Efficiency reports: schedules and their misfire policy, the self-contained page, and reports
made, listed and served by a real collector (`phaselens report`, the scheduler at start)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import httpx
import pytest

from collector.store import Store
from phaselens.cli import main
from phaselens.reports import (
    PLOTLY_MARKER,
    ReportError,
    ReportScheduler,
    parse_schedule,
    parse_schedules,
    render_html,
    standalone_html,
)
from tests.collector.conftest import start_collector

SUMMARY = {  # the shape of analytics' Summary.to_dict()
    "window": {"dataset": "live", "start_s": 1_796_000_000.0, "end_s": 1_796_003_600.0, "duration_s": 3600.0},
    "trust": {"labels": ["emulated", "host-bound"], "notes": ["3 % of iterations lagged the model"]},
    "parts": {
        "idle": {"idle_share": 0.25, "stranded_share": 0.4, "host_bound_share": 0.05, "gpus": 8},
        "phases": {
            "per_gpu": [
                {
                    "worker": f"worker-{i}",
                    "role": r,
                    "frac_prefill": p,
                    "frac_decode": d,
                    "frac_idle": 1 - p - d,
                }
                | {f"field_{k}_s": float(k) for k in range(20)}
                for i, (r, p, d) in enumerate([("prefill", 0.3, 0.0), ("decode", 0.0, 0.7)])
            ]
        },
        "cost": {
            "per_pool": [
                {"pool": "decode", "usd_per_1m_output": 0.42},
                {"pool": "prefill<b>", "usd_per_1m_output": 1.5},
            ]
        },
    },
    "missing": {"latency": "no requests in the window"},
    "seconds": {"idle": 0.1},
}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_schedules_parse_cron_and_name_what_is_wrong():
    hourly = parse_schedule("hourly=0 * * * *")
    assert hourly.period_s(_ts("2026-12-01 10:30")) == 3600
    assert parse_schedule("daily=0 6 * * *").grace_s() == 6 * 3600  # a quarter of the period
    assert parse_schedules(["off"]) == []
    with pytest.raises(ReportError, match="NAME=CRON"):
        parse_schedule("0 * * * *")
    with pytest.raises(ReportError, match="not a 5-field cron"):
        parse_schedule("hourly=61 * * * *")
    with pytest.raises(ReportError, match="given twice"):
        parse_schedules(["a=0 * * * *", "a=5 * * * *"])
    assert hourly.fire_times_s(_ts("2026-12-01 10:00"), _ts("2026-12-01 12:00")) == [
        _ts("2026-12-01 11:00"),
        _ts("2026-12-01 12:00"),
    ]


def test_misfire_policy_coalesces_runs_missed_while_down_within_the_grace_time(tmp_path):
    store = Store.open(tmp_path / "r.duckdb")
    sched = ReportScheduler([parse_schedule("hourly=0 * * * *")], store, "n", write=lambda job: None)
    hourly = sched.schedules[0]
    assert sched.missed_fire_s(hourly, _ts("2026-12-01 11:05")) is None  # never ran: nothing missed
    store.append("reports", [{"node": "n", "ts_s": _ts("2026-12-01 10:00:05"), "kind": "hourly"}])
    store.flush()
    assert sched.missed_fire_s(hourly, _ts("2026-12-01 10:30")) is None  # nothing due since
    assert sched.missed_fire_s(hourly, _ts("2026-12-01 11:05")) == _ts("2026-12-01 11:00")
    assert sched.missed_fire_s(hourly, _ts("2026-12-01 11:20")) is None  # 20 min late > 15 min grace
    # down from 10:00 to 12:10: the 11:00 and 12:00 runs become one, for 12:00
    assert sched.missed_fire_s(hourly, _ts("2026-12-01 12:10")) == _ts("2026-12-01 12:00")
    store.close()


def test_schedules_take_an_optional_seconds_field_first():
    every_20s = parse_schedule("often=*/20 * * * * *")
    assert every_20s.period_s(_ts("2026-12-01 10:00:05")) == 20
    assert every_20s.grace_s() == 60  # a quarter of 20 s, but at least a minute
    assert every_20s.fire_times_s(_ts("2026-12-01 10:00"), _ts("2026-12-01 10:01")) == [
        _ts("2026-12-01 10:00:20"),
        _ts("2026-12-01 10:00:40"),
        _ts("2026-12-01 10:01"),
    ]
    # six fields: seconds first, then the five crontab fields with the same meanings
    assert parse_schedule("h=30 0 * * * *").fire_times_s(
        _ts("2026-12-01 10:00"), _ts("2026-12-01 12:00")
    ) == [
        _ts("2026-12-01 10:00:30"),
        _ts("2026-12-01 11:00:30"),
    ]
    with pytest.raises(ReportError, match=r"'61 \* \* \* \* \*' is not a 5-field.*6-field.*seconds first"):
        parse_schedule("s=61 * * * * *")
    with pytest.raises(ReportError, match="7 fields, expected 5 or 6"):
        parse_schedule("s=* * * * * * *")


def test_a_seconds_schedule_down_for_a_week_catches_up_once_for_its_latest_fire_time(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    sched = ReportScheduler([parse_schedule("often=*/10 * * * * *")], store, "n", write=lambda job: None)
    often = sched.schedules[0]
    store.append("reports", [{"node": "n", "ts_s": _ts("2026-12-01 10:00:00.2"), "kind": "often"}])
    store.flush()
    assert sched.missed_fire_s(often, _ts("2026-12-01 10:00:05")) is None  # nothing due since
    assert sched.missed_fire_s(often, _ts("2026-12-01 10:00:25")) == _ts("2026-12-01 10:00:20")
    # a week later (60,480 fire times since the last run): the latest, within the one-minute grace
    assert sched.missed_fire_s(often, _ts("2026-12-08 10:00:05")) == _ts("2026-12-08 10:00")
    assert sched.missed_fire_s(often, _ts("2026-12-08 10:01:00")) == _ts("2026-12-08 10:01")
    store.close()


def test_the_page_escapes_folds_the_tables_and_embeds_the_json():
    page = render_html(SUMMARY, title="Hourly <report>", start_s=1_796_000_000.0, end_s=1_796_003_600.0)
    assert "<script src" not in page and PLOTLY_MARKER not in page  # no chart here: no script at all
    assert standalone_html(page) == page
    assert "Hourly &lt;report&gt;" in page and "prefill&lt;b&gt;" in page  # escaped
    assert "<h2>What is missing</h2>" in page and "no requests in the window" in page
    assert 'class="badge emulated"' in page and 'class="badge host-bound"' in page
    assert "3 % of iterations lagged the model" in page  # the notes, in the appendix
    # the appendix: a wide table of two GPUs on its side (a column per GPU), in a folded part
    assert "<details><summary>Phases</summary>" in page
    assert "<th>prefill · worker-0</th><th>decode · worker-1</th>" in page
    assert "No data in this window" not in page  # phases were recorded
    embedded = page.split('id="phaselens-summary">')[1].split("</script>")[0]
    assert json.loads(embedded.replace("<\\/", "</")) == SUMMARY
    failed = render_html(None, title="t", error="the analytics summary failed: boom")
    assert "No summary:</b> the analytics summary failed: boom" in failed


@pytest.fixture
def collector_url(tmp_path):
    db = tmp_path / "c.duckdb"
    with Store.open(db) as store:  # an every-minute schedule that ran two minutes ago: one run missed
        store.append(
            "reports", [{"node": "n", "ts_s": time.time() - 125, "kind": "minutely", "format": "html"}]
        )
        store.flush()
    proc, url = start_collector(db, "--report-schedule", "minutely=* * * * *")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def test_reports_are_made_listed_and_served(collector_url, tmp_path, capsys):
    url = collector_url
    out = tmp_path / "report.html"
    rc = main(
        [
            "report",
            "--since",
            "2h",
            "--collector",
            url,
            "--out",
            str(out),
            "--json-out",
            str(tmp_path / "s.json"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    rid = printed.split()[1].rstrip(":")
    listed = httpx.get(f"{url}/api/v1/reports", params={"kind": "manual"}).json()["reports"]
    assert [r["report_id"] for r in listed] == [rid]
    assert listed[0]["end_s"] - listed[0]["start_s"] == pytest.approx(7200, abs=1)
    page = httpx.get(f"{url}/api/v1/reports/{rid}")
    assert page.headers["content-type"].startswith("text/html") and out.read_text() == page.text
    assert "<h1>Efficiency report" in page.text and "<script src" not in page.text
    detail = httpx.get(f"{url}/api/v1/reports/{rid}", params={"format": "json"}).json()
    assert "body" not in detail and (detail["summary"] is not None or detail["error"])
    assert httpx.get(f"{url}/api/v1/reports/nope").status_code == 404
    assert httpx.get(f"{url}/api/v1/reports/{rid}", params={"format": "pdf"}).status_code == 400
    bad = httpx.post(f"{url}/api/v1/reports", json={"dataset": "no-such-scenario"})
    assert bad.status_code == 400 and "unknown data set" in bad.json()["error"]["message"]
    assert main(["report", "--collector", "http://127.0.0.1:9"]) == 2
    assert "cannot reach the collector" in capsys.readouterr().err
    # the run missed while the collector was down was caught up at start (and the schedule runs on)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        caught = httpx.get(f"{url}/api/v1/reports", params={"kind": "minutely"}).json()["reports"]
        if len(caught) >= 2:
            break
        time.sleep(0.3)
    assert len(caught) >= 2 and caught[0]["end_s"] - caught[0]["start_s"] == 60
    health = httpx.get(f"{url}/health").json()["reports"]
    assert health["schedules"] == {"minutely": "* * * * *"} and health["runs"] >= 1


def test_report_through_a_collector_with_a_token_says_how_to_pass_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    proc, url = start_collector(tmp_path / "t.duckdb", "--control-token", "tok-1", "--report-schedule", "off")
    try:
        assert main(["report", "--since", "1h", "--collector", url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "answered 401" in err
        assert "Pass the collector's control token with --token TOKEN or $PHASELENS_CONTROL_TOKEN" in err
        assert main(["report", "--since", "1h", "--collector", url, "--token", "tok-1"]) == 0
        assert capsys.readouterr().out.startswith("report ")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_collect_refuses_a_bad_schedule(tmp_path, capsys):
    assert main(["collect", "--db", str(tmp_path / "x.duckdb"), "--report-schedule", "h=* * *"]) == 2
    assert "--report-schedule" in capsys.readouterr().err


def test_report_on_a_store_file_covers_the_whole_scenario(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    assert (
        main(["simulate", "--no-progress", "--layout", "agg:1xh100-sxm", "--limit", "20", "--db", str(db)])
        == 0
    )
    capsys.readouterr()
    assert main(["report", "--dataset", "latest", "--db", str(db), "--out", str(tmp_path / "r.html")]) == 0
    assert "stored in" in capsys.readouterr().out
    with Store.open(db, read_only=True) as store:
        (row,) = store.query(
            "SELECT r.start_s, r.end_s, s.start_s, s.end_s FROM reports r, scenarios s"
        ).values
    assert row[0] == pytest.approx(row[2]) and row[1] == pytest.approx(row[3])  # the scenario's span
    page = (tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    # the whole scenario has no period before it: the headline says so instead of a trend
    assert "No trend against a previous period: the previous period would start before the scenario" in page
    assert main(["report", "--dataset", "nope", "--db", str(db)]) == 2
    assert "unknown data set" in capsys.readouterr().err
    # its title names the model and the layout it ran, and the window in UTC with its length
    with Store.open(db, read_only=True) as store:
        (title, model, start_s) = store.query(
            "SELECT r.title, s.model, s.start_s FROM reports r, scenarios s"
        ).values[0]
    assert model and f"{model} on agg:1xh100-sxm · simulated scenario " in title, title
    assert f"{datetime.fromtimestamp(start_s, UTC):%Y-%m-%d %H:%M:%S} – " in title
    assert title.endswith(" s)") and " UTC (" in title
    assert f"<b>model</b> {model} · <b>layout</b> <code>agg:1xh100-sxm" in page
    # the appendix: labels with their units, no field name
    appendix = page.split("Appendix: the detailed tables")[1].split('id="report-json"')[0]
    labels = set(re.findall(r"<th>([^<]*)</th>", appendix)) | set(re.findall(r"<h[3-6]>([^<]*)</h", appendix))
    assert {"TTFT p90 (s)", "Energy, prefill (J)", "Cost per 1M tokens ($)"} <= labels, sorted(labels)
    assert not [lb for lb in labels if "_" in lb or "j " in lb.lower() or lb.endswith(" j")]
    # no 1.2e-05, no rows of 0.0000 among the numbers (a simulated GPU's UUID, GPU-sim-<date>-<hex>-0,
    # holds "e-0" when its hex ends in e: the text is not searched for it)
    numbers = re.findall(r'<td class="num">([^<]*)</td>', appendix)
    assert numbers and not [n for n in numbers if re.search(r"\de[-+]?\d", n) or "0.0000" in n], numbers


def test_a_live_report_is_titled_by_the_stacks_layout(tmp_path):
    """The live title reads the bundled stack's layout from the workers' roles on their GPUs (the
    rows a collector stores from the stack's /v1/devices: 1 prefill and 1 decode worker)."""
    from phaselens.reports import build_report

    end_s = float(int(time.time()))
    start_s = end_s - 3600
    db = tmp_path / "live.duckdb"
    with Store.open(db) as store:
        devices, samples = [], []
        for i, role in enumerate(("prefill", "decode")):
            key = {"node": "n1", "source": "emulated", "device": "emulated:h200", "index": i}
            devices.append(key | {"since_s": start_s, "emulated": True, "worker": f"w{i}", "role": role,
                                  "name": "NVIDIA H200 (emulated)", "uuid": f"GPU-{i}"})  # fmt: skip
            samples += [key | {"ts_s": t, "emulated": True} for t in (start_s + 10, end_s - 5)]
        store.append("devices", devices)
        store.append("gpu_samples", samples)
        store.flush()
        with store.reader() as cur:
            report = build_report(cur, {"dataset": "live", "start_s": start_s, "end_s": end_s})
    day = datetime.fromtimestamp(start_s, UTC)
    assert report.title.startswith("Efficiency report · layout 1p1d:h200 · live stack · "), report.title
    assert report.title.endswith(" UTC (1 h)") and f"{day:%Y-%m-%d %H:%M} – " in report.title
    assert report.summary is not None and report.summary["scope"]["layout"] == "1p1d:h200"


def test_time_spans_read_in_the_unit_that_fits():
    from dashboard.report_html.text import duration_text, seconds_text

    assert seconds_text(9.063) == "9.06 s"  # not 9,063 ms
    assert seconds_text(0.42) == "420 ms" and seconds_text(0.0125) == "12.5 ms"
    assert seconds_text(150) == "2.5 min" and seconds_text(5400) == "90 min" and seconds_text(9000) == "2.5 h"
    assert seconds_text(None) == "—" and seconds_text(float("nan")) == "—"
    assert duration_text(3600) == "1 h" and duration_text(427) == "7 min" and duration_text(14) == "14 s"
    assert duration_text(5.5 * 3600) == "5.5 h"


def test_field_names_read_as_labels_with_units():
    from dashboard.report_html.appendix import number_text
    from dashboard.report_html.labels import field_label, field_unit

    assert field_label("energy_j_prefill") == "Energy, prefill (J)"
    assert field_label("ttft_p90_s") == "TTFT p90 (s)"
    assert field_label("frac_idle") == "Idle (%)" and field_unit("frac_idle").scale == 100
    assert field_label("e2e_ms") == "End-to-end (s)" and field_unit("e2e_ms").scale == 1e-3
    assert field_label("output_tokens_per_s") == "Output tokens per second"
    assert field_label("j_per_token") == "Energy per token (J)"
    assert field_label("energy_kwh") == "Energy (kWh)"
    assert field_label("NVIDIA H200") == "NVIDIA H200"  # an identifier used as a key stays as it is
    assert number_text(0.00001) == "< 0.001" and number_text(0.0) == "0" and number_text(9063.2) == "9,063"


def test_a_nested_cell_shows_its_numbers_as_people_read_them():
    import numpy as np

    from dashboard.report_html.appendix import _cell

    cell = _cell({"prefill": 1.2e-05, "decode": [0.00004, 2.5], "n": 3})
    assert "e-0" not in cell and "&lt; 0.001" in cell and "2.5" in cell and ": 3" in cell
    assert _cell(np.float32(1.2e-05)) == '<td class="num">&lt; 0.001</td>'  # not str(): 1.2e-05
    assert _cell(np.int64(12345)) == '<td class="num">12,345</td>'


def test_report_on_a_missing_store_file_is_refused_and_creates_nothing(tmp_path, capsys):
    from phaselens.cli import main

    db = tmp_path / "absent" / "x.duckdb"
    assert main(["report", "--since", "24h", "--db", str(db)]) == 2
    assert "no such store file" in capsys.readouterr().err
    assert not db.parent.exists()


def test_a_report_through_the_collector_of_a_live_stack_names_its_model_and_layout(tmp_path):
    """A real disaggregated stack (1 prefill, 1 decode worker on emulated H100s modelling llama-3.1-8b)
    polled by a real collector: the report's title names the model and the layout it reads."""
    from serving.testing import start_server, stop_server

    server = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    proc = None
    try:
        proc, url = start_collector(
            tmp_path / "l.duckdb", "--serving", server.url, "--report-schedule", "off"
        )
        deadline = time.monotonic() + 60
        while True:  # the workers' GPUs with their roles, sampled
            devices = httpx.get(f"{url}/api/v1/tables/devices").json()["rows"]
            if {d.get("role") for d in devices} >= {"prefill", "decode"}:
                break
            assert time.monotonic() < deadline, devices
            time.sleep(0.3)
        made = httpx.post(f"{url}/api/v1/reports", json={"since": "5m"}, timeout=60)
        assert made.status_code == 200, made.text
        title = made.json()["title"]
        assert title.startswith("Efficiency report · llama-3.1-8b on 1p1d:h100-sxm · live stack · "), title
        assert title.endswith(" UTC (5 min)")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        stop_server(server)
