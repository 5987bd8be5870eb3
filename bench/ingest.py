"""Sustained ingest of gpu_samples into the collector store: batched Arrow vs row-by-row INSERT.

Batched: ``Store.append("gpu_samples", <pyarrow.Table>)`` -- the real append path (type checks,
conform, the device attributes split off into ``devices`` rows when they change, one INSERT ...
BY NAME per table and batch, one transaction each) -- for batches of 10k and 100k
rows, one DuckDB row group (122,880), and 10k appends coalesced by ``buffer_rows`` -- one row
group, and the collector's own write buffer (``WRITER_BUFFER_ROWS``, 4 row groups: what each flush
holds when a stream arrives faster than that per flush interval); every run
ends with a CHECKPOINT so the time includes writing the database file. Also the
``append_gpu_samples`` path from ``DeviceSample`` objects (Python objects -> Arrow).
The input is "wide", as the sources produce it: the sample columns plus kind, uuid and name on
every row. Baseline: a parameterised ``INSERT INTO gpu_samples VALUES (?, ...)`` per row
(autocommit; the table's columns only), in the same run, on fewer rows. Reference runs: DuckDB
alone inserting the same batches into the same table (the Store's own overhead, device split
included), and into the 11-column table of DESIGN.md's figures.
The load average is printed, and beside each figure the CPU other processes used meanwhile
(cores; Linux): the figures only compare within one run on a shared machine.

    .venv/bin/python bench/ingest.py               # 2M rows per batched size, 2,000 baseline rows
    .venv/bin/python bench/ingest.py --rows 500000 --baseline-rows 1000 --no-reference
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from collector.store import ROW_GROUP_ROWS, WRITER_BUFFER_ROWS, Store
from collector.store.devices import SPLIT_COLUMNS
from serving.devices.base import DeviceSample

DEVICES = 8


def sample_batch(n: int, t0: float, rng: np.random.Generator) -> pa.Table:
    """``n`` synthetic 100 ms samples of 8 H100s (every metric filled, with the device attributes
    kind/uuid/name as a source delivers them), as an Arrow table."""
    i = np.arange(n)
    dev = i % DEVICES
    # What NVML reports: integer % for utilization, integer deg C, power in mW, clocks in MHz;
    # GPM activity metrics are full-precision doubles.
    return pa.table(
        {
            "node": pa.array(["node-a"] * n),
            "source": pa.array(["nvml"] * n),
            "ts_s": t0 + (i // DEVICES) * 0.1,
            "device": pa.array([f"cuda:{d}" for d in dev]),
            "kind": pa.array(["cuda"] * n),
            "index": dev.astype(np.int32),
            "uuid": pa.array([f"GPU-{d:04d}" for d in dev]),
            "name": pa.array(["NVIDIA H100 80GB HBM3"] * n),
            "emulated": np.zeros(n, dtype=bool),
            "gpu_util_pct": rng.integers(0, 101, n).astype(np.float64),
            "mem_util_pct": rng.integers(0, 101, n).astype(np.float64),
            "sm_active_pct": rng.uniform(0, 100, n),
            "sm_occupancy_pct": rng.uniform(0, 100, n),
            "tensor_active_pct": rng.uniform(0, 100, n),
            "dram_active_pct": rng.uniform(0, 100, n),
            "power_w": rng.integers(70_000, 700_000, n) / 1000.0,
            "energy_mj": (i * 50).astype(np.int64),
            "power_limit_w": np.full(n, 700.0),
            "sm_clock_mhz": rng.integers(345, 1980, n, dtype=np.int32),
            "mem_clock_mhz": np.full(n, 2619, dtype=np.int32),
            "temperature_c": rng.integers(30, 80, n).astype(np.float64),
            "mem_used_bytes": rng.integers(0, 80 << 30, n, dtype=np.int64),
            "mem_total_bytes": np.full(n, 80 << 30, dtype=np.int64),
            "clock_event_reasons": np.zeros(n, dtype=np.uint64),
            "lost": np.zeros(n, dtype=bool),
        }
    )


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


def bench_device_samples(path: Path, total: int, batch: int) -> float:
    """Rows/s through ``append_gpu_samples`` from DeviceSample objects (includes object -> Arrow)."""
    rows = sample_batch(batch, 1.7e9, np.random.default_rng(1)).drop_columns(["node", "source"]).to_pylist()
    samples = [DeviceSample(**r) for r in rows]
    with Store.open(path) as store:
        t = time.perf_counter()
        done = 0
        while done < total:
            done += store.append_gpu_samples(samples, "node-a", "nvml")
        store.checkpoint()
        return done / (time.perf_counter() - t)


def bench_row_by_row(path: Path, total: int) -> float:
    """Rows/s of one parameterised INSERT per row (autocommit), the naive baseline."""
    with Store.open(path):
        pass  # create the schema
    rows = _narrow(sample_batch(total, 1.7e9, np.random.default_rng(2))).to_pylist()
    cols = list(rows[0])
    names = ", ".join(f'"{c}"' for c in cols)
    sql = f"INSERT INTO gpu_samples ({names}) VALUES ({', '.join('?' * len(cols))})"
    con = duckdb.connect(str(path))
    try:
        t = time.perf_counter()
        for r in rows:
            con.execute(sql, list(r.values()))
        con.execute("CHECKPOINT")
        return total / (time.perf_counter() - t)
    finally:
        con.close()


def bench_raw_duckdb(path: Path, total: int, batch: int, columns: list[str] | None = None) -> float:
    """Reference: DuckDB alone (no Store) inserting the same Arrow batches, checkpoint included.

    ``columns`` narrows the table; with the 11 columns of ``REFERENCE_11`` this is the table the
    figures in DESIGN.md ("Facts measured on these machines") were taken on.
    """
    data = _narrow(sample_batch(batch, 1.7e9, np.random.default_rng(3)))
    if columns is None:
        with Store.open(path) as store:  # the store's own table and types
            data = store._to_arrow("gpu_samples", data)
        table = "gpu_samples"
    else:
        data = data.select(columns)
        table = "reference"
    con = duckdb.connect(str(path))
    try:
        con.register("batch", data)
        if columns is not None:
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


ROW_GROUP = ROW_GROUP_ROWS
REFERENCE_11 = [
    "ts_s",
    "device",
    "gpu_util_pct",
    "mem_util_pct",
    "sm_active_pct",
    "power_w",
    "energy_mj",
    "power_limit_w",
    "sm_clock_mhz",
    "temperature_c",
    "mem_used_bytes",
]


def _busy_jiffies() -> int | None:
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait


def timed_with_others(fn: Callable[[], float]) -> tuple[float, float | None]:
    """``fn()`` and the CPU (cores) that other processes used while it ran (None off Linux)."""
    b0, r0, t0 = _busy_jiffies(), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    value = fn()
    b1, r1, t1 = _busy_jiffies(), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    if b0 is None or b1 is None:
        return value, None
    own = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return value, max(0.0, (b1 - b0) / os.sysconf("SC_CLK_TCK") - own) / (t1 - t0)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print rows/s of each path and the ratio to row-by-row INSERT."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows per batched run")
    ap.add_argument("--baseline-rows", type=int, default=2_000, help="rows for the row-by-row baseline")
    ap.add_argument("--no-reference", action="store_true", help="skip the DuckDB-only reference runs")
    args = ap.parse_args(argv)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"duckdb {duckdb.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} CPUs, load average {load}"
    )
    schema = sample_batch(1, 0, np.random.default_rng()).schema
    strings = sum(pa.types.is_string(f.type) for f in schema)
    rows = args.rows
    line = "{:<56} {:>10,} rows {:>11,.0f} rows/s {:>8} {:>14}"

    def run(label: str, n: int, fn: Callable[[], float]) -> float:
        rate, others = timed_with_others(fn)
        busy = "" if others is None else f"others {others:.2f}"
        print(line.format(label, n, rate, f"{rate / base:,.0f}x" if label[:3] != "row" else "1x", busy))
        return rate

    base = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        with Store.open(tmp_path / "schema.duckdb") as store:
            table_cols, device_cols = len(store.columns("gpu_samples")), len(store.columns("devices"))
        print(
            f"input: {len(schema)} columns ({strings} strings); gpu_samples: {table_cols} columns, "
            f"{len(_narrow(sample_batch(1, 0, np.random.default_rng())).schema)} filled; devices "
            f"({device_cols} columns) gets a row when a GPU's attributes change; every run ends with CHECKPOINT"
        )
        base = run(
            "row-by-row parameterised INSERT (baseline)",
            args.baseline_rows,
            lambda: bench_row_by_row(tmp_path / "rows.duckdb", args.baseline_rows),
        )
        cases = [
            ("Store.append, Arrow 10,000 rows/batch", 10_000, 0),
            ("Store.append, Arrow 100,000 rows/batch", 100_000, 0),
            (f"Store.append, Arrow {ROW_GROUP:,} rows/batch (1 row group)", ROW_GROUP, 0),
            (f"Store.append, Arrow 10,000/batch, buffer_rows={ROW_GROUP:,}", 10_000, ROW_GROUP),
            (
                f"Store.append, 10,000/batch, collector buffer {WRITER_BUFFER_ROWS:,}",
                10_000,
                WRITER_BUFFER_ROWS,
            ),
        ]
        for label, size, buffer_rows in cases:
            path = tmp_path / f"arrow{size}-{buffer_rows}.duckdb"
            run(label, rows, lambda p=path, s=size, b=buffer_rows: bench_batched(p, rows, s, b))
        n = min(rows, 200_000)
        run(
            "Store.append_gpu_samples, 10,000 DeviceSamples/call",
            n,
            lambda: bench_device_samples(tmp_path / "samples.duckdb", n, 10_000),
        )
        if args.no_reference:
            return
        n = min(rows, 1_000_000)
        for label, size, columns in (
            ("reference: DuckDB only, same table, 10,000/batch", 10_000, None),
            ("reference: DuckDB only, same table, 100,000/batch", 100_000, None),
            (f"reference: DuckDB only, same table, {ROW_GROUP:,}/batch", ROW_GROUP, None),
            ("reference: DuckDB only, 11-column table, 10,000/batch", 10_000, REFERENCE_11),
            ("reference: DuckDB only, 11-column table, 100,000/batch", 100_000, REFERENCE_11),
        ):
            path = tmp_path / f"raw{size}-{columns is None}.duckdb"
            run(label, n, lambda p=path, s=size, c=columns: bench_raw_duckdb(p, n, s, c))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
