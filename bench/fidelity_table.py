"""Regenerate the model columns of docs/FIDELITY.md: the emulator's prefill TTFT and decode ITL beside
published measurements, with the error.

Every modeled figure comes from the public ``serving.devices.predict_iteration`` (default knobs: TDP
power limit, unlocked clocks, default constants). The published figures are constants below, each with
its source key (see docs/FIDELITY.md, "Sources"); nothing is fetched.

Conventions:

* TTFT of an ``n``-token prompt = one prefill iteration of ``n`` tokens (one sequence, sampling one
  token): ``attention_pairs = n (n + 1) / 2``.
* ITL at batch ``B`` and context ``c`` = one decode iteration of ``B`` sequences each attending ``c``
  tokens: ``decode_seqs = B``, ``context_tokens = attention_pairs = B c``, ``sampled_seqs = B``.
* A measurement over a generation (``out`` tokens after an ``in``-token prompt) is modeled step by
  step: the decode step that produces token ``k + 1`` attends ``in + k`` tokens.
* Tensor parallelism is not modeled. Where a source used TP = N, the row is modeled on a per-GPU shard
  (:func:`tp_shard`: heads, KV heads, MLP width and vocabulary divided by N; hidden size, layers and
  the per-iteration overhead unchanged) -- the ideal split, with no all-reduce or NVLink time.

    python bench/fidelity_table.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, replace
from typing import Any

from serving.config import ModelConfig, preset
from serving.devices import IterationWork, predict_iteration

GPUS = ("h100-sxm", "h200", "a100-sxm-80gb")
GPU_LABEL = {"h100-sxm": "H100 SXM", "h200": "H200", "a100-sxm-80gb": "A100-SXM-80GB"}

# Shapes of the Llama 2 checkpoints some sources measured (Hugging Face config.json of
# meta-llama/Llama-2-7b-hf and meta-llama/Llama-2-70b-hf); LLaMA-1 7B has the same shape as Llama-2-7B.
LLAMA2_7B = ModelConfig(
    name="llama-2-7b",
    vocab_size=32_000,
    hidden_size=4096,
    intermediate_size=11_008,
    num_layers=32,
    num_heads=32,
    num_kv_heads=32,
    max_position=4096,
    rope_theta=10_000.0,
)
LLAMA2_70B = ModelConfig(
    name="llama-2-70b",
    vocab_size=32_000,
    hidden_size=8192,
    intermediate_size=28_672,
    num_layers=80,
    num_heads=64,
    num_kv_heads=8,
    max_position=4096,
    rope_theta=10_000.0,
)
SHAPES: dict[str, ModelConfig] = {
    "llama-3.1-8b": preset("llama-3.1-8b"),
    "llama-3.1-70b": preset("llama-3.1-70b"),
    "llama-2-7b": LLAMA2_7B,
    "llama-2-70b": LLAMA2_70B,
}


def tp_shard(shape: ModelConfig, tp: int) -> ModelConfig:
    """The per-GPU shard of ``shape`` under ideal Megatron-style tensor parallelism of degree ``tp``."""
    if tp == 1:
        return shape
    return replace(
        shape,
        name=f"{shape.name}/tp{tp}",
        vocab_size=shape.vocab_size // tp,
        intermediate_size=shape.intermediate_size // tp,
        num_heads=shape.num_heads // tp,
        num_kv_heads=max(1, shape.num_kv_heads // tp),
        head_dim_override=shape.head_dim,
    )


# -- the model ---------------------------------------------------------------------------------------


def prefill_s(gpu: str, shape: ModelConfig, tokens: int, seqs: int = 1) -> float:
    """One prefill iteration of ``seqs`` prompts of ``tokens`` tokens each (each sampling one token)."""
    work = IterationWork(
        "prefill",
        prefill_tokens=seqs * tokens,
        decode_seqs=0,
        context_tokens=seqs * tokens,
        batch_size=seqs,
        attention_pairs=seqs * tokens * (tokens + 1) // 2,
        sampled_seqs=seqs,
    )
    return predict_iteration(gpu, shape, work).time_s


def decode_s(gpu: str, shape: ModelConfig, batch: int, context: int) -> float:
    """One decode iteration of ``batch`` sequences, each attending ``context`` tokens."""
    work = IterationWork(
        "decode",
        prefill_tokens=0,
        decode_seqs=batch,
        context_tokens=batch * context,
        batch_size=batch,
        attention_pairs=batch * context,
        sampled_seqs=batch,
    )
    return predict_iteration(gpu, shape, work).time_s


def generation_s(gpu: str, shape: ModelConfig, batch: int, in_len: int, out_len: int) -> tuple[float, float]:
    """(prefill time, summed decode time) of ``batch`` requests: ``in_len`` prompt, ``out_len`` output."""
    pre = prefill_s(gpu, shape, in_len, seqs=batch)
    dec = sum(decode_s(gpu, shape, batch, in_len + k) for k in range(1, out_len))
    return pre, dec


# -- published measurements ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Row:
    """One published figure and how to model it."""

    source: str  # key into SOURCES
    gpu: str
    shape: str  # key into SHAPES
    tp: int
    metric: str  # "ttft" | "itl" | "e2e"
    measured_ms: float
    tokens: int = 0  # ttft: prompt tokens; itl/e2e: prompt tokens per sequence
    batch: int = 1
    out_len: int = 0  # itl/e2e: generated tokens per sequence
    what: str = ""
    comparable: str = "yes"  # "yes" | "converted" (TP shard) | "fitted" | "no"
    note: str = ""

    def modeled_ms(self) -> float:
        shape = tp_shard(SHAPES[self.shape], self.tp)
        if self.metric == "ttft":
            return prefill_s(self.gpu, shape, self.tokens, seqs=self.batch) * 1e3
        if self.metric == "itl":  # mean step time over the generation (what a mean TBT/ITL measures)
            steps = [decode_s(self.gpu, shape, self.batch, self.tokens + k) for k in range(1, self.out_len)]
            return statistics.fmean(steps) * 1e3
        if self.metric == "e2e":
            pre, dec = generation_s(self.gpu, shape, self.batch, self.tokens, self.out_len)
            return (pre + dec) * 1e3
        raise ValueError(self.metric)


SOURCES: dict[str, str] = {
    "phaselens-h200": "this project, docs/gpu/2026-11-30-h200-run2.json (engine rows)",
    "vllm-ci": "vLLM nightly performance benchmark, latency tests (buildkite.com/vllm/performance-benchmark)",
    "splitwise": "Splitwise profiling data, github.com/Mutinifni/splitwise-sim data/perf_model.csv",
    "trtllm-0.5": "TensorRT-LLM docs/source/performance.md, 'Low Latency' tables (data from v0.5)",
}

# Splitwise perf_model.csv: medians of the 5 repeated rows (prompt_time, token_time in ms).
_SW_PROMPT = {  # (gpu, tp) -> {prompt tokens: prompt_time ms}, batch 1
    ("h100-sxm", 2): {1024: 157.95, 2048: 310.32, 4096: 642.66, 8192: 1339.84},
    ("a100-sxm-80gb", 2): {1024: 377.06, 2048: 688.05, 4096: 1485.35, 8192: 2990.18},
}
_SW_TOKEN = {  # (gpu, tp) -> {batch: token_time ms}, prompt 512, 128 output tokens
    ("h100-sxm", 2): {1: 37.00, 8: 40.40, 32: 52.30},
    ("a100-sxm-80gb", 2): {1: 54.86, 8: 61.69, 32: 72.19},
    ("h100-sxm", 8): {1: 29.76},
    ("a100-sxm-80gb", 8): {1: 44.85},
}

ROWS: list[Row] = []
# This project's engine on an H200 (llama-3.1-8b bf16, one GPU, eager PyTorch). The prefill rows are the
# ones the compute efficiency was fitted to; the decode rows (context 1024) were host-bound.
for _n, _ms, _cmp, _note in (
    (256, 35.129, "no", "host-bound: util 39 %"),
    (1024, 31.382, "no", "partly host-bound: util 87 %"),
    (4096, 107.772, "fitted", "GPU-bound (util 97 %); used to fit eta_c"),
    (8192, 222.82, "fitted", "GPU-bound (util 97 %); used to fit eta_c"),
):
    ROWS.append(
        Row(
            "phaselens-h200",
            "h200",
            "llama-3.1-8b",
            1,
            "ttft",
            _ms,
            _n,
            what=f"prefill {_n}",
            comparable=_cmp,
            note=_note,
        )
    )
for _b, _ms, _util in ((1, 66.08, 8), (16, 76.386, 4), (64, 76.518, 22), (128, 73.636, 32)):
    ROWS.append(
        Row(
            "phaselens-h200",
            "h200",
            "llama-3.1-8b",
            1,
            "itl",
            _ms,
            1024,
            _b,
            2,
            what=f"decode batch {_b}, ctx 1024",
            comparable="no",
            note=f"host-bound: util {_util} %",
        )
    )
# vLLM CI latency test: batch 8, 32 input + 128 output tokens, end-to-end latency (median), bf16 default.
for _gpu, _ms, _build in (
    ("h200", 834.014, 9513),
    ("h100-sxm", 997.365, 9555),
    ("a100-sxm-80gb", 1579.34, 9523),
):
    ROWS.append(
        Row(
            "vllm-ci",
            _gpu,
            "llama-3.1-8b",
            1,
            "e2e",
            _ms,
            32,
            8,
            128,
            what="latency_llama8B_tp1: batch 8, 32 in / 128 out, e2e",
            note=f"build {_build}",
        )
    )
for _gpu, _ms, _build in (
    ("h200", 2075.36, 9513),
    ("h100-sxm", 2444.3, 9555),
    ("a100-sxm-80gb", 3990.39, 9523),
):
    ROWS.append(
        Row(
            "vllm-ci",
            _gpu,
            "llama-3.1-70b",
            4,
            "e2e",
            _ms,
            32,
            8,
            128,
            what="latency_llama70B_tp4: batch 8, 32 in / 128 out, e2e",
            comparable="converted",
            note=f"build {_build}; TP 4 -> per-GPU shard",
        )
    )
for (_gpu, _tp), _d in _SW_PROMPT.items():
    for _n, _ms in _d.items():
        ROWS.append(
            Row(
                "splitwise",
                _gpu,
                "llama-2-70b",
                _tp,
                "ttft",
                _ms,
                _n,
                what=f"prompt {_n}, batch 1",
                comparable="converted",
                note=f"fp16, TP {_tp} -> per-GPU shard",
            )
        )
for (_gpu, _tp), _d in _SW_TOKEN.items():
    for _b, _ms in _d.items():
        ROWS.append(
            Row(
                "splitwise",
                _gpu,
                "llama-2-70b",
                _tp,
                "itl",
                _ms,
                512,
                _b,
                128,
                what=f"token time, batch {_b}, prompt 512, 128 out",
                comparable="converted",
                note=f"fp16, TP {_tp} -> per-GPU shard",
            )
        )
# TensorRT-LLM v0.5 first-token latency, A100 FP16, batch 1 (the H100 rows are FP8: not comparable).
for _shape, _tp, _n, _ms in (
    ("llama-2-7b", 1, 128, 16.0),
    ("llama-2-7b", 1, 2048, 133.0),
    ("llama-2-70b", 4, 128, 47.0),
    ("llama-2-70b", 4, 2048, 377.0),
):
    ROWS.append(
        Row(
            "trtllm-0.5",
            "a100-sxm-80gb",
            _shape,
            _tp,
            "ttft",
            _ms,
            _n,
            what=f"1st token latency, input {_n}, batch 1",
            comparable="yes" if _tp == 1 else "converted",
            note="fp16" + ("" if _tp == 1 else f", TP {_tp} -> per-GPU shard"),
        )
    )


# -- tables ----------------------------------------------------------------------------------------------

PREFILL_TOKENS = (128, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 8, 32, 64, 128, 256)
DECODE_CONTEXT = 1024


def model_grid() -> list[dict[str, Any]]:
    rows = []
    for gpu in GPUS:
        for name in ("llama-3.1-8b", "llama-3.1-70b"):
            shape = SHAPES[name]
            rows.append(
                {
                    "gpu": gpu,
                    "shape": name,
                    "ttft_ms": {n: prefill_s(gpu, shape, n) * 1e3 for n in PREFILL_TOKENS},
                    "itl_ms": {b: decode_s(gpu, shape, b, DECODE_CONTEXT) * 1e3 for b in DECODE_BATCHES},
                }
            )
    return rows


def comparisons() -> list[dict[str, Any]]:
    out = []
    for r in ROWS:
        modeled = r.modeled_ms()
        out.append(
            {
                "source": r.source,
                "gpu": r.gpu,
                "shape": r.shape,
                "tp": r.tp,
                "metric": r.metric,
                "what": r.what,
                "measured_ms": r.measured_ms,
                "modeled_ms": round(modeled, 2),
                "error_pct": round((modeled - r.measured_ms) / r.measured_ms * 100.0, 1),
                "comparable": r.comparable,
                "note": r.note,
            }
        )
    return out


def _fmt(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def markdown(grid: list[dict[str, Any]], comps: list[dict[str, Any]]) -> str:
    lines = [
        "Model grid: TTFT (one prompt of n tokens) and ITL (decode step, batch B, context "
        f"{DECODE_CONTEXT}), ms",
        "",
        "| GPU | shape | "
        + " | ".join(f"TTFT {n}" for n in PREFILL_TOKENS)
        + " | "
        + " | ".join(f"ITL b{b}" for b in DECODE_BATCHES)
        + " |",
        "|---|---|" + "---|" * (len(PREFILL_TOKENS) + len(DECODE_BATCHES)),
    ]
    for g in grid:
        cells = [_fmt(g["ttft_ms"][n]) for n in PREFILL_TOKENS] + [
            _fmt(g["itl_ms"][b]) for b in DECODE_BATCHES
        ]
        lines.append(f"| {GPU_LABEL[g['gpu']]} | {g['shape']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Comparisons (error = (model - measured) / measured)",
        "",
        "| source | GPU | shape | TP | measurement | measured ms | model ms | error | comparable | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in comps:
        lines.append(
            f"| {c['source']} | {GPU_LABEL[c['gpu']]} | {c['shape']} | {c['tp']} | {c['what']} | "
            f"{c['measured_ms']:g} | {_fmt(c['modeled_ms'])} | {c['error_pct']:+.1f} % | {c['comparable']} | "
            f"{c['note']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the grid and the comparisons here")
    args = ap.parse_args(argv)
    grid, comps = model_grid(), comparisons()
    print(markdown(grid, comps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"grid": grid, "comparisons": comps, "sources": SOURCES}, f, indent=1)


if __name__ == "__main__":
    main()
