"""Plain JSON values out of analysis results (numpy scalars, NaN, infinities, tuples) and their tables."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def json_safe(obj: Any, *, inf_as_text: bool = False) -> Any:
    """``obj`` with numpy scalars made Python values, dict keys strings, tuples and sets lists,
    NaN as null, and infinities as null (or ``"+Inf"``/``"-Inf"`` with ``inf_as_text``, as a
    Prometheus bucket bound is written)."""
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        if inf_as_text and not math.isnan(obj):
            return "+Inf" if obj > 0 else "-Inf"
        return None
    if isinstance(obj, dict):
        return {str(k): json_safe(v, inf_as_text=inf_as_text) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [json_safe(v, inf_as_text=inf_as_text) for v in obj]
    return obj


def json_cell(v: Any) -> Any:
    """A table cell as a JSON value: numpy scalars as Python ones, NaN / NA / NaT as None, lists and
    arrays cell by cell."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, list | tuple | np.ndarray):
        return [json_cell(x) for x in v]
    return v


def table_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A result table as JSON-ready records (:func:`json_cell` on every cell)."""
    return [{k: json_cell(v) for k, v in rec.items()} for rec in df.to_dict(orient="records")]


def tables_dict(result: Any, **between: Any) -> dict[str, Any]:
    """The JSON form of a result with ``window``, ``per_gpu`` / ``per_pool`` / ``per_hour`` tables,
    ``trust`` and ``missing`` (:class:`analytics.attribution.PhaseBreakdown`,
    :class:`analytics.bimodal.IdleSplit`), in that order, with ``between`` after the tables."""
    return {
        "window": result.window.describe(),
        "per_gpu": table_records(result.per_gpu),
        "per_pool": table_records(result.per_pool),
        "per_hour": table_records(result.per_hour),
        **between,
        "trust": result.trust.to_dict(),
        "missing": list(result.missing),
    }
