"""Where a decode step's time goes on a GPU: median step time by batch and a torch.profiler table.

(docs/gpu/2026-11-30-h200-decode-profile.txt was taken with an earlier version that also timed a
masked-SDPA decode attention; the engine's attention is now serving.model.Attention._paged_decode.)

Usage: python scripts/gpu_decode_profile.py [--model llama-3.2-1b] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.config import EngineConfig, SamplingParams
from serving.devices import open_device
from serving.engine import Engine
from serving.weights import load_model


def decode_steps(engine: Engine, batch: int, ctx: int, steps: int) -> list[float]:
    for i in range(batch):
        engine.add_request(
            f"b{batch}-{i}-{time.time()}", [1] * ctx, SamplingParams(max_tokens=10_000, ignore_eos=True)
        )
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        engine.step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def clear(engine: Engine) -> None:
    for seq in list(engine.scheduler.running) + list(engine.scheduler.waiting):
        engine.abort(seq.request_id)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = open_device(args.device)
    model, _ = load_model(args.model, device=dev.torch_device, dtype=torch.bfloat16)
    torch.set_num_threads(2)
    engine = Engine(
        model, EngineConfig(kv_cache_bytes=16 * 2**30, max_num_seqs=256, max_num_batched_tokens=16384), dev
    )
    for batch in (1, 64):
        t = decode_steps(engine, batch, 1024, 25)
        print(
            f"decode batch {batch}: median {statistics.median(t[3:]):.2f} ms, min {min(t):.2f} ms", flush=True
        )
        clear(engine)
    decode_steps(engine, 16, 1024, 3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table)
    (out / "decode_profile.txt").write_text(
        table + "\n\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
