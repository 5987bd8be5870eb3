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

The GPU-time categories (:data:`CATEGORIES`) split busy time into productive and stranded by 1 − MFU /
1 − MBU of the work the iterations carry, else by 1 − SM / DRAM activity (:mod:`analytics.stranded`
says which basis each figure rests on). The aggregate's SQL, one statement (states, energies and
categories in one pass), is :mod:`analytics.attribution_queries`'; the bad-iteration counts are
:mod:`analytics.iteration_issues`'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.attribution_queries import STATES, aggregate_sql, split_periods
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
from analytics.iteration_issues import issue_notes, iteration_issues
from analytics.jsonable import tables_dict
from analytics.power_model import (
    GPU_KEY,
    PowerFit,
    coef_frame,
    fit_gpus,
    fit_stats_sql,
    gpu_key,
    poor_fit_notes,
    sample_gaps,
)
from analytics.roofline import phase_rates
from analytics.stranded import BASIS_SUM_COLS
from analytics.trust import ESTIMATED, HOST_BOUND, UNVALIDATED, Trust
from analytics.window import Window


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
    #: ``raw``'s sums per ``period_s`` instead of per hour (``hour_s`` the period's start), when asked
    raw_by_period: pd.DataFrame | None = field(default=None, repr=False)
    period_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return tables_dict(
            self,
            fits={k: v.to_dict() for k, v in self.fits.items()},
            sample_gaps={k: dict(v) for k, v in self.gaps.items()},
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
    *BASIS_SUM_COLS,
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
    period_s: float | None = None,
) -> PhaseBreakdown:
    """Time and energy of the window's GPUs by state, per GPU, per pool (role) and per hour, with
    the per-GPU power fits and the trust labels. Runs on grid buckets of ``bucket_s`` seconds
    (None: chosen from the sampling period; 0: exact sample intervals, slow on big windows)
    materialised in a TEMP table — or on ``intervals``, one already open on ``con`` for this window
    and shared by several analyses. Aggregation runs in SQL; only per GPU × role × hour sums reach
    Python. ``iteration_groups``: the window's :func:`analytics.iteration_groups.iteration_groups`
    when already computed (else computed here). ``period_s``: also sum per GPU × role × period of
    that many seconds (``raw_by_period``: the cost over time at a resolution finer than the hour)."""
    if intervals is not None:
        if intervals.window != window:
            raise ValueError("the interval table given is of another window than the one asked for")
        return _breakdown_from(con, window, intervals, iteration_groups, period_s)
    with IntervalTable(con, window, bucket_s) as t:
        return _breakdown_from(con, window, t, iteration_groups, period_s)


def _breakdown_from(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    iv: IntervalTable,
    groups: pa.Table | None,
    period_s: float | None = None,
) -> PhaseBreakdown:
    table = iv.name
    trust = Trust()
    missing: list[str] = []
    stats = con.execute(fit_stats_sql(table)).df()
    fits = fit_gpus(stats)
    gaps = sample_gaps(stats)
    coef = coef_frame(fits, stats)
    rates = phase_rates(con, window)
    con.register("pl_coef", coef)
    con.register("pl_rates_hour", rates.hourly)
    con.register("pl_rates_gpu", rates.whole)
    try:
        raw, by_period = split_periods(con.execute(aggregate_sql(table, period_s)).df())
    finally:
        for name in ("pl_coef", "pl_rates_hour", "pl_rates_gpu"):
            con.unregister(name)
    for note in rates.unvalidated:
        trust.add(UNVALIDATED, note)
    issues = iteration_issues(con, window, table, iv.exact, groups)
    lagged = int(issues["lagged"])
    if raw.empty:
        missing.append(
            f"no GPU sample intervals in the window ({window.label()}): a window needs two samples of a GPU"
        )
        missing += issue_notes(issues)
        empty = pd.DataFrame(columns=[*GPU_KEY, "role", *_SUM_COLS])
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
    keys = [*GPU_KEY, "uuid", "name", "role", "worker"]
    raw["index"] = raw["index"].astype("Int64")
    per_gpu = raw.groupby([*GPU_KEY, "role"], dropna=False, as_index=False).agg(
        {"uuid": "first", "name": "first", "worker": "first", **dict.fromkeys(_SUM_COLS, "sum")}
    )[[*keys, *_SUM_COLS]]
    per_pool = raw.groupby("role", as_index=False)[list(_SUM_COLS)].sum()
    per_pool.insert(
        1, "gpus", raw.groupby("role")[list(GPU_KEY)].apply(lambda g: len(g.drop_duplicates())).values
    )
    per_hour = raw.groupby(["hour_s", "role"], as_index=False)[list(_SUM_COLS)].sum()
    # what is missing, per GPU
    for rec in (
        raw.groupby([*GPU_KEY], dropna=False)
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
    missing += issue_notes(issues)
    out = PhaseBreakdown(
        window, _finish(per_gpu), _finish(per_pool), _finish(per_hour), fits, trust, missing, raw, gaps
    )
    out.raw_by_period, out.period_s = by_period, period_s if by_period is not None else None
    return out
