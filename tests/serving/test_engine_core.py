"""One engine step, two executors: the live engine's step driven in virtual time with the GPU model as
its executor and the simulator give the same schedules, iteration events, telemetry and token times."""

from __future__ import annotations

import random

import pytest

from serving.config import EngineConfig, SamplingParams, preset
from serving.devices.gpu_specs import gpu_spec
from serving.engine_core import Batch, EngineCore, Execution, VirtualClock, admit_handoffs
from serving.scheduler import Scheduler
from serving.sim.executor import GpuModelExecutor
from serving.sim.layout import parse_layout
from serving.sim.simulator import BATCH_EVENTS, Simulation
from serving.telemetry import TelemetryEmitter
from serving.trace import TraceRequest

SHAPE = preset("llama-3.1-8b")
T0 = 1_800_000_000.0
# A small KV cache (48 blocks of 16 = 768 tokens) and token budget: preemption and chunked prefill happen.
LAYOUT = "agg:1xh100-sxm:kv_blocks=48:max_num_batched_tokens=512:max_num_seqs=12"


def _trace(n: int = 60, seed: int = 5) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.uniform(0.005, 0.12)
        prompt = rng.randint(16, 600)
        out.append(TraceRequest(t, prompt, rng.randint(1, min(120, 768 - prompt))))
    return out


class Recording:
    """An executor that notes each batch's composition (request id, tokens) and runs the real one."""

    def __init__(self, inner: GpuModelExecutor) -> None:
        self.inner = inner
        self.schedules: list[list[tuple[str, int]]] = []

    def execute(self, batch: Batch) -> Execution:
        self.schedules.append([(i.seq.request_id, i.num_new_tokens) for i in batch.sched.items])
        return self.inner.execute(batch)


def _simulate(requests: list[TraceRequest]):
    layout = parse_layout(LAYOUT)
    sim = Simulation(layout, SHAPE, requests, start_s=T0, scenario="t")
    replica = sim.replicas[0]
    recording = Recording(replica.core.executor)
    replica.core.executor = recording
    return sim.run(), replica, recording.schedules


def _live(requests: list[TraceRequest], replica):
    """The engine's own loop, as a worker runs it, in virtual time: requests join at their arrival;
    an idle engine waits for the next one."""
    layout = parse_layout(LAYOUT)
    pool = layout.pools[0]
    recording = Recording(GpuModelExecutor(gpu_spec(layout.gpu), SHAPE, pool, link=layout.tp_link))
    batches: list[dict] = []
    clock = VirtualClock()
    engine = EngineCore(
        EngineConfig(
            block_size=16,
            num_blocks=pool.kv_blocks,
            max_num_seqs=pool.max_num_seqs,
            max_num_batched_tokens=pool.max_num_batched_tokens,
            chunked_prefill=pool.chunked_prefill,
            max_model_len=SHAPE.max_position,
        ),
        recording,
        worker_id="worker-0",
        device=f"simulated:{layout.gpu}",
        gpus=[(g.uuid, g.index) for g in replica.gpus],
        telemetry=TelemetryEmitter("worker-0", batches.append, max_batch_events=BATCH_EVENTS),
        stop_token_ids=SHAPE.eos_token_ids,
        clock=clock,
        time_offset_s=T0,
    )
    tokens: dict[str, list] = {}
    i = 0
    while i < len(requests) or engine.has_work():
        if not engine.has_work():
            clock.now_s = requests[i].arrival_s
        while i < len(requests) and requests[i].arrival_s <= clock.now_s:
            r = requests[i]
            engine.add_request(
                f"sim-{i}",
                [0] * r.prompt_tokens,
                SamplingParams(max_tokens=r.output_tokens, ignore_eos=True),
                arrival_s=r.arrival_s,
            )
            i += 1
        result = engine.step()
        assert result.end_s is not None, "an engine with work ran nothing"
        clock.now_s = result.end_s
        for o in result.outputs:
            tokens.setdefault(o.request_id, []).append(o)
    engine.telemetry.flush()
    return batches, tokens, recording.schedules


@pytest.fixture(scope="module")
def runs():
    requests = _trace()
    sim, replica, sim_schedules = _simulate(requests)
    live_batches, live_tokens, live_schedules = _live(requests, replica)
    return sim, sim_schedules, live_batches, live_tokens, live_schedules


def test_the_live_engine_runs_the_shared_step() -> None:
    from serving.engine import Engine

    for name in ("step", "begin", "update", "emit_iteration", "admit_imports"):
        assert getattr(Engine, name) is getattr(EngineCore, name), name


def test_same_schedules(runs) -> None:
    sim, sim_schedules, _, _, live_schedules = runs
    assert live_schedules == sim_schedules
    assert len(sim_schedules) == sim.iterations > 100
    assert any(len(s) > 1 for s in sim_schedules)  # batching happened
    assert any(n > 1 and n < 512 for s in sim_schedules for _, n in s)  # prompt chunks / prompts
    iters = [e for b in sim.batches for e in b["events"] if e["type"] == "iteration"]
    assert sum(e["preempted"] for e in iters) > 0  # the small cache preempted


def test_same_iteration_events_and_telemetry_batches(runs) -> None:
    sim, _, live_batches, _, _ = runs
    sim_batches = [b for b in sim.batches if b["source"] == "worker-0"]
    assert sim_batches and live_batches
    drop_sent = [{k: v for k, v in b.items() if k != "sent_s"} for b in sim_batches]
    assert [{k: v for k, v in b.items() if k != "sent_s"} for b in live_batches] == drop_sent


def test_same_tokens_and_request_timings(runs) -> None:
    sim, _, _, live_tokens, _ = runs
    requests = [e for b in sim.batches for e in b["events"] if e["type"] == "request"]
    assert len(requests) == len(live_tokens) == 60
    for ev in requests:
        outs = live_tokens[ev["request_id"]]
        assert [T0 + o.ts_s for o in outs] == ev["token_ts_s"]
        assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + ["length"]
        meta = outs[0].meta
        for key in ("first_scheduled_s", "prefill_start_s", "prefill_end_s"):
            assert T0 + meta[key] == ev[key], key
        assert outs[-1].meta is None or outs[-1].meta["num_preemptions"] == ev["preemptions"]


def _cfg(**kw) -> EngineConfig:
    return EngineConfig(**{"block_size": 4, "num_blocks": 8, "max_model_len": 64, "max_num_seqs": 8, **kw})


class _Nothing:
    def execute(self, batch: Batch) -> Execution:  # pragma: no cover - not stepped
        raise AssertionError


def test_a_handoff_that_does_not_fit_does_not_block_the_ones_behind_it() -> None:
    """Hand-off admission skips past a sequence whose blocks are not free (the simulator used to stop
    there, unlike the live engine: head-of-line blocking)."""
    core = EngineCore(_cfg(), _Nothing(), clock=VirtualClock())
    core.add_request("busy", list(range(12)), SamplingParams(max_tokens=4))  # 3 of the 8 blocks
    assert core.begin(0.0) is not None
    params = SamplingParams(max_tokens=2)
    core.queue_prefilled("big", list(range(24)), 23, params, 23)  # 6 blocks: waits
    core.queue_prefilled("small", list(range(8)), 7, params, 7)  # 2 blocks: fits now
    core.admit_imports()
    running = [s.request_id for s in core.scheduler.running]
    assert running == ["busy", "small"]
    assert core.num_pending_imports == 1


def test_admit_handoffs_keeps_arrival_order_and_the_seats_limit() -> None:
    sched = Scheduler(_cfg(max_num_seqs=2))
    core = EngineCore(_cfg(max_num_seqs=2), _Nothing(), clock=VirtualClock())
    for rid in ("a", "b", "c"):
        core.queue_prefilled(rid, list(range(5)), 4, SamplingParams(max_tokens=2), 4)
    pending = list(core._pending_imports)
    admitted = admit_handoffs(sched, pending, lambda p: p[0])
    assert [p[0].request_id for p in admitted] == ["a", "b"]
    assert [p[0].request_id for p in pending] == ["c"]
