"""Rows handed over as columns: what a source produces per poll, and its typed Arrow build.

A :class:`ColumnBlock` is one poll's rows of one table: equal-length value lists per column plus
``constants`` (one value for every row: the node, the source) and ``repeats`` (value lists that a
source hands on again, as the very same object, while they do not change: a GPU's identity, poll
after poll; see :class:`RepeatedColumns`). Cheap for a source to make (no Arrow per poll: a poll of
8 GPUs would pay more for 27 small Arrow arrays than for its data). The collector's writer hands
all the blocks of a flush to ``Store.append_columns``, which builds each column once, with the
table's own Arrow type (``pa.array(values, type=...)``: no per-value type inference). A list of
dicts, by contrast, is pivoted row by row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from types import MappingProxyType
from typing import Any

import numpy as np
import pyarrow as pa

#: The ``repeats`` of a block without any (one shared object: blocks without repeats form one run).
NO_REPEATS: Mapping[str, Sequence[Any]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ColumnBlock:
    """``n`` rows of one table as columns: ``values[name]`` has ``n`` values, ``constants[name]``
    is the value of every row, ``repeats[name]`` has ``n`` values and is the same mapping object
    as the previous poll's while unchanged. A column in none of them is NULL (or the default)."""

    n: int
    values: Mapping[str, Sequence[Any]]
    constants: Mapping[str, Any] = field(default_factory=dict)
    repeats: Mapping[str, Sequence[Any]] = field(default_factory=lambda: NO_REPEATS)
    # ``values``' lists in ``values``' order (made by ``of``; the writer transposes these)
    lists: tuple[Sequence[Any], ...] = ()

    @classmethod
    def of(
        cls,
        values: Mapping[str, Sequence[Any]],
        constants: Mapping[str, Any] | None = None,
        repeats: Mapping[str, Sequence[Any]] | None = None,
    ) -> ColumnBlock:
        """A block from value lists of equal length (``repeats`` kept as the object given, so that
        polls sharing it are built once); ValueError naming the lengths or the clash otherwise."""
        repeats = repeats or NO_REPEATS
        values = dict(values)
        lists = tuple(values.values())
        lengths = set(map(len, chain(lists, repeats.values())))  # in C: a source makes one a poll
        if len(lengths) > 1:
            got = {name: len(v) for name, v in chain(values.items(), repeats.items())}
            raise ValueError(f"columns of one block must have equal lengths, got {got}")
        constants = dict(constants or {})
        both = (values.keys() & constants.keys()) | (repeats.keys() & (values.keys() | constants.keys()))
        if both:
            raise ValueError(f"column(s) {sorted(both)} given twice (values, constants, repeats)")
        return cls(lengths.pop() if lengths else 0, values, constants, repeats, lists)

    @property
    def names(self) -> list[str]:
        return [*self.values, *self.repeats, *self.constants]

    def to_rows(self) -> list[dict[str, Any]]:
        """The block's rows as dicts (for reading a poll back; the writer never needs this)."""
        columns = {**self.values, **self.repeats}
        return [{**{name: v[i] for name, v in columns.items()}, **self.constants} for i in range(self.n)]


def transpose(rows: Sequence[Mapping[str, Any]]) -> dict[str, Sequence[Any]]:
    """Dicts (a poll's samples) as value lists per key; rows of one shape (the same keys in the
    same order) are transposed in C, others key by key."""
    if not rows:
        return {}
    shapes = list(map(tuple, rows))  # ordered: rows with equal key sets in other orders differ
    first = shapes[0]
    if shapes.count(first) == len(shapes):
        return dict(zip(first, zip(*(row.values() for row in rows), strict=True), strict=True))
    names = list(dict.fromkeys(name for row in rows for name in row))
    return {name: [row.get(name) for row in rows] for name in names}


class RepeatedColumns:
    """A source's value lists that usually repeat from poll to poll (a GPU's identity columns),
    handed on as the previous poll's object while every value is equal and of the same type.

    The writer then builds such columns once per run of polls sharing the object (an identity
    check per poll, not a comparison per value); a changed value makes a new object. One instance
    per source and table; not thread-safe (a source polls on one thread).
    """

    __slots__ = ("_last", "_lists", "_steady", "_types")

    def __init__(self, steady: Iterable[str] = ()) -> None:
        """``steady``: value columns that usually keep their values too (a GPU's power limit, its
        memory size), shared with the identity by :meth:`split` until one first changes; from
        then on that column goes with the values of each poll (so a column that changes often
        does not cut every poll into a run of its own)."""
        self._last: Mapping[str, Sequence[Any]] = NO_REPEATS
        self._lists: tuple[tuple[Any, ...], ...] = ()
        self._types: tuple[type, ...] = ()
        self._steady = set(steady)

    def split(
        self, values: Mapping[str, Sequence[Any]], identity: Iterable[str]
    ) -> tuple[dict[str, Sequence[Any]], Mapping[str, Sequence[Any]]]:
        """``values`` as (the columns to hand on per poll, the shared ``repeats``): the
        ``identity`` columns and the steady ones that have not changed yet, through :meth:`share`."""
        names = set(identity) | self._steady
        shared = {name: v for name, v in values.items() if name in names}
        last = self._last
        changed = [
            name
            for name in self._steady.intersection(shared)
            if name in last
            and (
                last[name] != tuple(shared[name])
                or list(map(type, last[name])) != list(map(type, shared[name]))
            )
        ]
        for name in changed:  # a steady column that changed: handed on per poll from now on
            self._steady.discard(name)
            del shared[name]
        rest = {name: v for name, v in values.items() if name not in shared}
        return rest, self.share(shared) if shared else NO_REPEATS

    def share(self, values: Mapping[str, Sequence[Any]]) -> Mapping[str, Sequence[Any]]:
        """``values`` (the ``repeats`` of a block), or the previous poll's equal object."""
        lists = tuple(map(tuple, values.values()))
        types = tuple(map(type, chain.from_iterable(lists)))  # 1 == 1.0 == True: types too
        last = self._last
        if lists == self._lists and types == self._types and last.keys() == values.keys():
            return last
        self._last = MappingProxyType(dict(zip(values, lists, strict=True)))
        self._lists, self._types = lists, types
        return self._last


Encode = Callable[[Any], Any]  # per-value encoding before the Arrow build (JSON text), or None


def block_names(blocks: Sequence[ColumnBlock], runs: Sequence[ColumnRun] | None = None) -> list[str]:
    """Every column name of ``blocks`` (cut into ``runs``, when given), in first-seen order."""
    if runs is None:
        return list(dict.fromkeys(chain.from_iterable(b.names for b in blocks)))
    names: dict[str, Any] = {}
    for run in runs:  # a run's blocks share their value and repeats names: only constants differ
        names.update(dict.fromkeys(run.keys))
        names.update(dict.fromkeys(run.repeats))
        for b in run.blocks:
            names.update(b.constants)
    return list(names)


@dataclass(slots=True)
class ColumnRun:
    """Consecutive blocks with the same value columns and the same ``repeats`` object: their
    value lists are transposed at once, their repeats built once."""

    keys: tuple[str, ...]
    repeats: Mapping[str, Sequence[Any]]
    blocks: list[ColumnBlock]

    @property
    def rows(self) -> int:
        return sum(b.n for b in self.blocks)


def column_runs(blocks: Sequence[ColumnBlock]) -> list[ColumnRun]:
    """``blocks`` cut into :class:`ColumnRun` s, in order."""
    runs: list[ColumnRun] = []
    for b in blocks:
        keys = tuple(b.values)
        last = runs[-1] if runs else None
        if last is not None and last.repeats is b.repeats and last.keys == keys:
            last.blocks.append(b)
        else:
            runs.append(ColumnRun(keys, b.repeats, [b]))
    return runs


def build_columns(
    blocks: Sequence[ColumnBlock],
    types: Mapping[str, pa.DataType | None],
    encoders: Mapping[str, Encode] | None = None,
    runs: Sequence[ColumnRun] | None = None,
    names: Sequence[str] | None = None,
) -> dict[str, pa.Array]:
    """Every column of ``blocks`` as one Arrow array of ``types[name]`` (None: inferred).

    Python work is per run of blocks (``column_runs``, or ``runs`` when given), not per block and
    column: a run's value lists are transposed at once (``zip``) and each column is joined in C
    (``chain``), then built by Arrow with its type; a run's repeats are built once and tiled. A
    column that is a constant in every block is built from its distinct values and the block
    lengths. Such columns (a run's repeats over several blocks, a constant) come back
    dictionary-encoded: each row an int32 code into the few distinct values, so that the writer
    copies nothing per row for them (``Store`` hands them to DuckDB as they are, or decodes them).
    ``encoders[name]`` maps each value first (JSON text); ``names``, when given, is
    ``block_names(blocks)``. Raises what ``pa.array`` raises, with the column's name in ``.column``.
    """
    encoders = encoders or {}
    runs = column_runs(blocks) if runs is None else runs
    tiles = _Tiles()
    constants = _Constants(blocks)
    in_values = set(chain.from_iterable(chain(r.keys, r.repeats) for r in runs))
    # per column, one piece per run: ("lists", value lists) | ("tile", list, times) | ("const", blocks)
    parts: dict[str, list[tuple[str, Any, Any]]] = {name: [] for name in in_values}
    for run in runs:
        keys = run.keys
        columns = zip(*(b.lists or tuple(b.values.values()) for b in run.blocks), strict=True) if keys else ()
        for name, lists in zip(keys, columns, strict=True):
            parts[name].append(("lists", lists, None))
        for name, values in run.repeats.items():
            parts[name].append(("tile", values, len(run.blocks)))
        for name in in_values.difference(keys, run.repeats):  # a constant, or absent, in this run
            parts[name].append(("const", run.blocks, None))
    out: dict[str, pa.Array] = {}
    for name in block_names(blocks, runs) if names is None else names:
        arrow_type = types[name]
        encode = encoders.get(name)
        try:
            if name not in in_values:
                if encode is None:
                    out[name] = constants.column(name, arrow_type)
                    continue
                parts[name] = [("const", blocks, None)]
            pieces = parts[name]
            if len(pieces) == 1 and arrow_type is not None and pieces[0][0] != "const":
                kind, data, times = pieces[0]
                if kind == "tile":  # one list, the same for every block of the run
                    values = data if encode is None else list(map(encode, data))
                    array = pa.array(values, type=arrow_type)
                    if times > 1:  # each block's rows point at the one list: nothing copied per row
                        array = pa.DictionaryArray.from_arrays(tiles.get(len(values), times), array)
                    out[name] = array
                    continue
                if len(data) == 1 and encode is None:
                    out[name] = pa.array(data[0], type=arrow_type)  # one block: its own list
                    continue
            if len(pieces) == 1 and pieces[0][0] == "lists":  # one run: its blocks' lists, one chain
                joined: Any = chain.from_iterable(pieces[0][1])
            else:
                joined = chain.from_iterable(_expand(name, piece) for piece in pieces)
            if encode is not None:
                joined = map(encode, joined)
            out[name] = pa.array(list(joined), type=arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            e.column = name  # type: ignore[attr-defined]
            raise
    return out


def _expand(name: str, piece: tuple[str, Any, Any]) -> Any:
    """The values of one piece of a column, in row order."""
    kind, data, times = piece
    if kind == "lists":
        return chain.from_iterable(data)
    if kind == "tile":
        return chain.from_iterable(repeat(data, times))
    return chain.from_iterable(repeat(b.constants.get(name), b.n) for b in data)


class _Tiles:
    """The int32 codes ``0..n-1`` repeated ``times`` times, made once per (n, times) in a build."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[tuple[int, int], pa.Array] = {}

    def get(self, n: int, times: int) -> pa.Array:
        codes = self._made.get((n, times))
        if codes is None:
            codes = self._made[n, times] = pa.array(np.tile(np.arange(n, dtype=np.int32), times))
        return codes


class _Constants:
    """The constant columns of a build: one value per block (or absent: NULL), dictionary-encoded.
    The blocks' constants are looked at once for all such columns; when every block has equal
    constants (one source's polls) each column is one value and zero codes."""

    __slots__ = ("_blocks", "_codes", "_lengths", "_same")

    def __init__(self, blocks: Sequence[ColumnBlock]) -> None:
        self._blocks = blocks
        first = blocks[0].constants if blocks else None
        self._same = all(b.constants == first for b in blocks)
        self._lengths: list[int] | None = None
        self._codes: pa.Array | None = None

    def column(self, name: str, arrow_type: pa.DataType | None) -> pa.Array:
        """Column ``name`` of the blocks: its distinct values, and one code per row."""
        blocks = self._blocks
        if self._same:
            if self._codes is None:
                self._codes = pa.array(np.zeros(sum(b.n for b in blocks), dtype=np.int32))
            dictionary = pa.array([blocks[0].constants.get(name)], type=arrow_type)
            return pa.DictionaryArray.from_arrays(self._codes, dictionary)
        consts = [b.constants.get(name) for b in blocks]
        distinct = list(dict.fromkeys(consts))
        dictionary = pa.array(distinct, type=arrow_type)
        if self._lengths is None:
            self._lengths = [b.n for b in blocks]
        index = {v: i for i, v in enumerate(distinct)}
        codes = np.repeat(np.fromiter((index[v] for v in consts), np.int32, len(consts)), self._lengths)
        return pa.DictionaryArray.from_arrays(pa.array(codes), dictionary)
