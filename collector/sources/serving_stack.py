"""The bundled serving stack: its telemetry (requests, tokens, iterations, control events), the
devices of its workers (emulated GPUs included) and the host CPU/memory of its worker processes."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

import psutil

from collector.sources.base import TABLE_GPU_SAMPLES, Source, SourceResult, SourceUnavailable
from collector.sources.http import HttpClient
from collector.store.columns import RepeatedColumns, transpose
from collector.store.devices import IDENTITY_COLUMNS, STEADY_SAMPLE_COLUMNS
from serving.telemetry import TelemetryReader

TABLE_TELEMETRY = "telemetry_batches"  # raw batches: the store splits them into their tables
TABLE_TELEMETRY_GAPS = "telemetry_gaps"
TABLE_HOST_SAMPLES = "host_samples"
TABLE_EMULATION_SAMPLES = "emulation_samples"
# An emulated GPU's sample fields kept in ``emulation_samples`` (its cumulative counters), not in
# gpu_samples, whose columns stay those of a measured GPU (``host_bound_pct`` is on both shapes).
EMULATION_COUNTERS: tuple[str, ...] = (
    "window_s",
    "uptime_s",
    "busy_s_total",
    "sm_active_s_total",
    "sm_occupancy_s_total",
    "tensor_active_s_total",
    "dram_active_s_total",
    "mem_active_s_total",
    "iterations_total",
    "paced_iterations_total",
    "lagged_iterations_total",
    "lag_s_total",
    "modeled_s_total",
)
_OWNER = itemgetter("worker", "role")
_SAMPLE_KEY = ("ts_s", "device", "index")


#: The largest JSON answer read from the serving stack: a telemetry read of up to 1000 batches is
#: the largest (tens of MB at most); the limit only stops a runaway answer from filling memory.
MAX_JSON_BYTES = 256 * 1024 * 1024


class _JsonClient:
    """Keep-alive GETs of JSON from one base URL, ``http://`` or ``https://``
    (:class:`~collector.sources.http.HttpClient`: one deadline of ``timeout_s`` per request, bodies
    of at most ``max_body_bytes``)."""

    def __init__(self, base_url: str, timeout_s: float, max_body_bytes: int = MAX_JSON_BYTES) -> None:
        self._http = HttpClient(base_url, timeout_s=timeout_s, max_body_bytes=max_body_bytes)

    def get(self, path: str, what: str, **params: Any) -> Any:
        """GET `path` and decode JSON; raise SourceUnavailable naming `what` on any failure."""
        return self._get(path, what, params, found_only=False)

    def get_if_found(self, path: str, what: str, **params: Any) -> Any | None:
        """As :meth:`get`, but None when the server has no such path (HTTP 404: an older server)."""
        return self._get(path, what, params, found_only=True)

    def _get(self, path: str, what: str, params: dict[str, Any], *, found_only: bool) -> Any | None:
        status, body = self._http.get(path, params, what=what, accept="application/json")
        if status == 404 and found_only:
            return None
        if status != 200:
            raise SourceUnavailable("http_status", f"{what}: HTTP {status}: {bytes(body[:200])!r}")
        try:
            return json.loads(body)
        except ValueError as e:
            raise SourceUnavailable("bad_response", f"{what}: not JSON: {e}") from e

    def status(self, path: str) -> int:
        try:
            self.get(path, path)
        except SourceUnavailable as e:
            return 0 if e.kind in ("unreachable", "timeout") else 500
        return 200

    def close(self) -> None:
        self._http.close()


class ServingTelemetrySource(Source):
    """Reads `GET /v1/telemetry` with per-source cursors; every gap in batch numbers is recorded."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        interval_s: float = 0.5,
        name: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(name or f"serving-telemetry:{url}", interval_s=interval_s, **kw)
        self.url = url.rstrip("/")
        self.node = node or socket.gethostname()
        self.reader = TelemetryReader()
        self._client = _JsonClient(self.url, timeout_s=10)
        # per producer, the newest batch already stored (seq, sent_s): re-read once to check that
        # the producer is the one that sent it (a restarted server numbers its batches from 0 again)
        self._anchors: dict[str, tuple[int, float]] = {}
        self.restored_cursors = 0
        self.producer_restarts = 0  # restored cursors dropped: the producer was not the one stored

    def restore(self, stored: Mapping[str, tuple[int, float]]) -> None:
        """Resume after the batches already in the store: ``stored`` maps each producer (telemetry
        source) to its newest stored batch's ``(seq, sent_s)``. No batch is then read twice and no
        gap is recorded for batches stored before a collector restart."""
        for source, (seq, sent_s) in stored.items():
            self._anchors[source] = (int(seq), float(sent_s))
            self.reader.cursors[source] = int(seq)
        self.restored_cursors = len(self._anchors)

    def _discover(self) -> bool:
        return self._client.status("/v1/models") == 200

    def _collect(self, now_s: float, result: SourceResult) -> None:
        gaps_before, rejected_before = len(self.reader.gaps), self.reader.rejected
        while True:
            payload = self._client.get("/v1/telemetry", "telemetry", after=self._after())
            if self._take_telemetry(payload, result):
                break
        self._count_telemetry(result, gaps_before, rejected_before)

    def _take_telemetry(self, payload: dict[str, Any], result: SourceResult) -> bool:
        """Add a telemetry read's new batches to ``result``; whether the read was the last one
        needed (False: the read's limit was reached, or restarted producers must be read again)."""
        payload, reread = self._check_anchors(payload)
        result.add_rows(TABLE_TELEMETRY, self.reader.accept(payload))
        return not reread and len(payload.get("batches", [])) < 1000

    def _count_telemetry(self, result: SourceResult, gaps_before: int, rejected_before: int) -> None:
        """The gaps and rejected batches found since the counts ``*_before``: rows and counts."""
        new_gaps = self.reader.gaps[gaps_before:]
        result.add_rows(
            TABLE_TELEMETRY_GAPS,
            [
                {
                    "node": self.node,
                    "source": g.source,
                    "after_seq": g.after_seq,
                    "missing_batches": g.missing_batches,
                }
                for g in new_gaps
            ],
        )
        if new_gaps:
            missing = sum(g.missing_batches for g in new_gaps)
            result.count("telemetry_gap", f"{missing} telemetry batches missing (e.g. {new_gaps[0]})")
        result.count(
            "invalid_batch", "telemetry batch with a bad envelope", self.reader.rejected - rejected_before
        )

    def _after(self) -> str:
        """The ``after`` cursors: an unverified restored cursor asks for its anchor batch again."""
        cursors = dict(self.reader.cursors)
        for source, (seq, _) in self._anchors.items():
            cursors[source] = seq - 1
        return ",".join(f"{s}:{n}" for s, n in sorted(cursors.items()))

    def _check_anchors(self, payload: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Check restored cursors against the producers' rings; return the payload without the
        batches of producers found restarted, and whether those must be read again from the start.

        Same producer: its anchor batch is there with the stored ``sent_s`` (or has been evicted from
        the ring: the batches after it were lost, a gap). Restarted: the batch of that seq was sent
        at another time, or the ring ends before that seq.
        """
        if not self._anchors:
            return payload, False
        batches = payload.get("batches") or []
        rings = payload.get("sources") or {}
        restarted: set[str] = set()
        for source, (seq, sent_s) in list(self._anchors.items()):
            anchor = next(
                (
                    b
                    for b in batches
                    if isinstance(b, dict) and b.get("source") == source and b.get("seq") == seq
                ),
                None,
            )
            ring = rings.get(source)
            if anchor is not None:
                if anchor.get("sent_s") != sent_s:
                    restarted.add(source)
            elif not isinstance(ring, dict) or not isinstance(ring.get("last_seq"), int):
                continue  # nothing of this producer in the ring (yet): ask again next time
            elif ring["last_seq"] < seq:
                restarted.add(source)
            elif isinstance(ring.get("first_seq"), int) and ring["first_seq"] <= seq:
                continue  # in the ring but left out of this read (the read's limit): ask again
            del self._anchors[source]
        for source in restarted:
            self._anchors.pop(source, None)
            self.reader.cursors.pop(source, None)
            self.producer_restarts += 1
        if not restarted:
            return payload, False
        kept = [b for b in batches if not (isinstance(b, dict) and b.get("source") in restarted)]
        return {**payload, "batches": kept}, True

    def health_details(self) -> dict[str, Any]:
        return {
            "restored_cursors": self.restored_cursors,
            "producer_restarts": self.producer_restarts,
            "telemetry_gaps": len(self.reader.gaps),
            "telemetry_missing_batches": sum(g.missing_batches for g in self.reader.gaps),
            "telemetry_rejected_batches": self.reader.rejected,
            "cursors": dict(self.reader.cursors),
        }

    def close(self) -> None:
        self._client.close()


def add_device_columns(
    result: SourceResult,
    items: list[dict[str, Any]],
    node: str,
    repeats: RepeatedColumns | None = None,
    *,
    per_device: bool = False,
) -> None:
    """The samples of ``/v1/devices`` items (each with a ``sample``) as gpu_samples columns, with the
    worker and role owning each GPU (they go to the GPU's devices row, a new one when they change).
    ``source`` is ``emulated`` for an emulated GPU's sample, else ``serving``. With ``repeats`` (one
    per source), the GPUs' identity columns are handed on as the previous poll's while unchanged
    and the rest, the metrics, packed as float64 as well (``RepeatedColumns.block``: once the
    samples' key set is known, a poll is read with one ``itemgetter`` and compared in C).
    ``per_device``: ``items`` already has one item per device and sample time (the batched read's
    ticks, each made one per device by :func:`one_item_per_device`), so a device's rows of several
    ticks are kept apart."""
    if not items:
        return
    if not per_device:
        items = one_item_per_device(items)
    samples = [item["sample"] for item in items]
    try:
        worker, role = zip(*map(_OWNER, items), strict=True)
    except KeyError:
        worker, role = [item.get("worker") for item in items], [item.get("role") for item in items]
    owners: dict[str, Sequence[Any]] = {"worker": worker, "role": role}
    emulated = [sample.get("emulated") for sample in samples]
    constants: dict[str, Any] = {"node": node}
    if all(emulated):
        constants["source"] = "emulated"
    elif not any(emulated):
        constants["source"] = "serving"
    else:
        owners["source"] = ["emulated" if e else "serving" for e in emulated]
    if repeats is None:
        values = transpose(samples)  # one stack, one sample shape: transposed in C
        values.update(owners)
        counters = {name: values.pop(name) for name in EMULATION_COUNTERS if name in values}
        result.add_columns(TABLE_GPU_SAMPLES, values, constants)
    else:  # one stack, one sample shape: read by a plan made for it, the identity compared in C
        block, counters = repeats.block(
            samples, IDENTITY_COLUMNS, owners, constants, apart=EMULATION_COUNTERS
        )
        result.add_block(TABLE_GPU_SAMPLES, block)
    if counters:
        keyed_from = values if repeats is None else {**block.values, **block.repeats}
        rows = [i for i, e in enumerate(emulated) if e]
        keyed = {**{k: keyed_from[k] for k in _SAMPLE_KEY}, **counters}
        if "source" in keyed_from:
            keyed["source"] = keyed_from["source"]
        if len(rows) < len(samples):
            keyed = {k: [column[i] for i in rows] for k, column in keyed.items()}
        result.add_columns(TABLE_EMULATION_SAMPLES, keyed, constants)


def one_item_per_device(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` with one item per physical device: workers sharing a device (two on ``cpu`` or
    ``cuda:0``) each report its sample under the same ``(device, index)``. Their item becomes one,
    with the sample of the first worker (in worker-id order), ``worker`` the workers' ids comma-joined
    in that order (``worker-0,worker-1``) and ``role`` their distinct roles in that order (``mixed``;
    ``prefill,decode`` for a device both pools share), so a pool's name stays a role: the device keeps
    one ``devices`` row while the same workers share it, instead of one per poll as the owner
    alternated. Items of unshared devices (every emulated GPU has its own index) pass unchanged."""
    keys = [(item["sample"].get("device"), item["sample"].get("index")) for item in items]
    if len(set(keys)) == len(keys):
        return items
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for key, item in zip(keys, items, strict=True):
        groups.setdefault(key, []).append(item)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        group = sorted(group, key=lambda item: _worker_order(item.get("worker")))
        merged = dict(group[0])
        merged["worker"] = ",".join(str(item.get("worker")) for item in group)
        merged["role"] = ",".join(dict.fromkeys(str(item.get("role")) for item in group))
        out.append(merged)
    return out


def _worker_order(worker: Any) -> tuple[Any, ...]:
    """``worker-2`` before ``worker-10``: ids by their number, then by text."""
    text = str(worker)
    head, _, number = text.rpartition("-")
    return (head, int(number), text) if number.isdigit() else (text, -1, text)


class ServingDevicesSource(Source):
    """Samples the stack's worker devices (`GET /v1/devices`) and the workers' host CPU and memory."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        interval_s: float = 0.1,
        host_interval_s: float = 1.0,
        **kw: Any,
    ) -> None:
        super().__init__(f"serving-devices:{url}", interval_s=interval_s, **kw)
        self.url = url.rstrip("/")
        self.node = node or socket.gethostname()
        self.host_interval_s = host_interval_s
        self._client = _JsonClient(self.url, timeout_s=5)
        self._procs: dict[int, psutil.Process] = {}
        self._last_host_s = 0.0
        # the GPUs' identity (and steady) columns, handed on while unchanged
        self._repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)

    def _discover(self) -> bool:
        return self._client.status("/v1/devices") == 200

    def _collect(self, now_s: float, result: SourceResult) -> None:
        self._take(self._client.get("/v1/devices", "devices"), now_s, result)

    def _take(self, body: dict[str, Any], now_s: float, result: SourceResult) -> None:
        """A ``/v1/devices`` answer's samples (and, every ``host_interval_s``, the workers' host
        CPU and memory) into ``result``."""
        hosts = []
        sample_hosts = now_s - self._last_host_s >= self.host_interval_s
        if sample_hosts:
            self._last_host_s = now_s
        items = []
        for item in body.get("devices", []):
            if "sample" not in item:
                result.count("device_error", f"{item.get('worker')}: {item.get('error')}")
                continue
            items.append(item)
            if sample_hosts and item.get("pid"):
                host = self._host_sample(item["pid"], item["worker"], now_s)
                if host is not None:
                    hosts.append(host)
        add_device_columns(result, items, self.node, self._repeats)
        result.add_rows(TABLE_HOST_SAMPLES, hosts)

    def _host_sample(self, pid: int, worker: str, now_s: float) -> dict[str, Any] | None:
        try:
            proc = self._procs.get(pid) or self._procs.setdefault(pid, psutil.Process(pid))
            with proc.oneshot():
                cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
        except psutil.Error:
            self._procs.pop(pid, None)  # remote stack or the worker is gone
            return None
        return {
            "node": self.node,
            "ts_s": now_s,
            "pid": pid,
            "worker": worker,
            "cpu_pct": cpu,
            "rss_bytes": rss,
        }

    def close(self) -> None:
        self._client.close()
