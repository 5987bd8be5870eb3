"""Named SQL queries composed into one statement.

A long analysis statement is a list of :class:`Cte` — each a name and one :class:`Query` (SQL text
and its ``?`` parameters, in text order) returned by a small function with a docstring — joined by
:func:`with_ctes` into ``WITH a AS (...), b AS (...) SELECT ...``. Each named query can be read on
its own from a store (:func:`select_from`), which is how the tests check them one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Query:
    """SQL text and its positional parameters, in the order their ``?`` stand in the text."""

    sql: str
    params: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Cte:
    """A named query of a ``WITH`` clause; ``inline``: ``AS NOT MATERIALIZED`` (DuckDB inlines it
    where it is read instead of computing it once)."""

    name: str
    query: Query
    inline: bool = False


def with_ctes(ctes: Sequence[Cte], final: Query) -> tuple[str, list[Any]]:
    """``WITH`` every one of ``ctes`` (in order: a query reads only those before it), then
    ``final``; the statement and its parameters."""
    parts = [f"{c.name} AS{' NOT MATERIALIZED' if c.inline else ''} ({c.query.sql}\n)" for c in ctes]
    params = [p for c in ctes for p in c.query.params]
    return "\nWITH\n" + ",\n".join(parts) + "\n" + final.sql, [*params, *final.params]


def select_from(ctes: Sequence[Cte], name: str) -> tuple[str, list[Any]]:
    """The statement reading the named query ``name`` of ``ctes`` (with those before it) whole;
    KeyError for a name not among them."""
    for i, cte in enumerate(ctes):
        if cte.name == name:
            return with_ctes(ctes[: i + 1], Query(f"SELECT * FROM {name}"))
    raise KeyError(f"no query named {name!r}; names: {', '.join(c.name for c in ctes)}")
