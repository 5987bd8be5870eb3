"""The live engine counts each iteration's FLOPs and HBM bytes from the tensors it holds, and its count
equals the GPU model's for the same work (issue 23 point 4)."""

from __future__ import annotations

import pytest
import torch

from serving.config import BYTE_EOS, BYTE_VOCAB, EngineConfig, ModelConfig, SamplingParams, preset
from serving.devices import CpuDevice, EmulatedDevice
from serving.devices.base import IterationWork
from serving.devices.gpu_model import predict_iteration
from serving.devices.roofline import count_work, rank_dims_of_shape
from serving.engine import Engine, live_rank_dims
from serving.model import LlamaForCausalLM
from serving.telemetry import TelemetryEmitter

CFG = ModelConfig(
    name="test-roofline",
    vocab_size=BYTE_VOCAB,
    hidden_size=64,
    intermediate_size=160,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    max_position=512,
    rope_theta=10_000.0,
    eos_token_ids=(BYTE_EOS,),
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.set_num_threads(1)
    return LlamaForCausalLM(CFG).init_random(0, std=0.2).to(torch.bfloat16).eval()


def _run(model: LlamaForCausalLM, device) -> tuple[list[IterationWork], list[dict]]:
    """Serve three requests; the work of each iteration (as the executor saw it) and its events."""
    batches: list[dict] = []
    tel = TelemetryEmitter("worker-r", batches.append, max_batch_events=1000)
    eng = Engine(model, EngineConfig(block_size=4, num_blocks=64, max_model_len=512), device, telemetry=tel)
    works: list[IterationWork] = []
    execute = eng.executor.execute

    def seen(batch):
        works.append(IterationWork(*batch.work))
        return execute(batch)

    eng.executor.execute = seen
    for i, p in enumerate([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while eng.has_work():
        eng.step()
    tel.flush()
    return works, [e for b in batches for e in b["events"] if e["type"] == "iteration"]


def test_the_engine_reads_its_dimensions_from_its_tensors(model) -> None:
    eng = Engine(model, EngineConfig(block_size=4, num_blocks=8, max_model_len=512), CpuDevice())
    assert live_rank_dims(model, eng.cache) == rank_dims_of_shape(CFG, 1, "bf16")
    # an fp32 copy moves twice the weight and KV bytes: the count follows the tensors, not the config
    fp32 = LlamaForCausalLM(CFG).init_random(0).eval()
    eng32 = Engine(fp32, EngineConfig(block_size=4, num_blocks=8, max_model_len=512), CpuDevice())
    dims32 = live_rank_dims(fp32, eng32.cache)
    assert (dims32.weight_bytes, dims32.kv_bytes) == (4, 4)


def test_live_count_equals_the_model_s_count_for_the_same_work(model) -> None:
    works, events = _run(model, CpuDevice())
    assert len(events) == len(works) >= 3 and {w.phase for w in works} >= {"prefill", "decode"}
    for work, event in zip(works, events, strict=True):
        est = predict_iteration("h200", CFG, work)  # the GPU model, bf16, TP 1, for the same work
        assert (event["flops"], event["hbm_bytes"]) == (est.flops, est.hbm_bytes) != (0.0, 0.0), work
        hand = count_work(rank_dims_of_shape(CFG), work)
        assert (event["flops"], event["hbm_bytes"]) == (hand.flops, hand.hbm_bytes)


def test_an_emulated_device_s_events_carry_the_modeled_shape_s_count(model) -> None:
    """On an emulated GPU the modeled time is the modeled shape's, so is the count."""
    shape = preset("llama-3.1-8b")
    dev = EmulatedDevice("h200", model_shape=shape)
    _works, events = _run(model, dev)
    last = dev.last_estimate
    assert events[-1]["flops"] == last.flops and events[-1]["hbm_bytes"] == last.hbm_bytes
    assert all(e["flops"] > 2 * 7e9 for e in events)  # 8B parameters per token, not the tiny model's
