"""Deployment layouts the simulator runs: GPU type, pools (role, replicas, TP, knobs) and links.

A layout is written as one string, ``MODE:GPU[:OPTION...]``:

* ``agg:8xh100-sxm:tp2`` — aggregated: 8 H100s, each replica (engine) on 2 of them (4 replicas);
* ``3p1d:h100-sxm:tp2`` — disaggregated: 3 prefill and 1 decode replica of TP 2 (8 GPUs);
* options, each ``KEY=VALUE`` (for every pool) or ``ROLE.KEY=VALUE`` (``prefill.``, ``decode.`` or
  ``mixed.``): ``tp``, ``power_limit_w``, ``sm_clock_mhz`` (``LOW-HIGH``), ``max_num_seqs``,
  ``max_num_batched_tokens``, ``chunked_prefill`` (``on``/``off``), ``kv_blocks`` (KV blocks of 16
  tokens per replica, instead of what the GPU memory holds); layout-wide ``kv_link`` (the
  hand-off link between pools), ``tp_link`` (the link of a replica's all-reduces), ``profile``
  (the engine profile of the GPU model), ``gpu_memory_utilization``, ``dtype`` (``bf16`` or ``fp8``
  weights and KV; fp8 figures, and every figure on a GPU the model was not validated on, are
  unvalidated: ``serving.devices.gpu_specs.fidelity``); ``tpN`` is short for ``tp=N``.

:func:`parse_layout` turns the string into a :class:`Layout`; :func:`check_layout` refuses, before
anything runs, a layout the model does not fit, a TP that does not divide the model's heads, an
unknown GPU or link, or knobs outside the GPU's bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from serving.config import ConfigError, ModelConfig
from serving.devices.errors import DeviceValueError
from serving.devices.gpu_model import LINKS, PROFILES, kv_capacity_tokens, shard_shape
from serving.devices.gpu_specs import DTYPES, GPU_SPECS, gpu_spec

ROLES = ("mixed", "prefill", "decode")
_POOL_KEYS = (
    "tp",
    "power_limit_w",
    "sm_clock_mhz",
    "max_num_seqs",
    "max_num_batched_tokens",
    "chunked_prefill",
    "kv_blocks",
)
_LAYOUT_KEYS = ("kv_link", "tp_link", "profile", "gpu_memory_utilization", "dtype")


class LayoutError(ConfigError):
    """A layout string or a layout that cannot run (the message names what and what is allowed)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One role's replicas: each replica is one engine on ``tp`` GPUs, with these knobs."""

    role: str  # mixed | prefill | decode
    replicas: int
    tp: int = 1
    power_limit_w: float | None = None  # None: the GPU's default (TDP)
    sm_clock_mhz: tuple[int, int] | None = None  # a locked SM clock range
    max_num_seqs: int = 256  # vLLM's defaults
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    kv_blocks: int | None = None  # KV blocks per replica; None: what the GPU memory holds

    @property
    def gpus(self) -> int:
        return self.replicas * self.tp


@dataclass(frozen=True, slots=True)
class Layout:
    """A serving deployment: which GPUs, split into which pools, linked how."""

    gpu: str  # a key of serving.devices.GPU_SPECS
    pools: tuple[PoolSpec, ...]
    kv_link: str = "infiniband"  # prefill -> decode hand-off, between nodes by default
    tp_link: str = "nvlink"
    profile: str | None = None  # None: the GPU model's default engine profile
    gpu_memory_utilization: float = 0.9
    name: str = ""
    dtype: str = "bf16"  # weights and KV: bf16 | fp8

    @property
    def mode(self) -> str:
        return "aggregated" if all(p.role == "mixed" for p in self.pools) else "disaggregated"

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def pool(self, role: str) -> PoolSpec | None:
        return next((p for p in self.pools if p.role == role), None)

    def describe(self) -> dict[str, Any]:
        """The layout as JSON-able values (stored with a scenario)."""
        return {
            "name": self.name,
            "mode": self.mode,
            "gpu": self.gpu,
            "gpus": self.gpus,
            "kv_link": self.kv_link,
            "tp_link": self.tp_link,
            "profile": self.profile,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "dtype": self.dtype,
            "pools": [
                {
                    "role": p.role,
                    "replicas": p.replicas,
                    "tp": p.tp,
                    "power_limit_w": p.power_limit_w,
                    "sm_clock_mhz": list(p.sm_clock_mhz) if p.sm_clock_mhz else None,
                    "max_num_seqs": p.max_num_seqs,
                    "max_num_batched_tokens": p.max_num_batched_tokens,
                    "chunked_prefill": p.chunked_prefill,
                    "kv_blocks": p.kv_blocks,
                }
                for p in self.pools
            ],
        }


_AGG = re.compile(r"^(?:agg|aggregated)$", re.I)
_XPYD = re.compile(r"^(\d+)p(\d+)d$", re.I)
_COUNT_GPU = re.compile(r"^(\d+)x(.+)$", re.I)
_TP_SHORT = re.compile(r"^tp(\d+)$", re.I)

SYNTAX = (
    "MODE:GPU[:OPTION...], e.g. agg:8xh100-sxm:tp2 or 3p1d:h100-sxm:tp2:decode.power_limit_w=450 "
    "(MODE agg|XpYd; GPU for agg is NxGPU)"
)


def parse_layout(text: str) -> Layout:
    """Parse a layout string (module docstring); LayoutError names the bad part and the syntax."""
    name, _, spec = text.partition("=") if "=" in text.split(":", 1)[0] else ("", "", text)
    parts = [p.strip() for p in spec.strip().split(":")]
    if len(parts) < 2 or not all(parts):
        raise LayoutError(f"layout {text!r}: expected {SYNTAX}")
    mode, gpu_part, options = parts[0], parts[1], parts[2:]
    if _AGG.match(mode):
        m = _COUNT_GPU.match(gpu_part)
        if not m:
            raise LayoutError(
                f"layout {text!r}: an aggregated layout gives NxGPU (e.g. 8xh100-sxm), got {gpu_part!r}"
            )
        count, gpu = int(m.group(1)), m.group(2).lower()
        roles = {"mixed": count}  # GPUs, divided by tp below
    elif m := _XPYD.match(mode):
        gpu = gpu_part.lower()
        roles = {"prefill": int(m.group(1)), "decode": int(m.group(2))}  # replicas
    else:
        raise LayoutError(
            f"layout {text!r}: mode {mode!r} is neither agg nor XpYd (e.g. 3p1d); expected {SYNTAX}"
        )
    if gpu not in GPU_SPECS:
        raise LayoutError(f"layout {text!r}: unknown GPU {gpu!r}; allowed: {', '.join(GPU_SPECS)}")
    pool_opts: dict[str, dict[str, Any]] = {r: {} for r in roles}
    layout_opts: dict[str, Any] = {}
    for opt in options:
        if m := _TP_SHORT.match(opt):
            key, value, targets = "tp", m.group(1), list(roles)
        else:
            key, eq, value = opt.partition("=")
            if not eq:
                raise LayoutError(f"layout {text!r}: option {opt!r} is not KEY=VALUE or tpN")
            role, dot, key = key.rpartition(".")
            if dot and role not in roles:
                raise LayoutError(
                    f"layout {text!r}: option {opt!r} names role {role!r}; this layout has {', '.join(roles)}"
                )
            targets = [role] if dot else list(roles)
        if key in _LAYOUT_KEYS and len(targets) == len(roles):
            layout_opts[key] = _layout_value(text, key, value)
        elif key in _POOL_KEYS:
            for r in targets:
                pool_opts[r][key] = _pool_value(text, key, value)
        else:
            raise LayoutError(
                f"layout {text!r}: unknown option {key!r}; allowed: {', '.join(_POOL_KEYS + _LAYOUT_KEYS)}"
            )
    pools = []
    for role, n in roles.items():
        opts = pool_opts[role]
        tp = opts.get("tp", 1)
        if role == "mixed":
            if n % tp:
                raise LayoutError(f"layout {text!r}: {n} GPUs do not split into replicas of tp {tp}")
            n //= tp
        if n < 1:
            raise LayoutError(f"layout {text!r}: the {role} pool needs at least one replica")
        pools.append(PoolSpec(role=role, replicas=n, **opts))
    return Layout(gpu=gpu, pools=tuple(pools), name=name.strip() or spec.strip(), **layout_opts)


def _pool_value(text: str, key: str, value: str) -> Any:
    try:
        if key == "sm_clock_mhz":
            low, _, high = value.partition("-")
            return (int(low), int(high or low))
        if key == "chunked_prefill":
            if value.lower() not in ("on", "off", "true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("on", "true", "1")
        if key == "power_limit_w":
            return float(value)
        number = int(value)
    except ValueError:
        raise LayoutError(f"layout {text!r}: {key}={value!r} is not a valid value") from None
    if number < 1:
        raise LayoutError(f"layout {text!r}: {key} must be >= 1, got {number}")
    return number


def _layout_value(text: str, key: str, value: str) -> Any:
    if key in ("kv_link", "tp_link"):
        if value not in LINKS:
            raise LayoutError(f"layout {text!r}: unknown link {value!r}; allowed: {', '.join(LINKS)}")
        return value
    if key == "dtype":
        if value not in DTYPES:
            raise LayoutError(f"layout {text!r}: unknown dtype {value!r}; allowed: {', '.join(DTYPES)}")
        return value
    if key == "profile":
        if value not in PROFILES:
            raise LayoutError(
                f"layout {text!r}: unknown engine profile {value!r}; allowed: {', '.join(PROFILES)}"
            )
        return value
    try:
        fraction = float(value)
    except ValueError:
        raise LayoutError(f"layout {text!r}: {key}={value!r} is not a number") from None
    if not 0.1 <= fraction <= 1.0:
        raise LayoutError(f"layout {text!r}: {key} must be in [0.1, 1], got {fraction:g}")
    return fraction


def check_layout(layout: Layout, shape: ModelConfig) -> dict[str, int]:
    """Refuse a layout that cannot run ``shape``; return the KV-cache tokens per replica, by role.

    Checks, naming what is wrong: TP divides the model's heads (``shard_shape``), the shard's weights
    fit the GPU with room for KV (``kv_capacity_tokens``), power limits and clock ranges lie within
    the GPU's bounds.
    """
    spec = gpu_spec(layout.gpu)
    capacity: dict[str, int] = {}
    for pool in layout.pools:
        where = f"{layout.name or layout.gpu} {pool.role} pool"
        try:
            shard_shape(shape, pool.tp)
            tokens = kv_capacity_tokens(
                spec,
                shape,
                tp=pool.tp,
                gpu_memory_utilization=layout.gpu_memory_utilization,
                dtype=layout.dtype,
            )
        except DeviceValueError as e:
            raise LayoutError(f"{where}: {e}") from e
        if pool.power_limit_w is not None and not spec.min_power_limit_w <= pool.power_limit_w <= spec.tdp_w:
            raise LayoutError(
                f"{where}: power_limit_w {pool.power_limit_w:g} W is outside "
                f"[{spec.min_power_limit_w:g}, {spec.tdp_w:g}] W for {spec.name}"
            )
        if pool.sm_clock_mhz is not None:
            low, high = pool.sm_clock_mhz
            if not spec.min_sm_clock_mhz <= low <= high <= spec.max_sm_clock_mhz:
                raise LayoutError(
                    f"{where}: sm_clock_mhz {low}-{high} is not a range within "
                    f"[{spec.min_sm_clock_mhz}, {spec.max_sm_clock_mhz}] MHz for {spec.name}"
                )
        if layout.dtype == "fp8" and spec.fp8_tflops is None:
            raise LayoutError(f"{where}: {spec.name} has no FP8 tensor cores; allowed dtype: bf16")
        capacity[pool.role] = tokens  # every TP rank holds its heads' share of the same tokens
    return capacity
