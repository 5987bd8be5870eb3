"""A synthetic fleet's store, written in DuckDB to the store's own schema: 64 GPUs on one node
(``bench``, emulated H100s: 32 aggregated ``mixed`` workers, 16 ``prefill`` and 16 ``decode``),
sampled every 100 ms, one iteration every 50 ms per GPU (alternating prefill/decode on mixed GPUs),
requests with 1–39 output tokens each (their ``tokens``), and the per-second rollup of the iterations
the store's writer keeps (``iteration_seconds``), with values shaped like serving (busy power and SM
activity by phase, a monotonic energy counter). The data is synthetic: it exercises the analytics'
SQL at scale, its figures mean nothing. bench/analytics_data.py builds it at 10 M samples for the
benches; tests build it small (:func:`build`, :func:`t0_ending_now`).
"""

from __future__ import annotations

import time
from pathlib import Path

from collector.store import Store, iteration_seconds

NODE = "bench"  # the node every row of the data carries
GPUS = 64
SAMPLES = 10_000_000
REQUESTS = 1_000_000
PERIOD_S = 0.1
ITER_S = 0.05
T0 = 1_796_000_000.0
VERSION = 4  # bump when the shape of the data changes (bench/analytics_data.py rebuilds its cached file);
# 2: gpu_samples keyed; 3: iteration_seconds; 4: tokens.worker


def role_of(g: str) -> str:
    return f"CASE WHEN {g} < 32 THEN 'mixed' WHEN {g} < 48 THEN 'prefill' ELSE 'decode' END"


def build(path: Path, *, samples: int = SAMPLES, requests: int = REQUESTS, t0: float = T0) -> dict[str, int]:
    """Create the store at ``path`` (replacing it) and return the rows per table: ``samples`` GPU
    samples over the 64 GPUs, ``requests`` requests, starting at ``t0`` (UTC epoch s)."""
    for p in (path, Path(str(path) + ".wal")):
        p.unlink(missing_ok=True)
    per_gpu = samples // GPUS
    span_s = per_gpu * PERIOD_S
    with Store.open(path) as store, store.transaction() as con:
        con.execute(
            f"""
            INSERT INTO devices (node, source, device, "index", since_s, kind, uuid, name, emulated, worker, role)
            SELECT 'bench', 'emulated', 'emulated:h100-sxm', g, {t0}, 'emulated', 'GPU-bench-' || g,
                   'NVIDIA H100 80GB HBM3 (emulated)', TRUE, 'worker-' || g, {role_of("g")}
            FROM range({GPUS}) t(g)
            """
        )
        # Samples: mixed GPUs alternate prefill-like and decode-like seconds; prefill GPUs are busy
        # 60 % of the time at high SM activity; decode GPUs 90 % at low.
        con.execute(  # gpu_samples is stored keyed (collector/store/gpu_keys.py): GPU g has key g
            f"""
            INSERT INTO gpu_keys (gpu_key, node, source, device, "index", emulated)
            SELECT g, 'bench', 'emulated', 'emulated:h100-sxm', g, TRUE FROM range({GPUS}) t(g)
            """
        )
        con.execute(
            f"""
            INSERT INTO gpu_sample_rows (gpu_key, ts_s, gpu_util_pct,
                mem_util_pct, sm_active_pct, sm_occupancy_pct, tensor_active_pct, dram_active_pct,
                power_w, energy_mj, power_limit_w, sm_clock_mhz, mem_clock_mhz, temperature_c,
                mem_used_bytes, mem_total_bytes, clock_event_reasons, lost)
            WITH s AS (
                SELECT g, k, {t0} + (k + 1) * {PERIOD_S} AS ts_s,
                       CASE WHEN g < 32 THEN (k // 10) % 2 = 0 WHEN g < 48 THEN hash(g, k) % 10 < 6
                            ELSE FALSE END AS pre,
                       CASE WHEN g < 32 THEN 0.95 WHEN g < 48 THEN 0.6 ELSE 0.9 END AS busy
                FROM range({GPUS}) a(g), range({per_gpu}) b(k)
            ), p AS (
                SELECT *, CASE WHEN pre THEN 640.0 ELSE 330.0 END * busy + 72.0 * (1 - busy) AS power_w FROM s
            )
            SELECT g, ts_s, 100 * busy, CASE WHEN pre THEN 30 ELSE 70 END,
                   CASE WHEN pre THEN 70 ELSE 18 END * busy, 25, CASE WHEN pre THEN 45 ELSE 5 END,
                   CASE WHEN pre THEN 30 ELSE 75 END, power_w,
                   CAST(floor(1000 * {PERIOD_S} * sum(power_w) OVER (PARTITION BY g ORDER BY k)) AS BIGINT),
                   700, 1980, 2619, 50, 60 * 2^30, 81559 * 2^20, 0, FALSE
            FROM p
            """
        )
        n_iter = int(span_s / ITER_S)
        con.execute(
            f"""
            INSERT INTO iterations (node, source, batch_seq, worker, device, start_s, end_s, phase,
                batch_size, prefill_tokens, decode_seqs, context_tokens, kv_blocks_used, kv_blocks_total,
                preempted, compute_s, pacing_s, gpu_uuid, gpu_index, lag_s, modeled_s)
            WITH i AS (
                SELECT g, j, {t0} + j * {ITER_S} AS start_s,
                       CASE WHEN g < 32 THEN CASE WHEN (j // 20) % 2 = 0 THEN 'prefill' ELSE 'decode' END
                            WHEN g < 48 THEN 'prefill' ELSE 'decode' END AS phase
                FROM range({GPUS}) a(g), range({n_iter}) b(j)
                WHERE g >= 48 OR g < 32 OR hash(g, j) % 10 < 6
            )
            SELECT 'bench', 'worker-' || g, 0, 'worker-' || g, 'emulated:h100-sxm', start_s,
                   start_s + 0.04, phase, CASE WHEN phase = 'prefill' THEN 2 ELSE 32 END,
                   CASE WHEN phase = 'prefill' THEN 2048 ELSE 0 END,
                   CASE WHEN phase = 'prefill' THEN 0 ELSE 32 END, 32 * 1200, 2400, 8000, 0,
                   0.035, 0.0, 'GPU-bench-' || g, g, 0.0, 0.04
            FROM i
            """
        )
        iteration_seconds.add(con, "iterations")  # the rollup the store's writer keeps with its iterations
        con.execute(
            f"""
            INSERT INTO requests (node, source, batch_seq, request_id, arrival_s, first_scheduled_s,
                prefill_start_s, prefill_end_s, first_token_s, finish_s, prompt_tokens, output_tokens,
                prefill_worker, decode_worker, status, finish_reason, attempts, preemptions)
            WITH r AS (
                SELECT n, {t0} + n * ({span_s} / {requests}) AS arrival_s, 1 + n % 39 AS out_tokens,
                       n % 48 AS pw
                FROM range({requests}) t(n)
            )
            SELECT 'bench', 'router', 0, 'req-' || n, arrival_s, arrival_s + 0.01, arrival_s + 0.01,
                   arrival_s + 0.2, arrival_s + 0.2, arrival_s + 0.2 + 0.03 * (out_tokens - 1),
                   200 + n % 1800, out_tokens,
                   'worker-' || pw, 'worker-' || CASE WHEN pw < 32 THEN pw ELSE 48 + pw % 16 END,
                   CASE WHEN n % 500 = 0 THEN 'error' ELSE 'ok' END, 'length', 1, 0
            FROM r
            """
        )
        con.execute(
            """
            INSERT INTO tokens (node, request_id, idx, ts_s, itl_s, worker)
            SELECT 'bench', r.request_id, k, r.first_token_s + 0.03 * k, CASE WHEN k = 0 THEN NULL ELSE 0.03 END,
                   coalesce(r.decode_worker, r.prefill_worker)
            FROM requests r, range(39) t(k)
            WHERE r.node = 'bench' AND k < r.output_tokens
            """
        )
        counts = {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("gpu_samples", "iterations", "requests", "tokens", "devices")
        }
    return counts


def t0_ending_now(samples: int) -> float:
    """The start (UTC epoch s) that makes ``samples`` GPU samples end about now (a live window of the
    last hour sees them)."""
    return time.time() - (samples // GPUS) * PERIOD_S - 1.0
