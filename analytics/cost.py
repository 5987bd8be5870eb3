"""Cost and energy per token, split by phase and by waste (DESIGN.md, "Measures").

Cost of a GPU-time category c (per GPU and hour)::

    cost_c = gpu_usd_per_hour × seconds_c / 3600 + energy_j_c / 3.6e6 × PUE × electricity_usd_per_kwh

Categories (GPU-seconds and joules per GPU × pool × hour from helper A's attribution,
:attr:`analytics.attribution.PhaseBreakdown.raw`):
``prefill`` / ``decode`` (productive), ``stranded_prefill`` (prefill time × (1 − MBU), else × (1 −
DRAM activity)), ``stranded_decode`` (decode time × (1 − MFU), else × (1 − SM activity): the basis in
``stranded_basis``, :mod:`analytics.stranded`), ``host_bound`` (host time in and gaps between
iterations), ``other_busy`` (an external fleet's busy time no engine work explains:
:mod:`analytics.external_cost`), ``idle`` (no work), ``unsampled`` (a gap in the GPU's samples: its
work is not known, so it is not idle; its GPU-hours are still paid for and its energy is the
counter's rise across the gap). Input side (→ $/1M input tokens): prefill + stranded_prefill + the
input share of host_bound, other_busy, idle and unsampled; output side (→ $/1M output tokens):
decode + stranded_decode + the output share. The input share of a GPU-hour's overhead time is its
prefill-side busy time over its busy time ((prefill + stranded_prefill) / busy); a GPU-hour with no
busy time gives it to the input side in a prefill pool, the output side in a decode pool, else by
the window's share (noted). The figures that compare layouts and periods do not depend on that
split: all-in $/1M tokens (window cost / (input + output tokens)), $ per request (window cost /
requests finished) and the blended $/1M tokens at Artificial Analysis' 3:1 input:output mix.
Formulas and sources: docs/analytics/cost.md. The pure part, :func:`price_usage`, takes :class:`GpuHourUsage` rows and a
:class:`PriceTable`; :func:`cost_breakdown` builds those rows from the store. The categories and
the pricing are in :mod:`analytics.cost_pricing` (re-exported here); an external fleet's rows are
in :mod:`analytics.external_cost`.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.cost_pricing import (
    CATEGORIES,
    CATEGORY_LABELS,
    AnnualProjection,
    CostBreakdown,
    GpuHourUsage,
    price_usage,
)
from analytics.iteration_groups import iteration_groups, registered_groups
from analytics.prices import (
    DEFAULT_SOURCES,
    PriceError,
    PriceTable,
    load_prices,
)
from analytics.stranded import basis_note, stranded_basis
from analytics.trust import Trust
from analytics.window import Window

__all__ = [
    "ATTRIBUTION_CATEGORY",
    "CATEGORIES",
    "CATEGORY_LABELS",
    "COST_PERIODS_S",
    "DEFAULT_SOURCES",
    "MIG_SLICES",
    "AnnualProjection",
    "CostBreakdown",
    "GpuHourUsage",
    "PriceError",
    "PriceTable",
    "cost_breakdown",
    "cost_period_s",
    "load_prices",
    "mig_share",
    "price_usage",
    "token_counts",
    "usage_rows",
]

#: the period widths the cost over time is summed at when an hour is too coarse for the window (each a
#: divisor of the hour; the smallest whose buckets stay within MAX_COST_BUCKETS and that holds whole
#: grid buckets of the attribution)
COST_PERIODS_S = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
MAX_COST_BUCKETS = 60


def cost_period_s(window_s: float, grid_s: float) -> float | None:
    """The period to sum the cost over time at for a window of ``window_s`` seconds whose attribution
    runs on grid buckets of ``grid_s`` seconds (0: exact sample intervals): the smallest of
    :data:`COST_PERIODS_S` that is a whole number of grid buckets and cuts the window into at most
    :data:`MAX_COST_BUCKETS`; None when only an hour or more would (``by_hour`` serves those)."""
    for p in COST_PERIODS_S:
        whole = grid_s <= 0 or (p >= grid_s and abs(p / grid_s - round(p / grid_s)) < 1e-9)
        if whole and window_s / p <= MAX_COST_BUCKETS:
            return p
    return None


# -- from the store -----------------------------------------------------------------------------------

_TOKENS_SQL = """
WITH w AS (  -- each worker's GPUs per hour, from the iterations starting in the window (a TP worker runs on several)
    SELECT DISTINCT node, worker, gpu_uuid, hour_start_s FROM {groups} WHERE starts_in AND gpu_uuid IS NOT NULL
),
wn AS (SELECT node, worker, hour_start_s, count(*) AS gpus FROM w GROUP BY ALL),
input AS (   -- prompt tokens, at the end of their prefill, on the prefill worker
    SELECT node, prefill_worker AS worker, floor(prefill_end_s / 3600) * 3600 AS hour_start_s,
           sum(prompt_tokens) AS tokens
    FROM requests
    WHERE {node} AND prefill_end_s >= ? AND prefill_end_s < ? AND prompt_tokens > 0
    GROUP BY ALL
),
output AS (  -- generated tokens, when generated, on the decode worker (else the prefill worker): the
             -- worker stored with the token; a token stored without one (written before the store
             -- kept it) joined to its request, counted per request and hour before the join
    SELECT node, worker, hour_start_s, sum(tokens)::BIGINT AS tokens FROM (
        SELECT node, worker, floor(ts_s / 3600) * 3600 AS hour_start_s, count(*) AS tokens
        FROM tokens t WHERE {tnode} AND t.ts_s >= ? AND t.ts_s < ? AND t.worker IS NOT NULL
        GROUP BY ALL
        UNION ALL
        SELECT r.node, coalesce(r.decode_worker, r.prefill_worker), t.hour_start_s, sum(t.tokens)
        FROM (SELECT node, request_id, floor(ts_s / 3600) * 3600 AS hour_start_s, count(*) AS tokens
              FROM tokens t WHERE {tnode} AND t.ts_s >= ? AND t.ts_s < ? AND t.worker IS NULL GROUP BY ALL) t
        JOIN requests r ON r.node = t.node AND r.request_id = t.request_id
        GROUP BY ALL)
    GROUP BY ALL
),
per_worker AS (
    SELECT coalesce(i.node, o.node) AS node, coalesce(i.worker, o.worker) AS worker,
           coalesce(i.hour_start_s, o.hour_start_s) AS hour_start_s,
           coalesce(i.tokens, 0) AS input_tokens, coalesce(o.tokens, 0) AS output_tokens
    FROM input i FULL JOIN output o
      ON i.node = o.node AND i.worker IS NOT DISTINCT FROM o.worker AND i.hour_start_s = o.hour_start_s
)
SELECT p.node, p.worker, p.hour_start_s, w.gpu_uuid,
       p.input_tokens / coalesce(wn.gpus, 1) AS input_tokens,
       p.output_tokens / coalesce(wn.gpus, 1) AS output_tokens
FROM per_worker p
LEFT JOIN wn ON wn.node = p.node AND wn.worker = p.worker AND wn.hour_start_s = p.hour_start_s
LEFT JOIN w ON w.node = p.node AND w.worker = p.worker AND w.hour_start_s = p.hour_start_s
"""


def token_counts(
    con: duckdb.DuckDBPyConnection, window: Window, iteration_groups: pa.Table | None = None
) -> pd.DataFrame:
    """Tokens served per GPU and hour: ``node, worker, hour_start_s, gpu_uuid, input_tokens,
    output_tokens``. Input tokens are a request's prompt tokens at its ``prefill_end_s`` on its
    prefill worker; output tokens are the ``tokens`` rows at their ``ts_s`` on the request's decode
    worker (its prefill worker when it has none); a worker's tokens of an hour are shared evenly by
    the GPUs its iterations ran on in that hour (``gpu_uuid`` NULL: the worker ran no iteration in
    that hour of the window). The worker's GPUs per hour come from the window's
    :func:`analytics.iteration_groups.iteration_groups` (``iteration_groups`` when already
    computed)."""
    pred, params = window.node_sql("node")
    tpred, tparams = window.node_sql("t.node")
    bounds = [window.start_s, window.end_s]
    with registered_groups(con, window, iteration_groups) as groups:
        sql = _TOKENS_SQL.format(node=pred, tnode=tpred, groups=groups)
        return con.execute(sql, [*params, *bounds, *tparams, *bounds, *tparams, *bounds]).df()


def _mig_shares(con: duckdb.DuckDBPyConnection, window: Window) -> dict[tuple[Any, ...], float]:
    pred, params = window.node_sql("node")
    rows = con.execute(
        f'SELECT DISTINCT node, source, device, "index", mig_profile FROM devices '
        f"WHERE {pred} AND mig_profile IS NOT NULL",
        params,
    ).fetchall()
    return {(n, s, d, None if i is None else int(i)): mig_share(p) for n, s, d, i, p in rows}


#: the served model of each live stack: its latest ``start`` control event (the router puts
#: ``after.model``, the name ``/v1/models`` serves) at or before the window's end, per node and source
_SERVED_MODELS_SQL = """
SELECT DISTINCT model FROM (
    SELECT json_extract_string(after, '$.model') AS model,
           row_number() OVER (PARTITION BY node, source ORDER BY ts_s DESC) AS newest
    FROM control_events
    WHERE action = 'start' AND ts_s <= ? AND {nodes}
      AND json_extract_string(after, '$.model') IS NOT NULL
) WHERE newest = 1
"""


def _model_name(con: duckdb.DuckDBPyConnection, window: Window) -> str | None:
    """The window's model: a scenario's, or the one model its live stacks serve (None when none
    is known or they serve several)."""
    if window.simulated:
        row = con.execute("SELECT model FROM scenarios WHERE scenario_id = ?", [window.dataset]).fetchone()
        return str(row[0]) if row and row[0] else None
    nodes, params = window.node_sql()
    rows = con.execute(_SERVED_MODELS_SQL.format(nodes=nodes), [window.end_s, *params]).fetchall()
    return str(rows[0][0]) if len(rows) == 1 and rows[0][0] else None


#: our category → the attribution's GPU-time category (PhaseBreakdown.raw columns <name>_s, energy_<name>_j)
ATTRIBUTION_CATEGORY = {
    "prefill": "productive_prefill",
    "stranded_prefill": "stranded_bandwidth",
    "decode": "productive_decode",
    "stranded_decode": "stranded_compute",
    "host_bound": "host_bound",
    "idle": "idle",
    "unsampled": "unsampled",
}


def usage_rows(
    raw: pd.DataFrame,
    tokens: pd.DataFrame,
    model: str | None,
    shares: dict[tuple[Any, ...], float] | None = None,
) -> list[GpuHourUsage]:
    """:class:`GpuHourUsage` rows from the attribution's GPU × pool × hour table
    (:attr:`analytics.attribution.PhaseBreakdown.raw`) and :func:`token_counts`: a GPU is its uuid
    (else ``node|source|device|index``); categories per :data:`ATTRIBUTION_CATEGORY`. ``shares``:
    ``(node, source, device, index)`` → share of the physical GPU's price (MIG instances)."""
    if raw.empty:
        return []
    raw = raw.reset_index(drop=True)
    key = [
        u if isinstance(u, str) and u else f"{n}|{s}|{d}|{'' if pd.isna(i) else int(i)}"
        for u, n, s, d, i in zip(
            raw["uuid"], raw["node"], raw["source"], raw["device"], raw["index"], strict=True
        )
    ]
    tok = (
        tokens.dropna(subset=["gpu_uuid"])
        .groupby(["node", "gpu_uuid", "hour_start_s"])[["input_tokens", "output_tokens"]]
        .sum()
    )
    # a GPU that served two pools in one hour (a role change): its tokens go to the pool with more busy time
    busy = sum(
        pd.to_numeric(raw.get(c), errors="coerce").fillna(0.0)
        for c in ("prefill_s", "decode_s", "mixed_prefill_s", "mixed_decode_s")
        if c in raw
    )
    raw = raw.assign(_gpu=key, _busy=busy)
    first = ~raw.sort_values("_busy", ascending=False).duplicated(["node", "_gpu", "hour_s"])
    first = first.reindex(raw.index).to_numpy(dtype=bool)
    # plain dicts and records: a pandas lookup per row cost more than the rest of the pricing
    tok_of = {
        (n, g, float(h)): (float(i), float(o))
        for (n, g, h), i, o in zip(tok.index, tok["input_tokens"], tok["output_tokens"], strict=True)
    }
    out = []
    for i, r in enumerate(raw.to_dict(orient="records")):
        t = (r["node"], r["_gpu"], float(r["hour_s"]))
        tokens = tok_of.get(t) if first[i] else None
        out.append(
            GpuHourUsage(
                gpu=str(r["_gpu"]),
                gpu_name=None if pd.isna(r.get("name")) else str(r["name"]),
                hour_start_s=float(r["hour_s"]),
                seconds={c: _nonneg(r.get(f"{a}_s")) for c, a in ATTRIBUTION_CATEGORY.items()},
                energy_j={c: _nonneg(r.get(f"energy_{a}_j")) for c, a in ATTRIBUTION_CATEGORY.items()},
                input_tokens=tokens[0] if tokens else 0.0,
                output_tokens=tokens[1] if tokens else 0.0,
                pool=None if pd.isna(r.get("role")) else str(r["role"]),
                model=model,
                node=str(r["node"]),
                gpu_share=(shares or {}).get(
                    (r["node"], r["source"], r["device"], None if pd.isna(r["index"]) else int(r["index"])),
                    1.0,
                ),
            )
        )
    return out


def cost_breakdown(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    prices: PriceTable | None = None,
    *,
    breakdown: Any = None,
    tokens: pd.DataFrame | None = None,
    external: Any = None,
) -> CostBreakdown:
    """Cost and energy per token over ``window``: GPU-seconds and joules per category per GPU × pool
    × hour from helper A's :func:`analytics.attribution.phase_breakdown` (its ``raw`` table: the
    power model's apportioned energy, stranded time from MFU / MBU, else SM / DRAM activity), tokens from
    :func:`token_counts`, priced by :func:`price_usage`. Pass ``breakdown`` (a PhaseBreakdown of the
    same window) to reuse one already computed, and ``tokens`` (its :func:`token_counts`) likewise. Trust labels and missing-data notes are the
    attribution's, plus the pricing's own.

    ``external``: the window's :class:`analytics.external.ExternalAttribution`; the GPUs without
    any serving telemetry in the window (dcgm-exporter GPUs of vLLM / SGLang / Dynamo) are then
    priced from it (:mod:`analytics.external_cost`: observed sample time, estimated phase split,
    tokens and requests from the engine's counters; labelled estimated) instead of being left out."""
    from analytics.attribution import phase_breakdown
    from analytics.external import gpu_id
    from analytics.external_cost import (
        external_requests,
        external_usage,
        gpus_without_telemetry,
        served_tokens,
    )

    prices = prices or load_prices()
    groups = iteration_groups(con, window) if breakdown is None and tokens is None else None
    pb = breakdown if breakdown is not None else phase_breakdown(con, window, iteration_groups=groups)
    trust = Trust().merge([pb.trust])
    trust.notes.extend(n for n in pb.missing if n not in trust.notes)
    model = _model_name(con, window)
    tokens = tokens if tokens is not None else token_counts(con, window, groups)
    shares = _mig_shares(con, window)
    if shares:
        trust.notes.append(
            f"{len(shares)} MIG instances priced at their compute slices / {MIG_SLICES} of their GPU's price; "
            "their energy is on the physical GPU's row"
        )
    raw = pb.raw
    usages = usage_rows(raw, tokens, model, shares)
    requests = _requests_finished(con, window)
    ext_tokens: dict[str, float] = {}
    external_gpus = gpus_without_telemetry(raw) if external is not None else set()
    if external_gpus:
        keep = [
            gpu_id(*k) not in external_gpus
            for k in zip(raw["node"], raw["source"], raw["device"], raw["index"], strict=True)
        ]
        usages = [u for u, k in zip(usages, keep, strict=True) if k]
        usages += external_usage(external, external_gpus)
        requests += external_requests(external, external_gpus)
        ext_tokens = served_tokens(external)
        trust.merge([external.trust])
        trust.notes.append(
            f"{len(external_gpus)} GPUs without phaselens telemetry priced from dcgm-exporter and engine metrics "
            "(estimated): GPU-hours are their observed sample time, the phase split the engine-metrics work model "
            "or their pool, tokens and requests the engines' counters"
        )
        raw = raw[keep]
    result = price_usage(usages, prices, trust=trust, requests=requests)
    if pb.raw_by_period is not None and not external_gpus and not pb.raw_by_period.empty:
        # the same GPU-seconds and joules summed per period instead of per hour, priced alike: no
        # tokens (a period's are not counted), so its rows carry dollars and no $ per token
        no_tokens = tokens.iloc[0:0]
        periods = price_usage(usage_rows(pb.raw_by_period, no_tokens, model, shares), prices, trust=Trust())
        result.by_period, result.period_s = periods.by_hour, pb.period_s

    unattributed = float(raw["unattributed_s"].sum()) if "unattributed_s" in raw else 0.0
    if unattributed > 0:
        trust.notes.append(
            f"{unattributed:,.1f} GPU-seconds have no serving telemetry (unattributed): not in any cost category"
        )
    unsampled = float(raw["unsampled_s"].sum()) if "unsampled_s" in raw else 0.0
    if unsampled > 0:
        trust.notes.append(
            f"{unsampled:,.1f} GPU-seconds fall in gaps of their GPU's samples: priced apart as "
            f"'{CATEGORY_LABELS['unsampled']}' — the GPU is paid for, its work is not known — not as idle"
        )
    unknown = sum(
        float(raw[c].sum()) for c in ("decode_activity_unknown_s", "prefill_activity_unknown_s") if c in raw
    )
    if unknown > 0:
        trust.notes.append(
            f"{unknown:,.1f} busy GPU-seconds have neither a work count (MFU/MBU) nor SM/DRAM activity: "
            "counted productive (stranded unknown)"
        )
    result.stranded_basis = stranded_basis(raw)
    trust.notes.append(basis_note(result.stranded_basis))
    unassigned = tokens[tokens["gpu_uuid"].isna()]
    result.tokens = {
        "input_tokens_served": (float(tokens["input_tokens"].sum()) if len(tokens) else 0.0)
        + ext_tokens.get("input_tokens", 0.0),
        "output_tokens_served": (float(tokens["output_tokens"].sum()) if len(tokens) else 0.0)
        + ext_tokens.get("output_tokens", 0.0),
        "input_tokens_counted": float(result.lines["input_tokens"].sum()),
        "output_tokens_counted": float(result.lines["output_tokens"].sum()),
        "input_tokens_unassigned": float(unassigned["input_tokens"].sum()) if len(unassigned) else 0.0,
        "output_tokens_unassigned": float(unassigned["output_tokens"].sum()) if len(unassigned) else 0.0,
    }
    lost_in = result.tokens["input_tokens_served"] - result.tokens["input_tokens_counted"]
    lost_out = result.tokens["output_tokens_served"] - result.tokens["output_tokens_counted"]
    if lost_in > 0.5 or lost_out > 0.5:
        trust.notes.append(
            f"{lost_in:,.0f} input and {lost_out:,.0f} output tokens served in the window are on no GPU "
            "the attribution covers (a worker without iterations or samples in their hour; an engine's counters "
            "outside its GPUs' samples): not in $/1M tokens"
        )
    return result


def _requests_finished(con: duckdb.DuckDBPyConnection, window: Window) -> float:
    """Requests that finished in the window (any status: a failed request's GPU time is paid too)."""
    pred, params = window.node_sql("node")
    row = con.execute(
        f"SELECT count(*) FROM requests WHERE {pred} AND finish_s >= ? AND finish_s < ?",
        [*params, window.start_s, window.end_s],
    ).fetchone()
    return float(row[0]) if row else 0.0


#: compute slices of a whole GPU in MIG mode (A100, H100, H200: 7 GPCs)
MIG_SLICES = 7


def mig_share(profile: str | None) -> float:
    """The share of its physical GPU a MIG instance of ``profile`` (e.g. ``1g.10gb``, ``3g.40gb``) is:
    its compute slices / 7; 1.0 for a whole GPU (no profile) and for a profile that does not parse."""
    if not profile:
        return 1.0
    head = str(profile).split("g.", 1)[0]
    try:
        slices = int(head)
    except ValueError:
        return 1.0
    return min(1.0, slices / MIG_SLICES) if slices > 0 else 1.0


def _nonneg(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0
