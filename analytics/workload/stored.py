"""The ``workloads`` table's rows (migration 13): a workload description as a row, and back.

The analytics make the rows; the store's writer appends them (the collector's writer thread, or a
process holding the file: phaselens/workload_api.py).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import duckdb

from analytics.window import AnalyticsError
from analytics.workload.model import Workload

OBSERVED = "observed"
SYNTHESIZED = "synthesized"
KINDS = (OBSERVED, SYNTHESIZED)

#: the summary columns of ``workloads`` (the same names as :meth:`Workload.summary`'s keys)
SUMMARY_COLUMNS = (
    "request_count",
    "mean_rps",
    "peak_rps",
    "interarrival_cv",
    "burstiness_cv",
    "gamma_shape",
    "dispersion_index",
    "prompt_tokens_mean",
    "prompt_tokens_p50",
    "prompt_tokens_p90",
    "prompt_tokens_p99",
    "output_tokens_mean",
    "output_tokens_p50",
    "output_tokens_p90",
    "output_tokens_p99",
    "prefix_reuse_ratio",
)
_LIST_COLUMNS = (
    "workload_id",
    "node",
    "ts_s",
    "kind",
    "source",
    "dataset",
    "start_s",
    "end_s",
    "observed_id",
    *SUMMARY_COLUMNS,
    "trust",
)


def new_workload_id(now_s: float | None = None) -> str:
    """``wl-<unix seconds>-<6 hex>`` (the recommendations' id style)."""
    return f"wl-{int(time.time() if now_s is None else now_s)}-{secrets.token_hex(3)}"


def workload_row(
    workload: Workload,
    *,
    kind: str,
    node: str,
    workload_id: str | None = None,
    observed_id: str | None = None,
    ts_s: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``workloads`` row of ``workload``; ``extra`` goes into ``details`` (e.g. the synthesis
    parameters: seed, duration, rate scale)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    summary = workload.summary()
    details = workload.to_dict()
    if extra:
        details["synthesis"] = extra
    return {
        "workload_id": workload_id or new_workload_id(),
        "node": node,
        "ts_s": time.time() if ts_s is None else ts_s,
        "kind": kind,
        "source": workload.source,
        "dataset": str(workload.window.get("dataset") or "live"),
        "start_s": workload.start_s,
        "end_s": workload.end_s,
        "observed_id": observed_id,
        **{c: summary[c] for c in SUMMARY_COLUMNS},
        "trust": workload.trust.to_dict(),
        "details": details,
    }


def list_workloads(
    con: duckdb.DuckDBPyConnection, *, limit: int = 20, kind: str | None = None, dataset: str | None = None
) -> list[dict[str, Any]]:
    """Stored workloads, newest first, their summary columns (no details)."""
    if kind is not None and kind not in KINDS:
        raise AnalyticsError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", "kind")
    where, params = [], []
    if kind:
        where.append("kind = ?")
        params.append(kind)
    if dataset:
        where.append("dataset = ?")
        params.append(dataset)
    sql = f"SELECT {', '.join(_LIST_COLUMNS)} FROM workloads"
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = con.execute(sql + " ORDER BY ts_s DESC, kind LIMIT ?", [*params, int(limit)]).fetchall()
    out = []
    for r in rows:
        item = dict(zip(_LIST_COLUMNS, r, strict=True))
        item["trust"] = json.loads(item["trust"]) if isinstance(item["trust"], str) else item["trust"]
        out.append(item)
    return out


def load_workload(con: duckdb.DuckDBPyConnection, workload_id: str) -> Workload:
    """The stored workload ``workload_id``; AnalyticsError when there is none."""
    row = con.execute("SELECT details FROM workloads WHERE workload_id = ?", [workload_id]).fetchone()
    if row is None:
        raise AnalyticsError(f"no stored workload {workload_id!r}", "workload_id")
    details = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return Workload.from_dict(details)


def latest_observed(
    con: duckdb.DuckDBPyConnection, *, dataset: str | None = None, before_s: float | None = None
) -> tuple[str, Workload] | None:
    """The newest stored observed workload (of ``dataset``, stored before ``before_s`` when given):
    ``(workload_id, workload)``, or None. The daily report compares it with today's
    (:func:`analytics.workload.drift.workload_drift`) to say when a recommendation is stale."""
    where, params = ["kind = ?"], [OBSERVED]
    if dataset:
        where.append("dataset = ?")
        params.append(dataset)
    if before_s is not None:
        where.append("ts_s < ?")
        params.append(before_s)
    row = con.execute(
        f"SELECT workload_id, details FROM workloads WHERE {' AND '.join(where)} ORDER BY ts_s DESC LIMIT 1",
        params,
    ).fetchone()
    if row is None:
        return None
    details = json.loads(row[1]) if isinstance(row[1], str) else row[1]
    return str(row[0]), Workload.from_dict(details)
