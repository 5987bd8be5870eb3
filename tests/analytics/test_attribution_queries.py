"""analytics/attribution_queries.py: the aggregate statement run on its own, on a hand-made interval
table in a real DuckDB with the power fits and the MFU / MBU rates it joins; every sum computed by hand.

GPU ``cuda:0`` (attributed, role decode), two 1 s intervals in hour 0:
* t0 0: 0.5 s prefill + 0.5 s idle, 200 J; fits 300 / 200 / 100 W (prefill / decode / idle) weigh
  it 150 : 50, so 150 J prefill, 50 J idle; no MBU rate, so prefill is split by DRAM activity:
  40 % of the interval over 0.5 s busy = 0.8 → 0.1 s (30 J) stranded bandwidth.
* t0 1: 0.8 s decode + 0.2 s gap (host-bound), 180 J → 160 J decode, 20 J gap; MFU 0.25 →
  0.6 s (120 J) stranded compute.
GPU ``cuda:1`` (no serving telemetry: not attributed), one 1 s interval of 100 J.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from analytics.attribution_queries import STATES, aggregate_sql, split_periods

COLUMNS = (
    'node VARCHAR, source VARCHAR, device VARCHAR, "index" INTEGER, uuid VARCHAR, name VARCHAR, '
    "role VARCHAR, worker VARCHAR, hour_s DOUBLE, t0_s DOUBLE, interval_s DOUBLE, attributed BOOLEAN, "
    + ", ".join(f"{s} DOUBLE" for s in STATES)
    + ", energy_j DOUBLE, energy_unsampled_j DOUBLE, energy_source VARCHAR, sm_active_pct DOUBLE, "
    "dram_active_pct DOUBLE, gpu_util_pct DOUBLE, sm_source VARCHAR, trust VARCHAR, host_bound BOOLEAN"
)


def _row(device: str, index: int, uuid: str, t0_s: float, attributed: bool, energy_j: float, **states: float):
    role = "decode" if attributed else None
    seconds = [states.get(s, 0.0) if attributed or s == "unsampled_s" else None for s in STATES]
    gpu = ["n", "nvml", device, index, uuid, "H100", role, "w0" if attributed else None]
    return [
        *gpu,
        0.0,
        t0_s,
        1.0,
        attributed,
        *seconds,
        energy_j,
        0.0,
        "counter",
        50.0,
        40.0,
        90.0,
        "sm_active",
        "measured",
        False,
    ]


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE iv ({COLUMNS})")
    marks = ", ".join("?" * (12 + len(STATES) + 9))
    con.executemany(
        f"INSERT INTO iv VALUES ({marks})",
        [
            _row("cuda:0", 0, "GPU-a", 0.0, True, 200.0, prefill_s=0.5, idle_s=0.5),
            _row("cuda:0", 0, "GPU-a", 1.0, True, 180.0, decode_s=0.8, gap_s=0.2),
            _row("cuda:1", 1, "GPU-b", 0.0, False, 100.0),
        ],
    )
    key = {"node": ["n"], "source": ["nvml"], "device": ["cuda:0"], "index": pa.array([0], pa.int64())}
    con.register("pl_coef", pa.table({**key, "w_prefill": [300.0], "w_decode": [200.0], "w_idle": [100.0]}))
    rates = {"mfu_decode": [0.25], "mbu_prefill": [None], "mfu_mixed": [None], "mbu_mixed": [None]}
    rates = {k: pa.array(v, pa.float64()) for k, v in rates.items()}
    con.register("pl_rates_hour", pa.table({"node": ["n"], "uuid": ["GPU-a"], "hour_s": [0.0], **rates}))
    con.register("pl_rates_gpu", pa.table({"node": ["n"], "uuid": ["GPU-a"], **rates}))
    yield con
    con.close()


def _gpu(df: pd.DataFrame, device: str) -> dict:
    rows = df[df["device"] == device].to_dict(orient="records")
    assert len(rows) == 1
    return rows[0]


def test_states_energies_and_categories_are_summed_per_gpu_role_and_hour(con) -> None:
    raw, by_period = split_periods(con.execute(aggregate_sql("iv")).df())
    assert by_period is None and len(raw) == 2
    a = _gpu(raw, "cuda:0")
    expected = {
        "role": "decode",
        "intervals": 2,
        "interval_s": 2.0,
        "attributed_s": 2.0,
        "unattributed_s": 0.0,
        "prefill_s": 0.5,
        "decode_s": 0.8,
        "idle_s": 0.5,
        "gap_s": 0.2,
        "energy_j": 380.0,
        "energy_prefill_j": 150.0,
        "energy_decode_j": 160.0,
        "energy_idle_j": 50.0,
        "energy_gap_j": 20.0,
        "energy_unsampled_j": 0.0,
        "productive_prefill_s": 0.4,
        "stranded_bandwidth_s": 0.1,
        "productive_decode_s": 0.2,
        "stranded_compute_s": 0.6,
        "host_bound_s": 0.2,
        "energy_productive_prefill_j": 120.0,
        "energy_stranded_bandwidth_j": 30.0,
        "energy_productive_decode_j": 40.0,
        "energy_stranded_compute_j": 120.0,
        "energy_host_bound_j": 20.0,
        "decode_roofline_s": 0.8,
        "prefill_activity_s": 0.5,
        "prefill_roofline_s": 0.0,
    }
    assert {k: a[k] for k in expected} == pytest.approx(expected)
    b = _gpu(raw, "cuda:1")
    assert (b["role"], b["interval_s"], b["attributed_s"], b["unattributed_s"]) == ("unknown", 1.0, 0.0, 1.0)
    assert b["energy_unattributed_j"] == pytest.approx(100.0) and pd.isna(b["energy_decode_j"])


def test_with_a_period_the_same_pass_sums_per_period_too(con) -> None:
    raw, by_period = split_periods(con.execute(aggregate_sql("iv", period_s=1.0)).df())
    assert list(raw.columns) == list(by_period.columns) and "p_start" not in raw
    assert _gpu(raw, "cuda:0")["decode_s"] == pytest.approx(0.8)
    periods = by_period[by_period["device"] == "cuda:0"].sort_values("hour_s")
    assert periods["hour_s"].tolist() == [0.0, 1.0]  # hour_s: the period's start
    assert periods["prefill_s"].tolist() == pytest.approx([0.5, 0.0])
    assert periods["energy_decode_j"].tolist() == pytest.approx([0.0, 160.0])
