"""The typed Arrow build of column blocks (collector/store/columns.py): :func:`build_columns` builds
each column of a flush once, with the table's own Arrow type, from the blocks' value lists, their
repeated and constant columns (dictionary-encoded) or, for numbers handed on packed, from one numpy
column per run; any column whose packed values might not store exactly what its lists store is
built from the lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa

from collector.store.columns import ColumnBlock, ColumnRun, Encode, block_names, column_runs

_n_of = attrgetter("n")
_constants_of = attrgetter("constants")


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
    # per column, one piece per run: ("lists", value lists, (packed run, column) | None) |
    # ("tile", list, times) | ("const", blocks)
    parts: dict[str, list[tuple[str, Any, Any]]] = {name: [] for name in in_values}
    for run in runs:
        keys = run.keys
        if keys:
            lists = _Transposed(run.blocks)
            packed = _Packed(run) if None not in map(_floats_of, run.blocks) else None
            for j, name in enumerate(keys):
                parts[name].append(("lists", (lists, j), None if packed is None else (packed, j)))
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
            if (
                encode is None
                and arrow_type is not None
                and all(p[0] == "lists" and p[2] is not None for p in pieces)
            ):
                array = _from_floats(pieces, arrow_type)
                if array is not None:
                    out[name] = array
                    continue
            pieces = [(k, d[0].column(d[1]), x) if k == "lists" else (k, d, x) for k, d, x in pieces]
            if len(pieces) == 1 and arrow_type is not None and pieces[0][0] != "const":
                kind, data, times = pieces[0]
                if kind == "tile":  # one list, the same for every block of the run
                    values = data if encode is None else list(map(encode, data))
                    array = _typed_array(values, arrow_type)
                    if times > 1:  # each block's rows point at the one list: nothing copied per row
                        array = pa.DictionaryArray.from_arrays(tiles.get(len(values), times), array)
                    out[name] = array
                    continue
                if len(data) == 1 and encode is None:
                    out[name] = _typed_array(data[0], arrow_type)  # one block: its own list
                    continue
            if len(pieces) == 1 and pieces[0][0] == "lists":  # one run: its blocks' lists, one chain
                joined: Any = chain.from_iterable(pieces[0][1])
            else:
                joined = chain.from_iterable(_expand(name, piece) for piece in pieces)
            if encode is not None:
                joined = map(encode, joined)
            out[name] = _typed_array(list(joined), arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            e.column = name  # type: ignore[attr-defined]
            raise
    return out


def _typed_array(values: Sequence[Any], arrow_type: pa.DataType | None) -> pa.Array:
    """``values`` as an Arrow array of ``arrow_type``. Arrow converts a float to an integer type by
    truncating it (1.5 → 1): for an integer column, a value with a fraction raises ValueError
    instead (the caller names the column). Their sum (in C) tells whether any float is there."""
    array = pa.array(values, type=arrow_type)
    if arrow_type is not None and pa.types.is_integer(arrow_type):
        try:
            whole = type(sum(values)) is int  # ints and bools sum to an int, any float to a float
        except TypeError:  # a None among them
            whole = False
        if not whole:
            bad = next((v for v in values if type(v) is float and not v.is_integer()), None)
            if bad is not None:
                raise ValueError(f"{bad!r} is not a whole number (the column holds integers)")
    return array


_EXACT = 2.0**53  # integers up to this size are exact in float64 (and Arrow converts them to double)


def _from_floats(pieces: Sequence[tuple[str, Any, Any]], arrow_type: pa.DataType) -> pa.Array | None:
    """A float64 or integer column from its pieces' packed values, or None when it must be built
    from the lists: another type, or values whose build from the lists may differ (or fail).

    NaN (a None, or a NaN: the store's NaN-means-NULL rule) becomes NULL. A float64 column with
    a value beyond 2**53 may hold an integer Arrow refuses as inexact. An integer column takes
    only integral values up to 2**53, and a 0 or 1 only where the lists do not hold a boolean
    (which ``pa.array`` refuses there; looked up per such row, so a column with many is built
    from its lists): the lists may hold a fraction (refused by ``_typed_array``) or an integer
    too large for float64."""
    if arrow_type != pa.float64() and not pa.types.is_integer(arrow_type):
        return None
    runs = [p[2] for p in pieces]
    columns = [packed.column(j) for packed, j in runs]
    values = columns[0] if len(columns) == 1 else np.concatenate(columns)
    fits = np.abs(values) <= _EXACT  # False for NaN too
    if arrow_type != pa.float64():
        fits &= np.trunc(values) == values
    nulls = None
    if not fits.all():
        nulls = np.isnan(values)
        if not (fits | nulls).all():
            return None
    if arrow_type == pa.float64():
        return pa.array(values, type=arrow_type, mask=nulls)
    for (packed, j), column in zip(runs, columns, strict=True):  # booleans pack as 0 and 1
        suspects = np.flatnonzero((column == 0) | (column == 1))
        if len(suspects) > len(column) // 8:  # a bitmask or counter often 0: the lists cost less
            return None
        if len(suspects) and bool in set(map(type, packed.values_at(j, suspects))):
            return None
    ints = pa.array((values if nulls is None else np.where(nulls, 0.0, values)).astype(np.int64), mask=nulls)
    try:
        return ints if arrow_type == pa.int64() else ints.cast(arrow_type)  # safe: out of range raises
    except pa.ArrowInvalid:
        return None  # the lists' build names what does not fit


_floats_of = attrgetter("floats")


class _Transposed:
    """A run's value lists per column (``column(j)``: each block's list of column ``j``),
    transposed at once when a column is first built from its lists (a packed run may need none)."""

    __slots__ = ("_blocks", "_columns")

    def __init__(self, blocks: Sequence[ColumnBlock]) -> None:
        self._blocks = blocks
        self._columns: list[tuple[Sequence[Any], ...]] | None = None

    def column(self, j: int) -> tuple[Sequence[Any], ...]:
        if self._columns is None:
            self._columns = list(
                zip(*(b.lists or tuple(b.values.values()) for b in self._blocks), strict=True)
            )
        return self._columns[j]


class _Packed:
    """A run's packed values (``ColumnBlock.floats`` of each block) joined once; ``column(j)`` is
    the run's column ``j`` (of ``keys``) as one float64 array, copied out in row order."""

    __slots__ = ("_blocks", "_cube", "_flat", "_gather", "_k", "_starts")

    def __init__(self, run: ColumnRun) -> None:
        self._blocks, self._k = run.blocks, len(run.keys)
        self._flat: np.ndarray | None = None
        self._cube: np.ndarray | None = None
        self._gather: tuple[np.ndarray, np.ndarray] | None = None
        self._starts: np.ndarray = np.zeros(0, dtype=np.int64)  # each block's first row in the run

    def column(self, j: int) -> np.ndarray:
        if self._flat is None:
            blocks = self._blocks
            self._flat = np.frombuffer(b"".join(map(_floats_of, blocks)), dtype=np.float64)  # type: ignore[arg-type]
            lengths = np.fromiter(map(_n_of, blocks), np.int64, len(blocks))
            self._starts = np.cumsum(lengths) - lengths
            if (lengths == lengths[0]).all():  # polls of the same GPUs: blocks x columns x rows
                self._cube = self._flat.reshape(len(blocks), self._k, int(lengths[0]))
            else:  # row r of block b, column j: at k * (rows before b) + j * n_b + (r - rows before b)
                base = np.repeat((self._k - 1) * self._starts, lengths) + np.arange(int(lengths.sum()))
                self._gather = base, np.repeat(lengths, lengths)
        if self._cube is not None:
            return self._cube[:, j, :].ravel()
        base, step = self._gather  # type: ignore[misc]
        return self._flat[base + j * step]

    def values_at(self, j: int, rows: np.ndarray) -> list[Any]:
        """The blocks' own values (their lists) of column ``j`` at the run's ``rows``."""
        blocks = self._blocks
        which = np.searchsorted(self._starts, rows, side="right") - 1
        return [
            (blocks[b].lists or tuple(blocks[b].values.values()))[j][r - self._starts[b]]
            for b, r in zip(which.tolist(), rows.tolist(), strict=True)
        ]


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
        consts = list(map(_constants_of, blocks))
        self._same = not consts or consts.count(consts[0]) == len(consts)
        self._lengths: list[int] | None = None
        self._codes: pa.Array | None = None

    def column(self, name: str, arrow_type: pa.DataType | None) -> pa.Array:
        """Column ``name`` of the blocks: its distinct values, and one code per row."""
        blocks = self._blocks
        if self._same:
            if self._codes is None:
                self._codes = pa.array(np.zeros(sum(map(_n_of, blocks)), dtype=np.int32))
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
