"""The aggregate statement of phase attribution: per GPU × role × hour (and period) sums of an interval
table's state seconds, the state energies apportioned by the power model, the GPU-time categories
and the sums behind the utilization − SM activity gap, in one pass over the table.

:func:`aggregate_sql` reads an interval table (:class:`analytics.intervals.IntervalTable`: the
columns of :func:`analytics.attribution.gpu_intervals`) joined to three relations its caller
registers: ``pl_coef`` (the per-GPU power fits, :func:`analytics.power_model.coef_frame`),
``pl_rates_hour`` and ``pl_rates_gpu`` (MFU / MBU per GPU and hour, and per GPU,
:func:`analytics.roofline.phase_rates`). :func:`analytics.attribution.phase_breakdown` runs it.
Formulas: docs/analytics/attribution.md.
"""

from __future__ import annotations

import pandas as pd

from analytics.roofline import RATE_COLUMNS
from analytics.stranded import basis_sql, stranded_sql

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


def aggregate_sql(table: str, period_s: float | None = None) -> str:
    """Per GPU × role × hour sums: state seconds, the apportioned energy of every state, the
    GPU-time categories (time and energy) and the sums behind the utilization − SM activity gap; with
    ``period_s`` per GPU × role × period too, in the same pass (:func:`split_periods` parts them).

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
    keys = "node, source, device, \"index\", coalesce(role, 'unknown')"
    if period_s is None:
        p_col, p_sel, group = "", "", f"{keys}, hour_s"
    else:
        p = repr(float(period_s))
        p_col = f", floor(t0_s / {p}) * {p} AS p_start"
        p_sel = "p_start, GROUPING(p_start) = 1 AS by_hour, "
        group = f"GROUPING SETS (({keys}, hour_s), ({keys}, p_start))"
    e_parts = ", ".join(f"sum(e_{s[:-2]}) AS energy_{s[:-2]}_j" for s in STATES)
    s_parts = ", ".join(f"sum({s}) AS {s}" for s in STATES)
    rates = ", ".join(f"coalesce(rh.{c}, rg.{c}) AS r_{c}" for c in RATE_COLUMNS)
    return f"""
WITH iv AS (
    SELECT i.*, c.* EXCLUDE (node, source, device, "index"), coalesce({weights}, 0.0) AS wsum,
           coalesce(i.prefill_s, 0) + coalesce(i.mixed_prefill_s, 0) AS p_s,
           coalesce(i.decode_s, 0) + coalesce(i.mixed_decode_s, 0) AS d_s,
           i.interval_s - i.unsampled_s AS sampled_s,  -- the activities are of this time
           {rates}
    FROM {table} i
    LEFT JOIN pl_coef c ON i.node = c.node AND i.source = c.source AND i.device = c.device
     AND i."index" IS NOT DISTINCT FROM c."index"
    LEFT JOIN pl_rates_hour rh ON i.node = rh.node AND i.uuid = rh.uuid AND i.hour_s = rh.hour_s
    LEFT JOIN pl_rates_gpu rg ON i.node = rg.node AND i.uuid = rg.uuid
),
ev AS (  -- per interval: apportioned state energies; SM / DRAM activity during GPU-busy time
    SELECT *, {e_cols},
           CASE WHEN p_s + d_s > 0 AND sm_active_pct IS NOT NULL THEN least(1.0, sm_active_pct / 100.0 * sampled_s / (p_s + d_s)) END AS sm_busy,
           CASE WHEN p_s + d_s > 0 AND dram_active_pct IS NOT NULL THEN least(1.0, dram_active_pct / 100.0 * sampled_s / (p_s + d_s)) END AS dram_busy
    FROM iv
),
cv AS (
    SELECT *, coalesce(e_prefill, 0) + coalesce(e_mixed_prefill, 0) AS ep_j,
           coalesce(e_decode, 0) + coalesce(e_mixed_decode, 0) AS ed_j,
           {stranded_sql("compute", "s")} AS sc_s, {stranded_sql("bandwidth", "s")} AS sb_s,
           {stranded_sql("compute", "j")} AS sc_j, {stranded_sql("bandwidth", "j")} AS sb_j{p_col}
    FROM ev
)
SELECT node, source, device, "index", any_value(uuid) AS uuid, any_value(name) AS name,
       coalesce(role, 'unknown') AS role, any_value(worker) AS worker, hour_s, {p_sel}
       count(*) AS intervals, sum(interval_s) AS interval_s,
       sum(CASE WHEN attributed THEN interval_s ELSE unsampled_s END) AS attributed_s,
       sum(CASE WHEN NOT attributed THEN interval_s - unsampled_s ELSE 0 END) AS unattributed_s,
       {s_parts},
       sum(energy_j) AS energy_j,
       sum(CASE WHEN energy_source LIKE 'integrated%' THEN energy_j ELSE 0 END) AS energy_estimated_j,
       sum(CASE WHEN NOT attributed THEN {sampled_j} ELSE 0 END) AS energy_unattributed_j,
       {e_parts},
       sum(p_s - sb_s) FILTER (WHERE attributed) AS productive_prefill_s,
       sum(sb_s) FILTER (WHERE attributed) AS stranded_bandwidth_s,
       sum(d_s - sc_s) FILTER (WHERE attributed) AS productive_decode_s,
       sum(sc_s) FILTER (WHERE attributed) AS stranded_compute_s,
       sum(coalesce(host_s, 0) + coalesce(gap_s, 0)) FILTER (WHERE attributed) AS host_bound_s,
       sum(ep_j - sb_j) FILTER (WHERE attributed) AS energy_productive_prefill_j,
       sum(sb_j) FILTER (WHERE attributed) AS energy_stranded_bandwidth_j,
       sum(ed_j - sc_j) FILTER (WHERE attributed) AS energy_productive_decode_j,
       sum(sc_j) FILTER (WHERE attributed) AS energy_stranded_compute_j,
       sum(coalesce(e_host, 0) + coalesce(e_gap, 0)) FILTER (WHERE attributed) AS energy_host_bound_j,
       sum({basis_sql("compute", "roofline")}) FILTER (WHERE attributed) AS decode_roofline_s,
       sum({basis_sql("compute", "activity")}) FILTER (WHERE attributed) AS decode_activity_s,
       sum({basis_sql("compute", "unknown")}) FILTER (WHERE attributed) AS decode_activity_unknown_s,
       sum({basis_sql("bandwidth", "roofline")}) FILTER (WHERE attributed) AS prefill_roofline_s,
       sum({basis_sql("bandwidth", "activity")}) FILTER (WHERE attributed) AS prefill_activity_s,
       sum({basis_sql("bandwidth", "unknown")}) FILTER (WHERE attributed) AS prefill_activity_unknown_s,
       sum(d_s * (1.0 - sm_busy)) FILTER (WHERE attributed) AS stranded_compute_sm_s,
       sum(CASE WHEN sm_busy IS NOT NULL THEN d_s ELSE 0 END) FILTER (WHERE attributed) AS decode_sm_known_s,
       sum(p_s * (1.0 - dram_busy)) FILTER (WHERE attributed) AS stranded_bandwidth_dram_s,
       sum(CASE WHEN dram_busy IS NOT NULL THEN p_s ELSE 0 END) FILTER (WHERE attributed) AS prefill_dram_known_s,
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
GROUP BY {group}
"""


def split_periods(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """:func:`aggregate_sql`'s rows as (hourly, per period with ``hour_s`` its start), or (all, None)."""
    if "by_hour" not in df:
        return df, None
    hourly = df["by_hour"].astype(bool)
    raw = df[hourly].drop(columns=["p_start", "by_hour"]).reset_index(drop=True)
    periods = df[~hourly].drop(columns=["hour_s", "by_hour"]).rename(columns={"p_start": "hour_s"})
    return raw, periods[raw.columns].reset_index(drop=True)
