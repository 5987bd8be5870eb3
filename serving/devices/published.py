"""Published serving measurements the GPU model is calibrated on and checked against, as
docs/FIDELITY.md shows: each figure a :class:`Point` with its source key (:data:`SOURCES`; nothing is
fetched) and its set (calibration / validation / test), the shapes those sources measured. This module
holds vLLM CI, TRT-LLM v0.5 and this project's H200 rows; Splitwise's units and LMDeploy's are in
published_splitwise.py / published_lmdeploy.py, every point of every source with the protocol's sets in
fidelity_sets.py. The fit is serving/devices/calibration.py; the tables bench/fidelity_table.py;
tests/serving/devices/test_fidelity_sets.py recomputes the errors.

Conventions:

* TTFT of an ``n``-token prompt = one prefill iteration of ``n`` tokens (one sequence, sampling one
  token), host time included: ``attention_pairs = n (n + 1) / 2``.
* TPOT (a mean token time over a generation of ``out`` tokens after an ``in``-token prompt) = the mean
  wall time of the decode steps, the step producing token ``k + 1`` attending ``in + k`` tokens.
* e2e = the prefill iteration plus every decode step.
* ``busy``: GPU-busy time of one decode step at a locked SM clock (this project's H200 rows: step
  time x GPU utilization).

Every modeled figure comes from the public :func:`~serving.devices.gpu_model.predict_iteration` (TDP
power limit, unlocked clocks unless a row says otherwise, default constants, tensor parallelism
modeled with ``tp=`` over the GPU's NVLink).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Literal

from serving.config import ModelConfig, preset
from serving.devices.base import IterationWork
from serving.devices.gpu_model import (
    DEFAULT_CONSTANTS,
    PROFILES,
    EmulationConstants,
    EngineProfile,
    predict_iteration,
)
from serving.devices.published_splitwise import TTFT_MS

LINK_OF = {"h100-sxm": "nvlink", "h200": "nvlink", "a100-sxm-80gb": "nvlink3"}

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

Metric = Literal["ttft", "tpot", "e2e", "busy"]
Role = Literal["calibration", "validation", "test", "excluded", "reference"]


# -- the model ---------------------------------------------------------------------------------------


def prefill_work(tokens: int, seqs: int = 1) -> IterationWork:
    """One prefill iteration of ``seqs`` prompts of ``tokens`` tokens each (each sampling one token)."""
    return IterationWork(
        "prefill",
        prefill_tokens=seqs * tokens,
        decode_seqs=0,
        context_tokens=seqs * tokens,
        batch_size=seqs,
        attention_pairs=seqs * tokens * (tokens + 1) // 2,
        sampled_seqs=seqs,
    )


def decode_work(batch: int, context: int) -> IterationWork:
    """One decode iteration of ``batch`` sequences, each attending ``context`` tokens."""
    return IterationWork(
        "decode",
        prefill_tokens=0,
        decode_seqs=batch,
        context_tokens=batch * context,
        batch_size=batch,
        attention_pairs=batch * context,
        sampled_seqs=batch,
    )


def _mean_step(step_s: Any, out_len: int, exact_up_to: int = 8, samples: int = 9) -> float:
    """Mean of ``step_s(k)`` over the decode steps ``k = 1 .. out_len - 1``: every step up to
    ``exact_up_to`` of them, else the trapezoid over ``samples`` evenly spaced steps (a decode step's
    time is linear in its context, the only thing ``k`` changes, so the trapezoid is exact there)."""
    n = out_len - 1
    if n <= 0:
        return 0.0
    if n <= exact_up_to:
        return statistics.fmean(step_s(k) for k in range(1, out_len))
    ks = sorted({1 + round(i * (n - 1) / (samples - 1)) for i in range(samples)})
    ts = [step_s(k) for k in ks]
    area = sum((ts[i] + ts[i + 1]) / 2 * (ks[i + 1] - ks[i]) for i in range(len(ks) - 1))
    return area / (ks[-1] - ks[0]) if ks[-1] > ks[0] else ts[0]


@dataclass(frozen=True, slots=True)
class Point:
    """One published figure, how to model it, and whether the calibration saw it."""

    source: str  # key into SOURCES
    gpu: str
    shape: str  # key into SHAPES
    tp: int
    metric: Metric
    measured_ms: float
    profile: str  # the engine profile that models this source's stack
    role: Role
    tokens: int = 0  # ttft: prompt tokens; tpot/e2e/busy: prompt (context) tokens per sequence
    batch: int = 1
    out_len: int = 0  # tpot/e2e: generated tokens per sequence
    sm_clock_mhz: int | None = None  # busy: the locked clock
    power_limit_w: float | None = None  # the board power limit of the run (None: the TDP)
    what: str = ""
    note: str = ""

    def modeled_ms(
        self, profile: EngineProfile | None = None, constants: EmulationConstants = DEFAULT_CONSTANTS
    ) -> float:
        """The model's figure, with ``profile`` (default: the shipped one this point names)."""
        prof = profile if profile is not None else PROFILES[self.profile]
        shape = SHAPES[self.shape]

        def run(work: IterationWork, clock: int | None = None) -> Any:
            lock = (clock, clock) if clock else None
            return predict_iteration(
                self.gpu,
                shape,
                work,
                power_limit_w=self.power_limit_w,
                sm_clock_range=lock,
                constants=constants,
                tp=self.tp,
                link=LINK_OF[self.gpu],
                profile=prof,
            )

        if self.metric == "busy":
            return run(decode_work(self.batch, self.tokens), self.sm_clock_mhz).busy_s * 1e3
        pre = run(prefill_work(self.tokens, self.batch)).time_s
        if self.metric == "ttft":
            return pre * 1e3
        mean_step = _mean_step(lambda k: run(decode_work(self.batch, self.tokens + k)).time_s, self.out_len)
        if self.metric == "tpot":
            return mean_step * 1e3
        return (pre + mean_step * (self.out_len - 1)) * 1e3

    def error(
        self, profile: EngineProfile | None = None, constants: EmulationConstants = DEFAULT_CONSTANTS
    ) -> float:
        """(model - measured) / measured."""
        return self.modeled_ms(profile, constants) / self.measured_ms - 1.0


SOURCES: dict[str, str] = {
    "phaselens-h200": "this project, docs/gpu/2026-11-30-h200-run2.json and -engine.json (engine rows)",
    "vllm-ci": "vLLM nightly performance benchmark, latency tests (buildkite.com/vllm/performance-benchmark)",
    "splitwise": "Splitwise profiling data, github.com/Mutinifni/splitwise-sim data/perf_model.csv",
    "trtllm-0.5": "TensorRT-LLM docs/source/performance.md, 'Low Latency' tables (data from v0.5)",
    "lmdeploy-0.1": "LMDeploy v0.1.0a1 (TurboMind) static inference benchmark, A100-80G fp16: "
    "InternLM/lmdeploy docs/en/benchmark/a100_fp16.md @3e391df (serving/devices/published_lmdeploy.py)",
    "gpt-fast": "gpt-fast (PyTorch, torch.compile + CUDA graphs) batch-1 generation, 8x A100-80GB at 330 W, bf16: "
    "pytorch-labs/gpt-fast README.md @c9f683e (serving/devices/published_gptfast.py)",
}

POINTS: list[Point] = []

# This project's engine on an H200 (llama-3.1-8b bf16, one GPU, eager PyTorch).
for _n, _ms, _role, _note in (
    (4096, 107.772, "calibration", "GPU-bound (util 97 %); fits eta_c"),
    (8192, 222.82, "calibration", "GPU-bound (util 97 %); fits eta_c"),
    (256, 35.129, "reference", "host-bound: util 39 %, ~30-35 ms host floor of that day's engine"),
    (1024, 31.382, "reference", "partly host-bound: util 87 %"),
):
    POINTS.append(
        Point(
            "phaselens-h200",
            "h200",
            "llama-3.1-8b",
            1,
            "ttft",
            _ms,
            "phaselens-eager",
            _role,
            _n,
            what=f"prefill {_n}, one step",
            note=_note,
        )
    )
# Decode batch 64 at context 1024: GPU-busy time = step time x GPU utilization, at the window's clock.
for _file, _knob, _mhz, _ms, _role in (
    ("run2", "default", 1980, 76.518 * 0.2226, "calibration"),
    ("run2", "sm 990 MHz", 990, 40.639 * 0.7030, "calibration"),
    ("run2", "cap 497 W", 1980, 32.735 * 0.3719, "validation"),
    ("run2", "cap 350 W", 1980, 37.591 * 0.4488, "validation"),
    ("run2", "sm 1410 MHz", 1410, 28.081 * 0.5840, "validation"),
    ("run2", "cap 200 W (408 MHz)", 405, 41.877 * 0.9377, "validation"),
    ("engine", "default", 1980, 72.711 * 0.1152, "validation"),
    ("engine", "cap 497 W", 1980, 38.846 * 0.2330, "validation"),
    ("engine", "cap 350 W", 1980, 49.750 * 0.2659, "validation"),
    ("engine", "sm 1410 MHz", 1410, 41.905 * 0.3548, "validation"),
    ("engine", "sm 990 MHz", 990, 40.020 * 0.6570, "validation"),
    ("engine", "cap 200 W (949 MHz)", 945, 42.202 * 0.7013, "validation"),
):
    POINTS.append(
        Point(
            "phaselens-h200",
            "h200",
            "llama-3.1-8b",
            1,
            "busy",
            round(_ms, 2),
            "phaselens-eager",
            _role,
            1024,
            64,
            sm_clock_mhz=_mhz,
            what=f"decode b64 GPU-busy, {_knob}",
            note=f"{_file}: step x util; fits kernel_latency_cycles" if _role == "calibration" else _file,
        )
    )
# vLLM CI latency test: batch 8, 32 input + 128 output tokens, end-to-end latency (median), bf16.
for _gpu, _ms8, _ms70, _build, _role8, _role70 in (
    # v3: all six calibrate the profile's two constants (3 rows each, the protocol's minimum); its check is
    # leave-one-out (bench/fidelity_table.py), there is no vLLM validation row left
    ("h100-sxm", 997.365, 2444.3, 9555, "calibration", "calibration"),
    ("h200", 834.014, 2075.36, 9513, "calibration", "calibration"),
    ("a100-sxm-80gb", 1579.34, 3990.39, 9523, "calibration", "calibration"),
):
    for _shape, _tp, _ms, _role in (("llama-3.1-8b", 1, _ms8, _role8), ("llama-3.1-70b", 4, _ms70, _role70)):
        POINTS.append(
            Point(
                "vllm-ci",
                _gpu,
                _shape,
                _tp,
                "e2e",
                _ms,
                "vllm",
                _role,
                32,
                8,
                128,
                what=f"latency_{'llama8B_tp1' if _tp == 1 else 'llama70B_tp4'}: batch 8, 32 in / 128 out, e2e",
                note=f"build {_build}",
            )
        )

# Splitwise perf_model.csv: every llama2-70b unit, in serving/devices/fidelity_sets.py (published_splitwise.py).
# TensorRT-LLM v0.5 first-token latency, A100 FP16, batch 1 (the H100 rows are FP8: not comparable).
for _shape, _tp, _n, _ms, _role in (
    ("llama-2-7b", 1, 128, 16.0, "calibration"),
    ("llama-2-7b", 1, 2048, 133.0, "calibration"),
    ("llama-2-70b", 4, 128, 47.0, "calibration"),
    ("llama-2-70b", 4, 2048, 377.0, "validation"),
):
    POINTS.append(
        Point(
            "trtllm-0.5",
            "a100-sxm-80gb",
            _shape,
            _tp,
            "ttft",
            _ms,
            "trtllm-0.5",
            _role,
            _n,
            what=f"1st token latency, input {_n}, batch 1",
            note="fp16",
        )
    )


# -- evidence --------------------------------------------------------------------------------------------


def prompt_step_evidence() -> list[dict[str, Any]]:
    """Per H100 TP degree, from the Splitwise measurements alone (no GPU model): the prompt time per token
    added between 1024 and 2048 tokens in one iteration (``below_us``), between 2048 and 4096 (``across_us``,
    over the custom all-reduce's 3072-token limit for Llama-2-70B) and between 4096 and 8192 (``above_us``),
    for one long prompt and for a batch of 512-token prompts; and ``attention_ms``, one 8192-token prompt
    minus 16 prompts of 512 (the same tokens, 1/16 of the causal attention pairs) -- what the quadratic
    (attention) part costs one rank (docs/FIDELITY.md, "What the Splitwise prompt times depend on")."""
    out = []
    for tp in (2, 4, 8):
        t = {(n, b): ms for (hw, p, n, b), ms in TTFT_MS.items() if hw == "h100-80gb" and p == tp}
        series = {
            "one_prompt": {n: t[n, 1] for n in (1024, 2048, 4096, 8192)},
            "prompts_of_512": {512 * b: t[512, b] for b in (2, 4, 8, 16)},
        }
        row: dict[str, Any] = {"gpu": "h100-sxm", "tp": tp, "attention_ms": t[8192, 1] - t[512, 16]}
        for name, v in series.items():
            row[name] = {
                "below_us": (v[2048] - v[1024]) / 1024 * 1e3,
                "across_us": (v[4096] - v[2048]) / 2048 * 1e3,
                "above_us": (v[8192] - v[4096]) / 4096 * 1e3,
            }
        out.append(row)
    return out
