"""The per-GPU power model of phase attribution (analytics/attribution.py): bounded least squares
of a row's energy on its state seconds, one coefficient (W) per ``MODEL_TERMS`` term, each within
the GPU's power limit (else its spec TDP, else the highest power observed × a margin); a term with
too little time on a GPU takes the pooled fit of every GPU of its model. Fitted from per-GPU SQL
sums (:func:`fit_stats_sql`): no row reaches Python. Formulas and sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

# The power model's regressors: each fine state maps to one coefficient (W) (analytics/attribution_queries.py
# maps them). Host-bound time shares the idle coefficient there.
MODEL_TERMS: tuple[str, ...] = ("prefill", "decode", "idle")
GPU_KEY = ("node", "source", "device", "index")


def gpu_key(node: str, source: str, device: str, index: int | None) -> str:
    """The key of a GPU in ``PhaseBreakdown.fits``: ``node|source|device|index``."""
    return f"{node}|{source}|{device}|{'' if index is None or pd.isna(index) else int(index)}"


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


def fit_stats_sql(table: str) -> str:
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


def power_bounds(df: pd.DataFrame) -> dict[str, tuple[float | None, str | None]]:
    """Per GPU (``gpu_key``) of the :func:`fit_stats_sql` rows ``df``: the most a power coefficient
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


def sample_gaps(stats: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per GPU (``gpu_key``) with a gap in its samples, from the :func:`fit_stats_sql` rows:
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


def fit_gpus(stats: pd.DataFrame) -> dict[str, PowerFit]:
    """The bounded power fit of every attributed GPU from its :func:`fit_stats_sql` row. A term
    too thin to fit on one GPU takes the estimate of a fit on the pooled sums of every GPU of the
    same model (name) where it is not thin there, else is left out."""
    df = stats[
        stats["attributed"].fillna(False).astype(bool)
    ]  # no states to fit on: reported as unattributed
    bounds = power_bounds(df)
    skip = {*GPU_KEY, "attributed", "name", "max_power_w", "max_mean_w", "power_limit_w", *_GAP_STAT_COLS}
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


def coef_frame(fits: dict[str, PowerFit], stats: pd.DataFrame) -> pa.Table:
    """The fitted power per state (``w_<term>``, 0 where not fitted) of every GPU of ``fits``, keyed
    by the GPU's identity columns (``node, source, device, index``: from its :func:`fit_stats_sql`
    row in ``stats``), for the aggregate's join."""
    keys: dict[str, list[Any]] = {k: [] for k in GPU_KEY}
    w: dict[str, list[float]] = {f"w_{t}": [] for t in MODEL_TERMS}
    for node, source, device, index in zip(*(stats[k] for k in GPU_KEY), strict=True):
        fit = fits.get(gpu_key(node, source, device, index))
        if fit is None:
            continue
        for k, v in zip(GPU_KEY, (node, source, device, index), strict=True):
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
