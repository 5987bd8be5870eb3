"""CPU cost of `phaselens collect`: CPU seconds of the collector process per wall second while it
samples N emulated GPUs at 100 ms (sampling alone), then while also ingesting the telemetry of the
stack under load. Baseline in the same run: the same process idle (no sources).

Usage: python bench/collector_overhead.py [--gpus 8] [--seconds 30] [--json out.json]
Target: < 2 % of one core for the sampling alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phaselens.testing import start_collector  # noqa: E402
from serving.loadgen import run_load  # noqa: E402
from serving.testing import start_server, stop_server  # noqa: E402
from serving.trace import poisson_trace  # noqa: E402


def cpu_share(proc: subprocess.Popen, seconds: float) -> float:
    """CPU seconds (user + system) of `proc` per wall second over `seconds`."""
    p = psutil.Process(proc.pid)
    t0, c0 = time.monotonic(), p.cpu_times()
    time.sleep(seconds)
    t1, c1 = time.monotonic(), p.cpu_times()
    return ((c1.user + c1.system) - (c0.user + c0.system)) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out: dict[str, float | int] = {"gpus": args.gpus, "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        idle, _ = start_collector(Path(tmp) / "idle.duckdb")
        time.sleep(2)
        out["idle_core_share"] = cpu_share(idle, args.seconds / 2)
        idle.terminate()
        idle.wait(30)

        server = start_server(
            "--mode",
            "aggregated",
            "--workers",
            str(args.gpus),
            "--device",
            "emulated:h100-sxm",
            "--emulate-shape",
            "llama-3.1-8b",
            "--kv-cache-mb",
            "8",
        )
        try:
            proc, url = start_collector(Path(tmp) / "c.duckdb", "--serving", server.url)
            time.sleep(3)
            out["sampling_core_share"] = cpu_share(proc, args.seconds)
            health = httpx.get(f"{url}/health").json()
            out["gpu_samples_per_s"] = (
                health["writer"]["rows_written"].get("gpu_samples", 0) / health["uptime_s"]
            )
            trace = poisson_trace(
                4.0, int(args.seconds * 4), prompt_tokens=(32, 256), output_tokens=(8, 32), seed=0
            )
            load = threading.Thread(target=run_load, args=(server.url, trace), kwargs={"progress": False})
            load.start()
            time.sleep(1)
            out["with_telemetry_core_share"] = cpu_share(proc, args.seconds * 0.8)
            load.join()
            health = httpx.get(f"{url}/health").json()
            out["rows_written"] = sum(health["writer"]["rows_written"].values())
            out["results_dropped"] = health["writer"]["results_dropped"]
            proc.terminate()
            proc.wait(30)
        finally:
            stop_server(server)
    net = out["sampling_core_share"] - out["idle_core_share"]
    print(f"collector idle (no sources):                {out['idle_core_share'] * 100:6.2f} % of one core")
    print(
        f"sampling {args.gpus} emulated GPUs at 100 ms:        {out['sampling_core_share'] * 100:6.2f} % of one core "
        f"({out['gpu_samples_per_s']:.0f} samples/s; net of idle {net * 100:.2f} %)"
    )
    print(
        f"  + ingesting telemetry of the loaded stack: {out['with_telemetry_core_share'] * 100:6.2f} % of one core"
    )
    print(f"target < 2 % for the sampling alone: {'met' if out['sampling_core_share'] < 0.02 else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
