"""CpuDevice and the Device base-class defaults."""

from __future__ import annotations

import json
import time
from dataclasses import FrozenInstanceError

import psutil
import pytest

from serving.devices import CpuDevice, DeviceNotSupportedError, DeviceSample, IterationWork

GPU_ONLY = [
    "gpu_util_pct",
    "mem_util_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "power_w",
    "energy_mj",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "clock_event_reasons",
    "locked_sm_clock_min_mhz",
    "locked_sm_clock_max_mhz",
]


def test_cpu_snapshot_reports_host_memory_and_no_gpu_metrics() -> None:
    before = time.time()
    s = CpuDevice().snapshot()
    assert before <= s.ts_s <= time.time()
    assert (s.device, s.kind, s.index, s.uuid, s.emulated, s.lost) == ("cpu", "cpu", None, None, False, False)
    assert s.mem_total_bytes == psutil.virtual_memory().total
    assert 0 < s.mem_used_bytes <= s.mem_total_bytes
    assert {name: getattr(s, name) for name in GPU_ONLY} == dict.fromkeys(GPU_ONLY)
    assert s.name


def test_sample_to_dict_is_flat_json() -> None:
    d = CpuDevice().snapshot().to_dict()
    assert set(d) == set(DeviceSample.__dataclass_fields__)
    assert json.loads(json.dumps(d)) == d


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("power_limit_constraints_w", ()),
        ("power_limit_w", ()),
        ("set_power_limit_w", (300.0,)),
        ("reset_power_limit", ()),
        ("sm_clock_range_mhz", ()),
        ("supported_sm_clocks_mhz", ()),
        ("set_sm_clock_range_mhz", (900, 1500)),
        ("reset_sm_clocks", ()),
    ],
)
def test_cpu_knobs_are_unsupported_and_name_the_device(method: str, args: tuple) -> None:
    with pytest.raises(DeviceNotSupportedError, match=r"^cpu does not support"):
        getattr(CpuDevice(), method)(*args)


def test_cpu_defaults() -> None:
    dev = CpuDevice()
    assert (dev.torch_device, dev.is_emulated) == ("cpu", False)
    knobs = dev.knobs()
    assert knobs["device"] == "cpu"
    assert all(value is None for key, value in knobs.items() if key not in ("device", "emulated"))
    work = IterationWork(phase="decode", prefill_tokens=0, decode_seqs=4, context_tokens=900, batch_size=4)
    assert dev.on_iteration(work, started_s=time.time(), elapsed_s=0.01) == 0.0
    with pytest.raises(FrozenInstanceError):
        work.batch_size = 5  # type: ignore[misc]
    dev.close()
    dev.close()
