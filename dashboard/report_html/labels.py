"""Field names as people read them: one mapping from a summary field's name to its label and unit,
used wherever the report prints a field (the appendix's tables and rows).

:func:`field_label` gives ``Energy, prefill (J)`` for ``energy_j_prefill``, ``TTFT p90 (s)`` for
``ttft_p90_s``, ``Idle (%)`` for ``frac_idle``; :func:`field_unit` the unit and the factor its
values are multiplied by to be shown in it (shares as percentages, milliseconds as seconds, joules
of a whole window as kWh).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Unit:
    """How a field's values are shown: the unit's symbol and the factor applied to the value."""

    symbol: str
    scale: float = 1.0


# the unit words a field name carries (anywhere in it: ``energy_j_prefill``, ``ttft_p90_s``)
_UNITS: dict[str, Unit] = {
    "s": Unit("s"),
    "ms": Unit("s", 1e-3),  # seconds, not 9,063 ms
    "pct": Unit("%"),
    "w": Unit("W"),
    "j": Unit("J"),
    "wh": Unit("Wh"),
    "kwh": Unit("kWh"),
    "usd": Unit("$"),
    "mhz": Unit("MHz"),
    "bytes": Unit("bytes"),
    "mib": Unit("MiB"),
    "gib": Unit("GiB"),
    "rps": Unit("requests/s"),
    "c": Unit("°C"),
}
# what a quantity in a unit is called when the name starts with the unit (``j_per_token``)
_QUANTITY = {"j": "Energy", "kwh": "Energy", "wh": "Energy", "usd": "Cost", "w": "Power", "s": "Time"}
_SPELLED = {"s": "second", "ms": "millisecond", "j": "joule", "w": "watt", "usd": "dollar", "h": "hour"}
_WORDS = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "e2e": "end-to-end",
    "gpu": "GPU",
    "gpus": "GPUs",
    "sm": "SM",
    "kv": "KV",
    "slo": "SLO",
    "slos": "SLOs",
    "dram": "DRAM",
    "pue": "PUE",
    "tp": "TP",
    "id": "ID",
    "uuid": "UUID",
    "1m": "1M",
    "mfu": "MFU",
    "nvml": "NVML",
    "rmse": "RMSE",
}
_SHARE_PREFIXES = ("frac", "share")
_FIELD = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")

#: names whose generic reading is not what a person calls them
LABELS: dict[str, tuple[str, str]] = {
    "usd_per_1m_tokens": ("Cost per 1M tokens", "$"),
    "usd_per_1m_output_tokens": ("Cost per 1M output tokens", "$"),
    "j_per_token": ("Energy per token", "J"),
    "energy_per_token_j": ("Energy per token", "J"),
    "tokens_per_j": ("Tokens per joule", ""),
    "usd_per_year": ("Cost per year", "$"),
    "usd_per_h": ("Cost per hour", "$"),
    "gpu_s": ("GPU-time", "s"),
    "gpu_seconds": ("GPU-time", "s"),
    "gpu_hours": ("GPU-time", "GPU-hours"),
    "n": ("Count", ""),
    "dip_p": ("Dip test p-value", ""),
    "dip": ("Dip statistic", ""),
    "pue": ("PUE", ""),
    "electricity_usd_per_kwh": ("Electricity price", "$/kWh"),
    "r2": ("R²", ""),
}
_UNIT_OF_LABELLED = {
    "$/kWh": Unit("$/kWh"),
    "$": Unit("$"),
    "J": Unit("J"),
    "s": Unit("s"),
    "GPU-hours": Unit("GPU-hours"),
}


def _word(token: str) -> str:
    return _WORDS.get(token, token)


def _split(key: str) -> tuple[list[str], str | None, list[str], bool]:
    """The words before the unit, the unit word, the words after it, whether it is a share."""
    tokens = [t for t in str(key).lower().split("_") if t]
    share = bool(tokens) and tokens[0] in _SHARE_PREFIXES and len(tokens) > 1
    if share:
        return tokens[1:], None, [], True
    for i in range(len(tokens) - 1, -1, -1):  # the last unit word (``ttft_p90_s``: s)
        if tokens[i] in _UNITS and len(tokens) > 1:
            return tokens[:i], tokens[i], tokens[i + 1 :], False
    return tokens, None, [], False


def is_field_name(key: str) -> bool:
    """A snake_case field name (``energy_j_prefill``), not an identifier used as a key (a GPU's
    ``sim:x|simulated|h200|0``, ``NVIDIA H200``): only field names are relabelled."""
    return bool(_FIELD.fullmatch(str(key)))


def field_unit(key: str) -> Unit | None:
    """The unit a field's values are shown in (and the factor to apply), None for a plain number."""
    if not is_field_name(key):
        return None
    if key in LABELS:
        return _UNIT_OF_LABELLED.get(LABELS[key][1])
    before, unit, _, share = _split(key)
    if share:
        return Unit("%", 100.0)
    if unit is None or (before and before[-1] == "per"):
        return None
    return _UNITS[unit]


def field_label(key: str) -> str:
    """A field's label with its unit: ``energy_j_prefill`` → ``Energy, prefill (J)``,
    ``output_tokens_per_s`` → ``Output tokens per second``, ``frac_idle`` → ``Idle (%)``."""
    if not is_field_name(key):
        return str(key)
    if key in LABELS:
        label, unit = LABELS[key]
        return f"{label} ({unit})" if unit else label
    before, unit, after, share = _split(key)
    if unit is not None and before and before[-1] == "per":  # a rate: tokens per second
        text = " ".join(_word(t) for t in before) + " " + _SPELLED.get(unit, _UNITS[unit].symbol)
        if after:
            text += ", " + " ".join(_word(t) for t in after)
        return _cap(text)
    if unit is not None and not before:  # ``j_per_token``: the unit's quantity
        text = " ".join([_QUANTITY.get(unit, "Value"), *(_word(t) for t in after)])
        return f"{_cap(text)} ({_UNITS[unit].symbol})"
    text = " ".join(_word(t) for t in before) or str(key)
    if after:
        text += ", " + " ".join(_word(t) for t in after)
    symbol = "%" if share else (_UNITS[unit].symbol if unit else "")
    return f"{_cap(text)} ({symbol})" if symbol else _cap(text)


def _cap(text: str) -> str:
    text = text.replace("_", " ").strip()
    return text[:1].upper() + text[1:] if text[:1].islower() and not text[:2].isupper() else text
