"""Serving telemetry batches (docs/TELEMETRY.md) turned into store rows, event by event.

A bad event never spoils its batch: it is left out and counted by ``(kind, message)``, and the
store writes those counts to ``ingest_errors``. Unknown fields are ignored, as the contract says.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from serving.telemetry import validate_batch

Row = dict[str, Any]

# Field kinds: "str", "num" (int or float, not bool), "int" (not bool), "nums" (list of num), "json".
_FieldSpec = tuple[str, bool]  # (kind, required)

ITERATION_FIELDS: dict[str, _FieldSpec] = {
    "worker": ("str", True),
    "device": ("str", False),
    "start_s": ("num", True),
    "end_s": ("num", True),
    "phase": ("str", True),
    "batch_size": ("int", False),
    "prefill_tokens": ("int", False),
    "decode_seqs": ("int", False),
    "context_tokens": ("int", False),
    "kv_blocks_used": ("int", False),
    "kv_blocks_total": ("int", False),
    "preempted": ("int", False),
    "compute_s": ("num", False),
    "pacing_s": ("num", False),
    "gpu_uuid": ("str", False),
    "gpu_index": ("int", False),
    "lag_s": ("num", False),
    "modeled_s": ("num", False),
}

REQUEST_FIELDS: dict[str, _FieldSpec] = {
    "request_id": ("str", True),
    "arrival_s": ("num", True),
    "first_scheduled_s": ("num", False),
    "prefill_start_s": ("num", False),
    "prefill_end_s": ("num", False),
    "kv_transfer_start_s": ("num", False),
    "kv_transfer_end_s": ("num", False),
    "kv_transfer_bytes": ("int", False),
    "first_token_s": ("num", False),
    "token_ts_s": ("nums", False),
    "finish_s": ("num", False),
    "prompt_tokens": ("int", False),
    "output_tokens": ("int", False),
    "prefill_worker": ("str", False),
    "decode_worker": ("str", False),
    "status": ("str", False),
    "finish_reason": ("str", False),
    "error": ("str", False),
    "attempts": ("int", False),
    "preemptions": ("int", False),
}

CONTROL_FIELDS: dict[str, _FieldSpec] = {
    "ts_s": ("num", True),
    "action": ("str", True),
    "target": ("str", False),
    "before": ("json", False),
    "after": ("json", False),
    "actor": ("str", False),
}

ALLOWED_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("iteration", "phase"): frozenset({"prefill", "decode", "mixed"}),
    ("request", "status"): frozenset({"ok", "error", "aborted"}),
}

_EVENT_FIELDS = {"iteration": ITERATION_FIELDS, "request": REQUEST_FIELDS, "control": CONTROL_FIELDS}


@dataclass(slots=True)
class TelemetryRows:
    """One batch's rows per table, plus the events left out, counted by (kind, message)."""

    source: str
    iterations: list[Row] = field(default_factory=list)
    requests: list[Row] = field(default_factory=list)
    tokens: list[Row] = field(default_factory=list)
    control_events: list[Row] = field(default_factory=list)
    telemetry_batches: list[Row] = field(default_factory=list)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected_batch: str | None = None  # why the whole batch was refused (bad envelope)

    def tables(self) -> dict[str, list[Row]]:
        """The non-empty row lists keyed by table name."""
        out = {
            "telemetry_batches": self.telemetry_batches,
            "iterations": self.iterations,
            "requests": self.requests,
            "tokens": self.tokens,
            "control_events": self.control_events,
        }
        return {name: rows for name, rows in out.items() if rows}

    @property
    def rejected_events(self) -> int:
        """Events of this batch that were left out."""
        return sum(self.errors.values())


def split_batch(batch: Any, node: str, received_s: float) -> TelemetryRows:
    """Validate a telemetry batch and split it into rows for each table.

    A bad envelope (``validate_batch`` fails) rejects the whole batch: ``rejected_batch`` holds the
    reason and ``errors`` one ``invalid_batch`` count. Otherwise each event is checked on its own.
    """
    try:
        validate_batch(batch)
    except ValueError as e:
        source = batch.get("source") if isinstance(batch, dict) else None
        out = TelemetryRows(source=source if isinstance(source, str) and source else "unknown")
        out.rejected_batch = str(e)
        out.errors["invalid_batch", str(e)] += 1
        return out
    source, seq = batch["source"], batch["seq"]
    out = TelemetryRows(source=source)
    base = {"node": node, "source": source, "batch_seq": seq}
    for event in batch["events"]:
        problem = _check_event(event)
        if problem is not None:
            out.errors[problem] += 1
            continue
        etype = event["type"]
        fields = {name: event.get(name) for name in _EVENT_FIELDS[etype]}
        if etype == "iteration":
            out.iterations.append({**base, **fields})
        elif etype == "control":
            out.control_events.append({**base, **fields})
        else:
            token_ts = fields.pop("token_ts_s") or []
            out.requests.append({**base, **fields})
            prev = None
            for idx, ts in enumerate(token_ts):
                out.tokens.append(
                    {
                        "node": node,
                        "request_id": fields["request_id"],
                        "idx": idx,
                        "ts_s": float(ts),
                        "itl_s": None if prev is None else ts - prev,
                    }
                )
                prev = ts
    sent_s = batch.get("sent_s")
    dropped = batch.get("dropped_events_total")
    out.telemetry_batches.append(
        {
            "node": node,
            "source": source,
            "seq": seq,
            "sent_s": float(sent_s) if _is_num(sent_s) else received_s,
            "received_s": received_s,
            "events": len(batch["events"]),
            "rejected_events": out.rejected_events,
            "dropped_events_total": dropped if _is_int(dropped) else None,
        }
    )
    return out


def _check_event(event: Any) -> tuple[str, str] | None:
    """Return (kind, message) when the event must be left out, else None."""
    if not isinstance(event, dict):
        return "invalid_event", f"telemetry event must be an object, got {type(event).__name__}"
    etype = event.get("type")
    spec = _EVENT_FIELDS.get(etype) if isinstance(etype, str) else None
    if spec is None:
        return (
            "unknown_event_type",
            f"unknown telemetry event type {etype!r}; known: {', '.join(_EVENT_FIELDS)}",
        )
    for name, (kind, required) in spec.items():
        value = event.get(name)
        if value is None:
            if required:
                return "invalid_event", f"{etype} event lacks required field {name!r}"
            continue
        if not _KIND_CHECKS[kind](value):
            return (
                "invalid_event",
                f"{etype} field {name!r} must be {_KIND_NAMES[kind]}, got {type(value).__name__}",
            )
        allowed = ALLOWED_VALUES.get((etype, name))
        if allowed is not None and value not in allowed:
            return "invalid_event", f"{etype} field {name!r} must be one of {sorted(allowed)}"
    return None


def _is_num(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_nums(v: Any) -> bool:
    return isinstance(v, list) and all(_is_num(x) for x in v)


def _is_json(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


_KIND_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "num": _is_num,
    "int": _is_int,
    "nums": _is_nums,
    "json": _is_json,
}
_KIND_NAMES = {
    "str": "a string",
    "num": "a finite number",
    "int": "an integer",
    "nums": "a list of numbers",
    "json": "JSON-serialisable",
}
