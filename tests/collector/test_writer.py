"""The collector's writer thread in process: duplicates counted apart, retention at start, its flags."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collector.cli import build_parser, collect_settings
from collector.service import Collector, CollectorSettings
from collector.sources.base import Source, SourceResult
from collector.sources.serving_stack import TABLE_TELEMETRY
from collector.store import RetentionPolicy, Store
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
