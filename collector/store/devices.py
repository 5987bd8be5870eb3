"""Which device attributes were in effect when: the writer's copy of the ``devices`` table.

Samples arrive "wide": a :class:`~serving.devices.base.DeviceSample` (kind, uuid, name), a
dcgm-exporter row with Kubernetes labels, a Parquet export of the version-5 ``gpu_samples``. Those
attributes (and the serving worker and role owning a GPU) rarely change, so the store keeps them out of ``gpu_samples``: ``devices`` gets one row
per GPU -- ``(node, source, device, index)`` -- each time its attributes are first seen or change,
valid from ``since_s``, the ts of the first sample with them. :class:`DeviceRegistry` holds every
GPU's rows in memory (loaded from the table when the store opens) and works out, per batch, which
rows ``devices`` lacks.

Every source delivers a GPU's samples in time order. A late sample (older than its GPU's newest
``devices`` row) is compared with the attributes in effect at its own time; when they differ it
starts a row of its own, which then also covers the later samples up to the next row.
"""

from __future__ import annotations

import bisect
from operator import itemgetter
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

DEVICE_KEY: tuple[str, ...] = ("node", "source", "device", "index")
#: Where an exporter's GPU runs (its Kubernetes pod, its MIG parent and instance, the exporter's
#: host): the devices attributes a dcgm-exporter page carries beside the sample.
PLACEMENT_ATTRIBUTES: tuple[str, ...] = (
    "k8s_pod",
    "k8s_namespace",
    "k8s_container",
    "parent_uuid",
    "mig_instance_id",
    "mig_profile",
    "exporter_hostname",
)
DEVICE_ATTRIBUTES: tuple[str, ...] = (
    "kind",
    "uuid",
    "name",
    "emulated",
    *PLACEMENT_ATTRIBUTES,
    "worker",  # the serving worker owning the GPU, and its role (prefill | decode | mixed)
    "role",
)
#: A GPU's identity in wide gpu_samples input (its devices row's key and attributes): the same poll
#: after poll, so sources hand these columns on as ``ColumnBlock.repeats``.
IDENTITY_COLUMNS: tuple[str, ...] = (*DEVICE_KEY, *DEVICE_ATTRIBUTES)
#: gpu_samples columns that usually keep their values from poll to poll (shared like the identity
#: until one changes: ``RepeatedColumns(steady=...)``).
STEADY_SAMPLE_COLUMNS: tuple[str, ...] = (
    "power_limit_w",
    "mem_total_bytes",
    "mem_clock_mhz",
    "clock_event_reasons",
    "locked_sm_clock_min_mhz",
    "locked_sm_clock_max_mhz",
    "lost",
)
#: Attribute columns of a wide gpu_samples input that ``gpu_samples`` does not have (``emulated``
#: stays on every sample row).
SPLIT_COLUMNS: tuple[str, ...] = tuple(c for c in DEVICE_ATTRIBUTES if c != "emulated")

Key = tuple[Any, ...]  # (node, source, device, index)
_first = itemgetter(0)
Attributes = tuple[Any, ...]  # values of DEVICE_ATTRIBUTES


class DeviceRegistry:
    """Every GPU's attribute history, ``since_s`` ascending; not thread-safe (the store's lock guards it)."""

    __slots__ = ("_attrs", "_since")

    def __init__(self) -> None:
        self._since: dict[Key, list[float]] = {}
        self._attrs: dict[Key, list[Attributes]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._since.values())

    def load(self, con: duckdb.DuckDBPyConnection) -> None:
        """Replace the contents with the ``devices`` rows committed in ``con``'s database."""
        names = ", ".join(f'"{c}"' for c in (*DEVICE_KEY, "since_s", *DEVICE_ATTRIBUTES))
        rows = con.execute(f"SELECT {names} FROM devices ORDER BY since_s").fetchall()
        self.clear()
        n = len(DEVICE_KEY)
        for row in rows:
            self._add(tuple(row[:n]), row[n], tuple(row[n + 1 :]))

    def clear(self) -> None:
        """Forget everything: the next sample of every GPU then writes a ``devices`` row again."""
        self._since.clear()
        self._attrs.clear()

    def in_effect(self, key: Key, ts_s: float) -> Attributes | None:
        """The attributes of GPU ``key`` at ``ts_s`` (None before its first row)."""
        since = self._since.get(key)
        if not since:
            return None
        i = bisect.bisect_right(since, ts_s) - 1
        return self._attrs[key][i] if i >= 0 else None

    def note(self, devices: pa.Table) -> None:
        """Record ``devices`` rows that are about to be written (a direct append to the table)."""
        for row in devices.select([*DEVICE_KEY, "since_s", *DEVICE_ATTRIBUTES]).to_pylist():
            self._add(
                tuple(row[c] for c in DEVICE_KEY),
                row["since_s"],
                tuple(row[c] for c in DEVICE_ATTRIBUTES),
            )

    def changes(self, samples: pa.Table) -> list[dict[str, Any]]:
        """The ``devices`` rows that a batch of wide samples adds, recorded as written.

        ``samples`` has every column of :data:`DEVICE_KEY`, :data:`DEVICE_ATTRIBUTES` and ``ts_s``.
        Per GPU the batch is cut into runs of unchanged attributes; a run whose attributes differ
        from those in effect at its first sample starts a row.
        """
        if samples.num_rows == 0:
            return []
        runs = _runs_row_by_row(samples) if samples.num_rows <= _SMALL_BATCH else _runs_grouped(samples)
        new: list[dict[str, Any]] = []
        for key, spans in runs.items():
            for since, attrs in spans:
                if self.in_effect(key, since) != attrs:
                    self._add(key, since, attrs)
                    new.append(
                        {
                            **dict(zip(DEVICE_KEY, key, strict=True)),
                            "since_s": since,
                            **dict(zip(DEVICE_ATTRIBUTES, attrs, strict=True)),
                        }
                    )
        return new

    def _add(self, key: Key, since_s: float, attrs: Attributes) -> None:
        since = self._since.setdefault(key, [])
        i = bisect.bisect_right(since, since_s)
        since.insert(i, since_s)
        self._attrs.setdefault(key, []).insert(i, attrs)


Runs = dict[Key, list[tuple[float, Attributes]]]  # per GPU: (first ts, attributes) of each run
_SMALL_BATCH = 2_000  # rows up to which a Python loop costs less than an Arrow group-by
_VARYING = object()


def _runs_row_by_row(samples: pa.Table) -> Runs:
    """Each GPU's runs of unchanged attributes, oldest first, looking at every row."""
    n = len(DEVICE_KEY)
    seen: dict[Key, list[tuple[float, Attributes]]] = {}
    columns = [samples.column(c).to_pylist() for c in (*DEVICE_KEY, *DEVICE_ATTRIBUTES)]
    for ts, *values in zip(samples.column("ts_s").to_pylist(), *columns, strict=True):
        seen.setdefault(tuple(values[:n]), []).append((ts, tuple(values[n:])))
    runs: Runs = {}
    for key, rows in seen.items():
        rows.sort(key=_first)  # stable: rows of equal ts keep their order
        spans = runs[key] = []
        for ts, attrs in rows:
            if not spans or attrs != spans[-1][1]:
                spans.append((ts, attrs))
    return runs


def _runs_grouped(samples: pa.Table) -> Runs:
    """Each GPU's runs of unchanged attributes from an Arrow group-by (GPUs whose attributes
    changed inside the batch are looked at row by row)."""
    columns = [*DEVICE_KEY, *DEVICE_ATTRIBUTES]
    constant = {c: v for c in columns if (v := _constant(samples.column(c))) is not _VARYING}
    varying = [c for c in columns if c not in constant]
    if not varying:
        groups = [{"ts_s_min": pc.min(samples.column("ts_s")).as_py()}]
    else:
        groups = (
            samples.select([*varying, "ts_s"])
            .group_by(varying, use_threads=False)
            .aggregate([("ts_s", "min")])
            .to_pylist()
        )
    runs: Runs = {}
    for group in groups:
        values = {**constant, **group}
        key = tuple(values[c] for c in DEVICE_KEY)
        runs.setdefault(key, []).append((values["ts_s_min"], tuple(values[c] for c in DEVICE_ATTRIBUTES)))
    for key, spans in runs.items():
        if len(spans) > 1:  # the attributes changed inside the batch: find each change
            runs[key] = _runs_row_by_row(samples.filter(_rows_of(samples, key)))[key]
    return runs


def _rows_of(samples: pa.Table, key: Key) -> pa.ChunkedArray:
    """Mask of the rows of GPU ``key``."""
    mask = None
    for name, value in zip(DEVICE_KEY, key, strict=True):
        col = samples.column(name)
        cond = pc.is_null(col) if value is None else pc.fill_null(pc.equal(col, value), False)
        mask = cond if mask is None else pc.and_(mask, cond)
    return mask


def _constant(column: pa.ChunkedArray) -> Any:
    """The one value of ``column`` (None when all NULL), or ``_VARYING``: a constant column needs
    no hashing (node and source are constant in every append, the k8s labels often all NULL)."""
    if column.null_count == len(column):
        return None
    if column.null_count:
        return _VARYING
    first = column[0]
    if not column[-1].equals(first) or not pc.all(pc.equal(column, first)).as_py():
        return _VARYING
    return first.as_py()
