"""CPU cost of `phaselens collect`: CPU seconds of the collector process per wall second while it
samples N emulated GPUs at 100 ms (sampling alone), then while also ingesting the telemetry of the
stack under load. Baseline in the same run: the same process idle (no sources).

First, against the same stack, the CPU per poll of the serving sources (`GET /v1/devices`,
`GET /v1/telemetry`) with this tree's HTTP client (``new``: httpcore's connection pool) and with
the clients of the baseline revisions (their ``collector/sources/http.py``, read with ``git show``):
``hand`` (``--hand-rev``: the hand-written HTTP/1.1 client) and ``httpx`` (``--httpx-rev``: the
first httpx version, an ``httpx.Client``), in alternated blocks of ``--polls`` polls each, in this
process (CPU time of this thread: the stack is another process).

Usage: python bench/collector_overhead.py [--gpus 8] [--seconds 30] [--json out.json]
       [--hand-rev REV] [--httpx-rev REV] [--polls 200] [--rounds 6] [--clients-only]
Target: < 2 % of one core for the sampling alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.sources.serving_stack import ServingDevicesSource, ServingTelemetrySource  # noqa: E402
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


#: main before the HTTP client became httpx: the hand-written HTTP/1.1 keep-alive client
HAND_CLIENT_REV = "0e5f64aa01c107324a06488e85d265ec231c72ed"
#: main with the first httpx client (an ``httpx.Client`` whose transport's pool held the deadline)
HTTPX_CLIENT_REV = "e9b9d193ab22559e358a511f8757413fbc30674e"


def http_module_at(rev: str, tmp: Path, name: str) -> ModuleType:
    """``collector/sources/http.py`` as it was at ``rev`` (``git show``), imported as a module of
    its own; it raises this tree's ``SourceUnavailable``/``PageTooLarge`` like this tree's."""
    text = subprocess.run(
        ["git", "show", f"{rev}:collector/sources/http.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = tmp / f"{name}_http.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"phaselens_{name}_http", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def client_cpu_per_poll(
    url: str, baselines: dict[str, ModuleType], polls: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """CPU seconds of this thread per poll of each serving source, per client (``baselines``' and
    ``new``), one list entry per block of ``polls`` polls; the order of the clients is rotated
    every round, ``rounds`` rounds."""
    sources = {}
    for client in [*baselines, "new"]:
        devices = ServingDevicesSource(url, host_interval_s=float("inf"))  # the HTTP and JSON only
        telemetry = ServingTelemetrySource(url)
        if client in baselines:
            for src in (devices, telemetry):
                timeout_s = src._client._http.timeout_s
                src._client._http = baselines[client].HttpClient(
                    url, timeout_s=timeout_s, max_body_bytes=256 << 20
                )
        sources[client] = {"devices": devices, "telemetry": telemetry}
    out: dict[str, dict[str, list[float]]] = {c: {"devices": [], "telemetry": []} for c in sources}
    for by_name in sources.values():  # warm up: connections open, caches filled
        for src in by_name.values():
            for _ in range(20):
                assert src.poll(force=True).ok
    order = list(sources)
    for r in range(rounds):
        for client in order[r % len(order) :] + order[: r % len(order)]:
            for name, src in sources[client].items():
                t0 = time.thread_time()
                for _ in range(polls):
                    src.poll(force=True)
                out[client][name].append((time.thread_time() - t0) / polls)
    for by_name in sources.values():
        for src in by_name.values():
            assert src.health().status == "ok", src.health()
            src.close()
    return out


def print_clients(per_poll: dict[str, dict[str, list[float]]], revs: dict[str, str]) -> dict[str, float]:
    """Print the medians per source and client and the ratios to this tree's; return them flat."""
    flat: dict[str, float] = {}
    named = ", ".join(f"{c} = {rev[:10]}'s client" for c, rev in revs.items())
    print(f"CPU per poll of the serving sources (median of blocks; new = this tree's; {named}):")
    for name, rate in (("devices", 10), ("telemetry", 2)):
        med = {c: statistics.median(per_poll[c][name]) for c in per_poll}
        flat |= {f"{name}_{c}_ms": s * 1e3 for c, s in med.items()}
        cells = "  ".join(f"{c} {s * 1e3:6.3f} ms" for c, s in med.items())
        ratios = "  ".join(f"new/{c} {med['new'] / med[c]:4.2f}x" for c in revs)
        flat |= {f"{name}_new_over_{c}": med["new"] / med[c] for c in revs}
        print(f"  GET /v1/{name:<9} {cells}  {ratios}")
        for c in revs:
            print(f"    at {rate}/s, new vs {c}: {(med['new'] - med[c]) * rate * 100:+.2f} % of one core")
    return flat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--hand-rev", default=HAND_CLIENT_REV, help="the commit of the hand-written client")
    ap.add_argument("--httpx-rev", default=HTTPX_CLIENT_REV, help="the commit of the httpx.Client client")
    ap.add_argument("--polls", type=int, default=200, help="polls per block of the client comparison")
    ap.add_argument("--rounds", type=int, default=6, help="old/new blocks of the client comparison")
    ap.add_argument("--clients-only", action="store_true", help="only the client comparison")
    args = ap.parse_args()
    out: dict[str, float | int] = {"gpus": args.gpus, "seconds": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        revs = {"hand": args.hand_rev, "httpx": args.httpx_rev}
        baselines = {c: http_module_at(rev, Path(tmp), c) for c, rev in revs.items()}
        if not args.clients_only:
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
            per_poll = client_cpu_per_poll(server.url, baselines, args.polls, args.rounds)
            out |= print_clients(per_poll, revs)
            if args.clients_only:
                if args.json:
                    Path(args.json).write_text(json.dumps(out, indent=1))
                return 0
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
