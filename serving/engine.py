"""One worker's inference engine: the shared step (`serving.engine_core`) with the torch model as its
executor and a paged KV cache on the device."""

from __future__ import annotations

import time
from typing import Any

import torch

from serving.config import EngineConfig, ModelConfig, SamplingParams
from serving.devices.base import Device, IterationWork
from serving.devices.roofline import RankDims, count_work
from serving.engine_core import Batch, EngineCore, Execution, Handoff, StepResult, TokenOutput
from serving.model import AttentionBatch, KVCache, LlamaForCausalLM
from serving.sampling import Sampler, SamplingError
from serving.scheduler import SchedulerOutput
from serving.sequence import Sequence
from serving.telemetry import TelemetryEmitter

__all__ = ["Engine", "Handoff", "StepResult", "TokenOutput", "TorchExecutor", "live_rank_dims"]


def live_rank_dims(model: LlamaForCausalLM, cache: KVCache) -> RankDims:
    """The dimensions of the work this engine really runs, read from the tensors it holds (its
    weight matrices' shapes and element size, its KV cache's element size), not from its config:
    the live side of the roofline count (serving/devices/roofline.py)."""
    layers = model.model.layers
    attn, mlp = layers[0].self_attn, layers[0].mlp
    q_out, hidden = attn.q_proj.weight.shape
    head_dim = attn.head_dim
    return RankDims(
        layers=len(layers),
        hidden=int(hidden),
        intermediate=int(mlp.gate_proj.weight.shape[0]),
        heads=int(q_out) // head_dim,
        kv_heads=int(attn.k_proj.weight.shape[0]) // head_dim,
        head_dim=head_dim,
        vocab=int(model.lm_head.weight.shape[0]),
        body_params=sum(p.numel() for p in layers.parameters()) + model.model.norm.weight.numel(),
        lm_head_params=model.lm_head.weight.numel(),
        weight_bytes=model.lm_head.weight.element_size(),
        kv_bytes=cache.k.element_size(),
    )


class TorchExecutor:
    """The live executor: the model's forward pass over the batch and sampling, then the device's
    accounting (an emulated device paces the iteration to its modeled time)."""

    def __init__(self, model: LlamaForCausalLM, cache: KVCache, device: Device, block_size: int) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        self.block_size = block_size
        self.sampler = Sampler()
        self.dims = live_rank_dims(model, cache)

    def execute(self, batch: Batch) -> Execution:
        sampled = self._forward_and_sample(batch.sched)
        compute_s = time.time() - batch.start_s
        work = IterationWork(*batch.work)
        pacing_s = self.device.on_iteration(work, batch.start_s, compute_s)
        timing = self.device.last_iteration_timing()
        if timing is not None and timing.flops is not None:  # an emulated GPU: its modeled shape's work
            flops, hbm = timing.flops, timing.hbm_bytes
        else:  # a real device: the work of the tensors this engine holds
            count = count_work(self.dims, work)
            flops, hbm = count.flops, count.hbm_bytes
        return Execution(
            end_s=time.time(),
            tokens=sampled,
            compute_s=compute_s,
            pacing_s=pacing_s,
            modeled_s=timing.modeled_s if timing is not None else None,
            lag_s=timing.lag_s if timing is not None else None,
            flops=flops,
            hbm_bytes=hbm,
        )

    def _forward_and_sample(self, sched: SchedulerOutput) -> list[int | SamplingError]:
        dev = self.device.torch_device
        ids: list[int] = []
        positions: list[int] = []
        logits_idx: list[int] = []
        samplers: list[tuple[SamplingParams, int, list[int]]] = []
        items = sched.items
        for item in items:
            seq, n = item.seq, item.num_new_tokens
            ids.extend(seq.token_ids[seq.num_computed : seq.num_computed + n])
            positions.extend(range(seq.num_computed, seq.num_computed + n))
            if item.completes_prompt:
                logits_idx.append(len(ids) - 1)
                history = seq.output_ids if seq.params.penalized else []  # penalties count these
                samplers.append((seq.params, seq.num_output_tokens, history))  # seeded draws key on the index
        batch = AttentionBatch.build(
            [i.num_new_tokens for i in items],
            [i.context_len for i in items],
            [i.seq.block_table for i in items],
            self.block_size,
            dev,
        )
        logits = self.model(
            torch.tensor(ids, device=dev),
            torch.tensor(positions, device=dev),
            batch,
            self.cache,
            torch.tensor(logits_idx, dtype=torch.long, device=dev),
        )
        return self.sampler.sample(logits, samplers) if samplers else []


class Engine(EngineCore):
    """Continuous-batching engine over a paged KV cache on one device.

    Loop: `while engine.has_work(): engine.step()` (:meth:`EngineCore.step`); requests come in with
    `add_request` (from a client) or `add_prefilled` (a KV hand-off from a prefill worker).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        engine_cfg: EngineConfig,
        device: Device,
        *,
        worker_id: str = "worker-0",
        telemetry: TelemetryEmitter | None = None,
    ) -> None:
        self.model = model
        self.model_cfg: ModelConfig = model.config
        dtype = model.lm_head.weight.dtype
        cfg = engine_cfg.resolved(self.model_cfg, dtype.itemsize)
        self.device = device
        identity = device.snapshot()  # which GPU this is, carried by every iteration event
        self.gpu_uuid, self.gpu_index = identity.uuid, identity.index
        self.cache = KVCache(self.model_cfg, cfg.num_blocks, cfg.block_size, device.torch_device, dtype)
        super().__init__(
            cfg,
            TorchExecutor(model, self.cache, device, cfg.block_size),
            worker_id=worker_id,
            device=device.spec,
            gpus=[(self.gpu_uuid, self.gpu_index)],
            telemetry=telemetry,
            stop_token_ids=self.model_cfg.eos_token_ids,
        )

    def add_prefilled(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        params: SamplingParams,
        kv: torch.Tensor,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Continue a request whose prompt KV was computed elsewhere; waits if blocks are short."""
        self.queue_prefilled(request_id, token_ids, num_prompt_tokens, params, kv.shape[2], kv=kv, meta=meta)
        self.admit_imports()

    def _imported(self, seq: Sequence, kv: Any) -> None:
        self.cache.import_(seq.block_table, kv)

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        return {
            "running": len(s.running),
            "waiting": len(s.waiting) + self.num_pending_imports,
            "kv_blocks_used": s.blocks.num_blocks - s.blocks.num_free,
            "kv_blocks_total": s.blocks.num_blocks,
            "kv_usage": s.blocks.usage,
            "iterations": self.iterations,
            "emulation": self.device.emulation_counters(),
        }

    def _export(self, seq: Sequence, meta: dict[str, Any]) -> Handoff:
        kv = self.cache.export(seq.block_table, seq.num_computed)
        return Handoff(seq.request_id, list(seq.token_ids), seq.num_prompt_tokens, seq.params, kv, meta)

    def _failed(self, seq: Sequence) -> None:
        """Zero a failed sequence's KV blocks: NaN left there would leak into the next owner's
        masked (zero-weight) slots, since 0 * NaN is NaN."""
        if seq.block_table:
            idx = torch.tensor(seq.block_table, device=self.cache.k.device)
            self.cache.k[:, idx] = 0
            self.cache.v[:, idx] = 0
