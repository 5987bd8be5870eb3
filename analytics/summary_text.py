"""The summary as readable text: :func:`format_summary` renders the JSON form of a summary
(``Summary.to_dict()`` of analytics/summary.py, also what the collector's
``GET /api/v1/analytics/summary`` answers) as tables, so ``phaselens analyze`` prints the same
whether it ran the analysis itself or asked the service.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from analytics.intervals import GAP_MIN_S, GAP_PERIODS
from analytics.latency import attainment_basis
from analytics.text_tables import (
    DEFAULT_GPU_ROWS,
    GpuNames,
    cell_text,
    fmt_ms,
    fmt_p_value,
    fmt_pct,
    fmt_slo_ms,
    fmt_usd,
    gpu_keys_of,
    index_runs,
    left_out_lines,
    notable_first,
    render_lines,
    section_lines,
)
from analytics.throughput import throughput


def _phase_lines(parts: dict[str, Any]) -> list[str]:
    pools = (parts.get("phases") or {}).get("per_pool") or []
    rows = []
    for p in pools:
        mixed = (p.get("frac_mixed_prefill") or 0) + (p.get("frac_mixed_decode") or 0)
        rows.append(
            [
                str(p.get("role") or "—"),
                str(p.get("gpus", "—")),
                f"{(p.get('interval_s') or 0) / 3600:,.2f}",
                fmt_pct(p.get("frac_prefill")),
                fmt_pct(p.get("frac_decode")),
                fmt_pct(mixed),
                fmt_pct((p.get("frac_host") or 0) + (p.get("frac_gap") or 0)),
                fmt_pct(p.get("frac_idle")),
                fmt_pct(p.get("frac_unsampled")),
                f"{(p.get('energy_j') or 0) / 3.6e6:,.3g}",
            ]
        )
    return section_lines(
        "GPU time by phase (per pool)",
        [
            "pool",
            "GPUs",
            "GPU-h",
            "prefill",
            "decode",
            "mixed",
            "host-bound",
            "idle",
            "unsampled",
            "energy kWh",
        ],
        rows,
    )


def _gap_lines(parts: dict[str, Any], names: GpuNames, gpu_rows: int | None) -> list[str]:
    """The GPUs with gaps in their samples: unsampled time of at most ``gpu_rows`` of them (None:
    all) -- the most unsampled first -- in natural order, and overall, with the rule."""
    phases = parts.get("phases") or {}
    gaps = phases.get("sample_gaps") or {}
    if not gaps:
        return []
    shown = notable_first(list(gaps), lambda gpu: -(gaps[gpu].get("gap_s") or 0.0), gpu_rows)
    total_s = sum((g.get("interval_s") or 0.0) for g in phases.get("per_gpu") or [])
    unsampled_s = sum((g.get("gap_s") or 0.0) for g in gaps.values())
    rows = [
        [
            names.label(gpu),
            f"{gaps[gpu].get('gap_s') or 0.0:,.1f}",
            str(gaps[gpu].get("gaps", "—")),
            f"{gaps[gpu].get('longest_s') or 0.0:,.1f}",
            f"{gaps[gpu].get('threshold_s') or 0.0:,.1f}",
        ]
        for gpu in shown
    ]
    title = "Unsampled time (gaps in a GPU's samples: its own state, not idle)"
    out = section_lines(title, ["GPU", "unsampled s", "gaps", "longest s", "threshold s"], rows, titled=True)
    out += left_out_lines(len(shown), len(gaps), "the most unsampled time")
    out.append(
        f"  overall: {unsampled_s:,.1f} s of {total_s:,.1f} GPU-s unsampled ({fmt_pct(unsampled_s / total_s if total_s else None)});"
        f" a gap: samples further apart than {GAP_PERIODS:g} sampling periods and {GAP_MIN_S:g} s; its energy is"
        " the counter's rise across it"
    )
    return out


def _idle_lines(parts: dict[str, Any]) -> list[str]:
    pools = (parts.get("idle") or {}).get("per_pool") or []
    basis = (parts.get("idle") or {}).get("basis") or {}
    how = "; ".join(
        f"stranded {kind} = {basis[f'{kind}_label']}"
        for kind in ("compute", "bandwidth")
        if basis.get(f"{kind}_label")
    )
    rows = [
        [
            str(p.get("role") or "—"),
            fmt_pct(p.get("frac_productive_prefill")),
            fmt_pct(p.get("frac_stranded_bandwidth")),
            fmt_pct(p.get("frac_productive_decode")),
            fmt_pct(p.get("frac_stranded_compute")),
            fmt_pct(p.get("frac_host_bound")),
            fmt_pct(p.get("frac_idle")),
            fmt_pct(p.get("frac_unsampled")),
            cell_text(p.get("util_pct")),
            cell_text(p.get("sm_active_pct")),
        ]
        for p in pools
    ]
    return section_lines(
        "Where the GPU time goes (per pool; stranded = busy with the compute or bandwidth idle"
        + (f": {how})" if how else ")"),
        [
            "pool",
            "prefill",
            "stranded bw",
            "decode",
            "stranded compute",
            "host-bound",
            "idle",
            "unsampled",
            "util %",
            "SM active %",
        ],
        rows,
    )


def _roofline_lines(parts: dict[str, Any]) -> list[str]:
    """MFU and MBU per pool and phase with the activities beside them, then stranded compute and
    bandwidth per pool (analytics/roofline.py)."""
    part = parts.get("roofline") or {}
    rows = [
        [
            str(r.get("role") or "fleet") if r.get("scope") == "pool" else "fleet",
            str(r.get("phase")),
            cell_text(r.get("busy_s")),
            cell_text(r.get("achieved_tflops_s")),
            cell_text(r.get("achieved_tb_s")),
            fmt_pct(r.get("mfu")),
            fmt_pct(r.get("mbu")),
            cell_text(r.get("sm_active_pct")),
            cell_text(r.get("tensor_active_pct")),
            cell_text(r.get("dram_active_pct")),
            ", ".join(r.get("trust") or []),
        ]
        for r in part.get("table") or []
        if r.get("scope") in ("fleet", "pool")
    ]
    out = section_lines(
        "Against the roofline (work / busy time; MFU, MBU vs the GPU's dense peak; activity % per busy s)",
        ["pool", "phase", "busy s", "TFLOP/s", "TB/s", "MFU", "MBU", "SM %", "tensor %", "DRAM %", "trust"],
        rows,
    )
    stranded = [
        [
            str(s.get("role") or "fleet"),
            cell_text(s.get("stranded_compute_s")),
            cell_text(s.get("decode_s")),
            fmt_pct(s.get("mfu_decode")),
            cell_text(s.get("sm_active_decode_pct")),
            cell_text(s.get("tensor_active_decode_pct")),
            cell_text(s.get("stranded_bandwidth_s")),
            cell_text(s.get("prefill_s")),
            fmt_pct(s.get("mbu_prefill")),
            cell_text(s.get("dram_active_prefill_pct")),
        ]
        for s in part.get("stranded") or []
    ]
    return out + section_lines(
        "Stranded (GPU-s): compute = decode s × (1 − MFU), bandwidth = prefill s × (1 − MBU)",
        [
            "pool",
            "stranded compute",
            "decode s",
            "MFU",
            "SM % (decode)",
            "tensor % (decode)",
            "stranded bw",
            "prefill s",
            "MBU",
            "DRAM % (prefill)",
        ],
        stranded,
    )


def _bimodal_lines(parts: dict[str, Any], names: GpuNames, gpu_rows: int | None) -> list[str]:
    """The bimodality table: the pools, then at most ``gpu_rows`` GPUs (None: all) — those whose
    verdict differs from their pool's first, then the largest dip statistic — in natural order."""
    table = (parts.get("bimodal") or {}).get("table") or []
    pools = {r.get("role"): r for r in table if r.get("scope") == "pool"}
    per_gpu = {str(r["gpu"]): r for r in table if r.get("scope") == "gpu" and r.get("gpu")}

    def rank(gpu: str) -> tuple[bool, float]:
        r = per_gpu[gpu]
        same = r.get("bimodal") == (pools.get(r.get("role")) or {}).get("bimodal")
        dip = r.get("dip")
        return same, -dip if dip is not None and dip == dip else math.inf

    shown = notable_first(list(per_gpu), rank, gpu_rows)
    rows = [_bimodal_row(str(r.get("role") or "—"), r) for r in pools.values()]
    rows += [
        _bimodal_row(f"  GPU {names.label(g)} ({per_gpu[g].get('role') or '—'})", per_gpu[g]) for g in shown
    ]
    rule = (parts.get("bimodal") or {}).get("rule")
    if not rule:  # a summary without the part's rule (no bimodal part): the rule it would carry
        from analytics.bimodal_stats import BIMODAL_RULE as rule
    out = section_lines(
        f"SM activity: bimodal? ({rule}; modes: peaks of the histogram and their share of the time)",
        [
            "pool / GPU",
            "intervals",
            "SM % prefill",
            "SM % decode",
            "util %",
            "dip",
            "p",
            "Sarle b (evidence)",
            "bimodal",
            "modes",
        ],
        rows,
    )
    return out + left_out_lines(
        len(shown), len(per_gpu), "the GPUs whose verdict differs from their pool's, then the largest dip"
    )


def _bimodal_row(where: str, r: dict[str, Any]) -> list[str]:
    """One row of the bimodality table: a pool's or a GPU's figures, verdict and modes."""
    modes = (
        "constant / no spread: bimodality not defined"
        if r.get("no_spread")
        else "—"
        if r.get("mode_low_pct") is None
        else f"one: {r['mode_low_pct']:,.1f} %"
        if r.get("mode_high_pct") is None
        else f"{r['mode_low_pct']:,.1f} % ({fmt_pct(r.get('weight_low'))}) / "
        f"{r['mode_high_pct']:,.1f} % ({fmt_pct(r.get('weight_high'))})"
    )
    return [
        where,
        f"{r.get('n', 0):,}",
        cell_text(r.get("sm_prefill_pct")),
        cell_text(r.get("sm_decode_pct")),
        cell_text(r.get("util_pct")),
        cell_text(r.get("dip")),
        fmt_p_value(r.get("dip_p_value")),
        cell_text(r.get("sarle")),
        "—" if r.get("bimodal") is None else "yes" if r.get("bimodal") else "no",
        modes,
    ]


def _cost_lines(parts: dict[str, Any]) -> list[str]:
    t = (parts.get("cost") or {}).get("total") or {}
    if not t:
        return []
    labels = ", ".join(((parts.get("cost") or {}).get("trust") or {}).get("labels") or []) or "no data"
    out = ["", f"Cost per token (GPU-hours at list price + energy × electricity × PUE; {labels})"]
    requests = t.get("requests")
    out.append(
        f"  all in (compare layouts and periods by these): {fmt_usd(t.get('usd_per_1m_tokens'))} per 1M tokens"
        f" (input + output), {fmt_usd(t.get('usd_per_request'))} per request"
        f" ({'—' if requests is None or requests != requests else f'{requests:,.0f}'} finished)"
    )
    out.append(
        f"  industry figure (GPU $/h ÷ output tokens/s): {fmt_usd(t.get('industry_usd_per_1m_output'))} per 1M output tokens"
        f" at {cell_text(t.get('output_tokens_per_s_per_gpu'))} output tokens/s per GPU"
    )
    out.append(
        f"  blended 3:1 (input:output, as Artificial Analysis compares API prices; follows the split by side):"
        f" {fmt_usd(t.get('blended_usd_per_1m_tokens'))} per 1M tokens"
    )
    out.append("  by side (a pool's idle time is on one side, so these depend on the layout):")
    out.append(
        f"  $/1M input tokens  {fmt_usd(t.get('usd_per_1m_input'))}  = prefill {fmt_usd(t.get('usd_per_1m_input_prefill'))}"
        f" + stranded {fmt_usd(t.get('usd_per_1m_input_stranded'))} + host-bound {fmt_usd(t.get('usd_per_1m_input_host_bound'))}"
        f" + idle {fmt_usd(t.get('usd_per_1m_input_idle'))}{_unsampled_usd(t, 'input')}"
    )
    out.append(
        f"  $/1M output tokens {fmt_usd(t.get('usd_per_1m_output'))}  = decode {fmt_usd(t.get('usd_per_1m_output_decode'))}"
        f" + stranded {fmt_usd(t.get('usd_per_1m_output_stranded'))} + host-bound {fmt_usd(t.get('usd_per_1m_output_host_bound'))}"
        f" + idle {fmt_usd(t.get('usd_per_1m_output_idle'))}{_unsampled_usd(t, 'output')}"
    )
    out.append(
        f"  energy: {cell_text(t.get('j_per_input_token'))} J per input token, {cell_text(t.get('j_per_output_token'))} J per output"
        f" token ({cell_text(t.get('output_tokens_per_j'))} output tokens/J); window cost {fmt_usd(t.get('cost_usd'))} for"
        f" {cell_text(t.get('gpu_hours'))} GPU-h"
    )
    annual = parts.get("annual") or {}
    if annual.get("sentence"):
        out.append(f"  {annual['sentence']}")
    elif annual:
        out.append(
            f"  annualised for {annual.get('fleet_gpus')} GPUs: {fmt_usd(annual.get('total_usd_per_year'))} a year"
        )
    return out


def _unsampled_usd(total: dict[str, Any], side: str) -> str:
    """`` + other busy $x + unsampled (no samples) $y`` for the categories with GPU time in the
    window (an external fleet's unexplained busy time; gaps in samples), else nothing."""
    return "".join(
        f" + {name} {fmt_usd(total.get(f'usd_per_1m_{side}_{c}'))}"
        for c, name in (("other_busy", "other busy"), ("unsampled", "unsampled (no samples)"))
        if (total.get(f"{c}_s") or 0) > 0
    )


def _external_lines(parts: dict[str, Any]) -> list[str]:
    """The estimated phase split of the GPUs without phaselens telemetry, per pool, and the engines
    whose counters gave their tokens."""
    ext = parts.get("external") or {}
    labels = ", ".join((ext.get("trust") or {}).get("labels") or []) or "estimated"
    rows = [
        [
            str(p.get("pool") or "—"),
            str(p.get("gpus", "—")),
            f"{(p.get('span_s') or 0) / 3600:,.3f}",
            *(fmt_pct(p.get(f"{s}_share")) for s in ("prefill", "decode", "other_busy", "idle")),
            f"{(p.get('energy_j') or 0) / 3.6e6:,.3g}",
            str(p.get("method") or "—"),
        ]
        for p in ext.get("per_pool") or []
    ]
    head = ["pool", "GPUs", "GPU-h", "prefill", "decode", "other busy", "idle", "energy kWh", "method"]
    title = f"GPU time by phase, GPUs without phaselens telemetry ({labels}: dcgm-exporter + engine metrics)"
    out = section_lines(title, head, rows)
    engines = [
        [
            str(e.get("endpoint")),
            str(e.get("engine") or "—"),
            str(e.get("model") or "—"),
            str(e.get("role") or "—"),
            cell_text(e.get("served_input_tokens")),
            cell_text(e.get("served_output_tokens")),
            cell_text(e.get("served_requests")),
            cell_text(e.get("fit_r2")),
        ]
        for e in ext.get("engines") or []
    ]
    head = ["engine", "kind", "model", "role", "input tokens", "output tokens", "requests", "fit R²"]
    return out + section_lines("Engines (their counters over the window)", head, engines)


def _throughput_lines(summary: dict[str, Any]) -> list[str]:
    """The headline output tokens/s (the window average) and, named as what it is, the rate while
    serving: :func:`analytics.throughput.throughput`, as the Overview shows them."""
    t = throughput(summary)
    if t.get("output_tokens_per_s") is None:
        return ["", f"{t['label']}: {t.get('no_data') or 'no data'}"]
    out = ["", f"{t['label']}: {_rate(t['output_tokens_per_s'])} ({t['basis']})"]
    if t.get("output_tokens_per_s_busy") is not None:
        out.append(f"  {t['busy_label']}: {_rate(t['output_tokens_per_s_busy'])} ({t['busy_basis']})")
    return out


def _rate(x: float) -> str:
    """Tokens/s as the Overview tile writes them: ``1,234`` from 100, else ``67.0``."""
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _latency_lines(parts: dict[str, Any]) -> list[str]:
    lat = parts.get("latency") or {}
    pct = lat.get("percentiles") or {}
    rows = []
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "end-to-end")):
        p = pct.get(key)
        if not p:
            continue
        how = p.get("method") or ""
        rows.append(
            [
                label,
                f"{p.get('n', 0):,}",
                fmt_ms(p.get("p50_s")),
                fmt_ms(p.get("p90_s")),
                fmt_ms(p.get("p99_s")),
                how,
            ]
        )
    out = section_lines("Latency (ms)", ["", "n", "p50", "p90", "p99", "method"], rows)
    att = lat.get("attainment") or {}
    slo = lat.get("slo") or {}
    if att:
        out.append(
            f"  SLO attainment (TTFT ≤ {fmt_slo_ms(slo.get('ttft_s'))} ms and TPOT ≤ {fmt_slo_ms(slo.get('tpot_s'))} ms):"
            f" {fmt_pct(att.get('both'))} ({attainment_basis(lat)})"
        )
    return out


def _fit_lines(parts: dict[str, Any], names: GpuNames, gpu_rows: int | None) -> list[str]:
    """The power model: at most ``gpu_rows`` GPUs' fits (None: all) — the lowest R² first, an
    undefined R² before any — in natural order; then each note once, with the GPUs it applies to."""
    fits = (parts.get("phases") or {}).get("fits") or {}

    def rank(gpu: str) -> tuple[bool, float]:
        r2 = fits[gpu].get("r2")
        return r2 is not None and r2 == r2, r2 if r2 is not None and r2 == r2 else 0.0

    shown = notable_first(list(fits), rank, gpu_rows)
    rows = [
        [names.label(gpu)]
        + [
            cell_text((fits[gpu].get("coef_w") or {}).get(k))
            for k in ("prefill", "decode", "host_bound", "idle")
        ]
        + [cell_text(fits[gpu].get("r2"))]
        for gpu in shown
    ]
    title = "Power model per GPU (W while in each state; apportions each interval's measured energy)"
    out = section_lines(
        title, ["GPU", "prefill W", "decode W", "host-bound W", "idle W", "R²"], rows, titled=bool(fits)
    )
    out += left_out_lines(len(shown), len(fits), "the lowest R²")
    bounds = {
        gpu: f"[0, {f['bound_w']:,.0f} W] ({f.get('bound_source')})"
        if f.get("bound_w") is not None
        else "none"
        for gpu, f in fits.items()
    }
    if len(set(bounds.values())) == 1 and bounds:
        out.append(f"  bound on each state's power: {next(iter(bounds.values()))}")
    gpus_of: dict[str, list[str]] = {}  # each note, in the order first met, and the GPUs it is of
    for gpu in names.order(fits):
        notes = [
            n for n in fits[gpu].get("notes") or [] if " time in the window: its power is not fitted" not in n
        ]
        if len(set(bounds.values())) > 1:
            notes.insert(0, f"bound on each state's power: {bounds[gpu]}")
        for note in notes:
            gpus_of.setdefault(note, []).append(gpu)
    return out + [f"  {names.listing(gpus)}: {note}" for note, gpus in gpus_of.items()]


_HOUR = re.compile(r"hour from (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)")
_GPU_SLOT, _HOUR_SLOT = "\0gpus\0", "\0hours\0"  # where a grouped message's GPUs or hours go


def _key_runs(keys: list[str]) -> str:
    """Keys of ``missing`` compacted per part: ``bimodal.7–22``, ``phases.0, idle.0``."""
    numbered: dict[str, list[int]] = {}
    named: list[str] = []
    for key in keys:
        part, _, n = key.rpartition(".")
        if part and n.isdigit():
            numbered.setdefault(part, []).append(int(n))
        else:
            named.append(key)
    return ", ".join([f"{part}.{index_runs(sorted(ns), most=3)}" for part, ns in numbered.items()] + named)


def _missing_lines(missing: dict[str, str], names: GpuNames) -> list[str]:
    """What is missing, one line per message; messages that differ only by the one GPU (or hour)
    they name are one line, with the count and a compact list of the GPUs (or the first and last
    hour), under their keys (``bimodal.7–22``) to find them in ``--json``."""
    gpu = names.pattern
    groups: dict[str, tuple[list[str], list[str]]] = {}  # message with a slot for what varies -> keys, values
    for key, text in missing.items():
        found = gpu.findall(text) if gpu else []
        hours = _HOUR.findall(text)
        if len(found) == 1:
            template, value = gpu.sub(_GPU_SLOT, text), found[0]
        elif len(hours) == 1:
            template, value = _HOUR.sub(_HOUR_SLOT, text), hours[0]
        elif found:  # several GPUs named: each by its label
            template, value = names.relabel(text), ""
        else:
            template, value = text, ""
        keys, values = groups.setdefault(template, ([], []))
        keys.append(key)
        values.append(value)
    return [f"  {_key_runs(keys)}: {_filled(t, values, names)}" for t, (keys, values) in groups.items()]


def _filled(template: str, values: list[str], names: GpuNames) -> str:
    """A grouped message with its GPUs (``GPUs 48–63 (16)``) or its hours (``hours from
    2026-11-30 00:00:00 UTC to 05:00:00 UTC (6)``) in its slot."""
    if _GPU_SLOT in template:
        return template.replace(_GPU_SLOT, names.listing(values))
    if _HOUR_SLOT in template:
        first, last, n = min(values), max(values), len(set(values))
        last = last[11:] if last[:10] == first[:10] else last  # the date once
        return template.replace(
            _HOUR_SLOT, f"hour from {first}" if n == 1 else f"hours from {first} to {last} ({n})"
        )
    return template


def format_summary(
    summary: dict[str, Any], *, detail: bool = False, gpu_rows: int | None = DEFAULT_GPU_ROWS
) -> str:
    """The summary's JSON form as readable tables: the window and its trust labels, GPU time by
    phase, where it goes, bimodality, cost per token, latency, the power fits, what is missing.

    GPUs are in natural order (node, then index) and labelled by index alone where the window holds
    one node, else ``node/index``. The unsampled-time, bimodality and power-model tables show at most ``gpu_rows``
    GPUs (None: all; 0: the pools only), the notable ones, and say how many they leave out; notes and
    missing messages that differ only by GPU (or hour) are one line each. ``detail`` appends every
    table of every part (the same as ``--json``, as text)."""
    w = summary["window"]
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(w["start_s"]))
    end = time.strftime("%H:%M:%S", time.gmtime(w["end_s"]))
    trust = summary.get("trust", {})
    parts = summary.get("parts", {})
    names = GpuNames(gpu_keys_of(parts))
    lines = [
        f"phaselens analysis — data set {w['dataset']}, {start} – {end} UTC ({w['duration_s']:,.0f} s)",
        f"trust: {', '.join(trust.get('labels', [])) or 'no data'}",
    ]
    if (summary.get("missing") or {}).get("window"):  # why the window is empty, before any table
        lines.append(f"  ! {summary['missing']['window']}")
    lines += [f"  note: {names.relabel(n)}" for n in trust.get("notes", [])]
    lines += _phase_lines(parts)
    lines += _gap_lines(parts, names, gpu_rows)
    lines += _idle_lines(parts)
    lines += _roofline_lines(parts)
    lines += _bimodal_lines(parts, names, gpu_rows)
    lines += _external_lines(parts)
    lines += _cost_lines(parts)
    lines += _throughput_lines(summary)
    lines += _latency_lines(parts)
    lines += _fit_lines(parts, names, gpu_rows)
    if summary.get("missing"):
        lines += ["", "Missing or not computed:", *_missing_lines(summary["missing"], names)]
    if detail:
        for name, part in parts.items():
            lines += ["", f"== {name} (detail) ==", *render_lines(part)]
    return "\n".join(lines)
