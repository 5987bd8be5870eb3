"""A recommendation's question read from a stored window: the trace (the window's observed
requests, or for an external fleet a trace synthesized from its engine histograms), the current
layout, the model and what the recommendation is for (``target``).

* a simulated scenario: its own ``scenarios`` row (the layout it ran, its model); target
  ``scenario:<id>``;
* live data of the bundled stack: the workers the ``devices`` table shows at the window's end (each
  worker one GPU, TP 1; its ``role``; the GPU type from the device spec ``emulated:<gpu>`` or the
  NVML name), the engine settings ``phaselens serve`` runs with (``serving.sim.live_compare``'s
  ``ENGINE_OPTIONS``) and the KV blocks its iterations report; target ``stack:<router URL>``, the
  serving endpoint the collector polled (``telemetry_batches.endpoint``).

The application layer (``phaselens/recommend_window.py``) composes this with the workload read and
the stores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from analytics.recommend.inputs import fits
from analytics.window import AnalyticsError, Window
from analytics.workload.model import REQUESTS, Workload
from serving.config import ConfigError, model_config_for
from serving.devices.gpu_specs import GPU_SPECS
from serving.sim.layout import Layout, PoolSpec, parse_layout
from serving.trace import TraceRequest

#: the last seconds of a live window whose sampled GPUs are the current layout's
CURRENT_SPAN_S = 30.0
#: gpu_memory_utilization values tried for a TP-1 worker (0.96 lets 70B fit one H200, as the live stack runs it)
_UTILIZATIONS = (0.9, 0.96)


@dataclass(slots=True)
class WindowTrace:
    """The trace a window gives and how it was made."""

    trace: list[TraceRequest]
    desc: str
    trust: str  # the trace's own label: measured / simulated (observed), estimated (synthesized)
    synthesized: bool


def window_trace(con: duckdb.DuckDBPyConnection, window: Window, observed: Workload) -> WindowTrace:
    """The window's requests themselves (``analytics.workload.requests_trace``) when ``observed``
    came from request rows; else (an external fleet: engine histograms, no single request seen) a
    trace synthesized from the observed workload over the window's span (seed 0), labelled
    ``estimated``."""
    from analytics.workload import requests_trace, synthesize_trace

    if observed.source == REQUESTS:
        trace = requests_trace(con, window)
        label = "simulated" if window.simulated else "measured"
        return WindowTrace(
            trace, f"the {len(trace):,} requests observed in {window.label()}", label, synthesized=False
        )
    trace = synthesize_trace(observed, duration_s=observed.duration_s, seed=0)
    return WindowTrace(
        trace,
        f"{len(trace):,} requests synthesized from the engine histograms of {window.label()} "
        "(estimated: arrivals and lengths drawn from the observed workload, no single request seen)",
        "estimated",
        synthesized=True,
    )


def scenario_row(con: duckdb.DuckDBPyConnection, window: Window) -> dict[str, Any] | None:
    """The ``scenarios`` row of a scenario window (model, layout), None for live data."""
    if not window.simulated:
        return None
    row = con.execute(
        "SELECT model, layout FROM scenarios WHERE scenario_id = ?", [window.dataset]
    ).fetchone()
    if row is None:
        return None
    layout = json.loads(row[1]) if isinstance(row[1], str) else row[1]
    return {"model": row[0], "layout": layout}


def layout_from_describe(d: dict[str, Any]) -> str:
    """The layout string of a ``Layout.describe()`` (as a scenario stores it): the options that
    differ from the defaults, written so that it parses back to the same layout."""
    pools = {p["role"]: p for p in d["pools"]}
    gpu = d["gpu"]
    if set(pools) == {"mixed"}:
        m = pools["mixed"]
        head, prefix = f"agg:{m['replicas'] * m['tp']}x{gpu}", {"mixed": ""}
    elif set(pools) == {"prefill", "decode"}:
        head = f"{pools['prefill']['replicas']}p{pools['decode']['replicas']}d:{gpu}"
        prefix = {"prefill": "prefill.", "decode": "decode."}
    else:
        raise AnalyticsError(f"a layout of pools {', '.join(pools)} cannot be written as one layout string")
    opts: list[str] = []
    base = PoolSpec(role="mixed", replicas=1)
    for role, p in pools.items():
        for key in ("tp", "power_limit_w", "sm_clock_mhz", "max_num_seqs", "max_num_batched_tokens",
                    "chunked_prefill", "kv_blocks"):  # fmt: skip
            value = p.get(key)
            default = getattr(base, key)
            if key == "sm_clock_mhz" and value is not None:
                value, default = tuple(value), default
            if value is None or value == default:
                continue
            if key == "sm_clock_mhz":
                text = f"{value[0]}-{value[1]}"
            elif key == "chunked_prefill":
                text = "on" if value else "off"
            else:
                text = f"{value:g}" if isinstance(value, float) else str(value)
            opts.append(f"{prefix[role]}{key}={text}")
    blank = Layout(gpu=gpu, pools=())
    for key in ("kv_link", "tp_link", "profile", "gpu_memory_utilization"):
        value = d.get(key)
        if value is not None and value != getattr(blank, key):
            opts.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
    text = ":".join([head, *opts])
    want = {k: v for k, v in d.items() if k != "name"}
    got = {k: v for k, v in parse_layout(text).describe().items() if k != "name"}
    if got != want:
        raise AnalyticsError(f"the stored layout cannot be written back as a layout string ({text!r})")
    return text


_OWNERS_SQL = """
WITH last AS (SELECT max(ts_s) AS t FROM gpu_samples WHERE {nodes} AND ts_s >= ? AND ts_s < ?),
seen AS (
    SELECT DISTINCT node, source, device, "index" FROM gpu_samples, last
    WHERE {nodes} AND ts_s >= greatest(?, last.t - ?) AND ts_s <= last.t
)
SELECT d.node, d.device, d.name, d.worker, d.role FROM devices d SEMI JOIN seen s
  ON d.node = s.node AND d.source = s.source AND d.device = s.device AND d."index" IS NOT DISTINCT FROM s."index"
WHERE {dnodes} AND d.since_s < ?
QUALIFY row_number() OVER (PARTITION BY d.node, d.source, d.device, d."index" ORDER BY d.since_s DESC) = 1
"""


def gpu_of(device: str, name: str | None) -> str | None:
    """The ``GPU_SPECS`` key of a device: ``emulated:<gpu>``'s own, else the spec whose NVML name
    the device's name carries."""
    if device.startswith("emulated:"):
        key = device.split(":", 1)[1].lower()
        return key if key in GPU_SPECS else None
    for key, spec in GPU_SPECS.items():
        if name and spec.name.lower() in name.lower():
            return key
    return None


def live_layout(con: duckdb.DuckDBPyConnection, window: Window, model: str) -> tuple[str, str]:
    """The bundled stack's layout at the end of a live window, and a sentence saying how it was
    derived (module docstring); AnalyticsError naming what is missing (then give --layout)."""
    from serving.sim.live_compare import ENGINE_OPTIONS

    nodes, params = window.node_sql("d.node")
    snodes, sparams = window.node_sql("node")
    sql = _OWNERS_SQL.format(nodes=snodes, dnodes=nodes)
    rows = con.execute(
        sql,
        [
            *sparams,
            window.start_s,
            window.end_s,
            *sparams,
            window.start_s,
            CURRENT_SPAN_S,
            *params,
            window.end_s,
        ],
    ).fetchall()
    owned = [r for r in rows if r[3] is not None and r[4] is not None]
    if not owned:
        raise AnalyticsError(
            f"no GPU sampled in the last {CURRENT_SPAN_S:g} s of the window ({window.label()}) belongs to a serving "
            "worker with a role (the bundled stack's devices carry their worker and role): the current layout "
            "cannot be read from the store; give it with --layout",
            "layout",
        )
    gpus = {gpu_of(r[1], r[2]) for r in owned}
    if None in gpus or len(gpus) != 1:
        names = sorted({f"{r[1]} ({r[2]})" for r in owned})
        raise AnalyticsError(
            f"the workers' GPUs are {', '.join(names)}: not one known GPU type (allowed: {', '.join(GPU_SPECS)}); "
            "give the current layout with --layout",
            "layout",
        )
    gpu = gpus.pop()
    roles = {role: sum(1 for r in owned if r[4] == role) for role in ("mixed", "prefill", "decode")}
    if roles["mixed"] and (roles["prefill"] or roles["decode"]):
        raise AnalyticsError(
            f"the stack has mixed and split workers at once ({roles}): no single layout string says that; "
            "give the current layout with --layout",
            "layout",
        )
    if roles["mixed"]:
        head = f"agg:{roles['mixed']}x{gpu}"
    elif roles["prefill"] and roles["decode"]:
        head = f"{roles['prefill']}p{roles['decode']}d:{gpu}"
    else:
        raise AnalyticsError(f"the stack's workers cannot serve as a layout: {roles}", "layout")
    kv = con.execute(
        f"SELECT max(kv_blocks_total) FROM iterations WHERE {snodes} AND start_s >= ? AND start_s < ?",
        [*sparams, window.start_s, window.end_s],
    ).fetchone()[0]
    try:
        shape = model_config_for(model)
    except ConfigError as e:
        raise AnalyticsError(str(e), "model") from e
    util = next((u for u in _UTILIZATIONS if fits(shape, gpu, 1, u)), None)
    if util is None:
        raise AnalyticsError(
            f"{shape.name} does not fit one {gpu} (TP 1, as each bundled-stack worker runs): wrong --model?",
            "model",
        )
    options = [ENGINE_OPTIONS, *([f"kv_blocks={int(kv)}"] if kv else []), f"gpu_memory_utilization={util:g}"]
    text = ":".join([head, *options])
    how = (
        f"{len(owned)} worker(s) by their role in the devices table at the window's end "
        f"({', '.join(f'{n} {r}' for r, n in roles.items() if n)}), one {gpu} GPU each (TP 1; the GPU from the "
        f"device spec / name), phaselens serve's engine settings ({ENGINE_OPTIONS}), "
        + (
            f"{int(kv)} KV blocks from the iterations"
            if kv
            else "KV blocks from the GPU memory (no iterations)"
        )
    )
    return text, how


def stack_target(con: duckdb.DuckDBPyConnection, window: Window) -> str | None:
    """``stack:<URL>`` of the one serving endpoint the collector polled over a live window, or None."""
    nodes, params = window.node_sql("node")
    rows = con.execute(
        f"SELECT DISTINCT endpoint FROM telemetry_batches WHERE {nodes} AND endpoint IS NOT NULL "
        "AND received_s >= ? AND received_s < ?",
        [*params, window.start_s, window.end_s],
    ).fetchall()
    urls = sorted({str(r[0]).rstrip("/") for r in rows})
    return f"stack:{urls[0]}" if len(urls) == 1 else None


@dataclass(slots=True)
class DispatchDelay:
    """The front end's dispatch delay a window's simulations add to each arrival (``Simulation``
    ``dispatch_delay_s``): measured on a live stack window, 0 for a scenario or an external fleet."""

    delay_s: float
    requests: int  # the requests it is the median of (those that found their worker idle)
    scheduled: int  # the window's scheduled requests looked at
    how: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "delay_s": self.delay_s,
            "requests": self.requests,
            "of_requests": self.scheduled,
            "how": self.how,
        }


def window_dispatch_delay(
    con: duckdb.DuckDBPyConnection, window: Window, *, synthesized: bool = False
) -> DispatchDelay:
    """The live front end's dispatch delay (router HTTP handling, tokenization, pipe to the worker)
    over ``window``: ``serving.sim.device_model.measured_dispatch_delay_s`` on the window's
    ``requests`` rows and its workers' ``iterations``. A scenario (its simulation has no front end)
    or an external fleet (no per-request rows): 0, said so."""
    from analytics.workload import dispatch_rows
    from serving.sim.device_model import dispatch_delays_s

    if window.simulated:
        return DispatchDelay(0.0, 0, 0, "none: a simulated scenario (its simulation has no front end)")
    if synthesized:
        return DispatchDelay(
            0.0, 0, 0, "none: an external fleet's engine histograms carry no per-request scheduling times"
        )
    requests = dispatch_rows(con, window)
    nodes, params = window.node_sql("node")
    # iterations from a little before the window: one running at its first arrival makes that worker busy
    iterations = (
        con.execute(
            f"SELECT node || '/' || worker AS worker, start_s, end_s FROM iterations "
            f"WHERE {nodes} AND end_s >= ? AND start_s < ?",
            [*params, window.start_s, window.end_s],
        )
        .df()
        .to_dict("records")
    )
    delays = sorted(dispatch_delays_s(requests, iterations))
    if not delays:
        return DispatchDelay(
            0.0,
            0,
            len(requests),
            f"none measured: of the window's {len(requests)} scheduled requests none found its worker idle "
            "(or the window holds no iterations)",
        )
    delay = float(np.median(delays))
    return DispatchDelay(
        delay,
        len(delays),
        len(requests),
        f"the median wait from arrival to first scheduling of the {len(delays)} of "
        f"{len(requests)} requests that found their worker idle (the router's HTTP handling, tokenization and "
        "pipe to the worker), added to every arrival of the simulations",
    )
