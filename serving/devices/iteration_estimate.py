"""What the GPU model (:mod:`serving.devices.gpu_model`, which re-exports it) says of one iteration:
:class:`IterationEstimate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Bound = Literal["compute", "memory", "overhead", "comm"]


@dataclass(frozen=True, slots=True)
class IterationEstimate:
    """The modeled execution of one iteration.

    ``time_s = host_s + busy_s`` is the iteration's wall duration: ``host_s`` of host time with the
    GPU idle, then ``busy_s`` of GPU work (kernels, fixed overhead and the tensor-parallel
    all-reduces, ``comm_s`` of it). ``compute_s`` and ``memory_s`` are the summed compute and memory
    roofline terms at the chosen clock. ``power_w`` is the mean power while busy; the activities
    (``sm_active``, ``dram_active``, ``tensor_active``, ``sm_occupancy``) are fractions (0-1) of
    ``busy_s``, and so is ``bound``'s meaning. Energy: :attr:`busy_energy_j` = ``power_w * busy_s``;
    :attr:`host_energy_j` = the gap model's energy of the host gap right after a busy interval;
    :attr:`energy_j` = both (back-to-back iterations).
    """

    time_s: float
    power_w: float
    sm_clock_mhz: int
    compute_s: float
    memory_s: float
    sm_active: float
    dram_active: float
    bound: Bound
    tensor_active: float = 0.0
    sm_occupancy: float = 0.0
    power_capped: bool = False  # the power limit held the SM clock below the allowed maximum
    flops: float = 0.0
    hbm_bytes: float = 0.0
    host_s: float = 0.0
    busy_s: float = 0.0
    comm_s: float = 0.0
    host_energy_j: float = 0.0
    tp: int = 1
    # the roofline (serving/devices/roofline.py): flops and hbm_bytes are the work's count on this
    # rank (no tile padding or re-reads); the peaks are the GPU's dense tensor FLOP/s of the dtype
    # and its HBM bytes/s; validated False: a GPU or dtype no measurement checked the model on
    peak_flops_s: float = 0.0
    peak_bytes_s: float = 0.0
    dtype: str = "bf16"
    validated: bool = True
    # what the modeled kernels execute: GEMM tiles padded, KV re-read per query head by a GQA-unaware
    # engine, the small kernels' activation passes (dram_active is executed_bytes over busy_s)
    executed_flops: float = 0.0
    executed_bytes: float = 0.0

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation of the busy time: ``flops / (busy_s * peak_flops_s)``."""
        if self.busy_s <= 0 or self.peak_flops_s <= 0:
            return None
        return self.flops / (self.busy_s * self.peak_flops_s)

    @property
    def mbu(self) -> float | None:
        """Memory-bandwidth utilisation of the busy time: ``hbm_bytes / (busy_s * peak_bytes_s)``."""
        if self.busy_s <= 0 or self.peak_bytes_s <= 0:
            return None
        return self.hbm_bytes / (self.busy_s * self.peak_bytes_s)

    @property
    def busy_energy_j(self) -> float:
        """Energy of the GPU-busy part: ``power_w * busy_s``."""
        return self.power_w * self.busy_s

    @property
    def energy_j(self) -> float:
        """Energy of the whole iteration: busy energy plus the host gap's (gap-power model)."""
        return self.power_w * self.busy_s + self.host_energy_j

    @property
    def mean_power_w(self) -> float:
        """Mean power over the whole iteration (host gap included)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0
