"""A serving worker: one OS process, one Device, one Engine; talks to the router over a pipe.

Router → worker messages: ("submit", dict), ("abort", id), ("call", call_id, method, kwargs),
("shutdown",). Worker → router: ("ready", info), ("failed", message), ("tokens", [...]),
("kv_received", id, info), ("request_error", id, message), ("handoff_error", id, message) (the KV
could not be sent to the decode worker), ("stats", dict), ("telemetry", batch),
("reply", call_id, ok, result).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from serving.config import EngineConfig, SamplingParams

ROLES = ("mixed", "prefill", "decode")
_STATS_INTERVAL_S = 0.2
# An iteration that raises fails its requests and the worker goes on; this many failed iterations
# in a row (or an error that leaves the device unusable) end the process so the pool restarts it.
MAX_CONSECUTIVE_ITERATION_ERRORS = 5
_FATAL_MARKERS = ("CUDA error", "device-side assert", "CUBLAS_STATUS", "cuDNN error", "NCCL error")
_DEVICE_METHODS = (
    "knobs",
    "snapshot",
    "set_power_limit_w",
    "reset_power_limit",
    "set_sm_clock_range_mhz",
    "reset_sm_clocks",
)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker process needs to start (picklable)."""

    worker_id: str
    device: str
    model: str = "tiny"
    dtype: str = "auto"
    seed: int = 0
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    threads: int = 1
    kv_host: str = "127.0.0.1"
    emulate_shape: str | None = None  # model shape an emulated GPU models (default: the real model)
    emulate_dtype: str = "bf16"  # the emulated weights' and KV's precision (bf16 | fp8: unvalidated)


def params_to_dict(p: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(p)


def params_from_dict(d: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**{**d, "stop_token_ids": tuple(d.get("stop_token_ids", ()))})


class _Link:
    """The pipe to the router, shared by the main loop and the KV threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, *msg: Any) -> None:
        with self._lock:
            self.conn.send(msg)


def worker_main(spec: WorkerSpec, conn: Connection, kv_secret: bytes) -> None:
    """Process entry point: build the engine, report ready, then serve until told to stop.

    ``kv_secret`` authenticates the KV hand-off connections between the stack's workers; it comes
    through the process pipe (never a command line, where ``ps`` would show it).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the router decides when workers stop
    link = _Link(conn)
    code = 0
    try:
        worker = _Worker(spec, link, kv_secret)
    except Exception as e:
        link.send("failed", f"{type(e).__name__}: {e}")
        code = 1
    else:
        try:
            worker.run()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass  # the router went away
        except Exception:
            traceback.print_exc()
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: daemon KV threads blocked in sockets can abort it noisily.
    os._exit(code)


def engine_fingerprint(device: Any, model: str, dtype: str) -> dict[str, Any]:
    """What a power calibration of this worker depends on besides its GPU: the model (an emulated
    GPU's modeled shape, in bf16 as the GPU model computes it), dtype, TP and the engine's version
    (phaselens's; an emulated GPU adds its engine profile)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        engine_version = f"phaselens {version('phaselens')}"
    except PackageNotFoundError:
        engine_version = "phaselens (not installed)"
    if device.is_emulated:
        return {
            "model": device.model_shape.name,
            "dtype": "bfloat16",
            "tp": device.tp,
            "engine_version": f"{engine_version} / emulated {device.profile.name}",
        }
    return {"model": model, "dtype": dtype, "tp": 1, "engine_version": engine_version}


class _Worker:
    def __init__(self, spec: WorkerSpec, link: _Link, kv_secret: bytes) -> None:
        import torch

        from serving.config import model_config_for
        from serving.devices import open_device
        from serving.engine import Engine
        from serving.kv_transfer import KVLayout, KVReceiver, KVSender
        from serving.telemetry import TelemetryEmitter
        from serving.weights import load_model, model_dtype

        self.spec, self.link = spec, link
        worker_number = int(spec.worker_id.rsplit("-", 1)[-1]) if spec.worker_id[-1:].isdigit() else None
        emulation: dict[str, Any] = {"dtype": spec.emulate_dtype} if spec.emulate_dtype != "bf16" else {}
        self.device = open_device(
            spec.device,
            model_shape=model_config_for(spec.emulate_shape or spec.model),
            index=worker_number,
            **emulation,
        )
        # A GPU worker's host work is small tensors: many threads only contend.
        threads = spec.threads if self.device.torch_device == "cpu" else min(spec.threads, 2)
        torch.set_num_threads(max(1, threads))
        dtype_name = spec.dtype
        if dtype_name == "auto":
            dtype_name = "bfloat16" if self.device.torch_device.startswith("cuda") else "float32"
        model, _cfg = load_model(
            spec.model, device=self.device.torch_device, dtype=model_dtype(dtype_name), seed=spec.seed
        )
        self.telemetry = TelemetryEmitter(spec.worker_id, lambda b: link.send("telemetry", b))
        self.engine = Engine(
            model, spec.engine, self.device, worker_id=spec.worker_id, telemetry=self.telemetry
        )
        mc = self.engine.model_cfg
        layout = KVLayout(
            mc.num_layers, mc.num_kv_heads, mc.head_dim, self.engine.cfg.max_model_len, mc.vocab_size
        )
        self._reject_log_s, self._reject_log_budget, self._reject_log_skipped = time.monotonic(), 10.0, 0
        self._reject_lock = threading.Lock()  # receiver threads share the log budget
        self.receiver = KVReceiver(kv_secret, layout, spec.kv_host, on_reject=self._kv_rejected)
        self.sender = KVSender(kv_secret, self._on_sent)
        self._targets: dict[str, tuple[str, int]] = {}
        self._stop = False
        self.iteration_errors = 0
        self._consecutive_errors = 0
        self._last_stats = 0.0
        link.send(
            "ready",
            {
                "pid": os.getpid(),
                "kv_host": self.receiver.host,
                "kv_port": self.receiver.port,
                "device": self.device.spec,
                "device_name": self.device.snapshot().name,
                "gpu_uuid": self.engine.gpu_uuid,
                "gpu_index": self.engine.gpu_index,
                "emulated": self.device.is_emulated,
                "dtype": dtype_name,
                "engine": dataclasses.asdict(self.engine.cfg),
                "model": self.engine.model_cfg.name,
                "fingerprint": engine_fingerprint(self.device, self.engine.model_cfg.name, dtype_name),
            },
        )

    def run(self) -> None:
        conn = self.link.conn
        while not self._stop:
            busy = self.engine.has_work()
            if conn.poll(0 if busy else 0.01):
                while conn.poll():
                    self._handle(conn.recv())
            self._admit_handoffs()
            if self.engine.has_work():
                try:
                    self._step()
                    self._consecutive_errors = 0
                except (EOFError, BrokenPipeError, ConnectionResetError):
                    raise  # the router went away
                except Exception as e:
                    self._iteration_failed(e)
            now = time.monotonic()
            if now - self._last_stats >= _STATS_INTERVAL_S:
                self._last_stats = now
                self.link.send("stats", self.stats())
            self.telemetry.maybe_flush()
        self.telemetry.flush()
        self.receiver.close()
        self.sender.close()
        self.device.close()

    def stats(self) -> dict[str, Any]:
        """The engine's stats, the failed iterations and the refused KV hand-off connections by reason."""
        return {
            **self.engine.stats(),
            "iteration_errors": self.iteration_errors,
            "kv_rejected": dict(self.receiver.rejected),
        }

    def _step(self) -> None:
        result = self.engine.step()
        if result.outputs:
            self.link.send(
                "tokens",
                [(o.request_id, o.token_id, o.ts_s, o.finish_reason, o.meta) for o in result.outputs],
            )
        for rid, message in result.errors:  # the engine dropped these requests; the worker goes on
            self._targets.pop(rid, None)
            self.link.send("request_error", rid, message)
        for h in result.handoffs:
            header = {
                "request_id": h.request_id,
                "token_ids": h.token_ids,
                "num_prompt_tokens": h.num_prompt_tokens,
                "params": params_to_dict(h.params),
                "from_worker": self.spec.worker_id,
                "meta": h.meta,
            }
            target = self._targets.pop(h.request_id, None)
            if target is None:
                self.link.send("request_error", h.request_id, "no decode worker was given for the hand-off")
            else:
                self.sender.send(target, header, h.kv)

    def _iteration_failed(self, error: Exception) -> None:
        """Fail the requests an iteration was running when it raised, and keep serving.

        Re-raises (ending the process; the pool restarts it) when the error cannot be pinned to
        requests, when it leaves the device unusable, or after repeated failures in a row.
        """
        self.iteration_errors += 1
        self._consecutive_errors += 1
        text = f"{type(error).__name__}: {error}"
        batch = [seq.request_id for seq in self.engine.scheduler.running]
        fatal = any(m in text for m in _FATAL_MARKERS) or not self._device_usable()
        if not batch or fatal or self._consecutive_errors >= MAX_CONSECUTIVE_ITERATION_ERRORS:
            raise error
        print(
            f"{self.spec.worker_id}: iteration failed, failing its {len(batch)} request(s): {text}",
            file=sys.stderr,
            flush=True,
        )
        for rid in batch:
            self.engine.abort(rid)
            self._targets.pop(rid, None)
            self.link.send(
                "request_error",
                rid,
                f"worker {self.spec.worker_id} failed while running this request's batch ({text}); "
                "the request was dropped, the worker goes on serving",
            )

    def _device_usable(self) -> bool:
        """A small op on the device: False after a sticky error (e.g. a CUDA device-side assert)."""
        import torch

        try:
            return float(torch.ones(2, device=self.device.torch_device).sum().item()) == 2.0
        except Exception:
            return False

    def _on_sent(self, header: dict[str, Any], nbytes: int, started_s: float, error: str | None) -> None:
        if error is not None:
            self.link.send("handoff_error", header["request_id"], error)

    def _kv_rejected(self, reason: str, message: str, request_id: str | None, authenticated: bool) -> None:
        """A hand-off connection was refused (on its receiver thread): one log line each (a burst of
        10, then one a second; the next line says how many were left out), and the request failed
        when a peer of this stack sent a frame naming it (the router would wait for its KV forever)."""
        with self._reject_lock:
            now = time.monotonic()
            self._reject_log_budget = min(10.0, self._reject_log_budget + now - self._reject_log_s)
            self._reject_log_s = now
            log = self._reject_log_budget >= 1.0
            if log:
                self._reject_log_budget -= 1.0
                skipped, self._reject_log_skipped = self._reject_log_skipped, 0
            else:
                self._reject_log_skipped += 1
        if log:
            more = f" ({skipped} more refused since the last line)" if skipped else ""
            print(
                f"{self.spec.worker_id}: KV hand-off connection refused ({reason}): {message}{more}",
                file=sys.stderr,
                flush=True,
            )
        if authenticated and request_id is not None:
            self.link.send(
                "request_error", request_id, f"decode worker refused the KV hand-off frame: {message}"
            )

    def _admit_handoffs(self) -> None:
        inbox = self.receiver.inbox
        while not inbox.empty():
            got = inbox.get_nowait()
            h = got.header  # checked by the receiver (kv_transfer.check_header)
            rid = h["request_id"]
            try:
                self.engine.add_prefilled(
                    rid, h["token_ids"], h["num_prompt_tokens"], params_from_dict(h["params"]), got.kv
                )
            except Exception as e:
                self.link.send("request_error", rid, f"decode worker rejected the hand-off: {e}")
                continue
            self.link.send(
                "kv_received",
                rid,
                {
                    "decode_worker": self.spec.worker_id,
                    "kv_transfer_bytes": got.nbytes,
                    "kv_transfer_start_s": h["sent_s"],
                    "kv_transfer_end_s": got.received_s,
                },
            )

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "submit":
            self._submit(msg[1])
        elif kind == "abort":
            self.engine.abort(msg[1])
            self._targets.pop(msg[1], None)
        elif kind == "call":
            self._call(*msg[1:])
        elif kind == "shutdown":
            self._stop = True

    def _submit(self, req: dict[str, Any]) -> None:
        rid = req["request_id"]
        try:
            handoff = req.get("handoff_to")
            if handoff is not None:
                self._targets[rid] = (handoff["host"], handoff["port"])
            self.engine.add_request(
                rid,
                req["prompt_ids"],
                params_from_dict(req["params"]),
                arrival_s=req.get("arrival_s"),
                handoff=handoff is not None,
            )
        except Exception as e:
            self._targets.pop(rid, None)
            self.link.send("request_error", rid, str(e))

    def _call(self, call_id: int, method: str, kwargs: dict[str, Any]) -> None:
        from serving.devices import DeviceError

        try:
            if method == "stats":
                result: Any = self.stats()
            elif method in _DEVICE_METHODS:
                result = getattr(self.device, method)(**kwargs)
                if method == "snapshot":
                    result = result.to_dict()
            else:
                raise ValueError(f"unknown worker call {method!r}")
            self.link.send("reply", call_id, True, result)
        except DeviceError as e:
            self.link.send("reply", call_id, False, {"type": type(e).__name__, "message": str(e)})
        except (ValueError, TypeError) as e:
            self.link.send("reply", call_id, False, {"type": "ValueError", "message": str(e)})
