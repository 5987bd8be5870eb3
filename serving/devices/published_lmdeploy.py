"""LMDeploy (TurboMind) static inference benchmark on A100-80G, fp16: another stack (a C++ engine derived
from FasterTransformer) and another release than Splitwise's, scored by the v3 protocol with its own
calibration / validation / test split (rule below, committed before any of its units was scored).

Source (``lmdeploy-0.1``): InternLM/lmdeploy ``docs/en/benchmark/a100_fp16.md`` at commit
``3e391df4673326f79363eebe030876861a9b7090`` ("All the following results are tested on (x8) A100-80G CUDA
11.8. The tested lmdeploy version is v0.1.0a1"), section "Static Inference Benchmark", tables
``llama2-7b`` (TP 1) and ``llama2-70b`` (TP 4): ``batch`` concurrent sessions, each of ``prompt_tokens``
then ``output_tokens``; FTL = first-token latency (s; ave / min / max over the sessions); ``50%(s)`` = the
median per-token latency of the generated tokens. Figures are transcribed as published (seconds, 2-3
significant digits).

Units (as for Splitwise, docs/FIDELITY.md "Protocol"):

* TTFT ``(shape, tp, prompt)``: median over the batch-1 rows of that prompt (every output length) of
  ``FTL(ave)`` -- one session, so ave = the session's first-token latency. Batches above 1 are not TTFT
  units: their FTL(ave) includes the sessions queued behind the others' prompts.
* TPOT ``(shape, tp, batch, prompt, out)``: the row's ``50%(s)``, modeled as the mean decode step of
  ``batch`` sequences over the generation (a step's time is linear in the context, so its median over the
  generation is its mean). Used: every llama2-70b row (64 sessions of 4096 tokens hold 21 GB of KV per
  GPU: they all ran at once) and the llama2-7b rows of batch 1 and 16; the llama2-7b batch-32/64 rows are
  not used: there the sessions' KV (0.5 MB per token) nears or passes what an 80 GB GPU holds beside
  13.5 GB of weights (32 x 4096 tokens: 69 GB; 64 x 2176: 73 GB), and FTL(max) at batch 64 (16 s and
  116 s at 2048-token prompts, vs 3.6 and 3.1 s at batch 16) shows sessions queued, not run at once.

Split rule (fixed and committed 2026-12-05 before any lmdeploy unit was scored): per (shape, figure), the
units sorted by ``sha256(f"lmdeploy|{figure}|{'|'.join(unit)}")``; position ``i % 3 == 0`` is TEST,
``1`` CALIBRATION, ``2`` VALIDATION.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict

from serving.devices.published import Point

SOURCE = "lmdeploy-0.1"
SOURCE_TEXT = (
    "LMDeploy v0.1.0a1 (TurboMind) static inference benchmark, A100-80G fp16: InternLM/lmdeploy "
    "docs/en/benchmark/a100_fp16.md @3e391df"
)
PROFILE = "turbomind-0.1"

# shape -> (tp, rows): (batch, prompt_tokens, output_tokens, FTL ave s, per-token latency 50% s)
ROWS: dict[str, tuple[int, tuple[tuple[int, int, int, float, float], ...]]] = {
    "llama-2-70b": (
        4,
        (
            (1, 1, 128, 0.031, 0.029),
            (1, 128, 128, 0.074, 0.029),
            (1, 128, 2048, 0.074, 0.031),
            (1, 2048, 128, 0.402, 0.031),
            (1, 2048, 2048, 0.405, 0.031),
            (16, 1, 128, 0.071, 0.03),
            (16, 128, 128, 0.437, 0.03),
            (16, 128, 2048, 0.403, 0.033),
            (16, 2048, 128, 5.776, 0.035),
            (16, 2048, 2048, 5.773, 0.036),
            (32, 1, 128, 0.098, 0.032),
            (32, 128, 128, 0.749, 0.032),
            (32, 128, 2048, 0.732, 0.036),
            (32, 2048, 128, 11.834, 0.04),
            (32, 2048, 2048, 11.711, 0.043),
            (64, 1, 128, 0.213, 0.037),
            (64, 128, 128, 1.292, 0.037),
            (64, 128, 2048, 1.173, 0.043),
            (64, 2048, 128, 17.402, 0.05),
            (64, 2048, 2048, 21.29, 0.055),
        ),
    ),
    "llama-2-7b": (
        1,
        (
            (1, 1, 128, 0.011, 0.009),
            (1, 128, 128, 0.022, 0.01),
            (1, 128, 2048, 0.022, 0.01),
            (1, 2048, 128, 0.139, 0.01),
            (1, 2048, 2048, 0.14, 0.011),
            (16, 1, 128, 0.021, 0.01),
            (16, 128, 128, 0.129, 0.011),
            (16, 128, 2048, 0.13, 0.015),
            (16, 2048, 128, 2.897, 0.02),
            (16, 2048, 2048, 2.678, 0.025),
        ),
    ),
}


def units() -> dict[tuple, float]:
    """Every unit -> its figure in ms: ``("ttft", shape, tp, prompt)`` and
    ``("tpot", shape, tp, batch, prompt, out)``."""
    out: dict[tuple, float] = {}
    ftl: dict[tuple, list[float]] = defaultdict(list)
    for shape, (tp, rows) in ROWS.items():
        for batch, prompt, out_len, ftl_s, token_s in rows:
            if batch == 1:
                ftl["ttft", shape, tp, prompt].append(ftl_s * 1e3)
            out["tpot", shape, tp, batch, prompt, out_len] = token_s * 1e3
    for key, v in ftl.items():
        out[key] = statistics.median(v)
    return out


def role_of(key: tuple, all_keys: list[tuple]) -> str:
    """TEST / CALIBRATION / VALIDATION by the split rule of the module docstring."""
    group = sorted(
        (k for k in all_keys if k[:2] == key[:2]),
        key=lambda k: hashlib.sha256(("lmdeploy|" + "|".join(str(x) for x in k)).encode()).hexdigest(),
    )
    return ("test", "calibration", "validation")[group.index(key) % 3]


def points() -> list[Point]:
    """The units as Points of the ``turbomind-0.1`` profile on the A100-SXM-80GB."""
    us = units()
    keys = list(us)
    out = []
    for key, ms in us.items():
        role = role_of(key, keys)
        if key[0] == "ttft":
            _, shape, tp, prompt = key
            out.append(
                Point(
                    SOURCE,
                    "a100-sxm-80gb",
                    shape,
                    tp,
                    "ttft",
                    ms,
                    PROFILE,
                    role,
                    prompt,
                    1,  # type: ignore[arg-type]
                    what=f"first-token latency, prompt {prompt}, batch 1",
                    note="fp16",
                )
            )
        else:
            _, shape, tp, batch, prompt, out_len = key
            out.append(
                Point(
                    SOURCE,
                    "a100-sxm-80gb",
                    shape,
                    tp,
                    "tpot",
                    ms,
                    PROFILE,
                    role,
                    prompt,
                    batch,
                    out_len,  # type: ignore[arg-type]
                    what=f"token latency p50, batch {batch}, prompt {prompt}, {out_len} out",
                    note="fp16",
                )
            )
    return out
