"""NVIDIA dcgm-exporter as a source: ``DCGM_FI_*`` fields → ``gpu_samples`` rows (DeviceSample columns).

One row per GPU per scrape: ``kind="cuda"``, ``emulated=False``, ``source="dcgm:<url>"``, ``node`` the
collector's node (``phaselens collect --node``, default the host: the machine the GPU belongs to, as
for every other source), the exporter's own ``Hostname`` (old exporters) or ``hostname`` label in
``exporter_hostname``, and Kubernetes ``pod``/``namespace``/``container`` labels kept as
``k8s_pod``/``k8s_namespace``/``k8s_container``. DCGM writes "blank" sentinels for values it does not
have; they become ``None``. The rows are the store's wide ``gpu_samples`` input: it keeps kind, UUID,
model name, MIG identity and the Kubernetes labels in ``devices``, one row per change.

MIG: dcgm-exporter labels a GPU instance's series with the physical GPU's ``gpu``/``UUID`` plus
``GPU_I_ID`` and ``GPU_I_PROFILE``, and repeats whole-GPU fields (power, energy, clocks,
temperature) on every instance. Such a GPU gives one whole-GPU row (``cuda:N``: the GPU-level fields,
from its own series or else from its instances, once) and one row per instance (``cuda:N/gi<id>``,
``mig_instance_id``, ``mig_profile``, ``parent_uuid``; ``uuid`` NULL as DCGM does not export MIG
UUIDs) carrying only the per-instance fields (GR engine/SM/tensor/DRAM activity, framebuffer), so
``SUM(power_w)`` over a physical GPU's rows is its power.

DCGM fields without a column, and non-DCGM families, are counted as ``unmapped`` (once per family
per hour), never dropped silently.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from collector.sources.base import TABLE_GPU_SAMPLES, SourceResult, UnmappedFamilies
from collector.sources.exposition import PageSource, finite, parse_exposition
from collector.store.columns import RepeatedColumns
from collector.store.devices import PLACEMENT_ATTRIBUTES, STEADY_SAMPLE_COLUMNS
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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": DcgmField("gr_engine_active_pct", 100.0),
    "DCGM_FI_PROF_SM_ACTIVE": DcgmField("sm_active_pct", 100.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": DcgmField("sm_occupancy_pct", 100.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": DcgmField("tensor_active_pct", 100.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": DcgmField("dram_active_pct", 100.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": DcgmField("pcie_tx_bytes_per_s"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": DcgmField("pcie_rx_bytes_per_s"),
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
#: Columns a MIG instance has of its own (its slice of the engines and of the framebuffer); every
#: other mapped column describes the physical GPU and is stored once, on the whole-GPU row.
INSTANCE_COLUMNS: frozenset[str] = frozenset(
    {
        "gr_engine_active_pct",
        "sm_active_pct",
        "sm_occupancy_pct",
        "tensor_active_pct",
        "dram_active_pct",
        "mem_used_bytes",
        "mem_total_bytes",
    }
)

#: The columns of a gpu_samples row produced here (DeviceSample fields + where it came from).
GPU_ROW_COLUMNS: tuple[str, ...] = (
    "node",
    "source",
    *(f.name for f in dataclasses.fields(DeviceSample)),
    "gr_engine_active_pct",
    "pcie_tx_bytes_per_s",
    "pcie_rx_bytes_per_s",
    *PLACEMENT_ATTRIBUTES,
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


class GpuRowBuilder:
    """Collects DCGM field values per GPU (and MIG instance) and emits gpu_samples rows.

    ``node``: the node of every row (a direct scrape: the collector's); when None, the series'
    ``Hostname``/``hostname`` label or the ``default_node`` given to :meth:`add` (the Prometheus
    query path, which reads many machines). DCGM fields without a column are collected in
    :attr:`unmapped` for the source to count. A field given twice for one GPU (or MIG instance) in
    one snapshot (the same series twice, or series differing only in labels that are not the GPU's
    identity, e.g. one per Kubernetes pod sharing it) keeps the first value in page order and counts
    the others as ``duplicate_series`` (a warning; :attr:`duplicates`).
    """

    def __init__(
        self, source: str, default_node: str | None, result: SourceResult, *, node: str | None = None
    ) -> None:
        self.source = source
        self.default_node = default_node
        self.node = node
        self.result = result
        self.unmapped: set[str] = set()
        self.duplicates = 0  # values dropped: their GPU already had that field from an earlier series
        self._gpus: dict[tuple, dict[str, Any]] = {}

    def add(
        self,
        field: str,
        labels: dict[str, str],
        value: float,
        ts_s: float,
        default_node: str | None = None,
        *,
        stamped: bool = False,
    ) -> None:
        """Add one DCGM field value (``stamped``: ``ts_s`` is the exporter's own timestamp).

        ``default_node`` names the node when the series has no Hostname/hostname label
        (default: the builder's).
        """
        if field.endswith("_total") and field[:-6] in DCGM_FIELDS:  # parser's counter renaming
            field = field[:-6]
        if field not in DCGM_FIELDS and field not in _FB_FIELDS:
            self.unmapped.add(field.removesuffix("_total"))  # the family (DCGM names are upper case)
            return
        if not finite(value):
            self.result.count("non_finite", f"{field}{labels}: {value}", severity="warning")
            return
        node = self.node or _label(labels, _NODE_LABELS) or default_node or self.default_node
        key = (node, labels.get("gpu"), labels.get("UUID") or labels.get("uuid"), labels.get("GPU_I_ID", ""))
        gpu = self._gpus.get(key)
        if gpu is None:
            gpu = self._gpus[key] = {
                "labels": labels,
                "ts_s": ts_s,
                "fields": {},
                "k8s": {},
                "stamped": False,
            }
        for k in _K8S_LABELS:  # Kubernetes labels may sit on some fields only: keep the first seen
            if labels.get(k):
                gpu["k8s"].setdefault(k, labels[k])
        if field in gpu["fields"]:  # the same field of the same GPU again: the first series is kept
            self.duplicates += 1
            mig = f", GPU_I_ID {key[3]}" if key[3] else ""
            self.result.count(
                "duplicate_series",
                f"{field} of {node} gpu {key[1]} (UUID {key[2]}{mig}) more than once ({labels}); "
                "the first kept",
                severity="warning",
            )
            return
        gpu["ts_s"] = max(gpu["ts_s"], ts_s)
        gpu["stamped"] = gpu["stamped"] or stamped
        gpu["fields"][field] = None if is_blank(field, value) else value

    def rows(self) -> list[tuple[tuple, dict[str, Any]]]:
        """``(key, row)`` per whole GPU and per MIG instance seen."""
        return [(key, row) for key, row, _ in self.stamped_rows()]

    def stamped_rows(self) -> list[tuple[tuple, dict[str, Any], bool]]:
        """``(key, row, stamped)``: ``stamped`` when the row's time is the exporter's own timestamp."""
        physical: dict[tuple, dict[str, dict[str, Any]]] = {}
        for (node, gpu, uuid, mig), g in self._gpus.items():
            physical.setdefault((node, gpu, uuid), {})[mig] = g
        out: list[tuple[tuple, dict[str, Any], bool]] = []
        for (node, gpu, uuid), groups in physical.items():
            instances = {mig: g for mig, g in groups.items() if mig}
            whole = groups.get("")
            if not instances:
                row = self._row(node, gpu, uuid, whole, whole["fields"])
                out.append(((node, gpu, uuid, ""), row, whole["stamped"]))
                continue
            # A MIG-enabled GPU: GPU-level fields once, on the whole-GPU row; instances keep their own.
            fields: dict[str, float | None] = dict(whole["fields"]) if whole else {}
            for g in sorted(instances.values(), key=lambda g: -g["ts_s"]):
                for fname, v in g["fields"].items():
                    if _column(fname) not in INSTANCE_COLUMNS:
                        fields.setdefault(fname, v)
            base = whole or {
                "labels": next(iter(instances.values()))["labels"],
                "ts_s": max(g["ts_s"] for g in instances.values()),
                "stamped": any(g["stamped"] for g in instances.values()),
                "k8s": {},
            }
            out.append(((node, gpu, uuid, ""), self._row(node, gpu, uuid, base, fields), base["stamped"]))
            for mig, g in instances.items():
                own = {f: v for f, v in g["fields"].items() if _column(f) in INSTANCE_COLUMNS}
                row = self._row(node, gpu, uuid, g, own)
                row.update(
                    device=f"{row['device']}/gi{mig}",
                    uuid=None,
                    parent_uuid=uuid,
                    mig_instance_id=int(mig) if mig.isdigit() else None,
                    mig_profile=g["labels"].get("GPU_I_PROFILE") or None,
                )
                out.append(((node, gpu, uuid, mig), row, g["stamped"]))
        return out

    def _row(
        self, node: str | None, gpu: str | None, uuid: str | None, g: dict[str, Any], fields: dict[str, Any]
    ) -> dict[str, Any]:
        labels: dict[str, str] = g["labels"]
        index = int(gpu) if gpu is not None and gpu.isdigit() else None
        device = f"cuda:{gpu}" if gpu is not None else (labels.get("device") or "cuda")
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
            exporter_hostname=_label(labels, _NODE_LABELS),
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


def _column(field: str) -> str:
    spec = DCGM_FIELDS.get(field)
    return spec.column if spec is not None else "mem_total_bytes"  # the FB fields


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


class DcgmSource(PageSource):
    """Scrapes one dcgm-exporter ``/metrics`` endpoint (use :meth:`many` for several).

    ``node`` (default: this host) is the node of every row; ``scrape``: the page's deadline, size
    limit, client, clock and backoff (:class:`~collector.sources.exposition.PageSource`).
    dcgm-exporter refreshes its values every 30 s by default while this source may scrape every
    second: a GPU row whose values did not change (and whose exporter timestamp, where the
    exposition has one, did not move) is not stored again; such rows and scrapes are counted in
    :meth:`health_details` (``unchanged_rows``, ``unchanged_scrapes``), not as errors.
    """

    def __init__(self, url: str, *, node: str | None = None, interval_s: float = 1.0, **scrape: Any) -> None:
        super().__init__(f"dcgm:{url}", url, interval_s=interval_s, **scrape)
        self.node = node or socket.gethostname()
        self._last: dict[tuple, tuple[float, tuple]] = {}  # per row key: (ts_s, values) last stored
        self._unmapped = UnmappedFamilies()
        self._repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)
        self.unchanged_rows = 0
        self.unchanged_scrapes = 0
        self.duplicate_series = 0

    @classmethod
    def many(cls, urls: Iterable[str], **kwargs: Any) -> list[DcgmSource]:
        """One source per endpoint, so each has its own health and backoff."""
        return [cls(u, **kwargs) for u in urls]

    def _discover(self) -> bool:
        return "DCGM_FI_" in self._fetch()

    def _collect(self, now_s: float, result: SourceResult) -> None:
        text = self._fetch()
        builder = _map_exposition(text, self.name, self.node, now_s, result, self._unmapped)
        self.duplicate_series += builder.duplicates
        rows, unchanged = [], 0
        for key, row, stamped in builder.stamped_rows():
            what = f"{row['node']} {row['device']}"
            values = tuple(v for k, v in row.items() if k != "ts_s")
            last = self._last.get(key)
            ts = row["ts_s"]
            if last is not None and ts < last[0]:
                result.count("clock_backwards", f"{what}: ts {ts:.3f} < last {last[0]:.3f}; row dropped")
                continue
            if last is not None and (ts == last[0] if stamped else values == last[1]):
                unchanged += 1  # the exporter has not refreshed since the last scrape
                continue
            if last is not None and ts == last[0]:
                result.count("duplicate_timestamp", f"{what}: ts {ts:.3f} repeated", severity="info")
                continue
            self._last[key] = (ts, values)
            rows.append(row)
        self.unchanged_rows += unchanged
        if unchanged and not rows:
            self.unchanged_scrapes += 1
        # as columns, the GPUs' identity handed on while unchanged (see ``SourceResult.add_samples``)
        result.add_samples(TABLE_GPU_SAMPLES, rows, repeats=self._repeats)

    def health_details(self) -> dict[str, Any]:
        return {
            "unchanged_scrapes": self.unchanged_scrapes,
            "unchanged_rows": self.unchanged_rows,
            "unmapped_families": len(self._unmapped),
            "duplicate_series": self.duplicate_series,
        }


def rows_from_text(
    text: str, *, source: str = "dcgm:test", node: str | None = None, ts_s: float = 0.0
) -> SourceResult:
    """Map one exposition text to gpu_samples rows without any HTTP (handy for tools and tests).

    ``node`` None takes each series' Hostname/hostname label as its node.
    """
    result = SourceResult(source, ts_s)
    builder = _map_exposition(text, source, node, ts_s, result, UnmappedFamilies())
    result.add_samples(TABLE_GPU_SAMPLES, [row for _, row in builder.rows()])
    return result


def _map_exposition(
    text: str, source: str, node: str | None, now_s: float, result: SourceResult, unmapped: UnmappedFamilies
) -> GpuRowBuilder:
    builder = GpuRowBuilder(source, None, result, node=node)
    others: set[str] = set()
    for s in parse_exposition(text, result):
        if s.name.endswith("_created"):
            continue  # a counter's creation time: metadata, not a metric
        if not is_dcgm_field(s.name):
            others.add(s.stem)
            continue
        stamped = s.timestamp_s is not None
        builder.add(s.name, s.labels, s.value, s.timestamp_s if stamped else now_s, stamped=stamped)
    unmapped.count(builder.unmapped, now_s, result, "DCGM field without a gpu_samples column")
    unmapped.count(others, now_s, result, "not a DCGM field")
    return builder


__all__ = [
    "DCGM_FIELDS",
    "GPU_ROW_COLUMNS",
    "INSTANCE_COLUMNS",
    "ClockGuard",
    "DcgmField",
    "DcgmSource",
    "GpuRowBuilder",
    "is_blank",
    "rows_from_text",
]
