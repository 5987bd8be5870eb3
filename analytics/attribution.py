"""Phase attribution: where every GPU sample interval's time and energy went.

For every sample interval of a GPU — ``(previous ts_s, ts_s]`` of two consecutive ``gpu_samples`` rows
of one ``(node, source, device, index)``; the first sample of the window only opens the first
interval — the seconds the GPU spent in

* ``prefill_s`` / ``decode_s``: GPU-busy time of prefill-only / decode-only iterations,
* ``mixed_prefill_s`` / ``mixed_decode_s``: GPU-busy time of mixed iterations, split by their work
  (prefill tokens vs decode sequences: each is one row of the forward pass's matmuls),
* ``host_s``: engine host time inside an iteration with the GPU idle (simulated: the iteration's
  ``modeled_s − compute_s``, at its start; emulated: the step's wall time beyond ``modeled_s``),
* ``gap_s``: between iterations while the owning worker had a request in flight (host-bound),
* ``idle_s``: no work at all,
* ``unsampled_s``: inside a gap in the GPU's samples (no sample for longer than its gap threshold,
  see :mod:`analytics.intervals`): not known, never idle,

summing to ``interval_s``; and the interval's energy (the energy counter's rise; integrated power,
flagged ``estimated``, where the counter is missing or went backwards). A per-GPU power model
(non-negative least squares of interval energy on the state seconds) apportions each interval's
measured energy, less its rise across sample gaps (which is the unsampled state's), to its states,
so the attributed energy sums to the measured energy exactly.

Everything runs as set-based SQL in DuckDB: the state seconds of an interval are differences of
cumulative state-time functions evaluated at the interval's two ends by ``ASOF`` joins (no
interval × iteration product), and the per-GPU / pool / hour tables are SQL aggregates; only
aggregates reach Python. Formulas and their sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.intervals import (
    GAP_MIN_S,
    GAP_PERIODS,
    IntervalTable,
    buckets_sql,
    choose_bucket_s,
    has_long_iterations,
    intervals_sql,
    registered_islands,
)
from analytics.iteration_groups import registered_groups
from analytics.trust import ESTIMATED, HOST_BOUND, Trust
from analytics.window import Window

# Fine states of an interval (seconds), in report order; they sum to interval_s on attributed GPUs.
STATES: tuple[str, ...] = (
    "prefill_s",
    "decode_s",
    "mixed_prefill_s",
    "mixed_decode_s",
    "host_s",
    "gap_s",
    "idle_s",
    "unsampled_s",
)
# The power model's regressors: each fine state maps to one coefficient (W). Host-bound time (the GPU
# runs no kernel while the host works) shares the idle coefficient: it co-occurs with decode in a
# nearly fixed proportion (host time per iteration), so a separate term would be unidentifiable and
# would trade watts with decode from one bucket width to the next.
MODEL_TERMS: tuple[str, ...] = ("prefill", "decode", "idle")
_TERM_OF: dict[str, str] = {
    "prefill_s": "prefill",
    "mixed_prefill_s": "prefill",
    "decode_s": "decode",
    "mixed_decode_s": "decode",
    "host_s": "idle",
    "gap_s": "idle",
    "idle_s": "idle",
}
# The states the power model apportions a row's energy to: all but unsampled time, whose energy is
# the counter's rise across the gap (``energy_unsampled_j`` of the row), not a share of a fit.
_MODELLED_STATES: tuple[str, ...] = tuple(s for s in STATES if s in _TERM_OF)
_GPU_KEY = ("node", "source", "device", "index")


def gpu_intervals(con: duckdb.DuckDBPyConnection, window: Window) -> pd.DataFrame:
    """One row per GPU sample interval of ``window``: the GPU (node, source, device, index, uuid,
    parent_uuid, mig_instance_id, name, worker, role), ``t0_s``/``t1_s``/``interval_s``/``hour_s``,
    ``attributed`` (whether the GPU's work is known), the state seconds ``prefill_s``, ``decode_s``,
    ``mixed_prefill_s``, ``mixed_decode_s``, ``host_s``, ``gap_s``, ``idle_s`` (NULL where not
    attributed), ``unsampled_s`` (seconds in a sample gap, on every row), ``sm_active_pct`` (utilization % where the source has no SM activity:
    ``sm_source`` says which), ``gpu_util_pct``, ``dram_active_pct``, ``power_w``, ``energy_j`` and
    ``energy_source`` (``counter``, ``integrated-reset``, ``integrated-no-counter``, ``mig-parent``:
    a MIG instance, whose energy is its physical GPU's), ``energy_unsampled_j`` (of ``energy_j``, the
    rise across sample gaps), ``trust``, ``host_bound``, ``samples``, ``excess_s``, ``sample_gaps``
    (gaps ending in the row), ``longest_gap_s``, ``gap_threshold_s`` (the GPU's), ``power_limit_w``.

    Exact per sample, and sorted per GPU: for inspection and small windows. The breakdowns run on
    :func:`gpu_buckets` (same columns) and aggregate in SQL without pulling rows into pandas."""
    with registered_islands(con, window) as islands:
        sql, params = intervals_sql(window, islands)
        return con.execute(sql + ' ORDER BY o.node, o.source, o.device, o."index", o.ts_s', params).df()


def gpu_buckets(
    con: duckdb.DuckDBPyConnection, window: Window, bucket_s: float | None = None
) -> pd.DataFrame:
    """One row per GPU and grid bucket of ``bucket_s`` seconds (None: :func:`choose_bucket_s`), with
    the columns of :func:`gpu_intervals`; ``samples`` counts the samples in the bucket and
    ``excess_s`` the iteration seconds beyond its time that were scaled away (overlapping iterations,
    clock skew). What :func:`phase_breakdown` aggregates."""
    width = choose_bucket_s(con, window) if bucket_s is None else bucket_s
    with registered_islands(con, window) as islands:
        long_iterations = has_long_iterations(con, window, width)
        sql, params = buckets_sql(window, width, islands, long_iterations=long_iterations)
        return con.execute(f'SELECT * FROM ({sql}) ORDER BY node, source, device, "index", t0_s', params).df()


# -- the power model ------------------------------------------------------------------------------


@dataclass(slots=True)
class PowerFit:
    """Non-negative least squares fit of interval energy (J) on the state seconds of one GPU:
    ``energy_j ≈ Σ coef_w[term] × seconds[term]`` over ``MODEL_TERMS``."""

    coef_w: dict[str, float | None]
    r2: float | None
    intervals: int
    rmse_j: float | None
    notes: list[str] = field(default_factory=list)
    #: the upper bound of every coefficient (W; None: none known) and where it comes from
    bound_w: float | None = None
    bound_source: str | None = None
    #: states with time whose power is not fitted (too little time, none pooled): their seconds
    #: carry no energy of their own, their intervals' energy goes to the other states
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "coef_w": dict(self.coef_w),
            "r2": self.r2,
            "intervals": self.intervals,
            "rmse_j": self.rmse_j,
            "notes": list(self.notes),
            "bound_w": self.bound_w,
            "bound_source": self.bound_source,
            "missing": list(self.missing),
        }


def nnls_gram(gram: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares from the normal equations: the minimiser of
    ``b'Gb − 2b'X'y`` over ``b ≥ 0`` (:func:`bounded_lsq_gram` with no upper bounds)."""
    k = len(xty)
    return bounded_lsq_gram(gram, xty, np.zeros(k), np.full(k, np.inf))


def bounded_lsq_gram(gram: np.ndarray, xty: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Exact bounded least squares from the normal equations: the minimiser of ``b'Gb − 2b'X'y``
    over ``lo ≤ b ≤ hi`` (``hi`` may be ``inf``; ``lo = hi`` fixes a coefficient). The optimum is
    the unconstrained least-squares solution of its free coefficients with the others at a bound
    (Lawson & Hanson 1974, ch. 23; Stark & Parker 1995, "Bounded-variable least-squares"), so
    trying every assignment of each coefficient to its lower bound, its upper bound or free finds
    it exactly: at most 3^k small solves for the handful of terms here."""
    k = len(xty)
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    choices = tuple(
        (0,) if lo[i] >= hi[i] else (0, 2) if not math.isfinite(hi[i]) else (0, 1, 2) for i in range(k)
    )
    best: np.ndarray | None = None
    best_obj = math.inf
    for at_hi, free, fixed, sub, cross in _assignments(choices):
        b = np.where(at_hi, hi, lo)
        if len(free):
            rhs = xty[free] - gram[cross] @ b[fixed]
            sol, *_ = np.linalg.lstsq(gram[sub], rhs, rcond=None)
            tol = 1e-9 * np.maximum(1.0, np.abs(sol))
            lo_f, hi_f = lo[free], hi[free]
            if (sol < lo_f - tol).any() or (sol > hi_f + tol).any():
                continue
            b[free] = np.clip(sol, lo_f, hi_f)
        obj = float(b @ gram @ b - 2.0 * b @ xty)
        if best is None or obj < best_obj - 1e-12 * max(1.0, abs(best_obj)):
            best, best_obj = b, obj
    return best


@functools.cache
def _assignments(
    choices: tuple[tuple[int, ...], ...],
) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, Any, Any], ...]:
    """Every assignment of :func:`bounded_lsq_gram`'s coefficients to a choice (0 lower bound, 1
    upper, 2 free), in its order: the upper-bound mask, the free and fixed indices and the index
    tuples of the free × free and free × fixed blocks of the Gram matrix (the same per ``choices``,
    so built once)."""
    out = []
    for assign in product(*choices):
        a = np.array(assign)
        free = np.flatnonzero(a == 2)
        fixed = np.flatnonzero(a != 2)
        out.append((a == 1, free, fixed, np.ix_(free, free), np.ix_(free, fixed)))
    return tuple(out)


# A term with less than this share of a GPU's fitted seconds, or in fewer rows, is not fitted on
# that GPU: a second or two of prefill in minutes of idle lets the fit trade thousands of watts
# for a few joules of noise (3 kW "prefill power" on a 700 W GPU).
MIN_TERM_SHARE = 0.01
MIN_TERM_ROWS = 3
# Bound on a coefficient where neither the power limit nor the spec TDP is known: the highest
# power observed (sample power, interval mean power) times this margin.
OBSERVED_POWER_MARGIN = 1.25


def _gram(stats: dict[str, float], k: int) -> tuple[np.ndarray, np.ndarray]:
    gram = np.array([[stats[f"x{i}x{j}" if i <= j else f"x{j}x{i}"] for j in range(k)] for i in range(k)])
    return gram, np.array([stats[f"x{i}y"] for i in range(k)])


def _thin_terms(stats: dict[str, float], terms: tuple[str, ...]) -> dict[str, str]:
    """The terms with time but too little to fit (see ``MIN_TERM_SHARE``), each with the reason."""
    total = sum(stats.get(f"sx{i}", 0.0) for i in range(len(terms)))
    thin: dict[str, str] = {}
    for i, t in enumerate(terms):
        sx, nz = stats.get(f"sx{i}", 0.0), int(stats.get(f"nz{i}", 0))
        if sx > 0 and (sx < MIN_TERM_SHARE * total or nz < MIN_TERM_ROWS):
            thin[t] = (
                f"{sx:.2f} s of {t} in {nz} intervals ({sx / total:.2%} of the {total:.0f} s fitted) is too "
                f"little to fit (< {MIN_TERM_SHARE:.0%} or < {MIN_TERM_ROWS} intervals)"
            )
    return thin


def _fit(
    stats: dict[str, float],
    terms: tuple[str, ...],
    bound_w: float | None = None,
    bound_source: str | None = None,
    pooled: dict[str, tuple[float, str]] | None = None,
) -> PowerFit:
    """The power fit of one GPU from its SQL aggregates (sums of products of the regressors):
    bounded least squares, every coefficient in ``[0, bound_w]``. A term with too little time
    (:func:`_thin_terms`) is not fitted: it takes its ``pooled`` estimate (W, and where it comes
    from) when there is one, else it is left out (coefficient None, named in ``missing``)."""
    n = int(stats["n"])
    notes: list[str] = []
    missing: list[str] = []
    if n == 0:
        return PowerFit(
            {t: None for t in terms},
            None,
            0,
            None,
            ["no interval with a known energy"],
            bound_w,
            bound_source,
        )
    k = len(terms)
    gram, xty = _gram(stats, k)
    present = [i for i in range(k) if gram[i, i] > 1e-12]
    thin = _thin_terms(stats, terms)
    cap = math.inf if bound_w is None else bound_w
    lo, hi = np.zeros(k), np.full(k, cap)
    fitted: list[int] = []
    coef: dict[str, float | None] = {}
    for i, t in enumerate(terms):
        coef[t] = None
        if i not in present:
            hi[i] = 0.0
            notes.append(f"no {t} time in the window: its power is not fitted")
        elif t in thin and pooled and t in pooled:
            lo[i] = hi[i] = min(pooled[t][0], cap)
            notes.append(f"{thin[t]}: {t} power set to {lo[i]:.1f} W, {pooled[t][1]}")
        elif t in thin:
            hi[i] = 0.0
            missing.append(
                f"{thin[t]}, on this GPU and on every GPU of its model: {t} power not fitted; the energy "
                f"of the intervals with {t} time goes to their other states"
            )
        else:
            fitted.append(i)
    b = bounded_lsq_gram(gram, xty, lo, hi)
    for i, t in enumerate(terms):
        if i in present and hi[i] > 0:
            coef[t] = float(b[i])
        if i in fitted and math.isfinite(cap) and b[i] >= cap * (1 - 1e-9):
            notes.append(
                f"{t} power at its bound {cap:.0f} W ({bound_source}): the unbounded fit exceeds what the GPU can draw"
            )
    yy, sy = stats["yy"], stats["sy"]
    sse = max(0.0, yy - 2.0 * float(b @ xty) + float(b @ gram @ b))
    sst = yy - sy * sy / n
    r2 = 1.0 - sse / sst if sst > 1e-12 and n > 1 else None
    if r2 is None:
        notes.append("R² undefined: interval energies do not vary")
    return PowerFit(coef, r2, n, math.sqrt(sse / n), notes, bound_w, bound_source, missing)


# -- the breakdown --------------------------------------------------------------------------------


@dataclass(slots=True)
class PhaseBreakdown:
    """Where the window's GPU time and energy went.

    ``per_gpu``: one row per GPU (node, source, device, index, uuid, name, role, worker); ``per_pool``:
    one row per role (pool); ``per_hour``: one row per hour and role. Each has ``interval_s`` (GPU
    seconds covered by sample intervals), the state seconds (``STATES``), their fractions
    (``frac_<state>``, summing to 1 on attributed time), ``energy_j`` (measured),
    ``energy_<state>_j`` (apportioned by the power model; they sum to ``energy_j``),
    ``energy_estimated_j`` (of ``energy_j``, integrated from power) and ``unattributed_s`` /
    ``energy_unattributed_j`` (GPUs with no serving telemetry). ``fits``: the power model per GPU
    (keyed ``node|source|device|index``). ``missing``: what could not be computed, and why.
    ``raw``: the GPU × role × hour sums all tables come from (with the idle-split sums that
    :func:`analytics.bimodal.idle_split` reads); not part of ``to_dict``. ``gaps``: per GPU (same
    keys) with gaps in its samples, ``gaps`` (how many), ``gap_s`` (its unsampled seconds),
    ``longest_s`` and ``threshold_s`` (its gap threshold); ``sample_gaps`` in ``to_dict``."""

    window: Window
    per_gpu: pd.DataFrame
    per_pool: pd.DataFrame
    per_hour: pd.DataFrame
    fits: dict[str, PowerFit]
    trust: Trust
    missing: list[str] = field(default_factory=list)
    raw: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    gaps: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.describe(),
            "per_gpu": _records(self.per_gpu),
            "per_pool": _records(self.per_pool),
            "per_hour": _records(self.per_hour),
            "fits": {k: v.to_dict() for k, v in self.fits.items()},
            "sample_gaps": {k: dict(v) for k, v in self.gaps.items()},
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


def _json_value(v: Any) -> Any:
    """A table cell as a JSON value: numpy scalars as Python ones, NaN / NA as None."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_json_value(x) for x in v]
    return v


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A result table as JSON-ready records."""
    return [{k: _json_value(v) for k, v in rec.items()} for rec in df.to_dict(orient="records")]


def gpu_key(node: str, source: str, device: str, index: int | None) -> str:
    """The key of a GPU in ``PhaseBreakdown.fits``: ``node|source|device|index``."""
    return f"{node}|{source}|{device}|{'' if index is None or pd.isna(index) else int(index)}"


def _fit_stats_sql(table: str) -> str:
    """Per GPU: the count, Σy, Σy² and the sums of products of the regressors (x_i x_j, x_i y) of
    the intervals with a known energy on attributed time — all the least-squares fit needs."""
    xs = [
        "coalesce(prefill_s, 0) + coalesce(mixed_prefill_s, 0)",
        "coalesce(decode_s, 0) + coalesce(mixed_decode_s, 0)",
        "coalesce(host_s, 0) + coalesce(gap_s, 0) + coalesce(idle_s, 0)",
    ]
    # y: the energy of the sampled part (the rise across a sample gap is not the states')
    y = "(energy_j - coalesce(energy_unsampled_j, 0))"
    ok = "FILTER (WHERE attributed AND energy_j IS NOT NULL AND interval_s > unsampled_s)"
    parts = []
    for i in range(len(xs)):
        for j in range(i, len(xs)):
            parts.append(f"sum(({xs[i]}) * ({xs[j]})) {ok} AS x{i}x{j}")
        parts.append(f"sum(({xs[i]}) * {y}) {ok} AS x{i}y")
        parts.append(f"sum({xs[i]}) {ok} AS sx{i}")  # the term's seconds, and its rows: is it enough to fit?
        parts.append(f"count(*) FILTER (WHERE attributed AND energy_j IS NOT NULL AND {xs[i]} > 0) AS nz{i}")
    return f"""
SELECT node, source, device, "index", count(*) {ok} AS n, sum({y} * {y}) {ok} AS yy,
       sum({y}) {ok} AS sy, bool_or(attributed) AS attributed, {", ".join(parts)},
       any_value(name) AS name, max(power_w) AS max_power_w,
       max({y} / nullif(interval_s - unsampled_s, 0)) {ok} AS max_mean_w, max(power_limit_w) AS power_limit_w,
       sum(sample_gaps) AS sample_gaps, sum(unsampled_s) AS unsampled_s, max(longest_gap_s) AS longest_gap_s,
       max(gap_threshold_s) AS gap_threshold_s
FROM {table}
GROUP BY ALL
ORDER BY node, source, device, "index"  -- the fits (and their notes) in one order on every run
"""


def _spec_tdp_w(name: Any, device: Any) -> tuple[float, str] | None:
    """The spec TDP of a GPU model this project knows: by its NVML name (``NVIDIA H100 80GB HBM3``,
    also with a suffix such as `` (emulated)``) or its device spec (``emulated:h100-sxm``)."""
    from serving.devices.gpu_specs import GPU_SPECS

    for spec in GPU_SPECS.values():
        by_name = isinstance(name, str) and (name.strip().lower() + " ").startswith(spec.name.lower() + " ")
        if by_name or str(device).rsplit(":", 1)[-1] == spec.key:
            return spec.tdp_w, f"the {spec.name} spec TDP"
    return None


def _power_bounds(df: pd.DataFrame) -> dict[str, tuple[float | None, str | None]]:
    """Per GPU (``gpu_key``) of the :func:`_fit_stats_sql` rows ``df``: the most a power coefficient
    may be (W) and where it comes from — the highest power limit of its samples in the window, else
    its spec TDP, else the highest power observed (sample power, interval mean power) ×
    ``OBSERVED_POWER_MARGIN``; (None, None) where nothing is known."""
    out: dict[str, tuple[float | None, str | None]] = {}
    for rec in df.to_dict(orient="records"):
        key = gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])
        seen = [
            v for v in (rec.get("max_power_w"), rec.get("max_mean_w")) if v is not None and not pd.isna(v)
        ]
        observed = max(seen) if seen else None
        limit, tdp = rec.get("power_limit_w"), _spec_tdp_w(rec.get("name"), rec["device"])
        if limit is not None and not pd.isna(limit) and limit > 0:
            bound, why = float(limit), "the GPU's power limit"
        elif tdp is not None:
            bound, why = tdp
        elif observed is not None and observed > 0:
            bound, why = (
                observed * OBSERVED_POWER_MARGIN,
                f"the highest power observed × {OBSERVED_POWER_MARGIN:g}",
            )
        else:
            bound, why = None, None
        out[key] = (bound, why)
    return out


_GAP_STAT_COLS = ("sample_gaps", "unsampled_s", "longest_gap_s", "gap_threshold_s")


def _sample_gaps(stats: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per GPU (``gpu_key``) with a gap in its samples, from the :func:`_fit_stats_sql` rows:
    ``gaps`` (how many), ``gap_s`` (their total: the GPU's unsampled seconds), ``longest_s`` and
    ``threshold_s`` (its gap threshold, see :func:`analytics.intervals.gap_threshold_sql`)."""
    out: dict[str, dict[str, float]] = {}
    for rec in stats.to_dict(orient="records"):
        n = rec.get("sample_gaps")
        if n is None or pd.isna(n) or n <= 0:
            continue
        out[gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])] = {
            "gaps": int(n),
            "gap_s": float(rec["unsampled_s"]),
            "longest_s": float(rec["longest_gap_s"]),
            "threshold_s": float(rec["gap_threshold_s"]),
        }
    return out


def _fits(stats: pd.DataFrame) -> dict[str, PowerFit]:
    """The bounded power fit of every attributed GPU from its :func:`_fit_stats_sql` row. A term
    too thin to fit on one GPU takes the estimate of a fit on the pooled sums of every GPU of the
    same model (name) where it is not thin there, else is left out."""
    df = stats[
        stats["attributed"].fillna(False).astype(bool)
    ]  # no states to fit on: reported as unattributed
    bounds = _power_bounds(df)
    skip = {*_GPU_KEY, "attributed", "name", "max_power_w", "max_mean_w", "power_limit_w", *_GAP_STAT_COLS}
    gpus = []
    for rec in df.to_dict(orient="records"):
        stats = {
            k: float(v) if v is not None and not pd.isna(v) else 0.0 for k, v in rec.items() if k not in skip
        }
        gpus.append((gpu_key(rec["node"], rec["source"], rec["device"], rec["index"]), rec["name"], stats))
    pooled_fits: dict[Any, PowerFit] = {}
    fits: dict[str, PowerFit] = {}
    for key, name, stats in gpus:
        bound_w, why = bounds[key]
        pooled: dict[str, tuple[float, str]] = {}
        if _thin_terms(stats, MODEL_TERMS) and stats["n"] > 0:
            same = [s for _, n, s in gpus if n == name]
            if len(same) > 1:
                if name not in pooled_fits:
                    total = {k: sum(s[k] for s in same) for k in stats}
                    pooled_fits[name] = _fit(total, MODEL_TERMS, bound_w, why)
                pf = pooled_fits[name]
                pooled = {
                    t: (w, f"from the pooled fit of the {len(same)} GPUs named {name!r}")
                    for t, w in pf.coef_w.items()
                    if w is not None
                }
        fits[key] = _fit(stats, MODEL_TERMS, bound_w, why, pooled)
    return fits


def _coef_frame(fits: dict[str, PowerFit], stats: pd.DataFrame) -> pa.Table:
    """The fitted power per state (``w_<term>``, 0 where not fitted) of every GPU of ``fits``, keyed
    by the GPU's identity columns (``node, source, device, index``: from its :func:`_fit_stats_sql`
    row in ``stats``), for the aggregate's join."""
    keys: dict[str, list[Any]] = {k: [] for k in _GPU_KEY}
    w: dict[str, list[float]] = {f"w_{t}": [] for t in MODEL_TERMS}
    for node, source, device, index in zip(*(stats[k] for k in _GPU_KEY), strict=True):
        fit = fits.get(gpu_key(node, source, device, index))
        if fit is None:
            continue
        for k, v in zip(_GPU_KEY, (node, source, device, index), strict=True):
            keys[k].append(v)
        for t in MODEL_TERMS:
            w[f"w_{t}"].append(float(fit.coef_w[t] or 0.0))
    return pa.table(
        {
            "node": pa.array(keys["node"], pa.string()),
            "source": pa.array(keys["source"], pa.string()),
            "device": pa.array(keys["device"], pa.string()),
            "index": pa.array([None if pd.isna(i) else int(i) for i in keys["index"]], pa.int64()),
            **{k: pa.array(v, pa.float64()) for k, v in w.items()},
        }
    )


# GPU-time categories (idle split): they partition attributed time, as the states do.
CATEGORIES: tuple[str, ...] = (
    "productive_prefill",
    "stranded_bandwidth",
    "productive_decode",
    "stranded_compute",
    "host_bound",
    "idle",
    "unsampled",
)
# the categories that are states of their own (their sums are the breakdown's state columns)
_STATE_CATEGORIES = ("idle", "unsampled")


def _aggregate_sql(table: str) -> str:
    """Per GPU × role × hour sums: state seconds, the apportioned energy of every state, the
    GPU-time categories (time and energy) and the sums behind the utilization − SM activity gap.

    Unsampled time is a state of every GPU, attributed or not (no GPU's work is known there): so
    ``attributed_s`` (what the state fractions divide by) is the time whose state is known — an
    attributed GPU's time and any GPU's unsampled time — and ``unattributed_s`` the sampled time of
    GPUs without serving telemetry; they sum to ``interval_s``. A row's energy across its sample
    gaps (``energy_unsampled_j``) is the unsampled state's; the power model apportions the rest."""
    weights = " + ".join(f"w_{_TERM_OF[s]} * coalesce({s}, 0)" for s in _MODELLED_STATES)
    sampled_j = "(energy_j - coalesce(energy_unsampled_j, 0))"
    e_cols = ", ".join(
        [
            f"CASE WHEN attributed AND energy_j IS NOT NULL THEN {sampled_j} * "
            f"CASE WHEN wsum > 0 THEN w_{_TERM_OF[s]} * coalesce({s}, 0) / wsum "
            f"ELSE coalesce({s}, 0) / nullif(interval_s - unsampled_s, 0) END END AS e_{s[:-2]}"
            for s in _MODELLED_STATES
        ]
        + ["CASE WHEN energy_j IS NOT NULL THEN coalesce(energy_unsampled_j, 0) END AS e_unsampled"]
    )
    e_parts = ", ".join(f"sum(e_{s[:-2]}) AS energy_{s[:-2]}_j" for s in STATES)
    s_parts = ", ".join(f"sum({s}) AS {s}" for s in STATES)
    return f"""
WITH iv AS (
    SELECT i.*, c.* EXCLUDE (node, source, device, "index"), coalesce({weights}, 0.0) AS wsum,
           coalesce(i.prefill_s, 0) + coalesce(i.mixed_prefill_s, 0) AS p_s,
           coalesce(i.decode_s, 0) + coalesce(i.mixed_decode_s, 0) AS d_s,
           i.interval_s - i.unsampled_s AS sampled_s  -- the activities are of this time
    FROM {table} i
    LEFT JOIN pl_coef c ON i.node = c.node AND i.source = c.source AND i.device = c.device
     AND i."index" IS NOT DISTINCT FROM c."index"
),
ev AS (  -- per interval: apportioned state energies; SM / DRAM activity during GPU-busy time
    SELECT *, {e_cols},
           CASE WHEN p_s + d_s > 0 AND sm_active_pct IS NOT NULL THEN least(1.0, sm_active_pct / 100.0 * sampled_s / (p_s + d_s)) END AS sm_busy,
           CASE WHEN p_s + d_s > 0 AND dram_active_pct IS NOT NULL THEN least(1.0, dram_active_pct / 100.0 * sampled_s / (p_s + d_s)) END AS dram_busy
    FROM iv
),
cv AS (
    SELECT *, coalesce(e_prefill, 0) + coalesce(e_mixed_prefill, 0) AS ep_j,
           coalesce(e_decode, 0) + coalesce(e_mixed_decode, 0) AS ed_j
    FROM ev
)
SELECT node, source, device, "index", any_value(uuid) AS uuid, any_value(name) AS name,
       coalesce(role, 'unknown') AS role, any_value(worker) AS worker, hour_s,
       count(*) AS intervals, sum(interval_s) AS interval_s,
       sum(CASE WHEN attributed THEN interval_s ELSE unsampled_s END) AS attributed_s,
       sum(CASE WHEN NOT attributed THEN interval_s - unsampled_s ELSE 0 END) AS unattributed_s,
       {s_parts},
       sum(energy_j) AS energy_j,
       sum(CASE WHEN energy_source LIKE 'integrated%' THEN energy_j ELSE 0 END) AS energy_estimated_j,
       sum(CASE WHEN NOT attributed THEN {sampled_j} ELSE 0 END) AS energy_unattributed_j,
       {e_parts},
       sum(p_s * coalesce(dram_busy, 1.0)) FILTER (WHERE attributed) AS productive_prefill_s,
       sum(p_s * (1.0 - dram_busy)) FILTER (WHERE attributed) AS stranded_bandwidth_s,
       sum(d_s * coalesce(sm_busy, 1.0)) FILTER (WHERE attributed) AS productive_decode_s,
       sum(d_s * (1.0 - sm_busy)) FILTER (WHERE attributed) AS stranded_compute_s,
       sum(coalesce(host_s, 0) + coalesce(gap_s, 0)) FILTER (WHERE attributed) AS host_bound_s,
       sum(ep_j * coalesce(dram_busy, 1.0)) FILTER (WHERE attributed) AS energy_productive_prefill_j,
       sum(ep_j * (1.0 - dram_busy)) FILTER (WHERE attributed) AS energy_stranded_bandwidth_j,
       sum(ed_j * coalesce(sm_busy, 1.0)) FILTER (WHERE attributed) AS energy_productive_decode_j,
       sum(ed_j * (1.0 - sm_busy)) FILTER (WHERE attributed) AS energy_stranded_compute_j,
       sum(coalesce(e_host, 0) + coalesce(e_gap, 0)) FILTER (WHERE attributed) AS energy_host_bound_j,
       sum(CASE WHEN sm_busy IS NULL THEN d_s ELSE 0 END) FILTER (WHERE attributed) AS decode_activity_unknown_s,
       sum(CASE WHEN dram_busy IS NULL THEN p_s ELSE 0 END) FILTER (WHERE attributed) AS prefill_activity_unknown_s,
       sum(sampled_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS both_s,
       sum(gpu_util_pct * sampled_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS util_pct_s,
       sum(sm_active_pct * sampled_s) FILTER (WHERE sm_source = 'sm_active' AND gpu_util_pct IS NOT NULL) AS sm_pct_s,
       count(*) FILTER (WHERE energy_j IS NULL AND energy_source IS DISTINCT FROM 'mig-parent') AS no_energy_intervals,
       count(*) FILTER (WHERE energy_source = 'integrated-reset') AS counter_resets,
       count(*) FILTER (WHERE energy_source = 'integrated-no-counter') AS no_counter_intervals,
       count(*) FILTER (WHERE energy_source = 'mig-parent') AS mig_instance_intervals,
       count(*) FILTER (WHERE sm_source = 'gpu_util') AS util_fallback_intervals,
       count(*) FILTER (WHERE host_bound) AS host_bound_intervals,
       list(DISTINCT trust) AS trusts
FROM cv
GROUP BY node, source, device, "index", coalesce(role, 'unknown'), hour_s
"""


_SUM_COLS = (
    "intervals",
    "interval_s",
    "attributed_s",
    "unattributed_s",
    *STATES,
    "energy_j",
    "energy_estimated_j",
    "energy_unattributed_j",
    *[f"energy_{s[:-2]}_j" for s in STATES],
)
# sums kept for the idle split (IdleSplit), not shown in the breakdown's tables
CATEGORY_SUM_COLS = (
    *[f"{c}_s" for c in CATEGORIES if c not in _STATE_CATEGORIES],
    *[f"energy_{c}_j" for c in CATEGORIES if c not in _STATE_CATEGORIES],
    "decode_activity_unknown_s",
    "prefill_activity_unknown_s",
    "both_s",
    "util_pct_s",
    "sm_pct_s",
)


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    """Add the state fractions (of ``attributed_s``, the time whose state is known; NaN where none)."""
    df = df.copy()
    denom = df["attributed_s"].where(df["attributed_s"] > 0)
    for s in STATES:
        df[f"frac_{s[:-2]}"] = df[s] / denom
    return df


def _iteration_issues(
    con: duckdb.DuckDBPyConnection, window: Window, table: str, exact: bool, groups: pa.Table | None = None
) -> dict[str, float]:
    """Counts of bad iteration rows: ones with no GPU uuid, ones of GPUs with no samples, ones more
    than 1 s outside their GPU's sampled time (clock skew between engine and sampler), ones ending
    before they start; overlapping ones on one GPU (counted with a sort on sample intervals, as the
    seconds scaled away on buckets); and ``lagged``, the iterations with ``lag_s > 0``.

    The window's :func:`~analytics.iteration_groups.iteration_groups` (``groups``, else computed
    here: one grouped scan of its iterations), summed per GPU uuid, give all but two: the rows outside
    their GPU's samples are counted row by row only for the GPUs whose earliest end or latest start
    says some are (none, in data without clock skew), and the overlaps (sample intervals only) take
    a sort of the iterations."""
    i_pred, i_par = window.node_sql("i.node")
    w = [window.start_s, window.end_s]
    span = f"SELECT node, uuid, min(t0_s) AS t0, max(t1_s) AS t1 FROM {table} WHERE uuid IS NOT NULL GROUP BY ALL"
    with registered_groups(con, window, groups) as g:
        row = con.execute(
            f"""
WITH per AS (  -- per GPU uuid (NULL: the rows without one) of the iterations overlapping the window
    SELECT node, gpu_uuid, sum(n) AS n, sum(lagged) AS lagged, sum(negative) AS negative,
           min(min_end_s) AS min_end_s, max(max_start_s) AS max_start_s
    FROM {g} WHERE overlaps_window
    GROUP BY node, gpu_uuid
),
span AS ({span})
SELECT coalesce(sum(p.n) FILTER (WHERE p.gpu_uuid IS NULL), 0),
       coalesce(sum(p.negative), 0),
       count(DISTINCT p.gpu_uuid) FILTER (WHERE sp.uuid IS NULL AND p.gpu_uuid IS NOT NULL),
       coalesce(sum(p.n) FILTER (WHERE sp.uuid IS NULL AND p.gpu_uuid IS NOT NULL), 0),
       coalesce(sum(p.lagged), 0),
       count(*) FILTER (WHERE sp.uuid IS NOT NULL AND (p.min_end_s < sp.t0 - 1.0 OR p.max_start_s > sp.t1 + 1.0)),
       (SELECT coalesce(sum(excess_s), 0.0) FROM {table}),
       (SELECT count(*) FILTER (WHERE excess_s > 1e-9) FROM {table})
FROM per p LEFT JOIN span sp ON p.node = sp.node AND p.gpu_uuid = sp.uuid
"""
        ).fetchall()[0]  # every row fetched: the relation is unregistered on this connection next
    no_uuid, negative, unsampled_gpus, unsampled_its, lagged, suspect, excess_s, excess_n = row
    outside = 0
    if suspect:
        outside = con.execute(
            f"""
WITH span AS ({span})
SELECT count(*) FROM iterations i JOIN span sp ON i.node = sp.node AND i.gpu_uuid = sp.uuid
WHERE {i_pred} AND i.end_s > ? AND i.start_s < ? AND (i.end_s < sp.t0 - 1.0 OR i.start_s > sp.t1 + 1.0)""",
            [*i_par, *w],
        ).fetchone()[0]
    overlapping = 0
    if exact:
        overlapping = con.execute(
            f"""
SELECT count(*) FROM (
    SELECT i.gpu_uuid, i.start_s,
           max(i.end_s) OVER (PARTITION BY i.node, i.gpu_uuid ORDER BY i.start_s, i.end_s
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM iterations i WHERE {i_pred} AND i.end_s > ? AND i.start_s < ?)
WHERE prev_end_s > start_s + 1e-9 AND gpu_uuid IS NOT NULL""",
            [*i_par, *w],
        ).fetchone()[0]
    return {
        "overlapping": overlapping or 0,
        "no_uuid": no_uuid or 0,
        "outside_samples": outside or 0,
        "negative": negative or 0,
        "unsampled_gpus": unsampled_gpus or 0,
        "unsampled_iterations": unsampled_its or 0,
        "excess_s": excess_s or 0,
        "excess_buckets": excess_n or 0,
        "lagged": lagged or 0,
    }


def _issue_notes(issues: dict[str, int]) -> list[str]:
    """What the bad iteration rows counted by :func:`_iteration_issues` mean for the result."""
    notes: list[str] = []
    if issues["overlapping"]:
        notes.append(
            f"{issues['overlapping']} iterations overlap an earlier one on the same GPU: clipped to "
            "the time after it (each GPU second counted once)"
        )
    if issues["excess_s"] > 1e-9:
        notes.append(
            f"{issues['excess_s']:.3f} s of iteration time beyond their bucket's sampled time in "
            f"{issues['excess_buckets']} buckets (overlapping iterations or clock skew): scaled away, "
            "each GPU second counted once"
        )
    if issues["no_uuid"]:
        notes.append(f"{issues['no_uuid']} iterations carry no gpu_uuid: not attributed to any GPU")
    if issues["unsampled_gpus"]:
        notes.append(
            f"{issues['unsampled_gpus']} GPU uuid(s) ran {issues['unsampled_iterations']} iterations in the "
            "window but have no samples in it: their time and energy are not in any interval"
        )
    if issues["negative"]:
        notes.append(f"{issues['negative']} iterations end before they start: ignored")
    if issues["outside_samples"]:
        notes.append(
            f"{issues['outside_samples']} iterations lie more than 1 s outside their GPU's samples "
            "(clock skew between engine and sampler?): they fall in no interval"
        )
    return notes


def _trust_from(df: pd.DataFrame, trust: Trust, lagged: int, bucket_note: str) -> None:
    labels = {t for ts in df["trusts"] for t in (ts if ts is not None else [])}
    for label in sorted(labels):
        trust.add(label)
    if df["energy_estimated_j"].sum() > 0:
        trust.add(
            ESTIMATED,
            "energy integrated from power (trapezoid rule) where the energy counter is missing or went "
            f"backwards: {df['energy_estimated_j'].sum():.1f} J of {df['energy_j'].sum():.1f} J",
        )
    if (df["util_fallback_intervals"] > 0).any():
        trust.add(
            ESTIMATED,
            f"SM activity missing on {int(df['util_fallback_intervals'].sum())} intervals: utilization % "
            "used instead (it reads busy whenever a kernel runs, so it overstates SM activity)",
        )
    if (df["host_bound_intervals"] > 0).any() or lagged > 0:
        trust.add(
            HOST_BOUND,
            f"{int(df['host_bound_intervals'].sum())} sample intervals with host_bound_pct > 0, "
            f"{lagged} iterations with lag_s > 0: the emulated GPU's host could not keep pace",
        )
    trust.notes.append(
        "energy apportioned to states by a per-GPU least-squares power model (each state's power in "
        "[0, the GPU's power limit]); the apportioned energy sums to the measured energy"
    )
    trust.notes.append(bucket_note)


def phase_breakdown(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    bucket_s: float | None = None,
    intervals: IntervalTable | None = None,
    iteration_groups: pa.Table | None = None,
) -> PhaseBreakdown:
    """Time and energy of the window's GPUs by state, per GPU, per pool (role) and per hour, with
    the per-GPU power fits and the trust labels. Runs on grid buckets of ``bucket_s`` seconds
    (None: chosen from the sampling period; 0: exact sample intervals, slow on big windows)
    materialised in a TEMP table — or on ``intervals``, one already open on ``con`` for this window
    and shared by several analyses. Aggregation runs in SQL; only per GPU × role × hour sums reach
    Python. ``iteration_groups``: the window's :func:`analytics.iteration_groups.iteration_groups`
    when already computed (else computed here)."""
    if intervals is not None:
        if intervals.window != window:
            raise ValueError("the interval table given is of another window than the one asked for")
        return _breakdown_from(con, window, intervals, iteration_groups)
    with IntervalTable(con, window, bucket_s) as t:
        return _breakdown_from(con, window, t, iteration_groups)


#: Below this R² a GPU's power model is said to fit poorly.
POOR_FIT_R2 = 0.5
#: More GPUs than this with a poor fit get one note between them, not one each.
POOR_FIT_NOTES_MAX = 3


def poor_fit_notes(fits: Mapping[str, PowerFit]) -> list[str]:
    """Notes on the GPUs whose power model fits poorly (R² < ``POOR_FIT_R2``): one per GPU for a
    few, else one for all of them with the R² range and the worst GPUs named (a fleet's breakdown
    must not bury its other notes under one line per GPU)."""
    poor = sorted((fit.r2, key) for key, fit in fits.items() if fit.r2 is not None and fit.r2 < POOR_FIT_R2)

    def r2_text(r2: float) -> str:
        return f"{r2:.2f}".replace("-0.00", "0.00")  # a rounding's sign is noise

    if len(poor) <= POOR_FIT_NOTES_MAX:
        return [
            f"{key}: power model fits poorly (R² {r2_text(r2)}); energy shares uncertain" for r2, key in poor
        ]
    worst = ", ".join(f"{key} (R² {r2_text(r2)})" for r2, key in poor[:POOR_FIT_NOTES_MAX])
    return [
        f"power model fits poorly on {len(poor)} of {len(fits)} GPUs (R² {r2_text(poor[0][0])}–{r2_text(poor[-1][0])}; "
        f"lowest: {worst}): their energy shares are uncertain; every GPU's fit is in the fit table"
    ]


def _breakdown_from(
    con: duckdb.DuckDBPyConnection, window: Window, iv: IntervalTable, groups: pa.Table | None
) -> PhaseBreakdown:
    table = iv.name
    trust = Trust()
    missing: list[str] = []
    stats = con.execute(_fit_stats_sql(table)).df()
    fits = _fits(stats)
    gaps = _sample_gaps(stats)
    coef = _coef_frame(fits, stats)
    con.register("pl_coef", coef)
    try:
        raw = con.execute(_aggregate_sql(table)).df()
    finally:
        con.unregister("pl_coef")
    issues = _iteration_issues(con, window, table, iv.exact, groups)
    lagged = int(issues["lagged"])
    if raw.empty:
        missing.append(
            f"no GPU sample intervals in the window ({window.label()}): a window needs two samples of a GPU"
        )
        missing += _issue_notes(issues)
        empty = pd.DataFrame(columns=[*_GPU_KEY, "role", *_SUM_COLS])
        return PhaseBreakdown(
            window, _finish(empty), _finish(empty), _finish(empty), fits, trust, missing, raw, gaps
        )
    _trust_from(
        raw,
        trust,
        lagged,
        "per sample interval"
        if iv.exact
        else f"on {iv.bucket_s:g} s buckets (energy counter interpolated at bucket boundaries)",
    )
    keys = [*_GPU_KEY, "uuid", "name", "role", "worker"]
    raw["index"] = raw["index"].astype("Int64")
    per_gpu = raw.groupby([*_GPU_KEY, "role"], dropna=False, as_index=False).agg(
        {"uuid": "first", "name": "first", "worker": "first", **dict.fromkeys(_SUM_COLS, "sum")}
    )[[*keys, *_SUM_COLS]]
    per_pool = raw.groupby("role", as_index=False)[list(_SUM_COLS)].sum()
    per_pool.insert(
        1, "gpus", raw.groupby("role")[list(_GPU_KEY)].apply(lambda g: len(g.drop_duplicates())).values
    )
    per_hour = raw.groupby(["hour_s", "role"], as_index=False)[list(_SUM_COLS)].sum()
    # what is missing, per GPU
    for rec in (
        raw.groupby([*_GPU_KEY], dropna=False)
        .agg(
            unattributed_s=("unattributed_s", "sum"),
            no_energy=("no_energy_intervals", "sum"),
            resets=("counter_resets", "sum"),
            no_counter=("no_counter_intervals", "sum"),
            mig=("mig_instance_intervals", "sum"),
            intervals=("intervals", "sum"),
        )
        .reset_index()
        .to_dict(orient="records")
    ):
        name = gpu_key(rec["node"], rec["source"], rec["device"], rec["index"])
        if rec["unattributed_s"] > 0:
            missing.append(
                f"{name}: no owner worker and no iteration with its uuid: phase states unknown for "
                f"{rec['unattributed_s']:.1f} s (time counted under unattributed_s, not idle)"
            )
        if rec["no_energy"] > 0:
            missing.append(f"{name}: neither energy counter nor power on {int(rec['no_energy'])} intervals")
        if rec["resets"] > 0:
            missing.append(
                f"{name}: energy counter went backwards (reset/wrap) on {int(rec['resets'])} intervals: "
                "power integrated there"
            )
        if rec["no_counter"] > 0:
            missing.append(
                f"{name}: no energy counter on {int(rec['no_counter'])} intervals: power integrated"
            )
        if rec["mig"] > 0:
            missing.append(
                f"{name}: MIG instance: energy is counted once on its physical GPU's row, not here"
            )
    for key, gap in gaps.items():
        missing.append(
            f"{key}: not sampled for {gap['gap_s']:.1f} s ({gap['gaps']} gap(s) between samples longer than "
            f"{gap['threshold_s']:.1f} s, i.e. {GAP_PERIODS:g} sampling periods and at least {GAP_MIN_S:g} s; "
            f"longest {gap['longest_s']:.1f} s): counted as unsampled time (not idle), with the energy "
            "counter's rise across the gaps"
        )
    for key, fit in fits.items():
        missing += [f"{key}: {m}" for m in fit.missing]
    missing += poor_fit_notes(fits)
    missing += _issue_notes(issues)
    return PhaseBreakdown(
        window, _finish(per_gpu), _finish(per_pool), _finish(per_hour), fits, trust, missing, raw, gaps
    )
