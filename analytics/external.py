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

Public API: :func:`external_attribution` → :class:`ExternalAttribution`. Its store reads are in
:mod:`analytics.external_reads`, its fits and energy in :mod:`analytics.external_energy`, its pricing
in :mod:`analytics.external_cost`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analytics.external_energy import (
    STATES,
    apportion_energy,
    mig_energy,
    nnls,
    r2,
    rel_rmse,
)
from analytics.external_reads import (
    ENGINE_COUNTERS,
    EngineSeries,
    engine_series,
    read_engine_rows,
    read_intervals,
)
from analytics.external_roles import (
    DECODE,
    MIXED,
    PREFILL,
    ROLES,
    ExternalAttributionError,
    assign_engines,
    check_role,
    dynamo_roles,
    gpu_key_text,
    identifiers,
    label_text,
)
from analytics.jsonable import table_records
from analytics.trust import ESTIMATED, LABELS, Trust
from analytics.window import Window

WORK_TERMS = ("iterations", "prompt_tokens", "generation_tokens")


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
        return {
            "window": self.window.describe(),
            "per_gpu": table_records(self.per_gpu),
            "per_pool": table_records(self.per_pool),
            "engines": table_records(self.engines),
            "trust": self.trust.to_dict(),
            "missing": list(self.missing),
        }


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
    iv = read_intervals(con, window)
    if gpus is not None and not iv.empty:
        wanted = set(gpus)
        ids = pd.Series(
            [gpu_id(*r) for r in zip(iv["node"], iv["source"], iv["device"], iv["index"], strict=True)],
            index=iv.index,
        )
        keep = ids.isin(wanted)
        parents = set(iv.loc[keep, "parent_uuid"].dropna())
        iv = iv[keep | (iv["parent_uuid"].isna() & iv["uuid"].isin(parents))].reset_index(drop=True)
    values, labels = read_engine_rows(con, window)
    if iv.empty:
        missing.append("no GPU samples (two or more per GPU) in the window")
        return ExternalAttribution(
            window, pd.DataFrame(columns=_GPU_COLUMNS), pd.DataFrame(), pd.DataFrame(), iv, trust, missing
        )
    for label in sorted(set(iv["trust"])):
        if label in LABELS:
            trust.add(label)
    iv["gpu"] = [
        gpu_key_text(r)
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
    iv = mig_energy(iv, notes)
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
    gpu_engine = assign_engines(gpus, labels, engine_gpus, notes)
    dyn_roles = dynamo_roles(labels)
    engines = engine_series(values)
    # roles
    role_of: dict[str, str] = {}
    role_why: dict[str, str] = {}
    given = {str(k): check_role(f"roles[{k!r}]", v) for k, v in (roles or {}).items()}
    for g in gpus.to_dict("records"):
        k = g["gpu"]
        ep = gpu_engine.get(k)
        hit = next((given[i] for i in sorted(identifiers(g) | ({ep} if ep else set())) if i in given), None)
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
            - {i for g in gpus.to_dict("records") for i in identifiers(g)}
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
            fit_r2=r2(x[ok], y[ok], coef) if ok.sum() >= 2 else float("nan"),
            fit_intervals=int(ok.sum()),
            fit_rel_rmse=rel_rmse(x[ok], y[ok], coef),
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
    apportion_energy(iv, missing, trust)
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
    e: EngineSeries,
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
    return label_text(hit.iloc[0]) if len(hit) else None


GpuId = tuple[Any, ...]  # (node, source, device, index) of a GPU's sample rows


def gpu_id(node: Any, source: Any, device: Any, index: Any) -> GpuId:
    """A GPU's identity in the store, as the attribution's rows and the sample intervals carry it."""
    return (str(node), str(source), str(device), None if index is None or pd.isna(index) else int(index))


def _first(a: np.ndarray | None) -> float:
    return float(a[0]) if a is not None and len(a) else float("nan")


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
