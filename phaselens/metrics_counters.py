"""The counters of ``GET /metrics`` (phaselens/metrics_export.py): GPU-seconds, joules and dollars per
GPU-time category, tokens, requests and control actions, counted step by step over the live data so
that PromQL can sum them across collectors and over time (docs/PROMETHEUS.md).

Each computation counts one step ``[c, e)`` of settled data (``e`` at most ``now - settle_s``) and
adds it to the running totals; the cursor ``c`` moves on only when the step succeeded, so nothing is
counted twice or skipped. A step is counted as the difference of two summaries that start at the
same point, ``T([c - L, e)) - T([c - L, c))`` (``L`` = :data:`LOOKBACK_S`): the analytics drop the
sample interval that straddles a window's start, so plain consecutive windows would lose one
sampling period per GPU at every boundary (0.5 % of GPU-time at 15 s steps on 100 ms samples, about
5 % on 1 s samples). The difference keeps it (``L`` must exceed the GPUs' sampling period): GPU-seconds,
joules, dollars and tokens then sum over the steps to the summary of their union
(tests/phaselens/test_metrics_export.py).
A category's share of a step can come out a little negative (each window fits its own power model
and bucket grid): a counter exports the running maximum of its running sum, so it never decreases
and catches up with the sum as soon as the sum passes it again.

Requests are counted by arrival over ``[c - R, e - R)`` (``R`` = :data:`REQUEST_SETTLE_S` more), so
that a request has had time to finish before it is judged against the SLO.

Across restarts: the counters of a new process start at 0 (Prometheus' counter-reset semantics:
``rate()``/``increase()`` treat the drop as a reset) and count on from where the last process
stopped: the cursor is saved beside the store after every step (``<db>.metrics-state.json``), so a
restart neither loses nor double-counts data; without a saved cursor counting starts at the start.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the cost categories (analytics/cost_pricing.py) → the ``category`` label: the attribution's names
#: (analytics/attribution.py CATEGORIES; other_busy: an external fleet's busy time no engine work explains)
CATEGORY_LABEL = {
    "prefill": "productive_prefill",
    "stranded_prefill": "stranded_bandwidth",
    "decode": "productive_decode",
    "stranded_decode": "stranded_compute",
    "host_bound": "host_bound",
    "other_busy": "other_busy",
    "idle": "idle",
    "unsampled": "unsampled",
}
#: labels of every per-GPU series: dcgm-exporter's names for the GPU (``gpu`` its index, ``UUID``,
#: ``Hostname``), its product name (``gpu_name``: dcgm-exporter's ``modelName`` is camelCase, which
#: promtool's lint refuses), the engine pool and the served model
GPU_LABELS = ("Hostname", "gpu", "UUID", "gpu_name", "pool", "model")
UNASSIGNED_POOL = "unassigned"  # a GPU whose samples carry no engine role
TRUST_LABELS = ("measured", "emulated", "simulated", "host-bound", "estimated")
TRUST_PARTS = {"gpu_time": "phases", "cost": "cost", "requests": "latency"}  # trust part → summary part
SLOS = ("both", "ttft", "tpot")
LOOKBACK_S = 30.0
SETTLE_S = 30.0
REQUEST_SETTLE_S = 120.0
MAX_BACKLOG_S = 86_400.0

#: family → (label names, HELP)
COUNTERS: dict[str, tuple[tuple[str, ...], str]] = {
    "phaselens_gpu_seconds": (
        (*GPU_LABELS, "category"),
        "GPU-seconds per GPU-time category (productive_prefill, stranded_bandwidth, productive_decode, "
        "stranded_compute, host_bound, other_busy, idle, unsampled; they sum to the GPU's observed seconds). "
        "stranded_compute is decode time x (1 - MFU), stranded_bandwidth prefill time x (1 - MBU), from the "
        "work the engine counted; SM / DRAM activity instead where it counted none.",
    ),
    "phaselens_gpu_energy_joules": (
        (*GPU_LABELS, "category"),
        "Energy per GPU-time category, J (measured energy apportioned by the power model).",
    ),
    "phaselens_gpu_cost_dollars": (
        (*GPU_LABELS, "category"),
        "All-in cost per GPU-time category, USD (GPU-hours at list price + energy x electricity x PUE).",
    ),
    "phaselens_tokens": (
        (*GPU_LABELS, "side"),
        "Tokens served, side=input (prefilled) or output (generated); a tensor-parallel worker's tokens "
        "are shared evenly by its GPUs.",
    ),
    "phaselens_requests": ((), "Requests arrived (counted once they have had time to finish)."),
    "phaselens_requests_slo_met": (
        ("slo",),
        "Requests meeting the SLO, slo=both|ttft|tpot (a failed, aborted or unfinished request misses).",
    ),
    "phaselens_control_actions": (
        ("action", "status", "dry_run"),
        "Control actions recorded in the actions table (apply, rollback, ...), by their status when counted.",
    ),
    "phaselens_control_events": (
        ("action",),
        "Control events of the serving stack (worker added/removed, role switched, ...).",
    ),
}


Key = tuple[str, tuple[str, ...]]  # (family, label values in COUNTERS order)


@dataclass(slots=True)
class Step:
    """What one step counted: per-series increments and the trust labels of its figures."""

    start_s: float
    end_s: float
    increments: dict[Key, float] = field(default_factory=dict)
    trust: dict[str, list[str]] = field(default_factory=dict)

    def add(self, key: Key, value: float) -> None:
        self.increments[key] = self.increments.get(key, 0.0) + value


@dataclass(slots=True)
class Totals:
    """The running totals: ``sums`` (every step's increment added) and ``exported`` (their running
    maximum, what a scrape shows: never decreasing). A series is born at 0: it is exported as 0 for
    ``hold_s`` after the step that found it, then with its value, so that every Prometheus scraping
    at least that often sees its start and ``rate()``/``increase()`` count its first step too
    (Prometheus takes a new series' first sample as its starting point)."""

    hold_s: float = 60.0
    sums: dict[Key, float] = field(default_factory=dict)
    exported: dict[Key, float] = field(default_factory=dict)
    born: dict[Key, float] = field(default_factory=dict)  # series still shown at 0: when found

    def add(self, step: Step, now_s: float) -> None:
        for key, inc in step.increments.items():
            s = self.sums.get(key, 0.0) + inc
            self.sums[key] = s
            if key not in self.exported:
                self.exported[key] = 0.0
                self.born[key] = now_s
            elif key not in self.born:
                self.exported[key] = max(self.exported[key], s)

    def release(self, now_s: float) -> None:
        """The series born ``hold_s`` or more before ``now_s`` take their values."""
        for key in [k for k, t in self.born.items() if now_s - t >= self.hold_s]:
            self.exported[key] = max(self.exported[key], self.sums[key])
            del self.born[key]


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def gpu_identities(con: Any) -> dict[tuple[str, str], dict[str, str]]:
    """``(node, GPU key as the cost lines name it)`` → the dcgm-style labels of that GPU (newest
    ``devices`` row): Hostname (the exporter's host name, else the node), gpu (index), UUID,
    modelName."""
    rows = con.execute(
        """SELECT node, source, device, "index", arg_max(uuid, since_s), arg_max(name, since_s),
                  arg_max(exporter_hostname, since_s)
           FROM devices GROUP BY node, source, device, "index\""""
    ).fetchall()
    out: dict[tuple[str, str], dict[str, str]] = {}
    for node, source, device, index, uuid, name, host in rows:
        fallback = f"{node}|{source}|{device}|{'' if index is None else int(index)}"
        ident = {
            "Hostname": str(host or node),
            "gpu": "" if index is None else str(int(index)),
            "UUID": str(uuid or fallback),
            "gpu_name": str(name or ""),
        }
        out[(str(node), str(uuid or fallback))] = ident
        out[(str(node), fallback)] = ident
    return out


def _window(con: Any, start_s: float, end_s: float, dataset: str = "live") -> Any:
    from analytics.reads import window_of

    return window_of(con, {"dataset": dataset, "start_s": start_s, "end_s": end_s})


def _gpu_rows(
    con: Any, start_s: float, end_s: float, trust: dict[str, list[str]] | None, dataset: str = "live"
) -> dict[Key, float]:
    """The per-GPU counter values of ``[start_s, end_s)``: seconds, joules, dollars per category and
    tokens, from the summary's priced cost lines (``trust`` receives the parts' trust labels)."""
    from analytics.summary import summarize

    objects: dict[str, Any] = {}
    window = _window(con, start_s, end_s, dataset)
    summary = summarize(con, window, skip=frozenset({"bimodal"}), objects=objects)
    if trust is not None:
        for name, part in TRUST_PARTS.items():
            trust[name] = list(((summary.parts.get(part) or {}).get("trust") or {}).get("labels") or [])
    cost = objects.get("cost")
    if cost is None:  # a window without samples still has its (empty) cost part: this is a failure
        missing = "; ".join(f"{k}: {v}" for k, v in summary.missing.items()) or "no reason given"
        raise RuntimeError(f"the summary of [{start_s:.0f}, {end_s:.0f}) has no cost part ({missing})")
    lines = cost.lines
    out: dict[Key, float] = {}
    if lines is None or lines.empty:
        return out
    idents = gpu_identities(con)
    for r in lines.to_dict(orient="records"):
        node, gpu = str(r.get("node") or ""), str(r.get("gpu") or "")
        ident = idents.get((node, gpu)) or {"Hostname": node, "gpu": "", "UUID": gpu, "gpu_name": ""}
        pool = r.get("pool")
        model = r.get("model")
        labels = (
            ident["Hostname"],
            ident["gpu"],
            ident["UUID"],
            ident["gpu_name"] or str(r.get("gpu_name") or ""),
            str(pool) if isinstance(pool, str) and pool and pool != "unknown" else UNASSIGNED_POOL,
            str(model) if isinstance(model, str) else "",
        )
        for cat, label in CATEGORY_LABEL.items():
            for family, col in (
                ("phaselens_gpu_seconds", f"{cat}_s"),
                ("phaselens_gpu_energy_joules", f"energy_j_{cat}"),
                ("phaselens_gpu_cost_dollars", f"cost_usd_{cat}"),
            ):
                v = r.get(col)
                if family == "phaselens_gpu_cost_dollars" and not _finite(v):
                    continue  # a GPU without a price: no dollar series, never a made-up 0
                key = (family, (*labels, label))
                out[key] = out.get(key, 0.0) + _num(v)
        for side in ("input", "output"):
            key = ("phaselens_tokens", (*labels, side))
            out[key] = out.get(key, 0.0) + _num(r.get(f"{side}_tokens"))
    return out


def count_step(
    con: Any,
    start_s: float,
    end_s: float,
    *,
    lookback_s: float = LOOKBACK_S,
    request_settle_s: float = REQUEST_SETTLE_S,
    dataset: str = "live",
) -> Step:
    """Count ``[start_s, end_s)`` of the live data (or a simulated ``dataset``) on ``con`` (a store
    reader cursor): the per-GPU values as ``T([start - L, end)) - T([start - L, start))``, requests
    by arrival ``request_settle_s`` earlier, control actions and events by their time."""
    from analytics.latency import latency_summary

    step = Step(start_s, end_s)
    big = _gpu_rows(con, start_s - lookback_s, end_s, step.trust, dataset)
    small = _gpu_rows(con, start_s - lookback_s, start_s, None, dataset)
    for key in big.keys() | small.keys():
        step.add(key, big.get(key, 0.0) - small.get(key, 0.0))
    r = request_settle_s
    lat = latency_summary(con, _window(con, start_s - r, end_s - r, dataset))
    att = lat.to_dict().get("attainment") or {}
    n = _num(att.get("requests"))
    step.add(("phaselens_requests", ()), n)
    for slo in SLOS:
        met = _num(att.get("met")) if slo == "both" else round(_num(att.get(slo)) * n)
        step.add(("phaselens_requests_slo_met", (slo,)), met)
    for action, status, dry_run, k in con.execute(
        "SELECT action, status, dry_run, count(*) FROM actions WHERE ts_s >= ? AND ts_s < ? GROUP BY ALL",
        [start_s, end_s],
    ).fetchall():
        step.add(("phaselens_control_actions", (str(action), str(status), str(bool(dry_run)).lower())), k)
    for action, k in con.execute(
        "SELECT action, count(*) FROM control_events WHERE ts_s >= ? AND ts_s < ? GROUP BY ALL",
        [start_s, end_s],
    ).fetchall():
        step.add(("phaselens_control_events", (str(action),)), k)
    return step


def trust_values(trust: dict[str, list[str]]) -> Iterable[tuple[str, str, float]]:
    """``(part, trust label, 1 or 0)`` for every part and every label (all of them, always: a label
    coming or going changes a value, never the set of series)."""
    for part in TRUST_PARTS:
        given = set(trust.get(part) or [])
        for label in TRUST_LABELS:
            yield part, label, 1.0 if label in given else 0.0


# -- the cursor saved beside the store --------------------------------------------------------------


def state_path(db_path: str | os.PathLike[str] | None) -> Path | None:
    """Where the cursor of a store is saved (None for an in-memory store)."""
    if not db_path or str(db_path) == ":memory:":
        return None
    return Path(str(db_path) + ".metrics-state.json")


def load_cursor(path: Path | None, now_s: float, *, settle_s: float = SETTLE_S) -> tuple[float, str]:
    """Where counting starts: the saved cursor (no older than :data:`MAX_BACKLOG_S`), else now less
    the settle lag; with a sentence saying which."""
    start = now_s - settle_s
    if path is None or not path.exists():
        return start, "no saved cursor: counting from the start"
    try:
        saved = float(json.loads(path.read_text())["counted_until_s"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return start, f"saved cursor {path} unreadable ({type(e).__name__}: {e}): counting from the start"
    if not math.isfinite(saved) or saved > now_s:
        return start, f"saved cursor {saved!r} is not in the past: counting from the start"
    if saved < now_s - MAX_BACKLOG_S:
        return now_s - MAX_BACKLOG_S, (
            f"saved cursor {saved:.0f} is over {MAX_BACKLOG_S:.0f} s old: counting the last {MAX_BACKLOG_S:.0f} s"
        )
    return saved, f"resuming from the saved cursor {saved:.3f}"


def save_cursor(path: Path | None, counted_until_s: float) -> None:
    """Save the cursor (atomically: a crash leaves the old file or the new one)."""
    if path is None:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"counted_until_s": counted_until_s, "saved_at_s": time.time()}))
    tmp.replace(path)


def drop_cursor(path: Path | None) -> None:
    """Remove a saved cursor that could not be updated (a restart then starts afresh rather than
    counting again from a stale point); a failure to remove it is logged."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.error("metrics counters: stale cursor %s left (a restart counts again from it): %s", path, e)
