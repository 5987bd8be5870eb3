"""NVIDIA dcgm-exporter as a source: ``DCGM_FI_*`` fields → ``gpu_samples`` rows (DeviceSample columns).

One row per GPU per scrape: ``kind="cuda"``, ``emulated=False``, ``source="dcgm:<url>"``, the node from
the ``Hostname`` (old exporters) or ``hostname`` label, and Kubernetes ``pod``/``namespace``/``container``
labels kept as ``k8s_pod``/``k8s_namespace``/``k8s_container``. DCGM writes "blank" sentinels for values it does not have; they become ``None``.
The rows are the store's wide ``gpu_samples`` input: it keeps kind, UUID, model name and the
Kubernetes labels in ``devices``, one row per change (a pod moving to another GPU shows up there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from collector.sources.backoff import Backoff
from collector.sources.base import TABLE_GPU_SAMPLES, Source, SourceResult
from collector.sources.exposition import fetch_text, finite, parse_exposition
from serving.devices.base import DeviceSample


@dataclass(frozen=True, slots=True)
class DcgmField:
    """How one DCGM field lands in a gpu_samples column: ``column = value * scale`` as ``type``."""

    column: str
    scale: float = 1.0
    integer: bool = False


_MIB = 1024 * 1024

#: DCGM field → gpu_samples column. Ratios (0-1) are scaled to percent; MiB to bytes.
DCGM_FIELDS: dict[str, DcgmField] = {
    "DCGM_FI_DEV_GPU_UTIL": DcgmField("gpu_util_pct"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": DcgmField("mem_util_pct"),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": DcgmField("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": DcgmField("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField("dram_active_pct", 100.0),
    "DCGM_FI_DEV_POWER_USAGE": DcgmField("power_w"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": DcgmField("energy_mj", integer=True),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": DcgmField("power_limit_w"),
    "DCGM_FI_DEV_SM_CLOCK": DcgmField("sm_clock_mhz", integer=True),
    "DCGM_FI_DEV_MEM_CLOCK": DcgmField("mem_clock_mhz", integer=True),
    "DCGM_FI_DEV_GPU_TEMP": DcgmField("temperature_c"),
    "DCGM_FI_DEV_FB_USED": DcgmField("mem_used_bytes", _MIB, integer=True),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": DcgmField("clock_event_reasons", integer=True),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": DcgmField("clock_event_reasons", integer=True),
}
#: Fields read only to compute ``mem_total_bytes`` (FB_TOTAL when exported, else used+free+reserved).
_FB_FIELDS = ("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
#: Fields whose newer name wins when an exporter writes both.
_PREFERRED = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}

#: The columns of a gpu_samples row produced here (DeviceSample fields + where it came from).
GPU_ROW_COLUMNS: tuple[str, ...] = (
    "node",
    "source",
    *(f.name for f in dataclasses.fields(DeviceSample)),
    "k8s_pod",
    "k8s_namespace",
    "k8s_container",
)

# DCGM blank sentinels (dcgm_structs.h): int64 blanks start at 0x7ffffffffffffff0 (≈ 9.22e18),
# int32 blanks at 0x7ffffff0, fp64 blanks at 2**47. The energy counter is int64 and can legitimately
# pass the int32 range, so only the int64 rule applies to it.
_INT64_BLANK = 9.2e18
_INT32_BLANK = (0x7FFFFFF0, 0x7FFFFFFF)
_FP64_BLANK = (140737488355328.0, 140737488355328.0 + 16)

_NODE_LABELS = ("Hostname", "hostname")
_MODEL_LABELS = ("modelName", "model_name")
_K8S_LABELS = ("pod", "namespace", "container")


def is_blank(field: str, value: float) -> bool:
    """True when ``value`` is a DCGM 'no data' sentinel rather than a measurement."""
    if value >= _INT64_BLANK:
        return True
    if field == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
        return False
    return _INT32_BLANK[0] <= value <= _INT32_BLANK[1] or _FP64_BLANK[0] <= value <= _FP64_BLANK[1]


def is_dcgm_field(name: str) -> bool:
    return name.startswith("DCGM_FI_")


def _label(labels: dict[str, str], keys: Iterable[str]) -> str | None:
    for k in keys:
        v = labels.get(k)
        if v:
            return v
    return None


def gpu_key(
    labels: dict[str, str], default_node: str | None
) -> tuple[str | None, str | None, str | None, str]:
    """(node, gpu index, UUID, MIG instance) — what makes one GPU row."""
    return (
        _label(labels, _NODE_LABELS) or default_node,
        labels.get("gpu"),
        labels.get("UUID") or labels.get("uuid"),
        labels.get("GPU_I_ID", ""),
    )


class GpuRowBuilder:
    """Collects DCGM field values per GPU and emits one gpu_samples row per GPU."""

    def __init__(self, source: str, default_node: str | None, result: SourceResult) -> None:
        self.source = source
        self.default_node = default_node
        self.result = result
        self._gpus: dict[tuple, dict[str, Any]] = {}

    def add(
        self, field: str, labels: dict[str, str], value: float, ts_s: float, default_node: str | None = None
    ) -> None:
        """Add one DCGM field value (unmapped DCGM fields are ignored: the table has no column).

        ``default_node`` names the node when the series has no Hostname/hostname label
        (default: the builder's).
        """
        if field.endswith("_total") and field[:-6] in DCGM_FIELDS:  # parser's counter renaming
            field = field[:-6]
        if field not in DCGM_FIELDS and field not in _FB_FIELDS:
            return
        if not finite(value):
            self.result.count("non_finite", f"{field}{labels}: {value}", severity="warning")
            return
        key = gpu_key(labels, default_node or self.default_node)
        gpu = self._gpus.get(key)
        if gpu is None:
            gpu = self._gpus[key] = {"labels": labels, "ts_s": ts_s, "fields": {}, "k8s": {}}
        for k in _K8S_LABELS:  # Kubernetes labels may sit on some fields only: keep the first seen
            if labels.get(k):
                gpu["k8s"].setdefault(k, labels[k])
        gpu["ts_s"] = max(gpu["ts_s"], ts_s)
        gpu["fields"][field] = None if is_blank(field, value) else value

    def rows(self) -> list[tuple[tuple, dict[str, Any]]]:
        """``(gpu key, row)`` per GPU seen."""
        return [(key, self._row(key, g)) for key, g in self._gpus.items()]

    def _row(self, key: tuple, g: dict[str, Any]) -> dict[str, Any]:
        labels: dict[str, str] = g["labels"]
        fields: dict[str, float | None] = g["fields"]
        node, gpu, uuid, mig = key
        index = int(gpu) if gpu is not None and gpu.isdigit() else None
        device = f"cuda:{gpu}" if gpu is not None else (labels.get("device") or "cuda")
        if mig:
            device += f"/gi{mig}"
        row: dict[str, Any] = dict.fromkeys(GPU_ROW_COLUMNS)
        row.update(
            ts_s=g["ts_s"],
            node=node,
            source=self.source,
            device=device,
            kind="cuda",
            index=index,
            name=_label(labels, _MODEL_LABELS) or "",
            uuid=uuid,
            emulated=False,
            lost=False,
        )
        for k in _K8S_LABELS:
            row[f"k8s_{k}"] = g["k8s"].get(k)
        for fname, value in fields.items():
            spec = DCGM_FIELDS.get(fname)
            if spec is None or (fname in _PREFERRED and _PREFERRED[fname] in fields):
                continue
            row[spec.column] = _convert(value, spec)
        row["mem_total_bytes"] = _mem_total_bytes(fields)
        return row


def _convert(value: float | None, spec: DcgmField) -> float | int | None:
    if value is None:
        return None
    v = value * spec.scale
    return round(v) if spec.integer else float(v)


def _mem_total_bytes(fields: dict[str, float | None]) -> int | None:
    total = fields.get("DCGM_FI_DEV_FB_TOTAL")
    if total is not None:
        return round(total * _MIB)
    used, free = fields.get("DCGM_FI_DEV_FB_USED"), fields.get("DCGM_FI_DEV_FB_FREE")
    if used is None or free is None:
        return None
    return round((used + free + (fields.get("DCGM_FI_DEV_FB_RESERVED") or 0)) * _MIB)


class ClockGuard:
    """Drops a row whose timestamp is not after the last one kept for the same key."""

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}

    def admit(self, key: Any, ts_s: float, result: SourceResult, what: str, count_equal: bool = True) -> bool:
        last = self._last.get(key)
        if last is not None and ts_s < last:
            result.count("clock_backwards", f"{what}: ts {ts_s:.3f} < last {last:.3f}; row dropped")
            return False
        if last is not None and ts_s == last:
            if count_equal:
                result.count("duplicate_timestamp", f"{what}: ts {ts_s:.3f} repeated", severity="info")
            return False
        self._last[key] = ts_s
        return True


class DcgmSource(Source):
    """Scrapes one dcgm-exporter ``/metrics`` endpoint (use :meth:`many` for several)."""

    def __init__(
        self,
        url: str,
        *,
        node: str | None = None,
        interval_s: float = 1.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] | None = None,
        backoff: Backoff | None = None,
        client: httpx.Client | None = None,
        discovery_ttl_s: float = 60.0,
    ) -> None:
        super().__init__(
            f"dcgm:{url}",
            interval_s=interval_s,
            clock=clock,
            backoff=backoff,
            discovery_ttl_s=discovery_ttl_s,
        )
        self.url = url
        # Rows without a Hostname/hostname label fall back to the endpoint's host.
        self.node = node or urlsplit(url).hostname
        self._own_client = client is None
        self._client = client or httpx.Client(timeout=timeout_s)
        self._clock_guard = ClockGuard()

    @classmethod
    def many(cls, urls: Iterable[str], **kwargs: Any) -> list[DcgmSource]:
        """One source per endpoint, so each has its own health and backoff."""
        return [cls(u, **kwargs) for u in urls]

    def _discover(self) -> bool:
        return "DCGM_FI_" in fetch_text(self._client, self.url)

    def _collect(self, now_s: float, result: SourceResult) -> None:
        text = fetch_text(self._client, self.url)
        builder = _map_exposition(text, self.name, self.node, now_s, result)
        rows = []
        for key, row in builder.rows():
            if self._clock_guard.admit(key, row["ts_s"], result, f"{row['node']} {row['device']}"):
                rows.append(row)
        result.add_rows(TABLE_GPU_SAMPLES, rows)

    def close(self) -> None:
        if self._own_client:
            self._client.close()


def rows_from_text(
    text: str, *, source: str = "dcgm:test", node: str | None = None, ts_s: float = 0.0
) -> SourceResult:
    """Map one exposition text to gpu_samples rows without any HTTP (handy for tools and tests)."""
    result = SourceResult(source, ts_s)
    builder = _map_exposition(text, source, node, ts_s, result)
    result.add_rows(TABLE_GPU_SAMPLES, [row for _, row in builder.rows()])
    return result


def _map_exposition(
    text: str, source: str, node: str | None, now_s: float, result: SourceResult
) -> GpuRowBuilder:
    builder = GpuRowBuilder(source, node, result)
    for s in parse_exposition(text, result):
        if not is_dcgm_field(s.name):
            result.count("unknown_metric", f"{s.name} is not a DCGM field", severity="warning")
            continue
        builder.add(s.name, s.labels, s.value, s.timestamp_s if s.timestamp_s is not None else now_s)
    return builder


__all__ = [
    "DCGM_FIELDS",
    "GPU_ROW_COLUMNS",
    "ClockGuard",
    "DcgmField",
    "DcgmSource",
    "GpuRowBuilder",
    "is_blank",
    "rows_from_text",
]
