"""Hive-partitioned Parquet export from two nodes' stores, merged without duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.store import Store, StoreError, export_parquet, import_parquet
from tests.collector.store.conftest import sample

DAY = 86_400.0
T0 = 1_764_028_800.0  # 2025-11-25 00:00:00 UTC


def _node_store(path: Path, node: str) -> Store:
    store = Store.open(path)
    samples = [
        sample(T0 + d * DAY + i, device=f"cuda:{g}", power_w=float(i))
        for d in (0, 1)
        for i in range(5)
        for g in (0, 1)
    ]
    store.append_gpu_samples(samples, node=node, source="nvml")
    store.append(
        "requests",
        [
            {
                "node": node,
                "source": "router",
                "request_id": f"{node}-r{i}",
                "arrival_s": T0 + i,
                "status": "ok",
            }
            for i in range(3)
        ],
    )
    store.append(
        "tokens", [{"node": node, "request_id": f"{node}-r0", "idx": k, "ts_s": T0 + k} for k in range(4)]
    )
    store.append(
        "engine_metrics",
        [
            {
                "node": node,
                "endpoint": "e",
                "ts_s": T0,
                "metric": "vllm:num_requests_running",
                "labels": {},
                "value": 1,
            }
        ],
    )
    store.append(
        "actions",
        [{"node": node, "ts_s": T0, "actor": "x", "action": "noop", "dry_run": True, "status": "planned"}],
    )
    return store


def _counts(store: Store) -> dict[str, int]:
    return {
        t: int(store.query(f"SELECT count(*) AS n FROM {t}")["n"][0])
        for t in ("gpu_samples", "requests", "tokens", "engine_metrics", "actions")
    }


def test_export_import_between_two_nodes_without_duplicates(tmp_path: Path) -> None:
    a = _node_store(tmp_path / "a.duckdb", "node-a")
    b = _node_store(tmp_path / "b.duckdb", "node-b")
    try:
        exported = export_parquet(a, tmp_path / "export-a")
        assert exported.rows["gpu_samples"] == 20 and exported.rows["requests"] == 3
        assert exported.rows["calibrations"] == 0
        day_dirs = sorted(p.name for p in (tmp_path / "export-a" / "gpu_samples").iterdir())
        assert day_dirs == ["date=2025-11-25", "date=2025-11-26"]
        assert (tmp_path / "export-a" / "gpu_samples" / "date=2025-11-25" / "node=node-a").is_dir()
        assert not (tmp_path / "export-a" / "calibrations").exists()

        before = _counts(b)
        result = import_parquet(b, tmp_path / "export-a")
        assert result.inserted == {
            "gpu_samples": 20,
            "devices": 2,  # cuda:0 and cuda:1 of node A, each described once
            "requests": 3,
            "tokens": 4,
            "engine_metrics": 1,
            "actions": 1,
        }
        assert all(v == 0 for v in result.duplicates.values())
        assert _counts(b) == {k: 2 * v for k, v in before.items()}
        per_node = b.query(
            "SELECT node, count(*) AS n, sum(power_w) AS w FROM gpu_samples GROUP BY node ORDER BY node"
        )
        assert per_node.values.tolist() == [["node-a", 20, 40.0], ["node-b", 20, 40.0]]
        # node A's rows came back intact, with their device attributes
        ra = b.query("SELECT * FROM gpu_samples_full WHERE node = 'node-a' ORDER BY ts_s, device")
        oa = a.query("SELECT * FROM gpu_samples_full ORDER BY ts_s, device")
        assert ra.equals(oa) and ra["uuid"].notna().all()

        # importing again, and an overlapping second export, adds nothing
        export_parquet(a, tmp_path / "export-a", start=T0 + DAY)  # same dir: new files beside the old
        again = import_parquet(b, tmp_path / "export-a")
        assert all(v == 0 for v in again.inserted.values())
        assert again.duplicates["gpu_samples"] == 30  # 20 + the 10 of day 2 exported twice
        assert _counts(b) == {k: 2 * v for k, v in before.items()}

        # and the merged store exports both nodes, partitioned by node
        export_parquet(b, tmp_path / "export-b", end=T0 + DAY)
        nodes = sorted(p.name for p in (tmp_path / "export-b" / "gpu_samples" / "date=2025-11-25").iterdir())
        assert nodes == ["node=node-a", "node=node-b"]
        assert not (tmp_path / "export-b" / "gpu_samples" / "date=2025-11-26").exists()
    finally:
        a.close()
        b.close()


def test_import_ignores_columns_the_table_lacks(tmp_path: Path) -> None:
    import duckdb

    out = tmp_path / "x" / "host_samples" / "date=2025-11-25" / "node=n"
    out.mkdir(parents=True)
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT 'n' AS node, {T0} AS ts_s, 42 AS pid, 1.5 AS cpu_pct, 'v9' AS future_col) "
        f"TO '{out / 'part.parquet'}' (FORMAT PARQUET)"
    )
    with Store.open(tmp_path / "s.duckdb") as store:
        result = import_parquet(store, tmp_path / "x")
        assert result.inserted == {"host_samples": 1}
        assert result.ignored_columns == {"host_samples": ["future_col"]}
        assert store.query("SELECT pid, cpu_pct, rss_bytes FROM host_samples").values.tolist()[0][:2] == [
            42,
            1.5,
        ]


def test_import_errors(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        with pytest.raises(StoreError, match="is not a directory"):
            import_parquet(store, tmp_path / "missing")
        with pytest.raises(StoreError, match="unknown table"):
            export_parquet(store, tmp_path / "out", tables=["nope"])


def test_an_export_from_a_start_carries_the_device_rows_in_effect(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.duckdb") as a:
        a.append_gpu_samples(
            [sample(T0 + i) for i in range(3)], node="n1", source="dcgm", k8s={"k8s_pod": "p0"}
        )
        a.append_gpu_samples(
            [sample(T0 + DAY + i) for i in range(3)], node="n1", source="dcgm", k8s={"k8s_pod": "p1"}
        )
        a.append_gpu_samples([sample(T0 + DAY + 10)], node="n1", source="dcgm", k8s={"k8s_pod": "p2"})
        exported = export_parquet(a, tmp_path / "out", start=T0 + DAY + 1, end=T0 + DAY + 5)
        assert exported.rows["gpu_samples"] == 2
        assert exported.rows["devices"] == 1  # p1, in effect from before the start; not p0, not p2
        want = a.query(
            "SELECT * FROM gpu_samples_full WHERE ts_s >= ? AND ts_s < ? ORDER BY ts_s",
            [T0 + DAY + 1, T0 + DAY + 5],
        )
    with Store.open(tmp_path / "b.duckdb") as b:
        assert import_parquet(b, tmp_path / "out").inserted == {"gpu_samples": 2, "devices": 1}
        got = b.query("SELECT * FROM gpu_samples_full ORDER BY ts_s")
        assert got.equals(want) and got["k8s_pod"].tolist() == ["p1", "p1"]


def test_an_export_of_the_version_5_shape_imports_its_device_attributes(tmp_path: Path) -> None:
    import duckdb

    out = tmp_path / "v5" / "gpu_samples" / "date=2025-11-25" / "node=n1"
    out.mkdir(parents=True)
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT 'n1' AS node, 'dcgm' AS source, {T0} + i::DOUBLE AS ts_s, 'cuda:0' AS device,
                         'cuda' AS kind, 0 AS "index", 'GPU-0' AS uuid, 'H100' AS name, false AS emulated,
                         100.0 + i::DOUBLE AS power_w, CASE WHEN i < 2 OR i > 3 THEN 'a' ELSE 'b' END AS k8s_pod,
                         'llm' AS k8s_namespace, NULL::VARCHAR AS k8s_container
                  FROM range(6) t(i))
            TO '{out / "part.parquet"}' (FORMAT PARQUET)"""
    )
    cols = 'node, source, ts_s, device, kind, "index", uuid, name, emulated, power_w, k8s_pod, k8s_namespace'
    wide = con.execute(f"SELECT {cols} FROM '{out / 'part.parquet'}' ORDER BY ts_s").fetchall()
    with Store.open(tmp_path / "s.duckdb") as store:
        result = import_parquet(store, tmp_path / "v5")
        assert result.inserted == {"gpu_samples": 6, "devices": 3}  # a, b, a again
        assert result.ignored_columns == {}
        with store.reader() as cur:
            assert cur.execute(f"SELECT {cols} FROM gpu_samples_full ORDER BY ts_s").fetchall() == wide
        again = import_parquet(store, tmp_path / "v5")
        assert again.inserted == {"gpu_samples": 0, "devices": 0}


def test_mig_dcgm_and_engine_columns_survive_export_and_import(tmp_path: Path) -> None:
    from collector.captures import capture
    from collector.sources import TABLE_ENGINE_METRICS, TABLE_GPU_SAMPLES
    from collector.sources.base import SourceResult
    from collector.sources.dcgm import rows_from_text
    from collector.sources.exposition import parse_exposition
    from collector.sources.prometheus import EngineMapper, EngineRows

    gpu = rows_from_text(capture("dcgm-exporter-a30-mig.prom"), source="dcgm:x", node="n1", ts_s=T0)
    res = SourceResult("engine:x", T0)
    samples = parse_exposition(capture("dynamo-vllm-worker.prom"), res)
    engine = EngineRows(EngineMapper()).rows(samples, node="n1", endpoint="w:9090", ts_s=T0, result=res)
    with Store.open(tmp_path / "a.duckdb") as a:
        a.append("gpu_samples", gpu.table_rows(TABLE_GPU_SAMPLES))
        a.append(TABLE_ENGINE_METRICS, engine)
        a.flush()
        export_parquet(a, tmp_path / "pq")
        cols = "device, power_w, gr_engine_active_pct, mig_instance_id, mig_profile, parent_uuid, exporter_hostname"
        want_gpu = a.query(f"SELECT {cols} FROM gpu_samples_full ORDER BY device")
        want_eng = a.query("SELECT engine, metric, labels, value FROM engine_metrics ORDER BY ALL")
    with Store.open(tmp_path / "b.duckdb") as b:
        import_parquet(b, tmp_path / "pq")
        got_gpu = b.query(f"SELECT {cols} FROM gpu_samples_full ORDER BY device")
        got_eng = b.query("SELECT engine, metric, labels, value FROM engine_metrics ORDER BY ALL")
    assert len(want_gpu) == 4 and want_gpu["mig_profile"].tolist()[1:] == ["2g.12gb", "1g.6gb", "1g.6gb"]
    assert got_gpu.equals(want_gpu)
    assert len(want_eng) > 10 and set(want_eng["engine"]) == {"dynamo_worker", "vllm"}
    assert got_eng.equals(want_eng)
