"""The collector's writer thread in process: duplicates counted apart, retention at start, its flags."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collector.service import Collector, CollectorSettings
from collector.sources.base import Source, SourceResult
from collector.sources.serving_stack import TABLE_TELEMETRY
from collector.store import RetentionPolicy, Store
from phaselens.cli import build_parser
from phaselens.cli.collect import collect_settings
from serving.telemetry import SCHEMA, SCHEMA_VERSION


def wait_for(fn, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not fn():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class Replay(Source):
    """Hands the same telemetry batch to the writer on every poll (a reader that re-reads)."""

    def __init__(self, batch: dict) -> None:
        super().__init__("replay", interval_s=0.01)
        self.batch = batch

    def _discover(self) -> bool:
        return True

    def _collect(self, now_s: float, result: SourceResult) -> None:
        result.add_rows(TABLE_TELEMETRY, [self.batch])


def test_batches_read_again_are_counted_as_duplicates_not_as_written(tmp_path: Path) -> None:
    event = {"type": "control", "ts_s": 1.0, "action": "tick"}
    batch = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "source": "router",
        "seq": 0,
        "sent_s": 1.0,
        "events": [event],
    }
    settings = CollectorSettings(db_path=str(tmp_path / "d.duckdb"), nvml=False, flush_interval_s=0.05)
    with Store.open(settings.db_path) as store:
        collector = Collector(settings, store, [Replay(batch)])
        collector.start()
        try:
            wait_for(lambda: collector.stats.duplicates.get(TABLE_TELEMETRY, 0) >= 3)
        finally:
            collector.stop()
        writer = collector.health()["writer"]
        assert writer["rows_written"][TABLE_TELEMETRY] == 1
        polls = collector.sources[0].health().rows_total
        assert writer["duplicates"][TABLE_TELEMETRY] == polls - 1
        assert store.query("SELECT count(*) AS n FROM telemetry_batches")["n"][0] == 1
        assert store.query("SELECT count(*) AS n FROM control_events")["n"][0] == 1


def test_retention_runs_at_start_not_only_after_the_first_interval(tmp_path: Path) -> None:
    settings = CollectorSettings(
        db_path=str(tmp_path / "r.duckdb"),
        nvml=False,
        flush_interval_s=0.05,
        retention=RetentionPolicy(raw_days=1, rollup_days=30),
        retention_interval_s=3600.0,
    )
    old_s = time.time() - 3 * 86_400
    with Store.open(settings.db_path) as store:
        store.append(
            "gpu_samples",
            [
                {
                    "node": "n1",
                    "source": "nvml",
                    "ts_s": old_s + i,
                    "device": "cuda:0",
                    "index": 0,
                    "emulated": False,
                    "power_w": 100.0,
                }
                for i in range(5)
            ],
        )
        store.flush()
        collector = Collector(settings, store, [])
        collector.start()
        try:
            wait_for(lambda: collector.stats.retention_runs >= 1)
        finally:
            collector.stop()
        assert collector.stats.raw_rows_rolled_up == 5
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
        assert store.query("SELECT sum(samples) AS n FROM gpu_samples_10s")["n"][0] == 5


def test_retention_interval_flag_sets_the_period_and_bad_values_are_named() -> None:
    parse = build_parser().parse_args
    assert collect_settings(parse(["collect"])).retention_interval_s == 600.0
    assert collect_settings(parse(["collect", "--retention-interval-s", "30"])).retention_interval_s == 30.0
    with pytest.raises(ValueError, match="--retention-interval-s must be in"):
        collect_settings(parse(["collect", "--retention-interval-s", "0"]))
    with pytest.raises(ValueError, match="rollup_days"):
        collect_settings(parse(["collect", "--raw-days", "10", "--rollup-days", "5"]))


class Once(Source):
    """Hands the given telemetry batches to the writer in one poll, then nothing."""

    def __init__(self, batches: list[dict]) -> None:
        super().__init__("serving-telemetry:once", interval_s=0.01)
        self.batches = batches

    def _discover(self) -> bool:
        return True

    def _collect(self, now_s: float, result: SourceResult) -> None:
        result.add_rows(TABLE_TELEMETRY, self.batches)
        self.batches = []


def test_a_batch_the_store_refuses_costs_only_itself_not_the_batches_polled_with_it(tmp_path: Path) -> None:
    def batch(seq: int, kv_bytes: int) -> dict:
        event = {"type": "request", "request_id": f"r{seq}", "arrival_s": 1.0, "kv_transfer_bytes": kv_bytes}
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "source": "router",
            "seq": seq,
            "sent_s": 1.0 + seq,
            "events": [event],
        }

    settings = CollectorSettings(db_path=str(tmp_path / "b.duckdb"), nvml=False, flush_interval_s=0.05)
    with Store.open(settings.db_path) as store:
        # an integer too large for BIGINT passes the event checks but not the column's type
        collector = Collector(settings, store, [Once([batch(0, 1), batch(1, 2**70), batch(2, 3)])])
        collector.start()
        try:
            wait_for(lambda: collector.stats.store_errors >= 1 and collector.stats.flushes >= 2)
        finally:
            collector.stop()
        assert store.query("SELECT request_id FROM requests ORDER BY 1")["request_id"].tolist() == [
            "r0",
            "r2",
        ]
        assert collector.stats.rows_written[TABLE_TELEMETRY] == 2
        errors = store.query("SELECT kind, count FROM ingest_errors")
        assert errors.values.tolist() == [["store_rejected", 1]]


def _gpu_poll(k: int) -> SourceResult:
    res = SourceResult("nvml", float(k))
    res.add_columns(
        "gpu_samples",
        {"ts_s": [float(k)], "device": ["cuda:0"], "index": [0], "emulated": [False]},
        {"node": "n1", "source": "nvml"},
    )
    return res


def test_drains_commit_once_per_flush_interval_and_stop_writes_the_rest(tmp_path: Path) -> None:
    def stored(store: Store) -> int:
        return int(store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0])

    with Store.open(tmp_path / "a.duckdb", buffer_rows=1_000) as store:
        collector = Collector(CollectorSettings(nvml=False, flush_interval_s=3600.0), store, sources=[])
        for k in range(3):
            collector._put(_gpu_poll(k))
            collector._drain()  # the interval has not passed: left to the store's buffer
        assert (collector.stats.flushes, stored(store)) == (0, 0)
        assert collector.stats.rows_written == {"gpu_samples": 3}
        collector.stop()
        assert stored(store) == 3
    with Store.open(tmp_path / "b.duckdb", buffer_rows=1_000) as store:
        collector = Collector(CollectorSettings(nvml=False, flush_interval_s=0.0), store, sources=[])
        for k in range(3):
            collector._put(_gpu_poll(k))
            collector._drain()  # due every time: committed at once
            assert stored(store) == k + 1
        assert collector.stats.flushes == 3


def test_a_full_queue_drops_its_oldest_results_and_counts_them(tmp_path: Path) -> None:
    with Store.open(tmp_path / "q.duckdb") as store:
        collector = Collector(CollectorSettings(nvml=False, max_queue=3), store, sources=[])
        for k in range(5):
            collector._put(_gpu_poll(k))
        assert collector.health()["queue_depth"] == 3
        collector._drain()
        assert collector.health()["queue_depth"] == 0
        assert collector.stats.results_dropped == 2
        stored = store.query("SELECT ts_s FROM gpu_samples ORDER BY 1")["ts_s"].tolist()
        assert stored == [2.0, 3.0, 4.0]  # the newest three
        errors = store.query("SELECT source, kind, count FROM ingest_errors").values.tolist()
        assert errors == [["collector", "writer_behind", 2]]
    with Store.open(tmp_path / "u.duckdb") as store:  # max_queue 0: unbounded (queue.Queue's rule)
        collector = Collector(CollectorSettings(nvml=False, max_queue=0), store, sources=[])
        for k in range(5):
            collector._put(_gpu_poll(k))
        collector._drain()
        assert collector.stats.results_dropped == 0
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 5


def test_a_failed_background_flush_is_a_store_error_not_a_rejection_of_the_source_appending(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "f.duckdb", buffer_rows=3) as store:
        with store.transaction() as con:  # a write DuckDB refuses: two samples with the same ts_s
            con.execute("CREATE UNIQUE INDEX one_ts ON gpu_sample_rows(ts_s)")
        collector = Collector(CollectorSettings(nvml=False, flush_interval_s=3600.0), store, sources=[])
        for k in (0, 0, 1):
            collector._put(_gpu_poll(k))
        collector._drain()  # 3 rows: due, handed to a background flush, which fails
        for k in (2, 3, 4):
            collector._put(_gpu_poll(k))
        collector._drain()  # due again: the append reports the failed flush, then is taken
        collector.stop()
        assert (collector.stats.store_errors, collector.stats.rows_lost) == (1, 3)
        assert "background flush of 3 rows to gpu_samples" in collector.stats.last_error
        assert collector.stats.rows_written == {"gpu_samples": 6}
        assert collector.health()["writer"]["rows_lost"] == 3
        stored = store.query("SELECT ts_s FROM gpu_samples ORDER BY 1")["ts_s"].tolist()
        assert stored == [2.0, 3.0, 4.0]
        assert store.query("SELECT count(*) AS n FROM ingest_errors")["n"][0] == 0  # no source's rejection


def test_the_problems_of_a_flush_are_stored_together_and_a_bad_one_costs_only_itself(
    tmp_path: Path,
) -> None:
    """Every counted problem of the results written lands in ingest_errors (``info`` ones are not
    stored); a problem row the store refuses (here a fraction of a count) is lost alone."""
    settings = CollectorSettings(db_path=str(tmp_path / "d.duckdb"), nvml=False)
    with Store.open(settings.db_path) as store:
        collector = Collector(settings, store, sources=[])
        results = []
        for k in range(3):
            res = SourceResult(f"src-{k}", float(k))
            res.count("unmapped", f"FAMILY_{k}: no column", severity="warning")
            res.count("non_finite", f"value {k}: nan", n=2)
            res.count("duplicate_timestamp", "ignored", severity="info")
            results.append(res)
        collector.write_results(results)
        rows = store.query("SELECT source, kind, count FROM ingest_errors ORDER BY source, kind")
        assert rows.to_dict("records") == [
            {"source": f"src-{k}", "kind": kind, "count": n}
            for k in range(3)
            for kind, n in (("non_finite", 2), ("unmapped", 1))
        ]
        bad = SourceResult("src-bad", 9.0)
        bad.count("unmapped", "FAMILY_X: no column")
        bad.errors[0].count = 1.5  # type: ignore[assignment]  # not a count: refused by the store
        good = SourceResult("src-good", 9.0)
        good.count("unmapped", "FAMILY_Y: no column")
        collector.write_results([bad, good])
        kept = store.query("SELECT source FROM ingest_errors WHERE source IN ('src-bad', 'src-good')")
        assert kept["source"].tolist() == ["src-good"]
