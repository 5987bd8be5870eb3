"""Rows handed over as columns: what a source produces per poll, and its typed Arrow build.

A :class:`ColumnBlock` is one poll's rows of one table: equal-length value lists per column plus
``constants`` (one value for every row: the node, the source) and ``repeats`` (value lists that a
source hands on again, as the very same object, while they do not change: a GPU's identity, poll
after poll; see :class:`RepeatedColumns`). Cheap for a source to make (no Arrow per poll: a poll of
8 GPUs would pay more for 27 small Arrow arrays than for its data). The collector's writer hands
all the blocks of a flush to ``Store.append_columns``, which builds each column once, with the
table's own Arrow type (``pa.array(values, type=...)``: no per-value type inference). A list of
dicts, by contrast, is pivoted row by row.

A source whose value columns are numbers (GPU samples) hands them on packed as well
(``ColumnBlock.of(..., packed=True)``: ``floats``, the values as float64 made in C, None as NaN):
the writer then joins a run's buffers and builds each float or integer column from one numpy
column, touching no Python object per value; any column whose packed values might not store
exactly what its value lists store is built from the lists. The Arrow build itself
(:func:`~collector.store.column_build.build_columns`) is in collector/store/column_build.py.
"""

from __future__ import annotations

import marshal
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, starmap
from operator import attrgetter, itemgetter
from types import MappingProxyType
from typing import Any

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
    # ``values`` as native float64, column after column (``n`` each, ``values``' order), None as
    # NaN: made by ``of(..., packed=True)`` when every value is a number (see ``pack_floats``)
    floats: bytes | None = None
    keys: tuple[str, ...] = ()  # ``values``' names (made by ``of``: runs of blocks compare these)

    @classmethod
    def of(
        cls,
        values: Mapping[str, Sequence[Any]],
        constants: Mapping[str, Any] | None = None,
        repeats: Mapping[str, Sequence[Any]] | None = None,
        *,
        packed: bool = False,
    ) -> ColumnBlock:
        """A block from value lists of equal length (``repeats`` kept as the object given, so that
        polls sharing it are built once); ValueError naming the lengths or the clash otherwise.
        ``packed``: also pack the values as float64 (``pack_floats``; kept only when every value
        is a number or None), which the writer builds numeric columns from."""
        repeats = repeats or NO_REPEATS
        values = dict(values)
        lists = tuple(values.values())
        lengths = set(map(len, chain(lists, repeats.values())))  # in C: a source makes one a poll
        if len(lengths) > 1:
            got = {name: len(v) for name, v in chain(values.items(), repeats.items())}
            raise ValueError(f"columns of one block must have equal lengths, got {got}")
        constants = dict(constants) if constants else {}
        keys = values.keys()
        if not (
            keys.isdisjoint(constants)
            and repeats.keys().isdisjoint(keys)
            and repeats.keys().isdisjoint(constants)
        ):
            both = (keys & constants.keys()) | (repeats.keys() & (keys | constants.keys()))
            raise ValueError(f"column(s) {sorted(both)} given twice (values, constants, repeats)")
        n = lengths.pop() if lengths else 0
        floats = pack_floats(lists, n) if packed else None
        return cls(n, values, constants, repeats, lists, floats, tuple(values))

    @property
    def names(self) -> list[str]:
        return [*self.values, *self.repeats, *self.constants]

    def to_rows(self) -> list[dict[str, Any]]:
        """The block's rows as dicts (for reading a poll back; the writer never needs this)."""
        columns = {**self.values, **self.repeats}
        return [{**{name: v[i] for name, v in columns.items()}, **self.constants} for i in range(self.n)]


_NAN = float("nan")
_first = itemgetter(0)


def pack_floats(lists: Sequence[Sequence[Any]], n: int) -> bytes | None:
    """``lists`` (``n`` values each) as native float64, column after column, each None as NaN;
    None when a value is no number (a string: ``struct`` refuses it) or none is given.

    One ``struct`` pack in C per column (a ``Struct`` of ``n`` doubles, made once per ``n``).
    Booleans and integers pack as their float value: the writer builds from the packed values
    only where that stores what the lists store (see ``collector.store.column_build._from_floats``). A column that is all None
    (a metric the GPU lacks) costs a count, other None values a pass over their column."""
    if not lists or not n:
        return None
    pack = _PACKS.get(n) or _pack_of(n)
    if None in map(_first, lists):  # a column starting with None: usually one that is all None
        lists = [_none_as_nan(v, n) if v[0] is None else v for v in lists]
    try:
        return b"".join(starmap(pack, lists))
    except struct.error:
        pass
    lists = [_none_as_nan(v, n) if None in v else v for v in lists]
    try:
        return b"".join(starmap(pack, lists))
    except struct.error:
        return None


_PACKS: dict[int, Callable[..., bytes]] = {}  # n -> pack of n doubles, for the usual block sizes


def _pack_of(n: int) -> Callable[..., bytes]:
    pack = struct.Struct(f"{n}d").pack
    if n <= 4096:
        _PACKS[n] = pack
    return pack


def _none_as_nan(values: Sequence[Any], n: int) -> Sequence[Any]:
    return [_NAN] * n if values.count(None) == n else [_NAN if v is None else v for v in values]


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

    __slots__ = ("_last", "_lists", "_plan", "_steady", "_types")

    def __init__(self, steady: Iterable[str] = ()) -> None:
        """``steady``: value columns that usually keep their values too (a GPU's power limit, its
        memory size), shared with the identity by :meth:`split` until one first changes; from
        then on that column goes with the values of each poll (so a column that changes often
        does not cut every poll into a run of its own)."""
        self._last: Mapping[str, Sequence[Any]] = NO_REPEATS
        self._lists: tuple[tuple[Any, ...], ...] = ()
        self._types: tuple[type, ...] = ()
        self._steady = set(steady)
        self._plan: _RowPlan | None = None  # how the previous call of block read its rows

    def split(
        self, values: Mapping[str, Sequence[Any]], identity: Iterable[str]
    ) -> tuple[dict[str, Sequence[Any]], Mapping[str, Sequence[Any]]]:
        """``values`` as (the columns to hand on per poll, the shared ``repeats``): the
        ``identity`` columns and the steady ones that have not changed yet, through :meth:`share`."""
        names = set(identity) | self._steady
        shared = {name: v for name, v in values.items() if name in names}
        last = self._last
        if shared.keys() == last.keys():  # the poll after poll case: every value as before?
            lists = tuple(map(tuple, shared.values()))
            if lists == self._lists and tuple(map(type, chain.from_iterable(lists))) == self._types:
                return {name: v for name, v in values.items() if name not in shared}, last
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

    def block(
        self,
        rows: Sequence[Mapping[str, Any]],
        identity: Sequence[str],
        extra: Mapping[str, Sequence[Any]] | None = None,
        constants: Mapping[str, Any] | None = None,
        *,
        apart: Sequence[str] = (),
    ) -> tuple[ColumnBlock, dict[str, Sequence[Any]]]:
        """A poll's ``rows`` (dicts; ``extra``: more value lists, e.g. each row's owner) as one packed
        block with ``constants``, its ``identity`` columns shared, and the value columns named in
        ``apart`` (another table's) taken out of it: what ``ColumnBlock.of(values, constants,
        shared, packed=True)`` makes of ``values, shared = self.split(columns, identity)``, where
        ``columns`` is ``{**transpose(rows), **extra}`` without the ``apart`` ones.

        Done once per key set: rows with the key set of the previous call's rows (in any order)
        are read with one ``itemgetter`` made for it, their shared values compared with those of
        the previous call (values and types), and the block made without checking its columns'
        lengths and names again. Anything else goes through :meth:`split` and ``ColumnBlock.of``."""
        plan = self._plan
        if plan is not None and rows:
            made = plan.block(self, rows, identity, extra, constants, apart)
            if made is not None:
                return made
        values = transpose(rows)
        if extra:
            values.update(extra)
        set_apart = {name: values.pop(name) for name in apart if name in values}
        values, shared = self.split(values, identity)
        self._plan = _RowPlan.of(self, rows, identity, extra, apart, shared)
        return ColumnBlock.of(values, constants, shared, packed=True), set_apart

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


def _getter(names: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A row's values of ``names`` as a tuple (``itemgetter`` gives one name's value bare)."""
    if len(names) > 1:
        return itemgetter(*names)
    if names:
        name = names[0]
        return lambda row: (row[name],)
    return lambda row: ()


_UNTYPED = (str, type(None))  # values equal to one of these types are of that type (JSON's, at least)


class _RowPlan:
    """How :meth:`RepeatedColumns.block` reads rows of one key set: one ``itemgetter`` of their
    shared columns (identity and steady ones), value columns and columns set apart, transposed at
    once, and the shared columns (and extra ones) of the call that made the repeats' current
    shared object.

    Equal values of other types (``1 == 1.0 == True``) only occur among numbers: shared columns
    that held only strings or None are compared by value alone, the others (``typed``, first) by
    value and type. A string or None that changes into anything else is unequal. The types are
    compared through ``marshal`` (version 2), which writes each value with its exact type (and
    refuses any other type): equal values whose bytes differ (-0.0 and 0.0) go through ``split``."""

    __slots__ = (
        "apart",
        "apart_names",
        "columns",
        "extra",
        "extra_typed",
        "extras",
        "identity",
        "last",
        "names",
        "of_row",
        "shared",
        "steady",
        "typed",
        "types",
        "value_names",
        "values_end",
        "width",
    )

    def __init__(
        self,
        repeats: RepeatedColumns,
        rows: Sequence[Mapping[str, Any]],
        identity: Sequence[str],
        extra: Mapping[str, Sequence[Any]],
        apart: Sequence[str],
        shared: Mapping[str, Sequence[Any]],
    ) -> None:
        """The plan of ``rows`` (their first row's key set, the extra columns following), whose
        shared columns are ``shared`` (what ``split`` just returned for them)."""
        keys = tuple(rows[0])
        names = (set(identity) | repeats._steady).difference(apart)
        typed = [name for name in keys if name in names and not _all_untyped(shared[name])]
        plain = [name for name in keys if name in names and name not in typed]
        self.value_names = tuple(name for name in keys if name not in names and name not in apart)
        self.apart, self.apart_names = tuple(apart), tuple(name for name in apart if name in keys)
        self.identity, self.extra, self.width = identity, tuple(extra), len(keys)
        self.names = frozenset(chain(shared, self.value_names))  # the block's, but its constants
        self.steady = len(repeats._steady)  # it only shrinks (in split): a change shows in its size
        self.typed, self.shared = len(typed), len(typed) + len(plain)
        self.values_end = self.shared + len(self.value_names)
        self.of_row = _getter([*typed, *plain, *self.value_names, *self.apart_names])
        self.extra_typed = tuple(name for name in extra if not _all_untyped(shared[name]))
        self.last = shared
        self.columns = tuple(zip(*map(self.of_row, rows), strict=True))[: self.shared]
        self.extras = tuple(map(tuple, extra.values()))
        self.types = _types(self.columns[: self.typed], extra, self.extra_typed)

    @classmethod
    def of(
        cls,
        repeats: RepeatedColumns,
        rows: Sequence[Mapping[str, Any]],
        identity: Sequence[str],
        extra: Mapping[str, Sequence[Any]] | None,
        apart: Sequence[str],
        shared: Mapping[str, Sequence[Any]],
    ) -> _RowPlan | None:
        """The plan for rows with ``rows``' key set, after ``split`` made ``shared`` of them; None
        when the rows have no one key set, an ``extra`` column is one of theirs, set apart or not
        shared, or nothing is shared."""
        if not rows or not rows[0] or not shared:
            return None
        first, extra = rows[0], extra or {}
        if set(map(len, rows)) != {len(first)} or any(name in first or name in apart for name in extra):
            return None
        names = (set(identity) | repeats._steady).difference(apart)
        if shared.keys() != {name for name in first if name in names} | extra.keys():
            return None  # an extra column not shared
        try:
            return cls(repeats, rows, identity, extra, apart, shared)
        except (KeyError, ValueError):  # rows of other key sets, a value marshal refuses
            return None

    def block(
        self,
        repeats: RepeatedColumns,
        rows: Sequence[Mapping[str, Any]],
        identity: Sequence[str],
        extra: Mapping[str, Sequence[Any]] | None,
        constants: Mapping[str, Any] | None,
        apart: Sequence[str],
    ) -> tuple[ColumnBlock, dict[str, Sequence[Any]]] | None:
        """``repeats.block(rows, identity, extra, constants, apart=apart)`` when ``rows`` have this
        plan's key set and their shared values (and ``extra``) are the previous call's, values and
        types, and ``constants`` name none of the block's columns; else None."""
        if repeats._last is not self.last or len(repeats._steady) != self.steady:
            return None  # the repeats moved on without this plan (split or share called directly)
        if identity is not self.identity and tuple(identity) != tuple(self.identity):
            return None
        extra = extra or {}
        constants = dict(constants) if constants else {}
        if (
            tuple(extra) != self.extra
            or (apart is not self.apart and tuple(apart) != self.apart)
            or not self.names.isdisjoint(constants)  # ColumnBlock.of names the clash
            or set(map(len, rows)) != {self.width}
        ):
            return None
        try:
            columns = tuple(zip(*map(self.of_row, rows), strict=False))  # one getter: equal lengths
            shared = columns[: self.shared]
            if (
                shared != self.columns
                or tuple(map(tuple, extra.values())) != self.extras
                or _types(shared[: self.typed], extra, self.extra_typed) != self.types
            ):
                return None
        except (KeyError, TypeError, ValueError):  # another key set, a value marshal refuses
            return None  # (split says what is wrong with the rows)
        n, lists, names = len(rows), columns[self.shared : self.values_end], self.value_names
        values = dict(zip(names, lists, strict=True))
        block = ColumnBlock(n, values, constants, self.last, lists, pack_floats(lists, n), names)
        return block, dict(zip(self.apart_names, columns[self.values_end :], strict=True))


def _types(
    columns: tuple[tuple[Any, ...], ...], extra: Mapping[str, Sequence[Any]], names: tuple[str, ...]
) -> bytes:
    """The values of ``columns`` and of ``extra`` 's columns ``names`` with their exact types, as
    ``marshal`` writes them (ValueError for a type it does not write)."""
    if names:
        columns += tuple(tuple(extra[name]) for name in names)
    return marshal.dumps(columns, 2)


def _all_untyped(values: Sequence[Any]) -> bool:
    return all(type(v) in _UNTYPED for v in values)


Encode = Callable[[Any], Any]  # per-value encoding before the Arrow build (JSON text), or None


def block_names(blocks: Sequence[ColumnBlock], runs: Sequence[ColumnRun] | None = None) -> list[str]:
    """Every column name of ``blocks`` (cut into ``runs``, when given), in first-seen order."""
    if runs is None:
        return list(dict.fromkeys(chain.from_iterable(b.names for b in blocks)))
    names: dict[str, Any] = {}
    for run in runs:  # a run's blocks share their value and repeats names: only constants differ
        names.update(dict.fromkeys(run.keys))
        names.update(dict.fromkeys(run.repeats))
        names.update(dict.fromkeys(chain.from_iterable(map(_constants_of, run.blocks))))
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
        return sum(map(_n_of, self.blocks))


_n_of = attrgetter("n")
_constants_of = attrgetter("constants")
_repeats_of = attrgetter("repeats")
_keys_of = attrgetter("keys")
_values_of = attrgetter("values")


def column_runs(blocks: Sequence[ColumnBlock]) -> list[ColumnRun]:
    """``blocks`` cut into :class:`ColumnRun` s, in order."""
    if blocks and len(set(map(id, map(_repeats_of, blocks)))) == 1:  # one source's polls: one run,
        keys = set(map(_keys_of, blocks))  # found without a Python step per block
        if len(keys) == 1 and ((first := keys.pop()) or not any(map(_values_of, blocks))):
            return [ColumnRun(first, blocks[0].repeats, list(blocks))]
    runs: list[ColumnRun] = []
    for b in blocks:
        keys = tuple(b.values)
        last = runs[-1] if runs else None
        if last is not None and last.repeats is b.repeats and last.keys == keys:
            last.blocks.append(b)
        else:
            runs.append(ColumnRun(keys, b.repeats, [b]))
    return runs
