"""gpu_samples stored keyed: gpu_sample_rows + gpu_keys behind the gpu_samples view."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from collector.store import Store, export_parquet, import_parquet
from collector.store.columns import ColumnBlock, RepeatedColumns
from collector.store.schema import LATEST_VERSION, apply_migrations
from tests.collector.store.conftest import sample

T0 = 1_764_028_800.0
_OLD_COLUMNS = [
    "node", "source", "ts_s", "device", "index", "emulated", "gpu_util_pct", "mem_util_pct",
    "sm_active_pct", "sm_occupancy_pct", "tensor_active_pct", "dram_active_pct", "power_w", "energy_mj",
    "power_limit_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "mem_used_bytes", "mem_total_bytes",
    "clock_event_reasons", "locked_sm_clock_min_mhz", "locked_sm_clock_max_mhz", "lost",
    "gr_engine_active_pct", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "host_bound_pct",
]  # fmt: skip


def _rows(store: Store, sql: str) -> list[tuple]:
    with store.reader() as cur:
        return cur.execute(sql).fetchall()


def _keys(store: Store) -> list[tuple]:
    return _rows(
        store, 'SELECT gpu_key, node, source, device, "index", emulated FROM gpu_keys ORDER BY gpu_key'
    )


def test_a_version_9_file_migrates_every_sample_to_the_keyed_tables(store_path: Path) -> None:
    con = duckdb.connect(str(store_path))
    assert apply_migrations(con, target_version=9) == list(range(1, 10))
    con.execute(
        'INSERT INTO gpu_samples (node, source, ts_s, device, "index", emulated, power_w, energy_mj) VALUES '
        "('box-1', 'nvml', 2.0, 'cuda:0', 0, false, 250.0, 10), "
        "('box-1', 'nvml', 1.0, 'cuda:0', 0, false, 240.0, 5), "
        "('box-1', 'dcgm', 1.0, 'cuda:0', 0, false, 241.0, NULL), "
        "('box-2', 'cpu', 1.5, 'cpu', NULL, false, NULL, NULL)"
    )
    before = con.execute("SELECT * FROM gpu_samples ORDER BY node, source, ts_s").fetchall()
    con.close()
    with Store.open(store_path) as store:
        assert store.schema_version == LATEST_VERSION >= 10
        assert [c.name for c in store.columns("gpu_samples")] == _OLD_COLUMNS
        assert _rows(store, "SELECT * FROM gpu_samples ORDER BY node, source, ts_s") == before
        assert len(_keys(store)) == 3  # one per GPU identity; the cpu's NULL index is one identity
        stored = store.query("SELECT * FROM gpu_sample_rows LIMIT 0").columns.tolist()
        assert stored[:2] == ["gpu_key", "ts_s"] and "node" not in stored and "device" not in stored
        # required columns stay required through the view
        assert {c.name for c in store.columns("gpu_samples") if c.not_null} == {
            "node",
            "source",
            "ts_s",
            "device",
            "emulated",
        }


def test_each_gpu_gets_one_key_whatever_path_its_samples_take(store_path: Path) -> None:
    with Store.open(store_path) as store:
        store.append_gpu_samples([sample(T0, "cuda:0"), sample(T0, "cuda:1")], node="a", source="nvml")
        # the collector's path: column blocks, identity shared poll after poll (dictionary-encoded)
        shared = RepeatedColumns()
        blocks = []
        for i in range(3):
            values = {"ts_s": [T0 + i + 1] * 2, "power_w": [100.0 + i, 200.0 + i]}
            identity = {"device": ["cuda:1", "cuda:2"], "index": [1, 2], "emulated": [False, False]}
            rest, repeats = shared.split({**values, **identity}, identity)
            blocks.append(ColumnBlock.of(rest, {"node": "a", "source": "nvml"}, repeats))
        assert store.append_columns("gpu_samples", blocks) == 6
        store.append("gpu_samples", pa.table({"node": ["b"], "source": ["dcgm"], "ts_s": [T0],
                                             "device": ["cuda:0"], "index": [0], "emulated": [False]}))  # fmt: skip
        store.flush()
        assert _keys(store) == [
            (0, "a", "nvml", "cuda:0", 0, False),
            (1, "a", "nvml", "cuda:1", 1, False),
            (2, "a", "nvml", "cuda:2", 2, False),
            (3, "b", "dcgm", "cuda:0", 0, False),
        ]
        per_gpu = store.query("SELECT device, count(*) AS n FROM gpu_samples WHERE node = 'a' GROUP BY ALL")
        assert dict(zip(per_gpu["device"], per_gpu["n"], strict=True)) == {
            "cuda:0": 1,
            "cuda:1": 4,
            "cuda:2": 3,
        }
    with Store.open(store_path) as store:  # keys persist: a GPU seen again keeps its key
        store.append_gpu_samples(
            [sample(T0 + 9, "cuda:2"), sample(T0 + 9, "cuda:3")], node="a", source="nvml"
        )
        store.flush()
        assert [k[0] for k in _keys(store)] == [0, 1, 2, 3, 4]
        assert _keys(store)[4] == (4, "a", "nvml", "cuda:3", 3, False)


def test_an_import_and_the_writer_share_the_keys(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.duckdb") as src:
        src.append_gpu_samples(
            [sample(T0 + i, "cuda:0", power_w=1.0) for i in range(3)], node="n", source="nvml"
        )
        src.flush()
        export_parquet(src, tmp_path / "out")
    with Store.open(tmp_path / "b.duckdb") as store:
        store.append_gpu_samples([sample(T0 + 10, "cuda:1")], node="n", source="nvml")
        store.flush()
        result = import_parquet(store, tmp_path / "out")
        assert result.inserted["gpu_samples"] == 3
        assert import_parquet(store, tmp_path / "out").duplicates["gpu_samples"] == 3  # natural key kept
        # the writer learns the key the import gave cuda:0 instead of adding the GPU twice
        store.append_gpu_samples(
            [sample(T0 + 20, "cuda:0"), sample(T0 + 20, "cuda:1")], node="n", source="nvml"
        )
        store.flush()
        assert [k[3] for k in _keys(store)] == ["cuda:1", "cuda:0"]
        counts = store.query("SELECT device, count(*) AS n FROM gpu_samples GROUP BY ALL ORDER BY device")
        assert counts.values.tolist() == [["cuda:0", 4], ["cuda:1", 2]]
