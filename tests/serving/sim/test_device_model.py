"""The fitted device model (a cpu device in the simulator) and the front end's dispatch delay."""

from __future__ import annotations

import random

import pytest

from serving.config import preset
from serving.devices.base import IterationWork
from serving.devices.gpu_model import IterationEstimate
from serving.sim.device_model import (
    DeviceModelError,
    FittedDeviceModel,
    iteration_events,
    measured_dispatch_delay_s,
    work_features,
)
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation, SimulationError
from serving.trace import TraceRequest, poisson_trace

# a "true" device: 2 ms + 50 µs per prompt token + 300 µs per decoding sequence + 1 µs per context token
TRUE = (2e-3, 50e-6, 300e-6, 1e-6, 0.0)
LOOP_S = 0.4e-3


def true_time_s(prefill: int, decode: int, context: int, batch: int) -> float:
    return float(
        sum(c * f for c, f in zip(TRUE, work_features(prefill, decode, context, batch), strict=True))
    )


def synthetic_events(n: int = 400, *, seed: int = 0, spikes: float = 0.0, noise_s: float = 0.0) -> list[dict]:
    """Back-to-back iterations of one worker: a mix of prefill, decode and mixed work."""
    rng = random.Random(seed)
    t, out = 1000.0, []
    for _ in range(n):
        decode = rng.randint(0, 12)
        prompts = rng.choice([0, 0, 0, 1, 2]) if decode else rng.randint(1, 2)
        prefill = sum(rng.randint(16, 300) for _ in range(prompts))
        context = prefill + sum(rng.randint(20, 400) for _ in range(decode))
        batch = decode + prompts
        dt = true_time_s(prefill, decode, context, batch) + rng.gauss(0.0, noise_s)
        if rng.random() < spikes:
            dt += 0.02  # preempted by another process
        phase = "mixed" if prefill and decode else "prefill" if prefill else "decode"
        out.append(
            {
                "type": "iteration",
                "worker": "worker-0",
                "device": "cpu",
                "start_s": t,
                "end_s": t + dt,
                "phase": phase,
                "batch_size": batch,
                "prefill_tokens": prefill,
                "decode_seqs": decode,
                "context_tokens": context,
            }
        )
        t += dt + LOOP_S
    return out


def test_fit_recovers_the_coefficients_and_loop_time_of_exact_data() -> None:
    model = FittedDeviceModel.fit(synthetic_events())
    assert model.coefficients == pytest.approx(TRUE, rel=1e-6, abs=1e-9)
    assert model.between_s == pytest.approx(LOOP_S, rel=1e-6)
    assert model.quality.r2 == pytest.approx(1.0)
    assert model.quality.rmse_s < 1e-9 and model.quality.iterations == 400
    assert model.device == "cpu"


def test_fit_is_robust_to_rare_preemption_spikes_and_keeps_them_as_residuals() -> None:
    events = synthetic_events(spikes=0.05, noise_s=1e-4)
    model = FittedDeviceModel.fit(events)
    # a plain least-squares intercept would absorb ~5 % x 20 ms = +1 ms
    assert model.coefficients[0] == pytest.approx(TRUE[0], abs=3e-4)
    assert model.coefficients[2] == pytest.approx(TRUE[2], rel=0.1)
    assert model.quality.median_abs_rel_error < 0.05
    assert max(model.residuals_s + model.prefill_residuals_s) > 0.015  # kept for jittered()


def test_no_work_coefficient_is_negative_even_for_collinear_terms() -> None:
    # context grows exactly with decode_seqs: a plain fit splits the cost with arbitrary signs
    events = synthetic_events(noise_s=3e-4, seed=3)
    for ev in events:
        ev["context_tokens"] = ev["prefill_tokens"] + 100 * ev["decode_seqs"]
    model = FittedDeviceModel.fit(events)
    assert all(c >= 0 for c in model.coefficients[1:])
    mean_pred = sum(
        model.iteration_s(e["prefill_tokens"], e["decode_seqs"], e["context_tokens"], e["batch_size"])
        for e in events
    )
    assert mean_pred == pytest.approx(sum(e["end_s"] - e["start_s"] for e in events), rel=0.05)


def test_fit_refuses_too_few_or_malformed_events() -> None:
    with pytest.raises(DeviceModelError, match="at least 8"):
        FittedDeviceModel.fit(synthetic_events(5))
    bad = synthetic_events(20)
    del bad[3]["decode_seqs"]
    with pytest.raises(DeviceModelError, match="decode_seqs"):
        FittedDeviceModel.fit(bad)


def test_the_model_times_simulated_iterations_and_says_nothing_about_power() -> None:
    model = FittedDeviceModel.fit(synthetic_events())
    est = model(IterationWork("decode", 0, 4, 800, 4))
    assert isinstance(est, IterationEstimate)
    assert est.busy_s == pytest.approx(true_time_s(0, 4, 800, 4), rel=1e-6)
    assert est.time_s == pytest.approx(est.busy_s + LOOP_S) and est.host_s == pytest.approx(LOOP_S)
    assert est.power_w == 0 and est.sm_clock_mhz == 0 and est.sm_active == 0

    trace = poisson_trace(20.0, 30, prompt_tokens=(16, 200), output_tokens=(4, 24), seed=1)
    layout = parse_layout(
        "agg:1xh200:max_num_seqs=64:max_num_batched_tokens=4096:chunked_prefill=off:kv_blocks=512"
    )
    result = Simulation(layout, preset("tiny"), trace, iteration_model=model).run()
    assert result.finished == 30 and result.failed == 0
    its = iteration_events(result.batches)
    assert its and all(
        ev["modeled_s"]
        == pytest.approx(
            model.iteration_s(ev["prefill_tokens"], ev["decode_seqs"], ev["context_tokens"], ev["batch_size"])
            + LOOP_S
        )
        for ev in its
    )


def test_jittered_model_resamples_the_residuals_reproducibly() -> None:
    model = FittedDeviceModel.fit(synthetic_events(spikes=0.1, noise_s=2e-4))
    work = IterationWork("decode", 0, 2, 300, 2)
    draws = [model.jittered(7)(work).busy_s for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]  # the same seed starts the same sequence
    stream = model.jittered(7)
    seq = [stream(work).busy_s for _ in range(200)]
    assert len(set(seq)) > 50 and min(seq) >= model.floor_s
    mean = sum(seq) / len(seq)
    assert mean == pytest.approx(
        model(work).busy_s + sum(model.residuals_s) / len(model.residuals_s), abs=1e-3
    )


def _request(arrival: float, scheduled: float) -> dict:
    return {"arrival_s": arrival, "first_scheduled_s": scheduled, "prefill_worker": "worker-0"}


def test_dispatch_delay_counts_only_requests_that_found_the_engine_idle() -> None:
    its = [
        {"worker": "worker-0", "start_s": 10.002, "end_s": 10.040},
        {"worker": "worker-0", "start_s": 10.040, "end_s": 10.080},
        {"worker": "worker-0", "start_s": 20.003, "end_s": 20.040},
    ]
    requests = [
        _request(10.0, 10.002),  # idle: 2 ms
        _request(10.010, 10.040),  # arrived during an iteration: queueing, not dispatch
        _request(20.0, 20.003),  # idle: 3 ms
        _request(30.0, 30.004),  # idle: 4 ms
    ]
    its_all = [*its, {"worker": "worker-0", "start_s": 30.004, "end_s": 30.1}]
    assert measured_dispatch_delay_s(requests, its_all) == pytest.approx(0.003)
    assert measured_dispatch_delay_s([_request(10.010, 10.040)], its) is None


def test_simulation_dispatch_delay_shifts_admission_but_not_the_arrival() -> None:
    layout = parse_layout("agg:1xh200:kv_blocks=256")
    trace = [TraceRequest(0.0, 100, 8), TraceRequest(5.0, 50, 4)]

    def ttfts(delay: float) -> list[float]:
        result = Simulation(layout, preset("llama-3.1-8b"), trace, dispatch_delay_s=delay).run()
        reqs = sorted(
            (e for b in result.batches for e in b["events"] if e["type"] == "request"),
            key=lambda e: e["arrival_s"],
        )
        assert [e["arrival_s"] for e in reqs] == [0.0, 5.0]
        return [e["first_token_s"] - e["arrival_s"] for e in reqs]

    base, delayed = ttfts(0.0), ttfts(0.004)
    assert delayed == pytest.approx([t + 0.004 for t in base])
    with pytest.raises(SimulationError, match="dispatch_delay_s"):
        Simulation(layout, preset("llama-3.1-8b"), trace, dispatch_delay_s=-1.0)
