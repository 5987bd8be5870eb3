"""MFU / MBU against the DCGM-style activities on this project's H200 measurements (issue 23 point 4).

For each step of docs/gpu/2026-11-30-h200-{run2,engine}.json (llama-3.1-8b bf16 on an H200, this
project's eager engine; one prompt of N tokens per prefill step, decode batches of B at context 1024):
the work of the step by the roofline count (serving/devices/roofline.py), its GPU-busy time as the step
time × GPU utilization (the windows' NVML utilization: the decode windows were host-bound), MFU and MBU
against the H200's dense BF16 peak and HBM bandwidth, and beside them the GPM readings per busy second
(SM activity / utilization, tensor activity / utilization; DRAM activity was not recorded). Then the two
yardsticks of stranded compute in decode: 1 − MFU (from work and time) and 1 − SM activity (the v2
figure), and the GPU model's activities for the same work (``phaselens-eager`` profile). Last, the two
bases of the phase attribution's stranded categories side by side (analytics/stranded.py): the share
of decode busy time stranded by 1 − MFU and by 1 − SM activity (1 − tensor activity beside), and of
prefill busy time by 1 − MBU, busy-time weighted (the table in docs/ANALYTICS.md).

    .venv/bin/python bench/roofline_h200.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from serving.config import preset
from serving.devices.base import IterationWork
from serving.devices.gpu_model import predict_iteration
from serving.devices.gpu_specs import GPU_SPECS
from serving.devices.roofline import count_work, rank_dims_of_shape

ROOT = Path(__file__).resolve().parents[1]
FILES = ("docs/gpu/2026-11-30-h200-run2.json", "docs/gpu/2026-11-30-h200-engine.json")
DECODE_CONTEXT = 1024
MIN_UTIL_PCT = 3.0  # below this the busy time is a few kernels in a window: no figure


def work_of(phase: str, size: int) -> IterationWork:
    """The step's work: a prompt of ``size`` tokens, or ``size`` sequences decoding at context 1024."""
    if phase == "prefill":
        return IterationWork("prefill", size, 0, size, 1, size * (size + 1) // 2, 1)
    return IterationWork("decode", 0, size, size * DECODE_CONTEXT, size, size * DECODE_CONTEXT, size)


def main() -> None:
    shape = preset("llama-3.1-8b")
    dims = rank_dims_of_shape(shape)
    spec = GPU_SPECS["h200"]
    head = (
        f"{'file':6} {'phase':7} {'size':>5} {'knob':12} {'busy ms':>8} {'MFU %':>6} {'MBU %':>6} "
        f"{'SM/util %':>9} {'tensor/util %':>13} {'1-MFU':>6} {'1-SM':>6} | model at default clocks: SM % tensor % MFU %"
    )
    print(head)
    decode_gap = []
    tensor_vs_mfu = []
    steps = []  # (phase, default clocks?, busy s, MFU, MBU, SM / util, tensor / util)
    for path in FILES:
        runs = json.loads((ROOT / path).read_text())["engine"]["runs"]
        tag = "run2" if "run2" in path else "engine"
        for r in runs:
            util = r.get("gpu_util_pct") or 0.0
            if r["knob"] == "warmup" or util < MIN_UTIL_PCT:
                continue
            work = work_of(r["phase"], int(r["size"]))
            c = count_work(dims, work)
            busy_s = r["step_ms"] / 1e3 * util / 100.0
            mfu = c.flops / (busy_s * spec.peak_flops_for("bf16"))
            mbu = c.hbm_bytes / (busy_s * spec.bandwidth_bytes_s)
            sm = r["sm_active_pct"] / util
            tensor = r["tensor_active_pct"] / util
            est = predict_iteration("h200", shape, work, profile="phaselens-eager")
            print(
                f"{tag:6} {r['phase']:7} {r['size']:>5} {r['knob']:12} {busy_s * 1e3:8.1f} {100 * mfu:6.1f} "
                f"{100 * mbu:6.1f} {100 * sm:9.1f} {100 * tensor:13.1f} {1 - mfu:6.2f} {1 - sm:6.2f} | "
                f"{100 * est.sm_active:7.1f} {100 * est.tensor_active:8.1f} {100 * (est.mfu or math.nan):5.1f}"
            )
            # at the default clocks only (tensor activity counts cycles at the clock that ran; MFU is
            # against the peak at the top clock); MBU above 1: the busy time from utilization is too short
            if r["knob"] == "default" and mbu <= 1.0:
                tensor_vs_mfu.append((tensor, mfu))
            if r["phase"] == "decode":
                decode_gap.append((1 - mfu) - (1 - sm))
            steps.append((r["phase"], r["knob"] == "default", busy_s, mfu, mbu, sm, tensor))
    ratio = [t / m for t, m in tensor_vs_mfu if m > 0]
    if ratio:
        ratio.sort()
        print(
            f"default clocks: tensor activity per busy second / MFU: median {ratio[len(ratio) // 2]:.2f} "
            f"(range {ratio[0]:.2f}–{ratio[-1]:.2f}) over {len(ratio)} steps"
        )
    if decode_gap:
        decode_gap.sort()
        mid = decode_gap[len(decode_gap) // 2]
        print(
            f"\ndecode: stranded compute by MFU exceeds the SM-activity figure by {100 * min(decode_gap):.0f}–"
            f"{100 * max(decode_gap):.0f} points of busy time (median {100 * mid:.0f}) over {len(decode_gap)} steps"
        )

    print_bases(steps)


def print_bases(steps: list[tuple[str, bool, float, float, float, float, float]]) -> None:
    """The phase attribution's two bases side by side (analytics/stranded.py): the share of decode busy
    time each calls stranded compute, and of prefill busy time stranded bandwidth, weighted by busy
    time, over the default-clock steps and over every step (caps and clock locks too)."""

    def share(phase: str, default_only: bool, rate: int) -> str:
        rows = [x for x in steps if x[0] == phase and (x[1] or not default_only)]
        busy = sum(x[2] for x in rows)
        if not rows or busy <= 0:
            return "–"
        return f"{100 * sum(x[2] * (1 - min(1.0, x[rate])) for x in rows) / busy:.1f} % ({len(rows)})"

    print("\nstranded share of busy time, weighted by busy time (steps): default clocks | every step")
    print(f"  decode  × (1 − MFU)           {share('decode', True, 3):>12} | {share('decode', False, 3)}")
    print(f"  decode  × (1 − SM activity)   {share('decode', True, 5):>12} | {share('decode', False, 5)}")
    print(f"  decode  × (1 − tensor active) {share('decode', True, 6):>12} | {share('decode', False, 6)}")
    print(f"  prefill × (1 − MBU)           {share('prefill', True, 4):>12} | {share('prefill', False, 4)}")
    print("  prefill × (1 − DRAM activity)  not recorded in these runs")


if __name__ == "__main__":
    main()
