"""The serving stack in virtual time (``phaselens simulate``): layouts, the discrete-event
simulation, device samples derived from its GPU counters, and a summary of each run."""

from serving.sim.layout import Layout, LayoutError, PoolSpec, check_layout, parse_layout
from serving.sim.simulator import SimResult, Simulation, SimulationError
from serving.sim.summary import SimSummary, SloSpec, format_table, summarize

__all__ = [
    "Layout",
    "LayoutError",
    "PoolSpec",
    "SimResult",
    "SimSummary",
    "Simulation",
    "SimulationError",
    "SloSpec",
    "check_layout",
    "format_table",
    "parse_layout",
    "summarize",
]
