"""Real-GPU check: NVML through the Device interface, knobs, per-phase engine timing and power, and
the serving stack on cuda:0 (aggregated and 1P1D) under load. Writes JSON results as it goes.

Usage: python scripts/gpu_check.py --out DIR [--model llama-3.1-8b] [--serve-model llama-3.2-1b]
Run by scripts/gpu_check.sh; finishes in a few minutes on one H100/H200.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS: dict[str, Any] = {}
DEVICE = "cuda:0"
LOAD_REQUESTS = 96
KV_GB = 24.0


def save(out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Sampler:
    """Samples one Device every `period_s` on a thread; `window(t0, t1)` averages a span."""

    def __init__(self, device: Any, period_s: float = 0.05) -> None:
        self.device, self.period_s = device, period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.device.snapshot().to_dict())
            except Exception as e:  # keep sampling; record the error once
                self.samples.append({"ts_s": time.time(), "error": str(e)})
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, t0: float, t1: float) -> dict[str, float | None]:
        keys = (
            "power_w",
            "gpu_util_pct",
            "sm_active_pct",
            "tensor_active_pct",
            "dram_active_pct",
            "sm_clock_mhz",
            "temperature_c",
        )
        rows = [s for s in self.samples if t0 <= s["ts_s"] <= t1 and "error" not in s]
        out: dict[str, float | None] = {"n": len(rows)}
        for k in keys:
            vals = [r[k] for r in rows if r.get(k) is not None]
            out[k] = round(statistics.fmean(vals), 2) if vals else None
        energy = [r["energy_mj"] for r in rows if r.get("energy_mj") is not None]
        out["energy_j"] = (energy[-1] - energy[0]) / 1000 if len(energy) > 1 else None
        return out


def sync() -> None:
    import torch

    if DEVICE != "cpu":
        torch.cuda.synchronize()


def stage_device(out: Path) -> Any:
    from serving.devices import open_device
    from serving.devices.errors import DeviceError

    dev = open_device(DEVICE)
    first = dev.snapshot().to_dict()
    time.sleep(0.3)
    second = dev.snapshot().to_dict()
    res: dict[str, Any] = {"first": first, "second": second, "knobs": dev.knobs()}
    try:
        c = dev.power_limit_constraints_w()
        target = max(c.min_w, round(c.max_w * 0.7))
    except DeviceError as e:
        res["constraints_error"], target = str(e), 0
    steps: list[dict[str, Any]] = []
    for name, fn in (
        (f"set_power_limit_w({target})", lambda: dev.set_power_limit_w(target)),
        ("read_after_set", lambda: dev.snapshot().power_limit_w),
        ("reset_power_limit", dev.reset_power_limit),
        ("read_after_reset", lambda: dev.snapshot().power_limit_w),
        ("set_sm_clock_range_mhz(990, 990)", lambda: dev.set_sm_clock_range_mhz(990, 990)),
        ("knobs_after_lock", dev.knobs),
        ("reset_sm_clocks", dev.reset_sm_clocks),
        ("set_power_limit_w(5000) (must fail)", lambda: dev.set_power_limit_w(5000)),
    ):
        try:
            steps.append({"step": name, "ok": True, "result": fn()})
        except DeviceError as e:
            steps.append({"step": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
    res["knob_steps"] = steps
    RESULTS["device"] = res
    save(out)
    return dev


def stage_engine(out: Path, dev: Any, model_name: str, budget_s: float) -> None:
    """Per-phase iteration time and power of the real engine, with power caps and clock locks."""
    import torch

    from serving.config import EngineConfig, SamplingParams
    from serving.engine import Engine
    from serving.weights import load_model

    t_load = time.time()
    model, _cfg = load_model(
        model_name, device=dev.torch_device, dtype=torch.bfloat16 if DEVICE != "cpu" else torch.float32
    )
    sync()
    engine = Engine(
        model,
        EngineConfig(kv_cache_bytes=int(KV_GB * 2**30), max_num_seqs=256, max_num_batched_tokens=16384),
        dev,
    )
    res: dict[str, Any] = {"model": model_name, "load_s": round(time.time() - t_load, 1), "runs": []}
    torch.set_num_threads(2)  # the step's host work is small; many threads only contend
    RESULTS["engine"] = res
    sampler = Sampler(dev)
    deadline = time.time() + budget_s
    rid = iter(range(10**9))

    def prefill(tokens: int, hold_s: float) -> tuple[float, float, float, int]:
        t0, n, times = time.time(), 0, []
        while time.time() - t0 < hold_s or n < 2:
            r = f"p{next(rid)}"
            engine.add_request(r, [1] * tokens, SamplingParams(max_tokens=1, ignore_eos=True))
            s = time.perf_counter()
            engine.step()
            sync()
            times.append(time.perf_counter() - s)
            n += 1
        return t0, time.time(), statistics.median(times[1:]), n

    def decode(batch: int, ctx: int, hold_s: float) -> tuple[float, float, float, int]:
        for _ in range(batch):
            engine.add_request(
                f"d{next(rid)}", [1] * ctx, SamplingParams(max_tokens=100_000 - ctx, ignore_eos=True)
            )
        while any(s.in_prefill for s in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        sync()
        t0, times = time.time(), []
        while time.time() - t0 < hold_s or len(times) < 3:
            s = time.perf_counter()
            engine.step()
            sync()
            times.append(time.perf_counter() - s)
        t1 = time.time()
        for seq in list(engine.scheduler.running):
            engine.abort(seq.request_id)
        return t0, t1, statistics.median(times[1:]), len(times)

    def record(kind: str, size: int, knob: str, fn: Any, *args: Any) -> None:
        if time.time() > deadline:
            return
        t0, t1, step_s, n = fn(*args)
        w = sampler.window(t0 + 0.3, t1)  # skip the ramp
        row = {"phase": kind, "size": size, "knob": knob, "step_ms": round(step_s * 1e3, 3), "iters": n, **w}
        res["runs"].append(row)
        log(
            f"engine {kind} {size} [{knob}]: {row['step_ms']} ms, {w['power_w']} W, SM {w['sm_active_pct']} %, util {w['gpu_util_pct']} %"
        )
        save(out)

    record("prefill", 512, "warmup", prefill, 512, 0.5)
    for tokens in (256, 1024, 4096, 8192):
        record("prefill", tokens, "default", prefill, tokens, 2.0)
    for batch in (1, 16, 64, 128):
        record("decode", batch, "default", decode, batch, 1024, 2.0)
    from serving.devices.errors import DeviceError

    try:
        c = dev.power_limit_constraints_w()
        caps = (round(c.max_w * 0.71), round(c.max_w * 0.5), c.min_w)
    except DeviceError as e:
        res["power_cap_error"], caps = str(e), ()
    for cap in caps:
        try:
            dev.set_power_limit_w(cap)
        except DeviceError as e:
            res["power_cap_error"] = str(e)
            break
        record("prefill", 4096, f"cap {cap} W", prefill, 4096, 2.0)
        record("decode", 64, f"cap {cap} W", decode, 64, 1024, 2.0)
    try:
        dev.reset_power_limit()
    except DeviceError:
        pass
    for mhz in (1410, 990):
        try:
            dev.set_sm_clock_range_mhz(mhz, mhz)
        except DeviceError as e:
            res["clock_lock_error"] = str(e)
            break
        record("prefill", 4096, f"sm {mhz} MHz", prefill, 4096, 2.0)
        record("decode", 64, f"sm {mhz} MHz", decode, 64, 1024, 2.0)
    try:
        dev.reset_sm_clocks()
    except DeviceError:
        pass
    sampler.stop()


def stage_serving(out: Path, dev: Any, model_name: str) -> None:
    """The real stack on cuda:0: aggregated, then 1P1D on the same GPU; greedy equality; load."""
    import httpx

    from serving.cli import wait_ready
    from serving.loadgen import run_load
    from serving.trace import poisson_trace

    prompts = ["The quick brown fox", "GPU efficiency of LLM serving", "0123456789" * 20]
    res: dict[str, Any] = {"model": model_name}
    RESULTS["serving"] = res
    sampler = Sampler(dev, 0.1)
    for name, extra in (
        ("aggregated", ["--mode", "aggregated", "--workers", "1", "--device", DEVICE]),
        ("disaggregated_1p1d", ["--mode", "disaggregated", "--device", f"{DEVICE},{DEVICE}"]),
    ):
        port = 8300 + len(res)
        cmd = [
            sys.executable,
            "-m",
            "serving.cli",
            "serve",
            "--port",
            str(port),
            "--model",
            model_name,
            "--kv-cache-mb",
            "8192",
            "--max-num-seqs",
            "128",
            *extra,
        ]
        t_start = time.time()
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, timeout_s=240)
            r: dict[str, Any] = {"startup_s": round(time.time() - t_start, 1)}
            r["greedy"] = [
                httpx.post(
                    f"{url}/v1/completions",
                    json={"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True},
                    timeout=120,
                ).json()["choices"][0]["text"]
                for p in prompts
            ]
            t0 = time.time()
            rep = run_load(
                url,
                poisson_trace(
                    16.0, LOAD_REQUESTS, prompt_tokens=(128, 2048), output_tokens=(32, 256), seed=1
                ),
                progress=False,
            )
            r["load"] = rep.summary_dict()
            r["nvml_during_load"] = sampler.window(t0, time.time())
            tele = httpx.get(f"{url}/v1/telemetry", timeout=30).json()
            reqs = [e for b in tele["batches"] for e in b["events"] if e["type"] == "request"]
            kv = [e for e in reqs if e.get("kv_transfer_bytes")]
            if kv:
                r["kv_transfer"] = {
                    "n": len(kv),
                    "mean_bytes": statistics.fmean(e["kv_transfer_bytes"] for e in kv),
                    "median_ms": statistics.median(
                        (e["kv_transfer_end_s"] - e["kv_transfer_start_s"]) * 1e3 for e in kv
                    ),
                    "GB_per_s": sum(e["kv_transfer_bytes"] for e in kv)
                    / sum(e["kv_transfer_end_s"] - e["kv_transfer_start_s"] for e in kv)
                    / 1e9,
                }
            res[name] = r
            log(f"serving {name}: {json.dumps(r['load'])[:400]}")
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            log(f"serving {name} failed: {e}")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        save(out)
    g = [res.get(k, {}).get("greedy") for k in ("aggregated", "disaggregated_1p1d")]
    res["greedy_equal"] = g[0] is not None and g[0] == g[1]
    sampler.stop()
    save(out)


def emulator_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The emulator's prediction beside each measured engine row (same GPU, shape, work, knob)."""
    from serving.config import preset
    from serving.devices import IterationWork, predict_iteration

    engine = results.get("engine") or {}
    name = (results.get("env") or {}).get("gpu") or ""
    gpu = "h200" if "H200" in name else "a100-sxm-80gb" if "A100" in name else "h100-sxm"
    shape = preset(engine.get("model", "llama-3.1-8b"))
    rows = []
    for run in engine.get("runs", []):
        n, knob = run["size"], run["knob"]
        if run["phase"] == "prefill":
            work = IterationWork("prefill", n, 0, n, 1, n * (n + 1) // 2, 1)
        else:
            ctx = 1024
            work = IterationWork("decode", 0, n, n * ctx, n, n * ctx, n)
        limit = clocks = None
        if knob.startswith("cap "):
            limit = float(knob.split()[1])
        elif knob.startswith("sm "):
            mhz = int(knob.split()[1])
            clocks = (mhz, mhz)
        est = predict_iteration(gpu, shape, work, power_limit_w=limit, sm_clock_range=clocks)
        rows.append(
            {
                "phase": run["phase"],
                "size": n,
                "knob": knob,
                "measured_ms": run["step_ms"],
                "modeled_ms": round(est.time_s * 1e3, 2),
                "time_err_pct": round((est.time_s * 1e3 / run["step_ms"] - 1) * 100, 1),
                "measured_w": run.get("power_w"),
                "modeled_w": round(est.power_w, 1),
                "measured_util_pct": run.get("gpu_util_pct"),
            }
        )
    return rows


def print_comparison(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'phase':8} {'size':>5} {'knob':14} {'meas ms':>9} {'model ms':>9} {'err %':>7} {'meas W':>7} {'model W':>8} {'util %':>7}"
    )
    for r in rows:
        print(
            f"{r['phase']:8} {r['size']:>5} {r['knob']:14} {r['measured_ms']:>9} {r['modeled_ms']:>9} "
            f"{r['time_err_pct']:>7} {r['measured_w']!s:>7} {r['modeled_w']:>8} {r['measured_util_pct']!s:>7}"
        )
    print("(rows with low util % were host-bound: the emulator models the GPU, not host overhead)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--model", default="llama-3.1-8b", help="shape for the per-phase engine sweep")
    ap.add_argument("--serve-model", default="llama-3.2-1b", help="shape served over HTTP")
    ap.add_argument("--engine-budget-s", type=float, default=90)
    ap.add_argument("--device", default="cuda:0", help="cuda:N (or cpu for a dry rehearsal)")
    ap.add_argument("--load-requests", type=int, default=96)
    ap.add_argument("--kv-gb", type=float, default=24.0, help="KV cache of the engine sweep")
    ap.add_argument("--compare", default=None, help="only print emulator vs measurement for a results JSON")
    ap.add_argument("--skip", default="", help="comma list of stages to skip: engine,serving")
    args = ap.parse_args()
    if args.compare:
        print_comparison(emulator_rows(json.loads(Path(args.compare).read_text())))
        return 0
    global DEVICE, LOAD_REQUESTS, KV_GB
    DEVICE, LOAD_REQUESTS, KV_GB = args.device, args.load_requests, args.kv_gb
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    RESULTS["env"] = {
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    log(json.dumps(RESULTS["env"]))
    dev = stage_device(out)
    log(json.dumps(RESULTS["device"]["knob_steps"], default=str))
    skip = set(args.skip.split(","))
    for name, fn in (
        ("engine", lambda: stage_engine(out, dev, args.model, args.engine_budget_s)),
        ("serving", lambda: stage_serving(out, dev, args.serve_model)),
    ):
        if name in skip:
            continue
        t = time.time()
        try:
            fn()
        except Exception as e:
            import traceback

            traceback.print_exc()
            RESULTS[f"{name}_error"] = f"{type(e).__name__}: {e}"
        log(f"stage {name} took {time.time() - t:.0f} s")
        import gc

        gc.collect()
        if DEVICE != "cpu":
            torch.cuda.empty_cache()
        save(out)
    if RESULTS.get("engine", {}).get("runs"):
        RESULTS["emulator_comparison"] = emulator_rows(RESULTS)
        print_comparison(RESULTS["emulator_comparison"])
        save(out)
    for restore in (dev.reset_power_limit, dev.reset_sm_clocks):
        try:
            restore()
        except Exception:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
