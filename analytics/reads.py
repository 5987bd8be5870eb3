"""One analytics read of a window, as ``phaselens analyze`` (phaselens/cli/analyze.py) and the service's
API (phaselens/api.py) ask for it: parameters checked the same way, the window resolved, the summary
or the histogram run on a store cursor."""

from __future__ import annotations

import math
from typing import Any

from analytics.window import LIVE, AnalyticsError, parse_span_s


def gpu_rows_of(value: str | None) -> int | None:
    """``--gpus``: a whole number >= 0 of per-GPU rows, or ``all`` (None); the default where not
    given. AnalyticsError names what is allowed otherwise."""
    from analytics.summary import DEFAULT_GPU_ROWS

    if value is None:
        return DEFAULT_GPU_ROWS
    text = value.strip()
    if text.lower() == "all":
        return None
    if text.isascii() and text.isdigit():
        return int(text)
    raise AnalyticsError(
        f"--gpus must be a whole number of GPU rows >= 0 (0: the pools only) or 'all', got {value!r}"
    )


def summary_params(
    *,
    dataset: str,
    since: str | None,
    start_s: float | None,
    end_s: float | None,
    nodes: list[str] | None,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    fleet_gpus: int | None,
) -> dict[str, Any]:
    """The query parameters of ``GET /api/v1/analytics/summary`` (what the CLI and the dashboard send)."""
    params: dict[str, Any] = {"dataset": dataset}
    for key, value in (
        ("since", since),
        ("start_s", start_s),
        ("end_s", end_s),
        ("slo_ttft_ms", slo_ttft_ms),
        ("slo_tpot_ms", slo_tpot_ms),
        ("fleet_gpus", fleet_gpus),
    ):
        if value is not None:
            params[key] = value
    if nodes:
        params["node"] = nodes
    return params


def window_of(con: Any, params: dict[str, Any]) -> Any:
    """The :class:`~analytics.window.Window` that ``params`` (``dataset``, ``since``, ``start_s``,
    ``end_s``, ``node``) name on ``con``; AnalyticsError names a bad parameter.

    The one check of a window's time parameters, for every analytics endpoint (summary, overview,
    histogram, reports) and the CLI: ``since`` a span in (0, 36500d], ``start_s`` / ``end_s`` finite
    UTC epoch seconds from 2000 to 9999, not both ``since`` and ``start_s``, and a window that starts
    from 2000 on and ends after it starts."""
    from analytics.window import check_window_start, epoch_s, resolve_window, scenarios

    dataset = str(params.get("dataset") or LIVE)
    since = params.get("since")
    since_s = parse_span_s(str(since), "since") if since is not None else None
    start_s = epoch_s("start_s", params.get("start_s"))  # the API's; the CLI checks its flags first
    end_s = epoch_s("end_s", params.get("end_s"))
    if since_s is not None and start_s is not None:
        raise AnalyticsError(
            "give since (the SPAN before end_s, or before now) or start_s, not both", "since"
        )
    if dataset == "latest":
        found = scenarios(con)
        if not found:
            raise AnalyticsError("--dataset latest: no simulated scenario is stored", "dataset")
        dataset = found[0]["scenario_id"]
    nodes = params.get("node")
    try:
        window = resolve_window(
            con,
            dataset=dataset,
            since_s=since_s,
            start_s=start_s,
            end_s=end_s,
            nodes=[nodes] if isinstance(nodes, str) else nodes,
        )
    except AnalyticsError as e:
        if e.param is None:  # the window's own check: its end is not after its start
            raise AnalyticsError(str(e), "end_s" if end_s is not None else "start_s") from None
        raise
    if start_s is None:
        check_window_start(window, param="since" if since_s is not None else "end_s")
    return window


#: price query parameters of the summary: name -> (lowest, highest, unit)
PRICE_PARAMS: dict[str, tuple[float, float, str]] = {
    "gpu_usd_per_hour": (0.0, 1000.0, "US $ per GPU-hour, for every GPU of the window"),
    "electricity_usd_per_kwh": (0.0, 10.0, "US $ per kWh"),
    "pue": (1.0, 5.0, "facility energy / IT energy"),
}


def price_overrides(params: dict[str, Any]) -> dict[str, float]:
    """The price parameters given in ``params``, checked against :data:`PRICE_PARAMS`'s ranges;
    AnalyticsError naming the parameter and its allowed range otherwise."""
    out: dict[str, float] = {}
    for name, (lo, hi, unit) in PRICE_PARAMS.items():
        raw = params.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if not (math.isfinite(value) and lo <= value <= hi):
            raise AnalyticsError(f"{name} must be a number in [{lo:g}, {hi:g}] ({unit}), got {raw!r}", name)
        out[name] = value
    return out


def _price_table(con: Any, window: Any, prices_path: str | None, given: dict[str, float]) -> Any:
    """The price table of a request: the defaults (or ``prices_path``), then the request's own
    prices; a request's GPU price applies to every GPU name of the window's devices."""
    from dataclasses import replace

    from analytics.cost import load_prices

    if not given and not prices_path:
        return None
    overrides: dict[str, Any] = {k: v for k, v in given.items() if k != "gpu_usd_per_hour"}
    if "gpu_usd_per_hour" in given:
        pred, par = window.node_sql("node")
        names = [
            str(r[0])
            for r in con.execute(
                f"SELECT DISTINCT name FROM devices WHERE {pred} AND name IS NOT NULL", par
            ).fetchall()
        ]
        overrides["gpu_usd_per_hour"] = {n: given["gpu_usd_per_hour"] for n in names}
    table = load_prices(prices_path, **overrides)
    sources = dict(table.sources)
    for key, value in given.items():
        names = overrides.get(key, {}) if key == "gpu_usd_per_hour" else {key: value}
        for name in names:
            sources[name] = f"set in the request ({key}={value:g})"
    return replace(table, sources=sources)


def run_summary(
    con: Any,
    params: dict[str, Any],
    *,
    prices_path: str | None = None,
    skip: frozenset[str] = frozenset(),
    objects: dict[str, Any] | None = None,
    reuse: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Resolve the window of ``params`` on ``con`` and return the summary's JSON form (without the
    parts named in ``skip``); ``objects`` and ``reuse`` as :func:`analytics.summary.summarize`'s.

    AnalyticsError (or ValueError) names a bad parameter. Used by the CLI on a store file and by the
    collector's API endpoint on a cursor of its writer's connection. Prices: ``prices_path`` (a
    file), then the :data:`PRICE_PARAMS` given in ``params``.
    """
    from analytics.summary import summarize

    given_prices = price_overrides(params)
    window = window_of(con, params)
    slo = None
    if params.get("slo_ttft_ms") is not None or params.get("slo_tpot_ms") is not None:
        from analytics.latency import SloSpec
        from serving.sim.summary import slo_ms_error

        default = SloSpec()
        ttft = _float(params, "slo_ttft_ms")
        tpot = _float(params, "slo_tpot_ms")
        for name, value in (("slo_ttft_ms", ttft), ("slo_tpot_ms", tpot)):
            if value is not None and (message := slo_ms_error(name, value)) is not None:
                raise AnalyticsError(message, name)
        slo = SloSpec(
            ttft_s=ttft / 1000 if ttft is not None else default.ttft_s,
            tpot_s=tpot / 1000 if tpot is not None else default.tpot_s,
        )
    prices = _price_table(con, window, prices_path, given_prices)
    fleet = params.get("fleet_gpus")
    if fleet is not None:
        try:
            fleet = int(fleet)
        except (TypeError, ValueError):
            raise AnalyticsError(
                f"fleet_gpus must be a whole number of GPUs >= 1, got {fleet!r}", "fleet_gpus"
            ) from None
        if fleet < 1:
            raise AnalyticsError(
                f"fleet_gpus must be >= 1 (a whole number of GPUs), got {fleet}", "fleet_gpus"
            )
    return summarize(
        con, window, prices=prices, slo=slo, fleet_gpus=fleet, skip=skip, objects=objects, reuse=reuse
    ).to_dict()


def run_histogram(con: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The binned SM activity and utilization % per pool of the window of ``params`` (the summary's
    window parameters plus ``bin_pct``): :func:`analytics.histogram.activity_histogram`'s JSON."""
    from analytics.histogram import DEFAULT_BIN_PCT, activity_histogram, check_bin_pct

    bin_pct = check_bin_pct(params.get("bin_pct", DEFAULT_BIN_PCT))
    return activity_histogram(con, window_of(con, params), bin_pct=bin_pct).to_dict()


def run_gpu_series(con: Any, params: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU means per time bucket of the window of ``params`` (the summary's window parameters
    plus ``max_points``, the most values per metric, and ``max_buckets``, the most time buckets):
    :func:`analytics.gpu_series.gpu_series`'s JSON."""
    from analytics.gpu_series import DEFAULT_MAX_POINTS, check_max_buckets, check_max_points, gpu_series

    max_points = check_max_points(params.get("max_points", DEFAULT_MAX_POINTS))
    max_buckets = check_max_buckets(params.get("max_buckets"))
    window = window_of(con, params)
    return gpu_series(con, window, max_points=max_points, max_buckets=max_buckets).to_dict()


def no_data_hint(con: Any, summary: dict[str, Any]) -> str | None:
    """Where a live window found nothing (no trust label), what the store does hold: the simulated
    scenarios to pass as ``--dataset``, and the span of its live samples (None: the window has data,
    or is a scenario's)."""
    from analytics.window import SIM_PREFIX, scenarios, utc

    window = summary.get("window") or {}
    if (summary.get("trust") or {}).get("labels") or window.get("dataset", LIVE) != LIVE:
        return None
    hints = []
    found = scenarios(con)
    if found:
        ids = ", ".join(s["scenario_id"] for s in found[:5]) + (
            f" and {len(found) - 5} more" if len(found) > 5 else ""
        )
        hints.append(
            f"this store holds {len(found)} simulated scenario(s): pass --dataset latest, or --dataset one of {ids}"
        )
    lo, hi = con.execute(
        f"SELECT min(ts_s), max(ts_s) FROM gpu_samples WHERE NOT starts_with(node, '{SIM_PREFIX}')"
    ).fetchone()
    if lo is not None:
        hints.append(
            f"its live samples span {utc(lo)} – {utc(hi)}: choose --since or --start-s/--end-s to cover them"
        )
    elif not found:
        hints.append("this store holds no samples at all")
    return "no live data in the window; " + "; ".join(hints)


def _float(params: dict[str, Any], key: str) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise AnalyticsError(f"{key} must be a number, got {value!r}", key) from None
