"""Simulated device samples: the same counters an emulated GPU integrates for the same iterations."""

import numpy as np
import pytest

from serving.config import preset
from serving.devices import EmulatedDevice, IterationWork
from serving.sim.layout import parse_layout
from serving.sim.samples import CumulativeCounters, replica_samples, sample_times
from serving.sim.simulator import Simulation
from serving.trace import poisson_trace

SHAPE = preset("llama-3.1-8b")
T0 = 1_800_000_000.0
PERIOD_S = 0.1


def _run(layout: str):
    trace = poisson_trace(3.0, 60, prompt_tokens=(64, 2048), output_tokens=(8, 200), seed=5)
    return Simulation(parse_layout(layout), SHAPE, trace, start_s=T0, record_work=True).run()


@pytest.mark.parametrize(
    "layout", ["agg:1xh100-sxm", "agg:1xh200:power_limit_w=300", "agg:1xh100-sxm:sm_clock_mhz=990-1200"]
)
def test_counters_and_samples_equal_an_emulated_gpu_fed_the_same_iterations(layout):
    result = _run(layout)
    (replica,) = result.replicas
    pool = replica.pool
    # The device's clock runs from 0 like the simulation's (time.monotonic() would be small too).
    clock = [0.0]
    dev = EmulatedDevice(
        result.layout.gpu, model_shape=SHAPE, pace=False, clock=lambda: clock[0], sleep=lambda s: None
    )
    if pool.power_limit_w:
        dev.set_power_limit_w(pool.power_limit_w)
    if pool.sm_clock_mhz:
        dev.set_sm_clock_range_mhz(*pool.sm_clock_mhz)
    (cols,) = list(replica_samples(result, replica, PERIOD_S, 16 * 2**30))
    ts = sample_times(result, PERIOD_S)  # virtual seconds since T0 (the ts_s column is T0 + these)
    assert cols.columns["ts_s"] == pytest.approx(T0 + ts, abs=1e-6)
    checked = 0
    k = 0
    for start, tally in replica.works:  # virtual seconds since T0
        while k < len(ts) and ts[k] <= start:  # a reading between iterations sees every earlier one
            clock[0] = ts[k]
            snap = dev.snapshot(window_s=PERIOD_S)
            assert cols.columns["power_w"][k] == pytest.approx(snap.power_w, rel=1e-6, abs=1e-6)
            assert cols.columns["gpu_util_pct"][k] == pytest.approx(snap.gpu_util_pct, abs=1e-6)
            assert cols.columns["sm_active_pct"][k] == pytest.approx(snap.sm_active_pct, abs=1e-6)
            assert abs(int(cols.columns["energy_mj"][k]) - snap.energy_mj) <= 1
            if snap.gpu_util_pct == 0:
                assert cols.columns["sm_clock_mhz"][k] == snap.sm_clock_mhz
            checked += 1
            k += 1
        clock[0] = start
        dev.on_iteration(IterationWork(*tally), started_s=start, elapsed_s=0.0)
    clock[0] = result.end_s - T0
    snap = dev.snapshot()
    cum = CumulativeCounters(replica.intervals, dev.gpu, pool.sm_clock_mhz[1] if pool.sm_clock_mhz else None)
    end = cum.at(np.asarray([result.duration_s]))
    assert end["energy"][0] * 1000 == pytest.approx(snap.energy_mj, rel=1e-3)
    assert end["busy"][0] == pytest.approx(snap.busy_s_total, rel=1e-6)
    assert checked > 100


def test_sample_means_integrate_to_the_energy_counter():
    result = _run("agg:2xh100-sxm")
    for replica in result.replicas:
        (cols,) = list(replica_samples(result, replica, PERIOD_S, 16 * 2**30))
        c = cols.columns
        energy_j = np.diff(np.concatenate(([0], c["energy_mj"]))) / 1000.0
        assert np.sum(c["power_w"] * PERIOD_S) == pytest.approx(energy_j.sum(), rel=1e-4)
        assert np.all(np.diff(c["energy_mj"]) >= 0)
        assert np.all((c["gpu_util_pct"] >= 0) & (c["gpu_util_pct"] <= 100))
        assert c["power_w"].min() >= 0.99 * 72.0  # never below the H100's true idle


def test_a_decode_heavy_gpu_is_busy_while_its_sms_are_mostly_idle():
    trace = poisson_trace(2.0, 40, prompt_tokens=64, output_tokens=400, seed=1)
    result = Simulation(parse_layout("agg:1xh100-sxm"), SHAPE, trace, start_s=T0).run()
    (cols,) = list(replica_samples(result, result.replicas[0], PERIOD_S, 16 * 2**30))
    busy = cols.columns["gpu_util_pct"] > 50
    assert busy.sum() > 100
    assert np.median(cols.columns["sm_active_pct"][busy]) < 0.6 * np.median(
        cols.columns["gpu_util_pct"][busy]
    )
