"""What `phaselens serve` starts: the pool layout, devices and engine settings, validated up front."""

from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from serving.admission import DEFAULT_MAX_BODY_BYTES
from serving.config import ConfigError, EngineConfig, ModelConfig, model_config_for
from serving.devices import check_devices_available, parse_device_spec
from serving.worker import WorkerSpec

MODES = ("aggregated", "disaggregated")


@dataclass(slots=True)
class ServeSettings:
    model: str = "tiny"
    mode: str = "aggregated"
    workers: int = 1  # aggregated
    prefill_workers: int = 1  # disaggregated
    decode_workers: int = 1
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    dtype: str = "auto"
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    threads_per_worker: int = 0  # 0: CPU cores / workers
    host: str = "127.0.0.1"
    port: int = 8000
    control_token: str | None = None
    telemetry_spool: str | None = None
    served_model_name: str | None = None
    emulate_shape: str | None = None  # with emulated:<gpu> devices: the model shape to pace for
    emulate_dtype: str = "bf16"  # with emulated:<gpu> devices: the modeled weights' and KV's precision
    restart_delay_s: float = 0.5  # first back-off before a dead worker is restarted (doubles)
    max_restart_delay_s: float = 30.0
    max_waiting_requests: int | None = None  # beyond it new requests get 429; None: one batch per worker
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request body gets 413
    # the router's own sampling of its workers' devices while a reader uses GET /v1/collect
    device_sample_interval_s: float = 0.1

    def model_config(self) -> ModelConfig:
        return model_config_for(self.model)

    @property
    def model_name(self) -> str:
        return self.served_model_name or (Path(self.model).name if Path(self.model).is_dir() else self.model)

    def roles(self) -> list[str]:
        if self.mode == "aggregated":
            return ["mixed"] * self.workers
        return ["prefill"] * self.prefill_workers + ["decode"] * self.decode_workers

    def worker_devices(self) -> list[str]:
        """One device spec per worker: a list is taken in order; one `cuda` spreads over cuda:0..N-1."""
        n = len(self.roles())
        if len(self.devices) == 1:
            spec = parse_device_spec(self.devices[0])
            if spec.kind == "cuda" and self.devices[0].strip().lower() == "cuda":
                return [f"cuda:{i}" for i in range(n)]
            return [str(spec)] * n
        if len(self.devices) != n:
            raise ConfigError(
                f"{len(self.devices)} devices given for {n} workers; give one device or exactly {n}"
            )
        return [str(parse_device_spec(d)) for d in self.devices]

    def validate(self) -> None:
        """Raise ConfigError / DeviceError with a one-line message before anything is started."""
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; allowed: {', '.join(MODES)}")
        counts = (
            {"workers": self.workers}
            if self.mode == "aggregated"
            else {"prefill workers": self.prefill_workers, "decode workers": self.decode_workers}
        )
        for what, n in counts.items():
            if n < 1:
                raise ConfigError(f"number of {what} must be >= 1, got {n}")
        if not (math.isfinite(self.restart_delay_s) and self.restart_delay_s > 0):
            raise ConfigError(f"restart delay must be a number of seconds > 0, got {self.restart_delay_s}")
        if not (math.isfinite(self.max_restart_delay_s) and self.max_restart_delay_s >= self.restart_delay_s):
            raise ConfigError(
                f"max restart delay must be >= the restart delay ({self.restart_delay_s} s), "
                f"got {self.max_restart_delay_s}"
            )
        if self.max_waiting_requests is not None and self.max_waiting_requests < 1:
            raise ConfigError(f"max waiting requests must be >= 1, got {self.max_waiting_requests}")
        if not (math.isfinite(self.device_sample_interval_s) and 0.01 <= self.device_sample_interval_s <= 10):
            raise ConfigError(
                "--device-sample-interval-s must be a number of seconds in [0.01, 10], "
                f"got {self.device_sample_interval_s:g}"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError(f"max request body must be at least 1 KiB, got {self.max_body_bytes} bytes")
        self.model_config()
        devices = self.worker_devices()
        if self.emulate_shape is not None:
            model_config_for(self.emulate_shape)
            if not all(d.startswith("emulated:") for d in devices):
                raise ConfigError("--emulate-shape needs emulated devices (--device emulated:<gpu>)")
        if self.emulate_dtype != "bf16":
            if not all(d.startswith("emulated:") for d in devices):
                raise ConfigError(
                    f"--emulate-dtype {self.emulate_dtype} needs emulated devices (--device emulated:<gpu>)"
                )
            from serving.devices.emulated_label import emulation_fidelity
            from serving.devices.errors import DeviceValueError

            for d in dict.fromkeys(devices):
                try:
                    emulation_fidelity(d.split(":", 1)[1], self.emulate_dtype)
                except DeviceValueError as e:
                    raise ConfigError(f"--emulate-dtype {self.emulate_dtype} on {d}: {e}") from e
        check_devices_available(devices)

    def worker_specs(self) -> list[tuple[str, WorkerSpec]]:
        roles, devices = self.roles(), self.worker_devices()
        threads = self.threads_per_worker or max(1, (os.cpu_count() or 1) // len(roles))
        return [
            (
                role,
                WorkerSpec(
                    worker_id=f"worker-{i}",
                    device=dev,
                    model=self.model,
                    dtype=self.dtype,
                    seed=self.seed,
                    engine=self.engine,
                    threads=threads,
                    emulate_shape=self.emulate_shape,
                    emulate_dtype=self.emulate_dtype,
                ),
            )
            for i, (role, dev) in enumerate(zip(roles, devices, strict=True))
        ]

    def resolve_token(self) -> str:
        """The control-API bearer token: given, from PHASELENS_CONTROL_TOKEN, or generated."""
        if not self.control_token:
            self.control_token = os.environ.get("PHASELENS_CONTROL_TOKEN") or secrets.token_urlsafe(24)
        return self.control_token
