"""What a power calibration is keyed by, and when a stored one no longer applies.

A calibration measures one GPU model under one driver running one engine: the model (an emulated
GPU's modeled shape), its dtype, the TP and the engine's version. Any of them changing moves the
curves (a new driver's boost table, another engine's kernels), so a record whose fingerprint differs
from the running stack's is **stale** and never used (:func:`stale_reason`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from phaselens.power.plan import CalibrateError

FIELDS = ("gpu_model", "driver", "model", "dtype", "tp", "engine_version")


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """The GPU model (NVML name), the driver, and the engine: model, dtype, TP, engine version."""

    gpu_model: str
    driver: str | None
    model: str
    dtype: str | None
    tp: int | None
    engine_version: str | None

    @property
    def key(self) -> str:
        """A short hash of every field (the ``fingerprint`` column)."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fingerprint": self.key}

    def text(self) -> str:
        return (
            f"{self.gpu_model} (driver {self.driver or '?'}), {self.model} {self.dtype or '?'} TP {self.tp or '?'}, "
            f"{self.engine_version or 'engine ?'}"
        )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Fingerprint:
        return cls(*(row.get(f) for f in FIELDS))  # type: ignore[arg-type]


def of_worker(worker: dict[str, Any], knobs: dict[str, Any]) -> Fingerprint:
    """A live worker's fingerprint: its ``GET /control/layout`` entry (``fingerprint``: model, dtype,
    TP, engine version) and its knob read (``gpu_name``, ``driver_version``)."""
    fp = worker.get("fingerprint") or {}
    if not fp.get("model"):
        raise CalibrateError(
            f"worker {worker.get('id')} reports no engine fingerprint (model, dtype, TP, engine version): "
            "the stack is older than this phaselens; restart it with this version"
        )
    return Fingerprint(
        gpu_model=str(knobs.get("gpu_name") or worker.get("device_name") or worker.get("device")),
        driver=knobs.get("driver_version"),
        model=str(fp["model"]),
        dtype=fp.get("dtype"),
        tp=int(fp["tp"]) if fp.get("tp") is not None else None,
        engine_version=fp.get("engine_version"),
    )


def stale_reason(record: dict[str, Any], current: Fingerprint) -> str | None:
    """Why ``record`` (a ``power_calibrations`` row) does not describe ``current``, else None."""
    if record.get("fingerprint") == current.key:
        return None
    was = Fingerprint.from_row(record)
    changed = [
        f"{f} {getattr(was, f)!r} → {getattr(current, f)!r}"
        for f in FIELDS
        if getattr(was, f) != getattr(current, f)
    ]
    return "the stack changed since it was calibrated: " + ("; ".join(changed) or "fingerprint differs")
