"""The store's telemetry writes: serving telemetry batches (docs/TELEMETRY.md), their cursors,
sequence gaps and ingest errors; a mixin of :class:`collector.store.store.Store`."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from collector.store.arrow_input import conform, one_table
from collector.store.columns import ColumnBlock
from collector.store.iteration_columns import IterationBlocks, check_iteration_envelope, columns_fit
from collector.store.telemetry_rows import BatchKey, TelemetryColumns, check_envelope
from serving.telemetry import Gap
from serving.telemetry_columns import IterationBatch, TokenTimesBatch


@dataclass(frozen=True, slots=True)
class TelemetryIngest:
    """What ``append_telemetry_batch`` stored from one batch, and what it left out."""

    source: str
    iterations: int
    requests: int
    tokens: int
    control_events: int
    rejected_events: int
    rejected_batch: str | None  # why the whole batch was refused (bad envelope), else None
    duplicate: bool = False  # the same batch (node, source, seq, sent_s) was stored before: skipped


class TelemetryWrites:
    """``append_telemetry_batch(es)``, ``telemetry_cursors``, ``record_gaps``, ``record_ingest_error(s)``."""

    __slots__ = ()

    def append_telemetry_batch(
        self, batch: Any, node: str, *, received_s: float | None = None, endpoint: str | None = None
    ) -> TelemetryIngest:
        """Store one serving telemetry batch (docs/TELEMETRY.md) received from ``node``; see
        :meth:`append_telemetry_batches`."""
        return self.append_telemetry_batches([batch], node, received_s=received_s, endpoint=endpoint)[0]

    def append_telemetry_batches(
        self,
        batches: Sequence[Any],
        node: str,
        *,
        received_s: float | None = None,
        endpoint: str | None = None,
    ) -> list[TelemetryIngest]:
        """Store serving telemetry batches (docs/TELEMETRY.md) received from ``node``, in order.

        Each batch is split into iterations, requests, tokens (one row per output token) and
        control_events, plus one telemetry_batches row; all of them are written in one transaction.
        Events of unknown type or with missing/mistyped fields are left out and counted in
        ingest_errors under the batch's source; the rest of the batch is kept. A batch whose
        envelope fails ``serving.telemetry.validate_batch`` is refused whole and counted.
        A batch already stored (same node, source, seq and sent_s -- e.g. re-read from the
        router's ring after a collector restart) is skipped and reported as ``duplicate``.
        ``endpoint`` (the serving URL read) is kept on the telemetry_batches rows, for
        :meth:`telemetry_cursors`.
        """
        now = time.time() if received_s is None else received_s
        # the simulator's router batches: the envelope, token times as arrays (checked as lists are)
        batches = [b.batch if type(b) is TokenTimesBatch else b for b in batches]
        splits = [
            check_iteration_envelope(b, node, now)
            if type(b) is IterationBatch
            else check_envelope(b, node, now)
            for b in batches
        ]
        out = TelemetryColumns()
        columnar = IterationBlocks()
        errors: Counter[tuple[str, str, str]] = Counter()
        results: list[TelemetryIngest] = []
        with self._lock:
            seen = self._seen_batches([s.key for s in splits if s.key is not None])
            keys: list[BatchKey] = []
            for batch, split in zip(batches, splits, strict=True):
                if split.key is not None and split.key in seen:
                    results.append(TelemetryIngest(split.source, 0, 0, 0, 0, 0, None, duplicate=True))
                    continue
                if split.key is not None:
                    seen.add(split.key)
                    keys.append(split.key)
                    if type(batch) is not IterationBatch:
                        out.add(batch, split, now, endpoint)
                    elif (cols := columns_fit(batch)) is not None:  # every event passes: as columns
                        columnar.add(batch, cols)
                        out.add_counted(batch, split, now, endpoint)
                    else:  # event by event, each bad one left out and counted
                        out.add(batch.envelope(), split, now, endpoint)
                for (kind, message), count in split.errors.items():
                    errors[split.source, kind, message] += count
                results.append(
                    TelemetryIngest(
                        source=split.source,
                        iterations=split.iterations,
                        requests=split.requests,
                        tokens=split.tokens,
                        control_events=split.control_events,
                        rejected_events=split.rejected_events,
                        rejected_batch=split.rejected_batch,
                    )
                )
            parts = {
                table: self._columns_arrow(table, [ColumnBlock.of(values, {"node": node})])
                for table, values in out.columns().items()
            }
            tokens = out.tokens_table()
            if tokens is not None:
                parts["tokens"] = conform("tokens", _with_node(tokens, node), self._table_columns("tokens"))
            if columnar:
                data = conform("iterations", columnar.table(node), self._table_columns("iterations"))
                parts["iterations"] = (
                    one_table([parts["iterations"], data]) if "iterations" in parts else data
                )
            if errors:
                rows = [
                    {"node": node, "source": src, "ts_s": now, "kind": kind, "message": msg, "count": n}
                    for (src, kind, msg), n in errors.items()
                ]
                parts["ingest_errors"] = self._to_arrow("ingest_errors", rows)
            if parts:
                self._enqueue(parts, keys=keys)
        return results

    def telemetry_cursors(self, node: str, endpoint: str) -> dict[str, tuple[int, float]]:
        """Per telemetry source read from ``endpoint`` on ``node``: ``(seq, sent_s)`` of the newest
        batch stored (by arrival; rows stored before version 8 have no endpoint and count too).
        A collector resumes its cursors from these after a restart."""
        with self._lock:
            self._flush_locked()  # waits for a flush in flight; its failure stays for flush()
        rows = self.query(
            "SELECT source, seq, sent_s FROM telemetry_batches "
            "WHERE node = ? AND (endpoint = ? OR endpoint IS NULL) "
            "QUALIFY row_number() OVER (PARTITION BY source ORDER BY received_s DESC, seq DESC) = 1",
            [node, endpoint],
        )
        return {r.source: (int(r.seq), float(r.sent_s)) for r in rows.itertuples()}

    def record_gaps(self, gaps: Iterable[Gap], node: str, *, detected_at_s: float | None = None) -> int:
        """Record telemetry sequence gaps (``serving.telemetry.Gap``) seen by the reader."""
        at = time.time() if detected_at_s is None else detected_at_s
        rows = [
            {
                "node": node,
                "source": g.source,
                "after_seq": g.after_seq,
                "missing_batches": g.missing_batches,
                "detected_at_s": at,
            }
            for g in gaps
        ]
        return self.append("telemetry_gaps", rows) if rows else 0

    def record_ingest_error(self, node: str, source: str, kind: str, message: str, count: int = 1) -> None:
        """Count ``count`` bad inputs of ``kind`` from ``source`` (e.g. a StoreError from append)."""
        self.record_ingest_errors(node, [(source, kind, message, count)])

    def record_ingest_errors(self, node: str, errors: Iterable[tuple[str, str, str, int]]) -> None:
        """Count many problems at once, ``(source, kind, message, count)`` each: one append."""
        now_s = time.time()
        rows = [
            {"node": node, "source": source, "ts_s": now_s, "kind": kind, "message": message, "count": count}
            for source, kind, message, count in errors
        ]
        if rows:
            self.append("ingest_errors", rows)


def _with_node(data: pa.Table, node: str) -> pa.Table:
    """``data`` with a ``node`` column of ``node`` on every row (dictionary-encoded)."""
    codes = pa.array(np.zeros(data.num_rows, dtype=np.int32))
    return data.append_column("node", pa.DictionaryArray.from_arrays(codes, pa.array([node])))
