"""A simulation's state objects: its GPUs, replicas (each the shared engine step on the GPU model),
requests and result (:mod:`serving.sim.simulator` runs them)."""

from __future__ import annotations

import functools
from array import array
from dataclasses import dataclass, field
from typing import Any

from serving.block_manager import BlockManager
from serving.config import EngineConfig, ModelConfig
from serving.engine_core import DecodeRun, EngineCore
from serving.scheduler import Scheduler
from serving.sim.executor import GpuModelExecutor
from serving.sim.layout import Layout, PoolSpec
from serving.sim.records import Busy, RequestStats


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One simulated GPU: its index in the layout and its UUID."""

    index: int
    uuid: str


class Replica:
    """One engine (a worker) of the deployment on ``tp`` GPUs, in virtual time: the live engine's
    step (:class:`~serving.engine_core.EngineCore`) with the GPU model as its executor."""

    __slots__ = (
        "blocks",
        "busy",
        "core",
        "engine_cfg",
        "gpus",
        "id",
        "inflight",
        "intervals",
        "iterations",
        "pool",
        "run",
        "works",
    )

    def __init__(self, wid: str, pool: PoolSpec, gpus: list[SimGpu], engine_cfg: EngineConfig) -> None:
        self.id = wid
        self.pool = pool
        self.gpus = gpus
        self.engine_cfg = engine_cfg
        self.core: ReplicaEngine | None = None  # set by the Simulation
        self.blocks: BlockManager | None = None  # its scheduler's, set with it (read per arrival)
        self.inflight: set[str] = set()
        self.busy = False
        self.intervals = Busy()
        self.iterations = 0
        self.works: list[Any] | None = None  # each iteration's tally, when the run records them
        self.run: DecodeRun | None = None  # the decode run it is in, until committed

    @property
    def role(self) -> str:
        return self.pool.role

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    @property
    def load(self) -> tuple[int, float]:
        """Requests in flight and KV use (outside a decode run: the simulation's routing reads a
        run's use at the arrival, ``Simulation._load``)."""
        return len(self.inflight), self.core.scheduler.blocks.usage

    def has_work(self) -> bool:
        return self.core.has_work()


class ReplicaEngine(EngineCore):
    """A replica's engine: the shared step; each token goes to the simulation's request state."""

    _collects_outputs = False

    def __init__(self, sim: Any, replica: Replica, executor: GpuModelExecutor, device: str) -> None:
        """``sim``: the :class:`~serving.sim.simulator.Simulation` the replica is part of."""
        super().__init__(
            replica.engine_cfg,
            executor,
            worker_id=replica.id,
            device=device,
            gpus=[(g.uuid, g.index) for g in replica.gpus],
            stop_token_ids=sim.shape.eos_token_ids,
            time_offset_s=sim.start_s,
        )
        # each token straight to the simulation (an instance attribute: one call per token, the hot path)
        self._on_token = functools.partial(sim._token, replica)


@dataclass(slots=True)
class SimRequest:
    """A request's state in a simulation: where it runs and its timings (virtual s)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefill: Replica | None = None
    decode: Replica | None = None
    first_scheduled_s: float | None = None
    prefill_start_s: float | None = None
    prefill_end_s: float | None = None
    kv_transfer_start_s: float | None = None
    kv_transfer_end_s: float | None = None
    kv_transfer_bytes: int | None = None
    # every token's time (virtual s), packed: read once at the end as an array, not as float objects
    # scattered over the run's memory
    token_ts: array = field(default_factory=lambda: array("d"))
    preemptions: int = 0


@dataclass(slots=True)
class SimResult:
    """What a simulation produced; times are UTC epoch seconds of the virtual clock."""

    layout: Layout
    shape: ModelConfig
    start_s: float
    end_s: float
    batches: list[dict[str, Any]]  # empty when the run streamed them to ``on_batch``
    replicas: list[Replica]
    requests: int
    finished: int
    failed: int
    iterations: int
    wall_s: float
    gpu_name: str
    events: int = 0
    stats: RequestStats = field(default_factory=RequestStats)
    batches_emitted: int = 0
    run_iterations: int = 0  # iterations taken in decode runs (of ``iterations``)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def gpus(self) -> list[tuple[Replica, SimGpu]]:
        return [(r, g) for r in self.replicas for g in r.gpus]
