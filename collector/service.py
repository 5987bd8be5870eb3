"""The collector service: polls every source on its own thread, writes the store from one writer
thread (DuckDB admits one writing process; this is it), and serves reads and health over HTTP.

While the disk refuses writes (no space left, ...) the store holds what it could not write and
retries it each flush interval, in append order (collector/store/held.py); the serving telemetry
sources stop reading meanwhile, so the stack's ring keeps what is not committed, and /health reads
``degraded`` naming the cause. Held sample rows dropped past the store's bound are recorded as gaps
(``ingest_errors`` kind ``store_gap``: table, rows, time range, cause).

Writes that do not come from a source (``import_export``: merging a Parquet export, e.g. a simulated
scenario's) are jobs run by the writer thread between two drains, so nothing else writes meanwhile.

The service process adds its jobs (phaselens/api.py: the report scheduler, the Prometheus export)
with :meth:`Collector.add_job`: started after the writer, stopped before it, named in ``/health``.

What it samples and where it writes (:class:`CollectorSettings`, which builds the sources) is in
collector/settings.py; the sources and the store are their own modules.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from collector.settings import CollectorSettings
from collector.sources.base import Source, SourceResult
from collector.sources.local_gpus import LocalGpuSource
from collector.sources.serving_batch import ServingStackSource
from collector.sources.serving_stack import TABLE_TELEMETRY, TABLE_TELEMETRY_GAPS, ServingTelemetrySource
from collector.store import (
    FlushError,
    ImportResult,
    Store,
    StoreError,
    TelemetryIngest,
    apply_retention,
    import_parquet,
)
from collector.store.columns import ColumnBlock
from collector.store.held import HeldDrop
from serving.devices import nvml_status

log = logging.getLogger(__name__)
T = TypeVar("T")
STORE_GAPS_KEPT = 20  # /health lists this many of the newest store gaps
# While the disk refuses writes the held rows are tried again after a delay doubling from the flush
# interval up to this (or 20 flush intervals): each try writes them all before the commit fails.
RETRY_MAX_S = 10.0


class ServiceJob(Protocol):
    """Run beside the collector (the report scheduler, the metrics export): see :meth:`Collector.add_job`."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class CollectorNotRunning(Exception):
    """A job was handed to the writer thread while it is not running (not started, or stopping)."""


@dataclass(slots=True)
class WriterStats:
    rows_written: dict[str, int] = field(default_factory=dict)
    # telemetry batches read again that the store already held (skipped, not in rows_written)
    duplicates: dict[str, int] = field(default_factory=dict)
    results_dropped: int = 0  # poll results dropped because the writer fell behind
    store_errors: int = 0
    # rows counted in rows_written that a background flush of the store then failed to write (and
    # did not hold: a flush the disk refused is held and retried, not lost)
    rows_lost: int = 0
    # held rows dropped past the store's bound while writes failed, per table (recorded as gaps)
    rows_dropped: dict[str, int] = field(default_factory=dict)
    store_gaps: list[dict[str, Any]] = field(default_factory=list)  # the last STORE_GAPS_KEPT of them
    store_gaps_total: int = 0
    flushes: int = 0
    retention_runs: int = 0
    raw_rows_rolled_up: int = 0
    last_flush_s: float | None = None
    last_error: str | None = None
    imports: int = 0  # Parquet exports merged through import_export
    rows_imported: int = 0
    last_import_s: float | None = None


class Collector:
    """Pollers (one thread per source) → bounded queue → one writer thread → the store."""

    def __init__(
        self, settings: CollectorSettings, store: Store, sources: list[Source] | None = None
    ) -> None:
        self.settings = settings
        self.store = store
        self.sources = sources if sources is not None else settings.build_sources()
        self._by_name = {s.name: s for s in self.sources}
        self._endpoints = {s.name: s.url for s in self.sources if isinstance(s, ServingTelemetrySource)}
        self.stats = WriterStats()
        self._queue: queue.Queue[SourceResult] = queue.Queue(maxsize=settings.max_queue)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._dropped_recorded = 0
        self._last_checkpoint_s = time.time()
        self._retry_delay_s = 0.0  # while writes fail: the delay before the next try, and its time
        self._retry_at = 0.0  # (monotonic)
        self.started_s = time.time()
        self._schema_version = store.schema_version  # for /health: read without the store's lock
        # jobs for the writer thread (import_export), and what wakes it before its next flush is due
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._jobs_lock = threading.Lock()
        self._jobs_open = False
        self._wake = threading.Event()
        self._service_jobs: list[tuple[ServiceJob, str | None]] = []  # add_job: (job, its /health key)

    def start(self) -> None:
        """Resume telemetry cursors from the store, then start the pollers and the writer."""
        self.restore_cursors()
        for src in self.sources:
            t = threading.Thread(target=self._poll_loop, args=(src,), daemon=True, name=f"poll-{src.name}")
            t.start()
            self._threads.append(t)
        writer = threading.Thread(target=self._write_loop, daemon=True, name="store-writer")
        writer.start()
        self._threads.append(writer)
        with self._jobs_lock:
            self._jobs_open = not self._stop.is_set()
        for job, _ in self._service_jobs:
            job.start()

    def stop(self) -> None:
        """Stop polling, write everything still queued, checkpoint; safe to call twice."""
        if self._stop.is_set():
            return
        for job, _ in reversed(self._service_jobs):
            job.stop()
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=10)
        self._close_jobs()
        self._drain()
        try:
            self.store.checkpoint()
        except FlushError as e:  # an earlier background flush failed: counted; the rest is written
            self._flush_failed(e)
        except StoreError as e:  # the checkpoint itself (a full disk): what was flushed is committed
            self.stats.store_errors += 1
            self.stats.last_error = str(e)
            log.error("checkpoint at stop failed: %s", e)
        for src in self.sources:
            src.close()

    def restore_cursors(self) -> None:
        """Give each serving telemetry source the newest batch per producer already stored, so a
        restarted collector neither reads stored batches again nor reports them as a gap."""
        for src in self.sources:
            if isinstance(src, ServingTelemetrySource):
                try:
                    src.restore(self.store.telemetry_cursors(self.settings.node, src.url))
                except StoreError as e:
                    self.stats.store_errors += 1
                    self.stats.last_error = str(e)
                    log.error("%s: cursors not restored (batches may be read again): %s", src.name, e)

    # -- threads -----------------------------------------------------------------------------------

    def _poll_loop(self, src: Source) -> None:
        telemetry = isinstance(src, ServingTelemetrySource)
        stack = isinstance(src, ServingStackSource)
        while not self._stop.is_set():
            # no telemetry read until the store takes writes again: the stack's ring keeps the
            # batches (what was read before is held by the store and written first); a stack's
            # device samples are still read (held like any row, the oldest dropped and counted)
            paused = telemetry and self.store.write_failure is not None
            if stack:
                src.telemetry_paused = paused
            elif paused:
                self._stop.wait(min(src.interval_s, 1.0))
                continue
            result = src.poll()
            if not result.skipped:
                self._put(result)
            nxt = src.next_attempt_s
            delay = 0.05 if nxt is None else max(0.0, nxt - src.clock())
            self._stop.wait(min(delay, 1.0))

    def _put(self, result: SourceResult) -> None:
        """Queue a poll result for the writer; a full queue drops its oldest result (counted).
        One lock per result, the queue's own: the writer takes everything queued under it at once
        (``_drain``) and nothing blocks on ``get``, so ``put_nowait``'s conditions are not needed
        (they cost several times this per 8-row poll)."""
        q = self._queue
        with q.mutex:
            if 0 < q.maxsize <= len(q.queue):  # maxsize 0: unbounded, as for queue.Queue
                q.queue.popleft()
                self.stats.results_dropped += 1
            q.queue.append(result)

    def _write_loop(self) -> None:
        interval = self.settings.flush_interval_s
        self._apply_retention()  # a collector down past the horizon catches up at once
        last_retention = time.monotonic()
        while not self._sleep(interval):
            self._drain()
            self._run_jobs()
            if time.monotonic() - last_retention >= self.settings.retention_interval_s:
                last_retention = time.monotonic()
                self._apply_retention()

    def _sleep(self, interval_s: float) -> bool:
        """Wait ``interval_s`` or until woken (stop, a job queued); True when stopping."""
        self._wake.wait(interval_s)
        self._wake.clear()
        return self._stop.is_set()

    # -- jobs on the writer thread ------------------------------------------------------------------

    def import_export(self, path: str | Path) -> Future[ImportResult]:
        """Queue the merge of a Parquet export directory (``phaselens store export``'s layout) into
        the store; the writer thread runs it between two drains (``import_parquet``: one
        transaction). The future gives the ImportResult, or raises the ExportFormatError/StoreError
        of an import that wrote nothing. CollectorNotRunning when the writer is not running."""
        return self.submit(partial(self._import, Path(path)))

    def _import(self, path: Path) -> ImportResult:
        result = import_parquet(self.store, path)
        self.stats.imports += 1
        self.stats.rows_imported += sum(result.inserted.values())
        self.stats.last_import_s = time.time()
        log.info("imported %s: %s", path, result.inserted)
        return result

    def add_job(self, job: ServiceJob, health_key: str | None = None) -> None:
        """Run ``job`` with the collector: started after the writer (in the order added), stopped
        before it (in reverse); ``job.health()`` under ``health_key`` in :meth:`health` when given."""
        self._service_jobs.append((job, health_key))

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        """Hand ``job`` to the writer thread and wake it (it runs between two drains, nothing else
        writes meanwhile); its future gives the result. CollectorNotRunning when the writer is not."""
        fut: Future[Any] = Future()
        with self._jobs_lock:
            if not self._jobs_open:
                raise CollectorNotRunning("the collector's writer is not running (starting or stopping)")
            self._jobs.put((job, fut))
        self._wake.set()
        return fut

    def _run_jobs(self) -> None:
        """Run the queued jobs (writer thread); a failing job fails its future, not the writer."""
        while True:
            try:
                job, fut = self._jobs.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue  # the caller gave up before it started
            try:
                fut.set_result(job())
            except Exception as e:  # handed to the caller
                fut.set_exception(e)

    def _close_jobs(self) -> None:
        """Refuse new jobs and fail the queued ones (the writer thread has stopped)."""
        with self._jobs_lock:
            self._jobs_open = False
        while True:
            try:
                _, fut = self._jobs.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(CollectorNotRunning("the collector stopped before the job ran"))

    def _apply_retention(self) -> None:
        """Fold raw samples older than the retention into 10 s rollups (same writer thread)."""
        try:
            res = apply_retention(self.store, self.settings.retention)
            self.stats.retention_runs += 1
            self.stats.raw_rows_rolled_up += res.raw_rows_deleted
        except StoreError as e:
            self.stats.store_errors += 1
            self.stats.last_error = str(e)
            log.error("retention failed: %s", e)

    def _drain(self) -> None:
        """Write everything queued; commit when the flush interval has passed since the last
        commit. Drains that follow each other faster (a writer catching up on full queues) leave
        their rows to the store's buffer (``WRITER_BUFFER_ROWS``, written as whole row groups),
        so nothing waits uncommitted longer than an interval plus one drain."""
        q = self._queue
        with q.mutex:  # take everything queued at once (not one locked get per poll result)
            results: list[SourceResult] = list(q.queue)
            q.queue.clear()
            q.not_full.notify_all()
        last = self.stats.last_flush_s or self.started_s
        due = time.time() - last >= self.settings.flush_interval_s
        if results or due:
            self.write_results(results, flush=due)

    def write_results(self, results: list[SourceResult], *, flush: bool = True) -> None:
        """Store poll results the way the writer thread does (one append per source and table),
        then flush (``flush=False``: leave them to the store's buffer, which writes when full).
        Only the writer thread (or a test without one) calls this."""
        # One append per (source, table) per flush: converting many tiny batches costs more than rows.
        by_source: dict[str, list[SourceResult]] = {}
        for res in results:
            by_source.setdefault(res.source, []).append(res)
        for group in by_source.values():
            self._write(group)
        dropped = self.stats.results_dropped - self._dropped_recorded
        if dropped:
            self._dropped_recorded += dropped
            self._record(
                "collector", "writer_behind", "poll results dropped: the writer fell behind", dropped
            )
        if not flush:
            return
        if self.store.write_failure is not None and time.monotonic() < self._retry_at:
            self._record_drops(self.store.take_held_drops())
            return
        try:
            now = time.time()
            # no checkpoint while writes fail: one that fails on a full disk invalidates the database
            checkpoint_due = now - self._last_checkpoint_s >= self.settings.checkpoint_interval_s
            if checkpoint_due and self.store.write_failure is None:
                self.store.checkpoint()
                self._last_checkpoint_s = now
            else:  # committed on the store's flush thread while this one goes on (or sleeps)
                self.store.flush(wait=False)
            self.stats.flushes += 1
            self.stats.last_flush_s = now
        except FlushError as e:
            self._flush_failed(e)
        except StoreError as e:
            self.stats.store_errors += 1
            self.stats.last_error = str(e)
            log.error("store flush failed: %s", e)
        if self.store.write_failure is None:
            self._retry_delay_s = 0.0
        self._record_drops(self.store.take_held_drops())

    def _record_drops(self, drops: list[HeldDrop]) -> None:
        """Held rows the store dropped past its bound: counted, listed in /health, and recorded as
        gaps (``ingest_errors`` kind ``store_gap``; held like any row until the store takes writes)."""
        for d in drops:
            self.stats.rows_dropped[d.table] = self.stats.rows_dropped.get(d.table, 0) + d.rows
            self.stats.store_gaps_total += 1
            gap = {"table": d.table, "rows": d.rows, "from_s": d.from_s, "to_s": d.to_s, "cause": d.cause}
            self.stats.store_gaps = [*self.stats.store_gaps, gap][-STORE_GAPS_KEPT:]
            self._record(
                "collector",
                "store_gap",
                f"{d.table}: {d.rows} rows from ts {d.from_s} to {d.to_s} (UTC epoch s) dropped: held while "
                f"store writes failed ({d.cause}) past the store's bound",
                d.rows,
            )

    def _write(self, results: list[SourceResult]) -> None:
        """Append one source's poll results: rows merged per table, problems counted."""
        source = results[0].source
        merged: dict[str, list[dict[str, Any]]] = {}
        columns: dict[str, list[ColumnBlock]] = {}
        for res in results:  # one pass: a flush may hold 10,000 poll results of a few rows each
            if res.rows:
                for table, rows in res.rows.items():
                    if table == TABLE_TELEMETRY_GAPS:
                        rows = [{**r, "detected_at_s": res.ts_s} for r in rows]
                    merged.setdefault(table, []).extend(rows)
            for table, blocks in res.columns.items():
                if table in columns:
                    columns[table] += blocks
                else:
                    columns[table] = list(blocks)
        for table, blocks in columns.items():
            try:
                written = self._taking(partial(self.store.append_columns, table, blocks))
                self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + written
            except StoreError as e:
                self._rejected(source, e, sum(b.n for b in blocks))
        for table, rows in merged.items():
            if not rows:
                continue
            try:
                if table == TABLE_TELEMETRY:
                    ingests = self._append_telemetry(rows, source)
                    duplicates = sum(i.duplicate for i in ingests)
                    if duplicates:
                        self.stats.duplicates[table] = self.stats.duplicates.get(table, 0) + duplicates
                    written = len(ingests) - duplicates
                else:
                    written = self._taking(partial(self.store.append, table, rows))
                self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + written
            except StoreError as e:  # bad rows from a source: counted, the service carries on
                self._rejected(source, e, len(rows))
        # one append for the flush's problems: a row each, converted once (not one append each)
        problems = [
            (err.source, err.kind, err.message[:2000], err.count)
            for res in results
            for err in res.errors
            if err.severity != "info"
        ]
        if problems:
            try:
                self._taking(partial(self.store.record_ingest_errors, self.settings.node, problems))
            except StoreError:  # one at a time, so that only a row the store refuses is lost (logged)
                for source_, kind, message, count in problems:
                    self._record(source_, kind, message, count)

    def _append_telemetry(self, batches: list[Any], source: str) -> list[TelemetryIngest]:
        """All of a source's telemetry batches of this flush in one append; when the store refuses
        them, batch by batch, so that only a bad batch is lost (counted as store_rejected)."""
        node, endpoint = self.settings.node, self._endpoints.get(source)
        append = partial(self.store.append_telemetry_batches, node=node, endpoint=endpoint)
        try:
            return self._taking(partial(append, batches))
        except StoreError:
            if len(batches) == 1:
                raise
        ingests: list[TelemetryIngest] = []
        for batch in batches:
            try:
                ingests += self._taking(partial(append, [batch]))
            except StoreError as e:
                self._rejected(source, e, 1)
        return ingests

    def _taking(self, append: Callable[[], T]) -> T:
        """``append()``; when it reports that an earlier background flush failed (a store error,
        not this source's: the append took nothing of its rows), count that and append again."""
        try:
            return append()
        except FlushError as e:
            self._flush_failed(e)
        return append()

    def _flush_failed(self, error: FlushError) -> None:
        """A background flush of the store failed: its rows, already counted as written, are lost,
        except those the store holds (the disk refused them: written by a later flush)."""
        lost = error.rows - error.held_rows
        if error.held_rows:
            interval = self.settings.flush_interval_s
            cap = min(RETRY_MAX_S, 20 * interval)
            self._retry_delay_s = min(cap, max(interval, 2 * self._retry_delay_s))
            self._retry_at = time.monotonic() + self._retry_delay_s
        self.stats.store_errors += 1
        self.stats.rows_lost += lost
        self.stats.last_error = str(error)
        log.error("store flush failed, %d rows lost, %d held: %s", lost, error.held_rows, error)

    def _rejected(self, source: str, error: StoreError, n: int) -> None:
        """Rows of ``source`` the store refused: counted in ingest_errors and as the source's own
        errors (it reads degraded, and so does /health)."""
        self.stats.store_errors += 1
        self.stats.last_error = str(error)
        self._record(source, "store_rejected", str(error), n)
        src = self._by_name.get(source)
        if src is not None:
            src.record_store_rejected(n, str(error))

    def _record(self, source: str, kind: str, message: str, count: int) -> None:
        try:
            self._taking(
                partial(
                    self.store.record_ingest_error, self.settings.node, source, kind, message[:2000], count
                )
            )
        except StoreError as e:
            log.error("could not record an ingest error: %s", e)

    # -- health --------------------------------------------------------------------------------------

    def notes(self) -> list[str]:
        """What this collector does not sample, and why: the host's GPUs when no NVML source runs
        (``--no-nvml``, or what NVML said), and nothing at all when it has no source."""
        out = []
        if not any(isinstance(s, LocalGpuSource) for s in self.sources):
            why = nvml_status() if self.settings.nvml else "--no-nvml"
            out.append(f"this host's GPUs are not sampled: {why}")
        if not self.sources:
            out.append(
                "no sources: nothing is sampled and the store only takes imports (POST /api/v1/import); "
                "give --serving, --dcgm, --engine or --prometheus, or run where NVML sees a GPU"
            )
        return out

    def health(self) -> dict[str, Any]:
        sources = [{**s.health().to_dict(), **s.health_details()} for s in self.sources]
        down = [s["name"] for s in sources if s["status"] in ("down", "degraded")]
        now = time.time()
        for s in sources:
            s["lag_s"] = None if s["last_success_s"] is None else round(now - s["last_success_s"], 3)
        reasons = [f"source {s['name']} is {s['status']}" for s in sources if s["name"] in down]
        if self.stats.results_dropped:
            reasons.append(f"{self.stats.results_dropped} poll results dropped: the writer fell behind")
        failure, held = self.store.write_failure, self.store.held_rows
        if failure is not None:
            paused = " (serving telemetry not read meanwhile)" if self._endpoints else ""
            reasons.insert(0, f"store writes failing: {failure}; {held} rows held{paused}")
        return {
            "status": "degraded" if reasons else "ok",
            "reasons": reasons,
            "notes": self.notes(),
            "node": self.settings.node,
            "db_path": str(self.store.path),
            "schema_version": self._schema_version,
            "uptime_s": round(now - self.started_s, 1),
            "queue_depth": self._queue.qsize(),
            "writer": {
                "rows_written": self.stats.rows_written,
                "duplicates": self.stats.duplicates,
                "results_dropped": self.stats.results_dropped,
                "store_errors": self.stats.store_errors,
                "rows_lost": self.stats.rows_lost,
                "write_failure": failure,
                "held_rows": held,
                "rows_dropped": self.stats.rows_dropped,
                "store_gaps_total": self.stats.store_gaps_total,
                "store_gaps": self.stats.store_gaps,
                "flushes": self.stats.flushes,
                "retention_runs": self.stats.retention_runs,
                "raw_rows_rolled_up": self.stats.raw_rows_rolled_up,
                "last_flush_s": self.stats.last_flush_s,
                "last_error": self.stats.last_error,
                "imports": self.stats.imports,
                "rows_imported": self.stats.rows_imported,
                "last_import_s": self.stats.last_import_s,
            },
            "sources": sources,
        } | {key: job.health() for job, key in self._service_jobs if key is not None}  # type: ignore[attr-defined]


__all__ = ["Collector", "CollectorNotRunning", "CollectorSettings", "ServiceJob", "WriterStats"]
