"""Bad iteration rows of a window, and what they mean for phase attribution.

:func:`iteration_issues` counts the iteration rows attribution cannot place whole (no GPU uuid, a GPU
with no samples, more than 1 s outside the GPU's sampled time, ending before they start, overlapping
an earlier one on the same GPU) and the lagged ones; :func:`issue_notes` says in words what each count
means for the result. :func:`analytics.attribution.phase_breakdown` reports both.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from analytics.iteration_groups import registered_groups
from analytics.window import Window


def iteration_issues(
    con: duckdb.DuckDBPyConnection, window: Window, table: str, exact: bool, groups: pa.Table | None = None
) -> dict[str, float]:
    """Counts of bad iteration rows: ones with no GPU uuid, ones of GPUs with no samples, ones more
    than 1 s outside their GPU's sampled time (clock skew between engine and sampler), ones ending
    before they start; overlapping ones on one GPU (counted with a sort on sample intervals, as the
    seconds scaled away on buckets); and ``lagged``, the iterations with ``lag_s > 0``.

    The window's :func:`~analytics.iteration_groups.iteration_groups` (``groups``, else computed
    here: one grouped scan of its iterations), summed per GPU uuid, give all but two: the rows outside
    their GPU's samples are counted row by row only for the GPUs whose earliest end or latest start
    says some are (none, in data without clock skew), and the overlaps (sample intervals only) take
    a sort of the iterations."""
    i_pred, i_par = window.node_sql("i.node")
    w = [window.start_s, window.end_s]
    span = f"SELECT node, uuid, min(t0_s) AS t0, max(t1_s) AS t1 FROM {table} WHERE uuid IS NOT NULL GROUP BY ALL"
    with registered_groups(con, window, groups) as g:
        row = con.execute(
            f"""
WITH per AS (  -- per GPU uuid (NULL: the rows without one) of the iterations overlapping the window
    SELECT node, gpu_uuid, sum(n) AS n, sum(lagged) AS lagged, sum(negative) AS negative,
           min(min_end_s) AS min_end_s, max(max_start_s) AS max_start_s
    FROM {g} WHERE overlaps_window
    GROUP BY node, gpu_uuid
),
span AS ({span})
SELECT coalesce(sum(p.n) FILTER (WHERE p.gpu_uuid IS NULL), 0),
       coalesce(sum(p.negative), 0),
       count(DISTINCT p.gpu_uuid) FILTER (WHERE sp.uuid IS NULL AND p.gpu_uuid IS NOT NULL),
       coalesce(sum(p.n) FILTER (WHERE sp.uuid IS NULL AND p.gpu_uuid IS NOT NULL), 0),
       coalesce(sum(p.lagged), 0),
       count(*) FILTER (WHERE sp.uuid IS NOT NULL AND (p.min_end_s < sp.t0 - 1.0 OR p.max_start_s > sp.t1 + 1.0)),
       (SELECT coalesce(sum(excess_s), 0.0) FROM {table}),
       (SELECT count(*) FILTER (WHERE excess_s > 1e-9) FROM {table})
FROM per p LEFT JOIN span sp ON p.node = sp.node AND p.gpu_uuid = sp.uuid
"""
        ).fetchall()[0]  # every row fetched: the relation is unregistered on this connection next
    no_uuid, negative, unsampled_gpus, unsampled_its, lagged, suspect, excess_s, excess_n = row
    outside = 0
    if suspect:
        outside = con.execute(
            f"""
WITH span AS ({span})
SELECT count(*) FROM iterations i JOIN span sp ON i.node = sp.node AND i.gpu_uuid = sp.uuid
WHERE {i_pred} AND i.end_s > ? AND i.start_s < ? AND (i.end_s < sp.t0 - 1.0 OR i.start_s > sp.t1 + 1.0)""",
            [*i_par, *w],
        ).fetchone()[0]
    overlapping = 0
    if exact:
        overlapping = con.execute(
            f"""
SELECT count(*) FROM (
    SELECT i.gpu_uuid, i.start_s,
           max(i.end_s) OVER (PARTITION BY i.node, i.gpu_uuid ORDER BY i.start_s, i.end_s
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_s
    FROM iterations i WHERE {i_pred} AND i.end_s > ? AND i.start_s < ?)
WHERE prev_end_s > start_s + 1e-9 AND gpu_uuid IS NOT NULL""",
            [*i_par, *w],
        ).fetchone()[0]
    return {
        "overlapping": overlapping or 0,
        "no_uuid": no_uuid or 0,
        "outside_samples": outside or 0,
        "negative": negative or 0,
        "unsampled_gpus": unsampled_gpus or 0,
        "unsampled_iterations": unsampled_its or 0,
        "excess_s": excess_s or 0,
        "excess_buckets": excess_n or 0,
        "lagged": lagged or 0,
    }


def issue_notes(issues: dict[str, int]) -> list[str]:
    """What the bad iteration rows counted by :func:`iteration_issues` mean for the result."""
    notes: list[str] = []
    if issues["overlapping"]:
        notes.append(
            f"{issues['overlapping']} iterations overlap an earlier one on the same GPU: clipped to "
            "the time after it (each GPU second counted once)"
        )
    if issues["excess_s"] > 1e-9:
        notes.append(
            f"{issues['excess_s']:.3f} s of iteration time beyond their bucket's sampled time in "
            f"{issues['excess_buckets']} buckets (overlapping iterations or clock skew): scaled away, "
            "each GPU second counted once"
        )
    if issues["no_uuid"]:
        notes.append(f"{issues['no_uuid']} iterations carry no gpu_uuid: not attributed to any GPU")
    if issues["unsampled_gpus"]:
        notes.append(
            f"{issues['unsampled_gpus']} GPU uuid(s) ran {issues['unsampled_iterations']} iterations in the "
            "window but have no samples in it: their time and energy are not in any interval"
        )
    if issues["negative"]:
        notes.append(f"{issues['negative']} iterations end before they start: ignored")
    if issues["outside_samples"]:
        notes.append(
            f"{issues['outside_samples']} iterations lie more than 1 s outside their GPU's samples "
            "(clock skew between engine and sampler?): they fall in no interval"
        )
    return notes
