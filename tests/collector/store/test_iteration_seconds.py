"""iteration_seconds: the store's per-second rollup of iterations, kept with every write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from collector.store import Store, delete_scenario, export_parquet, import_parquet
from collector.store import iteration_seconds as rollup
from collector.store.schema import LATEST_VERSION, apply_migrations
from serving.telemetry import SCHEMA, SCHEMA_VERSION

T0 = 1_764_028_800.0
COLS = "prefill_s, decode_s, mixed_prefill_s, mixed_decode_s, host_s"


def it(start: float, end: float, phase: str = "decode", **cols: Any) -> dict[str, Any]:
    return {
        "node": "n1",
        "source": "worker-0",
        "worker": "w0",
        "gpu_uuid": "GPU-a",
        "gpu_index": 0,
        "start_s": T0 + start,
        "end_s": T0 + end,
        "phase": phase,
        **cols,
    }


def per_second(con: Any, where: str = "TRUE") -> dict[tuple[Any, ...], tuple[float, ...]]:
    """(worker, uuid, second from T0) → summed columns of the rollup's rows (partial sums added)."""
    rows = con.execute(
        f"""SELECT worker, uuid, sec - {int(T0)}, sum(prefill_s), sum(decode_s), sum(mixed_prefill_s),
                   sum(mixed_decode_s), sum(host_s), sum(starts), sum(lagged), sum(negative), sum(unrolled),
                   min(min_end_s), max(max_start_s)
            FROM iteration_seconds WHERE {where} GROUP BY ALL ORDER BY ALL"""
    ).fetchall()
    return {tuple(r[:3]): tuple(round(x, 9) if isinstance(x, float) else x for x in r[3:]) for r in rows}


def rebuilt(path: Path) -> dict[tuple[Any, ...], tuple[float, ...]]:
    """The rollup recomputed from the iterations rows of the file (on a copy of its connection)."""
    con = duckdb.connect(str(path))
    try:
        con.begin()
        rollup.rebuild(con)
        out = per_second(con)
        con.rollback()
        return out
    finally:
        con.close()


def test_pieces_are_cut_at_whole_seconds_host_part_first(tmp_path: Path) -> None:
    rows = [  # times are binary fractions: exact beside T0
        # 0.5–1.5 s decode, modeled 0.75 s busy: host 0.5–0.75, busy 0.75–1.5
        it(0.5, 1.5, "decode", modeled_s=0.75),
        # prefill 1.75–4.25 s (crosses three boundaries), all busy (no modeled_s: the whole step)
        it(1.75, 4.25, "prefill"),
        # mixed 2.0–2.5, 3 prefill tokens + 1 decode seq: prefill share 0.75, lagged
        it(2.0, 2.5, "mixed", prefill_tokens=3, decode_seqs=1, lag_s=0.1),
        # no GPU: counted where it starts, no pieces
        {**it(0.25, 0.5, "decode"), "gpu_uuid": None},
        # ends before it starts: counted as negative, no pieces
        it(3.5, 3.25, "decode"),
    ]
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("iterations", rows)
        with store.reader() as cur:
            got = per_second(cur)
    assert got == {
        ("w0", None, 0): (0.0, 0.0, 0.0, 0.0, 0.0, 1, 0, 0, 0, T0 + 0.5, T0 + 0.25),
        ("w0", "GPU-a", 0): (0.0, 0.25, 0.0, 0.0, 0.25, 1, 0, 0, 0, T0 + 1.5, T0 + 0.5),
        ("w0", "GPU-a", 1): (0.25, 0.5, 0.0, 0.0, 0.0, 1, 0, 0, 0, T0 + 4.25, T0 + 1.75),
        ("w0", "GPU-a", 2): (1.0, 0.0, 0.375, 0.125, 0.0, 1, 1, 0, 0, T0 + 2.5, T0 + 2.0),
        ("w0", "GPU-a", 3): (1.0, 0.0, 0.0, 0.0, 0.0, 1, 0, 1, 0, T0 + 3.25, T0 + 3.5),
        ("w0", "GPU-a", 4): (0.25, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0, None, None),
    }


def test_a_simulated_row_is_busy_for_its_compute_s_a_measured_one_ignores_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("iterations", [it(0.0, 1.0, "decode", compute_s=0.25, modeled_s=0.5)])
        store.append(
            "iterations", [{**it(0.0, 1.0, "decode", compute_s=0.25), "source": "simulated", "worker": "w1"}]
        )
        with store.reader() as cur:
            got = per_second(cur)
    assert got[("w0", "GPU-a", 0)][1] == 0.5  # modeled_s: an emulated device's busy time
    assert got[("w1", "GPU-a", 0)][1] == 0.25  # the simulator's compute_s


def test_an_iteration_too_long_to_roll_up_is_counted_unrolled_and_the_reader_is_told(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("iterations", [it(0.0, 0.5), it(10.0, 10.0 + rollup.MAX_ROLLED_S + 1.0)])
        with store.reader() as cur:
            assert cur.execute("SELECT count(*) FROM iteration_seconds").fetchone()[0] == 2  # no 3,600 pieces
            assert per_second(cur)[("w0", "GPU-a", 10)][8] == 1
            assert not rollup.covers(cur, "node = ?", ["n1"])


def test_each_write_adds_its_rows_and_the_sums_equal_a_rebuild(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store.open(path) as store:
        store.append("iterations", [it(0.2, 0.7, "prefill"), it(0.7, 1.3)])
        store.append("iterations", [it(1.3, 1.9), it(1.9, 2.6, "mixed", prefill_tokens=1, decode_seqs=1)])
        ingest = store.append_telemetry_batch(
            {
                "schema": SCHEMA,
                "version": SCHEMA_VERSION,
                "source": "worker-0",
                "seq": 0,
                "sent_s": T0 + 5.0,
                "events": [
                    {
                        "type": "iteration",
                        "worker": "w0",
                        "start_s": T0 + 2.6,
                        "end_s": T0 + 3.05,
                        "phase": "decode",
                        "gpu_uuid": "GPU-a",
                        "gpu_index": 0,
                    }
                ],
            },
            "n1",
        )
        assert ingest.iterations == 1
        store.flush()
        with store.reader() as cur:
            assert (
                cur.execute("SELECT count(*) FROM iteration_seconds WHERE sec = ?", [int(T0) + 1]).fetchone()[
                    0
                ]
                == 2
            )  # second 1 has pieces from both appends: partial rows
            got = per_second(cur)
            assert rollup.covers(cur, "node = ?", ["n1"])
    assert got == rebuilt(path)
    assert got[("w0", "GPU-a", 3)][1] == pytest.approx(0.05)  # the telemetry batch's iteration, too


def test_rows_written_around_the_store_are_detected(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("iterations", [it(0.0, 0.5)])
        with store.transaction() as con:
            con.execute("INSERT INTO iterations SELECT * FROM iterations")  # plain SQL: no rollup rows
        with store.reader() as cur:
            assert not rollup.covers(cur, "node = ?", ["n1"])
        with store.transaction() as con:
            rollup.rebuild(con)
        with store.reader() as cur:
            assert rollup.covers(cur, "node = ?", ["n1"])
            assert per_second(cur)[("w0", "GPU-a", 0)][1] == 1.0


def test_an_import_rolls_up_the_rows_it_adds_and_not_the_duplicates(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.duckdb") as a:
        a.append("iterations", [it(0.5, 1.5), it(1.5, 2.25, "prefill")])
        export_parquet(a, tmp_path / "out")
    path = tmp_path / "b.duckdb"
    with Store.open(path) as b:
        b.append("iterations", [it(0.5, 1.5)])  # already there: skipped by the import
        result = import_parquet(b, tmp_path / "out")
        assert result.inserted["iterations"] == 1 and result.duplicates["iterations"] == 1
        with b.reader() as cur:
            got = per_second(cur)
            assert rollup.covers(cur, "node = ?", ["n1"])
    assert got == rebuilt(path)
    assert got[("w0", "GPU-a", 2)][0] == pytest.approx(0.25)


def test_deleting_a_scenario_deletes_its_rollup(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("scenarios", [{"scenario_id": "x", "created_s": T0, "node": "sim:x"}])
        store.append("iterations", [it(0.0, 0.5), {**it(0.0, 0.5), "node": "sim:x", "source": "simulated"}])
        delete_scenario(store, "x")
        with store.reader() as cur:
            assert cur.execute("SELECT DISTINCT node FROM iteration_seconds").fetchall() == [("n1",)]


def test_a_version_10_file_is_rolled_up_when_it_migrates(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    assert apply_migrations(con, target_version=10) == list(range(1, 11))
    con.execute(
        """INSERT INTO iterations (node, source, worker, start_s, end_s, phase, gpu_uuid, modeled_s)
           VALUES ('n1', 'worker-0', 'w0', ?, ?, 'decode', 'GPU-a', 0.5), ('n1', 'worker-0', 'w0', ?, ?, 'prefill', 'GPU-a', NULL)""",
        [T0 + 0.5, T0 + 1.5, T0 + 1.5, T0 + 2.0],
    )
    con.close()
    with Store.open(path) as store:
        assert store.schema_version == LATEST_VERSION
        with store.reader() as cur:
            got = per_second(cur)
            assert rollup.covers(cur, "node = ?", ["n1"])
    assert got[("w0", "GPU-a", 0)][:5] == (0.0, 0.0, 0.0, 0.0, 0.5)
    assert got[("w0", "GPU-a", 1)][:5] == (0.5, 0.5, 0.0, 0.0, 0.0)


def test_a_relation_without_the_needed_columns_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="phase"):
        rollup.rollup_sql("x", ["node", "worker", "start_s", "end_s"])


def test_rows_with_times_that_cannot_be_cut_into_seconds_are_kept_and_counted_unrolled(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append(
            "iterations",
            [it(0.0, 0.5), it(1.0, float("inf")), {**it(0.0, 0.5), "start_s": -1e300, "end_s": 1e300}],
        )
        with store.reader() as cur:
            assert cur.execute("SELECT count(*) FROM iterations").fetchone()[0] == 3  # the store keeps them
            assert cur.execute("SELECT sum(unrolled) FROM iteration_seconds").fetchone()[0] == 2
            assert not rollup.covers(cur, "node = ?", ["n1"])  # readers take the raw rows
