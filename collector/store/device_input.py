"""The rows of wide ``gpu_samples`` input that the devices bookkeeping must look at.

A run of column blocks that polls the same GPUs, unchanged, needs its first block only (with
each GPU's earliest ts); anything else every row (collector/store/devices.py keeps the registry).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

from collector.store.arrow_input import decoded_table
from collector.store.columns import ColumnRun
from collector.store.devices import DEVICE_ATTRIBUTES, DEVICE_KEY

DEVICE_INPUT = (*DEVICE_KEY, *DEVICE_ATTRIBUTES, "ts_s")  # what the devices rows are worked out from

Span = tuple[int, int, int]  # (first row, rows, rows per block when only the first block counts else 0)


def device_spans(runs: Sequence[ColumnRun]) -> list[Span]:
    """Per run of gpu_samples blocks, the rows whose device attributes the flush must look at: a
    run whose device key and attribute columns are one shared ``repeats`` object and constants
    (the same GPUs, unchanged, poll after poll) needs its first block only, with each GPU's
    earliest ts; any other run all its rows."""
    spans: list[Span] = []
    offset = 0
    for run in runs:
        rows = run.rows
        first = run.blocks[0]
        per_block = first.n if len(run.blocks) > 1 and run.repeats and _same_devices(run) else 0
        spans.append((offset, rows, per_block))
        offset += rows
    return spans


def _same_devices(run: ColumnRun) -> bool:
    """Whether every block of ``run`` holds the same GPUs with the same attributes, each once."""
    first = run.blocks[0]
    constants = [b.constants for b in run.blocks]
    if constants.count(first.constants) != len(constants):  # e.g. polls of two nodes in one run
        return False
    keyed: list[Any] = []
    for name in DEVICE_INPUT[:-1]:  # all but ts_s
        if name in run.keys:
            return False
        if name in DEVICE_KEY:
            keyed.append(
                run.repeats[name] if name in run.repeats else repeat(first.constants.get(name), first.n)
            )
    return len(set(zip(*keyed, strict=False))) == first.n  # no GPU twice in one poll (repeat: endless)


def device_input(data: pa.Table, spans: Sequence[Span] | None) -> pa.Table:
    """The rows of wide gpu_samples ``data`` that the devices bookkeeping must see."""
    wide = data.select(DEVICE_INPUT)
    if spans is None or not any(per_block for _, _, per_block in spans):
        return decoded_table(wide)
    ts = data.column("ts_s").to_numpy()
    rows, times = [], []
    for offset, n, per_block in spans:
        if per_block:
            rows.append(np.arange(offset, offset + per_block))
            times.append(ts[offset : offset + n].reshape(-1, per_block).min(axis=0))
        else:
            rows.append(np.arange(offset, offset + n))
            times.append(ts[offset : offset + n])
    wide = decoded_table(wide.take(pa.array(np.concatenate(rows))))
    return wide.set_column(len(DEVICE_INPUT) - 1, "ts_s", pa.array(np.concatenate(times)))
