"""Rows handed over as columns: what a source produces per poll, and its typed Arrow build.

A :class:`ColumnBlock` is one poll's rows of one table: equal-length value lists per column plus
``constants`` (one value for every row: the node, the source). The collector's writer hands all the
blocks of a flush to ``Store.append_columns``, which builds each column once, with the table's own
Arrow type (``pa.array(values, type=...)``: no per-value type inference), and builds a column that
is a constant in every block from its distinct values and the block lengths, without a Python
list of the rows. A list of dicts, by contrast, is pivoted row by row.
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
    is the value of every row. A column in neither is NULL (or the table's default).

    ``arrow``: the same rows as an Arrow table (types inferred), built by :meth:`of` -- on the
    source's poller thread, so that the writer only concatenates; None when Arrow could not
    infer a type (the writer then builds the columns with the table's types, naming a bad one).
    """

    n: int
    values: Mapping[str, Sequence[Any]]
    constants: Mapping[str, Any] = field(default_factory=dict)
    arrow: pa.Table | None = None

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
        arrow = None
        try:
            arrays = [pa.array(v) for v in values.values()] + [pa.repeat(c, n) for c in constants.values()]
            arrow = pa.Table.from_arrays(arrays, names=[*values, *constants])
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass  # mixed or unsupported values: the writer's typed build names the column
        return cls(n, dict(values), constants, arrow)

    @property
    def names(self) -> list[str]:
        return [*self.values, *self.constants]


Encode = Callable[[Any], Any]  # per-value encoding before the Arrow build (JSON text), or None


def concat_arrow(blocks: Sequence[ColumnBlock]) -> pa.Table | None:
    """The blocks' Arrow tables as one single-chunk table (missing columns NULL, numeric types
    promoted), or None when a block has none or their types cannot be unified."""
    tables = [b.arrow for b in blocks]
    if any(t is None for t in tables):
        return None
    try:  # the polls of a source mostly share one schema: nothing to unify
        data = pa.concat_tables(tables)
    except pa.ArrowInvalid:
        data = None
    try:
        if data is None:  # runs of one schema each, then the runs unified (few, not one per poll)
            runs: list[list[pa.Table]] = []
            for t in tables:
                if runs and t.schema.equals(runs[-1][0].schema):
                    runs[-1].append(t)
                else:
                    runs.append([t])
            data = pa.concat_tables([pa.concat_tables(run) for run in runs], promote_options="permissive")
        # one chunk per column: DuckDB and the casts take many small chunks ten times slower
        return data.combine_chunks()
    except (pa.ArrowException, TypeError, ValueError):
        return None


def block_names(blocks: Sequence[ColumnBlock]) -> list[str]:
    """Every column name of ``blocks``, in first-seen order."""
    return list(dict.fromkeys(chain.from_iterable(b.names for b in blocks)))


def build_column(
    name: str, blocks: Sequence[ColumnBlock], arrow_type: pa.DataType | None, encode: Encode | None = None
) -> pa.Array:
    """Column ``name`` of all ``blocks`` as one Arrow array of ``arrow_type`` (None: inferred).

    Raises what ``pa.array`` raises when a value does not fit the type (the caller names the column).
    """
    in_values = [name in b.values for b in blocks]
    if not any(in_values) and encode is None:
        # a constant per block (or absent: NULL): distinct values, then one take by block lengths
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
    if all(in_values):
        if len(blocks) == 1 and encode is None:
            return pa.array(blocks[0].values[name], type=arrow_type)
        parts = [b.values[name] for b in blocks]
    else:
        parts = [
            b.values[name] if inside else repeat(b.constants.get(name), b.n)
            for b, inside in zip(blocks, in_values, strict=True)
        ]
    values: Any = chain.from_iterable(parts)
    if encode is not None:
        values = map(encode, values)
    return pa.array(list(values), type=arrow_type)
