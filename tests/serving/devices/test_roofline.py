"""The roofline count (FLOPs and HBM bytes of an iteration), MFU/MBU, activities that follow the work,
and the GPUs / dtypes the model runs but was not validated on (issue 23 points 4 and 5)."""

from __future__ import annotations

import pytest

from serving.config import ModelConfig, preset
from serving.devices.base import IterationWork
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_model import predict_iteration
from serving.devices.gpu_specs import GPU_SPECS, fidelity, gpu_spec_for_name
from serving.devices.roofline import count_work, rank_dims_of_shape

# 2 layers, hidden 8, MLP 16, 2 query heads and 1 KV head of 4, vocabulary 10
SMALL = ModelConfig("small", 10, 8, 16, 2, 2, 1, 64)
MIXED = IterationWork("mixed", 3, 2, 10, 3, attention_pairs=20, sampled_seqs=3)
LLAMA_8B = preset("llama-3.1-8b")
LLAMA_70B = preset("llama-3.1-70b")


def decode(batch: int, ctx: int = 1024) -> IterationWork:
    return IterationWork("decode", 0, batch, batch * ctx, batch, batch * ctx, batch)


def test_count_matches_a_hand_count_of_a_small_shape() -> None:
    dims = rank_dims_of_shape(SMALL)
    # per layer: attention 8·4·(2·2 + 2·1) = 192, MLP 3·8·16 = 384, norms 16 -> 592; + final norm 8
    assert dims.body_params == 2 * 592 + 8 and dims.lm_head_params == 80
    c = count_work(dims, MIXED)
    # 5 tokens: 2·1192·5 linear + 4·2 layers·2 heads·4·20 pairs attention + 2·80·3 LM head
    assert c.flops == 11920 + 1280 + 480
    # weights 1192·2 + KV (10 read + 5 written)·32 + activations 5·416 + LM head 80·2 + 3·(8 + 10)·2
    assert c.hbm_bytes == 2384 + 480 + 2080 + 160 + 108
    fp8 = count_work(rank_dims_of_shape(SMALL, dtype="fp8"), MIXED)
    assert fp8.flops == c.flops and fp8.hbm_bytes == 1192 + 15 * 16 + 2080 + 80 + 108
    # a prompt chunk that does not sample skips the LM head; no tokens: no work
    chunk = count_work(dims, IterationWork("prefill", 3, 0, 3, 1, attention_pairs=6, sampled_seqs=0))
    assert chunk.flops == 2 * 1192 * 3 + 4 * 2 * 2 * 4 * 6
    assert count_work(dims, IterationWork("idle", 0, 0, 0, 0)).flops == 0.0


def test_tensor_parallel_count_is_one_rank_s_shard() -> None:
    one = count_work(rank_dims_of_shape(LLAMA_70B, 1), decode(8))
    eight = count_work(rank_dims_of_shape(LLAMA_70B, 8), decode(8))
    assert eight.flops == pytest.approx(one.flops / 8, rel=0.01)  # hidden-size norms are replicated
    assert one.hbm_bytes / 8 < eight.hbm_bytes < one.hbm_bytes / 6  # activations of hidden size are not split


def test_estimate_carries_the_count_and_its_utilisations() -> None:
    est = predict_iteration("h200", LLAMA_8B, decode(40))
    c = count_work(rank_dims_of_shape(LLAMA_8B), decode(40))
    assert (est.flops, est.hbm_bytes) == (c.flops, c.hbm_bytes)
    assert est.mfu == pytest.approx(c.flops / (est.busy_s * 989e12))
    assert est.mbu == pytest.approx(c.hbm_bytes / (est.busy_s * 4.8e12))
    assert est.executed_flops > est.flops  # 40 rows padded to GEMM tiles, the executed work
    assert 0 < est.mfu < 0.1 < 0.4 < est.mbu < 1  # decode: bandwidth-bound


def test_activities_follow_the_work() -> None:
    small, big = (
        predict_iteration("h200", LLAMA_70B, decode(b, 2048), tp=8, profile="vllm") for b in (8, 256)
    )
    assert big.tensor_active > 3 * small.tensor_active and big.mfu > 5 * small.mfu
    assert big.sm_active > small.sm_active
    # SM activity is the SMs a kernel's CTAs fill: the tiny model's few tiles leave most idle
    tiny = predict_iteration("h200", preset("tiny"), decode(8), profile="vllm")
    llama = predict_iteration("h200", LLAMA_8B, decode(8), profile="vllm")
    assert tiny.sm_active < 0.5 * llama.sm_active
    # DRAM activity is the executed bytes over the busy time at the peak bandwidth
    assert llama.dram_active == pytest.approx(llama.executed_bytes / (llama.busy_s * 4.8e12))


def test_blackwell_and_fp8_predictions_run_and_are_unvalidated() -> None:
    base = predict_iteration("h200", LLAMA_70B, decode(64, 2048), tp=8)
    assert base.validated and fidelity("h200") == (True, None)
    for gpu, dtype in (("b200", "bf16"), ("b200", "fp8"), ("gb200", "fp8"), ("h200", "fp8")):
        est = predict_iteration(gpu, LLAMA_70B, decode(64, 2048), tp=8, dtype=dtype)
        ok, note = fidelity(gpu, dtype)
        assert not est.validated and not ok and note.startswith("unvalidated")
        assert est.peak_flops_s == GPU_SPECS[gpu].peak_flops_for(dtype) and est.dtype == dtype
        assert est.busy_s < base.busy_s  # more bandwidth, or half the bytes
    fp8 = predict_iteration("h200", LLAMA_70B, decode(64, 2048), tp=8, dtype="fp8")
    assert fp8.hbm_bytes < 0.6 * base.hbm_bytes and fp8.peak_flops_s == pytest.approx(
        2 * base.peak_flops_s, rel=0.01
    )
    with pytest.raises(DeviceValueError, match="no FP8 tensor cores"):
        predict_iteration("a100-sxm-80gb", LLAMA_8B, decode(8), dtype="fp8")
    with pytest.raises(DeviceValueError, match="allowed: bf16, fp8"):
        predict_iteration("h200", LLAMA_8B, decode(8), dtype="int4")


def test_specs_name_their_sources_and_are_found_by_nvml_name() -> None:
    for spec in GPU_SPECS.values():
        assert spec.source and spec.num_sms > 100
        assert gpu_spec_for_name(spec.name) is spec
        assert gpu_spec_for_name(f"{spec.name} (emulated)") is spec
    assert GPU_SPECS["b200"].fp8_tflops == 2 * GPU_SPECS["b200"].bf16_tflops == 4500
    assert gpu_spec_for_name("NVIDIA H200 NVL") is GPU_SPECS["h200"] and gpu_spec_for_name("Tesla T4") is None
