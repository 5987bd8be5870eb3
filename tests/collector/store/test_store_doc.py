"""docs/STORE.md against the schema a fresh store really has: the version it states, and every
table and view, both ways (a table the doc lists that the store lacks, or one it never mentions)."""

from __future__ import annotations

import re
from pathlib import Path

from collector.store import LATEST_VERSION, Store

STORE_MD = Path(__file__).resolve().parents[3] / "docs" / "STORE.md"


def _doc() -> str:
    return STORE_MD.read_text(encoding="utf-8")


def _store_tables(path: Path) -> set[str]:
    with Store.open(path) as store:
        return set(store.query("SELECT table_name FROM information_schema.tables")["table_name"])


def _documented_tables(doc: str) -> set[str]:
    """The backticked names in the first column of the doc's table of tables."""
    names: set[str] = set()
    for line in doc.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    return names


def test_the_documented_schema_version_is_the_latest_migration() -> None:
    doc = _doc()
    stated = re.findall(r"version (\d+) today", doc)
    assert stated == [str(LATEST_VERSION)], (
        f"STORE.md states {stated}, the migrations end at {LATEST_VERSION}"
    )
    examples = {int(v) for v in re.findall(r'"schema_version": (\d+)', doc)}
    assert examples <= {LATEST_VERSION}, f"STORE.md's examples show schema_version {examples}"


def test_every_documented_table_exists_in_a_fresh_store(tmp_path: Path) -> None:
    documented = _documented_tables(_doc())
    assert len(documented) >= 15, documented  # the parser still finds the doc's table
    missing = documented - _store_tables(tmp_path / "s.duckdb")
    assert not missing, f"STORE.md lists tables a fresh store does not have: {sorted(missing)}"


def test_every_table_and_view_of_a_fresh_store_is_documented(tmp_path: Path) -> None:
    doc = _doc()
    undocumented = {t for t in _store_tables(tmp_path / "s.duckdb") if f"`{t}`" not in doc}
    assert not undocumented, f"tables or views of the store that STORE.md never names: {sorted(undocumented)}"
