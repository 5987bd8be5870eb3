"""One summary of a window: phases, idle time, bimodality, cost and latency, with trust labels.

:func:`summarize` runs every analysis on one window and gathers their results; a part that cannot
be computed (no samples, no requests, an analysis that failed on this data) is left out and named in
``missing`` with the reason — the rest of the summary stands. :func:`format_summary` renders the
JSON form (``Summary.to_dict()``, also what the collector's ``GET /api/v1/analytics/summary``
answers) as readable tables, so ``phaselens analyze`` prints the same whether it ran the analysis
itself or asked the service.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from analytics.intervals import GAP_MIN_S, GAP_PERIODS, span_order
from analytics.jsonable import json_safe
from analytics.latency import attainment_basis
from analytics.throughput import throughput
from analytics.trust import Trust
from analytics.window import Window


@dataclass(slots=True)
class Summary:
    """The parts of one window's analysis (each a JSON-able dict), what is missing, and the trust
    labels of the whole. ``seconds``: each part's own run time."""

    window: Window
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    trust: Trust = field(default_factory=Trust)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return json_safe(
            {
                "window": self.window.describe(),
                "trust": self.trust.to_dict(),
                "parts": self.parts,
                "missing": self.missing,
                "seconds": self.seconds,
            }
        )


_PART_ERRORS = (ValueError, duckdb.Error, ZeroDivisionError, KeyError)


def _as_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return result.to_dict()
    if isinstance(result, dict):
        return result
    raise TypeError(f"an analysis returned {type(result).__name__}, not a dict or an object with to_dict()")


def summarize(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    prices: Any = None,
    slo: Any = None,
    fleet_gpus: int | None = None,
    skip: frozenset[str] = frozenset(),
) -> Summary:
    """Run every analysis of the summary on ``window`` (but those named in ``skip``, e.g.
    ``{"bimodal"}``, which the overview does not read); a part that fails is named in ``missing``.

    The GPU-interval table is built once (a TEMP table on ``con``) and shared by the phase
    breakdown and the bimodality; idle split and cost reuse the phase breakdown; one grouped scan
    of the window's iterations (:func:`analytics.iteration_groups.iteration_groups`) serves the
    phase breakdown, the token counts and the latency part. GPUs with samples but no phaselens
    telemetry (dcgm-exporter under vLLM / SGLang / Dynamo) get the ``external`` part
    (:func:`analytics.external.external_attribution`, estimated) and are priced from it.
    """
    from analytics.attribution import phase_breakdown
    from analytics.bimodal import bimodality, idle_split
    from analytics.cost import cost_breakdown, load_prices, token_counts
    from analytics.external import external_attribution
    from analytics.external_cost import gpus_without_telemetry
    from analytics.intervals import IntervalTable
    from analytics.iteration_groups import iteration_groups
    from analytics.latency import latency_summary

    out = Summary(window)
    try:  # a terminal progress bar on long queries would garble the CLI's output
        con.execute("SET enable_progress_bar = false")
    except duckdb.Error:
        pass

    def run(name: str, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        try:
            result = fn()
        except _PART_ERRORS as e:
            out.missing[name] = f"{type(e).__name__}: {e}"
            return None
        finally:
            out.seconds[name] = time.perf_counter() - t
        _add(out, name, result)
        return result

    groups = functools.cache(lambda: iteration_groups(con, window))  # computed by the first part to ask

    t = time.perf_counter()
    try:
        intervals = IntervalTable(con, window).__enter__()
    except (ValueError, duckdb.Error) as e:
        intervals = None
        out.missing["intervals"] = f"{type(e).__name__}: {e}"
    out.seconds["intervals"] = time.perf_counter() - t
    try:
        pb = (
            run(
                "phases", lambda: phase_breakdown(con, window, intervals=intervals, iteration_groups=groups())
            )
            if intervals
            else None
        )
        if pb is not None:
            run("idle", lambda: idle_split(con, window, breakdown=pb))
            if "bimodal" not in skip:
                run("bimodal", lambda: bimodality(con, window, intervals=intervals))
    finally:
        if intervals is not None:
            intervals.__exit__(None, None, None)
    price_table = prices if prices is not None else load_prices()
    # GPUs with samples but no phaselens telemetry (dcgm-exporter under vLLM / SGLang / Dynamo):
    # their phase split, GPU-hours and tokens are estimated from the engines' own metrics
    unattributed = gpus_without_telemetry(pb.raw) if pb is not None else set()
    external = (
        run("external", lambda: external_attribution(con, window, gpus=unattributed))
        if unattributed
        else None
    )
    cost = (
        run(
            "cost",
            lambda: cost_breakdown(
                con,
                window,
                price_table,
                breakdown=pb,
                tokens=token_counts(con, window, groups()),
                external=external,
            ),
        )
        if pb is not None
        else None
    )
    if cost is not None and fleet_gpus:
        run("annual", lambda: cost.annualised(fleet_gpus))
    run("latency", lambda: latency_summary(con, window, slo, iteration_groups=groups()))
    run("serving", lambda: serving_span(con, window))
    # output tokens/s: the window average, and the rate while serving under its own name
    run("throughput", lambda: throughput({"window": window.describe(), "parts": out.parts}))
    return out


def serving_span(con: duckdb.DuckDBPyConnection, window: Window) -> dict[str, Any]:
    """When the window was serving: the union of its requests' spans (arrival to finish, or to the
    last time known of an unfinished one), clipped to the window — ``span_s`` (seconds with at
    least one request in flight), ``first_s``/``last_s``, ``requests``; ``span_s`` None where no
    request lies in the window. What "tokens/s while serving (busy time)" divides by
    (:mod:`analytics.throughput`; the headline output tokens/s is the window average).

    The spans are fetched and their union measured in numpy: sorted by start (then end), each
    span's part beyond every earlier one (a running maximum of the ends) — one sort of nearly
    ordered arrival times, instead of a window function over every request."""
    pred, par = window.node_sql("node")
    end = "coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)"  # the last time known of it
    spans = con.execute(
        f"""
SELECT greatest(arrival_s, ?) AS a, least({end}, ?) AS f
FROM requests WHERE {pred} AND arrival_s < ? AND {end} > ?
""",
        [window.start_s, window.end_s, *par, window.end_s, window.start_s],
    ).fetchnumpy()
    a, f = np.asarray(spans["a"], dtype=float), np.asarray(spans["f"], dtype=float)
    n = len(a)
    if not n:
        return {"requests": 0, "first_s": None, "last_s": None, "span_s": None}
    order = span_order(np.zeros(n, dtype=np.int64), a, f)
    a, f = a[order], f[order]
    # each span's part beyond every earlier-starting one: they sum to the union's length
    reach = np.empty(n)
    reach[0] = a[0]
    np.maximum(a[1:], np.maximum.accumulate(f)[:-1], out=reach[1:])
    span = float(np.maximum(0.0, f - reach).sum())
    return {"requests": n, "first_s": float(a[0]), "last_s": float(f.max()), "span_s": span}


def _add(out: Summary, name: str, result: Any) -> None:
    part = _as_dict(result)
    out.parts[name] = part
    trust = part.get("trust")
    if isinstance(trust, dict):
        out.trust.merge([Trust(set(trust.get("labels", [])), list(trust.get("notes", [])))])
    missing = part.get("missing")
    if isinstance(missing, dict):
        for what, why in missing.items():
            out.missing.setdefault(f"{name}.{what}", str(why))
    elif isinstance(missing, list):
        for i, why in enumerate(missing):
            out.missing.setdefault(f"{name}.{i}", str(why))


# -- rendering ------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "—"
        a = abs(value)
        return f"{value:,.0f}" if a >= 1000 else f"{value:.1f}" if a >= 10 else f"{value:.3g}"
    if isinstance(value, dict | list):
        return (
            ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
            if isinstance(value, dict)
            else ", ".join(map(_cell, value))
        )
    return str(value)


def _grid(header: list[str], rows: list[list[str]], *, rule: bool = False) -> list[str]:
    """Aligned text columns: the first left-aligned, the others right-aligned; ``rule`` under the header."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return [line(header)] + (["  ".join("-" * w for w in widths)] if rule else []) + [line(r) for r in rows]


def _table(rows: list[dict[str, Any]], limit: int = 40) -> list[str]:
    cols = list(dict.fromkeys(k for r in rows for k in r if not isinstance(r[k], dict | list)))
    if not cols:
        return []
    lines = _grid(cols, [[_cell(r.get(c)) for c in cols] for r in rows[:limit]], rule=True)
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows (--json for all)")
    return lines


def _render(obj: Any, indent: str = "") -> list[str]:
    lines: list[str] = []
    if isinstance(obj, dict):
        scalars = {k: v for k, v in obj.items() if not isinstance(v, dict | list) and k != "trust"}
        if scalars:
            width = max(len(k) for k in scalars)
            lines += [f"{indent}{k.ljust(width)}  {_cell(v)}" for k, v in scalars.items()]
        for k, v in obj.items():
            if k == "trust" and isinstance(v, dict):
                lines.append(f"{indent}trust: {', '.join(v.get('labels', [])) or 'no data'}")
                lines += [f"{indent}  note: {n}" for n in v.get("notes", [])]
            elif isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
                lines.append(f"{indent}{k}:")
                lines += [indent + "  " + line for line in _table(v)]
            elif isinstance(v, list):
                lines.append(f"{indent}{k}: {_cell(v)}")
            elif isinstance(v, dict):
                lines.append(f"{indent}{k}:")
                lines += _render(v, indent + "  ")
    return lines


def _pct(x: Any) -> str:
    return "—" if x is None or x != x else f"{100 * x:.1f} %"


def _ms(x: Any) -> str:
    return "—" if x is None or x != x else f"{1000 * x:,.1f}" if x < 1 else f"{1000 * x:,.0f}"


def _usd(x: Any) -> str:
    """Money to 3 significant figures ($4.31, $0.117, $0.00160, $35.6), whole dollars from $100."""
    if x is None or x != x:
        return "—"
    if x == 0 or abs(x) >= 100:
        return f"${x:,.0f}"
    return f"${x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def _p_value(p: Any) -> str:
    """A dip-test p-value: ``< 0.001`` rather than a 0, else 3 decimals below 0.1, 2 above."""
    if p is None or p != p:
        return "—"
    return "< 0.001" if p < 0.001 else f"{p:.3f}" if p < 0.1 else f"{p:.2f}"


def _slo_ms(x: Any) -> str:
    """An SLO threshold in ms, every threshold the same way: ``2,000``, ``100``, ``62.5``."""
    if x is None or x != x:
        return "—"
    ms = 1000 * x
    return f"{ms:,.0f}" if abs(ms - round(ms)) < 1e-9 else f"{ms:,.1f}"


def _rows(title: str, header: list[str], rows: list[list[str]], *, titled: bool = False) -> list[str]:
    """A titled table of ``rows``; nothing without rows, or the title alone where ``titled`` (lines
    under it still need it: a capped table's left-out line, notes)."""
    if not rows:
        return ["", title] if titled else []
    return ["", title, *("  " + line for line in _grid(header, rows))]


#: per-GPU rows of the unsampled-time, bimodality and power-model tables ``phaselens analyze`` prints by default
DEFAULT_GPU_ROWS = 12


def _natural(key: str) -> tuple[Any, ...]:
    """A GPU key's place in natural order: by node, then numeric index (2 before 10)."""
    parts = key.split("|")
    if len(parts) != 4:
        return (key, 2)
    node, source, device, index = parts
    return (node, 0, int(index), source, device) if index.isdigit() else (node, 1, index, source, device)


def _index_runs(indices: list[int], most: int = 8) -> str:
    """Sorted whole numbers as runs: ``0–31, 40, 42–44``; past ``most`` runs, the first ones, ``…``
    and the last (``1, 3, 5, …, 63``)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    texts = [f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
    return ", ".join(texts if len(texts) <= most else [*texts[: most - 1], "…", texts[-1]])


class GpuNames:
    """The GPUs of one summary (keys ``node|source|device|index``): their natural order (by node,
    then numeric index) and short labels — the index alone where the window holds one node, else
    ``node/index``. A GPU whose short label another GPU shares keeps its whole key."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.keys = sorted(set(keys), key=_natural)
        self.one_node = len({k.split("|")[0] for k in self.keys}) <= 1
        short = {k: self._short(k, one_node=self.one_node) for k in self.keys}
        taken = Counter(short.values())
        self._labels = {k: label for k, label in short.items() if label is not None and taken[label] == 1}
        self.pattern = (  # a key in a message, after "GPU " or not
            re.compile("(?:GPU )?(" + "|".join(map(re.escape, self.keys)) + r")(?!\d)") if self.keys else None
        )

    @staticmethod
    def _short(key: str, *, one_node: bool) -> str | None:
        parts = key.split("|")
        if len(parts) != 4 or not parts[3].isdigit():
            return None
        return parts[3] if one_node else f"{parts[0]}/{parts[3]}"

    def label(self, key: str) -> str:
        """The GPU's short label (its whole key where a short one would be ambiguous or unknown)."""
        return self._labels.get(key, key)

    def relabel(self, text: str) -> str:
        """``text`` with each GPU key it names as ``GPU <label>``."""
        return self.pattern.sub(lambda m: f"GPU {self.label(m[1])}", text) if self.pattern else text

    def order(self, keys: Iterable[str]) -> list[str]:
        """``keys`` in natural order."""
        return sorted(keys, key=_natural)

    def listing(self, keys: Iterable[str]) -> str:
        """``GPU 7`` for one GPU; for more, the count and their labels with runs of indices
        compacted: ``GPUs 0–31 (32)``, ``GPUs a/0–7, b/0–3 (12)``."""
        ordered = self.order(set(keys))
        if len(ordered) == 1:
            return f"GPU {self.label(ordered[0])}"
        pieces: list[str] = []
        by_node: dict[str, list[int]] = {}  # short-labelled GPUs' indices per node, in order
        for key in ordered:
            if key in self._labels:
                by_node.setdefault(key.split("|")[0], []).append(int(key.rsplit("|", 1)[1]))
            else:
                pieces.append(key)
        runs = [
            _index_runs(idx) if self.one_node else f"{node}/{_index_runs(idx)}"
            for node, idx in by_node.items()
        ]
        return f"GPUs {', '.join(runs + pieces)} ({len(ordered)})"


def _gpu_keys(parts: dict[str, Any]) -> list[str]:
    """Every GPU key the summary's per-GPU tables name: the power fits, the sample gaps, the
    bimodality's GPU rows."""
    phases = parts.get("phases") or {}
    keys = list(phases.get("fits") or {}) + list(phases.get("sample_gaps") or {})
    keys += [str(r["gpu"]) for r in (parts.get("bimodal") or {}).get("table") or [] if r.get("gpu")]
    return keys


def _notable_first(keys: list[str], rank: Callable[[str], Any], limit: int | None) -> list[str]:
    """The ``limit`` first of ``keys`` by ``rank`` (all where ``limit`` is None), in natural order."""
    chosen = keys if limit is None else sorted(keys, key=lambda k: (rank(k), _natural(k)))[: max(0, limit)]
    return sorted(chosen, key=_natural)


def _left_out(shown: int, total: int, rule: str) -> list[str]:
    """The line under a capped per-GPU table: how many GPUs it leaves out and how the shown ones were
    picked (nothing where none is left out)."""
    if shown >= total:
        return []
    picked = f"; shown: {rule}" if shown else ""
    return [f"  … {total - shown} of {total} GPUs left out{picked}; --gpus all (or --json) lists every one"]


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
                _pct(p.get("frac_prefill")),
                _pct(p.get("frac_decode")),
                _pct(mixed),
                _pct((p.get("frac_host") or 0) + (p.get("frac_gap") or 0)),
                _pct(p.get("frac_idle")),
                _pct(p.get("frac_unsampled")),
                f"{(p.get('energy_j') or 0) / 3.6e6:,.3g}",
            ]
        )
    return _rows(
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
    shown = _notable_first(list(gaps), lambda gpu: -(gaps[gpu].get("gap_s") or 0.0), gpu_rows)
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
    out = _rows(title, ["GPU", "unsampled s", "gaps", "longest s", "threshold s"], rows, titled=True)
    out += _left_out(len(shown), len(gaps), "the most unsampled time")
    out.append(
        f"  overall: {unsampled_s:,.1f} s of {total_s:,.1f} GPU-s unsampled ({_pct(unsampled_s / total_s if total_s else None)});"
        f" a gap: samples further apart than {GAP_PERIODS:g} sampling periods and {GAP_MIN_S:g} s; its energy is"
        " the counter's rise across it"
    )
    return out


def _idle_lines(parts: dict[str, Any]) -> list[str]:
    pools = (parts.get("idle") or {}).get("per_pool") or []
    rows = [
        [
            str(p.get("role") or "—"),
            _pct(p.get("frac_productive_prefill")),
            _pct(p.get("frac_stranded_bandwidth")),
            _pct(p.get("frac_productive_decode")),
            _pct(p.get("frac_stranded_compute")),
            _pct(p.get("frac_host_bound")),
            _pct(p.get("frac_idle")),
            _pct(p.get("frac_unsampled")),
            _cell(p.get("util_pct")),
            _cell(p.get("sm_active_pct")),
        ]
        for p in pools
    ]
    return _rows(
        "Where the GPU time goes (per pool; stranded = busy with the compute or bandwidth idle)",
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

    shown = _notable_first(list(per_gpu), rank, gpu_rows)
    rows = [_bimodal_row(str(r.get("role") or "—"), r) for r in pools.values()]
    rows += [
        _bimodal_row(f"  GPU {names.label(g)} ({per_gpu[g].get('role') or '—'})", per_gpu[g]) for g in shown
    ]
    rule = (parts.get("bimodal") or {}).get("rule")
    if not rule:  # a summary without the part's rule (no bimodal part): the rule it would carry
        from analytics.bimodal import BIMODAL_RULE as rule
    out = _rows(
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
    return out + _left_out(
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
        else f"{r['mode_low_pct']:,.1f} % ({_pct(r.get('weight_low'))}) / "
        f"{r['mode_high_pct']:,.1f} % ({_pct(r.get('weight_high'))})"
    )
    return [
        where,
        f"{r.get('n', 0):,}",
        _cell(r.get("sm_prefill_pct")),
        _cell(r.get("sm_decode_pct")),
        _cell(r.get("util_pct")),
        _cell(r.get("dip")),
        _p_value(r.get("dip_p_value")),
        _cell(r.get("sarle")),
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
        f"  all in (compare layouts and periods by these): {_usd(t.get('usd_per_1m_tokens'))} per 1M tokens"
        f" (input + output), {_usd(t.get('usd_per_request'))} per request"
        f" ({'—' if requests is None or requests != requests else f'{requests:,.0f}'} finished)"
    )
    out.append(
        f"  industry figure (GPU $/h ÷ output tokens/s): {_usd(t.get('industry_usd_per_1m_output'))} per 1M output tokens"
        f" at {_cell(t.get('output_tokens_per_s_per_gpu'))} output tokens/s per GPU"
    )
    out.append(
        f"  blended 3:1 (input:output, as Artificial Analysis compares API prices; follows the split by side):"
        f" {_usd(t.get('blended_usd_per_1m_tokens'))} per 1M tokens"
    )
    out.append("  by side (a pool's idle time is on one side, so these depend on the layout):")
    out.append(
        f"  $/1M input tokens  {_usd(t.get('usd_per_1m_input'))}  = prefill {_usd(t.get('usd_per_1m_input_prefill'))}"
        f" + stranded {_usd(t.get('usd_per_1m_input_stranded'))} + host-bound {_usd(t.get('usd_per_1m_input_host_bound'))}"
        f" + idle {_usd(t.get('usd_per_1m_input_idle'))}{_unsampled_usd(t, 'input')}"
    )
    out.append(
        f"  $/1M output tokens {_usd(t.get('usd_per_1m_output'))}  = decode {_usd(t.get('usd_per_1m_output_decode'))}"
        f" + stranded {_usd(t.get('usd_per_1m_output_stranded'))} + host-bound {_usd(t.get('usd_per_1m_output_host_bound'))}"
        f" + idle {_usd(t.get('usd_per_1m_output_idle'))}{_unsampled_usd(t, 'output')}"
    )
    out.append(
        f"  energy: {_cell(t.get('j_per_input_token'))} J per input token, {_cell(t.get('j_per_output_token'))} J per output"
        f" token ({_cell(t.get('output_tokens_per_j'))} output tokens/J); window cost {_usd(t.get('cost_usd'))} for"
        f" {_cell(t.get('gpu_hours'))} GPU-h"
    )
    annual = parts.get("annual") or {}
    if annual.get("sentence"):
        out.append(f"  {annual['sentence']}")
    elif annual:
        out.append(
            f"  annualised for {annual.get('fleet_gpus')} GPUs: {_usd(annual.get('total_usd_per_year'))} a year"
        )
    return out


def _unsampled_usd(total: dict[str, Any], side: str) -> str:
    """`` + other busy $x + unsampled (no samples) $y`` for the categories with GPU time in the
    window (an external fleet's unexplained busy time; gaps in samples), else nothing."""
    return "".join(
        f" + {name} {_usd(total.get(f'usd_per_1m_{side}_{c}'))}"
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
            *(_pct(p.get(f"{s}_share")) for s in ("prefill", "decode", "other_busy", "idle")),
            f"{(p.get('energy_j') or 0) / 3.6e6:,.3g}",
            str(p.get("method") or "—"),
        ]
        for p in ext.get("per_pool") or []
    ]
    head = ["pool", "GPUs", "GPU-h", "prefill", "decode", "other busy", "idle", "energy kWh", "method"]
    title = f"GPU time by phase, GPUs without phaselens telemetry ({labels}: dcgm-exporter + engine metrics)"
    out = _rows(title, head, rows)
    engines = [
        [
            str(e.get("endpoint")),
            str(e.get("engine") or "—"),
            str(e.get("model") or "—"),
            str(e.get("role") or "—"),
            _cell(e.get("served_input_tokens")),
            _cell(e.get("served_output_tokens")),
            _cell(e.get("served_requests")),
            _cell(e.get("fit_r2")),
        ]
        for e in ext.get("engines") or []
    ]
    head = ["engine", "kind", "model", "role", "input tokens", "output tokens", "requests", "fit R²"]
    return out + _rows("Engines (their counters over the window)", head, engines)


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
            [label, f"{p.get('n', 0):,}", _ms(p.get("p50_s")), _ms(p.get("p90_s")), _ms(p.get("p99_s")), how]
        )
    out = _rows("Latency (ms)", ["", "n", "p50", "p90", "p99", "method"], rows)
    att = lat.get("attainment") or {}
    slo = lat.get("slo") or {}
    if att:
        out.append(
            f"  SLO attainment (TTFT ≤ {_slo_ms(slo.get('ttft_s'))} ms and TPOT ≤ {_slo_ms(slo.get('tpot_s'))} ms):"
            f" {_pct(att.get('both'))} ({attainment_basis(lat)})"
        )
    return out


def _fit_lines(parts: dict[str, Any], names: GpuNames, gpu_rows: int | None) -> list[str]:
    """The power model: at most ``gpu_rows`` GPUs' fits (None: all) — the lowest R² first, an
    undefined R² before any — in natural order; then each note once, with the GPUs it applies to."""
    fits = (parts.get("phases") or {}).get("fits") or {}

    def rank(gpu: str) -> tuple[bool, float]:
        r2 = fits[gpu].get("r2")
        return r2 is not None and r2 == r2, r2 if r2 is not None and r2 == r2 else 0.0

    shown = _notable_first(list(fits), rank, gpu_rows)
    rows = [
        [names.label(gpu)]
        + [_cell((fits[gpu].get("coef_w") or {}).get(k)) for k in ("prefill", "decode", "host_bound", "idle")]
        + [_cell(fits[gpu].get("r2"))]
        for gpu in shown
    ]
    title = "Power model per GPU (W while in each state; apportions each interval's measured energy)"
    out = _rows(
        title, ["GPU", "prefill W", "decode W", "host-bound W", "idle W", "R²"], rows, titled=bool(fits)
    )
    out += _left_out(len(shown), len(fits), "the lowest R²")
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
    return ", ".join([f"{part}.{_index_runs(sorted(ns), most=3)}" for part, ns in numbered.items()] + named)


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
    names = GpuNames(_gpu_keys(parts))
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
            lines += ["", f"== {name} (detail) ==", *_render(part)]
    return "\n".join(lines)
