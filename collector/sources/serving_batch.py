"""One source per bundled serving stack: everything it polls in one GET when the router offers it.

``GET /v1/collect`` (``serving/device_sampler.py``) answers with every worker's device samples
the router took since the source's device cursor (one tick per ``--device-sample-interval-s``,
100 ms by default) and the telemetry batches since its telemetry cursors, so the collector makes
one request per ``interval_s`` (0.5 s) instead of ten ``/v1/devices`` and two ``/v1/telemetry``
requests a second. Each tick has one item per worker the router holds: a worker that is dead or
restarting (or that did not answer) is counted (``device_down`` / ``device_error``, its missing
samples; ``health_details()['devices_down']``), and the others' samples are stored as usual.

Against a router without ``/v1/collect`` (HTTP 404: an older one) the source polls as the two
sources it replaces did, on its one thread: ``/v1/devices`` every ``gpu_interval_s`` and
``/v1/telemetry`` every ``interval_s``. It asks again whether the router offers the batched read
after every failed poll (a restarted stack may be another version).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from collector.sources.base import SourceResult, SourceUnavailable
from collector.sources.serving_stack import (
    TABLE_HOST_SAMPLES,
    ServingDevicesSource,
    ServingTelemetrySource,
    add_device_columns,
    one_item_per_device,
)

COLLECT_SCHEMA = "phaselens.collect"
COLLECT_VERSION = 1
SERVING_READS = ("auto", "per-worker")  # `phaselens collect --serving-read`


class ServingStackSource(ServingTelemetrySource):
    """A serving stack's telemetry, device samples and workers' host CPU/memory: ``GET /v1/collect``
    every ``interval_s`` when the router offers it, else ``/v1/devices`` every ``gpu_interval_s``
    and ``/v1/telemetry`` every ``interval_s``. Telemetry cursors, restarts and gaps are handled as
    :class:`ServingTelemetrySource` does (whose subclass it is, so the collector restores its
    cursors and pauses it while the store refuses writes)."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        interval_s: float = 0.5,
        gpu_interval_s: float = 0.1,
        host_interval_s: float = 1.0,
        batched: bool | None = None,
        **kw: Any,
    ) -> None:
        """``batched``: None to use ``/v1/collect`` where the router offers it, False for the
        per-worker reads only (``--serving-read per-worker``)."""
        super().__init__(url, node=node, interval_s=interval_s, name=f"serving:{url.rstrip('/')}", **kw)
        self.batch_interval_s = interval_s
        self.gpu_interval_s = gpu_interval_s
        # the per-worker path (and, batched, the host samples and the GPUs' repeated columns)
        self.devices = ServingDevicesSource(
            url, node=self.node, interval_s=gpu_interval_s, host_interval_s=host_interval_s
        )
        self.batched: bool | None = batched  # None: not asked yet
        self._per_worker_only = batched is False
        if batched is False:
            self.interval_s = gpu_interval_s
        self._last_telemetry_s = float("-inf")  # the per-worker path's telemetry read
        self._sampler: str | None = None  # the router's sampler the device cursor belongs to
        self._device_cursor: int | None = None
        # a new source (this collector just started) stores from the router's newest tick on: the
        # ring's older ticks may be stored already (a restarted collector), as /v1/devices polls were
        self._fresh = True
        self.devices_down: Counter[str] = Counter()  # per worker: samples missing (down or failed)
        self.missed_ticks = 0  # the router's ticks evicted before they were read
        self.sampler_interval_s: float | None = None
        # set by the collector while the store refuses writes: the devices are still read (their rows
        # held, the oldest dropped and counted), the telemetry not (the stack's ring keeps it)
        self.telemetry_paused = False

    def _collect(self, now_s: float, result: SourceResult) -> None:
        try:
            if self.batched is not False:
                self._collect_batched(now_s, result)
            if self.batched is False:
                self._collect_per_worker(now_s, result)
        except SourceUnavailable:
            if not self._per_worker_only:
                self.batched = None  # ask again once the stack answers (a restart may change its version)
            raise

    # -- the batched read ---------------------------------------------------------------------------

    def _collect_batched(self, now_s: float, result: SourceResult) -> None:
        gaps_before, rejected_before = len(self.reader.gaps), self.reader.rejected
        while True:
            paused = self.telemetry_paused
            params: dict[str, Any] = {"telemetry": "false"} if paused else {"after": self._after()}
            if self._device_cursor is not None:
                params["devices_after"] = self._device_cursor
            body = self._client.get_if_found("/v1/collect", "collect", **params)
            if body is None:
                self.batched = False
                self.interval_s = self.gpu_interval_s
                return
            if not isinstance(body, dict) or body.get("schema") != COLLECT_SCHEMA:
                raise SourceUnavailable("bad_response", f"collect: not a {COLLECT_SCHEMA} answer")
            if body.get("version") != COLLECT_VERSION:
                raise SourceUnavailable(
                    "bad_response",
                    f"collect: version {body.get('version')!r} is not supported; allowed: {COLLECT_VERSION}",
                )
            if not self.batched:
                self.batched, self.interval_s = True, self.batch_interval_s
            self._take_devices(body.get("devices") or {}, now_s, result)
            if paused or self._take_telemetry(body.get("telemetry") or {}, result):
                break
        self._count_telemetry(result, gaps_before, rejected_before)

    def _take_devices(self, devices: dict[str, Any], now_s: float, result: SourceResult) -> None:
        """The ticks of a ``/v1/collect`` answer: samples to their tables, missing ones counted."""
        if devices.get("sampler") != self._sampler:  # another router process: its ticks from 0
            restarted = self._device_cursor is not None
            self._sampler, self._device_cursor = devices.get("sampler"), None
            if restarted:  # this answer's ticks were chosen by the old cursor: the next read has all
                return
        self.sampler_interval_s = devices.get("interval_s")
        missed = int(devices.get("missed_ticks") or 0)
        if missed:
            self.missed_ticks += missed
            result.count(
                "device_gap",
                f"{missed} sampling rounds of the router's devices were gone before they were read "
                f"(its ring holds the newest; every {self.sampler_interval_s} s)",
                missed,
            )
        items: list[dict[str, Any]] = []
        down: Counter[str] = Counter()
        failed: Counter[str] = Counter()
        why: dict[tuple[bool, str], str] = {}  # (down, worker): the first reason of a read
        ticks = devices.get("ticks") or []
        if self._fresh and ticks:
            self._fresh, ticks = False, ticks[-1:]
        for tick in ticks:
            sampled = []
            for item in tick.get("items") or []:
                if "sample" in item:
                    sampled.append(item)
                    continue
                worker, is_down = str(item.get("worker")), bool(item.get("down"))
                (down if is_down else failed)[worker] += 1
                why.setdefault((is_down, worker), str(item.get("error")))
            items.extend(one_item_per_device(sampled))
        add_device_columns(result, items, self.node, self.devices._repeats, per_device=True)
        for kind, is_down, counts in (("device_down", True, down), ("device_error", False, failed)):
            for worker, n in sorted(counts.items()):
                self.devices_down[worker] += n
                message = f"{why[is_down, worker]}: {n} samples of {worker} missing"
                result.count(kind, message, n, distinct=True)
        if devices.get("last_seq") is not None:
            self._device_cursor = int(devices["last_seq"])
        if now_s - self.devices._last_host_s >= self.devices.host_interval_s:
            self.devices._last_host_s = now_s
            hosts = [
                self.devices._host_sample(w["pid"], w["worker"], now_s)
                for w in devices.get("workers") or []
                if w.get("pid") and w.get("state") in ("ready", "draining")
            ]
            result.add_rows(TABLE_HOST_SAMPLES, [h for h in hosts if h is not None])

    # -- an older router: the two reads of before, on this thread ----------------------------------

    def _collect_per_worker(self, now_s: float, result: SourceResult) -> None:
        self.devices._collect(now_s, result)
        if not self.telemetry_paused and now_s - self._last_telemetry_s >= self.batch_interval_s:
            self._last_telemetry_s = now_s
            super()._collect(now_s, result)

    def health_details(self) -> dict[str, Any]:
        return {
            **super().health_details(),
            "read": {True: "batched", False: "per_worker", None: "not yet"}[self.batched],
            "device_cursor": self._device_cursor,
            "sampler_interval_s": self.sampler_interval_s,
            "missed_device_ticks": self.missed_ticks,
            "devices_down": dict(self.devices_down),
        }

    def close(self) -> None:
        super().close()
        self.devices.close()


__all__ = ["SERVING_READS", "ServingStackSource"]
