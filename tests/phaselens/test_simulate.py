"""`phaselens simulate`: scenarios land in the real store, labelled, through every write path."""

from __future__ import annotations

import time

import duckdb
import httpx
import pytest

from collector.store import Store
from phaselens.cli import main
from tests.collector.conftest import start_collector

TOKEN = "sim-import-token"


def _simulate(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--no-progress", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_two_layouts_are_compared_and_stored_as_labelled_scenarios(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    rc, out, _ = _simulate(
        capsys, "--layout", "agg:2xh100-sxm", "--layout", "1p1d:h100-sxm", "--limit", "60", "--db", str(db)
    )
    assert rc == 0
    assert "SIMULATED" in out and "agg:2xh100-sxm" in out and "1p1d:h100-sxm" in out
    assert out.count("labelled simulated") == 2
    con = duckdb.connect(str(db), read_only=True)
    scenarios = con.execute(
        "SELECT scenario_id, node, label, model, layout->>'mode' FROM scenarios"
    ).fetchall()
    assert len(scenarios) == 2
    # the output says how to analyze each: `phaselens analyze` alone reads the (empty) live data
    for sid, *_ in scenarios:
        assert f"  phaselens analyze --db {db} --dataset {sid}\n" in out
    assert {s[4] for s in scenarios} == {"aggregated", "disaggregated"}
    for sid, node, label, model, _ in scenarios:
        assert node == f"sim:{sid}" and label == "simulated" and model == "llama-3.1-8b"
        n_req = con.execute("SELECT count(*) FROM requests WHERE node = ?", [node]).fetchone()[0]
        n_tok = con.execute("SELECT count(*) FROM tokens WHERE node = ?", [node]).fetchone()[0]
        out_tok = con.execute("SELECT sum(output_tokens) FROM requests WHERE node = ?", [node]).fetchone()[0]
        assert n_req == 60 and n_tok == out_tok
        labels = con.execute(
            "SELECT DISTINCT trust_label(node, source, emulated), kind FROM gpu_samples_full WHERE node = ?",
            [node],
        ).fetchall()
        assert labels == [("simulated", "simulated")]
        # every iteration ties to a GPU whose devices row names the worker and role that ran it
        orphan = con.execute(
            """SELECT count(*) FROM iterations_full WHERE node = ? AND (role IS NULL OR gpu_uuid IS NULL)""",
            [node],
        ).fetchone()[0]
        assert orphan == 0
    assert con.execute("SELECT count(*) FROM ingest_errors").fetchone()[0] == 0


def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys):
    db = tmp_path / "bad.duckdb"
    cases = [
        (["--layout", "agg:1xh100-sxm", "--model", "llama-3.1-70b"], "needs 141"),
        (["--layout", "agg:3xh100-sxm:tp3"], "tp"),
        (["--layout", "agg:2xtpu-v5"], "unknown GPU 'tpu-v5'"),
        (["--layout", "agg:1xh100-sxm", "--duration", "0.000001", "--start", "3000"], "no requests"),
        (["--layout", "agg:1xh100-sxm", "--from-store", "soon"], "is not a time span; use e.g. 90s"),
        (["--layout", "agg:1xh100-sxm", "--sample-period-s", "0"], "--sample-period-s must be in"),
    ]
    for args, says in cases:
        rc, _, err = _simulate(capsys, *args, "--db", str(db))
        assert rc == 2, args
        assert says in err, (args, err)
    assert not db.exists()  # nothing was written, not even an empty store


def test_stored_traffic_is_replayed_on_another_layout(tmp_path, capsys):
    db = tmp_path / "live.duckdb"
    now = time.time()
    rows = [
        {
            "node": "box-1",
            "source": "router",
            "request_id": f"r{i}",
            "arrival_s": now - 600 + 2 * i,
            "prompt_tokens": 300 + i,
            "output_tokens": 20 + i,
            "status": "ok",
        }
        for i in range(40)
    ]
    rows.append(
        {
            "node": "box-1",
            "source": "router",
            "request_id": "old",
            "arrival_s": now - 7200,
            "prompt_tokens": 10,
            "output_tokens": 10,
            "status": "ok",
        }
    )
    with Store.open(db) as store:
        store.append("requests", rows)
    rc, out, _ = _simulate(capsys, "--layout", "4p4d:h100-sxm", "--from-store", "1h", "--db", str(db))
    assert rc == 0 and "40 (0)" in out  # the request older than an hour is not replayed
    rc, out, _ = _simulate(capsys, "--layout", "agg:1xh100-sxm", "--from-store", "1h", "--db", str(db))
    assert rc == 0 and "40 (0)" in out  # the first scenario's own (simulated) requests are not traffic
    con = duckdb.connect(str(db), read_only=True)
    for (node,) in con.execute("SELECT node FROM scenarios").fetchall():
        replayed = con.execute(
            "SELECT prompt_tokens, output_tokens FROM requests WHERE node = ? ORDER BY arrival_s LIMIT 3",
            [node],
        ).fetchall()
        assert replayed == [(300, 20), (301, 21), (302, 22)]


def test_a_running_collector_merges_the_scenario_and_guards_its_file(tmp_path, capsys):
    db = tmp_path / "main.duckdb"
    proc, url = start_collector(db, "--control-token", TOKEN)
    try:
        rc, _, err = _simulate(capsys, "--layout", "agg:1xh100-sxm", "--limit", "20", "--db", str(db))
        assert rc == 2 and "--collector" in err  # the collector holds the file: told how to go through it
        rc, _, err = _simulate(capsys, "--layout", "agg:1xh100-sxm", "--limit", "20", "--collector", url)
        assert rc == 2 and "token" in err
        rc, out, err = _simulate(
            capsys, "--layout", "agg:1xh100-sxm", "--limit", "20", "--collector", url, "--token", TOKEN
        )
        assert rc == 0, err
        assert f"merged through {url}" in out
        (scenario,) = httpx.get(f"{url}/api/v1/scenarios", timeout=10).json()["scenarios"]
        assert scenario["label"] == "simulated" and scenario["layout"]["mode"] == "aggregated"
        reqs = httpx.get(
            f"{url}/api/v1/tables/requests", params={"node": scenario["node"], "start": 0}, timeout=10
        ).json()["rows"]
        assert len(reqs) == 20
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("extra", [["--out"]])
def test_a_parquet_export_merges_later_with_store_import(tmp_path, capsys, extra):
    out_dir = tmp_path / "export"
    rc, _, _ = _simulate(capsys, "--layout", "agg:1xh100-sxm", "--limit", "15", *extra, str(out_dir))
    assert rc == 0 and (out_dir / "requests").is_dir()
    db = tmp_path / "later.duckdb"
    assert main(["store", "import", str(out_dir), "--db", str(db)]) == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM requests WHERE node LIKE 'sim:%'").fetchone()[0] == 15
    assert con.execute("SELECT count(*) FROM scenarios").fetchone()[0] == 1


def test_an_import_keeps_every_tensor_parallel_rank_of_an_iteration(tmp_path, capsys):
    """A TP-2 replica writes one iteration row per GPU, same worker and start: the import's dedupe must
    keep both (it once kept one, and the GPU of the other rank read as host-bound)."""
    args = ["--layout", "agg:2xh100-sxm:tp2", "--model", "llama-3.1-70b", "--limit", "12"]
    assert _simulate(capsys, *args, "--db", str(tmp_path / "direct.duckdb"))[0] == 0
    assert _simulate(capsys, *args, "--out", str(tmp_path / "export"))[0] == 0
    db = tmp_path / "imported.duckdb"
    assert main(["store", "import", str(tmp_path / "export"), "--db", str(db)]) == 0
    per_gpu = "SELECT gpu_index, count(*) FROM iterations WHERE node LIKE 'sim:%' GROUP BY ALL ORDER BY 1"
    direct = duckdb.connect(str(tmp_path / "direct.duckdb"), read_only=True).execute(per_gpu).fetchall()
    imported = duckdb.connect(str(db), read_only=True).execute(per_gpu).fetchall()
    assert [g for g, _ in direct] == [0, 1] and imported == direct


def test_the_sample_tables_repeated_columns_are_the_values_on_every_row() -> None:
    """_sample_table builds each repeated string from its bytes and shares what GPUs share (a
    replica's columns, each string): the same table as the values repeated row by row."""
    import numpy as np
    import pyarrow as pa

    from phaselens.cli.simulate import _sample_table
    from serving.sim.samples import SampleColumns

    n = 5
    columns = {"ts_s": np.arange(n, dtype=np.float64), "locked_sm_clock_min_mhz": [None] * n}
    columns["locked_sm_clock_max_mhz"] = [1980] * n
    cache: dict = {}
    for index, uuid, worker in ((0, "GPU-a", "w0"), (1, "GPU-b", ""), (2, "GPU-ü", "w0")):
        cols = SampleColumns(index, uuid, worker, "mixed", columns)
        table = _sample_table(cols, "node-1", "h100-sxm", "H100", cache)
        strings = {
            "node": "node-1",
            "source": "simulated",
            "device": "simulated:h100-sxm",
            "kind": "simulated",
            "uuid": uuid,
            "name": "H100 (simulated)",
            "worker": worker,
            "role": "mixed",
        }
        for name, value in strings.items():
            assert table.column(name).to_pylist() == [value] * n, name
        assert table.column("index").to_pylist() == [index] * n
        assert table.column("locked_sm_clock_min_mhz").type == pa.int32()
        assert table.column("locked_sm_clock_min_mhz").to_pylist() == [None] * n
        assert table.column("locked_sm_clock_max_mhz").to_pylist() == [1980] * n
        assert table.column("emulated").to_pylist() == [True] * n
        assert table.column("ts_s").to_pylist() == list(range(n))
