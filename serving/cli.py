"""`phaselens` command: serve, load (``phaselens demo`` is in ``phaselens.demo``)."""

from __future__ import annotations

import argparse
import errno
import math
import os
import socket
import subprocess
import sys
import time

import httpx

from serving.admission import DEFAULT_MAX_BODY_BYTES
from serving.config import ConfigError, EngineConfig
from serving.devices.errors import DeviceError
from serving.loadgen import add_load_arguments, main_load
from serving.settings import MODES, ServeSettings


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="tiny",
        help="preset (tiny, llama-3.2-1b, llama-3.1-8b, llama-3.1-70b) or HF folder",
    )
    p.add_argument("--mode", default="aggregated", choices=MODES)
    # default None: an option given for the other mode is an error, not silently ignored
    p.add_argument("--workers", type=int, default=None, help="workers in aggregated mode (1)")
    p.add_argument(
        "--prefill-workers", type=int, default=None, help="prefill workers in disaggregated mode (1)"
    )
    p.add_argument(
        "--decode-workers", type=int, default=None, help="decode workers in disaggregated mode (1)"
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu | cuda | cuda:N | emulated:<gpu>, or a comma-separated list with one per worker",
    )
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    p.add_argument("--seed", type=int, default=0, help="seed of a preset's random weights")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-mb", type=int, default=256, help="KV cache per worker, MiB")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--chunked-prefill", action="store_true")
    p.add_argument("--threads-per-worker", type=int, default=0)
    p.add_argument(
        "--control-token",
        default=None,
        help="bearer token of /control (default: $PHASELENS_CONTROL_TOKEN or generated)",
    )
    p.add_argument(
        "--emulate-shape",
        default=None,
        help="with --device emulated:<gpu>: model shape whose GPU time is emulated (e.g. llama-3.1-8b)",
    )
    p.add_argument(
        "--emulate-dtype",
        default="bf16",
        choices=("bf16", "fp8"),
        help="with --device emulated:<gpu>: the emulated weights' and KV's precision (fp8 needs an H100, "
        "H200 or Blackwell; its figures are labelled unvalidated)",
    )
    p.add_argument(
        "--telemetry-spool", default=None, help="also append telemetry batches to this JSON-lines file"
    )
    p.add_argument(
        "--device-sample-interval-s",
        type=float,
        default=0.1,
        help="the router samples every worker's device this often while a collector reads them "
        "batched (GET /v1/collect); seconds in [0.01, 10] (0.1)",
    )
    p.add_argument(
        "--restart-delay-s",
        type=float,
        default=0.5,
        help="back-off before a dead worker is restarted; doubles per death (0.5)",
    )
    p.add_argument(
        "--max-restart-delay-s",
        type=float,
        default=None,
        help="cap of the restart back-off (30, or the first delay when that is longer)",
    )
    p.add_argument(
        "--max-waiting-requests",
        type=int,
        default=None,
        help="bound of the requests waiting for a batch slot, all workers together; beyond it new "
        "requests get 429 with Retry-After, and /health is degraded from 80%% of it (default: one "
        "batch per worker that takes new requests, the sum of their --max-num-seqs)",
    )
    p.add_argument(
        "--max-request-body-mb",
        type=float,
        default=DEFAULT_MAX_BODY_BYTES / 2**20,
        help=f"largest request body in MiB; larger gets 413 ({DEFAULT_MAX_BODY_BYTES / 2**20:g})",
    )


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    return ServeSettings(
        model=args.model,
        mode=args.mode,
        workers=1 if args.workers is None else args.workers,
        prefill_workers=1 if args.prefill_workers is None else args.prefill_workers,
        decode_workers=1 if args.decode_workers is None else args.decode_workers,
        devices=[d for d in args.device.split(",") if d],
        dtype=args.dtype,
        seed=args.seed,
        engine=EngineConfig(
            block_size=args.block_size,
            kv_cache_bytes=args.kv_cache_mb * 2**20,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            chunked_prefill=args.chunked_prefill,
            max_model_len=args.max_model_len,
        ),
        threads_per_worker=args.threads_per_worker,
        host=args.host,
        port=args.port,
        control_token=args.control_token,
        telemetry_spool=args.telemetry_spool,
        emulate_shape=args.emulate_shape,
        emulate_dtype=args.emulate_dtype,
        restart_delay_s=args.restart_delay_s,
        device_sample_interval_s=args.device_sample_interval_s,
        max_restart_delay_s=(
            max(30.0, args.restart_delay_s) if args.max_restart_delay_s is None else args.max_restart_delay_s
        ),
        max_waiting_requests=args.max_waiting_requests,
        max_body_bytes=int(args.max_request_body_mb * 2**20)
        if math.isfinite(args.max_request_body_mb)
        else 0,
    )


def layout_option_error(args: argparse.Namespace) -> str | None:
    """A message when a worker-count option of the other mode was given, else None."""
    if args.mode == "disaggregated" and args.workers is not None:
        return "--workers applies to --mode aggregated; use --prefill-workers and --decode-workers"
    other = [f for f in ("prefill_workers", "decode_workers") if getattr(args, f) is not None]
    if args.mode == "aggregated" and other:
        flags = " and ".join("--" + f.replace("_", "-") for f in other)
        return f"{flags} apply to --mode disaggregated; use --workers with --mode aggregated"
    return None


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the server's listening socket, so a clash fails before any worker starts.

    Raises ConfigError with a one-line message.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use") from e
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock


def check_kv_secret() -> None:
    """ConfigError naming ``$PHASELENS_KV_SECRET`` when it is set but malformed (the pool would
    fail at start-up with a traceback)."""
    from serving.kv_transfer import stack_secret

    try:
        stack_secret()
    except ValueError as e:
        raise ConfigError(str(e)) from None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from serving.router import create_app

    message = layout_option_error(args)
    if message:
        print(f"phaselens serve: error: {message}", file=sys.stderr)
        return 2
    settings = settings_from_args(args)
    try:
        check_kv_secret()
        app = create_app(settings)
        sock = bind_socket(settings.host, settings.port)
    except (ConfigError, DeviceError) as e:
        print(f"phaselens serve: error: {e}", file=sys.stderr)
        return 2
    token_note = (
        ""
        if args.control_token or os.environ.get("PHASELENS_CONTROL_TOKEN")
        else f" token={settings.control_token}"
    )
    print(
        f"phaselens serve: {settings.model_name} {settings.mode} on http://{settings.host}:{settings.port} "
        f"(control API at /control,{token_note or ' token from PHASELENS_CONTROL_TOKEN/--control-token'})",
        file=sys.stderr,
        flush=True,
    )
    banner = emulation_banner(settings)
    if banner is not None:
        print(banner, file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # as uvicorn.run does: Ctrl-C after a clean shutdown
        pass
    return 0 if server.started else 3  # 3: start-up failed (uvicorn's STARTUP_FAILURE)


def emulation_banner(settings: ServeSettings) -> str | None:
    """The serve banner's note on emulated devices: which GPU and shape each models, and where lag is
    counted; ``None`` when every device is measured."""
    from serving.devices.emulated_label import emulated_device_label

    modeled: dict[tuple[str, str, str, str], list[str]] = {}
    for _role, spec in settings.worker_specs():
        label = emulated_device_label(spec.device, spec.emulate_shape or spec.model, spec.emulate_dtype)
        if label is not None:
            key = (label["device"], label["gpu"], label["models_shape"], label["dtype"])
            modeled.setdefault(key, []).append(spec.worker_id)
    if not modeled:
        return None
    what = "; ".join(
        f"{', '.join(workers)} on {device} ({gpu}) modeling {shape} ({dtype}"
        + (", UNVALIDATED: the GPU model was never checked on fp8)" if dtype != "bf16" else ")")
        for (device, gpu, shape, dtype), workers in modeled.items()
    )
    return (
        f"phaselens serve: EMULATED GPUs, modeled not measured: {what}. The model math runs on this "
        "host's CPU and each iteration is paced to the modeled GPU time; iterations the host cannot "
        "keep pace with are counted as lag (host-bound data): see /v1/devices ('emulation'), /metrics "
        "(phaselens:emulation_lagged_iterations_total, phaselens:emulation_lag_seconds_total) and "
        "lag_s in iteration telemetry."
    )


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 300.0) -> None:
    """Poll `url`/health until it answers 200; raise if the server process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} was not ready after {timeout_s} s")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `serve` and `load` on a `phaselens` subcommand parser."""
    serve = sub.add_parser("serve", help="run the serving stack (router + worker processes)")
    _add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    load = sub.add_parser("load", help="replay a trace or Poisson load against a server")
    add_load_arguments(load)
    load.set_defaults(func=main_load)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="phaselens", description="phase-aware GPU efficiency for LLM serving"
    )
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
