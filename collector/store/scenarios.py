"""Simulated scenarios in the store: how their rows are labelled, listed and removed.

A scenario of ``phaselens simulate`` is one ``scenarios`` row (``scenario_id``, ``node``,
``created_s``, ``label`` = ``'simulated'``, what was simulated, its virtual time span, summary). Every
row the scenario produced, in any table, has ``node = 'sim:<scenario_id>'`` (``scenario_node``), and
``source = 'simulated'`` where the table has a ``source`` column; its ``gpu_samples`` rows have
``emulated = TRUE`` (modeled, not measured). The SQL macro ``trust_label(node, source, emulated)``
(and ``trust_label(node, source)`` for tables without ``emulated``) maps a row to ``'simulated'``,
``'emulated'`` or ``'measured'``: the one definition analytics use.

Simulated rows are in virtual time, so retention leaves them alone; ``delete_scenario`` removes a
scenario and every row of it.
"""

from __future__ import annotations

import re

import pandas as pd

from collector.store import gpu_keys, iteration_seconds
from collector.store.errors import StoreError
from collector.store.schema import SIMULATED_NODE_PREFIX
from collector.store.store import Store
from collector.store.tables import TABLES

SIMULATED = "simulated"  # scenarios.label, and the source of a simulated row
_SCENARIO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def scenario_node(scenario_id: str) -> str:
    """The ``node`` of every row of scenario ``scenario_id``: ``'sim:<scenario_id>'``.

    StoreError unless the id is 1-128 letters, digits, ``.``, ``_`` or ``-`` (starting with a letter
    or digit): it becomes a Parquet partition folder name.
    """
    if not isinstance(scenario_id, str) or not _SCENARIO_ID.fullmatch(scenario_id):
        raise StoreError(
            f"scenario id must be 1-128 letters, digits, '.', '_' or '-' starting with a letter or digit, "
            f"got {scenario_id!r}"
        )
    return SIMULATED_NODE_PREFIX + scenario_id


def is_simulated_node(node: str | None) -> bool:
    """True for the node of a simulated scenario's rows (``sim:...``)."""
    return isinstance(node, str) and node.startswith(SIMULATED_NODE_PREFIX)


def list_scenarios(store: Store, *, limit: int | None = None) -> pd.DataFrame:
    """The stored scenarios, newest first (by ``created_s``, then ``scenario_id``)."""
    sql = "SELECT * FROM scenarios ORDER BY created_s DESC, scenario_id"
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise StoreError(f"limit must be a non-negative integer, got {limit!r}")
        sql += f" LIMIT {limit}"
    return store.query(sql)


def delete_scenario(store: Store, scenario_id: str) -> dict[str, int]:
    """Delete scenario ``scenario_id`` and every row of it (``node = 'sim:<id>'``) from every table,
    in one transaction; return the rows deleted per table (tables with none left out)."""
    node = scenario_node(scenario_id)
    deleted: dict[str, int] = {}
    with store.transaction() as con:
        for name in TABLES:
            sql = (
                gpu_keys.delete_sql("node = ?")
                if name == "gpu_samples"
                else f'DELETE FROM "{name}" WHERE node = ?'
            )
            n = int(con.execute(sql, [node]).fetchone()[0])
            if n:
                deleted[name] = n
        con.execute(f"DELETE FROM {iteration_seconds.TABLE} WHERE node = ?", [node])  # derived: not counted
    return deleted
