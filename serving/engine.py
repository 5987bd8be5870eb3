"""One worker's inference engine: schedule, run the model, sample, account — once per iteration."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from serving.config import EngineConfig, ModelConfig, SamplingParams
from serving.devices.base import Device, IterationWork
from serving.model import AttentionBatch, KVCache, LlamaForCausalLM
from serving.sampling import Sampler, SamplingError
from serving.scheduler import Scheduler, SchedulerOutput
from serving.sequence import Sequence
from serving.telemetry import TelemetryEmitter


@dataclass(slots=True)
class TokenOutput:
    """A token produced for a request in one iteration."""

    request_id: str
    token_id: int
    ts_s: float
    finish_reason: str | None = None  # "stop" | "length" | None while running
    meta: dict[str, Any] | None = None  # timings, sent with a request's first token from this worker


@dataclass(slots=True)
class Handoff:
    """A prefilled request leaving this engine for a decode worker, with its KV."""

    request_id: str
    token_ids: list[int]  # prompt + first token
    num_prompt_tokens: int
    params: SamplingParams
    kv: torch.Tensor  # [2, layers, prompt tokens, kv_heads, head_dim]
    meta: dict[str, Any]


@dataclass(slots=True)
class StepResult:
    outputs: list[TokenOutput] = field(default_factory=list)
    handoffs: list[Handoff] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (request id, message): dropped requests
    phase: str = "idle"


class Engine:
    """Continuous-batching engine over a paged KV cache on one device.

    Loop: `while engine.has_work(): engine.step()`; requests come in with `add_request` (from a
    client) or `add_prefilled` (a KV hand-off from a prefill worker).
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
        self.cfg = engine_cfg.resolved(self.model_cfg, dtype.itemsize)
        self.device = device
        identity = device.snapshot()  # which GPU this is, carried by every iteration event
        self.gpu_uuid, self.gpu_index = identity.uuid, identity.index
        self.worker_id = worker_id
        self.telemetry = telemetry
        self.scheduler = Scheduler(self.cfg)
        self.cache = KVCache(
            self.model_cfg, self.cfg.num_blocks, self.cfg.block_size, device.torch_device, dtype
        )
        self.sampler = Sampler()
        self._seqs: dict[str, Sequence] = {}
        self._pending_imports: list[tuple[Sequence, torch.Tensor, dict[str, Any]]] = []
        self._stop_ids = frozenset(self.model_cfg.eos_token_ids)
        self.iterations = 0

    # -- requests in -------------------------------------------------------------------------

    def check_admissible(self, num_prompt_tokens: int, max_tokens: int) -> None:
        self.scheduler.check_admissible(num_prompt_tokens, max_tokens)

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        arrival_s: float | None = None,
        handoff: bool = False,
    ) -> None:
        """Queue a new request; `handoff` stops it after the first token and exports its KV."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in this engine")
        seq = Sequence(
            request_id, list(prompt_ids), len(prompt_ids), params, arrival_s or time.time(), handoff
        )
        self.scheduler.add(seq)
        self._seqs[request_id] = seq

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
        self.scheduler.check_admissible(num_prompt_tokens, params.max_tokens)
        seq = Sequence(request_id, list(token_ids), num_prompt_tokens, params, time.time())
        seq.num_computed = kv.shape[2]
        self._seqs[request_id] = seq
        self._pending_imports.append((seq, kv, meta or {}))
        self._admit_imports()

    def _admit_imports(self) -> None:
        still = []
        for seq, kv, meta in self._pending_imports:
            if self.scheduler.add_running(seq):
                self.cache.import_(seq.block_table, kv)
            else:
                still.append((seq, kv, meta))
        self._pending_imports = still

    def abort(self, request_id: str) -> bool:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self._pending_imports = [p for p in self._pending_imports if p[0] is not seq]
        self.scheduler.finish(seq)
        return True

    # -- state ---------------------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self._pending_imports)

    def stats(self) -> dict[str, Any]:
        s = self.scheduler
        return {
            "running": len(s.running),
            "waiting": len(s.waiting) + len(self._pending_imports),
            "kv_blocks_used": s.blocks.num_blocks - s.blocks.num_free,
            "kv_blocks_total": s.blocks.num_blocks,
            "kv_usage": s.blocks.usage,
            "iterations": self.iterations,
            "emulation": self.device.emulation_counters(),
        }

    # -- one iteration ---------------------------------------------------------------------------

    def step(self) -> StepResult:
        """Run one iteration: schedule, forward, sample, update, report."""
        if self._pending_imports:
            self._admit_imports()
        sched = self.scheduler.schedule()
        if not sched.items:
            return StepResult()
        started_s = time.time()
        for item in sched.items:
            seq = item.seq
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = started_s
            if seq.in_prefill and seq.prefill_start_s is None:
                seq.prefill_start_s = started_s
        kv_blocks_used = self.scheduler.blocks.num_blocks - self.scheduler.blocks.num_free
        sampled = self._forward_and_sample(sched)
        compute_s = time.time() - started_s
        work = IterationWork(*sched.tally())
        pacing_s = self.device.on_iteration(work, started_s, compute_s)
        timing = self.device.last_iteration_timing()
        ended_s = time.time()
        result = self._update(sched, sampled, ended_s)
        self.iterations += 1
        if self.telemetry is not None:
            self.telemetry.emit(
                "iteration",
                worker=self.worker_id,
                device=self.device.spec,
                gpu_uuid=self.gpu_uuid,
                gpu_index=self.gpu_index,
                start_s=started_s,
                end_s=ended_s,
                phase=work.phase,
                batch_size=work.batch_size,
                prefill_tokens=work.prefill_tokens,
                decode_seqs=work.decode_seqs,
                context_tokens=work.context_tokens,
                kv_blocks_used=kv_blocks_used,
                kv_blocks_total=self.scheduler.blocks.num_blocks,
                preempted=len(sched.preempted),
                compute_s=compute_s,
                pacing_s=pacing_s,
                modeled_s=timing.modeled_s if timing is not None else None,
                lag_s=timing.lag_s if timing is not None else None,
            )
        return result

    def _forward_and_sample(self, sched: SchedulerOutput) -> list[int | SamplingError]:
        dev = self.device.torch_device
        ids: list[int] = []
        positions: list[int] = []
        logits_idx: list[int] = []
        samplers: list[tuple[SamplingParams, int, list[int]]] = []
        for item in sched.items:
            seq, n = item.seq, item.num_new_tokens
            ids.extend(seq.token_ids[seq.num_computed : seq.num_computed + n])
            positions.extend(range(seq.num_computed, seq.num_computed + n))
            if item.completes_prompt:
                logits_idx.append(len(ids) - 1)
                history = seq.output_ids if seq.params.penalized else []  # penalties count these
                samplers.append((seq.params, seq.num_output_tokens, history))  # seeded draws key on the index
        batch = AttentionBatch.build(
            [i.num_new_tokens for i in sched.items],
            [i.context_len for i in sched.items],
            [i.seq.block_table for i in sched.items],
            self.cfg.block_size,
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

    def _update(self, sched: SchedulerOutput, sampled: list[int | SamplingError], ts_s: float) -> StepResult:
        result = StepResult(phase=sched.phase)
        tokens = iter(sampled)
        for item in sched.items:
            seq = item.seq
            was_prefill, completes = seq.in_prefill, item.completes_prompt
            seq.num_computed += item.num_new_tokens
            if not completes:
                continue
            token = next(tokens)
            if isinstance(token, SamplingError):  # fail this request only; the batch goes on
                result.errors.append((seq.request_id, str(token)))
                self._scrub(seq)
                self._drop(seq)
                continue
            seq.token_ids.append(token)
            meta = None
            if was_prefill and seq.prefill_end_s is None:
                seq.prefill_end_s = ts_s
                meta = {
                    "worker": self.worker_id,
                    "arrival_s": seq.arrival_s,
                    "first_scheduled_s": seq.first_scheduled_s,
                    "prefill_start_s": seq.prefill_start_s,
                    "prefill_end_s": ts_s,
                    "num_preemptions": seq.num_preemptions,
                }
            reason = self._finish_reason(seq, token)
            if reason is not None and seq.num_preemptions:
                meta = {**(meta or {}), "num_preemptions": seq.num_preemptions}
            result.outputs.append(TokenOutput(seq.request_id, token, ts_s, reason, meta))
            if reason is not None:
                self._drop(seq)
            elif seq.handoff:
                result.handoffs.append(self._export(seq, meta or {}))
                self._drop(seq)
        return result

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self._stop_ids):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.cfg.max_model_len:
            return "length"
        return None

    def _export(self, seq: Sequence, meta: dict[str, Any]) -> Handoff:
        kv = self.cache.export(seq.block_table, seq.num_computed)
        return Handoff(seq.request_id, list(seq.token_ids), seq.num_prompt_tokens, seq.params, kv, meta)

    def _scrub(self, seq: Sequence) -> None:
        """Zero a failed sequence's KV blocks: NaN left there would leak into the next owner's
        masked (zero-weight) slots, since 0 * NaN is NaN."""
        if seq.block_table:
            idx = torch.tensor(seq.block_table, device=self.cache.k.device)
            self.cache.k[:, idx] = 0
            self.cache.v[:, idx] = 0

    def _drop(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self._seqs.pop(seq.request_id, None)
