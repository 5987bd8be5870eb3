"""What a layout recommendation is asked for, checked before anything runs.

:class:`RecommendInputs` holds the trace (``serving.trace.TraceRequest``s, arrival seconds from 0),
the model shape, the current layout (a ``serving.sim.layout`` string), the SLOs and the GPU budget;
:meth:`RecommendInputs.check` refuses, with a :class:`RecommendError` naming the value and what is
allowed, an unknown model or GPU, a current layout that cannot run, an SLO <= 0, an attainment target
outside (0, 1], a budget too small for the model, or a trace too short to search on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from analytics.prices import PriceTable, load_prices
from analytics.window import AnalyticsError
from serving.config import ConfigError, ModelConfig, model_config_for
from serving.devices.gpu_specs import GPU_SPECS
from serving.sim.layout import Layout, LayoutError, check_layout, parse_layout
from serving.trace import TraceRequest

#: tensor-parallel degrees the search tries (each must divide the model's heads and fit the GPU)
TP_DEGREES = (1, 2, 4, 8)
#: at most this many requests in a trace (an hour of a busy fleet is ~20 k; a day of the Azure trace 450 k)
MAX_REQUESTS = 500_000


class RecommendError(AnalyticsError):
    """A recommendation cannot be made as asked; the message names what and what is allowed."""


@dataclass(frozen=True, slots=True)
class SloTarget:
    """The SLOs a layout must meet: TTFT and TPOT (seconds, on the requests' percentiles through
    attainment: the share of all requests meeting both) and the attainment to hold."""

    ttft_s: float
    tpot_s: float
    target: float = 0.9

    def to_dict(self) -> dict[str, float]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "target": self.target}


@dataclass(slots=True)
class RecommendInputs:
    """One recommendation's inputs (stored with it in ``details.inputs``, so it can be re-run).

    ``gpu_budget``: the most GPUs a candidate may use (default: the current layout's); the search
    answers for that budget and for the least budget that meets the SLOs. ``allowed_gpus``: GPU types
    (``serving.devices.GPU_SPECS`` keys) a candidate may use (default: the current layout's).
    ``fleet_gpus``: the fleet the annual dollars are for (default: the current layout's GPUs).
    ``measured``: what was measured on the current layout over the same window
    (:func:`analytics.recommend.confidence.measured_figures`), or None.
    """

    trace: Sequence[TraceRequest]
    model: str
    current: str
    slo: SloTarget
    gpu_budget: int | None = None
    allowed_gpus: tuple[str, ...] = ()
    fleet_gpus: int | None = None
    prices: PriceTable = field(default_factory=load_prices)
    target: str = "scenario:trace"
    window: tuple[float, float] | None = None
    workload_id: str | None = None
    measured: dict[str, Any] | None = None
    trace_desc: str = ""
    #: the live front end's dispatch delay added to every arrival of every simulation (a stack window's, measured)
    dispatch_delay_s: float = 0.0

    # resolved by check()
    shape: ModelConfig | None = None
    current_layout: Layout | None = None

    def check(self) -> RecommendInputs:
        """Validate and resolve (shape, current layout, budget, GPUs); RecommendError when unusable."""
        try:
            self.shape = model_config_for(self.model)
        except ConfigError as e:
            raise RecommendError(str(e), "model") from e
        try:
            layout = parse_layout(self.current)
            check_layout(layout, self.shape)
        except (LayoutError, ConfigError) as e:
            raise RecommendError(f"current layout: {e}", "layout") from e
        self.current_layout = layout
        for name, value in (("TTFT", self.slo.ttft_s), ("TPOT", self.slo.tpot_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise RecommendError(f"the {name} SLO must be a number of seconds > 0, got {value!r}", "slo")
        if not (isinstance(self.slo.target, int | float) and 0 < self.slo.target <= 1):
            raise RecommendError(
                f"the attainment target must be in (0, 1], got {self.slo.target!r}", "slo_target"
            )
        self.allowed_gpus = tuple(g.lower() for g in self.allowed_gpus) or (layout.gpu,)
        unknown = [g for g in self.allowed_gpus if g not in GPU_SPECS]
        if unknown:
            raise RecommendError(
                f"unknown GPU {', '.join(unknown)}; allowed: {', '.join(GPU_SPECS)}", "allowed_gpus"
            )
        if self.gpu_budget is None:
            self.gpu_budget = layout.gpus
        if not isinstance(self.gpu_budget, int) or isinstance(self.gpu_budget, bool) or self.gpu_budget < 1:
            raise RecommendError(
                f"the GPU budget must be a whole number >= 1, got {self.gpu_budget!r}", "gpu_budget"
            )
        least = min_gpus(self.shape, self.allowed_gpus, layout.gpu_memory_utilization)
        if least is None or least > self.gpu_budget:
            need = (
                "no TP degree of " + "/".join(map(str, TP_DEGREES)) + " fits"
                if least is None
                else f"{least} GPUs"
            )
            raise RecommendError(
                f"a budget of {self.gpu_budget} GPU(s) is too small for {self.shape.name} on "
                f"{', '.join(self.allowed_gpus)}: one replica needs {need} (its bf16 weights and KV cache)",
                "gpu_budget",
            )
        if self.fleet_gpus is None:
            self.fleet_gpus = layout.gpus
        if not isinstance(self.fleet_gpus, int) or self.fleet_gpus < 1:
            raise RecommendError(
                f"fleet_gpus must be a whole number >= 1, got {self.fleet_gpus!r}", "fleet_gpus"
            )
        d = self.dispatch_delay_s
        if isinstance(d, bool) or not isinstance(d, int | float) or not (math.isfinite(d) and 0 <= d <= 60):
            raise RecommendError(
                f"the dispatch delay must be a number of seconds in [0, 60], got {d!r}", "dispatch_delay_s"
            )
        if len(self.trace) < 2:
            raise RecommendError(
                f"the trace has {len(self.trace)} request(s): at least 2 are needed", "trace"
            )
        if len(self.trace) > MAX_REQUESTS:
            raise RecommendError(
                f"the trace has {len(self.trace):,} requests: at most {MAX_REQUESTS:,} (take a window)",
                "trace",
            )
        if self.trace[-1].arrival_s - self.trace[0].arrival_s <= 0:
            raise RecommendError("every request of the trace arrives at once: no rate to scale", "trace")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The inputs as stored in ``details.inputs`` (the trace by its description and size)."""
        t0, t1 = self.window if self.window else (None, None)
        return {
            "slo": self.slo.to_dict(),
            "window": {"start_s": t0, "end_s": t1},
            "workload_id": self.workload_id,
            "gpu_budget": self.gpu_budget,
            "allowed_gpus": list(self.allowed_gpus),
            "model": self.model,
            "current": self.current,
            "fleet_gpus": self.fleet_gpus,
            "trace": {
                "desc": self.trace_desc,
                "requests": len(self.trace),
                "duration_s": self.trace[-1].arrival_s - self.trace[0].arrival_s if self.trace else 0.0,
            },
            "prices": {
                "gpu_usd_per_hour": dict(self.prices.gpu_usd_per_hour),
                "electricity_usd_per_kwh": self.prices.electricity_usd_per_kwh,
                "pue": self.prices.pue,
            },
            "measured_given": self.measured is not None,
            "dispatch_delay_s": self.dispatch_delay_s,
        }


def fits(shape: ModelConfig, gpu: str, tp: int, gpu_memory_utilization: float = 0.9) -> bool:
    """Whether one replica of ``shape`` at TP ``tp`` runs on ``gpu`` (``check_layout``'s rules)."""
    try:
        check_layout(
            parse_layout(f"agg:{tp}x{gpu}:tp{tp}:gpu_memory_utilization={gpu_memory_utilization:g}"), shape
        )
    except (LayoutError, ConfigError):
        return False
    return True


def tp_degrees(shape: ModelConfig, gpu: str, budget: int, gpu_memory_utilization: float = 0.9) -> list[int]:
    """The TP degrees of :data:`TP_DEGREES` at most ``budget`` that fit ``shape`` on ``gpu``."""
    return [tp for tp in TP_DEGREES if tp <= budget and fits(shape, gpu, tp, gpu_memory_utilization)]


def min_gpus(shape: ModelConfig, gpus: Sequence[str], gpu_memory_utilization: float = 0.9) -> int | None:
    """The fewest GPUs one replica of ``shape`` needs on any of ``gpus``; None when none fits."""
    found = [
        tp for g in gpus if g in GPU_SPECS for tp in TP_DEGREES if fits(shape, g, tp, gpu_memory_utilization)
    ]
    return min(found) if found else None


#: the fields of a request for a recommendation (``POST /api/v1/recommendations``' JSON body)
BODY_FIELDS = {
    "layout": "the current layout (a serving.sim.layout string), required",
    "model": "model shape (llama-3.1-70b)",
    "slo_ttft_ms": "TTFT SLO, ms (1000)",
    "slo_tpot_ms": "TPOT SLO, ms (30)",
    "slo_target": "attainment to hold, (0, 1] (0.9)",
    "gpu_budget": "most GPUs (the current layout's)",
    "allowed_gpus": "GPU types a candidate may use (the current layout's)",
    "fleet_gpus": "fleet size the annual $ are for (the current layout's GPUs)",
    "min_gain_pct": "a change must gain more than this (10)",
    "target": "what it is for: stack:URL, scenario:ID or fleet:NAME (scenario:trace)",
    "measured": "figures measured on the current layout over the window (ttft_p90_s, tpot_p90_s, output_tokens_per_s)",
    "dispatch_delay_s": "the front end's dispatch delay added to each arrival of the simulations, s (0; a stack window: measured)",
    "requests": "the trace inline: [[arrival_s, prompt_tokens, output_tokens], ...]",
    "poisson": "instead: Poisson arrivals at this rate, req/s (with num_requests, prompt_tokens, output_tokens, seed)",
    "num_requests": "with poisson (100)",
    "prompt_tokens": "with poisson: [min, max] (32, 512)",
    "output_tokens": "with poisson: [min, max] (16, 128)",
    "seed": "with poisson (0)",
    "duration": "instead: the first S seconds of the Azure conversation trace (the shared hour, else the vendored slice)",
    "trace_desc": "a description of the trace",
    "workload_id": "the stored workload it was made from",
    "window": "[start_s, end_s] of the store window it was made from",
}


def _num(body: dict[str, Any], key: str, default: Any, kind: type = float) -> Any:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise RecommendError(
            f"{key} must be a {'whole number' if kind is int else 'number'}, got {value!r}", key
        )
    return kind(value)


def _slo_ms(body: dict[str, Any], key: str, default: float) -> float:
    """An SLO given in ms (``slo_ttft_ms``, the CLI's ``--slo-ttft-ms``); RecommendError naming the
    field, its unit and what is allowed (the seconds check in :meth:`RecommendInputs.check` is for
    inputs built directly)."""
    from serving.sim.summary import slo_ms_error

    value = body.get(key, default)
    message = slo_ms_error(f"{key} (--{key.replace('_', '-')})", value)
    if message is not None:
        raise RecommendError(message, key)
    return float(value)


def trace_from_body(body: dict[str, Any]) -> tuple[list[TraceRequest], str]:
    """The trace a request body gives (``requests`` inline, ``poisson`` or ``duration``)."""
    from serving.trace import SHARED_TRACE, load_azure_trace, poisson_trace, vendored_trace_path

    given = [k for k in ("requests", "poisson", "duration") if body.get(k) is not None]
    if len(given) != 1:
        raise RecommendError("give the trace as exactly one of requests, poisson or duration", "requests")
    if "requests" in given:
        rows = body["requests"]
        if not isinstance(rows, list):
            raise RecommendError(
                "requests must be a list of [arrival_s, prompt_tokens, output_tokens]", "requests"
            )
        out = []
        for i, r in enumerate(rows):
            ok = (
                isinstance(r, list | tuple)
                and len(r) == 3
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in r)
            )
            if not ok or not (math.isfinite(r[0]) and r[0] >= 0 and r[1] >= 1 and r[2] >= 1):
                raise RecommendError(
                    f"requests[{i}] must be [arrival_s >= 0, prompt_tokens >= 1, output_tokens >= 1], got {r!r}",
                    "requests",
                )
            out.append(TraceRequest(float(r[0]), int(r[1]), int(r[2])))
        return sorted(out, key=lambda r: r.arrival_s), str(
            body.get("trace_desc") or f"{len(out)} requests given"
        )
    if "poisson" in given:
        rate = _num(body, "poisson", None)
        n = _num(body, "num_requests", 100, int)
        if not rate or rate <= 0 or n < 2:
            raise RecommendError("poisson must be > 0 req/s and num_requests >= 2", "poisson")
        spans = {}
        for key, default in (("prompt_tokens", (32, 512)), ("output_tokens", (16, 128))):
            v = body.get(key, default)
            if not (
                isinstance(v, list | tuple)
                and len(v) == 2
                and all(isinstance(x, int) for x in v)
                and 1 <= v[0] <= v[1]
            ):
                raise RecommendError(f"{key} must be [min, max] with 1 <= min <= max, got {v!r}", key)
            spans[key] = (v[0], v[1])
        seed = _num(body, "seed", 0, int)
        trace = poisson_trace(
            rate, n, prompt_tokens=spans["prompt_tokens"], output_tokens=spans["output_tokens"], seed=seed
        )
        return trace, f"Poisson {rate:g} req/s, {n} requests"
    duration = _num(body, "duration", None)
    if not duration or duration <= 0:
        raise RecommendError(f"duration must be > 0 s, got {duration!r}", "duration")
    path = SHARED_TRACE if SHARED_TRACE.is_file() else vendored_trace_path()
    return load_azure_trace(
        path, duration_s=duration
    ), f"Azure conversation trace {path.name}, first {duration:g} s"


def inputs_from_body(body: Any) -> tuple[RecommendInputs, float]:
    """The inputs (unchecked) and ``min_gain_pct`` of a request body; RecommendError naming a bad field."""
    if not isinstance(body, dict):
        raise RecommendError(
            'the body must be a JSON object, e.g. {"layout": "agg:8xh100-sxm:tp2", "duration": 600}'
        )
    unknown = sorted(set(body) - set(BODY_FIELDS))
    if unknown:
        raise RecommendError(
            f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(BODY_FIELDS))}", unknown[0]
        )
    if not isinstance(body.get("layout"), str):
        raise RecommendError("layout (the current layout, e.g. agg:8xh100-sxm:tp2) is required", "layout")
    trace, desc = trace_from_body(body)
    allowed = body.get("allowed_gpus") or []
    if not (isinstance(allowed, list) and all(isinstance(g, str) for g in allowed)):
        raise RecommendError(f"allowed_gpus must be a list of GPU names, got {allowed!r}", "allowed_gpus")
    measured = body.get("measured")
    if measured is not None and not isinstance(measured, dict):
        raise RecommendError(
            "measured must be an object of figures (ttft_p90_s, tpot_p90_s, output_tokens_per_s)", "measured"
        )
    window = body.get("window")
    inputs = RecommendInputs(
        trace=trace,
        model=str(body.get("model") or "llama-3.1-70b"),
        current=body["layout"],
        slo=SloTarget(
            ttft_s=_slo_ms(body, "slo_ttft_ms", 1000.0) / 1000.0,
            tpot_s=_slo_ms(body, "slo_tpot_ms", 30.0) / 1000.0,
            target=_num(body, "slo_target", 0.9),
        ),
        gpu_budget=_num(body, "gpu_budget", None, int),
        allowed_gpus=tuple(allowed),
        fleet_gpus=_num(body, "fleet_gpus", None, int),
        target=str(body.get("target") or "scenario:trace"),
        window=tuple(window) if isinstance(window, list) and len(window) == 2 else None,  # type: ignore[arg-type]
        workload_id=body.get("workload_id"),
        measured=measured,
        trace_desc=str(body.get("trace_desc") or desc),
        dispatch_delay_s=_num(body, "dispatch_delay_s", 0.0),
    )
    return inputs, _num(body, "min_gain_pct", 10.0)
