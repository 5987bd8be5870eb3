"""The scrape-source contract of the collector: ``poll()`` returns rows per table plus counted problems.

A source never raises out of :meth:`Source.poll`: a failed fetch (unreachable, an HTTP error, no
whole answer by the fetch's deadline) is recorded in its :class:`SourceHealth` (status ``down``) and
retried after an exponentially growing delay capped at ``DEFAULT_MAX_BACKOFF_S`` (10 s;
:class:`~collector.sources.backoff.Backoff`), so an unreachable endpoint never becomes a crash loop
and a recovered one is read again soon. An answer over the size limit (:class:`PageTooLarge`) is
counted and the source reads ``degraded``. The next good poll clears the status and ``last_error``.
Problems inside a successful fetch (a malformed line, an unknown metric, a clock that jumped back)
are counted as :class:`IngestError` and the rest of the data is kept.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from collector.sources.backoff import DEFAULT_MAX_BACKOFF_S, Backoff
from collector.store.columns import ColumnBlock, RepeatedColumns, transpose
from collector.store.devices import IDENTITY_COLUMNS

log = logging.getLogger(__name__)

TABLE_GPU_SAMPLES = "gpu_samples"
TABLE_ENGINE_METRICS = "engine_metrics"

Severity = Literal["error", "warning", "info"]
Status = Literal["unknown", "ok", "degraded", "down"]


@dataclass
class IngestError:
    """A counted problem met while ingesting from ``source``.

    ``kind`` is a short machine-readable word (``unreachable``, ``timeout``, ``http_status``,
    ``page_too_large``, ``malformed_line``, ``non_numeric``, ``non_finite``, ``unmapped``,
    ``duplicate_series``, ``clock_backwards``, ``counter_reset``, ``query_error``, ``partial_data``,
    ``internal``; the service adds ``store_rejected``). ``message`` is the first occurrence's detail.
    Severity ``error`` means data was lost (the source reads ``degraded``); ``warning`` means
    something was skipped that the tables have no place for; ``info`` is bookkeeping only.
    """

    source: str
    kind: str
    message: str
    count: int = 1
    severity: Severity = "error"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SourceResult:
    """What one poll produced: rows per target table and the problems met, merged by kind."""

    source: str
    ts_s: float
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # rows given as columns (add_columns): what the high-rate sources produce, built once per flush
    columns: dict[str, list[ColumnBlock]] = field(default_factory=dict)
    errors: list[IngestError] = field(default_factory=list)
    ok: bool = True  # False when the fetch itself failed
    skipped: bool = False  # True when the poll was not due (backing off) and nothing was fetched

    def add_rows(self, table: str, rows: Iterable[dict[str, Any]]) -> None:
        self.rows.setdefault(table, []).extend(rows)

    def add_columns(
        self,
        table: str,
        values: Mapping[str, Sequence[Any]],
        constants: Mapping[str, Any] | None = None,
        repeats: Mapping[str, Sequence[Any]] | None = None,
        *,
        packed: bool = False,
    ) -> None:
        """Add rows to ``table`` as columns: equal-length value lists, plus ``constants`` (one value
        for every row, e.g. the node) and ``repeats`` (value lists handed on as the previous poll's
        object while unchanged: ``RepeatedColumns.share``). Cheaper for the writer than dicts
        (``Store.append_columns``). ``packed``: the values are numbers (a GPU's metrics): pack
        them as float64 too, which the writer builds its numeric columns from (``ColumnBlock.of``)."""
        self.add_block(table, ColumnBlock.of(values, constants, repeats, packed=packed))

    def add_block(self, table: str, block: ColumnBlock) -> None:
        """Add a block of rows to ``table`` (one without rows is left out)."""
        if block.n:
            self.columns.setdefault(table, []).append(block)

    def add_samples(
        self,
        table: str,
        rows: Sequence[Mapping[str, Any]],
        constants: Mapping[str, Any] | None = None,
        repeats: RepeatedColumns | None = None,
    ) -> None:
        """Add a poll's sample dicts to ``table`` as columns: transposed, with ``constants`` for
        every row, and (with ``repeats``, one per source and table) the GPUs' identity columns
        (``IDENTITY_COLUMNS``, and the repeats' steady ones) handed on as the previous poll's while
        unchanged; the columns handed on per poll (a GPU's metrics) are then packed as well."""
        values = transpose(rows)
        shared = None
        if repeats is not None:
            values, shared = repeats.split(values, IDENTITY_COLUMNS)
        self.add_columns(table, values, constants, shared, packed=repeats is not None)

    def table_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``table`` in this result as a dict: those added as rows, then as columns."""
        return [*self.rows.get(table, []), *(r for b in self.columns.get(table, []) for r in b.to_rows())]

    def count(
        self, kind: str, message: str, n: int = 1, severity: Severity = "error", *, distinct: bool = False
    ) -> None:
        """Count ``n`` problems of ``kind``; the first message of a kind is kept.

        ``distinct`` keeps each message apart (e.g. one ``unmapped`` entry per metric family).
        """
        if n <= 0:
            return
        for e in self.errors:
            if e.kind == kind and e.severity == severity and (not distinct or e.message == message):
                e.count += n
                return
        self.errors.append(IngestError(self.source, kind, message, n, severity))

    def error_count(self, kind: str | None = None) -> int:
        """How many problems of ``kind`` (all kinds when ``None``) were counted."""
        return sum(e.count for e in self.errors if kind is None or e.kind == kind)

    @property
    def n_rows(self) -> int:
        return sum(len(r) for r in self.rows.values()) + sum(
            b.n for blocks in self.columns.values() for b in blocks
        )

    @property
    def degraded(self) -> bool:
        return any(e.severity == "error" for e in self.errors)


@dataclass
class SourceHealth:
    """How a source is doing, for the service's health endpoint and the dashboard."""

    name: str
    status: Status = "unknown"
    last_attempt_s: float | None = None
    last_success_s: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    next_attempt_s: float | None = None
    rows_total: int = 0
    errors_total: int = 0  # counted problems of severity error or warning, failed polls, store rejections
    store_rejected_rows: int = 0  # rows of this source the store refused (counted by the service)
    last_store_rejected_s: float | None = None
    timeouts: int = 0  # fetches that did not end by their deadline (the source reads ``down``)
    pages_too_large: int = 0  # answers over the size limit, dropped (the source reads ``degraded``)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SourceUnavailable(Exception):
    """A fetch failed as a whole (endpoint unreachable, HTTP error, every query rejected)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class PageTooLarge(SourceUnavailable):
    """The endpoint answered with a body over the size limit; it was read no further and dropped.

    Unlike a failed fetch the endpoint is up: the source reads ``degraded`` (not ``down``) and polls
    again at its interval, without backing off, so the first page within the limit is read at once.
    """

    def __init__(self, message: str) -> None:
        super().__init__("page_too_large", message)


class UnmappedFamilies:
    """Counts the metric families a source has no place for, once per family per ``every_s``.

    Each is an ``unmapped`` warning naming the family (it reaches ``ingest_errors``), so a family
    that is dropped every scrape is visible without a row per scrape.
    """

    def __init__(self, every_s: float = 3600.0) -> None:
        self.every_s = every_s
        self._last_s: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._last_s)

    def count(self, families: Iterable[str], now_s: float, result: SourceResult, why: str) -> None:
        """Count each of ``families`` on ``result`` unless it was counted less than ``every_s`` ago."""
        for family in sorted(set(families)):
            last = self._last_s.get(family)
            if last is not None and 0 <= now_s - last < self.every_s:
                continue
            self._last_s[family] = now_s
            result.count("unmapped", f"{family}: {why}", severity="warning", distinct=True)


#: How long after the store last refused a source's rows the source reads ``degraded``.
STORE_REJECTED_DEGRADED_S = 60.0


class Source(ABC):
    """A poll-driven data source. Subclasses implement :meth:`_discover` and :meth:`_collect`.

    ``clock`` (epoch seconds) stamps rows and drives the backoff schedule; ``interval_s`` is the
    nominal delay between successful polls (``due()`` is true again after it).
    """

    def __init__(
        self,
        name: str,
        *,
        interval_s: float = 0.0,
        clock: Callable[[], float] | None = None,
        backoff: Backoff | None = None,
        discovery_ttl_s: float = 60.0,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.clock = clock if clock is not None else time.time
        self.backoff = backoff if backoff is not None else Backoff(max_s=DEFAULT_MAX_BACKOFF_S)
        self.discovery_ttl_s = discovery_ttl_s
        self._health = SourceHealth(name)
        self._health_lock = threading.Lock()  # the writer thread reports store rejections
        self._available: bool | None = None
        self._available_checked_s: float | None = None
        self._lock = threading.Lock()

    # --- for subclasses ------------------------------------------------------------------------

    @abstractmethod
    def _discover(self) -> bool:
        """Return True when the endpoint answers with data this source understands. May raise."""

    @abstractmethod
    def _collect(self, now_s: float, result: SourceResult) -> None:
        """Fetch once and fill ``result``. Raise :class:`SourceUnavailable` when the fetch failed."""

    # --- public API ----------------------------------------------------------------------------

    def available(self, refresh: bool = False) -> bool:
        """Whether the endpoint is there (cached for ``discovery_ttl_s``; never raises)."""
        now = self.clock()
        fresh = (
            self._available_checked_s is not None
            and 0 <= now - self._available_checked_s < self.discovery_ttl_s
        )
        if self._available is None or refresh or not fresh:
            try:
                self._available = bool(self._discover())
            except Exception as e:  # discovery is best effort
                log.debug("%s: discovery failed: %s", self.name, e)
                self._available = False
            self._available_checked_s = now
        return self._available

    def due(self, now_s: float | None = None) -> bool:
        """Whether a poll now would fetch (False while backing off or inside ``interval_s``)."""
        nxt = self._health.next_attempt_s
        return nxt is None or (self.clock() if now_s is None else now_s) >= nxt

    def poll(self, *, force: bool = False) -> SourceResult:
        """Fetch once if due (or ``force``); never raises. Health and backoff are updated."""
        with self._lock:
            now = self.clock()
            result = SourceResult(self.name, now)
            if not force and not self.due(now):
                result.skipped = True
                return result
            h = self._health
            h.last_attempt_s = now
            try:
                self._collect(now, result)
            except PageTooLarge as e:
                self._too_large(result, now, e.message)
            except SourceUnavailable as e:
                self._fail(result, now, e.kind, e.message)
            except Exception as e:  # a bug or an unexpected payload: count it, back off, carry on
                log.exception("%s: poll failed", self.name)
                self._fail(result, now, "internal", f"{type(e).__name__}: {e}")
            else:
                self.backoff.success()
                with self._health_lock:
                    h.consecutive_failures = 0
                    h.last_success_s = now
                    h.next_attempt_s = now + self.interval_s
                    rejected = self._rejected_recently(now)
                    h.status = "degraded" if result.degraded or rejected else "ok"
                    # the last error is this poll's; an earlier one clears (a store refusal stays
                    # while it keeps the source degraded)
                    h.last_error = next(
                        (f"{e.kind}: {e.message}" for e in result.errors if e.severity != "info"),
                        h.last_error
                        if rejected and (h.last_error or "").startswith("store_rejected")
                        else None,
                    )
                    h.rows_total += result.n_rows
                    h.errors_total += sum(e.count for e in result.errors if e.severity != "info")
                self._available, self._available_checked_s = True, now
            return result

    def record_store_rejected(self, n_rows: int, message: str) -> None:
        """Count ``n_rows`` of this source's rows that the store refused (called by the writer).

        One error per refused append; the source reads ``degraded`` until
        :data:`STORE_REJECTED_DEGRADED_S` after the last refusal.
        """
        now = self.clock()
        with self._health_lock:
            h = self._health
            h.errors_total += 1
            h.store_rejected_rows += n_rows
            h.last_store_rejected_s = now
            h.last_error = f"store_rejected: {message}"
            if h.status != "down":
                h.status = "degraded"

    def _rejected_recently(self, now_s: float) -> bool:
        last = self._health.last_store_rejected_s
        return last is not None and now_s - last < STORE_REJECTED_DEGRADED_S

    def health(self) -> SourceHealth:
        """A copy of the current health."""
        with self._health_lock:
            return SourceHealth(**asdict(self._health))

    @property
    def next_attempt_s(self) -> float | None:
        """When the next poll is due (epoch seconds, on ``clock``); None before the first poll."""
        return self._health.next_attempt_s

    def health_details(self) -> dict[str, Any]:
        """Source-specific counters for the health endpoint (e.g. telemetry gaps); none by default."""
        return {}

    def close(self) -> None:
        """Release connections. Safe to call more than once."""
        return None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # --- internals -----------------------------------------------------------------------------

    def _too_large(self, result: SourceResult, now: float, message: str) -> None:
        """An answer over the size limit: counted, the source ``degraded``; polled again at its interval."""
        result.ok = False
        result.rows.clear()
        result.columns.clear()
        result.errors = [IngestError(self.name, "page_too_large", message, 1, "error")]
        self.backoff.success()  # the endpoint answers: no backoff
        with self._health_lock:
            h = self._health
            h.status = "degraded"
            h.consecutive_failures = 0
            h.last_error = f"page_too_large: {message}"
            h.errors_total += 1
            h.pages_too_large += 1
            h.next_attempt_s = now + self.interval_s
        log.warning("%s: page_too_large (%s)", self.name, message)

    def _fail(self, result: SourceResult, now: float, kind: str, message: str) -> None:
        result.ok = False
        result.rows.clear()
        result.columns.clear()
        result.errors = [IngestError(self.name, kind, message, 1, "error")]
        delay = self.backoff.failure()
        with self._health_lock:
            h = self._health
            h.status = "down"
            h.consecutive_failures += 1
            h.last_error = f"{kind}: {message}"
            h.errors_total += 1
            h.timeouts += kind == "timeout"
            h.next_attempt_s = now + delay
        log.warning("%s: %s (%s); retrying in %.1f s", self.name, kind, message, delay)
