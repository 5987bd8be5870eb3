"""Cost rows of an external fleet: :class:`analytics.cost.GpuHourUsage` rows from
:func:`analytics.external.external_attribution` (dcgm-exporter samples + engine ``/metrics``), so a
vLLM / SGLang / Dynamo fleet without phaselens telemetry is priced like a bundled one.

Per GPU and hour (of each sample interval's end), from the attribution's sample intervals:

* GPU-seconds: the observed sample time (the intervals' ``dt_s``), split into the estimated states
  ``prefill``, ``decode``, ``other_busy`` (busy time no engine work explains) and ``idle``; an
  interval's time with no utilization field is ``unsampled`` (its work is not known);
* joules: each state's share of the measured energy (the attribution's per-GPU power model);
* tokens: the engine's counters (``prompt_tokens_total`` → input, ``generation_tokens_total`` →
  output) over the interval, shared evenly by the engine's GPUs; prefill engines count no output
  and decode engines no input (docs/analytics/external.md, "Cost").

There is no productive/stranded split (stranded is 0: no iteration timing to split it by) and no
host-bound time: the engine's host time is inside its busy or idle time.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import pandas as pd

from analytics.cost import ATTRIBUTION_CATEGORY, GpuHourUsage, mig_share
from analytics.external import SERVED, ExternalAttribution, GpuId, gpu_id

#: the external states → the cost categories they are priced as
STATE_CATEGORY = {"prefill": "prefill", "decode": "decode", "other_busy": "other_busy", "idle": "idle"}


def gpus_without_telemetry(raw: pd.DataFrame) -> set[GpuId]:
    """:func:`~analytics.external.gpu_id` of the GPUs none of whose time in the window the bundled
    attribution could attribute (``raw``: :attr:`analytics.attribution.PhaseBreakdown.raw`): sampled,
    but without any phaselens serving telemetry — the GPUs to estimate and price from their
    dcgm-exporter samples and engine metrics."""
    if raw.empty or "unattributed_s" not in raw:
        return set()
    seconds = [f"{a}_s" for a in ATTRIBUTION_CATEGORY.values() if f"{a}_s" in raw]
    per = raw.assign(
        _id=[gpu_id(*r) for r in zip(raw["node"], raw["source"], raw["device"], raw["index"], strict=True)],
        _attr=raw[seconds].fillna(0.0).sum(axis=1),
    )
    sums = per.groupby("_id")[["_attr", "unattributed_s"]].sum()
    return {
        i
        for i, a, u in zip(sums.index, sums["_attr"], sums["unattributed_s"], strict=True)
        if a <= 0 and u > 0
    }


def external_usage(ext: ExternalAttribution, only: Collection[GpuId] | None = None) -> list[GpuHourUsage]:
    """GPU-hour rows of the estimated attribution ``ext`` (module docstring), of the GPUs in ``only``
    (their :func:`gpu_id`; None: every GPU of ``ext``)."""
    iv = ext.intervals
    if iv.empty or "gpu" not in iv:
        return []
    wanted = None if only is None else set(only)
    iv = iv.assign(
        _id=[gpu_id(*r) for r in zip(iv["node"], iv["source"], iv["device"], iv["index"], strict=True)],
        _hour=(iv["ts_s"] // 3600.0) * 3600.0,
    )
    if wanted is not None:
        iv = iv[iv["_id"].isin(wanted)]
    models = {}
    if not ext.engines.empty and "model" in ext.engines:
        models = {ep: m for ep, m in zip(ext.engines["endpoint"], ext.engines["model"], strict=True)}
    out = []
    for (gpu, hour), grp in iv.groupby(["gpu", "_hour"], sort=True):
        first = grp.iloc[0]
        seconds = {c: float(grp[f"{s}_s"].sum()) for s, c in STATE_CATEGORY.items()}
        energy = {c: _joules(grp[f"{s}_energy_j"]) for s, c in STATE_CATEGORY.items()}
        seconds["unsampled"] = max(0.0, float(grp["dt_s"].sum()) - sum(seconds.values()))
        no_state = float(grp.loc[grp["busy_measure"].isna(), "energy_j"].fillna(0.0).sum())
        energy["unsampled"] = no_state
        served = {col: float(grp[col].sum()) if col in grp else 0.0 for col in SERVED}
        endpoint = first.get("endpoint")
        model = models.get(endpoint) if isinstance(endpoint, str) else None
        out.append(
            GpuHourUsage(
                gpu=str(gpu),
                gpu_name=_text(first.get("name")),
                hour_start_s=float(hour),
                seconds=seconds,
                energy_j=energy,
                input_tokens=served["input_tokens"],
                output_tokens=served["output_tokens"],
                pool=_text(first.get("pool")),
                model=_text(model),
                node=str(first["node"]),
                gpu_share=mig_share(_text(first.get("mig_profile"))),
                estimated=True,
            )
        )
    return out


def external_requests(ext: ExternalAttribution, only: Collection[GpuId] | None = None) -> float:
    """Requests the engines of ``ext`` finished on the GPUs in ``only`` (all: None), from their
    ``requests_total`` counters over the GPUs' sample intervals."""
    iv = ext.intervals
    if iv.empty or "requests" not in iv:
        return 0.0
    if only is not None:
        ids = [gpu_id(*r) for r in zip(iv["node"], iv["source"], iv["device"], iv["index"], strict=True)]
        iv = iv[pd.Series(ids, index=iv.index).isin(set(only))]
    return float(iv["requests"].sum())


def served_tokens(ext: ExternalAttribution) -> dict[str, float]:
    """The engines' token counters over the window (``served_*`` of ``ext.engines``), the figures the
    tokens priced on some GPU are reconciled with."""
    e = ext.engines
    return {
        col: float(e[f"served_{col}"].fillna(0.0).sum()) if f"served_{col}" in e else 0.0 for col in SERVED
    }


def _joules(values: pd.Series) -> float:
    x = float(values.sum(min_count=1))
    return x if math.isfinite(x) and x > 0 else 0.0


def _text(v: Any) -> str | None:
    return str(v) if isinstance(v, str) and v else None
