"""Serving telemetry: versioned, batched, sequence-numbered events (docs/TELEMETRY.md).

Producers (workers, the router) put events into a `TelemetryEmitter`, which hands numbered
batches to a sink. The router keeps recent batches per source in a bounded `TelemetryHub` that
consumers read with cursors over HTTP (`GET /v1/telemetry`); `TelemetryReader` is that consumer,
detecting gaps. Nothing here blocks a producer: full buffers drop the oldest data and count it.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "phaselens.telemetry"
SCHEMA_VERSION = 1
EVENT_TYPES = ("request", "iteration", "control")

Batch = dict[str, Any]
Event = dict[str, Any]


class TelemetryEmitter:
    """Collects one source's events and emits them as numbered batches.

    `sink(batch)` must not block for long; if it raises, the batch is counted as dropped and the
    next batch still gets the next number, so the consumer sees the gap.
    """

    def __init__(
        self,
        source: str,
        sink: Callable[[Batch], None],
        *,
        max_batch_events: int = 512,
        flush_interval_s: float = 0.25,
        max_pending_events: int = 20_000,
    ) -> None:
        self.source = source
        self._sink = sink
        self._max_batch = max_batch_events
        self._interval = flush_interval_s
        self._max_pending = max_pending_events
        self._pending: deque[Event] = deque()
        self._lock = threading.Lock()
        self._next_seq = 0
        self._last_flush = time.monotonic()
        self.dropped_events = 0
        self.dropped_batches = 0

    def emit(self, event_type: str, **fields: Any) -> None:
        self.put({"type": event_type, **fields})

    def put(self, event: Event) -> None:
        """Queue a built event (its ``type`` one of EVENT_TYPES)."""
        if event.get("type") not in EVENT_TYPES:
            raise ValueError(f"unknown telemetry event type {event.get('type')!r}; allowed: {EVENT_TYPES}")
        with self._lock:
            if len(self._pending) >= self._max_pending:
                self._pending.popleft()
                self.dropped_events += 1
            self._pending.append(event)
            due = len(self._pending) >= self._max_batch
        if due:
            self.flush()

    def maybe_flush(self) -> None:
        """Flush when the interval has passed since the last flush."""
        if time.monotonic() - self._last_flush >= self._interval:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            self._last_flush = time.monotonic()
            if not self._pending:
                return
            events = [self._pending.popleft() for _ in range(min(len(self._pending), self._max_batch))]
            batch = envelope(self.source, self._next_seq, time.time(), self.dropped_events, events)
            self._next_seq += 1
        try:
            self._sink(batch)
        except Exception:
            self.dropped_batches += 1


def envelope(source: str, seq: int, sent_s: float, dropped_events_total: int, events: list[Event]) -> Batch:
    """A telemetry batch: ``events`` of ``source`` in its ``seq``-th batch (the live emitter's and the
    simulator's, one format)."""
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "source": source,
        "seq": seq,
        "sent_s": sent_s,
        "dropped_events_total": dropped_events_total,
        "events": events,
    }


def validate_batch(batch: Any) -> Batch:
    """Check a batch's envelope; raise ValueError naming what is wrong."""
    if not isinstance(batch, dict):
        raise ValueError(f"telemetry batch must be an object, got {type(batch).__name__}")
    if batch.get("schema") != SCHEMA:
        raise ValueError(f"telemetry batch schema must be {SCHEMA!r}, got {batch.get('schema')!r}")
    if batch.get("version") != SCHEMA_VERSION:
        raise ValueError(
            f"telemetry batch version {batch.get('version')!r} is not supported; allowed: {SCHEMA_VERSION}"
        )
    for key, kind in (("source", str), ("seq", int), ("events", list)):
        if not isinstance(batch.get(key), kind):
            raise ValueError(f"telemetry batch field {key!r} must be {kind.__name__}")
    return batch


@dataclass(slots=True)
class _SourceRing:
    batches: deque[Batch]
    evicted: int = 0  # batches dropped from the ring before any consumer read them


class TelemetryHub:
    """Recent batches of every source, bounded; read with per-source cursors.

    Optionally appends every batch to a JSON-lines spool file from a background thread, whose
    queue is bounded too (overflow counted in `spool_dropped`).
    """

    def __init__(self, max_batches_per_source: int = 2048, spool_path: str | Path | None = None) -> None:
        self._max = max_batches_per_source
        self._rings: dict[str, _SourceRing] = {}
        self._lock = threading.Lock()
        self.spool_dropped = 0
        self._spool_q: queue.Queue[Batch | None] | None = None
        if spool_path is not None:
            self._spool_q = queue.Queue(maxsize=10_000)
            threading.Thread(target=self._spool_loop, args=(Path(spool_path),), daemon=True).start()

    def publish(self, batch: Batch) -> None:
        with self._lock:
            ring = self._rings.setdefault(batch["source"], _SourceRing(deque()))
            if len(ring.batches) >= self._max:
                ring.batches.popleft()
                ring.evicted += 1
            ring.batches.append(batch)
        if self._spool_q is not None:
            try:
                self._spool_q.put_nowait(batch)
            except queue.Full:
                self.spool_dropped += 1

    def read(self, after: dict[str, int] | None = None, limit: int = 1000) -> dict[str, Any]:
        """Batches with seq > after[source] (all retained when a source is absent), oldest first."""
        after = after or {}
        out: list[Batch] = []
        sources: dict[str, dict[str, int]] = {}
        with self._lock:
            for source, ring in self._rings.items():
                if ring.batches:
                    sources[source] = {
                        "first_seq": ring.batches[0]["seq"],
                        "last_seq": ring.batches[-1]["seq"],
                        "evicted_batches": ring.evicted,
                    }
                cursor = after.get(source, -1)
                for b in ring.batches:
                    if b["seq"] > cursor and len(out) < limit:
                        out.append(b)
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, "sources": sources, "batches": out}

    def close(self) -> None:
        if self._spool_q is not None:
            self._spool_q.put(None)

    def _spool_loop(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            while (batch := self._spool_q.get()) is not None:
                f.write(json.dumps(batch, separators=(",", ":")) + "\n")
                if self._spool_q.empty():
                    f.flush()


@dataclass(slots=True)
class Gap:
    source: str
    after_seq: int
    missing_batches: int


@dataclass(slots=True)
class TelemetryReader:
    """Consumer side: keeps a cursor per source and records every gap in the sequence numbers."""

    cursors: dict[str, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    rejected: int = 0

    def accept(self, payload: dict[str, Any]) -> list[Batch]:
        """Take a `TelemetryHub.read` payload; return the new valid batches in order."""
        fresh = []
        for raw in payload.get("batches", []):
            try:
                batch = validate_batch(raw)
            except ValueError:
                self.rejected += 1
                continue
            src, seq = batch["source"], batch["seq"]
            last = self.cursors.get(src, -1)
            if seq <= last:
                continue
            if seq != last + 1:
                self.gaps.append(Gap(src, last, seq - last - 1))
            self.cursors[src] = seq
            fresh.append(batch)
        return fresh

    def query_param(self) -> str:
        """The `after` query parameter for the next read: "src:seq,src:seq"."""
        return ",".join(f"{s}:{n}" for s, n in sorted(self.cursors.items()))


def parse_after(param: str | None) -> dict[str, int]:
    """Parse "src:seq,src:seq" (the `after` query parameter); ValueError on bad input."""
    out: dict[str, int] = {}
    if not param:
        return out
    for part in param.split(","):
        src, sep, seq = part.rpartition(":")
        if not sep or not src or not re.fullmatch(r"-?[0-9]+", seq):
            raise ValueError(f"bad cursor {part!r} in 'after'; expected source:seq pairs joined by commas")
        out[src] = int(seq)
    return out
