"""The price table cost figures are computed with: GPU $/hour per GPU model, electricity $/kWh, PUE.

Every default has a source (``DEFAULT_SOURCES``; docs/analytics/cost.md). A TOML or JSON file and
keyword arguments override them::

    electricity_usd_per_kwh = 0.08
    pue = 1.2
    [gpu_usd_per_hour]
    "NVIDIA H100 80GB HBM3" = 2.49

GPU names are the store's (``devices.name``: NVML's name, e.g. ``NVIDIA H100 80GB HBM3``). An
emulated or simulated GPU (``... (emulated)``, ``... (simulated)``) is priced as the GPU it models
unless the table names it itself.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analytics.window import AnalyticsError

MODELED_SUFFIXES = (" (emulated)", " (simulated)")

#: GPU on-demand $/GPU-hour by the store's GPU name.
DEFAULT_GPU_USD_PER_HOUR: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 2.00,
    "NVIDIA H200": 2.60,
    "NVIDIA A100-SXM4-80GB": 1.49,
}
#: US commercial-sector average retail electricity price, 2025.
DEFAULT_ELECTRICITY_USD_PER_KWH = 0.13
#: Average annual data-centre PUE.
DEFAULT_PUE = 1.56

DEFAULT_SOURCES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": (
        "H100 SXM5 $1.99–2.50/GPU-h on-demand at specialty/long-tail clouds, May 2026: Mercatus, "
        "'Cloud GPU pricing' (https://www.mercatus-ai.com/blog/cloud-gpu-pricing); the low end"
    ),
    "NVIDIA H200": (
        "H200 SXM5 $2.50–3.50/GPU-h on-demand at specialty/long-tail clouds, May 2026: Mercatus, "
        "'Cloud GPU pricing' (https://www.mercatus-ai.com/blog/cloud-gpu-pricing); near the low end"
    ),
    "NVIDIA A100-SXM4-80GB": (
        "A100 80GB SXM $1.49–2.49/GPU-h typical on-demand range early 2026 (Lambda, CoreWeave, RunPod): "
        "pricegpu, 'H100 vs A100 cloud pricing' (https://pricegpu.pages.dev/blog/h100-vs-a100-cloud-price); "
        "the low end, like the H100 figure"
    ),
    "electricity_usd_per_kwh": (
        "US EIA Electric Power Monthly, table 5.6.A: average retail price to the commercial sector "
        "≈ 13 ¢/kWh (2025) (https://www.eia.gov/electricity/monthly/epm_table_grapher.php?t=epmt_5_6_a)"
    ),
    "pue": (
        "Uptime Institute Global Data Center Survey 2024: average annual PUE 1.56 "
        "(https://uptimeinstitute.com/resources/research-and-reports/uptime-institute-global-data-center-survey-results-2024)"
    ),
}

_KEYS = ("gpu_usd_per_hour", "electricity_usd_per_kwh", "pue")


class PriceError(AnalyticsError):
    """A price table value or file is unusable; the message names the key and what is allowed."""


@dataclass(frozen=True, slots=True)
class PriceTable:
    """GPU $/GPU-hour per GPU name, electricity $/kWh, PUE (facility energy / IT energy, ≥ 1).

    ``sources`` says where each value came from (a default's citation, a file, an argument)."""

    gpu_usd_per_hour: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_GPU_USD_PER_HOUR))
    electricity_usd_per_kwh: float = DEFAULT_ELECTRICITY_USD_PER_KWH
    pue: float = DEFAULT_PUE
    sources: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SOURCES))

    def __post_init__(self) -> None:
        _check_price("electricity_usd_per_kwh", self.electricity_usd_per_kwh)
        if not (isinstance(self.pue, int | float) and math.isfinite(self.pue) and self.pue >= 1.0):
            raise PriceError(f"pue must be a number >= 1 (facility energy / IT energy), got {self.pue!r}")
        for name, price in self.gpu_usd_per_hour.items():
            if not isinstance(name, str) or not name:
                raise PriceError(f"gpu_usd_per_hour keys must be GPU names, got {name!r}")
            _check_price(f"gpu_usd_per_hour[{name!r}]", price)

    def gpu_price(self, gpu_name: str | None) -> float | None:
        """$/GPU-hour of ``gpu_name``: its own entry, else the GPU an emulated/simulated one models;
        None when the table has neither (the caller reports the GPU as unpriced)."""
        if not gpu_name:
            return None
        if gpu_name in self.gpu_usd_per_hour:
            return float(self.gpu_usd_per_hour[gpu_name])
        for suffix in MODELED_SUFFIXES:
            if gpu_name.endswith(suffix):
                base = gpu_name.removesuffix(suffix)
                if base in self.gpu_usd_per_hour:
                    return float(self.gpu_usd_per_hour[base])
        return None

    def energy_usd(self, energy_j: float) -> float:
        """Dollars for ``energy_j`` joules at the GPU: J / 3.6e6 = kWh, × PUE × $/kWh."""
        return energy_j / 3.6e6 * self.pue * self.electricity_usd_per_kwh

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_usd_per_hour": dict(self.gpu_usd_per_hour),
            "electricity_usd_per_kwh": self.electricity_usd_per_kwh,
            "pue": self.pue,
            "sources": dict(self.sources),
        }


def _check_price(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PriceError(f"{key} must be a finite number >= 0 (US dollars), got {value!r}")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as e:
        raise PriceError(f"price file {path}: cannot be read: {e}") from e
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        elif path.suffix.lower() == ".toml":
            data = tomllib.loads(text.decode())
        else:
            raise PriceError(f"price file {path}: use a .toml or .json file")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise PriceError(f"price file {path}: not valid {path.suffix[1:].upper()}: {e}") from e
    if not isinstance(data, dict):
        raise PriceError(f"price file {path}: expected a table/object with keys {', '.join(_KEYS)}")
    return data


def load_prices(path: str | Path | None = None, **overrides: Any) -> PriceTable:
    """The default price table, overridden by the file at ``path`` (TOML or JSON, keys
    ``gpu_usd_per_hour`` (a table GPU name → $/h, merged into the defaults), ``electricity_usd_per_kwh``,
    ``pue``), then by ``overrides`` (the same keys). Unknown keys and bad values raise
    :class:`PriceError` naming the key and what is allowed."""
    gpu = dict(DEFAULT_GPU_USD_PER_HOUR)
    values: dict[str, Any] = {}
    sources = dict(DEFAULT_SOURCES)
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if path is not None:
        layers.append((f"file {path}", _read_file(Path(path))))
    if overrides:
        layers.append(("argument", overrides))
    for origin, layer in layers:
        for key, value in layer.items():
            if key not in _KEYS:
                raise PriceError(f"unknown price key {key!r} ({origin}); allowed: {', '.join(_KEYS)}")
            if key == "gpu_usd_per_hour":
                if not isinstance(value, Mapping):
                    raise PriceError(
                        f"gpu_usd_per_hour ({origin}) must be a table of GPU name → $/GPU-hour, got {value!r}"
                    )
                for name, price in value.items():
                    _check_price(f"gpu_usd_per_hour[{name!r}]", price)
                    gpu[str(name)] = float(price)
                    sources[str(name)] = origin
            else:
                values[key] = value
                sources[key] = origin
    try:
        return replace(PriceTable(), gpu_usd_per_hour=gpu, sources=sources, **values)
    except TypeError as e:  # pragma: no cover - keys are checked above
        raise PriceError(str(e)) from e
