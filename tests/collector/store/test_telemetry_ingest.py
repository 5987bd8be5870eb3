"""Serving telemetry batches (from the real TelemetryEmitter) into iterations/requests/tokens/control."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from collector.store import Store
from serving.telemetry import TelemetryEmitter, TelemetryHub, TelemetryReader
from serving.telemetry_columns import TokenTimesBatch

T0 = 1_764_000_000.0


def _worker_batches() -> list[dict]:
    out: list[dict] = []
    em = TelemetryEmitter("worker-0", out.append, max_batch_events=3, flush_interval_s=3600)
    for i in range(5):
        prefill = i == 0
        em.emit(
            "iteration",
            worker="worker-0",
            device="emulated:h100-sxm",
            start_s=T0 + i * 0.01,
            end_s=T0 + i * 0.01 + 0.008,
            phase="prefill" if prefill else "decode",
            batch_size=2,
            prefill_tokens=300 if prefill else 0,
            decode_seqs=0 if prefill else 2,
            context_tokens=300 + 2 * i,
            kv_blocks_used=20,
            kv_blocks_total=1000,
            preempted=0,
            compute_s=0.006,
            pacing_s=0.002,
            some_future_field="ignored",  # consumers ignore unknown fields
        )
    em.flush()
    return out


def _router_batches() -> list[dict]:
    out: list[dict] = []
    em = TelemetryEmitter("router", out.append, max_batch_events=100, flush_interval_s=3600)
    em.emit(
        "control",
        ts_s=T0 - 1,
        action="start",
        target="pool",
        before=None,
        after={"workers": [{"id": "worker-0", "role": "both"}]},
        actor="cli",
    )
    for r in range(2):
        tokens = [T0 + 0.01 + r + k * 0.02 for k in range(4)]
        em.emit(
            "request",
            request_id=f"cmpl-{r}",
            arrival_s=T0 + r,
            first_scheduled_s=T0 + r + 0.001,
            prefill_start_s=T0 + r + 0.001,
            prefill_end_s=T0 + r + 0.009,
            kv_transfer_start_s=None,
            kv_transfer_end_s=None,
            kv_transfer_bytes=None,
            first_token_s=tokens[0],
            token_ts_s=tokens,
            finish_s=tokens[-1],
            prompt_tokens=150,
            output_tokens=4,
            prefill_worker="worker-0",
            decode_worker=None if r == 0 else "worker-1",  # aggregated; handed off
            status="ok",
            finish_reason="length",
            error=None,
            attempts=1,
            preemptions=0,
        )
    em.flush()
    return out


def test_round_trip_of_real_batches(store: Store) -> None:
    worker, router = _worker_batches(), _router_batches()
    assert [b["seq"] for b in worker] == [0, 1]
    results = [store.append_telemetry_batch(b, node="node-a", received_s=T0 + 10) for b in worker + router]
    assert [(r.source, r.iterations, r.requests, r.tokens, r.control_events) for r in results] == [
        ("worker-0", 3, 0, 0, 0),
        ("worker-0", 2, 0, 0, 0),
        ("router", 0, 2, 8, 1),
    ]
    assert all(r.rejected_events == 0 and r.rejected_batch is None for r in results)

    it = store.query("SELECT * FROM iterations ORDER BY start_s")
    assert len(it) == 5
    assert it["batch_seq"].tolist() == [0, 0, 0, 1, 1] and set(it["source"]) == {"worker-0"}
    assert it["phase"].tolist() == ["prefill"] + ["decode"] * 4
    assert it["prefill_tokens"][0] == 300 and it["kv_blocks_total"][0] == 1000
    assert it["pacing_s"][0] == pytest.approx(0.002)

    req = store.query("SELECT * FROM requests ORDER BY arrival_s")
    assert req["request_id"].tolist() == ["cmpl-0", "cmpl-1"] and req["node"][0] == "node-a"
    assert req["kv_transfer_bytes"].isna().all() and (req["status"] == "ok").all()

    # ITL straight from the tokens table; TTFT/TPOT from the request_latency view
    itl = store.query(
        "SELECT request_id, count(*) AS n, count(itl_s) AS gaps, avg(itl_s) AS mean_itl_s, "
        "quantile_cont(itl_s, 0.5) AS p50_itl_s FROM tokens GROUP BY request_id ORDER BY request_id"
    )
    assert itl["n"].tolist() == [4, 4] and itl["gaps"].tolist() == [3, 3]
    assert itl["mean_itl_s"].tolist() == pytest.approx([0.02, 0.02], abs=1e-6)
    # each token with the worker that generated it: the decode worker, else the prefill worker
    workers = store.query("SELECT DISTINCT request_id, worker FROM tokens ORDER BY request_id")
    assert workers.values.tolist() == [["cmpl-0", "worker-0"], ["cmpl-1", "worker-1"]]
    lat = store.query("SELECT * FROM request_latency ORDER BY request_id")
    assert lat["ttft_s"].tolist() == pytest.approx([0.01, 0.01], abs=1e-6)
    assert lat["tpot_s"].tolist() == pytest.approx([0.02, 0.02], abs=1e-6)
    assert lat["queue_s"].tolist() == pytest.approx([0.001, 0.001], abs=1e-6)

    ctl = store.query("SELECT * FROM control_events")
    assert ctl["action"][0] == "start" and ctl["actor"][0] == "cli" and ctl["before"].isna()[0]
    assert json.loads(ctl["after"][0]) == {"workers": [{"id": "worker-0", "role": "both"}]}

    batches = store.query("SELECT * FROM telemetry_batches ORDER BY source, seq")
    assert batches[["source", "seq", "events", "rejected_events"]].values.tolist() == [
        ["router", 0, 3, 0],
        ["worker-0", 0, 3, 0],
        ["worker-0", 1, 2, 0],
    ]
    assert (batches["received_s"] == T0 + 10).all()
    assert store.query("SELECT count(*) AS n FROM ingest_errors")["n"][0] == 0


def test_bad_events_are_counted_and_the_rest_kept(store: Store) -> None:
    batch = _worker_batches()[0]
    good = batch["events"][0]
    batch["events"] += [
        {**good, "batch_size": "two"},  # wrong type
        {**good, "batch_size": "three"},  # same problem: counted together
        {**good, "start_s": None},  # required field missing
        {**good, "phase": "warmup"},  # not a phase
        {"type": "heartbeat", "ts_s": 1.0},  # unknown event type
        "not an event",
        {**good, "start_s": T0 + 5},  # fine
    ]
    result = store.append_telemetry_batch(batch, node="node-a")
    assert (result.iterations, result.rejected_events) == (4, 6)
    errs = store.query("SELECT source, kind, message, count FROM ingest_errors ORDER BY count DESC, message")
    assert set(errs["source"]) == {"worker-0"}
    assert errs.values.tolist()[0][1:] == [
        "invalid_event",
        "iteration field 'batch_size' must be an integer, got str",
        2,
    ]
    messages = set(errs["message"])
    assert "iteration event lacks required field 'start_s'" in messages
    assert "iteration field 'phase' must be one of ['decode', 'mixed', 'prefill']" in messages
    assert "telemetry event must be an object, got str" in messages
    assert any(m.startswith("unknown telemetry event type 'heartbeat'") for m in messages)
    assert dict(zip(errs["kind"], errs["count"], strict=False))["unknown_event_type"] == 1
    assert store.query("SELECT rejected_events FROM telemetry_batches")["rejected_events"][0] == 6
    assert store.query("SELECT count(*) AS n FROM iterations")["n"][0] == 4


def test_bad_envelope_is_refused_whole_and_counted(store: Store) -> None:
    batch = {**_worker_batches()[0], "version": 2}
    result = store.append_telemetry_batch(batch, node="node-a")
    assert result.rejected_batch is not None and "version 2 is not supported" in result.rejected_batch
    assert result.iterations == 0
    errs = store.query("SELECT source, kind, count FROM ingest_errors")
    assert errs.values.tolist() == [["worker-0", "invalid_batch", 1]]
    store.append_telemetry_batch(["nope"], node="node-a")
    assert store.query("SELECT source FROM ingest_errors ORDER BY ts_s")["source"].tolist()[-1] == "unknown"
    assert store.query("SELECT count(*) AS n FROM iterations")["n"][0] == 0


def test_reader_gaps_are_recorded(store: Store) -> None:
    hub = TelemetryHub(max_batches_per_source=1)  # evicts: the reader sees a gap
    em = TelemetryEmitter("worker-1", hub.publish, max_batch_events=1, flush_interval_s=3600)
    reader = TelemetryReader()
    em.emit("control", ts_s=T0, action="set_role", target="worker-1", before={}, after={}, actor="router")
    for batch in reader.accept(hub.read()):
        store.append_telemetry_batch(batch, node="node-a")
    for _ in range(3):
        em.emit("control", ts_s=T0, action="set_role", target="worker-1", before={}, after={}, actor="router")
    for batch in reader.accept(hub.read(reader.cursors)):
        store.append_telemetry_batch(batch, node="node-a")
    assert store.record_gaps(reader.gaps, node="node-a", detected_at_s=T0) == 1
    gaps = store.query("SELECT source, after_seq, missing_batches FROM telemetry_gaps")
    assert gaps.values.tolist() == [["worker-1", 0, 2]]
    assert store.query("SELECT seq FROM telemetry_batches ORDER BY seq")["seq"].tolist() == [0, 3]


def test_ingest_error_recorded_by_the_caller(store: Store) -> None:
    store.record_ingest_error("node-a", "dcgm:http://h:9400/metrics", "parse_error", "bad line 7", count=3)
    errs = store.query("SELECT source, kind, message, count FROM ingest_errors")
    assert errs.values.tolist() == [["dcgm:http://h:9400/metrics", "parse_error", "bad line 7", 3]]


@pytest.mark.parametrize("buffer_rows", [0, 10_000])
def test_a_batch_read_twice_is_stored_once(store_path: Path, buffer_rows: int) -> None:
    worker = _worker_batches()
    with Store.open(store_path, buffer_rows=buffer_rows) as store:
        first = [store.append_telemetry_batch(b, node="node-a") for b in worker]
        again = [store.append_telemetry_batch(b, node="node-a") for b in worker]  # e.g. after a restart
        assert [r.duplicate for r in first + again] == [False, False, True, True]
        assert again[0].iterations == 0
        store.append_telemetry_batch(worker[0], node="node-b")  # another node's batch is not a duplicate
        store.flush()
        assert store.query("SELECT count(*) AS n FROM iterations")["n"][0] == 5 + 3
        assert store.query("SELECT count(*) AS n FROM telemetry_batches")["n"][0] == 3


def test_token_times_as_arrays_store_the_rows_of_lists_and_are_checked_alike(store_path: Path) -> None:
    """The simulator's router batches (TokenTimesBatch: token_ts_s as float64 arrays) store the rows
    their envelope (lists) stores; an array with a NaN is refused per event as the list is."""
    batch = _router_batches()[0]
    as_arrays = TokenTimesBatch(
        {
            **batch,
            "events": [
                {**e, "token_ts_s": np.array(e["token_ts_s"])} if e["type"] == "request" else e
                for e in batch["events"]
            ],
        }
    )
    assert as_arrays.envelope() == batch
    bad = [{**e, "request_id": "cmpl-nan"} for e in as_arrays.batch["events"] if e["type"] == "request"][:1]
    bad[0]["token_ts_s"] = np.array([T0, np.nan])
    rows = {}
    for name, sent in (("lists", batch), ("arrays", as_arrays)):
        store = Store.open(store_path.with_name(f"{name}.duckdb"))
        try:
            assert store.append_telemetry_batch(sent, "node-a").tokens == 8
            nan = TokenTimesBatch({**as_arrays.batch, "seq": 99, "events": bad})
            assert store.append_telemetry_batch(nan, "node-a").rejected_events == 1
            store.flush()
            rows[name] = [
                store.query(f"SELECT {columns} FROM {t} ORDER BY ALL").values.tolist()
                for t, columns in (
                    ("tokens", "*"),
                    ("requests", "*"),
                    ("ingest_errors", "kind, message, count"),
                )
            ]
        finally:
            store.close()
    assert repr(rows["arrays"]) == repr(rows["lists"]) and len(rows["lists"][0]) == 8  # repr: NULL reads NaN
    message = "request field 'token_ts_s' must be a list of numbers, got ndarray"
    assert rows["lists"][2] == [["invalid_event", message, 1]]
