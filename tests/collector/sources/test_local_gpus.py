"""The local NVML source on scripted NVML scenarios, rows written to a real store."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.service import Collector, CollectorSettings
from collector.sources.local_gpus import LocalGpuSource
from collector.store import Store
from serving.devices import nvml as nvml_module
from tests.serving.devices.fake_nvml import NVML_ERROR_DRIVER_NOT_LOADED, FakeGpu, FakeNvml


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setattr(nvml_module, "_import_pynvml", lambda: fake)
    return fake


def test_a_lost_gpu_is_marked_and_the_other_keeps_being_sampled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install(monkeypatch, FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-lost", lost_after_calls=25)]))
    src = LocalGpuSource(node="n1")
    assert src.available()
    polls = [src.poll(force=True) for _ in range(6)]
    rows = [r for p in polls for r in p.table_rows("gpu_samples")]
    by_gpu = {d: [r for r in rows if r["device"] == d] for d in ("cuda:0", "cuda:1")}
    assert len(by_gpu["cuda:0"]) == 6 and not any(r["lost"] for r in by_gpu["cuda:0"])
    lost = [r for r in by_gpu["cuda:1"] if r["lost"]]
    assert lost and all(r["power_w"] is None for r in lost)
    assert src.health().status == "ok"
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("gpu_samples", rows)
        store.flush()
        counts = store.query(
            "SELECT device, count(*) AS n, count_if(lost) AS lost FROM gpu_samples GROUP BY 1 ORDER BY 1"
        )
    assert counts["n"].tolist() == [6, 6] and counts["lost"].tolist()[0] == 0


@pytest.mark.parametrize(
    ("fake", "says"),
    [
        (FakeNvml([], init_error=NVML_ERROR_DRIVER_NOT_LOADED), "NVML could not start"),
        (FakeNvml([]), "NVML sees no GPU"),
        (None, "nvidia-ml-py package is not installed"),
        (FakeNvml([FakeGpu()]), None),
    ],
    ids=["no-driver", "no-gpu", "no-pynvml", "one-gpu"],
)
def test_a_collector_says_why_it_does_not_sample_this_hosts_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeNvml | None, says: str | None
) -> None:
    if fake is None:

        def missing() -> None:
            raise ImportError("No module named 'pynvml'")

        monkeypatch.setattr(nvml_module, "_import_pynvml", missing)
    else:
        install(monkeypatch, fake)
    nvml_module._probe.cache_clear()
    with Store.open(tmp_path / "s.duckdb") as store:
        collector = Collector(CollectorSettings(db_path=str(tmp_path / "s.duckdb")), store)
        health = collector.health()
        nothing = collector.notes()
        off = Collector(CollectorSettings(db_path=str(tmp_path / "s.duckdb"), nvml=False), store).notes()
    assert health["status"] == "ok" and health["notes"] == nothing
    if says is None:  # NVML sees a GPU: it is sampled, nothing to say
        assert [type(s).__name__ for s in collector.sources] == ["LocalGpuSource"] and nothing == []
    else:
        assert collector.sources == []
        assert nothing[0].startswith("this host's GPUs are not sampled: ") and says in nothing[0]
        assert nothing[1].startswith("no sources: nothing is sampled and the store only takes imports")
    assert off[0] == "this host's GPUs are not sampled: --no-nvml"


def test_unsupported_metrics_are_null_not_strings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gpu = FakeGpu(
        name="NVIDIA A100-SXM4-80GB",
        gpm_supported=False,
        unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature"},
    )
    install(monkeypatch, FakeNvml([gpu]))
    src = LocalGpuSource(node="n1")
    rows = src.poll(force=True).table_rows("gpu_samples") + src.poll(force=True).table_rows("gpu_samples")
    assert all(r["energy_mj"] is None and r["temperature_c"] is None for r in rows)
    assert all(r["sm_active_pct"] is None for r in rows)  # no GPM on this GPU
    assert all(r["power_w"] is not None for r in rows)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("gpu_samples", rows)
        store.flush()
        df = store.query("SELECT energy_mj, temperature_c, power_w FROM gpu_samples")
    assert df["energy_mj"].isna().all() and df["power_w"].notna().all()


def test_no_nvml_means_the_source_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeNvml([FakeGpu()], init_error=9))  # NVML_ERROR_DRIVER_NOT_LOADED
    src = LocalGpuSource(node="n1")
    assert not src.available()
    result = src.poll(force=True)
    assert not result.ok and src.health().status == "down"
