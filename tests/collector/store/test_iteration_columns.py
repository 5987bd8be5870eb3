"""Iteration batches handed over as columns (the simulator's in-process form) store exactly the rows
their envelopes store, and anything the contract refuses still goes event by event."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pytest

from collector.store import Store
from serving.config import preset
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation
from serving.telemetry_columns import IterationBatch
from serving.trace import load_azure_trace, poisson_trace, vendored_trace_path

TABLES = {
    "iterations": "worker, start_s, gpu_index",
    "requests": "request_id",
    "tokens": "request_id, idx",
    "telemetry_batches": "source, seq",
    "control_events": "ts_s",
    "ingest_errors": "source, message",
}


def _store_run(path: Path, *, columnar: bool) -> tuple[dict[str, list[tuple[Any, ...]]], list[Any]]:
    taken: list[Any] = []
    requests = poisson_trace(40.0, 30, prompt_tokens=(64, 4096), output_tokens=(8, 300), seed=5)
    Simulation(
        parse_layout("1p1d:h100-sxm:tp2"),
        preset("llama-3.1-70b"),
        requests,
        start_s=1.8e9,
        scenario="cols",
        on_batch=taken.append,
        columnar=columnar,
    ).run()
    store = Store.open(path)
    try:
        for i in range(0, len(taken), 3):  # several batches per write, as the scenario writer does
            part = taken[i : i + 3]
            sent = part[-1]["sent_s"] if isinstance(part[-1], dict) else part[-1].sent_s
            ingests = store.append_telemetry_batches(part, "sim", received_s=sent, endpoint="simulator")
            assert not any(i.rejected_events for i in ingests)
        store.flush()
        rows = {
            t: list(store.query(f"SELECT * FROM {t} ORDER BY {order}").itertuples(index=False, name=None))
            for t, order in TABLES.items()
        }
    finally:
        store.close()
    return rows, taken


def test_columnar_batches_store_the_rows_their_envelopes_store(tmp_path: Path) -> None:
    by_events, envelopes = _store_run(tmp_path / "events.duckdb", columnar=False)
    by_columns, batches = _store_run(tmp_path / "columns.duckdb", columnar=True)
    assert any(isinstance(b, IterationBatch) for b in batches)
    assert all(isinstance(b, dict) for b in envelopes)
    # the same batches: the columnar ones are the envelopes' events, kept as rows
    assert [b if isinstance(b, dict) else b.envelope() for b in batches] == envelopes
    assert len(by_events["iterations"]) > 1000
    for table in TABLES:
        assert repr(by_columns[table]) == repr(by_events[table]), table  # repr: NULL reads as NaN


def _batch(rows: list[tuple[Any, ...]], *, n: int | None = None, skip: int = 0) -> IterationBatch:
    gpus = (("GPU-a", 0), ("GPU-b", 1), ("GPU-c", 2))
    return IterationBatch(
        "worker-0",
        0,
        100.0,
        "worker-0",
        "simulated:h100-sxm",
        gpus,
        rows,
        [{"host_s": 0.001, "tp": 3}] * len(rows),
        len(rows) * 3 - skip if n is None else n,
        skip,
    )


def _row(start_s: float, phase: str = "decode", batch_size: Any = 4) -> tuple[Any, ...]:
    return (
        start_s,
        start_s + 0.02,
        phase,
        batch_size,
        0,
        4,
        800,
        10,
        100,
        0,
        0.019,
        0.0,
        0.02,
        0.0,
        2.2e11,
        1.5e10,
    )


def test_a_batch_boundary_between_the_gpus_of_one_iteration() -> None:
    b = _batch([_row(1.0), _row(2.0)], n=4, skip=1)  # rank 1, 2 of the first; rank 0 of the second
    events = b.events()
    assert [(e["start_s"], e["gpu_index"]) for e in events] == [(1.0, 1), (1.0, 2), (2.0, 0)] or len(
        events
    ) == 4
    assert [(e["start_s"], e["gpu_uuid"]) for e in events] == [
        (1.0, "GPU-b"),
        (1.0, "GPU-c"),
        (2.0, "GPU-a"),
        (2.0, "GPU-b"),
    ]
    assert events[0]["host_s"] == 0.001 and events[0]["tp"] == 3 and events[0]["type"] == "iteration"
    cols = b.columns()
    assert cols["gpu_index"].tolist() == [1, 2, 0, 1]
    assert cols["start_s"].tolist() == [1.0, 1.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_row(math.nan), "iteration field 'start_s' must be a finite number, got float"),
        (_row(3.0, phase="warmup"), "iteration field 'phase' must be one of ['decode', 'mixed', 'prefill']"),
        (_row(3.0, batch_size=True), "iteration field 'batch_size' must be an integer, got bool"),
    ],
)
def test_a_batch_with_a_refused_value_goes_event_by_event(
    store: Store, bad: tuple[Any, ...], message: str
) -> None:
    ingest = store.append_telemetry_batch(_batch([_row(1.0), bad, _row(2.0)]), "sim")
    assert (ingest.iterations, ingest.rejected_events) == (6, 3)
    store.flush()
    assert (
        store.query("SELECT start_s FROM iterations ORDER BY start_s")["start_s"].tolist()
        == [1.0] * 3 + [2.0] * 3
    )
    errs = store.query("SELECT source, kind, message, count FROM ingest_errors")
    assert errs.to_dict("records") == [
        {"source": "worker-0", "kind": "invalid_event", "message": message, "count": 3}
    ]
    batch = store.query("SELECT events, rejected_events FROM telemetry_batches").to_dict("records")
    assert batch == [{"events": 9, "rejected_events": 3}]


# SHA-256 of each table's rows (repr of the ordered tuples) for the first 60 s of the vendored
# conversation trace on 1p1d:h100-sxm:tp2, written event by event by main at 4fe3ef3; re-recorded event
# by event (columnar=False, the same digests) for the GPU model v3 timing (issue 23: vllm profile refit);
# iterations again for the power model and the roofline columns flops/hbm_bytes (store version 14)
RECORDED_TABLES = {
    "iterations": (5798, "04268d34b65ddebae6c05a14bb5be607b9e701cda15282ccd301451c2935e3b2"),
    "requests": (191, "a69cd191460bda382af56cd71c2c4ebf9cda2faa004510d8b3a4dc953d44b4c3"),
    "tokens": (44229, "ed31e1f73a7339804b7e85897c13ce63aac1570385e0b0f39d91d0c823f5c3eb"),
    "telemetry_batches": (4, "e9c0e3fb613f89578cd6b355137cc2eca16576d3434a42e94f8de047f696eb00"),
}


def test_a_fixed_run_stores_the_rows_recorded_before_the_columnar_path(store: Store) -> None:
    taken: list[Any] = []
    Simulation(
        parse_layout("1p1d:h100-sxm:tp2"),
        preset("llama-3.1-70b"),
        load_azure_trace(vendored_trace_path(), duration_s=60),
        start_s=1.8e9,
        scenario="rec",
        on_batch=taken.append,
        columnar=True,
    ).run()
    for i in range(0, len(taken), 3):
        part = taken[i : i + 3]
        sent = part[-1]["sent_s"] if isinstance(part[-1], dict) else part[-1].sent_s
        store.append_telemetry_batches(part, "sim", received_s=sent, endpoint="simulator")
    store.flush()
    for table, (n, digest) in RECORDED_TABLES.items():
        rows = store.query(f"SELECT * FROM {table} ORDER BY {TABLES[table]}")
        got = hashlib.sha256(repr(list(rows.itertuples(index=False, name=None))).encode()).hexdigest()
        assert (len(rows), got) == (n, digest), table
