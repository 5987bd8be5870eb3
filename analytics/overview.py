"""The overview's headline figures: two analytics summaries (a window and the period of the same
length before it) turned into the figures a person reads in ten seconds, each with its trend,
its unit and its trust labels, plus where the GPU time goes and one sentence saying where the money
goes ("38.0 % of GPU-time is stranded (...): $41k/yr at this fleet size", the stranded tile's
value on the tile's base).

Pure: :func:`overview` takes the JSON form of two summaries (``analytics.summary.Summary.to_dict``,
what ``GET /api/v1/analytics/summary`` answers) and returns JSON. A figure that cannot be computed
(an empty window, no requests, no previous period) is ``None`` with the reason in ``no_data`` —
never a zero. Definitions (docs/ANALYTICS.md, "Overview"):

* ``output_tokens_per_s``: output tokens generated in the window ÷ the seconds of it the GPUs were observed
  (the window average, :func:`analytics.throughput.throughput`, what ``phaselens analyze`` prints);
  beside it, by its own name, ``busy_value``: "tokens/s while serving (busy time)", ÷ the seconds
  with a request in flight (``busy_s``);
* ``usd_per_1m_tokens`` / ``usd_per_request``: the window's cost ÷ its input + output tokens (× 1e6) and
  ÷ the requests finished in it (the cost part's figures that compare periods and layouts; $/1M input
  and output tokens depend on which side a pool's idle time is charged to);
* ``j_per_output_token``: output-side energy ÷ output tokens (``j_per_input_token`` beside it);
* ``stranded_share``, ``host_bound_share``, ``idle_share``: GPU-seconds of stranded compute (decode
  time × (1 − MFU), else × (1 − SM activity) where the work is not counted: the figure's ``basis``) and
  bandwidth (prefill time × (1 − MBU), else × (1 − DRAM activity)), host-bound time and idle time ÷ all GPU-seconds of the window (time in a gap of a
  GPU's samples is ``unsampled``, in the GPU-time bar, never idle); stranded and host-bound ÷ the
  GPU-seconds that have that split (not those of GPUs without phaselens telemetry, whose phases
  are estimated: ``no_data`` where every GPU is such);
* ``slo_attainment``: requests meeting both the TTFT and the TPOT SLO ÷ every request that arrived
  in the window (one failed, aborted or rejected misses: the latency part's ``attainment``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analytics.cost_pricing import CATEGORIES, HOURS_PER_YEAR
from analytics.latency import attainment_basis
from analytics.stranded import BASIS_ACTIVITY, BASIS_MIXED, BASIS_SHORT, basis_word
from analytics.throughput import HEADLINE_LABEL, throughput

# GPU-time shown in the overview's bar: (key, readable name, the cost part's second columns)
GPU_TIME = (
    ("productive_prefill", "productive prefill", ("prefill_s",)),
    ("productive_decode", "productive decode", ("decode_s",)),
    ("stranded", "stranded (busy, compute or bandwidth idle)", ("stranded_prefill_s", "stranded_decode_s")),
    ("host_bound", "host-bound", ("host_bound_s",)),
    ("other_busy", "other busy (not engine work)", ("other_busy_s",)),
    ("idle", "idle", ("idle_s",)),
    ("unsampled", "unsampled (no samples)", ("unsampled_s",)),
)
_SECONDS = (
    "prefill_s",
    "decode_s",
    "stranded_prefill_s",
    "stranded_decode_s",
    "host_bound_s",
    "other_busy_s",
    "idle_s",
    "unsampled_s",
)


@dataclass(frozen=True, slots=True)
class FigureSpec:
    """One headline figure: its key, label (with unit), unit, and which way is better."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    part: str  # the summary part its trust labels come from


FIGURES = (
    FigureSpec("output_tokens_per_s", HEADLINE_LABEL, "tokens/s", True, "cost"),
    FigureSpec("usd_per_1m_tokens", "$ per 1M tokens, all in", "$/1M tokens", False, "cost"),
    FigureSpec("usd_per_request", "$ per request", "$/request", False, "cost"),
    FigureSpec("j_per_output_token", "Energy per output token, J", "J/token", False, "cost"),
    FigureSpec("stranded_share", "Stranded GPU-time, %", "ratio", False, "cost"),
    FigureSpec("host_bound_share", "Host-bound GPU-time, %", "ratio", False, "cost"),
    FigureSpec("idle_share", "Idle GPU-time, %", "ratio", False, "cost"),
    FigureSpec("slo_attainment", "SLO attainment, %", "ratio", True, "latency"),
)


def _num(x: Any) -> float | None:
    """A finite float, else None (the summary writes NaN and infinities as null)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _why_missing(summary: dict[str, Any], *parts: str) -> str:
    """The summary's own reason a part is missing, else a plain 'no data' naming the part."""
    missing = summary.get("missing") or {}
    for p in (*parts, "phases", "idle", "intervals"):
        for key, why in missing.items():
            if key == p or key.startswith(p + "."):
                return f"no data: {why}"
    return "no data: no GPU time in the window"


def _cost_total(summary: dict[str, Any]) -> dict[str, Any] | None:
    total = ((summary.get("parts") or {}).get("cost") or {}).get("total") or {}
    seconds = _num(total.get("gpu_seconds"))
    return total if seconds is not None and seconds > 0 else None


def headline(summary: dict[str, Any] | None) -> dict[str, tuple[float | None, str | None]]:
    """Each of :data:`FIGURES` of one summary: ``(value, None)``, or ``(None, reason)``."""
    if summary is None:
        return {f.key: (None, "no data: no summary") for f in FIGURES}
    out: dict[str, tuple[float | None, str | None]] = {}
    total = _cost_total(summary)
    if total is None:
        why = _why_missing(summary, "cost")
        for f in FIGURES:
            if f.part == "cost":
                out[f.key] = (None, why)
    else:
        seconds = float(total["gpu_seconds"])
        rate = throughput(summary)
        out["output_tokens_per_s"] = (rate["output_tokens_per_s"], rate["no_data"])
        for key, why in (
            ("usd_per_1m_tokens", "no tokens in the window (or a GPU without a price)"),
            ("usd_per_request", "no request finished in the window (or a GPU without a price)"),
            ("j_per_output_token", "no output tokens in the window"),
        ):
            value = _num(total.get(key))
            out[key] = (value, None) if value is not None else (None, f"no data: {why}")

        def share(*cols: str, of: float = seconds) -> tuple[float | None, str | None]:
            vals = [_num(total.get(c)) for c in cols]
            if any(v is None for v in vals):
                return None, "no data: GPU-time split unknown"
            if of <= 0:
                return None, (
                    "no data: the GPUs of the window have no phaselens telemetry; their phase split is estimated "
                    "from dcgm-exporter and engine metrics, without a stranded or host-bound split"
                )
            return sum(vals) / of, None  # type: ignore[arg-type]

        # stranded and host-bound time are of the GPU-time that has the split: not of an external
        # fleet's GPUs, whose phases are estimated (analytics/external_cost.py)
        split = seconds - (_num(total.get("estimated_s")) or 0.0)
        out["stranded_share"] = share("stranded_prefill_s", "stranded_decode_s", of=split)
        out["host_bound_share"] = share("host_bound_s", of=split)
        out["idle_share"] = share("idle_s")
    latency = (summary.get("parts") or {}).get("latency") or {}
    both = _num((latency.get("attainment") or {}).get("both"))
    if not latency:
        out["slo_attainment"] = (None, _why_missing(summary, "latency"))
    elif both is None or not latency.get("requests"):
        out["slo_attainment"] = (None, "no data: no request arrived in the window")
    else:
        out["slo_attainment"] = (both, None)
    return out


def stranded_basis_of(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cost part's ``stranded_basis`` (:func:`analytics.stranded.stranded_basis`): which
    yardstick the stranded share rests on; None where the summary has none."""
    if summary is None:
        return None
    return ((summary.get("parts") or {}).get("cost") or {}).get("stranded_basis") or None


def _pct(x: Any) -> str:
    v = _num(x)
    return "–" if v is None else f"{100 * v:.1f} %"


def stranded_basis_text(basis: dict[str, Any]) -> str:
    """The stranded tile's basis in words, with the decode and prefill time it calls stranded and,
    beside them, what SM / DRAM activity would call stranded, e.g. "stranded = decode time × (1 − MFU)
    + prefill time × (1 − MBU), from the work counted: 97.2 % of decode time, 82.3 % of prefill time
    (by SM / DRAM activity: 50.6 %, 48.7 %)"."""
    word = basis_word(basis)
    shares = (
        f"{_pct(basis.get('stranded_compute_decode_share'))} of decode time, "
        f"{_pct(basis.get('stranded_bandwidth_prefill_share'))} of prefill time"
    )
    beside = (
        f" (by SM / DRAM activity: {_pct(basis.get('stranded_compute_sm_share'))}, "
        f"{_pct(basis.get('stranded_bandwidth_dram_share'))})"
    )
    if word == BASIS_ACTIVITY:
        return (
            "stranded = decode time × (1 − SM activity) + prefill time × (1 − DRAM activity), from the GPU "
            f"samples (the engine counted no work): {shares}"
        )
    if word == BASIS_MIXED:
        return (
            "stranded = decode time × (1 − MFU) + prefill time × (1 − MBU) where the engine counted the work, "
            f"else × (1 − SM / DRAM activity): {shares}{beside}"
        )
    return f"stranded = decode time × (1 − MFU) + prefill time × (1 − MBU), from the work counted: {shares}{beside}"


def _labels(summary: dict[str, Any] | None, part: str) -> list[str]:
    if summary is None:
        return []
    p = (summary.get("parts") or {}).get(part) or {}
    return list((p.get("trust") or {}).get("labels") or [])


def gpu_time(summary: dict[str, Any] | None) -> dict[str, Any]:
    """Where the GPU time of a summary goes: each of :data:`GPU_TIME` as a share of all
    GPU-seconds (they sum to 1), the GPU-seconds, and the trust labels; ``no_data`` when empty."""
    total = _cost_total(summary) if summary is not None else None
    if total is None:
        why = _why_missing(summary, "cost") if summary is not None else "no data: no summary"
        return {"shares": None, "gpu_seconds": None, "trust": [], "no_data": why}
    per_pool = {}
    for row in ((summary.get("parts") or {}).get("cost") or {}).get("by_pool") or []:  # type: ignore[union-attr]
        shares = _shares(row)
        if shares is not None:
            per_pool[str(row.get("pool") or "unassigned")] = shares
    return {
        "shares": _shares(total),
        "per_pool": per_pool,
        "names": {key: name for key, name, _cols in GPU_TIME},
        "gpu_seconds": float(total["gpu_seconds"]),
        "trust": _labels(summary, "cost"),
        "no_data": None,
    }


def _shares(row: dict[str, Any]) -> dict[str, float] | None:
    seconds = _num(row.get("gpu_seconds"))
    if seconds is None or seconds <= 0:
        return None
    return {key: sum(_num(row.get(c)) or 0.0 for c in cols) / seconds for key, _name, cols in GPU_TIME}


def observed_gpus(summary: dict[str, Any]) -> int | None:
    """GPUs of the window: the phase breakdown's per-pool GPU counts summed."""
    pools = ((summary.get("parts") or {}).get("phases") or {}).get("per_pool") or []
    n = sum(int(p.get("gpus") or 0) for p in pools)
    return n or None


def _annual(summary: dict[str, Any], total: dict[str, Any], fleet_gpus: int) -> dict[str, float | None]:
    """$ a year per cost category for ``fleet_gpus`` GPUs: the summary's ``annual`` part when it is
    for that fleet, else the same projection (``CostBreakdown.annualised``) from the total row."""
    annual = (summary.get("parts") or {}).get("annual") or {}
    if annual.get("fleet_gpus") == fleet_gpus and isinstance(annual.get("usd_per_year"), dict):
        return {k: _num(v) for k, v in annual["usd_per_year"].items()}
    scale = fleet_gpus * 3600.0 * HOURS_PER_YEAR / float(total["gpu_seconds"])
    out: dict[str, float | None] = {}
    for c in CATEGORIES:
        usd = _num(total.get(f"cost_usd_{c}"))
        out[c] = None if usd is None else usd * scale
    return out


def _money(usd: float) -> str:
    """$41k, $1.2M, $530 (a sentence's round figure)."""
    a = abs(usd)
    if a >= 1e6:
        return f"${usd / 1e6:,.1f}M"
    if a >= 1e4:
        return f"${usd / 1e3:,.0f}k"
    if a >= 1e3:
        return f"${usd / 1e3:,.1f}k"
    return f"${usd:,.0f}"


# (waste kind, its cost categories, the headline figure (tile) whose share it states, "is what"):
# the sentence states the tile's own value, so the two read the same number on the same base
_WASTE = (
    (
        "stranded",
        ("stranded_decode", "stranded_prefill"),
        "stranded_share",
        "stranded (busy, with the compute or the memory bandwidth idle)",
    ),
    ("host_bound", ("host_bound",), "host_bound_share", "host-bound (the GPU waits on the host)"),
    ("idle", ("idle",), "idle_share", "idle"),
)


def money_sentence(summary: dict[str, Any] | None, fleet_gpus: int | None = None) -> dict[str, Any]:
    """Where the money goes: the waste kind (stranded, host-bound, idle) that costs most a year at
    ``fleet_gpus`` GPUs (default: the GPUs observed), its share of GPU-time — the value of its
    headline tile (``figure``), on the same base: all GPU-seconds of the window (those with a
    stranded/host-bound split for those two) — and one sentence saying so."""
    total = _cost_total(summary) if summary is not None else None
    if total is None:
        why = _why_missing(summary, "cost") if summary is not None else "no data: no summary"
        return {"sentence": None, "no_data": why}
    observed = observed_gpus(summary)  # type: ignore[arg-type]
    fleet = fleet_gpus or observed
    if not fleet:
        return {"sentence": None, "no_data": "no data: no GPU observed in the window"}
    per_year = _annual(summary, total, fleet)  # type: ignore[arg-type]
    tiles = headline(summary)
    scale_note = "at this fleet size" if fleet_gpus else "at the observed fleet size"
    best: tuple[float, str, str, str, float, float | None] | None = None
    for kind, cats, figure, what in _WASTE:
        share = tiles[figure][0]
        usds = [per_year.get(c) for c in cats]
        usd = None if any(u is None for u in usds) else sum(usds)  # type: ignore[arg-type]
        rank = usd if usd is not None else -1.0
        if share is not None and share > 0 and (best is None or rank > best[0]):
            best = (rank, kind, figure, what, share, usd)
    base = {"fleet_gpus": fleet, "observed_gpus": observed, "usd_per_year": per_year, "no_data": None}
    if best is None:
        sentence = "No GPU-time in this window is stranded, host-bound or idle."
        return base | {
            "category": None,
            "figure": None,
            "share": 0.0,
            "of": None,
            "usd": None,
            "sentence": sentence,
        }
    _rank, kind, figure, what, share, usd = best
    word = basis_word(stranded_basis_of(summary)) if kind == "stranded" else None
    if word:  # which yardstick the stranded share rests on: MFU/MBU, or SM/DRAM activity without a count
        what = f"{what[:-1]}; {BASIS_SHORT[word]})"
    cost = f"{_money(usd)}/yr {scale_note} ({fleet:,} GPUs)" if usd is not None else "no price for this GPU"
    sentence = f"{share_text(share)} of GPU-time is {what}: {cost}."
    return base | {
        "category": kind,
        "figure": figure,
        "share": share,
        "of": "GPU-time",
        "usd": usd,
        "sentence": sentence,
    }


def share_text(share: float) -> str:
    """A share as the Overview's tiles print it (``64.7 %``): the sentence and its tile agree."""
    return f"{100 * share:.1f} %"


def _delta(value: float | None, previous: float | None) -> tuple[float | None, float | None]:
    if value is None or previous is None:
        return None, None
    d = value - previous
    return d, (d / abs(previous) if previous else None)


def overview(
    current: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    *,
    fleet_gpus: int | None = None,
    previous_missing: str | None = None,
) -> dict[str, Any]:
    """The overview of ``current`` against ``previous`` (a summary of the period of the same
    length before it, or None with ``previous_missing`` saying why). JSON: ``figures`` (each of
    :data:`FIGURES`: value, previous, delta, delta_ratio, unit, label, higher_is_better, trust,
    no_data, previous_no_data), ``gpu_time`` (:func:`gpu_time`), ``money``
    (:func:`money_sentence`), ``trust`` (of the whole window) and ``empty``."""
    now = headline(current)
    before = headline(previous)
    prev_why = previous_missing or "no data: no previous period"
    figures = {}
    for f in FIGURES:
        value, why = now[f.key]
        prev, pwhy = before[f.key] if previous is not None else (None, prev_why)
        delta, ratio = _delta(value, prev)
        figures[f.key] = {
            "label": f.label,
            "unit": f.unit,
            "higher_is_better": f.higher_is_better,
            "value": value,
            "previous": prev,
            "delta": delta,
            "delta_ratio": ratio,
            "trust": _labels(current, f.part) if value is not None else [],
            "no_data": why,
            "previous_no_data": pwhy,
        }
    total = _cost_total(current) if current is not None else None
    j_in = _num(total.get("j_per_input_token")) if total else None
    figures["j_per_output_token"]["j_per_input_token"] = j_in
    if current is not None:  # what the window average divides by, and the rate while serving by name
        rate = throughput(current)
        figures["output_tokens_per_s"] |= {
            "window_s": rate["window_s"],
            "basis": rate["basis"],
            "busy_label": rate["busy_label"],
            "busy_value": rate["output_tokens_per_s_busy"],
            "busy_s": rate["busy_s"],
            "busy_basis": rate["busy_basis"],
        }
        basis = stranded_basis_of(current)
        if basis and basis_word(basis):  # the stranded tile's yardstick, the activity basis's figure beside
            word = basis_word(basis)
            figures["stranded_share"] |= {
                "basis": stranded_basis_text(basis),
                "basis_kind": word,
                "basis_label": BASIS_SHORT.get(word or ""),
                "compute_basis": basis.get("compute_label"),
                "bandwidth_basis": basis.get("bandwidth_label"),
                "decode_stranded_share": basis.get("stranded_compute_decode_share"),
                "decode_stranded_share_by_sm_activity": basis.get("stranded_compute_sm_share"),
                "prefill_stranded_share": basis.get("stranded_bandwidth_prefill_share"),
                "prefill_stranded_share_by_dram_activity": basis.get("stranded_bandwidth_dram_share"),
            }
        latency = (current.get("parts") or {}).get("latency") or {}
        if figures["slo_attainment"]["value"] is not None:  # the denominator: every request
            figures["slo_attainment"]["basis"] = attainment_basis(latency)
    trust = list(((current or {}).get("trust") or {}).get("labels") or [])
    return {
        "window": (current or {}).get("window"),
        "previous_window": (previous or {}).get("window"),
        "figures": figures,
        "gpu_time": gpu_time(current),
        "money": money_sentence(current, fleet_gpus),
        "trust": trust,
        "notes": list(((current or {}).get("trust") or {}).get("notes") or []),
        "empty": all(fig["value"] is None for fig in figures.values()),
    }
