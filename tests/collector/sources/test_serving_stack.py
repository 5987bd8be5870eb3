"""The serving sources' keep-alive JSON client against a scripted HTTP server (raw bytes)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from collector.sources.base import SourceUnavailable
from collector.sources.http import HttpClient
from collector.sources.serving_stack import _JsonClient

CLOSE = b""  # scripted "answer": close the connection without responding


class ThenClose(bytes):
    """A scripted answer after which the server closes the connection."""


class ScriptedServer:
    """Answers each request (read up to the blank line) with the next scripted raw response."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/base"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn, conn.makefile("rb") as reader:
                while self.answers:
                    request = b""
                    while not request.endswith(b"\r\n\r\n"):
                        line = reader.readline()
                        if not line:
                            break
                        request += line
                    if not request:
                        break
                    self.requests.append(request)
                    answer = self.answers.pop(0)
                    if answer is CLOSE:
                        break
                    conn.sendall(answer)
                    if isinstance(answer, ThenClose) or b"Connection: close" in answer:
                        break

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[type[ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(answers: list[bytes]) -> ScriptedServer:
        servers.append(ScriptedServer(answers))
        return servers[-1]

    yield start  # type: ignore[misc]
    for s in servers:
        s.close()


def ok(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(h + b"\r\n" for h in headers)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def test_keep_alive_gets_with_content_length_and_chunked_bodies(serve) -> None:
    chunked = b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"a"\r\n5;x=1\r\n: [1]\r\n1\r\n}\r\n0\r\n\r\n'
    server = serve([ok(b'{"devices": []}'), chunked, ok(b"[1, 2]")])
    client = _JsonClient(server.url, timeout_s=5)
    assert client.get("/v1/devices", "devices") == {"devices": []}
    assert client.get("/v1/telemetry", "telemetry", after="router:3") == {"a": [1]}
    assert client.get("/v1/x", "x") == [1, 2]
    assert server.connections == 1  # one connection kept alive for all three
    first = server.requests[0].decode()
    assert first.startswith("GET /base/v1/devices HTTP/1.1\r\n") and f"Host: {server.url[7:-5]}\r\n" in first
    assert server.requests[1].startswith(b"GET /base/v1/telemetry?after=router%3A3 HTTP/1.1\r\n")
    client.close()


def test_the_request_line_has_the_base_path_its_query_and_the_params(serve) -> None:
    """Issue 21 (httpcore's pool directly): the target is the base URL's path and query, then the
    params, percent-encoded; a request without params is built once and sent again as it was."""
    server = serve([ok(b"1"), ok(b"2"), ok(b"3")])
    client = HttpClient(server.url + "?tenant=a", timeout_s=5, headers={"X-Scope-OrgID": "team-a"})
    assert client.get("/v1/telemetry", {"after": "router:3,worker-0:12"}, accept="application/json")[0] == 200
    assert [client.get("/v1/devices")[1] for _ in range(2)] == [bytearray(b"2"), bytearray(b"3")]
    first, second, third = server.requests
    assert first.startswith(b"GET /base/v1/telemetry?tenant=a&after=router%3A3%2Cworker-0%3A12 HTTP/1.1\r\n")
    port = server.url.split(":")[2].split("/")[0]
    for header in (f"Host: 127.0.0.1:{port}", "Accept: application/json", "X-Scope-OrgID: team-a"):
        assert f"\r\n{header}\r\n".encode() in first, (header, first)
    assert second == third and second.startswith(b"GET /base/v1/devices?tenant=a HTTP/1.1\r\n")
    assert b"\r\nAccept: */*\r\n" in second and server.connections == 1
    client.close()


def test_a_connection_the_server_closed_is_reopened_once(serve) -> None:
    server = serve([ok(b"1"), CLOSE, ok(b"2"), ok(b"3", b"Connection: close"), ok(b"4")])
    client = _JsonClient(server.url, timeout_s=5)
    assert [client.get("/p", "p") for _ in range(4)] == [1, 2, 3, 4]
    assert server.connections == 3  # reopened after the silent close and after Connection: close


def test_failures_are_source_unavailable_with_a_kind(serve) -> None:
    server = serve(
        [
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy",
            ok(b"not json"),
            ThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"),
            CLOSE,
            ThenClose(b"garbage\r\n\r\n"),
            ThenClose(b"garbage\r\n\r\n"),
            CLOSE,
            CLOSE,
        ]
    )
    client = _JsonClient(server.url, timeout_s=5)
    with pytest.raises(SourceUnavailable, match=r"devices: HTTP 503: b'busy'") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "http_status"
    with pytest.raises(SourceUnavailable, match="not JSON") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "bad_response"
    with pytest.raises(
        SourceUnavailable, match="RemoteProtocolError: Server disconnected without sending a response"
    ) as err:
        client.get("/v1/devices", "devices")  # truncated body; the retry's connection closes unanswered
    assert err.value.kind == "unreachable"
    with pytest.raises(SourceUnavailable, match=r"RemoteProtocolError: .*status line") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "unreachable"
    assert client.status("/v1/devices") == 0


def test_unreachable_endpoint() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    client = _JsonClient(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(SourceUnavailable, match="devices: ") as err:
        client.get("/v1/devices", "devices")
    assert err.value.kind == "unreachable"
    with pytest.raises(ValueError, match=r"http\(s\)://host"):
        _JsonClient("ftp://x:1", timeout_s=1)


@pytest.mark.timeout(60)
def test_https_is_spoken_and_its_handshake_ends_by_the_deadline() -> None:
    """Issue 21: the serving stack may be read over TLS (the hand-written client spoke http only);
    a peer that never finishes the TLS handshake ends the request by its deadline too."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the kernel accepts; nobody answers
        client = _JsonClient(f"https://127.0.0.1:{listener.getsockname()[1]}", timeout_s=1.0)
        with pytest.raises(SourceUnavailable, match="1 s deadline") as err:
            client.get("/v1/devices", "devices")
        assert err.value.kind == "timeout"
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(3)[:2] == b"\x16\x03"  # a TLS handshake record (the ClientHello)
        client.close()


# -- cursors restored from the store after a collector restart ------------------------------------


def _batch(source: str, seq: int, sent_s: float) -> dict:
    from serving.telemetry import SCHEMA, SCHEMA_VERSION

    event = {"type": "control", "ts_s": sent_s, "action": "tick"}
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "source": source,
        "seq": seq,
        "sent_s": sent_s,
        "dropped_events_total": 0,
        "events": [event],
    }


def _telemetry_server(http_server, batches: list[dict], ring: int):
    import json

    from serving.telemetry import TelemetryHub, parse_after

    hub = TelemetryHub(max_batches_per_source=ring)
    for b in batches:
        hub.publish(b)
    http_server.routes["/v1/models"] = (200, "{}", "application/json")
    http_server.routes["/v1/telemetry"] = lambda q: (
        200,
        json.dumps(hub.read(parse_after(q.get("after", [""])[0]))),
        "application/json",
    )
    return hub


def _restored_source(http_server, tmp_path, stored: list[dict]):
    from collector.sources.serving_stack import ServingTelemetrySource
    from collector.store import Store

    with Store.open(tmp_path / "s.duckdb", buffer_rows=1_000_000) as store:
        *earlier, last = stored
        rows = [
            {**{k: b[k] for k in ("source", "seq", "sent_s")}, "events": 1, "rejected_events": 0}
            for b in earlier
        ]
        store.append(
            "telemetry_batches",
            [{**r, "node": "n1", "received_s": 0.0, "endpoint": http_server.url} for r in rows],
        )
        assert not store.append_telemetry_batch(last, "n1", endpoint=http_server.url).duplicate
        cursors = store.telemetry_cursors("n1", http_server.url)
        assert store.telemetry_cursors("n1", "http://elsewhere:1") == {}
    src = ServingTelemetrySource(http_server.url, node="n1")
    src.restore(cursors)
    return src


def _seqs(result) -> list[int]:
    from collector.sources.serving_stack import TABLE_TELEMETRY

    return [b["seq"] for b in result.rows.get(TABLE_TELEMETRY, [])]


def test_a_restored_cursor_reads_on_without_a_false_gap_when_the_ring_moved_past_it(
    http_server, tmp_path
) -> None:
    # 2,500 batches stored before the restart; the router's ring now starts at seq 2500
    _telemetry_server(http_server, [_batch("router", i, 1000.0 + i) for i in range(2510)], ring=10)
    src = _restored_source(http_server, tmp_path, [_batch("router", i, 1000.0 + i) for i in range(2500)])
    result = src.poll(force=True)
    assert _seqs(result) == list(range(2500, 2510))
    assert src.reader.gaps == [] and src.health_details()["producer_restarts"] == 0


def test_a_restored_cursor_skips_the_batches_already_stored(http_server, tmp_path) -> None:
    _telemetry_server(http_server, [_batch("router", i, 1000.0 + i) for i in range(30)], ring=2048)
    src = _restored_source(http_server, tmp_path, [_batch("router", i, 1000.0 + i) for i in range(20)])
    assert _seqs(src.poll(force=True)) == list(range(20, 30))
    assert src.reader.gaps == [] and src.health_details()["restored_cursors"] == 1


@pytest.mark.parametrize("new_batches", [30, 5])
def test_a_restarted_server_numbering_from_zero_again_is_read_whole(
    http_server, tmp_path, new_batches
) -> None:
    # stored: seq 0..19 of the old server; the new one sent seq 0..new_batches-1 at other times
    _telemetry_server(http_server, [_batch("router", i, 5000.0 + i) for i in range(new_batches)], ring=2048)
    src = _restored_source(http_server, tmp_path, [_batch("router", i, 1000.0 + i) for i in range(20)])
    assert _seqs(src.poll(force=True)) == list(range(new_batches))
    assert src.reader.gaps == [] and src.health_details()["producer_restarts"] == 1


@pytest.mark.slow
def test_device_polls_of_the_real_stack_are_packed_and_store_what_their_rows_store(tmp_path) -> None:
    from collector.service import Collector, CollectorSettings
    from collector.sources.base import TABLE_GPU_SAMPLES
    from collector.sources.serving_stack import ServingDevicesSource
    from collector.store import Store
    from tests.serving.conftest import start_server, stop_server

    server = start_server("--mode", "disaggregated", "--device", "emulated:h100-sxm")  # two GPUs
    try:
        src = ServingDevicesSource(server.url, node="node-a")
        results = []
        for _ in range(3):
            results.append(src.poll(force=True))
            assert results[-1].ok, results[-1].errors
            time.sleep(0.05)
        src.close()
    finally:
        stop_server(server)
    blocks = [b for r in results for b in r.columns[TABLE_GPU_SAMPLES]]
    assert len(blocks) == 3 and all(b.n == 2 and b.floats is not None for b in blocks)
    assert {"ts_s", "power_w", "sm_clock_mhz"} <= blocks[0].values.keys()
    query = "SELECT * FROM gpu_samples_full ORDER BY ts_s, device, worker"
    with Store.open(tmp_path / "packed.duckdb") as store:  # as the collector's writer stores them
        settings = CollectorSettings(db_path=str(store.path), node="node-a", nvml=False)
        Collector(settings, store, sources=[src]).write_results(results)
        packed = store.query(query)
        assert store.query("SELECT count(*) AS n FROM ingest_errors")["n"][0] == 0
    with Store.open(tmp_path / "rows.duckdb") as store:
        store.append(TABLE_GPU_SAMPLES, [row for r in results for row in r.table_rows(TABLE_GPU_SAMPLES)])
        store.flush()
        assert packed.equals(store.query(query))
    assert len(packed) == 6 and packed["emulated"].all() and packed["power_w"].notna().all()
    assert set(packed["role"]) == {"prefill", "decode"}


# -- /v1/devices polls as columns: what the same polls as dict rows store ---------------------------


def _device_item(gpu: int, k: int, **changes: object) -> dict:
    """GPU ``gpu``'s item of the ``k``-th poll as ``GET /v1/devices`` returns it (decoded JSON): an
    emulated GPU's sample with its counters; ``changes`` set (or, as ``...``, drop) sample keys."""
    sample = {
        "ts_s": 100.0 + k,
        "device": "emulated:h100-sxm",
        "kind": "emulated",
        "index": gpu,
        "name": "NVIDIA H100 80GB HBM3 (emulated)",
        "uuid": f"GPU-emulated-{gpu}",
        "emulated": True,
        "gpu_util_pct": 10.0 * gpu + k,
        "power_w": 72.5 + k,
        "energy_mj": 1000 * k + gpu,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1410 + k,
        "mem_clock_mhz": 2619,
        "mem_total_bytes": 85_520_809_984,
        "clock_event_reasons": 1,
        "locked_sm_clock_min_mhz": None,
        "lost": False,
        "window_s": 0.1,
        "uptime_s": 1.5 * k,
        "iterations_total": 3 * k,
        "host_bound_pct": None,
    }
    for name, value in changes.items():
        if value is ...:
            del sample[name]
        else:
            sample[name] = value
    return {"worker": f"worker-{gpu}", "role": "decode", "pid": 0, "sample": sample}


def _device_poll_changes() -> list[list[dict]]:
    """Polls of two GPUs whose samples change shape and type mid-stream, each change held for a
    few polls (the source's row plan is made, then hit, then missed)."""
    polls: list[list[dict]] = []

    def hold(times: int, **changes: object) -> None:
        for _ in range(times):
            k = len(polls)
            polls.append(
                [
                    _device_item(g, k, **{n: v[g] if isinstance(v, list) else v for n, v in changes.items()})
                    for g in range(2)
                ]
            )

    hold(3)
    hold(2, name="NVIDIA H100 (emulated)")  # a string of the identity alone
    hold(2, host_bound_pct=[12.5, None])  # None <-> number in a metric
    hold(2, temperature_c=[40, 41.5])  # a key added (int and float)
    hold(2, lost=...)  # a key removed (a steady one)
    hold(2, mem_clock_mhz=2619.0)  # int -> float in a steady column
    hold(2, mem_clock_mhz=2619)
    hold(2, index=[0, 1.0])  # int -> an integral float in an identity column
    hold(2, uuid=[None, "GPU-emulated-1"])  # str -> None in an identity column
    hold(2, power_limit_w=None)  # a steady column -> None
    hold(2, sm_clock_mhz=[1410.0, None], energy_mj=[None, 7])  # metrics: int -> float, -> None
    hold(2, emulated=[True, False])  # a measured GPU beside an emulated one: source per row
    hold(2, emulated=[False, False], window_s=..., uptime_s=..., iterations_total=...)  # no counters
    hold(4)
    for poll in polls[-2:]:
        poll[1]["worker"] = "worker-9"  # another owner: a new devices row
    for poll in polls[-1:]:  # the same keys in another order
        poll[0]["sample"] = dict(reversed(poll[0]["sample"].items()))
    return polls


def _dict_rows(polls: list[list[dict]], node: str) -> dict[str, list[dict]]:
    """The polls as dict rows (the source before columns): gpu_samples without the emulation
    counters, which go to emulation_samples for each emulated GPU."""
    from collector.sources.serving_stack import EMULATION_COUNTERS

    rows: dict[str, list[dict]] = {"gpu_samples": [], "emulation_samples": []}
    for items in polls:
        for item in items:
            sample = item["sample"]
            source = "emulated" if sample.get("emulated") else "serving"
            own = {"worker": item["worker"], "role": item["role"], "node": node, "source": source}
            rows["gpu_samples"].append({k: v for k, v in sample.items() if k not in EMULATION_COUNTERS} | own)
            counters = {k: v for k, v in sample.items() if k in EMULATION_COUNTERS}
            if counters and sample.get("emulated"):
                key = {k: sample[k] for k in ("ts_s", "device", "index")}
                rows["emulation_samples"].append(key | counters | {"node": node, "source": source})
    return rows


_STORED_QUERIES = {
    "gpu_samples": 'SELECT * FROM gpu_samples_full ORDER BY ts_s, device, "index", worker',
    "devices": "SELECT * FROM devices ORDER BY ALL",
    "emulation_samples": "SELECT * FROM emulation_samples ORDER BY ALL",
}


@pytest.mark.parametrize("shared", [True, False])
def test_device_polls_whose_samples_change_shape_store_what_their_dict_rows_store(tmp_path, shared) -> None:
    from collector.service import Collector, CollectorSettings
    from collector.sources.base import TABLE_GPU_SAMPLES, SourceResult
    from collector.sources.serving_stack import add_device_columns
    from collector.store import Store
    from collector.store.columns import RepeatedColumns
    from collector.store.devices import STEADY_SAMPLE_COLUMNS

    polls = _device_poll_changes()
    repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS) if shared else None  # as the source holds
    results = []
    for k, items in enumerate(polls):
        results.append(SourceResult("serving-devices:test", 100.0 + k))
        add_device_columns(results[-1], items, "node-a", repeats)
    blocks = [r.columns[TABLE_GPU_SAMPLES][0] for r in results]
    if shared:  # unchanged polls hand on the previous poll's identity, changed ones a new one
        assert blocks[1].repeats is blocks[0].repeats is blocks[2].repeats
        assert blocks[4].repeats is blocks[3].repeats is not blocks[2].repeats  # another name
        assert len({id(b.repeats) for b in blocks[5:9]}) == 1  # metrics changed, a metric added
        assert blocks[10].repeats is blocks[9].repeats is not blocks[8].repeats  # "lost" dropped
        assert all(b.floats is not None for b in blocks)
    with Store.open(tmp_path / "columns.duckdb") as store:  # as the collector's writer stores them
        settings = CollectorSettings(db_path=str(store.path), node="node-a", nvml=False)
        collector = Collector(settings, store, sources=[])
        collector.write_results(results)
        assert collector.stats.store_errors == 0, collector.stats.last_error
        stored = {name: store.query(q) for name, q in _STORED_QUERIES.items()}
    with Store.open(tmp_path / "dicts.duckdb") as store:
        for table, rows in _dict_rows(polls, "node-a").items():
            store.append(table, rows)
        store.flush()
        for name, query in _STORED_QUERIES.items():
            assert stored[name].equals(store.query(query)), name
    gpu = stored["gpu_samples"]
    assert len(gpu) == 2 * len(polls) and len(stored["emulation_samples"]) == 2 * 27 + 2
    assert gpu["host_bound_pct"].isna().sum() == 2 * len(polls) - 2  # None stays NULL, not 0 or NaN
    assert gpu["temperature_c"].notna().sum() == 4 and gpu["lost"].isna().sum() == 4
    assert set(stored["devices"]["worker"]) == {"worker-0", "worker-1", "worker-9"}
    assert set(gpu["source"]) == {"emulated", "serving"}


@pytest.mark.parametrize(
    ("name", "values", "column"),
    [
        ("index", [0, True], "index"),  # True == 1, but a boolean in an INTEGER column
        ("emulated", [True, 1], "emulated"),  # 1 == True, but a number in a BOOLEAN column
        ("sm_clock_mhz", [1410.5, 1411], "sm_clock_mhz"),  # a fraction in an INTEGER column
        ("mem_clock_mhz", [2619.5, 2619], "mem_clock_mhz"),  # ... in a steady one
    ],
)
def test_a_bad_value_after_equal_polls_is_refused_naming_its_column(tmp_path, name, values, column) -> None:
    # the identity of the polls before compares equal (1 == True): the bad value still reaches the store
    from collector.sources.base import TABLE_GPU_SAMPLES, SourceResult
    from collector.sources.serving_stack import add_device_columns
    from collector.store import Store, StoreError
    from collector.store.columns import RepeatedColumns
    from collector.store.devices import STEADY_SAMPLE_COLUMNS

    repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)
    result = SourceResult("serving-devices:test", 100.0)
    for k in range(4):
        bad = {name: values} if k == 2 else {}
        items = [_device_item(g, k, **{n: v[g] for n, v in bad.items()}) for g in range(2)]
        if k < 2 and name in ("index", "emulated", "mem_clock_mhz"):  # equal values before
            for g, item in enumerate(items):
                item["sample"][name] = {"index": [0, 1], "emulated": [True, True]}.get(name, [2619, 2619])[g]
        add_device_columns(result, items, "node-a", repeats)
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(StoreError, match=rf"gpu_samples\.{column}"):
            store.append_columns(TABLE_GPU_SAMPLES, result.columns[TABLE_GPU_SAMPLES])
        store.flush()
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
