"""External fleets: phase attribution for vLLM / SGLang / NVIDIA Dynamo on GPUs watched by
dcgm-exporter, with no phaselens telemetry (no iterations, no requests, no worker↔GPU identity).

Everything here is **estimated** from what those expose, and says how:

* **Busy time** of a GPU per sample interval ``(t_prev, t]``: DCGM ``PROF_GR_ENGINE_ACTIVE`` (the
  fraction of time the compute engine ran, averaged over DCGM's watch interval: the utilization
  NVIDIA recommends, and the one a MIG instance has of its own), else ``DEV_GPU_UTIL`` (NVML's
  sampled utilization: a ~1 s window, a point sample when scrapes are longer; flagged), else
  ``PROF_SM_ACTIVE`` (a lower bound of busy time; flagged). ``busy_s = pct / 100 × dt_s``.
* **Pool membership** (disaggregated deployments: Dynamo prefill/decode workers, or any deployment
  whose pools are given): a GPU in a prefill pool spends its busy time in prefill, one in a decode
  pool in decode. Roles come from ``roles`` (GPU UUID, ``node/device``, Kubernetes pod or engine
  endpoint → ``prefill``/``decode``/``mixed``), else from the store's ``devices.role``, else from the
  Dynamo component labels of the engine serving the GPU (a component named ``*prefill*`` is a
  prefill worker; ``*decode*``, or ``backend`` in a Dynamo namespace that also has a prefill
  component, is a decode worker).
* **Aggregated engines** (vLLM, SGLang; role ``mixed``): a work model fitted per engine by
  non-negative least squares over the sample intervals of its GPUs,
  ``busy_s ≈ c_iter × iterations + c_prompt × prompt_tokens + c_gen × generation_tokens``, with
  the work of each interval the increase of the engine's counters ``iteration_tokens_total_count``,
  ``prompt_tokens_total``, ``generation_tokens_total`` (interpolated to the GPU's sample times).
  ``c_iter`` is the step's fixed cost (weights read once per step, launch latency: decode),
  ``c_prompt`` the cost of a prompt token (compute-bound GEMMs: prefill), ``c_gen`` a generated
  token's (its KV reads: decode). Each interval's *measured* busy time is split in proportion to
  the modeled prefill term ``c_prompt × prompt_tokens`` and decode terms — the model only divides,
  the measured busy time is what is divided. Intervals with busy time but no engine work are
  ``other_busy_s`` (the GPU was busy with something the engine does not report).
  vLLM's ``request_prefill_time_seconds`` / ``request_decode_time_seconds`` histogram sums are *not*
  GPU time: each request adds its own wall time in the phase, so their rates are the mean number of
  requests concurrently in prefill / decode (Little's law), observed when a request finishes (a
  request's lifetime late), and the two overlap whenever a step mixes chunks of prompts with
  decodes. They are reported per engine as concurrencies (``prefill_concurrency``,
  ``decode_concurrency``), with ``decode_batch_mean = generation tokens / iterations`` — the
  normalisation that turns request-seconds of decode into step-seconds — not used for the split.
* **Energy** per interval: the rise of ``DEV_TOTAL_ENERGY_CONSUMPTION`` (``energy_mj``); where the
  counter is missing, went backwards (reset) or wrapped, the trapezoid of ``POWER_USAGE`` (flagged).
  A per-GPU power model, ``energy_j ≈ w_idle × idle_s + w_prefill × prefill_s + w_decode ×
  decode_s + w_other × other_busy_s`` (NNLS, watts), apportions each interval's measured energy to
  its states; the attributed energy sums to the measured energy.
* **MIG**: a GPU instance (``parent_uuid`` set) is a GPU of its own for time (its own GR engine
  activity), while power and energy exist only for the physical GPU and are counted once: each
  interval's energy of the physical GPU is split among its instances — the floor (the GPU's lowest
  interval power in the window × dt) by compute slices (``Ng`` of the profile), the rest by slices ×
  busy fraction.

Public API: :func:`external_attribution` → :class:`ExternalAttribution`. (Over 600 lines: one method —
its SQL, engine matching, work and power fits — read top to bottom beside docs/analytics/external.md;
its pricing is in :mod:`analytics.external_cost`.)
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analytics.trust import ESTIMATED, LABELS, Trust
from analytics.window import AnalyticsError, Window

PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"
ROLES = (PREFILL, DECODE, MIXED)
STATES = ("prefill", "decode", "other_busy", "idle")

#: engine_metrics names (normalised by the collector) the attribution reads.
ENGINE_COUNTERS = (
    "prompt_tokens_total",
    "generation_tokens_total",
    "iteration_tokens_total_count",
    "prefill_seconds_sum",
    "decode_seconds_sum",
    "requests_total",
)
ENGINE_GAUGES = ("requests_running", "requests_waiting")
#: With fewer intervals than this, a GPU with several busy states gets one busy wattage: watts per
#: phase are not identifiable from so few (long) intervals.
MIN_PHASE_FIT_INTERVALS = 6
WORK_TERMS = ("iterations", "prompt_tokens", "generation_tokens")


class ExternalAttributionError(AnalyticsError):
    """A mapping or role given to :func:`external_attribution` is not usable (the message says
    which and what is allowed)."""


@dataclass(slots=True)
class ExternalAttribution:
    """Estimated phase shares of GPU time and energy for an external fleet.

    ``per_gpu``: one row per GPU (or MIG instance): ``gpu``, ``node``, ``uuid``, ``parent_uuid``,
    ``mig_profile``, ``pool`` (role), ``endpoint``, ``method`` (``pool`` | ``engine-metrics`` |
    ``busy-only``), ``busy_measure``, ``energy_source``, ``intervals``, ``span_s`` and per state
    (``prefill``, ``decode``, ``other_busy``, ``idle``) ``<state>_s``, ``<state>_share``,
    ``<state>_energy_j``, ``<state>_energy_share``; ``energy_j`` total.
    ``per_pool``: the same sums and shares per pool. ``engines``: per engine endpoint, its GPUs,
    role, fitted work model (``c_iter_s``, ``c_prompt_token_s``, ``c_gen_token_s``, ``fit_r2``,
    ``fit_rel_rmse``, ``fit_intervals``), its work in the window,
    the histogram-derived concurrencies, ``model`` and ``served_input_tokens``,
    ``served_output_tokens``, ``served_requests`` (its counters over the window, as counted for
    cost: :data:`SERVED`). ``intervals``: every sample interval's state seconds and energy, and its
    share of its engine's tokens and requests (``input_tokens``, ``output_tokens``, ``requests``).
    ``trust`` always carries ``estimated``; ``missing`` says what could not be done.
    """

    window: Window
    per_gpu: pd.DataFrame
    per_pool: pd.DataFrame
    engines: pd.DataFrame
    intervals: pd.DataFrame
    trust: Trust
    missing: list[str] = field(default_factory=list)

    def gpu(self, key: str) -> dict[str, Any]:
        """The ``per_gpu`` row of a GPU by its ``gpu`` key, UUID or pod."""
        df = self.per_gpu
        hit = df[(df["gpu"] == key) | (df["uuid"] == key) | (df["k8s_pod"] == key)]
        if hit.empty:
            raise ExternalAttributionError(f"no GPU {key!r}; known: {', '.join(df['gpu'])}")
        return hit.iloc[0].to_dict()

    def to_dict(self) -> dict[str, Any]:
        def records(df: pd.DataFrame) -> list[dict[str, Any]]:
            return [{k: _json_value(v) for k, v in row.items()} for row in df.to_dict("records")]

        return {
            "window": self.window.describe(),
            "per_gpu": records(self.per_gpu),
            "per_pool": records(self.per_pool),
            "engines": records(self.engines),
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


def _json_value(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if v is pd.NA or v is None:
        return None
    return v


# --- the store reads (SQL) ----------------------------------------------------------------------------

# A MIG instance's row is stored only when its values change (dcgm-exporter repeats them every
# scrape; the collector keeps a row per change), so an instance is sampled on its physical GPU's
# sample times, each taking the instance's last stored values (ASOF), from up to an hour before.
_INTERVALS_SQL = """
WITH x AS (
    SELECT node, source, device, "index", ts_s, uuid, name, parent_uuid, mig_instance_id, mig_profile,
           k8s_pod, k8s_namespace, {role} AS role,
           gr_engine_active_pct, gpu_util_pct, sm_active_pct, power_w, energy_mj, power_limit_w,
           trust_label(node, source, emulated) AS trust
    FROM gpu_samples_full
    WHERE {nodes} AND ts_s >= ? - 3600.0 AND ts_s < ?
), whole AS (
    SELECT * FROM x WHERE parent_uuid IS NULL AND ts_s >= ?
), inst AS (
    SELECT DISTINCT node, source, device, "index", parent_uuid FROM x WHERE parent_uuid IS NOT NULL
), grid AS (
    SELECT i.node, i.source, i.device, i."index", w.ts_s
    FROM inst i JOIN whole w ON w.node = i.node AND w.source = i.source AND w.uuid = i.parent_uuid
), filled AS (
    SELECT g.ts_s, v.* EXCLUDE (ts_s)
    FROM grid g ASOF JOIN (SELECT * FROM x WHERE parent_uuid IS NOT NULL) v
      ON g.node = v.node AND g.source = v.source AND g.device = v.device
     AND g."index" IS NOT DISTINCT FROM v."index" AND g.ts_s >= v.ts_s
), s AS (
    SELECT * FROM whole UNION ALL BY NAME SELECT * FROM filled
), d AS (
    SELECT *,
           ts_s - lag(ts_s) OVER w AS dt_s,
           lag(energy_mj) OVER w AS prev_energy_mj,
           lag(power_w) OVER w AS prev_power_w
    FROM s
    WINDOW w AS (PARTITION BY node, source, device, "index" ORDER BY ts_s)
)
SELECT *,
       CASE WHEN gr_engine_active_pct IS NOT NULL THEN 'gr_engine_active'
            WHEN gpu_util_pct IS NOT NULL THEN 'gpu_util'
            WHEN sm_active_pct IS NOT NULL THEN 'sm_active' END AS busy_measure,
       least(100.0, greatest(0.0, coalesce(gr_engine_active_pct, gpu_util_pct, sm_active_pct)))
           / 100.0 * dt_s AS busy_s,
       CASE WHEN energy_mj IS NOT NULL AND prev_energy_mj IS NOT NULL AND energy_mj >= prev_energy_mj
            THEN (energy_mj - prev_energy_mj) / 1000.0 END AS counter_energy_j,
       CASE WHEN power_w IS NOT NULL AND prev_power_w IS NOT NULL
            THEN (power_w + prev_power_w) / 2.0 * dt_s END AS integrated_energy_j,
       energy_mj < prev_energy_mj AS counter_reset
FROM d
WHERE dt_s IS NOT NULL AND dt_s > 0
ORDER BY node, source, device, "index", ts_s
"""

# Engines that hold no GPU of their own are not read: a Dynamo frontend, and the bundled stack's
# router (engine 'phaselens': its tokens are the bundled stack's, counted from its telemetry).
_ENGINE_SQL = """
SELECT endpoint, any_value(engine) AS engine, ts_s, metric, sum(value) AS value
FROM engine_metrics
WHERE {nodes} AND ts_s >= ? AND ts_s <= ? AND metric IN ({metrics}) AND value IS NOT NULL
  AND (engine IS NULL OR engine NOT IN ('dynamo', 'phaselens'))
GROUP BY endpoint, ts_s, metric
ORDER BY endpoint, metric, ts_s
"""

_ENGINE_LABELS_SQL = """
SELECT endpoint, any_value(engine) AS engine, mode(node) AS node,
       mode(labels->>'pod') AS pod,
       mode(labels->>'namespace') AS namespace,
       mode(labels->>'dynamo_component') AS dynamo_component,
       mode(labels->>'dynamo_namespace') AS dynamo_namespace,
       mode(labels->>'model_name') AS model,
       count(*) AS n_rows
FROM engine_metrics
WHERE {nodes} AND ts_s >= ? AND ts_s < ? AND (engine IS NULL OR engine NOT IN ('dynamo', 'phaselens'))
GROUP BY endpoint
ORDER BY endpoint
"""


def _has_column(con: duckdb.DuckDBPyConnection, view: str, column: str) -> bool:
    rows = con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = ?",
        [view, column],
    ).fetchone()
    return bool(rows and rows[0])


def _intervals(con: duckdb.DuckDBPyConnection, window: Window) -> pd.DataFrame:
    nodes, params = window.node_sql("node")
    role = "role" if _has_column(con, "gpu_samples_full", "role") else "NULL::VARCHAR"
    sql = _INTERVALS_SQL.format(nodes=nodes, role=role)
    return con.execute(sql, [*params, window.start_s, window.end_s, window.start_s]).df()


def _engine_rows(con: duckdb.DuckDBPyConnection, window: Window) -> tuple[pd.DataFrame, pd.DataFrame]:
    nodes, params = window.node_sql("node")
    metrics = (*ENGINE_COUNTERS, *ENGINE_GAUGES)
    marks = ", ".join("?" for _ in metrics)
    # engine scrapes may straddle the window: take one scrape period's worth beyond each edge
    margin = 600.0
    values = con.execute(
        _ENGINE_SQL.format(nodes=nodes, metrics=marks),
        [*params, window.start_s - margin, window.end_s + margin, *metrics],
    ).df()
    labels = con.execute(
        _ENGINE_LABELS_SQL.format(nodes=nodes), [*params, window.start_s - margin, window.end_s + margin]
    ).df()
    return values, labels


# --- identity, engines and roles ------------------------------------------------------------------------


def _text(v: Any) -> str | None:
    """A label value, or None for NULL / NaN / empty."""
    return str(v) if isinstance(v, str) and v else None


def _gpu_key(row: Mapping[str, Any]) -> str:
    if _text(row.get("uuid")):
        return str(row["uuid"])
    if _text(row.get("parent_uuid")):
        gi = row.get("mig_instance_id")
        return f"{row['parent_uuid']}/gi{int(gi) if pd.notna(gi) else '?'}"
    return f"{row['node']}/{row['device']}"


def _identifiers(g: Mapping[str, Any]) -> set[str]:
    ids = {g["gpu"], f"{g['node']}/{g['device']}"}
    for k in ("uuid", "k8s_pod"):
        if _text(g.get(k)):
            ids.add(str(g[k]))
    if _text(g.get("k8s_pod")) and _text(g.get("k8s_namespace")):
        ids.add(f"{g['k8s_namespace']}/{g['k8s_pod']}")
    return ids


def _check_role(where: str, role: str) -> str:
    r = str(role).lower()
    if r not in ROLES:
        raise ExternalAttributionError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    return r


def _dynamo_roles(labels: pd.DataFrame) -> dict[str, str]:
    """endpoint → role from Dynamo component labels (``*prefill*`` → prefill; ``*decode*``, or
    ``backend`` next to a prefill component in the same Dynamo namespace → decode)."""
    out: dict[str, str] = {}
    comps = labels.dropna(subset=["dynamo_component"])
    if comps.empty:
        return out
    with_prefill = {
        ns
        for ns, c in zip(comps["dynamo_namespace"], comps["dynamo_component"], strict=True)
        if "prefill" in c.lower()
    }
    for ep, comp, ns in zip(
        comps["endpoint"], comps["dynamo_component"], comps["dynamo_namespace"], strict=True
    ):
        c = comp.lower()
        if "prefill" in c:
            out[ep] = PREFILL
        elif "decode" in c or ns in with_prefill:
            out[ep] = DECODE
        else:
            out[ep] = MIXED
    return out


def _assign_engines(
    gpus: pd.DataFrame,
    labels: pd.DataFrame,
    engine_gpus: Mapping[str, Sequence[str]] | None,
    notes: list[str],
) -> dict[str, str]:
    """GPU key → engine endpoint: the ``engine_gpus`` mapping, else the engine's ``pod`` label
    matched to the GPU's Kubernetes pod (dcgm-exporter's pod attribution), else the one engine
    endpoint on the GPU's machine: the only engine whose URL has the host of the GPU's dcgm-exporter
    URL, else the only engine stored under the GPU's node (the collector's node: an engine and a
    dcgm-exporter it scrapes on localhost), else the only engine whose URL host is the node's name."""
    endpoints = set(labels["endpoint"]) if not labels.empty else set()
    out: dict[str, str] = {}
    ids = {g["gpu"]: _identifiers(g) for g in gpus.to_dict("records")}
    if engine_gpus:
        for ep, wanted in engine_gpus.items():
            if isinstance(wanted, str):
                wanted = [wanted]
            if ep not in endpoints:
                notes.append(f"engine {ep!r} of the mapping has no engine_metrics in the window")
            for w in wanted:
                hits = [k for k, s in ids.items() if w in s]
                if not hits:
                    known = ", ".join(sorted(ids)) or "none"
                    raise ExternalAttributionError(
                        f"engine_gpus[{ep!r}]: no GPU {w!r} in the window; GPUs (uuid or node/device): {known}"
                    )
                for k in hits:
                    out[k] = ep
    by_pod = {}
    if not labels.empty:
        for ep, pod, ns in zip(labels["endpoint"], labels["pod"], labels["namespace"], strict=True):
            if isinstance(pod, str) and pod:
                by_pod[pod] = ep
                if isinstance(ns, str) and ns:
                    by_pod[f"{ns}/{pod}"] = ep
    per_host: dict[str, list[str]] = {}
    for ep in sorted(endpoints):
        per_host.setdefault(_host(ep), []).append(ep)
    stored_on: dict[str, list[str]] = {}
    if not labels.empty and "node" in labels:
        for ep, node in zip(labels["endpoint"], labels["node"], strict=True):
            if isinstance(node, str) and node:
                stored_on.setdefault(node, []).append(ep)
    for g in gpus.to_dict("records"):
        k = g["gpu"]
        if k in out:
            continue
        pod, ns = _text(g.get("k8s_pod")), _text(g.get("k8s_namespace"))
        ep = by_pod.get(f"{ns}/{pod}") if pod and ns else None
        ep = ep or (by_pod.get(pod) if pod else None)
        if ep:
            out[k] = ep
            continue
        source = str(g.get("source") or "")
        exporter = _host(source.removeprefix("dcgm:")) if source.startswith("dcgm:") else None
        for candidates, where in (
            (
                per_host.get(exporter, []) if exporter else [],
                f"at the host of its dcgm-exporter ({exporter})",
            ),
            (stored_on.get(str(g["node"]), []), f"scraped on node {g['node']}"),
            (per_host.get(str(g["node"]), []), f"at host {g['node']}"),
        ):
            if len(candidates) == 1:
                out[k] = candidates[0]
                notes.append(f"GPU {k}: engine {candidates[0]} taken as the only engine {where}")
                break
    return out


def _host(url: str) -> str:
    """The host of a URL (``http://10.0.0.5:8000/metrics`` → ``10.0.0.5``)."""
    return re.sub(r"^[a-z]+://", "", url).split("/")[0].split(":")[0]


# --- fits ------------------------------------------------------------------------------------------------


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of the least-squares fits over every
    subset of columns whose coefficients are all ≥ 0 (exact for the ≤ 4 columns used here)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.shape[1]
    best, best_rss = np.zeros(n), float(np.sum(y * y))
    for r in range(1, n + 1):
        for cols in itertools.combinations(range(n), r):
            sub = x[:, cols]
            if not np.any(sub):
                continue
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            rss = float(np.sum((y - sub @ coef) ** 2))
            if rss < best_rss - 1e-15:
                best_rss = rss
                best = np.zeros(n)
                best[list(cols)] = coef
    return best


def _r2(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    if len(y) < 2:
        return float("nan")
    ss = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - x @ coef) ** 2)) / ss if ss > 0 else float("nan")


def _rel_rmse(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    """Root-mean-square residual over the mean of ``y`` (the fit's error per interval)."""
    if not len(y) or y.mean() <= 0:
        return float("nan")
    return float(np.sqrt(np.mean((y - x @ coef) ** 2)) / y.mean())


def _cumulative(ts: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A counter made monotonic: a drop is a restart, whose new value is the increase."""
    inc = np.diff(v, prepend=v[0])
    inc = np.where(inc < 0, v, inc)
    inc[0] = 0.0
    return v[0] + np.cumsum(inc)


@dataclass(slots=True)
class _Engine:
    endpoint: str
    engine: str | None
    series: dict[str, tuple[np.ndarray, np.ndarray]]  # metric → (ts_s, cumulative or gauge value)

    def increase(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """The counter's increase over each ``(a, b]`` (interpolated); NaN outside its scrapes."""
        s = self.series.get(metric)
        if s is None or len(s[0]) < 2:
            return None
        ts, cum = s
        inside = (a >= ts[0] - 1e-6) & (b <= ts[-1] + 1e-6)
        out = np.interp(b, ts, cum) - np.interp(a, ts, cum)
        return np.where(inside, out, np.nan)

    def clipped_increase(self, metric: str, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """The counter's increase over the part of each ``(a, b]`` inside its scrapes (0 outside)."""
        s = self.series.get(metric)
        if s is None or len(s[0]) < 2:
            return None
        ts, cum = s
        return np.interp(b, ts, cum) - np.interp(a, ts, cum)

    def span(self, metric: str, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
        """``(start, end)`` clipped to the metric's scrapes, as 1-element arrays for :meth:`increase`."""
        s = self.series.get(metric)
        lo, hi = (start_s, end_s) if s is None else (max(start_s, s[0][0]), min(end_s, s[0][-1]))
        return np.array([lo]), np.array([max(lo, hi)])

    def mean_gauge(self, metric: str, start_s: float, end_s: float) -> float:
        s = self.series.get(metric)
        if s is None:
            return float("nan")
        ts, v = s
        m = (ts >= start_s) & (ts < end_s)
        return float(v[m].mean()) if m.any() else float("nan")


def _engines(values: pd.DataFrame) -> dict[str, _Engine]:
    out: dict[str, _Engine] = {}
    for (ep, metric), grp in values.groupby(["endpoint", "metric"], sort=False):
        ts = grp["ts_s"].to_numpy(dtype=float)
        v = grp["value"].to_numpy(dtype=float)
        if metric in ENGINE_COUNTERS:
            v = _cumulative(ts, v)
        e = out.setdefault(ep, _Engine(ep, grp["engine"].iloc[0], {}))
        e.series[metric] = (ts, v)
    return out


# --- MIG --------------------------------------------------------------------------------------------------

_SLICES = re.compile(r"^(\d+)g\.")


def _mig_energy(iv: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """Give MIG instances their share of the physical GPU's interval energy (counted once)."""
    inst = iv["parent_uuid"].notna()
    if not inst.any():
        return iv
    parents = set(iv.loc[inst, "parent_uuid"])
    whole = iv[~inst & iv["uuid"].isin(parents)]
    iv = iv.copy()
    for parent in parents:
        w = whole[whole["uuid"] == parent]
        mine = iv.index[inst & (iv["parent_uuid"] == parent)]
        if w.empty:
            notes.append(f"MIG GPU {parent}: no whole-GPU samples, so no energy for its instances")
            iv.loc[mine, ["energy_j"]] = np.nan
            continue
        floor_w = float(np.nanmin(w["energy_j"] / w["dt_s"])) if w["energy_j"].notna().any() else 0.0
        energy_at = dict(zip(w["ts_s"], w["energy_j"], strict=True))
        src_at = dict(zip(w["ts_s"], w["energy_source"], strict=True))
        sub = iv.loc[mine]
        slices = sub["mig_profile"].map(
            lambda p: float(m.group(1)) if isinstance(p, str) and (m := _SLICES.match(p)) else 1.0
        )
        frac = (sub["busy_s"] / sub["dt_s"]).fillna(0.0)
        for ts, grp in sub.groupby("ts_s"):
            e = energy_at.get(ts)
            if e is None or not np.isfinite(e):
                iv.loc[grp.index, "energy_j"] = np.nan
                continue
            g = slices.loc[grp.index]
            dt = float(grp["dt_s"].iloc[0])
            base = min(e, floor_w * dt)
            dyn_w = g * frac.loc[grp.index]
            dyn = (e - base) * (dyn_w / dyn_w.sum() if dyn_w.sum() > 0 else g / g.sum())
            iv.loc[grp.index, "energy_j"] = base * g / g.sum() + dyn
            iv.loc[grp.index, "energy_source"] = src_at.get(ts)
        notes.append(
            f"MIG GPU {parent}: {len(sub['gpu'].unique())} instances; its energy counted once, split "
            f"by compute slices (floor {floor_w:.1f} W) and slices × busy fraction (the rest)"
        )
    # the physical GPU row of a MIG GPU has no activity of its own: its time is the instances'
    return iv[~(~inst & iv["uuid"].isin(parents))]


# --- the attribution ------------------------------------------------------------------------------------------


def external_attribution(
    con: duckdb.DuckDBPyConnection,
    window: Window,
    *,
    engine_gpus: Mapping[str, Sequence[str]] | None = None,
    roles: Mapping[str, str] | None = None,
    gpus: Collection[GpuId] | None = None,
) -> ExternalAttribution:
    """Estimate, per GPU and per pool, the share of GPU time and energy spent in prefill, decode,
    other busy work and idle, from dcgm-exporter samples and engine ``/metrics`` (module docstring).

    ``gpus``: only these GPUs (their :func:`gpu_id`; a MIG instance's physical GPU is kept for its
    energy), e.g. those without phaselens telemetry in a window that also has a bundled stack.

    ``engine_gpus``: engine endpoint (as stored in ``engine_metrics.endpoint``) → the GPUs serving it
    (UUIDs, ``node/device`` or Kubernetes pods); without it, GPUs are matched to engines by the
    engine series' ``pod`` label, or as the only engine scraped on the GPU's node. ``roles``: GPU,
    pod or engine endpoint → ``prefill`` / ``decode`` / ``mixed`` (overrides what the store says).
    """
    trust = Trust().add(ESTIMATED, "phase shares estimated from dcgm-exporter and engine metrics")
    missing: list[str] = []
    iv = _intervals(con, window)
    if gpus is not None and not iv.empty:
        wanted = set(gpus)
        ids = pd.Series(
            [gpu_id(*r) for r in zip(iv["node"], iv["source"], iv["device"], iv["index"], strict=True)],
            index=iv.index,
        )
        keep = ids.isin(wanted)
        parents = set(iv.loc[keep, "parent_uuid"].dropna())
        iv = iv[keep | (iv["parent_uuid"].isna() & iv["uuid"].isin(parents))].reset_index(drop=True)
    values, labels = _engine_rows(con, window)
    if iv.empty:
        missing.append("no GPU samples (two or more per GPU) in the window")
        return ExternalAttribution(
            window, pd.DataFrame(columns=_GPU_COLUMNS), pd.DataFrame(), pd.DataFrame(), iv, trust, missing
        )
    for label in sorted(set(iv["trust"])):
        if label in LABELS:
            trust.add(label)
    iv["gpu"] = [
        _gpu_key(r)
        for r in iv[["uuid", "parent_uuid", "mig_instance_id", "node", "device"]].to_dict("records")
    ]
    # energy per interval: the counter's rise, else integrated power (flagged)
    iv["energy_j"] = iv["counter_energy_j"].where(iv["counter_energy_j"].notna(), iv["integrated_energy_j"])
    iv["energy_source"] = np.where(
        iv["counter_energy_j"].notna(),
        "counter",
        np.where(iv["integrated_energy_j"].notna(), "integrated power", None),
    )
    resets = int(iv["counter_reset"].fillna(False).sum())
    if resets:
        trust.add(ESTIMATED, f"{resets} energy-counter resets: those intervals use integrated power")
    if (iv["energy_source"] == "integrated power").any():
        trust.add(ESTIMATED, "energy integrated from power (trapezoid) where the energy counter is missing")
    notes: list[str] = []
    iv = _mig_energy(iv, notes)
    gpus = (
        iv.sort_values("ts_s")
        .groupby("gpu", sort=True)
        .agg(
            node=("node", "first"),
            device=("device", "first"),
            uuid=("uuid", "first"),
            parent_uuid=("parent_uuid", "first"),
            mig_profile=("mig_profile", "first"),
            k8s_pod=("k8s_pod", "last"),
            k8s_namespace=("k8s_namespace", "last"),
            store_role=("role", "last"),
            source=("source", "first"),
        )
        .reset_index()
    )
    gpu_engine = _assign_engines(gpus, labels, engine_gpus, notes)
    dyn_roles = _dynamo_roles(labels)
    engines = _engines(values)
    # roles
    role_of: dict[str, str] = {}
    role_why: dict[str, str] = {}
    given = {str(k): _check_role(f"roles[{k!r}]", v) for k, v in (roles or {}).items()}
    for g in gpus.to_dict("records"):
        k = g["gpu"]
        ep = gpu_engine.get(k)
        hit = next((given[i] for i in sorted(_identifiers(g) | ({ep} if ep else set())) if i in given), None)
        if hit:
            role_of[k], role_why[k] = hit, "given"
        elif isinstance(g["store_role"], str) and g["store_role"] in ROLES:
            role_of[k], role_why[k] = g["store_role"], "store"
        elif ep and ep in dyn_roles:
            role_of[k], role_why[k] = dyn_roles[ep], "dynamo component"
        elif ep:
            role_of[k], role_why[k] = MIXED, "aggregated engine"
    if roles:
        unknown = (
            set(given)
            - {i for g in gpus.to_dict("records") for i in _identifiers(g)}
            - set(gpu_engine.values())
        )
        if unknown:
            raise ExternalAttributionError(
                f"roles name {', '.join(sorted(unknown))}, which match no GPU, pod or engine endpoint in the window"
            )
    for state in STATES:
        iv[f"{state}_s"] = 0.0
    for col in SERVED:
        iv[col] = 0.0
    iv["idle_s"] = (iv["dt_s"] - iv["busy_s"]).clip(lower=0.0)
    iv["method"] = "busy-only"
    iv["pool"] = iv["gpu"].map(role_of)
    iv["endpoint"] = iv["gpu"].map(gpu_engine)
    iv["busy_s"] = iv["busy_s"].fillna(0.0)
    no_busy = iv["busy_measure"].isna()
    if no_busy.any():
        missing.append(
            f"{int(no_busy.sum())} intervals of {iv.loc[no_busy, 'gpu'].nunique()} GPUs have no "
            "utilization field: their time is not attributed"
        )
        iv.loc[no_busy, "idle_s"] = 0.0
    # pool membership
    for role, col in ((PREFILL, "prefill_s"), (DECODE, "decode_s")):
        m = iv["pool"] == role
        iv.loc[m, col] = iv.loc[m, "busy_s"]
        iv.loc[m, "method"] = "pool"
    # aggregated engines: the work model
    engine_rows = []
    for ep in sorted(set(gpu_engine.values()) | set(engines)):
        e = engines.get(ep)
        mine = iv.index[(iv["endpoint"] == ep)]
        role = next((role_of[k] for k in iv.loc[mine, "gpu"].unique() if k in role_of), None)
        row: dict[str, Any] = {
            "endpoint": ep,
            "engine": e.engine if e else None,
            "gpus": ",".join(sorted(iv.loc[mine, "gpu"].unique())),
            "role": role,
            "role_from": ", ".join(
                sorted({role_why[k] for k in iv.loc[mine, "gpu"].unique() if k in role_why})
            ),
        }
        engine_rows.append(row)
        if e is None:
            if len(mine):
                missing.append(f"engine {ep}: no engine_metrics in the window")
            continue
        a = (iv.loc[mine, "ts_s"] - iv.loc[mine, "dt_s"]).to_numpy()
        b = iv.loc[mine, "ts_s"].to_numpy()
        span = (window.start_s, window.end_s)
        _served(iv, mine, e, role, (a, b), window, row)
        row["model"] = _model_of(labels, ep)
        p_inc = e.increase("prefill_seconds_sum", *e.span("prefill_seconds_sum", *span))
        d_inc = e.increase("decode_seconds_sum", *e.span("decode_seconds_sum", *span))
        work = {
            "iterations": e.increase("iteration_tokens_total_count", a, b),
            "prompt_tokens": e.increase("prompt_tokens_total", a, b),
            "generation_tokens": e.increase("generation_tokens_total", a, b),
        }
        whole = {
            k: e.increase(m, *e.span(m, *span))
            for k, m in (
                ("iterations", "iteration_tokens_total_count"),
                ("prompt_tokens", "prompt_tokens_total"),
                ("generation_tokens", "generation_tokens_total"),
            )
        }
        dur = window.duration_s
        row.update(
            iterations=_first(whole["iterations"]),
            prompt_tokens=_first(whole["prompt_tokens"]),
            generation_tokens=_first(whole["generation_tokens"]),
            prefill_concurrency=_first(p_inc) / dur if p_inc is not None else float("nan"),
            decode_concurrency=_first(d_inc) / dur if d_inc is not None else float("nan"),
            requests_running_mean=e.mean_gauge("requests_running", *span),
            requests_waiting_mean=e.mean_gauge("requests_waiting", *span),
        )
        it, gt = row["iterations"], row["generation_tokens"]
        row["decode_batch_mean"] = gt / it if it and np.isfinite(it) and it > 0 else float("nan")
        if role != MIXED or not len(mine):
            continue
        if work["prompt_tokens"] is None:
            missing.append(f"engine {ep}: no prompt_tokens_total, so no prefill/decode split of its GPUs")
            continue
        x = np.column_stack([w if w is not None else np.zeros(len(mine)) for w in work.values()])
        if work["iterations"] is None:
            trust.add(
                ESTIMATED, f"engine {ep}: no iteration_tokens_total: the work model has no per-step term"
            )
        ok = np.all(np.isfinite(x), axis=1)
        if not ok.all():
            missing.append(f"engine {ep}: {int((~ok).sum())} GPU intervals outside its scrapes: not split")
        y = iv.loc[mine, "busy_s"].to_numpy()
        coef = nnls(x[ok], y[ok]) if ok.sum() >= 2 else np.zeros(3)
        row.update(
            c_iter_s=coef[0],
            c_prompt_token_s=coef[1],
            c_gen_token_s=coef[2],
            fit_r2=_r2(x[ok], y[ok], coef) if ok.sum() >= 2 else float("nan"),
            fit_intervals=int(ok.sum()),
            fit_rel_rmse=_rel_rmse(x[ok], y[ok], coef),
        )
        if coef[1] == 0:
            trust.add(
                ESTIMATED, f"engine {ep}: the fit gave prompt tokens no cost; its busy time is all decode"
            )
        pre = np.where(ok, coef[1] * np.nan_to_num(x[:, 1]), 0.0)
        dec = np.where(ok, coef[0] * np.nan_to_num(x[:, 0]) + coef[2] * np.nan_to_num(x[:, 2]), 0.0)
        tot = pre + dec
        has = ok & (tot > 0)
        iv.loc[mine, "prefill_s"] = np.where(has, y * pre / np.where(has, tot, 1.0), 0.0)
        iv.loc[mine, "decode_s"] = np.where(has, y * dec / np.where(has, tot, 1.0), 0.0)
        iv.loc[mine, "other_busy_s"] = np.where(has, 0.0, y)
        iv.loc[mine, "method"] = "engine-metrics"
        trust.add(
            ESTIMATED,
            "aggregated engines: measured busy time split by an NNLS work model "
            "(c_iter × iterations + c_prompt × prompt tokens + c_gen × generated tokens)",
        )
    busy_only = iv["method"] == "busy-only"
    iv.loc[busy_only, "other_busy_s"] = iv.loc[busy_only, "busy_s"]
    for k in sorted(set(iv.loc[busy_only, "gpu"])):
        missing.append(f"GPU {k}: no engine or role known, its busy time is other_busy (not split by phase)")
    _apportion_energy(iv, missing, trust)
    per_gpu = _summarise(iv, ["gpu"], gpus)
    per_gpu["role_from"] = per_gpu["gpu"].map(role_why)
    per_pool = _summarise(iv.assign(pool=iv["pool"].astype(object).fillna("unknown")), ["pool"], None)
    trust.notes += [n for n in dict.fromkeys(notes) if n not in trust.notes]
    engines_df = pd.DataFrame(engine_rows)
    return ExternalAttribution(window, per_gpu, per_pool, engines_df, iv, trust, missing)


#: per interval, what the engine served on the GPU (its share of the engine's counters):
#: column → (engine counter, the role whose engines do not count it)
SERVED = {
    "input_tokens": ("prompt_tokens_total", DECODE),  # a decode worker re-counts the prompts it was handed
    "output_tokens": ("generation_tokens_total", PREFILL),  # a prefill worker's first token is the decode's
    "requests": ("requests_total", PREFILL),  # a disaggregated request finishes on its decode worker
}


def _served(
    iv: pd.DataFrame,
    mine: pd.Index,
    e: _Engine,
    role: str | None,
    intervals: tuple[np.ndarray, np.ndarray],
    window: Window,
    row: dict[str, Any],
) -> None:
    """Fill the :data:`SERVED` columns of an engine's GPU intervals: each counter's increase over the
    interval (the part inside the engine's scrapes) shared evenly by the engine's GPUs; and the
    engine row's window totals of them (``served_<column>``)."""
    gpus = max(1, int(iv.loc[mine, "gpu"].nunique()))
    for col, (metric, not_in) in SERVED.items():
        inc = e.clipped_increase(metric, *intervals) if role != not_in else None
        if inc is not None:
            iv.loc[mine, col] = np.nan_to_num(inc) / gpus
        whole = e.clipped_increase(metric, *e.span(metric, window.start_s, window.end_s))
        row[f"served_{col}"] = _first(whole) if whole is not None and role != not_in else 0.0


def _model_of(labels: pd.DataFrame, endpoint: str) -> str | None:
    """The model an engine serves (its series' ``model_name`` label), None where it has none."""
    if labels.empty or "model" not in labels:
        return None
    hit = labels.loc[labels["endpoint"] == endpoint, "model"]
    return _text(hit.iloc[0]) if len(hit) else None


GpuId = tuple[Any, ...]  # (node, source, device, index) of a GPU's sample rows


def gpu_id(node: Any, source: Any, device: Any, index: Any) -> GpuId:
    """A GPU's identity in the store, as the attribution's rows and the sample intervals carry it."""
    return (str(node), str(source), str(device), None if index is None or pd.isna(index) else int(index))


def _first(a: np.ndarray | None) -> float:
    return float(a[0]) if a is not None and len(a) else float("nan")


def _apportion_energy(iv: pd.DataFrame, missing: list[str], trust: Trust) -> None:
    """Per GPU, fit watts per state and split each interval's measured energy by them.

    The model, in watts: ``energy_j / dt_s = w_idle + Σ_state x_state × busy_state_s / dt_s`` with
    ``w_idle ≥ 0`` and every excess ``x_state ≥ 0`` (a busy GPU draws at least its idle power), so a
    state's watts are ``w_idle + x_state``. Rows: every interval; for a GPU with one busy state (a
    pool) also every sample's own power reading against its own utilization (``POWER_USAGE`` and
    ``GPU_UTIL`` describe the last second or so), whose spread of busy fractions separates idle
    from busy watts when scrapes are long. For a GPU with several busy states those readings add
    more noise (the last second's phase mix is not the interval's) than they help, and they are
    left out.
    """
    busy_states = [s for s in STATES if s != "idle"]
    fallbacks: list[str] = []
    zero_idle: list[str] = []
    for s in STATES:
        iv[f"{s}_energy_j"] = np.nan
    iv["power_model"] = None
    for k, grp in iv.groupby("gpu"):
        e = grp["energy_j"].to_numpy(dtype=float)
        ok = np.isfinite(e)
        if not ok.any():
            missing.append(f"GPU {k}: no energy counter and no power: no energy attributed")
            continue
        dt = grp["dt_s"].to_numpy(dtype=float)
        t = grp[[f"{s}_s" for s in busy_states]].to_numpy(dtype=float)
        x = np.column_stack([np.ones(len(dt)), t / dt[:, None]])[ok]
        y = (e / dt)[ok]
        busy = t.sum(axis=1)
        mix = np.divide(t, busy[:, None], out=np.zeros_like(t), where=busy[:, None] > 0)
        util = grp["gpu_util_pct"].to_numpy(dtype=float) / 100.0
        power = grp["power_w"].to_numpy(dtype=float)
        pts = np.isfinite(util) & np.isfinite(power) & (busy > 0) | (
            np.isfinite(util) & np.isfinite(power) & (util == 0)
        )
        few = int(ok.sum()) < MIN_PHASE_FIT_INTERVALS
        active = t[ok].sum(axis=0) >= 0.01 * dt[ok].sum()
        if pts.any() and int(active.sum()) <= 1:  # one busy state: the readings' mix is exact
            xp = np.column_stack([np.ones(int(pts.sum())), util[pts, None] * mix[pts]])
            x = np.vstack([x, xp])
            y = np.concatenate([y, power[pts]])
        coef = nnls(x, y)
        # A fit is physical when every busy state that takes >= 1 % of the time draws at most 1.5 x
        # the power limit (else 2 x the highest reading; at least idle by construction); otherwise
        # (or with fewer than 3 intervals, or fewer than MIN_PHASE_FIT_INTERVALS and several busy states)
        # fall back to idle + one busy wattage, busy energy split by time (flagged).
        limit = grp["power_limit_w"].max() if "power_limit_w" in grp else np.nan
        cap = (
            1.5 * float(limit)
            if np.isfinite(limit)
            else (2.0 * float(np.nanmax(power)) if np.isfinite(power).any() else np.inf)
        )
        excess = coef[1:]
        bad = (
            int(ok.sum()) < 3
            or (few and int(active.sum()) > 1)  # phase watts not identifiable from a few intervals
            or bool(np.any(active & (coef[0] + excess > cap)))
        )
        if bad:
            x1 = np.column_stack([np.ones(int(ok.sum())), (busy / dt)[ok]])
            y1 = (e / dt)[ok]
            if pts.any():
                x1 = np.vstack([x1, np.column_stack([np.ones(int(pts.sum())), util[pts]])])
                y1 = np.concatenate([y1, power[pts]])
            c1 = nnls(x1, y1)
            coef = np.concatenate([[c1[0]], np.full(len(busy_states), c1[1])])
            fallbacks.append(str(k))
        if coef[0] <= 0 and (dt[ok].sum() - busy[ok].sum()) >= 0.01 * dt[ok].sum():
            zero_idle.append(str(k))
        watts = {"idle": coef[0], **{s: coef[0] + c for s, c in zip(busy_states, coef[1:], strict=True)}}
        w = np.array([watts[s] for s in STATES])
        parts = grp[[f"{s}_s" for s in STATES]].to_numpy(dtype=float) * w
        tot = parts.sum(axis=1)
        fallback = tot <= 0
        parts[fallback] = grp[[f"{s}_s" for s in STATES]].to_numpy(dtype=float)[fallback]
        tot = parts.sum(axis=1)
        share = np.divide(parts, tot[:, None], out=np.zeros_like(parts), where=tot[:, None] > 0)
        for j, s in enumerate(STATES):
            iv.loc[grp.index, f"{s}_energy_j"] = np.where(ok, e * share[:, j], np.nan)
        iv.loc[grp.index, "power_model"] = json.dumps({s: round(float(v), 1) for s, v in watts.items()})
    if zero_idle:
        trust.add(
            ESTIMATED,
            f"GPUs {', '.join(zero_idle)}: idle watts not identifiable (busy about equally in every "
            "interval); the fit gives idle 0 W, so their idle energy is understated",
        )
    if fallbacks:
        trust.add(
            ESTIMATED,
            f"GPUs {', '.join(fallbacks)}: too few or too alike intervals to fit watts per phase; "
            "their busy energy is split by busy time (one busy wattage)",
        )


_GPU_COLUMNS = [
    "gpu",
    "node",
    "uuid",
    "parent_uuid",
    "mig_profile",
    "k8s_pod",
    "pool",
    "endpoint",
    "method",
    "busy_measure",
    "energy_source",
    "intervals",
    "span_s",
    "energy_j",
    *[f"{s}_{m}" for s in STATES for m in ("s", "share", "energy_j", "energy_share")],
]


def _summarise(iv: pd.DataFrame, by: list[str], gpus: pd.DataFrame | None) -> pd.DataFrame:
    agg: dict[str, Any] = {
        "intervals": ("dt_s", "size"),
        "span_s": ("dt_s", "sum"),
        "energy_j": ("energy_j", lambda s: s.sum(min_count=1)),
        "pool": ("pool", "first"),
        "endpoint": ("endpoint", "first"),
        "method": ("method", lambda s: ",".join(sorted(set(s)))),
        "busy_measure": ("busy_measure", lambda s: ",".join(sorted(set(s.dropna())))),
        "energy_source": ("energy_source", lambda s: ",".join(sorted(set(s.dropna())))),
        "power_model_w": ("power_model", "last"),
    }
    for s in STATES:
        agg[f"{s}_s"] = (f"{s}_s", "sum")
        agg[f"{s}_energy_j"] = (f"{s}_energy_j", lambda x: x.sum(min_count=1))
    if by == ["pool"]:
        agg.pop("pool")
        agg["gpus"] = ("gpu", "nunique")
        agg.pop("power_model_w")
    out = iv.groupby(by, dropna=False).agg(**agg).reset_index()
    span = out["span_s"].where(out["span_s"] > 0)
    energy = out["energy_j"].where(out["energy_j"] > 0)
    for s in STATES:
        out[f"{s}_share"] = out[f"{s}_s"] / span
        out[f"{s}_energy_share"] = out[f"{s}_energy_j"] / energy
    if gpus is not None:
        out = out.merge(gpus.drop(columns=["store_role"]), on="gpu", how="left")
    return out


__all__ = [
    "ENGINE_COUNTERS",
    "SERVED",
    "STATES",
    "ExternalAttribution",
    "ExternalAttributionError",
    "GpuId",
    "external_attribution",
    "gpu_id",
    "nnls",
]
