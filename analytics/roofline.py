"""Waste against the roofline: MFU and MBU per phase, stranded compute and stranded bandwidth.

Each iteration row carries its work on its GPU (``flops``, ``hbm_bytes``: store migration 14, counted
by serving/devices/roofline.py). Over a window, per phase (``prefill``, ``decode``, ``mixed``) and per
fleet, pool (role) and GPU:

* achieved FLOP/s and bytes/s = work / GPU-busy seconds (``busy_s``: the iteration's GPU-busy part, the
  store's one definition, ``collector.store.iteration_seconds.busy_len_sql``);
* **MFU** = ``Σ flops / Σ (busy_s · dense peak FLOP/s of the dtype)``, **MBU** = ``Σ hbm_bytes /
  Σ (busy_s · peak HBM bytes/s)``; the peaks are the GPU's (serving/devices/gpu_specs.py: ``emulated:``
  and ``simulated:`` devices by key, a real GPU by its NVML name; a simulated scenario's dtype from its
  layout, bf16 otherwise);
* **stranded compute** = decode busy time × (1 − MFU of decode) and **stranded bandwidth** = prefill
  busy time × (1 − MBU of prefill), GPU-seconds computed from work and time. Mixed (chunked-prefill)
  iterations have their own MFU/MBU: their decode share (by work: prefill tokens vs decode sequences)
  counts in stranded compute by 1 − their MFU, their prefill share in stranded bandwidth by 1 − their
  MBU — the rule of the phase attribution's categories (:mod:`analytics.stranded`, per GPU-hour there
  with :func:`phase_rates`), so the Overview's stranded share and this table rest on one basis.

Beside them, the DCGM-style activities of the same GPUs while each phase ran (``sm_active_pct``,
``tensor_active_pct``, ``dram_active_pct``, per busy second): over the GPU samples taken in the GPU's
seconds whose busy time was at least :data:`PHASE_DOMINANCE` that phase's (the store's per-second
rollup, ``iteration_seconds``), the sum of the activity % over the sum of the utilization % (each
sample's means cover its own window, idle time included; utilization is the busy share of it), i.e.
the activity per second a kernel ran. Measured where the samples are (NVML GPM,
DCGM), modeled on emulated / simulated GPUs (serving/devices/gpu_model.py).

Trust: a row is ``measured`` when a real GPU's engine counted the work over measured time, ``emulated`` /
``simulated`` when the GPU model did, plus ``unvalidated`` on a GPU or dtype the model was never checked
on (:func:`serving.devices.gpu_specs.fidelity`). Rows whose GPU is not one the model knows (no peak) or
that carry no count are left out and named in ``missing``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pandas as pd

from analytics.trust import EMULATED, MEASURED, SIMULATED, UNVALIDATED, Trust
from analytics.window import Window
from collector.store.iteration_seconds import PSHARE_SQL, busy_len_sql
from serving.devices.gpu_specs import GPU_SPECS, GpuSpec, dtype_of_name, fidelity, gpu_spec_for_name

PHASES = ("prefill", "decode", "mixed")
_SIM = "trust_label(node, source) = 'simulated'"  # the store's one definition (migration 9)


@dataclass(slots=True)
class Roofline:
    """MFU/MBU per scope and phase (``table``: rows with ``scope`` fleet | pool | gpu, ``role``,
    ``gpu``, ``phase``, ``iterations``, ``busy_s``, ``flops``, ``hbm_bytes``, ``achieved_tflops_s``,
    ``achieved_tb_s``, ``mfu``, ``mbu``, the activities beside them, ``trust``), the stranded GPU-seconds
    per fleet and pool (``stranded``), the labels of the whole and what was left out."""

    window: Window
    table: list[dict[str, Any]]
    stranded: list[dict[str, Any]]
    trust: Trust
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window.describe(),
            "table": self.table,
            "stranded": self.stranded,
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


def _spec_of(device: Any, name: Any) -> GpuSpec | None:
    """The spec of a row's GPU: by key for ``emulated:``/``simulated:`` devices, else by NVML name
    (NULLs read from pandas as NaN: no spec)."""
    device = device if isinstance(device, str) else ""
    name = name if isinstance(name, str) else None
    kind, _, key = device.partition(":")
    if kind in ("emulated", "simulated") and key in GPU_SPECS:
        return GPU_SPECS[key]
    return gpu_spec_for_name(name)


def _row_trust(node: str, source: str, device: Any, emulated: Any) -> str:
    if node.startswith("sim:") or source == "simulated":
        return SIMULATED
    flagged = emulated is not None and emulated == emulated and bool(emulated)  # NULL reads as NaN
    if (isinstance(device, str) and device.startswith("emulated:")) or flagged:
        return EMULATED
    return MEASURED


def _scenario_dtypes(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    try:
        rows = con.execute("SELECT node, layout FROM scenarios").fetchall()
    except duckdb.Error:
        return {}
    out = {}
    for node, layout in rows:
        try:
            out[node] = (json.loads(layout) if isinstance(layout, str) else layout or {}).get(
                "dtype"
            ) or "bf16"
        except (ValueError, AttributeError):
            out[node] = "bf16"
    return out


def _work_sql(pred: str, *, hourly: bool = False) -> str:
    """Per GPU and phase (and per hour of the iteration's start, ``hour_s``, with ``hourly``): the
    work, the GPU-busy seconds and the iterations of the window, with the GPU's role, name and
    emulated flag from its latest ``devices`` row with a worker (a GPU that changed role inside the
    window counts under its last one)."""
    hour = "floor(start_s / 3600.0) * 3600.0 AS hour_s, " if hourly else ""
    return f"""
WITH w AS (
    SELECT node, source, gpu_uuid, device, phase, {hour}
           count(*) AS iterations, count(flops) AS counted,
           sum(flops) AS flops, sum(hbm_bytes) AS hbm_bytes,
           sum(CASE WHEN flops IS NOT NULL THEN {busy_len_sql(_SIM)} END) AS busy_s,
           sum(CASE WHEN flops IS NOT NULL THEN ({PSHARE_SQL}) * {busy_len_sql(_SIM)} END) AS busy_prefill_s
    FROM iterations WHERE {pred} AND start_s >= ? AND start_s < ?
    GROUP BY ALL
), d AS (
    SELECT node, uuid, arg_max(role, since_s) AS role, arg_max(name, since_s) AS gpu_name,
           arg_max(emulated, since_s) AS gpu_emulated
    FROM devices WHERE worker IS NOT NULL AND uuid IS NOT NULL GROUP BY ALL
)
SELECT w.*, coalesce(d.role, 'unknown') AS role, d.gpu_name, d.gpu_emulated
FROM w LEFT JOIN d ON w.node = d.node AND w.gpu_uuid = d.uuid
"""


#: a GPU-second belongs to a phase when that phase's iterations hold this share of its busy seconds
PHASE_DOMINANCE = 0.8

_ACTIVITY_SQL = """
WITH sec AS (
    SELECT node, uuid, sec,
           CASE WHEN prefill_s >= {dom} * busy THEN 'prefill'
                WHEN decode_s >= {dom} * busy THEN 'decode'
                WHEN mixed_prefill_s + mixed_decode_s >= {dom} * busy THEN 'mixed' END AS phase
    FROM (SELECT *, prefill_s + decode_s + mixed_prefill_s + mixed_decode_s AS busy
          FROM iteration_seconds WHERE {spred} AND sec >= ? AND sec < ? AND uuid IS NOT NULL)
    WHERE busy > 0
), gpu AS (
    SELECT k.gpu_key, k.node, d.uuid
    FROM gpu_keys k JOIN (SELECT node, source, device, "index", arg_max(uuid, since_s) AS uuid
                          FROM devices WHERE uuid IS NOT NULL GROUP BY ALL) d
      ON k.node = d.node AND k.source = d.source AND k.device = d.device
     AND k."index" IS NOT DISTINCT FROM d."index"
)
SELECT g.node, g.uuid AS gpu_uuid, sec.phase,
       sum(s.gpu_util_pct) FILTER (WHERE s.sm_active_pct IS NOT NULL) AS util_sm,
       sum(s.sm_active_pct) AS sm,
       sum(s.gpu_util_pct) FILTER (WHERE s.tensor_active_pct IS NOT NULL) AS util_tensor,
       sum(s.tensor_active_pct) AS tensor,
       sum(s.gpu_util_pct) FILTER (WHERE s.dram_active_pct IS NOT NULL) AS util_dram,
       sum(s.dram_active_pct) AS dram
FROM gpu_sample_rows s
JOIN gpu g ON s.gpu_key = g.gpu_key
JOIN sec ON g.node = sec.node AND g.uuid = sec.uuid AND floor(s.ts_s)::BIGINT = sec.sec
WHERE s.ts_s >= ? AND s.ts_s < ? AND s.gpu_util_pct > 0 AND sec.phase IS NOT NULL
GROUP BY ALL
"""


def roofline(con: duckdb.DuckDBPyConnection, window: Window) -> Roofline:
    """MFU, MBU and stranded compute / bandwidth of ``window`` (the module docstring)."""
    pred, par = window.node_sql("node")
    df = con.execute(_work_sql(pred), [*par, window.start_s, window.end_s]).df()
    trust = Trust()
    missing: list[str] = []
    if df.empty:
        raise ValueError("no iterations in the window")
    if not int(df["counted"].sum()):
        raise ValueError(
            f"none of the window's {int(df['iterations'].sum())} iterations carries a work count "
            "(flops, hbm_bytes: store version 14 and an engine or GPU model that counts)"
        )
    dtypes = _scenario_dtypes(con)
    spred, spar = window.node_sql("node")
    try:
        act = con.execute(
            _ACTIVITY_SQL.format(spred=spred, dom=PHASE_DOMINANCE),
            [*spar, int(window.start_s), math.ceil(window.end_s), window.start_s, window.end_s],
        ).df()
    except duckdb.Error as e:  # no samples of that shape: the activities stay unknown
        act = None
        missing.append(f"GPU activities beside MFU/MBU unknown: {e}")
    activity = {}
    if act is not None:
        for r in act.itertuples(index=False):
            activity[(r.node, r.gpu_uuid, r.phase)] = r
    # per (scope key, phase): sums of work, busy, busy x peak, activity-weighted samples, labels
    groups: dict[tuple[str, str | None, str | None, str], dict[str, Any]] = {}
    uncounted = unknown = 0
    for r in df.itertuples(index=False):
        if not r.counted or r.busy_s is None or r.busy_s != r.busy_s or r.busy_s <= 0:
            uncounted += int(r.iterations)
            continue
        uncounted += int(r.iterations - r.counted)
        spec = _spec_of(r.device, r.gpu_name)
        if spec is None:
            unknown += int(r.counted)
            continue
        dtype = dtypes.get(r.node) or dtype_of_name(r.gpu_name)  # a scenario's layout, or the emulated name
        try:
            peak_f = spec.peak_flops_for(dtype)
        except ValueError:
            unknown += int(r.counted)
            continue
        labels = {_row_trust(r.node, r.source, r.device, r.gpu_emulated)}
        ok, note = fidelity(spec, dtype)
        if not ok:
            labels.add(UNVALIDATED)
            trust.add(UNVALIDATED, note)
        for label in labels - {UNVALIDATED}:
            trust.add(label)
        gpu = f"{r.node}/{r.gpu_uuid}"
        a = activity.get((r.node, r.gpu_uuid, r.phase))
        for key in (("fleet", None, None), ("pool", r.role, None), ("gpu", r.role, gpu)):
            g = groups.setdefault(
                (*key, r.phase),
                {"iterations": 0, "busy_s": 0.0, "busy_p": 0.0, "flops": 0.0, "hbm_bytes": 0.0, "peak_f": 0.0,
                 "peak_b": 0.0, "labels": set(), "sm": 0.0, "tensor": 0.0, "dram": 0.0,
                 "n_sm": 0.0, "n_tensor": 0.0, "n_dram": 0.0, "gpu_name": spec.name},
            )  # fmt: skip
            g["iterations"] += int(r.counted)
            g["busy_s"] += float(r.busy_s)
            g["busy_p"] += float(r.busy_prefill_s)
            g["flops"] += float(r.flops)
            g["hbm_bytes"] += float(r.hbm_bytes)
            g["peak_f"] += float(r.busy_s) * peak_f
            g["peak_b"] += float(r.busy_s) * spec.bandwidth_bytes_s
            g["labels"] |= labels
            if a is not None:  # activity-% sums and the utilization-% sums of the same samples
                for k in ("sm", "tensor", "dram"):
                    v, u = getattr(a, k), getattr(a, f"util_{k}")
                    if v is not None and v == v and u is not None and u == u:
                        g[k] += float(v)
                        g[f"n_{k}"] += float(u) / 100.0
    if uncounted:
        missing.append(
            f"{uncounted} iterations without a work count (older rows, a fitted iteration model) left out"
        )
    if unknown:
        missing.append(f"{unknown} iterations on GPUs without known peaks (CPU, an unknown GPU) left out")
    if not groups:
        raise ValueError("no iteration in the window has a work count on a GPU with known peaks")
    table = [_row(key, g) for key, g in sorted(groups.items(), key=_order)]
    stranded = _stranded(groups)
    return Roofline(window, table, stranded, trust, missing)


def _order(item: tuple[tuple[str, str | None, str | None, str], Any]) -> tuple[Any, ...]:
    (scope, role, gpu, phase), _ = item
    return (
        ("fleet", "pool", "gpu").index(scope),
        role or "",
        gpu or "",
        PHASES.index(phase) if phase in PHASES else 9,
    )


def _row(key: tuple[str, str | None, str | None, str], g: dict[str, Any]) -> dict[str, Any]:
    scope, role, gpu, phase = key
    busy = g["busy_s"]
    return {
        "scope": scope,
        "role": role,
        "gpu": gpu,
        "gpu_name": g["gpu_name"] if scope == "gpu" else None,
        "phase": phase,
        "iterations": g["iterations"],
        "busy_s": busy,
        "flops": g["flops"],
        "hbm_bytes": g["hbm_bytes"],
        "achieved_tflops_s": g["flops"] / busy / 1e12 if busy > 0 else None,
        "achieved_tb_s": g["hbm_bytes"] / busy / 1e12 if busy > 0 else None,
        "mfu": g["flops"] / g["peak_f"] if g["peak_f"] > 0 else None,
        "mbu": g["hbm_bytes"] / g["peak_b"] if g["peak_b"] > 0 else None,
        "sm_active_pct": g["sm"] / g["n_sm"] if g["n_sm"] else None,
        "tensor_active_pct": g["tensor"] / g["n_tensor"] if g["n_tensor"] else None,
        "dram_active_pct": g["dram"] / g["n_dram"] if g["n_dram"] else None,
        "trust": sorted(g["labels"]),
    }


def _stranded(groups: dict[tuple[str, str | None, str | None, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fleet and pool: stranded compute (decode busy × (1 − MFU of decode), plus a mixed
    iteration's decode share × (1 − MFU of mixed)) and stranded bandwidth (prefill busy × (1 − MBU of
    prefill), plus the mixed prefill share × (1 − MBU of mixed)), GPU-seconds — the attribution's
    categories (:mod:`analytics.stranded`) on the same rule —, with the activities beside them."""
    out = []
    scopes = sorted(
        {(s, r) for (s, r, _g, _p) in groups if s in ("fleet", "pool")},
        key=lambda k: (k[0] != "fleet", k[1] or ""),
    )
    for scope, role in scopes:
        dec = groups.get((scope, role, None, "decode"))
        pre = groups.get((scope, role, None, "prefill"))
        mix = groups.get((scope, role, None, "mixed"))
        row: dict[str, Any] = {"scope": scope, "role": role}
        mixed_d = mixed_p = None  # (seconds, stranded seconds) of the mixed iterations' two shares
        if mix is not None and mix["peak_f"] > 0:
            mfu_mx, mbu_mx = mix["flops"] / mix["peak_f"], mix["hbm_bytes"] / mix["peak_b"]
            d_s, p_s = mix["busy_s"] - mix["busy_p"], mix["busy_p"]
            mixed_d = (d_s, d_s * (1.0 - min(1.0, mfu_mx)))
            mixed_p = (p_s, p_s * (1.0 - min(1.0, mbu_mx)))
            row.update(mfu_mixed=mfu_mx, mbu_mixed=mbu_mx)
        if dec is not None and dec["peak_f"] > 0:
            mfu = dec["flops"] / dec["peak_f"]
            row.update(
                decode_s=dec["busy_s"],
                mfu_decode=mfu,
                stranded_compute_s=dec["busy_s"] - dec["flops"] * dec["busy_s"] / dec["peak_f"],
                sm_active_decode_pct=dec["sm"] / dec["n_sm"] if dec["n_sm"] else None,
                tensor_active_decode_pct=dec["tensor"] / dec["n_tensor"] if dec["n_tensor"] else None,
            )
        if pre is not None and pre["peak_b"] > 0:
            mbu = pre["hbm_bytes"] / pre["peak_b"]
            row.update(
                prefill_s=pre["busy_s"],
                mbu_prefill=mbu,
                stranded_bandwidth_s=pre["busy_s"] - pre["hbm_bytes"] * pre["busy_s"] / pre["peak_b"],
                dram_active_prefill_pct=pre["dram"] / pre["n_dram"] if pre["n_dram"] else None,
            )
        for key, seconds, part in (
            ("decode_s", "stranded_compute_s", mixed_d),
            ("prefill_s", "stranded_bandwidth_s", mixed_p),
        ):
            if part is not None:
                row[key] = row.get(key, 0.0) + part[0]
                row[seconds] = row.get(seconds, 0.0) + part[1]
        labels = set()
        for g in (dec, pre, mix):
            if g is not None:
                labels |= g["labels"]
        row["trust"] = sorted(labels)
        out.append(row)
    return out


def unvalidated_notes(con: duckdb.DuckDBPyConnection, window: Window) -> list[str]:
    """The notes of the window's GPUs and dtypes the GPU model was never validated on (emulated and
    simulated ones: a real GPU's figures are measured whatever its kind). Empty when there are none."""
    pred, par = window.node_sql("node")
    try:
        rows = con.execute(
            f"SELECT DISTINCT node, device, name FROM devices WHERE {pred} AND emulated", par
        ).fetchall()
    except duckdb.Error:
        return []
    dtypes = _scenario_dtypes(con)
    notes: list[str] = []
    for node, device, name in rows:
        spec = _spec_of(device, name)
        if spec is None:
            continue
        try:
            ok, note = fidelity(spec, dtypes.get(node) or dtype_of_name(name))
        except ValueError:
            continue
        if not ok and note not in notes:
            notes.append(note)
    return notes


#: the columns of :func:`phase_rates`' frames besides their keys (node, uuid; hour_s)
RATE_COLUMNS = ("mfu_decode", "mbu_prefill", "mfu_mixed", "mbu_mixed")
_RATE_OF = {"mfu_decode": ("decode", 0), "mbu_prefill": ("prefill", 1), "mfu_mixed": ("mixed", 0),
            "mbu_mixed": ("mixed", 1)}  # fmt: skip


@dataclass(slots=True)
class PhaseRates:
    """MFU and MBU per GPU and phase for the phase attribution's stranded categories
    (:mod:`analytics.stranded`): ``hourly`` has one row per GPU (``node``, ``uuid``) and hour of the
    iterations' starts (``hour_s``), ``whole`` one per GPU over the window, each with
    :data:`RATE_COLUMNS` (NaN where the GPU ran no counted iteration of that phase) in [0, 1];
    ``unvalidated``: the notes of GPUs / dtypes the GPU model was never checked on."""

    hourly: pd.DataFrame
    whole: pd.DataFrame
    unvalidated: list[str] = field(default_factory=list)


def _rate_frame(sums: dict[tuple[Any, ...], dict[str, list[float]]], keys: list[str]) -> pd.DataFrame:
    """One row per key of ``sums`` (per phase: Σ flops, Σ bytes, Σ busy × peak FLOP/s, Σ busy × peak
    bytes/s) with :data:`RATE_COLUMNS`."""
    cols: dict[str, list[Any]] = {k: [] for k in (*keys, *RATE_COLUMNS)}
    for key, phases in sums.items():
        for k, v in zip(keys, key, strict=True):
            cols[k].append(v)
        for col, (phase, which) in _RATE_OF.items():
            f, b, pf, pb = phases.get(phase, (0.0, 0.0, 0.0, 0.0))
            work, peak = (f, pf) if which == 0 else (b, pb)
            cols[col].append(min(1.0, max(0.0, work / peak)) if peak > 0 else float("nan"))
    types = {k: "float64" if k == "hour_s" else "string" for k in keys} | dict.fromkeys(
        RATE_COLUMNS, "float64"
    )
    return pd.DataFrame(cols).astype(types)  # typed even when empty: the attribution's SQL joins on them


def phase_rates(con: duckdb.DuckDBPyConnection, window: Window) -> PhaseRates:
    """MFU of decode, MBU of prefill, MFU and MBU of mixed iterations per GPU and hour of ``window``
    (and per GPU over the window), by the same rule as :func:`roofline`: Σ flops / Σ (busy_s · peak
    FLOP/s), Σ hbm_bytes / Σ (busy_s · peak bytes/s), over the iterations that carry a count on a GPU
    with known peaks. Empty where none does (no count: an external fleet, a store from before
    migration 14), so the attribution falls back to the GPUs' SM / DRAM activity."""
    pred, par = window.node_sql("node")
    try:
        rows = con.execute(_work_sql(pred, hourly=True), [*par, window.start_s, window.end_s]).fetchall()
        names = [d[0] for d in con.description]
    except duckdb.Error:  # a store without the count's columns (before migration 14)
        rows, names = [], []
    dtypes = _scenario_dtypes(con) if rows else {}
    notes: list[str] = []
    peaks: dict[tuple[Any, ...], tuple[float, float] | None] = {}
    hourly: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    whole: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for values in rows:
        r = dict(zip(names, values, strict=True))
        if not r["counted"] or not r["busy_s"] or r["busy_s"] <= 0 or r["gpu_uuid"] is None:
            continue
        key = (r["node"], r["device"], r["gpu_name"])
        if key not in peaks:
            spec, dtype = _spec_of(r["device"], r["gpu_name"]), dtypes.get(r["node"], "bf16")
            try:
                peaks[key] = None if spec is None else (spec.peak_flops_for(dtype), spec.bandwidth_bytes_s)
            except ValueError:
                peaks[key] = None
            if peaks[key] is not None and spec is not None:
                ok, note = fidelity(spec, dtype)
                if not ok and note not in notes:
                    notes.append(note)
        pk = peaks[key]
        if pk is None:
            continue
        add = (float(r["flops"]), float(r["hbm_bytes"]), r["busy_s"] * pk[0], r["busy_s"] * pk[1])
        gpu = (r["node"], r["gpu_uuid"])
        for table, k in ((hourly, (*gpu, float(r["hour_s"]))), (whole, gpu)):
            acc = table.setdefault(k, {}).setdefault(r["phase"], [0.0, 0.0, 0.0, 0.0])
            for n, v in enumerate(add):
                acc[n] += v
    return PhaseRates(
        _rate_frame(hourly, ["node", "uuid", "hour_s"]), _rate_frame(whole, ["node", "uuid"]), notes
    )
