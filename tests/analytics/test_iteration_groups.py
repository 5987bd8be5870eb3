"""iteration_groups: the window's iterations counted per worker, GPU and hour — from the store's
per-second rollup where it covers them, exactly as from the raw rows."""

from __future__ import annotations

import pandas as pd
import pytest

from analytics.iteration_groups import _SQL, iteration_groups
from analytics.window import Window
from tests.analytics.test_attribution import iteration, make_store

COLUMNS = ["node", "worker", "gpu_uuid", "hour_start_s", "starts_in", "overlaps_window"]


def _raw(con, window: Window) -> pd.DataFrame:
    pred, params = window.node_sql("node")
    s, e = window.start_s, window.end_s
    return con.sql(_SQL.format(node=pred), params=[s, s, *params, e, s, s]).df()


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    df = df.astype({"n": "int64", "lagged": "int64", "negative": "int64"})
    return df.sort_values(COLUMNS, na_position="first").reset_index(drop=True)


@pytest.fixture
def con(tmp_path):
    its = []
    t = 3590.0  # across an hour boundary
    for k in range(80):
        length = (0.07, 0.31, 1.45, 0.5, 12.0)[k % 5]
        its.append(iteration(t, t + length, ("prefill", "decode")[k % 2], lag_s=0.01 * (k % 3)))
        if k % 7 == 0:  # no GPU
            its.append({**iteration(t + 0.1, t + 0.2, "decode"), "gpu_uuid": None})
        if k % 11 == 0:  # ends before it starts
            its.append({**iteration(t + 0.3, t - 2.0, "decode"), "worker": "w1", "gpu_uuid": "GPU-b"})
        t += 0.4
    c = make_store(tmp_path / "groups.duckdb", {"iterations": its})
    yield c
    c.close()


@pytest.mark.parametrize(
    "start_s,end_s",
    [(3580.0, 3700.0), (3593.37, 3610.6), (3600.0, 3605.0), (3595.5, 3596.2), (3615.0, 3700.0)],
)
def test_the_rollup_counts_what_the_raw_rows_count(con, start_s, end_s):
    window = Window(start_s, end_s, "live")
    got, want = _sorted(iteration_groups(con, window).to_pandas()), _sorted(_raw(con, window))
    assert want["n"].sum() > 0
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
