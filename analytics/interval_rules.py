"""The rules the sample intervals and the grid buckets share (analytics/intervals.py): the gap
threshold, what part of an iteration is GPU-busy, when a request is on a worker, the keyed samples
read, the moments of SM activity. Formulas and sources: docs/analytics/attribution.md.
"""

from __future__ import annotations

import math

from collector.store import iteration_seconds

#: Bucket widths the automatic choice rounds up to (s).
NICE_BUCKETS_S: tuple[float, ...] = (
    1.0,
    2.0,
    5.0,
    10.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1800.0,
    3600.0,
)


#: A GPU's consecutive samples further apart than this many of its mean sampling periods in the
#: window, and at least ``GAP_MIN_S`` apart, leave the time between them unsampled (a collector
#: restart, a lost exporter).
GAP_PERIODS = 5.0
GAP_MIN_S = 5.0


def gap_threshold_sql(first_s: str, last_s: str, samples: str) -> str:
    """SQL of a GPU's gap threshold (s) from its first and last sample time in the window and its
    count of samples there: ``greatest(GAP_MIN_S, GAP_PERIODS × (last − first) / (samples − 1))``
    — the one definition the sample intervals and the buckets share."""
    return f"greatest({GAP_MIN_S!r}, {GAP_PERIODS!r} * (({last_s}) - ({first_s})) / greatest(({samples}) - 1, 1))"


def gap_subcells(bucket_s: float) -> int:
    """How many sub-cells a bucket cell of ``bucket_s`` seconds is cut into to find gaps: cells of at
    most ``GAP_MIN_S`` (two samples of one such cell are closer than any gap, so a gap always lies
    between consecutive non-empty sub-cells, exactly from the last sample of one to the first of
    the next)."""
    return max(1, math.ceil(bucket_s / GAP_MIN_S - 1e-9))


#: At most this many distinct edge seconds become constant filters on the raw iterations read at
#: GPUs' span ends (more: the raw rows are joined to the ends without them).
MAX_EDGE_FILTERS = 64

#: SM activity is shifted by this before its power sums are taken (less cancellation in moments).
SM_SHIFT_PCT = 50.0


def power_sums_sql(x: str, *, aggregate: bool) -> str:
    """``sm_n`` and ``sm_s1``..``sm_s4``: the count and the sums of the 1st–4th powers of
    ``x − SM_SHIFT_PCT`` (over a bucket's samples, or of one sample), from which the moments of SM
    activity over any group of rows follow exactly."""
    v = f"(({x}) - {SM_SHIFT_PCT})"
    if aggregate:
        return f"count({x}) AS sm_n, " + ", ".join(f"sum(pow({v}, {p})) AS sm_s{p}" for p in range(1, 5))
    return f"CASE WHEN ({x}) IS NULL THEN 0 ELSE 1 END AS sm_n, " + ", ".join(
        f"pow({v}, {p}) AS sm_s{p}" for p in range(1, 5)
    )


def iteration_rows_sql(pred: str, simulated: bool) -> str:
    """The window's iterations (parameters: ``pred``'s, then start_s, end_s; ``simulated``: the window
    is a simulated scenario's, whose rows are all simulated) with ``uuid`` (the GPU),
    ``busy_len_s`` (GPU-busy seconds, at the end of the iteration) and ``pshare`` (prefill share of a
    mixed iteration's work). GPU-busy seconds: the simulator's ``compute_s`` (its ``modeled_s −
    compute_s`` is engine host time with the GPU idle, at the start); else the emulated device's
    ``modeled_s`` (the step's wall time beyond it is host time); else the whole step (a measured
    engine: its host time inside a step is not visible)."""
    # trust_label(node, source) = 'simulated', knowing the window's nodes; tested after compute_s
    sim = "TRUE" if simulated else "source = 'simulated'"
    return f"""
    SELECT node, gpu_uuid AS uuid, worker, start_s, end_s, phase, lag_s,
           {iteration_seconds.busy_len_sql(sim)} AS busy_len_s, {iteration_seconds.PSHARE_SQL} AS pshare
    FROM iterations
    WHERE {pred} AND gpu_uuid IS NOT NULL AND end_s > start_s AND end_s > ? AND start_s < ?"""


def request_spans_sql(pred: str) -> str:
    """``(node, worker, a_s, b_s)``: when a request was on a worker (parameters: ``pred``'s twice).
    On its prefill (or only) worker from arrival until it finished, or, handed off to a decode
    worker, until its KV transfer started; on that decode worker from the transfer's end (else its
    first token) until it finished. A request that never finished counts until the last time known
    of it (first token, prefill end, else arrival)."""
    return f"""
    SELECT node, prefill_worker AS worker, arrival_s AS a_s,
           CASE WHEN decode_worker IS NULL OR decode_worker = prefill_worker
                THEN coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
                ELSE coalesce(kv_transfer_start_s, prefill_end_s, first_token_s, finish_s, arrival_s) END AS b_s
    FROM requests WHERE {pred} AND prefill_worker IS NOT NULL
    UNION ALL
    SELECT node, decode_worker, coalesce(kv_transfer_end_s, first_token_s, prefill_end_s, arrival_s),
           coalesce(finish_s, first_token_s, prefill_end_s, arrival_s)
    FROM requests WHERE {pred} AND decode_worker IS NOT NULL
      AND decode_worker IS DISTINCT FROM prefill_worker"""


def keyed_samples_sql(identity_pred: str) -> str:
    """``gpu_samples``' stored rows (``gpu_sample_rows``: ``gpu_key``, ``ts_s``, the metrics;
    collector/store/gpu_keys.py) of the GPUs whose identity (node, source, device, index, emulated)
    meets ``identity_pred``, as ``FROM`` text ending in a ``WHERE`` to add to with ``AND``. Grouping
    these by ``gpu_key`` and joining ``gpu_keys`` to the groups spares joining the identity to
    every sample (what the ``gpu_samples`` view does)."""
    return f"gpu_sample_rows WHERE gpu_key IN (SELECT gpu_key FROM gpu_keys WHERE {identity_pred})"
