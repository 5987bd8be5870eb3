"""Sustained ingest of gpu_samples into the collector store: batched Arrow vs row-by-row INSERT.

Batched: ``Store.append("gpu_samples", <pyarrow.Table>)`` -- the real append path (type checks,
conform, one INSERT ... BY NAME per batch, one transaction each) -- for batches of 10k and 100k
rows, one DuckDB row group (122,880), and 10k appends coalesced by ``buffer_rows``; every run
ends with a CHECKPOINT so the time includes writing the database file. Also the
``append_gpu_samples`` path from ``DeviceSample`` objects (Python objects -> Arrow).
Baseline: a parameterised ``INSERT INTO gpu_samples VALUES (?, ...)`` per row (autocommit), in
the same run, on fewer rows. Reference runs: DuckDB alone inserting the same batches into the
same table (the Store's own overhead), and into the 11-column table of DESIGN.md's figures.
The load average is printed: the figures only compare within one run on a shared machine.

    .venv/bin/python bench/ingest.py               # 2M rows per batched size, 2,000 baseline rows
    .venv/bin/python bench/ingest.py --rows 500000 --baseline-rows 1000 --no-reference
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from collector.store import Store
from serving.devices.base import DeviceSample

DEVICES = 8


def sample_batch(n: int, t0: float, rng: np.random.Generator) -> pa.Table:
    """``n`` synthetic 100 ms samples of 8 H100s (every metric filled), as an Arrow table."""
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
    rows = sample_batch(total, 1.7e9, np.random.default_rng(2)).to_pylist()
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
    data = sample_batch(batch, 1.7e9, np.random.default_rng(3))
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


ROW_GROUP = 122_880  # DuckDB's row-group size: a batch this big is written straight to the file
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
    filled = len(sample_batch(1, 0, np.random.default_rng()).schema)
    print(f"gpu_samples: 30 columns, {filled} filled (6 strings); every run ends with CHECKPOINT")
    rows = args.rows
    line = "{:<56} {:>10,} rows {:>11,.0f} rows/s {:>8}"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        base = bench_row_by_row(tmp_path / "rows.duckdb", args.baseline_rows)
        print(line.format("row-by-row parameterised INSERT (baseline)", args.baseline_rows, base, "1x"))
        cases = [
            ("Store.append, Arrow 10,000 rows/batch", 10_000, 0),
            ("Store.append, Arrow 100,000 rows/batch", 100_000, 0),
            (f"Store.append, Arrow {ROW_GROUP:,} rows/batch (1 row group)", ROW_GROUP, 0),
            (f"Store.append, Arrow 10,000/batch, buffer_rows={ROW_GROUP:,}", 10_000, ROW_GROUP),
        ]
        for label, size, buffer_rows in cases:
            rate = bench_batched(tmp_path / f"arrow{size}-{buffer_rows}.duckdb", rows, size, buffer_rows)
            print(line.format(label, rows, rate, f"{rate / base:,.0f}x"))
        n = min(rows, 200_000)
        rate = bench_device_samples(tmp_path / "samples.duckdb", n, 10_000)
        print(
            line.format(
                "Store.append_gpu_samples, 10,000 DeviceSamples/call", n, rate, f"{rate / base:,.0f}x"
            )
        )
        if args.no_reference:
            return
        n = min(rows, 1_000_000)
        for label, size, columns in (
            ("reference: DuckDB only, same table, 10,000/batch", 10_000, None),
            ("reference: DuckDB only, same table, 100,000/batch", 100_000, None),
            ("reference: DuckDB only, 11-column table, 10,000/batch", 10_000, REFERENCE_11),
            ("reference: DuckDB only, 11-column table, 100,000/batch", 100_000, REFERENCE_11),
        ):
            rate = bench_raw_duckdb(tmp_path / f"raw{size}-{columns is None}.duckdb", n, size, columns)
            print(line.format(label, n, rate, f"{rate / base:,.0f}x"))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average after: {load}")


if __name__ == "__main__":
    main()
