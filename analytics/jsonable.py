"""Plain JSON values out of analysis results (numpy scalars, NaN, infinities, tuples)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


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
