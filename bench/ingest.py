"""Sustained ingest into the collector store, through the path the collector really takes.

**The collector's path** (the headline figures): rows produced the way the sources produce them --
``SourceResult`` objects, built by the sources' own code from what their endpoints return -- handed
to a real :class:`~collector.service.Collector` exactly as its poller threads do (``_put`` into its
bounded queue) and written by the writer thread's own ``_drain`` (one append per source and table
per drain, into a store opened as ``phaselens collect`` opens it: ``WRITER_BUFFER_ROWS``), at most a
full queue (``max_queue`` results) per drain, drains back to back (a writer catching up: it
commits once per flush interval, the store writes its buffer when full, on its background flush
thread while the writer converts the next drain); ends with CHECKPOINT. ``--stages`` adds, for the
8-GPU polls as columns, where the writer's time went (building Arrow columns, waiting for the
flush in flight, the rest) and how long the background flushes took.
Cases (their rows: bench/ingest_rows.py):

* ``gpu_samples`` from ``GET /v1/devices``: ``add_device_columns`` (what ``ServingDevicesSource``
  does with the decoded JSON body), 8 GPUs per poll, columns per poll, the GPUs' identity columns
  shared across polls (``RepeatedColumns``, as the source holds one);
* the same polls as lists of dicts (what the sources produced before: the row-by-row pivot);
* ``gpu_samples`` from dcgm-exporter: a real ``DcgmSource`` scraping an 8-GPU page (the tests' L4
  page, its series repeated per GPU) over an in-process HTTP transport; the same rows as dicts;
* serving telemetry: batches as ``GET /v1/telemetry`` returns them (decoded JSON; 512 events each:
  worker batches of iteration events, router batches of request events with 128 token times each,
  4 worker batches per router batch ~ decode batch 32), one poll = what one GET returns, split by
  the store into iterations, requests, tokens, control_events and telemetry_batches rows.

The time the sources take to build their results (poller threads, beside the writer in the
service, sharing its GIL) is printed apart, and beside each collector figure as CPU per row: the
collector path's CPU, the sources' CPU for the same rows (``/v1/devices`` polls: transposing,
sharing the identity, packing the metrics as float64) and their sum, the CPU a row costs the
process in all; decoding JSON off the socket is not in either figure.

**References**: ``Store.append`` of pre-built Arrow tables (10,000 rows each, the collector's buffer)
and DuckDB alone inserting the same Arrow batches into the table the store writes
(``gpu_sample_rows``: one INTEGER ``gpu_key`` per GPU in place of node, source, device, index and
emulated) and into one wide table of ``gpu_samples``' columns (its shape before it was stored
keyed) -- what DuckDB takes, not what the collector receives; **baseline**: one parameterised
``INSERT`` per row into that wide table (autocommit), on fewer rows, same run.
The load average is printed, and beside each figure the CPU this process used per row (user +
system, all its threads: load-independent where wall time is not) and the CPU other processes used
meanwhile (cores; Linux): the figures only compare within one run on a shared machine.

    .venv/bin/python bench/ingest.py               # 1M rows per case, 2,000 baseline rows
    .venv/bin/python bench/ingest.py --rows 300000 --baseline-rows 1000 --no-reference --no-dcgm
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import numpy as np
import pyarrow as pa

import collector
from collector.service import Collector, CollectorSettings
from collector.sources.base import SourceResult
from collector.store import WRITER_BUFFER_ROWS, Store, gpu_keys
from collector.store.devices import SPLIT_COLUMNS

# bench/ingest_rows.py: the rows, built as the sources build them
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest_rows import (
    DEVICES,
    columns_results,
    dcgm_results,
    device_polls,
    dict_results,
    sample_batch,
    telemetry_results,
)

DATA_TABLES = ("gpu_samples", "telemetry_batches", "iterations", "requests", "tokens", "control_events")


class StagedStore(Store):
    """The store with stage timers (``--stages``): seconds the writer spent building Arrow columns
    and waiting for the background flush in flight, and the flushes' own seconds (background and
    on the writer's thread). Timing hooks only: the store's code runs unchanged."""

    stages: ClassVar[dict[str, float]] = {}

    def _columns_table(self, *args: Any, **kwargs: Any) -> pa.Table:
        t = time.perf_counter()
        try:
            return super()._columns_table(*args, **kwargs)
        finally:
            self._add("writer: build Arrow columns", t)

    def _settle(self) -> None:
        waiting = self._flight is not None
        t = time.perf_counter()
        super()._settle()
        if waiting:
            self._add("writer: wait for the flush in flight", t)

    def _write_pending(self, *args: Any) -> None:
        t = time.perf_counter()
        try:
            super()._write_pending(*args)
        finally:
            on_writer = threading.current_thread() is threading.main_thread()
            self._add("flush on the writer's thread" if on_writer else "background flushes", t)

    @classmethod
    def _add(cls, stage: str, t: float) -> None:
        cls.stages[stage] = cls.stages.get(stage, 0.0) + time.perf_counter() - t


def bench_collector(
    path: Path, results: list[SourceResult], rounds: int, store_cls: type[Store] = Store
) -> tuple[float, dict[str, int]]:
    """Rows/s of ``results`` (fed ``rounds`` times) through a real Collector's queue and writer
    drain into a store opened as ``phaselens collect`` opens it; CHECKPOINT included. The rows are
    those stored (counted in the file afterwards), per table."""
    settings = CollectorSettings(db_path=str(path), node="node-a", nvml=False)
    with store_cls.open(path, buffer_rows=WRITER_BUFFER_ROWS) as store:
        collector = Collector(settings, store, sources=[])
        t = time.perf_counter()
        queued = 0
        for _ in range(rounds):
            for res in results:
                collector._put(res)
                queued += 1
                if queued == settings.max_queue:  # a full queue: what one flush holds at most
                    collector._drain()
                    queued = 0
        collector._drain()
        store.checkpoint()
        elapsed = time.perf_counter() - t
        if collector.stats.store_errors or collector.stats.results_dropped:
            raise SystemExit(f"writer errors: {collector.stats.last_error}")
        stored = {t: int(store.query(f"SELECT count(*) AS n FROM {t}")["n"][0]) for t in DATA_TABLES}
    stored = {t: n for t, n in stored.items() if n}
    return sum(stored.values()) / elapsed, stored


def timed_build(fn: Callable[[], list[SourceResult]]) -> tuple[list[SourceResult], float, float]:
    """The results ``fn`` builds and the sources' cost per row: wall and CPU seconds (this process;
    nothing else of it runs meanwhile). The inputs prepared so far are frozen out of the garbage
    collector first: a source builds one poll, not a heap of them."""
    gc.freeze()
    t, c = time.perf_counter(), time.process_time()
    results = fn()
    rows = max(1, sum(r.n_rows for r in results))
    return results, (time.perf_counter() - t) / rows, (time.process_time() - c) / rows


def bench_batched(path: Path, total: int, batch: int, buffer_rows: int = 0) -> float:
    """Rows/s appending ``total`` rows in Arrow batches of ``batch`` rows, checkpoint included."""
    rng = np.random.default_rng(0)
    batches = [
        sample_batch(batch, 1.7e9 + k * batch / DEVICES * 0.1, rng) for k in range(min(4, total // batch))
    ]
    with Store.open(path, buffer_rows=buffer_rows) as store:
        t = time.perf_counter()
        done = 0
        k = 0
        while done < total:
            done += store.append("gpu_samples", batches[k % len(batches)])
            k += 1
        store.checkpoint()
        elapsed = time.perf_counter() - t
        stored = int(store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0])
    if stored != done:
        raise SystemExit(f"stored {stored} rows, appended {done}")
    return done / elapsed


def bench_row_by_row(path: Path, total: int) -> float:
    """Rows/s of one parameterised INSERT per row (autocommit), the naive baseline."""
    with Store.open(path):
        pass  # create the schema
    rows = _narrow(sample_batch(total, 1.7e9, np.random.default_rng(2))).to_pylist()
    cols = list(rows[0])
    names = ", ".join(f'"{c}"' for c in cols)
    sql = f"INSERT INTO wide ({names}) VALUES ({', '.join('?' * len(cols))})"
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE wide AS SELECT * FROM gpu_samples LIMIT 0")  # its columns, one table
        t = time.perf_counter()
        for r in rows:
            con.execute(sql, list(r.values()))
        con.execute("CHECKPOINT")
        return total / (time.perf_counter() - t)
    finally:
        con.close()


def bench_raw_duckdb(
    path: Path, total: int, batch: int, columns: list[str] | None = None, *, device_key: bool = False
) -> float:
    """Reference: DuckDB alone (no Store) inserting the same Arrow batches, checkpoint included.

    ``columns`` narrows the table (the 11-column table of DESIGN.md's "Facts measured on these
    machines": ts_s, device and nine metrics). Else the table is ``gpu_samples``' columns as one
    table (its shape before it was stored keyed: node, source, device, index and emulated on every
    row), or with ``device_key`` the table the store writes, ``gpu_sample_rows`` (one INTEGER
    ``gpu_key`` in place of those five; collector/store/gpu_keys.py).
    """
    data = _narrow(sample_batch(batch, 1.7e9, np.random.default_rng(3)))
    if columns is None:
        with Store.open(path) as store:  # the store's own table and types
            data = store._to_arrow("gpu_samples", data)
        table = "wide"
        if device_key:
            key = pa.array(np.arange(batch, dtype=np.int32) % DEVICES)
            data = data.drop_columns(list(gpu_keys.IDENTITY)).add_column(0, gpu_keys.KEY_COLUMN, key)
            table = gpu_keys.ROWS_TABLE
    else:
        data = data.select(columns)
        table = "reference"
    con = duckdb.connect(str(path))
    try:
        con.register("batch", data)
        if table != gpu_keys.ROWS_TABLE:
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM batch LIMIT 0")
        t = time.perf_counter()
        done = 0
        while done < total:
            con.execute(f"INSERT INTO {table} SELECT * FROM batch")
            done += batch
        con.execute("CHECKPOINT")
        return done / (time.perf_counter() - t)
    finally:
        con.close()


def _narrow(data: pa.Table) -> pa.Table:
    """The sample columns only (what gpu_samples stores)."""
    return data.drop_columns([c for c in SPLIT_COLUMNS if c in data.column_names])


def _busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait


def timed_with_others(fn: Callable[[], float]) -> tuple[float, float | None, float]:
    """``fn()``, the CPU (cores) that other processes used while it ran (None off Linux), and the
    CPU seconds (user + system, all threads) this process used for it."""
    b0, r0, t0 = _busy_jiffies(), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    value = fn()
    b1, r1, t1 = _busy_jiffies(), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    own_cpu_s = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    if b0 is None or b1 is None:
        return value, None, own_cpu_s
    return value, max(0.0, (b1 - b0) / os.sysconf("SC_CLK_TCK") - own_cpu_s) / (t1 - t0), own_cpu_s


def as_dicts(results: list[SourceResult]) -> list[SourceResult]:
    """The same poll results with their rows as lists of dicts (what the sources produced before)."""
    out = []
    for r in results:
        res = SourceResult(r.source, r.ts_s)
        for table in {*r.rows, *r.columns}:
            res.add_rows(table, r.table_rows(table))
        out.append(res)
    return out


TARGET_ROWS_S = 1_000_000


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; print rows/s of each path, its ratio to the row-by-row INSERT measured in
    the same run, and whether a collector path reaches the 1 M rows/s target."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per case")
    ap.add_argument("--baseline-rows", type=int, default=2_000, help="rows for the row-by-row baseline")
    ap.add_argument("--no-reference", action="store_true", help="skip the DuckDB-only reference runs")
    ap.add_argument("--no-dcgm", action="store_true", help="skip the dcgm-exporter cases (slow to prepare)")
    ap.add_argument(
        "--runs", type=int, default=3, help="runs of the 8-GPU polls as columns (each printed; default 3)"
    )
    ap.add_argument(
        "--stages", action="store_true", help="time the stages of the 8-GPU polls as columns (one more run)"
    )
    args = ap.parse_args(argv)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} CPUs, load average {load}; "
        f"collector code from {Path(collector.__file__).resolve().parents[1]}"
    )
    rows = args.rows
    line = "{:<78} {:>9,} rows {:>10,.0f} rows/s {:>7} {:>6}  {}"
    base = 1.0

    def run(
        label: str, n: int, fn: Callable[[], float], target: bool = True, source_cpu_s: float | None = None
    ) -> float:
        """``source_cpu_s``: the sources' CPU per row for these rows, printed beside with the sum."""
        rate, others, cpu_s = timed_with_others(fn)
        busy = f"cpu {cpu_s / n * 1e6:.2f} us/row"
        if source_cpu_s is not None:
            busy += f" + sources {source_cpu_s * 1e6:.2f} = {(cpu_s / n + source_cpu_s) * 1e6:.2f}"
        busy += "" if others is None else f", others {others:.2f}"
        ratio = f"{rate / base:,.0f}x" if base != 1.0 else "1x"
        met = ("≥1M" if rate >= TARGET_ROWS_S else "<1M") if target else ""
        print(line.format(label, n, rate, ratio, met, busy))
        return rate

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        base = run(
            "baseline: row-by-row parameterised INSERT, gpu_samples columns as one table, autocommit",
            args.baseline_rows,
            lambda: bench_row_by_row(tmp_path / "rows.duckdb", args.baseline_rows),
            target=False,
        )
        max_queue = CollectorSettings().max_queue
        print(
            "the collector's path: SourceResults as the sources build them -> Collector._put -> "
            f"writer _drain of <= {max_queue:,} results -> store (CHECKPOINT included)"
        )
        polls = device_polls(max_queue)  # one full queue of 8-GPU polls, fed again and again
        cols, cols_cost, cols_cpu = timed_build(lambda: columns_results(polls))
        dicts, dicts_cost, dicts_cpu = timed_build(lambda: dict_results(polls))
        written: dict[str, int] = {}

        def collector_case(name: str, results: list[SourceResult], rounds: int) -> Callable[[], float]:
            def go() -> float:
                rate, stored = bench_collector(tmp_path / f"{name}.duckdb", results, rounds)
                written.clear()
                written.update(stored)
                return rate

            return go

        gc.freeze()  # the prepared inputs are not the collector's garbage to scan
        rounds = max(1, rows // (max_queue * DEVICES))
        n = rounds * max_queue * DEVICES
        # the first run of a process is the slowest (its memory still to be mapped): a collector that has
        # run a while is the later runs; each is printed, then the best and the median
        rates = [
            run(
                f"  gpu_samples: 8-GPU polls of GET /v1/devices as columns, identity shared, run {i + 1}/{args.runs}",
                n,
                collector_case(f"cols-{i}", cols, rounds),  # a fresh file each run
                source_cpu_s=cols_cpu,
            )
            for i in range(args.runs)
        ]
        if args.runs > 1:
            best, median = max(rates), float(np.median(rates))
            print(
                f"    best {best:,.0f} rows/s ({'≥1M' if best >= TARGET_ROWS_S else '<1M'}), "
                f"median {median:,.0f} rows/s over {args.runs} runs"
            )
        if args.stages:
            StagedStore.stages.clear()
            t = time.perf_counter()
            bench_collector(tmp_path / "stages.duckdb", cols, rounds, StagedStore)
            wall = time.perf_counter() - t
            stages = ", ".join(f"{k} {v:.2f} s" for k, v in StagedStore.stages.items())
            print(f"    stages of one more such run ({wall:.2f} s in all): {stages}")
        run(
            "  gpu_samples: the same 8-GPU polls as lists of dicts (the source before)",
            n,
            collector_case("dicts", dicts, rounds),
            source_cpu_s=dicts_cpu,
        )
        costs = [
            f"/v1/devices polls as columns {cols_cost * 1e6:.2f} us/row (cpu {cols_cpu * 1e6:.2f}), "
            f"as dicts {dicts_cost * 1e6:.2f} (cpu {dicts_cpu * 1e6:.2f})"
        ]
        if not args.no_dcgm:
            scrapes = 500
            dcgm, dcgm_cost, dcgm_cpu = timed_build(lambda: dcgm_results(scrapes))
            dcgm_dicts = as_dicts(dcgm)
            gc.freeze()
            dcgm_rounds = max(1, rows // (scrapes * DEVICES))
            run(
                "  gpu_samples: dcgm-exporter scrapes of an 8-GPU page, real DcgmSource, columns",
                dcgm_rounds * scrapes * DEVICES,
                collector_case("dcgm", dcgm, dcgm_rounds),
                source_cpu_s=dcgm_cpu,
            )
            run(
                "  gpu_samples: the same dcgm-exporter scrapes as lists of dicts (before)",
                dcgm_rounds * scrapes * DEVICES,
                collector_case("dcgm-dicts", dcgm_dicts, dcgm_rounds),
            )
            costs.append(f"dcgm-exporter scrapes (fetch, parse, map) {dcgm_cost * 1e6:.0f} us/row")
        groups = max(1, rows // 68_000)
        tele, tele_rows = telemetry_results(groups)
        gc.freeze()
        run(
            "  telemetry: GET /v1/telemetry polls of 512-event batches, all tables",
            tele_rows,
            collector_case("tele", tele, 1),
        )
        if sum(written.values()) != tele_rows:
            raise SystemExit(f"telemetry: stored {written}, expected {tele_rows:,} rows")
        print("    telemetry rows stored: " + ", ".join(f"{k} {v:,}" for k, v in written.items()))
        print("  the sources' own cost (their poller threads, beside the writer): " + "; ".join(costs))
        print("reference: pre-built Arrow tables (what DuckDB takes, not what the collector receives)")
        run(
            f"  Store.append of pre-built Arrow, 10,000/batch, collector buffer {WRITER_BUFFER_ROWS:,}",
            rows,
            lambda: bench_batched(tmp_path / "arrow.duckdb", rows, 10_000, WRITER_BUFFER_ROWS),
            target=False,
        )
        if not args.no_reference:
            run(
                f"  DuckDB alone, the store's table gpu_sample_rows (INTEGER gpu_key), {WRITER_BUFFER_ROWS:,}/batch",
                rows,
                lambda: bench_raw_duckdb(
                    tmp_path / "keyed.duckdb", rows, WRITER_BUFFER_ROWS, device_key=True
                ),
                target=False,
            )
            run(
                f"  DuckDB alone, same rows as one wide table (identity on every row), {WRITER_BUFFER_ROWS:,}/batch",
                rows,
                lambda: bench_raw_duckdb(tmp_path / "raw.duckdb", rows, WRITER_BUFFER_ROWS),
                target=False,
            )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
