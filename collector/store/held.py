"""Rows the store holds while the disk refuses writes: what counts as such a failure, and the bound.

A flush that fails because the storage cannot take writes (no space left, quota, an I/O error; see
:func:`write_failure_cause`) is not discarded: its rows go back to the front of the write buffer
and the next flush retries them with everything appended since, in one transaction, so they are
committed in the order they were appended. The buffer is bounded (``max_held_rows``): past it the
oldest sample rows are dropped, and each drop is kept as a :class:`HeldDrop` (table, rows, time
range, cause) for the collector to record as a gap. Only sample rows (``SAMPLE_TABLES``) are ever
dropped: telemetry-derived rows are bounded upstream (the collector stops reading telemetry while
writes fail, and the stack's ring keeps what was not committed, docs/TELEMETRY.md), and the rest
(devices, problem counts, reports, ...) is a few rows.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.store.tables import TABLES

# the tables whose held rows may be dropped past the bound (the high-rate samples); the rest are
# held until written
SAMPLE_TABLES = frozenset({"gpu_samples", "emulation_samples", "host_samples", "engine_metrics"})
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG})
_STORAGE_WORDS = ("no space left on device", "disk quota exceeded", "could not write file", "i/o error")
_INVALIDATED = "database has been invalidated"


@dataclass(frozen=True, slots=True)
class HeldDrop:
    """Rows of ``table`` dropped from the held buffer when it overflowed: a gap in the store."""

    table: str
    rows: int
    from_s: float | None  # the time range of the dropped rows (the table's time column), UTC epoch s
    to_s: float | None
    cause: str  # why writes were failing


def write_failure_cause(error: BaseException) -> str | None:
    """What stops the storage from taking writes (e.g. ``no space left on device``), when ``error``
    (or its cause chain) is such a failure; None for any other error (bad rows, a constraint),
    whose flush is discarded, not retried."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _STORAGE_ERRNOS:
            return (e.strerror or str(e)).lower()
        if isinstance(e, duckdb.Error):
            text = str(e).lower()
            for word in _STORAGE_WORDS:
                if word in text:
                    return word if word != "could not write file" else _first_line(str(e))
            if isinstance(e, duckdb.IOException | duckdb.FatalException):
                return _first_line(str(e))
        e = e.__cause__ or e.__context__
    return None


def invalidated(error: BaseException) -> bool:
    """True when DuckDB invalidated the database (a failed checkpoint on a full disk does): the
    connection must be closed and the file opened again."""
    e: BaseException | None = error
    while e is not None:
        if isinstance(e, duckdb.FatalException) or _INVALIDATED in str(e):
            return True
        e = e.__cause__
    return False


def time_range(table: str, data: pa.Table) -> tuple[float | None, float | None]:
    """The min and max of ``table``'s time column in ``data`` (None when it has none)."""
    spec = TABLES.get(table)
    if spec is None or spec.time_column not in data.column_names or not data.num_rows:
        return None, None
    lo_hi = pc.min_max(data[spec.time_column])
    lo, hi = lo_hi["min"].as_py(), lo_hi["max"].as_py()
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def drop_oldest(pending: dict[str, list[pa.Table]], excess_rows: int, cause: str) -> list[HeldDrop]:
    """Drop whole appended parts of the ``SAMPLE_TABLES``, oldest first from the
    table holding most rows, until ``excess_rows`` rows are gone or none is left; what was dropped,
    merged per table. ``pending`` is changed in place."""
    dropped: dict[str, list[pa.Table]] = {}
    while excess_rows > 0:
        candidates = [(sum(p.num_rows for p in parts), name) for name, parts in pending.items()]
        candidates = [(n, name) for n, name in candidates if n and name in SAMPLE_TABLES]
        if not candidates:
            break
        _, name = max(candidates)
        part = pending[name].pop(0)
        if not pending[name]:
            del pending[name]
        dropped.setdefault(name, []).append(part)
        excess_rows -= part.num_rows
    out = []
    for name, parts in dropped.items():
        ranges = [time_range(name, p) for p in parts]
        los = [lo for lo, _ in ranges if lo is not None]
        his = [hi for _, hi in ranges if hi is not None]
        out.append(
            HeldDrop(
                name,
                sum(p.num_rows for p in parts),
                min(los) if los else None,
                max(his) if his else None,
                cause,
            )
        )
    return out


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else text
