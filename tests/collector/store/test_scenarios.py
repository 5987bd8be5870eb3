"""Simulated scenarios in the store: migration 9, the trust label, Parquet round trips, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from collector.store import (
    EXPORT_MANIFEST,
    LATEST_VERSION,
    ExportFormatError,
    RetentionPolicy,
    Store,
    StoreError,
    apply_retention,
    delete_scenario,
    export_parquet,
    import_parquet,
    list_scenarios,
    scenario_node,
)
from collector.store.schema import apply_migrations, current_version
from tests.collector.store.conftest import add_simulated_scenario, sample

T0 = 1_764_028_800.0  # 2025-11-25 00:00:00 UTC
SIM_TABLES = ("scenarios", "gpu_samples", "devices", "iterations", "requests", "tokens")


def _counts(store: Store, node: str) -> dict[str, int]:
    return {
        t: int(store.query(f"SELECT count(*) AS n FROM {t} WHERE node = ?", [node])["n"][0])
        for t in SIM_TABLES
    }


def _measured_store(path: Path) -> Store:
    store = Store.open(path)
    store.append_gpu_samples([sample(T0 + i, power_w=100.0) for i in range(3)], node="box-1", source="nvml")
    store.append(
        "requests",
        [{"node": "box-1", "source": "router", "request_id": "r0", "arrival_s": T0, "status": "ok"}],
    )
    store.flush()
    return store


def test_fresh_file_has_the_scenarios_table_and_the_trust_label(store: Store) -> None:
    assert store.schema_version == LATEST_VERSION >= 9
    cols = {c.name: (c.duckdb_type, c.not_null) for c in store.columns("scenarios")}
    assert cols == {
        "scenario_id": ("VARCHAR", True),
        "node": ("VARCHAR", True),
        "created_s": ("DOUBLE", True),
        "label": ("VARCHAR", True),
        "name": ("VARCHAR", False),
        "model": ("VARCHAR", False),
        "gpu": ("VARCHAR", False),
        "layout": ("JSON", False),
        "trace": ("JSON", False),
        "params": ("JSON", False),
        "start_s": ("DOUBLE", False),
        "end_s": ("DOUBLE", False),
        "wall_s": ("DOUBLE", False),
        "summary": ("JSON", False),
    }
    labels = store.query(
        "SELECT trust_label('sim:a', 'simulated', true) AS sim, trust_label('sim:a', 'nvml', false) AS sim_node, "
        "trust_label('box', 'simulated', NULL) AS sim_source, trust_label('box', 'emulated', true) AS emu, "
        "trust_label('box', 'nvml', false) AS measured, trust_label('box', 'nvml', NULL) AS unknown_emulated, "
        "trust_label('sim:a', 'router') AS two_sim, trust_label('box', 'router') AS two_measured"
    )
    assert labels.iloc[0].to_dict() == {
        "sim": "simulated",
        "sim_node": "simulated",
        "sim_source": "simulated",
        "emu": "emulated",
        "measured": "measured",
        "unknown_emulated": "measured",
        "two_sim": "simulated",
        "two_measured": "measured",
    }


def test_a_version_8_file_with_rows_migrates_to_9(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    assert apply_migrations(con, target_version=8) == list(range(1, 9))
    con.execute(
        'INSERT INTO gpu_samples (node, source, ts_s, device, "index", emulated, power_w) VALUES '
        "('box-1', 'nvml', 1.0, 'cuda:0', 0, false, 250.0), ('box-1', 'emulated', 1.0, 'emulated:h100-sxm', 0, true, 300.0)"
    )
    con.close()
    with Store.open(store_path) as store:
        assert store.schema_version == LATEST_VERSION
        versions = store.query("SELECT version FROM schema_version ORDER BY version")["version"].tolist()
        assert versions == list(range(1, LATEST_VERSION + 1))
        got = store.query(
            "SELECT device, power_w, trust_label(node, source, emulated) AS trust FROM gpu_samples ORDER BY device"
        )
        assert got.values.tolist() == [
            ["cuda:0", 250.0, "measured"],
            ["emulated:h100-sxm", 300.0, "emulated"],
        ]
        assert list_scenarios(store).empty
        add_simulated_scenario(store, "s1", T0)
        assert list_scenarios(store)["scenario_id"].tolist() == ["s1"]
    con = duckdb.connect(str(store_path), read_only=True)
    assert current_version(con) == LATEST_VERSION
    con.close()


def test_a_scenario_row_must_name_its_node_and_defaults_its_label(store: Store) -> None:
    store.append("scenarios", [{"scenario_id": "a", "node": "sim:a", "created_s": T0}])
    assert store.query("SELECT label FROM scenarios")["label"].tolist() == ["simulated"]
    with pytest.raises(StoreError, match="CHECK constraint"):
        store.append("scenarios", [{"scenario_id": "b", "node": "box-1", "created_s": T0}])
    assert scenario_node("run-1.a_b") == "sim:run-1.a_b"
    for bad in ("", "a/b", "../x", "-x", "x" * 129, "a b"):
        with pytest.raises(StoreError, match="scenario id must be"):
            scenario_node(bad)


def test_scenarios_are_listed_newest_first(store: Store) -> None:
    for i, sid in enumerate(("old", "new", "mid")):
        store.append(
            "scenarios", [{"scenario_id": sid, "node": f"sim:{sid}", "created_s": T0 + (0, 20, 10)[i]}]
        )
    assert list_scenarios(store)["scenario_id"].tolist() == ["new", "mid", "old"]
    assert list_scenarios(store, limit=1)["scenario_id"].tolist() == ["new"]


def test_simulated_rows_round_trip_through_parquet_beside_measured_rows(tmp_path: Path) -> None:
    with Store.open(tmp_path / "sim.duckdb") as sim:
        add_simulated_scenario(sim, "s1", T0)
        add_simulated_scenario(sim, "s2", T0 + 86_400.0)
        exported = export_parquet(sim, tmp_path / "pq")
        assert exported.rows["scenarios"] == 2 and exported.rows["gpu_samples"] == 40
        want = {
            t: sim.query(f"SELECT * FROM {t} ORDER BY ALL")
            for t in ("scenarios", "gpu_samples_full", "iterations", "requests", "tokens")
        }
        want_counts = _counts(sim, "sim:s1")
    manifest = json.loads((tmp_path / "pq" / EXPORT_MANIFEST).read_text())
    assert manifest["schema_version"] == LATEST_VERSION and manifest["rows"]["scenarios"] == 2
    assert (tmp_path / "pq" / "scenarios" / "date=2025-11-25").is_dir()

    with _measured_store(tmp_path / "main.duckdb") as main:
        result = import_parquet(main, tmp_path / "pq")
        assert result.schema_version == LATEST_VERSION
        assert result.inserted == {
            "gpu_samples": 40,
            "devices": 4,
            "iterations": 6,
            "requests": 6,
            "tokens": 24,
            "scenarios": 2,
        }
        assert all(n == 0 for n in result.duplicates.values())
        assert _counts(main, "sim:s1") == want_counts
        for t, df in want.items():
            got = main.query(f"SELECT * FROM {t} WHERE starts_with(node, 'sim:') ORDER BY ALL")
            assert got.equals(df), t
        trust = main.query(
            "SELECT trust_label(node, source, emulated) AS trust, count(*) AS n FROM gpu_samples GROUP BY ALL ORDER BY ALL"
        )
        assert trust.values.tolist() == [["measured", 3], ["simulated", 40]]
        req_trust = main.query(
            "SELECT trust_label(node, source) AS trust, count(*) AS n FROM requests GROUP BY ALL ORDER BY ALL"
        )
        assert req_trust.values.tolist() == [["measured", 1], ["simulated", 6]]
        scen = list_scenarios(main)
        assert scen["scenario_id"].tolist() == ["s2", "s1"]
        assert json.loads(scen["layout"][0]) == {"prefill": 1, "decode": 1}

        again = import_parquet(main, tmp_path / "pq")
        assert all(n == 0 for n in again.inserted.values())
        assert again.duplicates["scenarios"] == 2 and again.duplicates["gpu_samples"] == 40
        assert _counts(main, "sim:s1") == want_counts


def _export_of(tmp_path: Path, name: str) -> Path:
    with Store.open(tmp_path / f"{name}.duckdb") as sim:
        add_simulated_scenario(sim, name, T0)
        export_parquet(sim, tmp_path / name)
    return tmp_path / name


def test_import_refuses_what_is_not_an_export_and_writes_nothing(tmp_path: Path) -> None:
    good = _export_of(tmp_path, "good")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    unknown = _export_of(tmp_path, "unknown")
    (unknown / "requests").rename(unknown / "future_table")
    newer = _export_of(tmp_path, "newer")
    manifest = json.loads((newer / EXPORT_MANIFEST).read_text())
    (newer / EXPORT_MANIFEST).write_text(json.dumps({**manifest, "schema_version": LATEST_VERSION + 1}))
    garbled = _export_of(tmp_path, "garbled")
    (garbled / EXPORT_MANIFEST).write_text("{not json")
    cases = {
        tmp_path / "missing": "is not a directory of Parquet exports \\(it does not exist\\)",
        tmp_path / "a-file": "is not a directory of Parquet exports \\(it is a file\\)",
        tmp_path / "empty": "is not a phaselens export",
        unknown: "table\\(s\\) this store does not know: future_table",
        newer: f"schema version {LATEST_VERSION + 1}, newer than this store's \\(version {LATEST_VERSION}\\)",
        garbled: "not a readable export manifest",
    }
    with _measured_store(tmp_path / "main.duckdb") as main:
        before = _counts(main, "box-1")
        for path, message in cases.items():
            with pytest.raises(ExportFormatError, match=message):
                import_parquet(main, path)
        # a scenario row that breaks the labelling rolls back the rows imported before it
        bad = tmp_path / "bad" / "scenarios" / "date=2025-11-25" / "node=box-1"
        bad.mkdir(parents=True)
        con = duckdb.connect()
        con.execute(
            f"COPY (SELECT 'x' AS scenario_id, 'box-1' AS node, {T0} AS created_s, 'simulated' AS label) "
            f"TO '{bad / 'part.parquet'}' (FORMAT PARQUET)"
        )
        (tmp_path / "bad" / "requests").symlink_to(good / "requests")
        with pytest.raises(ExportFormatError, match=r"nothing was imported.*CHECK constraint"):
            import_parquet(main, tmp_path / "bad")
        assert _counts(main, "box-1") == before
        assert main.query("SELECT count(*) AS n FROM requests")["n"][0] == 1  # good's requests not kept
        assert import_parquet(main, good).inserted["requests"] == 3  # and the store still takes imports


def test_retention_leaves_simulated_rows_and_delete_scenario_removes_them(store: Store) -> None:
    add_simulated_scenario(store, "old", T0 - 400 * 86_400.0)  # virtual time far past every horizon
    store.append_gpu_samples([sample(T0 - 30 * 86_400.0 + i) for i in range(3)], node="box-1", source="nvml")
    before = _counts(store, "sim:old")
    result = apply_retention(store, RetentionPolicy(raw_days=7, rollup_days=365), now_s=T0)
    assert result.raw_rows_deleted == 3  # the measured samples were rolled up
    assert _counts(store, "sim:old") == before
    store.append_gpu_samples([sample(T0 + 1)], node="box-1", source="nvml")
    deleted = delete_scenario(store, "old")
    assert deleted == {k: v for k, v in before.items() if v}
    assert all(n == 0 for n in _counts(store, "sim:old").values())
    assert int(store.query("SELECT count(*) AS n FROM gpu_samples WHERE node = 'box-1'")["n"][0]) == 1
