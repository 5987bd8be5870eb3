"""The Grafana dashboard of ``GET /metrics`` (docs/grafana/phaselens.json) and the example Prometheus
alert rule (docs/grafana/phaselens-alerts.yml), built with grafanalib's typed panels from the series
phaselens/metrics_counters.py exports and coloured with the dashboard's own palette
(dashboard/figures/style.py: the same colour per GPU-time category, pool and trust label as on every
page and in the reports).

Regenerate both files after changing this module, the palette or the series::

    python -m phaselens.grafana_dashboard            # writes them
    python -m phaselens.grafana_dashboard --check    # exit 1 when the committed files differ

tests/phaselens/test_grafana_dashboard.py checks that the committed files are the generated ones, and
tests/phaselens/test_metrics_export.py runs every query (panels, variables, annotations, the alert)
against a real Prometheus scraping real collectors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboard.figures.style import COST_COLOURS, COST_LABELS, PHASE_COLOURS, TRUST_COLOURS
from phaselens.metrics_counters import CATEGORY_LABEL, UNASSIGNED_POOL

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD_PATH = ROOT / "docs" / "grafana" / "phaselens.json"
ALERTS_PATH = ROOT / "docs" / "grafana" / "phaselens-alerts.yml"
UID = "phaselens-overview"
DS = {"type": "prometheus", "uid": "${datasource}"}
#: the example alert: stranded GPU-time (compute idle in decode, bandwidth idle in prefill) costs more than this
STRANDED_USD_PER_H_ALERT = 50.0
ALERT_FOR = "15m"
RATE = "$__rate_interval"
#: every per-GPU series is filtered by the dashboard's variables
SEL = 'Hostname=~"$node", pool=~"$pool", UUID=~"$gpu", model=~"$model"'
#: the ``category`` label → its colour and name on the pages (dashboard/figures/style.py)
CATEGORY_COLOURS = {label: COST_COLOURS[cat] for cat, label in CATEGORY_LABEL.items()}
CATEGORY_NAMES = {label: COST_LABELS[cat] for cat, label in CATEGORY_LABEL.items()}
POOL_COLOURS = {
    "prefill": PHASE_COLOURS["prefill"],
    "decode": PHASE_COLOURS["decode"],
    "mixed": PHASE_COLOURS["mixed"],
    UNASSIGNED_POOL: COST_COLOURS["idle"],
}
STRANDED = 'category=~"stranded_compute|stranded_bandwidth"'
OUTPUT = 'side="output"'
STRANDED_COMPUTE = 'category="stranded_compute"'


def _sel(extra: str = "") -> str:
    return "{" + (f"{extra}, " if extra else "") + SEL + "}"


def stranded_usd_per_hour(selector: str = "", rng: str = RATE) -> str:
    """PromQL: what stranded GPU-time costs an hour, USD, over ``rng`` (the alert's and the stat's)."""
    inner = f"{STRANDED}, {selector}" if selector else STRANDED
    return f"3600 * sum(rate(phaselens_gpu_cost_dollars_total{{{inner}}}[{rng}]))"


def _t(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> g.Target:
    return g.Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DS)


def _colour_overrides(colours: dict[str, str], names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A fixed colour (and the pages' name) per series name: the legend must be exactly the key."""
    out = []
    for key, colour in colours.items():
        props: list[dict[str, Any]] = [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]
        if names and key in names:
            props.append({"id": "displayName", "value": names[key]})
        out.append({"matcher": {"id": "byName", "options": key}, "properties": props})
    return out


def _trust_column() -> dict[str, Any]:
    """The trust table's ``trust`` column: each label in the badge colour the pages give it."""
    options = {
        label: {"color": hex_colour, "index": i, "text": label}
        for i, (label, (_name, hex_colour)) in enumerate(TRUST_COLOURS.items())
    }
    return {
        "matcher": {"id": "byName", "options": "trust"},
        "properties": [
            {"id": "mappings", "value": [{"type": "value", "options": options}]},
            {"id": "custom.cellOptions", "value": {"type": "color-text"}},
        ],
    }


def _stat(title: str, desc: str, expr: str, unit: str, x: int, y: int, **kw: Any) -> g.Stat:
    return g.Stat(
        title=title,
        description=desc,
        dataSource=DS,
        targets=[_t(expr, kw.pop("legend", title))],
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        textMode="value",
        gridPos=g.GridPos(h=4, w=4, x=x, y=y),
        thresholds=kw.pop("thresholds", [g.Threshold("text", 0, 0.0)]),
        **kw,
    )


def _series(
    title: str,
    desc: str,
    targets: list[g.Target],
    unit: str,
    x: int,
    y: int,
    *,
    w: int = 12,
    stacked: bool = False,
    colours: dict[str, str] | None = None,
    names: dict[str, str] | None = None,
    **kw: Any,
) -> g.TimeSeries:
    return g.TimeSeries(
        title=title,
        description=desc,
        dataSource=DS,
        targets=targets,
        unit=unit,
        gridPos=g.GridPos(h=8, w=w, x=x, y=y),
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none"},
        fillOpacity=70 if stacked else 10,
        lineWidth=1 if stacked else 2,
        legendDisplayMode="list",
        legendPlacement="bottom",
        tooltipMode="multi",
        overrides=_colour_overrides(colours, names) if colours else [],
        **kw,
    )


def _variable(name: str, label: str, query: str) -> g.Template:
    return g.Template(
        name=name,
        label=label,
        query=query,
        dataSource=DS,
        includeAll=True,
        multi=True,
        allValue=".*",
        default="$__all",
        refresh=2,  # on time range change: GPUs come and go
        sort=1,
    )


def panels() -> list[g.Panel]:
    """The dashboard's rows and panels, top to bottom."""
    r = RATE
    cost = f"phaselens_gpu_cost_dollars_total{_sel()}"
    out: list[g.Panel] = [
        g.RowPanel(title="Fleet (the selected GPUs)", gridPos=g.GridPos(h=1, w=24, x=0, y=0))
    ]
    out += [
        _stat(
            "Output tokens/s",
            "Output tokens generated per second (rate of phaselens_tokens_total{side=output}).",
            f"sum(rate(phaselens_tokens_total{_sel(OUTPUT)}[{r}]))",
            "short",
            0,
            1,
        ),
        _stat(
            "$ per 1M tokens (all in)",
            "All cost (GPU-hours at list price + energy) per 1M input + output tokens.",
            f"1e6 * sum(rate({cost}[{r}])) / sum(rate(phaselens_tokens_total{_sel()}[{r}]))",
            "currencyUSD",
            4,
            1,
        ),
        _stat(
            "Stranded $ per hour",
            "What stranded GPU-time (decode with the compute idle, prefill with the bandwidth idle) costs "
            f"an hour. Red above ${STRANDED_USD_PER_H_ALERT:g}/h, the example alert's threshold "
            "(docs/grafana/phaselens-alerts.yml).",
            stranded_usd_per_hour(SEL, r),
            "currencyUSD",
            8,
            1,
            thresholds=[
                g.Threshold("green", 0, 0.0),
                g.Threshold("red", 1, STRANDED_USD_PER_H_ALERT),
            ],
            colorMode="value",
        ),
        _stat(
            "J per token",
            "Energy per input + output token, J.",
            f"sum(rate(phaselens_gpu_energy_joules_total{_sel()}[{r}])) "
            f"/ sum(rate(phaselens_tokens_total{_sel()}[{r}]))",
            "J",
            12,
            1,
        ),
        _stat(
            "SLO attainment",
            "Share of requests meeting both the TTFT and the TPOT SLO (all GPUs of the collectors: "
            "requests carry no GPU labels).",
            'sum(rate(phaselens_requests_slo_met_total{slo="both"}[' + r + "])) "
            "/ sum(rate(phaselens_requests_total[" + r + "]))",
            "percentunit",
            16,
            1,
        ),
        _stat(
            "Counting behind by",
            "How far the furthest-behind collector's counters are behind now: the settle lag (30 s), more "
            "while a collector catches up or while its counting steps fail (phaselens_derived_up 0).",
            "time() - min(phaselens_counters_end_timestamp_seconds)",
            "s",
            20,
            1,
        ),
    ]
    out.append(
        g.RowPanel(title="Where the GPU-time and the money go", gridPos=g.GridPos(h=1, w=24, x=0, y=5))
    )
    out += [
        _series(
            "GPU-time by category",
            "GPUs' worth of time in each GPU-time category (GPU-seconds per second); the stack is the "
            "number of GPUs observed.",
            [_t(f"sum by (category) (rate(phaselens_gpu_seconds_total{_sel()}[{r}]))", "{{category}}")],
            "short",
            0,
            6,
            stacked=True,
            colours=CATEGORY_COLOURS,
            names=CATEGORY_NAMES,
        ),
        _series(
            "Cost by category, $ per hour",
            "All-in cost per hour in each GPU-time category; the stranded shades are the waste.",
            [_t(f"3600 * sum by (category) (rate({cost}[{r}]))", "{{category}}")],
            "currencyUSD",
            12,
            6,
            stacked=True,
            colours=CATEGORY_COLOURS,
            names=CATEGORY_NAMES,
        ),
        _series(
            "Power by category",
            "Energy per second in each GPU-time category, W (the power model apportions the measured energy).",
            [_t(f"sum by (category) (rate(phaselens_gpu_energy_joules_total{_sel()}[{r}]))", "{{category}}")],
            "watt",
            0,
            14,
            stacked=True,
            colours=CATEGORY_COLOURS,
            names=CATEGORY_NAMES,
        ),
        _series(
            "Stranded share per pool",
            "Share of each pool's GPU-time that is stranded (busy with compute or bandwidth idle).",
            [
                _t(
                    f"sum by (pool) (rate(phaselens_gpu_seconds_total{_sel(STRANDED)}[{r}])) "
                    f"/ sum by (pool) (rate(phaselens_gpu_seconds_total{_sel()}[{r}]))",
                    "{{pool}}",
                )
            ],
            "percentunit",
            12,
            14,
            colours=POOL_COLOURS,
        ),
        _series(
            "Stranded compute share per GPU",
            "Share of each GPU's time busy in decode with the compute idle (the decode-bound signal).",
            [
                _t(
                    "sum by (Hostname, gpu, UUID) (rate(phaselens_gpu_seconds_total"
                    f"{_sel(STRANDED_COMPUTE)}[{r}])) "
                    f"/ sum by (Hostname, gpu, UUID) (rate(phaselens_gpu_seconds_total{_sel()}[{r}]))",
                    "{{Hostname}} GPU {{gpu}}",
                )
            ],
            "percentunit",
            0,
            22,
        ),
        _series(
            "$ per 1M tokens per pool",
            "All cost of each pool per 1M tokens it served (input + output).",
            [
                _t(
                    f"1e6 * sum by (pool) (rate({cost}[{r}])) "
                    f"/ sum by (pool) (rate(phaselens_tokens_total{_sel()}[{r}]))",
                    "{{pool}}",
                )
            ],
            "currencyUSD",
            12,
            22,
            colours=POOL_COLOURS,
        ),
        _series(
            "Tokens/s per pool",
            "Input tokens prefilled and output tokens generated per second, per pool.",
            [_t(f"sum by (pool, side) (rate(phaselens_tokens_total{_sel()}[{r}]))", "{{pool}} {{side}}")],
            "short",
            0,
            30,
        ),
        g.Table(
            title="Trust of the figures",
            description="The trust labels (analytics/trust.py) the counted figures carry: measured, "
            "emulated, simulated, host-bound, estimated. A model's output is never labelled measured.",
            dataSource=DS,
            targets=[_t("max by (part, trust) (phaselens_trust) == 1", "{{part}}: {{trust}}", instant=True)],
            gridPos=g.GridPos(h=8, w=12, x=12, y=30),
            transformations=[{"id": "labelsToFields", "options": {"mode": "columns"}}],
            overrides=[_trust_column()],
        ),
    ]
    out.append(
        g.RowPanel(
            title="Control actions and the collectors' health", gridPos=g.GridPos(h=1, w=24, x=0, y=38)
        )
    )
    out += [
        _series(
            "Control actions",
            "Actions recorded in the actions table (apply, rollback, ...) and the serving stack's control "
            "events, per interval; also drawn as annotations on every panel.",
            [
                _t(
                    f"sum by (action, status) (increase(phaselens_control_actions_total[{r}]))",
                    "{{action}} ({{status}})",
                ),
                _t(
                    f"sum by (action) (increase(phaselens_control_events_total[{r}]))",
                    "event {{action}}",
                    "B",
                ),
            ],
            "short",
            0,
            39,
            drawStyle="bars",
        ),
        _series(
            "Rows ingested per table",
            "Rows the collectors write to their stores per second.",
            [_t(f"sum by (table) (rate(phaselens_ingest_rows_total[{r}]))", "{{table}}")],
            "short",
            12,
            39,
        ),
        _series(
            "Sources up",
            "1 when a collector's source polled ok.",
            [_t("phaselens_source_up", "{{instance}} {{source}}")],
            "short",
            0,
            47,
        ),
        _series(
            "Drops and errors (last hour)",
            "Results dropped, store errors, rows dropped, telemetry gaps: all should stay 0.",
            [
                _t("sum(increase(phaselens_ingest_results_dropped_total[1h]))", "results dropped"),
                _t("sum(increase(phaselens_store_errors_total[1h]))", "store errors", "B"),
                _t("sum(increase(phaselens_store_rows_dropped_total[1h]))", "rows dropped", "C"),
                _t(
                    'sum(increase(phaselens_derived_computations_total{result="error"}[1h]))',
                    "counting errors",
                    "D",
                ),
            ],
            "short",
            12,
            47,
        ),
    ]
    return out


def annotations() -> list[dict[str, Any]]:
    """Control actions and control events as annotations (Prometheus queries: a point where a
    counter rose)."""
    return [
        {
            "name": "Control actions",
            "datasource": DS,
            "enable": True,
            "iconColor": TRUST_COLOURS["estimated"][1],
            "expr": "sum by (action, status, dry_run) (increase(phaselens_control_actions_total[2m])) > 0",
            "step": "1m",
            "titleFormat": "{{action}}",
            "textFormat": "{{status}} (dry run: {{dry_run}})",
            "tagKeys": "action,status",
            "useValueForTime": False,
        },
        {
            "name": "Serving control events",
            "datasource": DS,
            "enable": True,
            "iconColor": PHASE_COLOURS["mixed"],
            "expr": "sum by (action) (increase(phaselens_control_events_total[2m])) > 0",
            "step": "1m",
            "titleFormat": "{{action}}",
            "textFormat": "control event",
            "tagKeys": "action",
            "useValueForTime": False,
        },
    ]


def variables() -> list[g.Template]:
    """datasource, then node, pool, GPU and model (each narrowed by the ones before it)."""
    base = "phaselens_gpu_seconds_total"
    return [
        g.Template(name="datasource", label="Prometheus", query="prometheus", type="datasource"),
        _variable("node", "node", f"label_values({base}, Hostname)"),
        _variable("pool", "pool", f'label_values({base}{{Hostname=~"$node"}}, pool)'),
        _variable("gpu", "GPU", f'label_values({base}{{Hostname=~"$node", pool=~"$pool"}}, UUID)'),
        _variable("model", "model", f"label_values({base}, model)"),
    ]


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    dash = g.Dashboard(
        title="phaselens — GPU efficiency of LLM serving",
        uid=UID,
        description="Counters of the phaselens collectors' GET /metrics (docs/PROMETHEUS.md), summed over "
        "the selected collectors, nodes, pools, GPUs and models. Built by phaselens/grafana_dashboard.py.",
        tags=["phaselens", "llm", "gpu"],
        timezone="utc",
        refresh="30s",
        time=g.Time("now-1h", "now"),
        templating=g.Templating(list=variables()),
        annotations=g.Annotations(list=annotations()),
        panels=panels(),
    ).auto_panel_ids()
    return json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))


def alert_rules() -> str:
    """The example Prometheus rule file: stranded $ per hour over :data:`STRANDED_USD_PER_H_ALERT`."""
    expr = stranded_usd_per_hour(rng="15m")
    return f"""# Generated by phaselens/grafana_dashboard.py (python -m phaselens.grafana_dashboard); checked by
# promtool check rules in tests/phaselens/test_metrics_export.py. Load it with rule_files: in prometheus.yml.
groups:
  - name: phaselens
    rules:
      - alert: PhaselensStrandedDollarsPerHourHigh
        expr: {expr} > {STRANDED_USD_PER_H_ALERT:g}
        for: {ALERT_FOR}
        labels:
          severity: warning
        annotations:
          summary: Stranded GPU-time costs {{{{ $value | printf "%.0f" }}}} $/h (threshold {STRANDED_USD_PER_H_ALERT:g} $/h)
          description: >-
            GPUs are busy with their compute idle (decode) or their memory bandwidth idle (prefill).
            The phaselens Recommendations page and `phaselens recommend` say which layout would use them.
"""


def render_files() -> dict[Path, str]:
    """The generated files and their text."""
    return {
        DASHBOARD_PATH: json.dumps(build(), indent=2, sort_keys=True) + "\n",
        ALERTS_PATH: alert_rules(),
    }


def main(argv: list[str] | None = None) -> int:
    """Write the dashboard and the rule file, or (``--check``) say whether the committed ones differ."""
    p = argparse.ArgumentParser(
        prog="python -m phaselens.grafana_dashboard", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--check", action="store_true", help="exit 1 when a committed file is not the generated one"
    )
    args = p.parse_args(argv)
    stale = []
    for path, text in render_files().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        names = ", ".join(str(s.relative_to(ROOT)) for s in stale)
        print(f"{names}: not the generated file; run python -m phaselens.grafana_dashboard", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
