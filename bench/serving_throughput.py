"""Offline serving throughput: this engine (continuous batching) vs Hugging Face static batching.

The same model shape, the same weights and the same mixed-length requests go through

(a) ``serving.engine.Engine`` in-process (no HTTP) on ``CpuDevice``: all requests are queued at
    once and ``engine.step()`` runs until every request has its requested output tokens
    (``ignore_eos``), and
(b) ``transformers.LlamaForCausalLM.generate`` with static batching: requests in arrival order,
    ``B`` at a time, left-padded to the batch's longest prompt, each batch generating for its longest
    requested output (``min_new_tokens == max_new_tokens``, so EOS never ends a batch early); only
    each request's own requested tokens count as useful output,

on the same CPU in one process, and prints output tokens/s of both and their ratio. It also
measures the host's memory bandwidth and compares the engine's decode-only iteration time with the
memory-bandwidth roofline (weight bytes + KV bytes read per decode step, divided by bandwidth).

Weights: a ``transformers.LlamaConfig`` matching the preset gets random weights (HF init, fixed
seed), is saved with ``save_pretrained`` to a temporary folder, and the engine loads that folder with
``serving.weights.load_model``; both run in fp32.

Requests: the first ``--requests`` rows of the vendored Azure 2023 conversation trace
(``serving.trace.vendored_trace_path()``), token counts clipped to ``--max-prompt`` / ``--max-output``;
or ``--workload uniform`` draws them from seeded uniform ranges. Prompt token ids are seeded random.

Timing: one small warm-up run of each, then ``--repeats`` interleaved timed runs (engine, then each
HF batch size); the best run of each is the headline (the host may be shared), the median is shown
too. Greedy outputs of both are compared as a sanity check (same weights, so they should agree).

    python bench/serving_throughput.py [--model tiny] [--requests 64] [--hf-batch 8 [16 32 64]]
        [--threads 2] [--seed 0] [--repeats 3] [--json out.json] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from serving.config import PRESETS, EngineConfig, ModelConfig, SamplingParams, preset
from serving.devices import CpuDevice
from serving.devices.cpu import cpu_model_name
from serving.engine import Engine
from serving.model import LlamaForCausalLM as EngineModel
from serving.trace import load_azure_trace, vendored_trace_path
from serving.weights import load_model

TARGET_RATIO = 2.0


# -- workload ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    output_tokens: int


def make_requests(
    cfg: ModelConfig, n: int, seed: int, workload: str, max_prompt: int, max_output: int
) -> list[Request]:
    """`n` requests with mixed prompt/output lengths and seeded random prompt token ids."""
    rng = random.Random(seed)
    if workload == "azure":
        trace = load_azure_trace(
            vendored_trace_path(), limit=n, max_prompt_tokens=max_prompt, max_output_tokens=max_output
        )
        if len(trace) < n:
            raise SystemExit(f"the vendored trace has only {len(trace)} requests, asked for {n}")
        sizes = [(max(1, r.prompt_tokens), max(1, r.output_tokens)) for r in trace]
    else:
        sizes = [(rng.randint(16, max_prompt), rng.randint(8, max_output)) for _ in range(n)]
    # Plain token ids only: below BOS (byte ids for `tiny`, ordinary vocabulary for the Llama 3 presets).
    high = cfg.bos_token_id if cfg.bos_token_id and cfg.bos_token_id < cfg.vocab_size else cfg.vocab_size
    return [Request(f"req-{i}", [rng.randrange(high) for _ in range(p)], o) for i, (p, o) in enumerate(sizes)]


# -- weights -------------------------------------------------------------------------------------


def hf_config(cfg: ModelConfig) -> Any:
    from transformers import LlamaConfig

    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling is not None:
        rs = cfg.rope_scaling
        rope = {
            "rope_type": "llama3",
            "rope_theta": cfg.rope_theta,
            "factor": rs.factor,
            "low_freq_factor": rs.low_freq_factor,
            "high_freq_factor": rs.high_freq_factor,
            "original_max_position_embeddings": rs.original_max_position,
        }
    eos = list(cfg.eos_token_ids)
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=eos[0] if len(eos) == 1 else (eos or None),
        pad_token_id=eos[0] if eos else 0,
        torch_dtype="float32",
    )


def build_models(cfg: ModelConfig, folder: Path, seed: int) -> tuple[Any, EngineModel]:
    """Random-weight HF model saved to `folder`; the engine's model loaded back from that folder."""
    from transformers import LlamaForCausalLM as HFLlama

    torch.manual_seed(seed)
    hf = HFLlama(hf_config(cfg)).to(torch.float32).eval()
    hf.save_pretrained(folder)
    model, _ = load_model(folder, device="cpu", dtype=torch.float32)
    return hf, model


# -- memory bandwidth ----------------------------------------------------------------------------


def measure_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 7) -> dict[str, float]:
    """Best-of-`repeats` host memory bandwidth: a tensor copy (bytes read + written) and a sum (read)."""
    n = nbytes // 4
    src = torch.rand(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages
    copy_s, read_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        copy_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        src.sum()
        read_s.append(time.perf_counter() - t)
    return {
        "buffer_bytes": float(src.nbytes),
        "copy_gbps": 2 * src.nbytes / min(copy_s) / 1e9,
        "read_gbps": src.nbytes / min(read_s) / 1e9,
    }


def measure_matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-`repeats` fp32 matmul rate (GFLOP/s): the compute roof this host offers torch."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- engine --------------------------------------------------------------------------------------


class IterationLog:
    """Stands in for a TelemetryEmitter: keeps the engine's per-iteration records in memory."""

    def __init__(self) -> None:
        self.iterations: list[dict[str, Any]] = []

    def emit(self, event_type: str, **fields: Any) -> None:
        if event_type == "iteration":
            self.iterations.append(fields)


@dataclass(slots=True)
class EngineRun:
    elapsed_s: float
    output_tokens: int
    steps: list[dict[str, Any]] = field(default_factory=list)  # phase, wall_s, batch, context, ...
    outputs: dict[str, list[int]] = field(default_factory=dict)


def engine_config(cfg: ModelConfig, requests: list[Request], max_num_seqs: int) -> EngineConfig:
    """Enough KV blocks for every request at full length at once (no preemption)."""
    block = 16
    blocks = sum(-(-(len(r.prompt_ids) + r.output_tokens) // block) for r in requests) + max_num_seqs
    return EngineConfig(block_size=block, num_blocks=blocks, max_num_seqs=max_num_seqs)


def run_engine(model: EngineModel, requests: list[Request], max_num_seqs: int) -> EngineRun:
    log = IterationLog()
    engine = Engine(
        model, engine_config(model.config, requests, max_num_seqs), CpuDevice(), telemetry=log
    )  # IterationLog stands in for a TelemetryEmitter (duck-typed)
    outputs: dict[str, list[int]] = {r.request_id: [] for r in requests}
    steps: list[dict[str, Any]] = []
    start = time.perf_counter()
    for r in requests:
        params = SamplingParams(max_tokens=r.output_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(r.request_id, r.prompt_ids, params)
    while engine.has_work():
        t = time.perf_counter()
        res = engine.step()
        wall = time.perf_counter() - t
        for out in res.outputs:
            outputs[out.request_id].append(out.token_id)
        if res.phase != "idle":
            it = log.iterations[-1]
            steps.append(
                {
                    "phase": res.phase,
                    "wall_s": wall,
                    "compute_s": it["compute_s"],
                    "batch_size": it["batch_size"],
                    "prefill_tokens": it["prefill_tokens"],
                    "context_tokens": it["context_tokens"],
                    "preempted": it["preempted"],
                }
            )
    elapsed = time.perf_counter() - start
    for r in requests:
        if len(outputs[r.request_id]) != r.output_tokens:
            raise RuntimeError(
                f"engine: {r.request_id} got {len(outputs[r.request_id])} tokens, wanted {r.output_tokens}"
            )
    return EngineRun(elapsed, sum(r.output_tokens for r in requests), steps, outputs)


# -- transformers static batching ----------------------------------------------------------------


@dataclass(slots=True)
class HFRun:
    batch_size: int
    elapsed_s: float
    useful_tokens: int
    generated_tokens: int  # including the padding-to-longest-output tokens
    outputs: dict[str, list[int]] = field(default_factory=dict)


def run_hf(hf: Any, requests: list[Request], batch_size: int, pad_id: int) -> HFRun:
    from transformers import GenerationConfig

    outputs: dict[str, list[int]] = {}
    generated = 0
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, r in enumerate(batch):  # left padding
            ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids) :] = 1
        new = max(r.output_tokens for r in batch)
        gen_cfg = GenerationConfig(
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=hf.generation_config.eos_token_id,
        )
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
        if out.shape[1] != width + new:
            raise RuntimeError(f"transformers generated {out.shape[1] - width} tokens, wanted {new}")
        generated += new * len(batch)
        for row, r in enumerate(batch):
            outputs[r.request_id] = out[row, width : width + r.output_tokens].tolist()
    elapsed = time.perf_counter() - start
    return HFRun(batch_size, elapsed, sum(r.output_tokens for r in requests), generated, outputs)


# -- roofline ------------------------------------------------------------------------------------


def decode_step_bytes(model: EngineModel, batch: int, context_tokens: int) -> dict[str, int]:
    """Minimum bytes one decode step must move: every weight once + the batch's K/V once."""
    cfg: ModelConfig = model.config
    item = model.lm_head.weight.element_size()
    params = {id(p): p for p in model.parameters()}  # a tied lm_head/embedding counts once
    weights = sum(p.numel() * p.element_size() for p in params.values())
    if not cfg.tie_word_embeddings:  # only the batch's embedding rows are read
        weights -= model.model.embed_tokens.weight.nbytes
        weights += batch * cfg.hidden_size * item
    kv = context_tokens * cfg.kv_bytes_per_token(item)
    return {"weight_bytes": weights, "kv_bytes": kv, "total_bytes": weights + kv}


def decode_step_flops(model: EngineModel, batch: int, context_tokens: int) -> int:
    """FLOPs of one decode step: 2 per weight per sequence (matmuls) + QK^T and PV over the context."""
    cfg: ModelConfig = model.config
    matmul_params = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    matmul_params -= model.model.embed_tokens.weight.numel() * (not cfg.tie_word_embeddings)
    return 2 * matmul_params * batch + 4 * context_tokens * cfg.num_heads * cfg.head_dim * cfg.num_layers


def roofline_summary(
    model: EngineModel, steps: list[dict[str, Any]], bw_gbps: float, gflops: float
) -> dict[str, Any]:
    """Measured decode-only step times vs the memory roof (and, for context, the compute roof)."""
    decode = [s for s in steps if s["phase"] == "decode"]
    if not decode:
        return {}
    for s in decode:
        b = decode_step_bytes(model, s["batch_size"], s["context_tokens"])
        s["bytes"] = b["total_bytes"]
        s["roofline_s"] = b["total_bytes"] / (bw_gbps * 1e9)
    ref_batch = max(s["batch_size"] for s in decode)
    ref = [s for s in decode if s["batch_size"] == ref_batch]
    ref_ctx = statistics.fmean(s["context_tokens"] / s["batch_size"] for s in ref)
    ref_bytes = decode_step_bytes(model, ref_batch, round(ref_ctx * ref_batch))
    ref_roof = ref_bytes["total_bytes"] / (bw_gbps * 1e9)
    ref_wall = statistics.fmean(s["wall_s"] for s in ref)
    ref_flops = decode_step_flops(model, ref_batch, round(ref_ctx * ref_batch))
    ref_compute = ref_flops / (gflops * 1e9)
    mean_wall = statistics.fmean(s["wall_s"] for s in decode)
    mean_roof = statistics.fmean(s["roofline_s"] for s in decode)
    return {
        "decode_steps": len(decode),
        "mean_decode_step_s": mean_wall,
        "mean_decode_compute_s": statistics.fmean(s["compute_s"] for s in decode),
        "mean_decode_roofline_s": mean_roof,
        "mean_ratio": mean_wall / mean_roof,
        "ref_batch": ref_batch,
        "ref_steps": len(ref),
        "ref_context_per_seq": ref_ctx,
        "ref_weight_bytes": ref_bytes["weight_bytes"],
        "ref_kv_bytes": ref_bytes["kv_bytes"],
        "ref_step_s": ref_wall,
        "ref_roofline_s": ref_roof,
        "ref_ratio": ref_wall / ref_roof,
        "ref_flops": ref_flops,
        "ref_compute_roof_s": ref_compute,
        "ref_ratio_vs_max_roof": ref_wall / max(ref_roof, ref_compute),
    }


# -- profile -------------------------------------------------------------------------------------


def profile_engine(model: EngineModel, requests: list[Request], max_num_seqs: int) -> str:
    """cProfile (Python hot spots) and torch.profiler (operator self time) of one engine run."""
    prof = cProfile.Profile()
    prof.enable()
    run_engine(model, requests, max_num_seqs)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as tp:
        run_engine(model, requests, max_num_seqs)
    table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    return "== cProfile (tottime) ==\n" + buf.getvalue() + "\n== torch.profiler (self CPU) ==\n" + table


# -- main ----------------------------------------------------------------------------------------


def _agreement(a: dict[str, list[int]], b: dict[str, list[int]]) -> tuple[int, float]:
    """Requests whose greedy outputs are identical, and the mean length of the common prefix."""
    same, prefix = 0, []
    for rid, x in a.items():
        y = b.get(rid, [])
        same += x == y
        n = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        prefix.append(n / max(1, len(x)))
    return same, statistics.fmean(prefix)


def _commit() -> str:
    """The checked-out commit (with "+dirty" when serving/ has uncommitted changes), or "unknown"."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "serving"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", choices=sorted(PRESETS), help="model shape preset")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument(
        "--hf-batch", type=int, nargs="+", default=[8], help="static batch size(s) for transformers"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", choices=("azure", "uniform"), default="azure")
    ap.add_argument("--max-prompt", type=int, default=512, help="clip prompt lengths to this")
    ap.add_argument("--max-output", type=int, default=128, help="clip output lengths to this")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each; the best counts")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="engine max_num_seqs")
    ap.add_argument("--profile", action="store_true", help="also profile one engine run")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    cfg = preset(args.model)
    requests = make_requests(cfg, args.requests, args.seed, args.workload, args.max_prompt, args.max_output)
    prompt_lens = [len(r.prompt_ids) for r in requests]
    out_lens = [r.output_tokens for r in requests]
    machine = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu_model_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "commit": _commit(),
    }
    print(f"machine: {machine}")
    print(
        f"model {cfg.name}: {cfg.param_count() / 1e6:.1f}M params, fp32; {len(requests)} requests "
        f"({args.workload}), prompt {min(prompt_lens)}..{max(prompt_lens)} (sum {sum(prompt_lens)}), "
        f"output {min(out_lens)}..{max(out_lens)} (sum {sum(out_lens)})"
    )

    bw = measure_bandwidth()
    gflops = measure_matmul_gflops()
    bw["matmul_gflops"] = gflops
    print(
        f"memory bandwidth: copy {bw['copy_gbps']:.1f} GB/s (read+write), read {bw['read_gbps']:.1f} GB/s; "
        f"fp32 matmul {gflops:.0f} GFLOP/s"
    )

    with tempfile.TemporaryDirectory(prefix="phaselens-bench-") as tmp:
        t = time.perf_counter()
        hf, model = build_models(cfg, Path(tmp), args.seed)
        print(f"built + saved + loaded weights in {time.perf_counter() - t:.1f}s")
    pad_id = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    print(f"transformers attention: {hf.config._attn_implementation}")

    # Warm-up: one small run of each.
    warm = make_requests(cfg, 4, args.seed + 1, "uniform", 32, 8)
    run_engine(model, warm, args.max_num_seqs)
    run_hf(hf, warm, 2, pad_id)

    # Timed runs, interleaved (engine, then each HF batch size) `--repeats` times; the best run of
    # each counts (this host is shared, so a single run can be slowed by neighbours), medians are shown.
    eng_runs: list[EngineRun] = []
    hf_runs: dict[int, list[HFRun]] = {b: [] for b in args.hf_batch}
    for rep in range(args.repeats):
        e = run_engine(model, requests, args.max_num_seqs)
        eng_runs.append(e)
        print(f"[{rep + 1}/{args.repeats}] engine: {e.output_tokens} tokens in {e.elapsed_s:.2f}s")
        for b in args.hf_batch:
            r = run_hf(hf, requests, b, pad_id)
            hf_runs[b].append(r)
            print(
                f"[{rep + 1}/{args.repeats}] transformers B={b}: {r.useful_tokens} useful tokens "
                f"({r.generated_tokens} generated) in {r.elapsed_s:.2f}s"
            )
    eng = min(eng_runs, key=lambda r: r.elapsed_s)
    eng_tps = eng.output_tokens / eng.elapsed_s
    eng_med = eng.output_tokens / statistics.median(r.elapsed_s for r in eng_runs)
    hf_best = {b: min(rs, key=lambda r: r.elapsed_s) for b, rs in hf_runs.items()}
    hf_med = {
        b: rs[0].useful_tokens / statistics.median(r.elapsed_s for r in rs) for b, rs in hf_runs.items()
    }
    roof = roofline_summary(model, eng.steps, bw["copy_gbps"], gflops)
    same, prefix = _agreement(eng.outputs, hf_best[args.hf_batch[0]].outputs)

    phases: dict[str, list[float]] = {}
    for s in eng.steps:
        phases.setdefault(s["phase"], []).append(s["wall_s"])
    best = max(hf_best.values(), key=lambda r: r.useful_tokens / r.elapsed_s)
    best_tps = best.useful_tokens / best.elapsed_s

    w = 36
    print("\n" + "=" * 88)
    print(
        f"serving_throughput  model={cfg.name}  requests={len(requests)}  threads={args.threads}  "
        f"best of {args.repeats}"
    )
    print("-" * 88)
    print(f"{'':<{w}} {'best tok/s':>10} {'best s':>8} {'median tok/s':>13}")
    print(f"{'engine (continuous batching)':<{w}} {eng_tps:>10.1f} {eng.elapsed_s:>8.2f} {eng_med:>13.1f}")
    for b, r in hf_best.items():
        tps = r.useful_tokens / r.elapsed_s
        print(
            f"{f'transformers static B={b}':<{w}} {tps:>10.1f} {r.elapsed_s:>8.2f} {hf_med[b]:>13.1f}"
            f"   engine/HF = {eng_tps / tps:.2f}x (median {eng_med / hf_med[b]:.2f}x)"
        )
    verdict = "meets" if eng_tps / best_tps >= TARGET_RATIO else "BELOW"
    print(
        f"{'ratio vs best transformers (B=' + str(best.batch_size) + ')':<{w}} {eng_tps / best_tps:>10.2f}x"
        f"   ({verdict} the {TARGET_RATIO:.0f}x target)"
    )
    print("-" * 88)
    for ph, ts in sorted(phases.items()):
        print(
            f"engine {ph:<8} steps {len(ts):>5}  total {sum(ts):>7.2f} s  mean {statistics.fmean(ts) * 1e3:>8.2f} ms"
        )
    if roof:
        print(
            f"decode step (all {roof['decode_steps']} decode steps): measured {roof['mean_decode_step_s'] * 1e3:.2f} ms"
            f" (forward+sample {roof['mean_decode_compute_s'] * 1e3:.2f} ms) vs roofline "
            f"{roof['mean_decode_roofline_s'] * 1e3:.3f} ms = {roof['mean_ratio']:.1f}x"
        )
        print(
            f"decode step at batch {roof['ref_batch']}, context {roof['ref_context_per_seq']:.0f} tok/seq "
            f"({roof['ref_steps']} steps): measured {roof['ref_step_s'] * 1e3:.2f} ms vs roofline "
            f"{roof['ref_roofline_s'] * 1e3:.3f} ms = {roof['ref_ratio']:.1f}x"
        )
        print(
            f"  roofline bytes/step: weights {roof['ref_weight_bytes'] / 1e6:.1f} MB + KV "
            f"{roof['ref_kv_bytes'] / 1e6:.1f} MB at {bw['copy_gbps']:.1f} GB/s (measured copy bandwidth)"
        )
        print(
            f"  compute roof at that step: {roof['ref_flops'] / 1e9:.2f} GFLOP at {gflops:.0f} GFLOP/s = "
            f"{roof['ref_compute_roof_s'] * 1e3:.3f} ms; measured / max(memory, compute) roof = "
            f"{roof['ref_ratio_vs_max_roof']:.1f}x"
        )
    print(
        f"greedy agreement engine vs transformers: {same}/{len(requests)} requests identical, "
        f"mean common prefix {prefix:.0%}"
    )
    print("=" * 88)

    profile_text = None
    if args.profile:
        profile_text = profile_engine(model, requests, args.max_num_seqs)
        print(profile_text)

    if args.json:
        result = {
            "machine": machine,
            "command": " ".join(["python", *sys.argv]),
            "model": cfg.name,
            "workload": {
                "kind": args.workload,
                "requests": len(requests),
                "max_prompt": args.max_prompt,
                "max_output": args.max_output,
                "prompt_tokens": sum(prompt_lens),
                "output_tokens": sum(out_lens),
            },
            "bandwidth": bw,
            "repeats": args.repeats,
            "engine": {
                "tok_s": eng_tps,
                "median_tok_s": eng_med,
                "elapsed_s": eng.elapsed_s,
                "all_elapsed_s": [r.elapsed_s for r in eng_runs],
                "steps": {ph: {"n": len(ts), "total_s": sum(ts)} for ph, ts in phases.items()},
                "preempted": sum(s["preempted"] for s in eng.steps),
            },
            "transformers": [
                {
                    "batch": b,
                    "tok_s": r.useful_tokens / r.elapsed_s,
                    "median_tok_s": hf_med[b],
                    "elapsed_s": r.elapsed_s,
                    "all_elapsed_s": [x.elapsed_s for x in hf_runs[b]],
                    "useful_tokens": r.useful_tokens,
                    "generated_tokens": r.generated_tokens,
                }
                for b, r in hf_best.items()
            ],
            "ratio_vs_best": eng_tps / best_tps,
            "roofline": roof,
            "agreement": {"identical": same, "mean_prefix": prefix},
            "profile": profile_text,
        }
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
