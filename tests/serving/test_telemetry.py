"""Telemetry: numbered batches, bounded buffers, cursors, gap detection, the spool file."""

from __future__ import annotations

import json
import time
import types

import pytest

from serving import telemetry as tm
from serving.telemetry import (
    EVENT_TYPES,
    SCHEMA,
    SCHEMA_VERSION,
    Gap,
    TelemetryEmitter,
    TelemetryHub,
    TelemetryReader,
    parse_after,
    validate_batch,
)


def _batch(source: str, seq: int, **extra) -> dict:
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "source": source, "seq": seq, "events": [], **extra}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A controllable monotonic clock for the telemetry module."""
    now = [1000.0]
    monkeypatch.setattr(tm, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    return now


# -- emitter ---------------------------------------------------------------------------------------


def test_batches_are_numbered_consecutively_and_flush_by_size() -> None:
    got: list[dict] = []
    em = TelemetryEmitter("w0", got.append, max_batch_events=2, flush_interval_s=3600)
    for i in range(5):
        em.emit("iteration", i=i)
    assert [b["seq"] for b in got] == [0, 1]  # flushed when 2 were pending
    em.flush()
    em.flush()  # nothing pending: no batch, no number used
    em.emit("request", i=5)
    em.flush()
    assert [b["seq"] for b in got] == [0, 1, 2, 3]
    assert [[e["i"] for e in b["events"]] for b in got] == [[0, 1], [2, 3], [4], [5]]
    b = got[0]
    assert b["schema"] == SCHEMA and b["version"] == SCHEMA_VERSION
    assert b["source"] == "w0"
    assert b["dropped_events_total"] == 0
    assert isinstance(b["sent_s"], float)
    assert b["events"][0] == {"type": "iteration", "i": 0}
    assert got[3]["events"][0]["type"] == "request"
    for batch in got:
        assert validate_batch(batch) is batch


def test_sequence_numbers_are_per_source() -> None:
    got: list[dict] = []
    a = TelemetryEmitter("a", got.append, max_batch_events=1)
    b = TelemetryEmitter("b", got.append, max_batch_events=1)
    a.emit("control")
    b.emit("control")
    a.emit("control")
    assert [(x["source"], x["seq"]) for x in got] == [("a", 0), ("b", 0), ("a", 1)]


def test_flush_by_interval(clock: list[float]) -> None:
    got: list[dict] = []
    em = TelemetryEmitter("w", got.append, max_batch_events=100, flush_interval_s=0.25)
    em.emit("iteration")
    em.maybe_flush()
    assert got == []  # interval not over
    clock[0] += 0.24
    em.maybe_flush()
    assert got == []
    clock[0] += 0.02
    em.maybe_flush()
    assert len(got) == 1 and len(got[0]["events"]) == 1
    em.emit("iteration")
    clock[0] += 0.1
    em.maybe_flush()  # the interval counts from the last flush
    assert len(got) == 1
    clock[0] += 0.2
    em.maybe_flush()
    assert [b["seq"] for b in got] == [0, 1]


def test_bounded_pending_drops_oldest_and_counts() -> None:
    got: list[dict] = []
    em = TelemetryEmitter("w", got.append, max_batch_events=100, max_pending_events=3)
    for i in range(5):
        em.emit("iteration", i=i)
    assert em.dropped_events == 2
    em.flush()
    assert [e["i"] for e in got[0]["events"]] == [2, 3, 4]
    assert got[0]["dropped_events_total"] == 2
    em.emit("iteration", i=5)
    em.flush()
    assert got[1]["dropped_events_total"] == 2  # a running total


def test_failing_sink_counts_dropped_batch_and_leaves_a_gap() -> None:
    got: list[dict] = []
    fail = [True]

    def sink(batch: dict) -> None:
        if fail[0]:
            fail[0] = False
            raise ConnectionError("link down")
        got.append(batch)

    em = TelemetryEmitter("w", sink, max_batch_events=1)
    em.emit("iteration", i=0)  # must not raise
    assert em.dropped_batches == 1
    em.emit("iteration", i=1)
    assert [b["seq"] for b in got] == [1]
    reader = TelemetryReader()
    assert reader.accept({"batches": got}) == got
    assert reader.gaps == [Gap("w", -1, 1)]


def test_unknown_event_type_is_rejected() -> None:
    em = TelemetryEmitter("w", lambda b: None)
    with pytest.raises(ValueError) as e:
        em.emit("metrics", x=1)
    msg = str(e.value)
    assert "'metrics'" in msg
    for t in EVENT_TYPES:
        assert t in msg
    em.flush()
    assert em._next_seq == 0  # nothing was queued


# -- hub ----------------------------------------------------------------------------------------------


def test_hub_ring_evicts_oldest_and_counts() -> None:
    hub = TelemetryHub(max_batches_per_source=3)
    for i in range(5):
        hub.publish(_batch("a", i))
    hub.publish(_batch("b", 0))
    out = hub.read()
    assert out["schema"] == SCHEMA and out["version"] == SCHEMA_VERSION
    assert [(b["source"], b["seq"]) for b in out["batches"]] == [("a", 2), ("a", 3), ("a", 4), ("b", 0)]
    assert out["sources"]["a"] == {"first_seq": 2, "last_seq": 4, "evicted_batches": 2}
    assert out["sources"]["b"] == {"first_seq": 0, "last_seq": 0, "evicted_batches": 0}


def test_hub_read_with_cursors_and_limit() -> None:
    hub = TelemetryHub()
    for i in range(4):
        hub.publish(_batch("a", i))
        hub.publish(_batch("b", i))
    out = hub.read({"a": 2})
    assert [(b["source"], b["seq"]) for b in out["batches"]] == [
        ("a", 3),
        ("b", 0),
        ("b", 1),
        ("b", 2),
        ("b", 3),
    ]
    assert hub.read({"a": 3, "b": 3})["batches"] == []
    assert len(hub.read(limit=3)["batches"]) == 3
    assert [b["seq"] for b in hub.read({"a": 0, "b": 99}, limit=2)["batches"]] == [1, 2]
    assert hub.read(limit=0)["batches"] == []


def test_hub_spool_file_gets_every_batch(tmp_path) -> None:
    path = tmp_path / "spool" / "telemetry.jsonl"
    hub = TelemetryHub(max_batches_per_source=2, spool_path=path)
    batches = [_batch("w", i, events=[{"type": "iteration", "i": i}]) for i in range(20)]
    for b in batches:
        hub.publish(b)
    hub.close()
    deadline = time.monotonic() + 5
    lines: list[str] = []
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().splitlines()
            if len(lines) >= len(batches):
                break
        time.sleep(0.01)
    assert [json.loads(line) for line in lines] == batches  # ring evicted, the spool did not
    assert hub.spool_dropped == 0


# -- reader and cursors --------------------------------------------------------------------------------


def test_reader_detects_gaps_and_ignores_duplicates() -> None:
    r = TelemetryReader()
    fresh = r.accept({"batches": [_batch("a", 0), _batch("a", 1), _batch("b", 0)]})
    assert [(b["source"], b["seq"]) for b in fresh] == [("a", 0), ("a", 1), ("b", 0)]
    assert r.gaps == []
    fresh = r.accept({"batches": [_batch("a", 1), _batch("a", 4), _batch("a", 4), _batch("b", 1)]})
    assert [(b["source"], b["seq"]) for b in fresh] == [("a", 4), ("b", 1)]
    assert r.gaps == [Gap("a", 1, 2)]
    assert r.cursors == {"a": 4, "b": 1}
    assert r.accept({}) == []


def test_reader_sees_gap_from_hub_eviction() -> None:
    hub = TelemetryHub(max_batches_per_source=2)
    reader = TelemetryReader()
    hub.publish(_batch("w", 0))
    reader.accept(hub.read(parse_after(reader.query_param())))
    for i in range(1, 6):
        hub.publish(_batch("w", i))
    fresh = reader.accept(hub.read(parse_after(reader.query_param())))
    assert [b["seq"] for b in fresh] == [4, 5]
    assert reader.gaps == [Gap("w", 0, 3)]


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        {**_batch("a", 0), "schema": "other"},
        {**_batch("a", 0), "version": SCHEMA_VERSION + 1},
        {k: v for k, v in _batch("a", 0).items() if k != "version"},
        {**_batch("a", 0), "seq": "0"},
        {**_batch("a", 0), "source": 3},
        {**_batch("a", 0), "events": None},
    ],
)
def test_reader_rejects_invalid_envelopes(bad) -> None:
    r = TelemetryReader()
    fresh = r.accept({"batches": [bad, _batch("a", 0)]})
    assert r.rejected == 1
    assert [b["seq"] for b in fresh] == [0]
    with pytest.raises(ValueError):
        validate_batch(bad)


def test_validate_batch_messages() -> None:
    with pytest.raises(ValueError, match=r"schema must be 'phaselens\.telemetry'"):
        validate_batch({**_batch("a", 0), "schema": "x"})
    with pytest.raises(ValueError, match=r"version 2 is not supported; allowed: 1"):
        validate_batch({**_batch("a", 0), "version": 2})
    with pytest.raises(ValueError, match="'seq' must be int"):
        validate_batch({**_batch("a", 0), "seq": 1.5})


def test_parse_after_round_trips_query_param() -> None:
    r = TelemetryReader(cursors={"router": 12, "worker-1": 0, "prefill:0": 7})
    param = r.query_param()
    assert param == "prefill:0:7,router:12,worker-1:0"
    assert parse_after(param) == r.cursors
    assert TelemetryReader().query_param() == ""
    assert parse_after("") == {}
    assert parse_after(None) == {}
    assert parse_after("a:-1") == {"a": -1}


@pytest.mark.parametrize(
    "garbage",
    [
        "abc",
        "a:",
        ":5",
        "a:x",
        "a:1,",
        "a:1,,b:2",
        "a:1.5",
        "a:--1",
        "a:²",
    ],
)
def test_parse_after_rejects_garbage_clearly(garbage: str) -> None:
    with pytest.raises(ValueError, match=r"bad cursor .* expected source:seq pairs"):
        parse_after(garbage)
