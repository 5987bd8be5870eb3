"""Imports run as jobs on the collector's writer thread, between the writes of its sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.service import Collector, CollectorNotRunning, CollectorSettings
from collector.sources.base import Source, SourceResult
from collector.store import ExportFormatError, Store, export_parquet
from tests.collector.store.conftest import add_simulated_scenario
from tests.collector.test_writer import wait_for

T0 = 1_764_028_800.0


class Ticks(Source):
    """A host sample on every poll, with a new time each: the writer always has rows to store."""

    def __init__(self) -> None:
        super().__init__("ticks", interval_s=0.01)
        self.n = 0

    def _discover(self) -> bool:
        return True

    def _collect(self, now_s: float, result: SourceResult) -> None:
        self.n += 1
        result.add_rows("host_samples", [{"node": "box-1", "ts_s": T0 + self.n, "pid": 1, "cpu_pct": 5.0}])


def _count(store: Store, sql: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {sql}")["n"][0])


def test_imports_run_on_the_writer_beside_its_sources_and_a_failed_one_leaves_it_running(
    tmp_path: Path,
) -> None:
    with Store.open(tmp_path / "sim.duckdb") as sim:
        add_simulated_scenario(sim, "s1", T0)
        export_parquet(sim, tmp_path / "export")
    settings = CollectorSettings(db_path=str(tmp_path / "main.duckdb"), nvml=False, flush_interval_s=0.05)
    with Store.open(settings.db_path) as store:
        collector = Collector(settings, store, [Ticks()])
        with pytest.raises(CollectorNotRunning, match="not running"):
            collector.import_export(tmp_path / "export")  # no writer yet
        collector.start()
        try:
            wait_for(lambda: collector.stats.rows_written.get("host_samples", 0) >= 3)
            with pytest.raises(ExportFormatError, match="does not exist"):
                collector.import_export(tmp_path / "missing").result(timeout=60)
            result = collector.import_export(tmp_path / "export").result(timeout=60)
            assert result.inserted["scenarios"] == 1 and result.inserted["gpu_samples"] == 20
            written = collector.stats.rows_written["host_samples"]
            wait_for(lambda: collector.stats.rows_written["host_samples"] > written)  # the writer goes on
            again = collector.import_export(tmp_path / "export").result(timeout=60)
            assert sum(again.inserted.values()) == 0 and again.duplicates["gpu_samples"] == 20
        finally:
            collector.stop()
        with pytest.raises(CollectorNotRunning):
            collector.import_export(tmp_path / "export")
        health = collector.health()
        assert health["writer"]["imports"] == 2 and health["writer"]["store_errors"] == 0
        assert _count(store, "scenarios") == 1 and _count(store, "gpu_samples WHERE node = 'sim:s1'") == 20
        assert _count(store, "host_samples") == collector.stats.rows_written["host_samples"]


class Recorder:
    """A service job (what phaselens/api.py adds: the report scheduler, the metrics export) that
    notes when it starts and stops, and whether the writer took jobs at that moment."""

    def __init__(self, name: str, log: list[tuple[str, str, bool]], collector: Collector) -> None:
        self.name, self.log, self.collector = name, log, collector

    def _writer_open(self) -> bool:
        try:
            self.collector.submit(lambda: None).result(timeout=10)
        except CollectorNotRunning:
            return False
        return True

    def start(self) -> None:
        self.log.append(("start", self.name, self._writer_open()))

    def stop(self) -> None:
        self.log.append(("stop", self.name, self._writer_open()))

    def health(self) -> dict[str, str]:
        return {"job": self.name}


def test_service_jobs_start_after_the_writer_stop_before_it_and_report_health_by_name(
    tmp_path: Path,
) -> None:
    settings = CollectorSettings(db_path=str(tmp_path / "main.duckdb"), nvml=False, flush_interval_s=0.05)
    log: list[tuple[str, str, bool]] = []
    with Store.open(settings.db_path) as store:
        collector = Collector(settings, store, [])
        first, second = Recorder("first", log, collector), Recorder("second", log, collector)
        collector.add_job(first, health_key="first")
        collector.add_job(second)
        assert "reports" not in collector.health()  # the collector runs no report scheduler itself
        collector.start()
        try:
            health = collector.health()
            assert health["first"] == {"job": "first"}
            assert "second" not in health
        finally:
            collector.stop()
    assert log == [
        ("start", "first", True),
        ("start", "second", True),
        ("stop", "second", True),
        ("stop", "first", True),
    ]
