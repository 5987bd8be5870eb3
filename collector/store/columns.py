"""Rows handed over as columns: what a source produces per poll, and its typed Arrow build.

A :class:`ColumnBlock` is one poll's rows of one table: equal-length value lists per column plus
``constants`` (one value for every row: the node, the source). Cheap for a source to make (no
Arrow per poll: a poll of 8 GPUs would pay more for 27 small Arrow arrays than for its data). The
collector's writer hands all the blocks of a flush to ``Store.append_columns``, which builds each
column once, with the table's own Arrow type (``pa.array(values, type=...)``: no per-value type
inference). A list of dicts, by contrast, is pivoted row by row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import Any

import numpy as np
import pyarrow as pa


@dataclass(frozen=True, slots=True)
class ColumnBlock:
    """``n`` rows of one table as columns: ``values[name]`` has ``n`` values, ``constants[name]``
    is the value of every row. A column in neither is NULL (or the table's default)."""

    n: int
    values: Mapping[str, Sequence[Any]]
    constants: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, values: Mapping[str, Sequence[Any]], constants: Mapping[str, Any] | None = None
    ) -> ColumnBlock:
        """A block from value lists of equal length; ValueError naming the lengths otherwise."""
        lengths = {name: len(v) for name, v in values.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of one block must have equal lengths, got {lengths}")
        constants = dict(constants or {})
        both = set(values) & set(constants)
        if both:
            raise ValueError(f"column(s) {sorted(both)} given both as values and as constants")
        n = next(iter(lengths.values())) if lengths else 0
        return cls(n, dict(values), constants)

    @property
    def names(self) -> list[str]:
        return [*self.values, *self.constants]


Encode = Callable[[Any], Any]  # per-value encoding before the Arrow build (JSON text), or None


def block_names(blocks: Sequence[ColumnBlock]) -> list[str]:
    """Every column name of ``blocks``, in first-seen order."""
    return list(dict.fromkeys(chain.from_iterable(b.names for b in blocks)))


def build_columns(
    blocks: Sequence[ColumnBlock],
    types: Mapping[str, pa.DataType | None],
    encoders: Mapping[str, Encode] | None = None,
) -> dict[str, pa.Array]:
    """Every column of ``blocks`` as one Arrow array of ``types[name]`` (None: inferred).

    Python work is per run of blocks with the same column names, not per block and column: a
    run's value lists are transposed at once (``zip``) and each column is joined in C
    (``chain``), then built by Arrow with its type. A column that is a constant in every block is
    built from its distinct values and the block lengths. ``encoders[name]`` maps each value
    first (JSON text). Raises what ``pa.array`` raises, with the column's name in ``.column``.
    """
    encoders = encoders or {}
    runs: list[tuple[tuple[str, ...], list[ColumnBlock]]] = []
    for b in blocks:
        keys = tuple(b.values)
        if runs and runs[-1][0] == keys:
            runs[-1][1].append(b)
        else:
            runs.append((keys, [b]))
    in_values = set(chain.from_iterable(keys for keys, _ in runs))
    parts: dict[str, list[Any]] = {name: [] for name in in_values}
    for keys, run in runs:
        columns = zip(*(b.values.values() for b in run), strict=True) if len(keys) else ()
        for name, lists in zip(keys, columns, strict=True):
            parts[name].append(lists)
        for name in in_values.difference(keys):  # given as a constant, or absent, in this run
            parts[name].append([repeat(b.constants.get(name), b.n) for b in run])
    out: dict[str, pa.Array] = {}
    for name in block_names(blocks):
        try:
            if name not in in_values and name not in encoders:
                out[name] = _constant_column(name, blocks, types[name])
                continue
            if len(parts[name]) == 1 and len(parts[name][0]) == 1 and name not in encoders:
                out[name] = pa.array(parts[name][0][0], type=types[name])  # one block: its own list
                continue
            values: Any = chain.from_iterable(chain.from_iterable(parts[name]))
            if name in encoders:
                values = map(encoders[name], values)
            out[name] = pa.array(list(values), type=types[name])
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            e.column = name  # type: ignore[attr-defined]
            raise
    return out


def _constant_column(name: str, blocks: Sequence[ColumnBlock], arrow_type: pa.DataType | None) -> pa.Array:
    """A column that is one value per block (or absent: NULL): distinct values, one take."""
    consts = [b.constants.get(name) for b in blocks]
    distinct = list(dict.fromkeys(consts))
    dictionary = pa.array(distinct, type=arrow_type)
    if len(distinct) == 1:
        codes = np.zeros(sum(b.n for b in blocks), dtype=np.int32)
    else:
        index = {v: i for i, v in enumerate(distinct)}
        codes = np.repeat(
            np.fromiter((index[v] for v in consts), np.int32, len(consts)), [b.n for b in blocks]
        )
    return dictionary.take(pa.array(codes))
