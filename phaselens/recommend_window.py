"""A layout recommendation for a stored window: what ``phaselens recommend --since/--dataset`` and
``POST /api/v1/recommendations`` with window fields run (docs/RECOMMENDATIONS.md, "From the window
to the applied layout").

:func:`body_from_window` turns the window into the recommender's own request body: the workload of
the window is observed (``phaselens.workload_api.run_workload``: analytics/workload), the trace is
the window's requests themselves (an external fleet's engine histograms: a trace synthesized from
the observed workload, labelled estimated), the measured figures of the same window
(``measured_from_store``) give the confidence, the current layout, model and target are read from
the store (``analytics.recommend.window``) unless given, and so is a live stack window's dispatch delay
(``window_dispatch_delay``: every simulation of the recommendation adds it to each arrival). :func:`store_window_recommendation` stores
the observed workload (``workloads``) and the recommendation with its ``workload_id``, on the
store's writer. :func:`recommend_window` is both, for a process holding the store.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any

from analytics.window import AnalyticsError

#: the request fields that name a stored window (``dataset``: live | a scenario id | latest)
WINDOW_FIELDS = ("since", "dataset", "start_s", "end_s", "node")
DEFAULT_MODEL = "llama-3.1-70b"


def is_window_body(body: Any) -> bool:
    """Whether a request body asks for a recommendation of a stored window."""
    return isinstance(body, dict) and any(body.get(k) is not None for k in WINDOW_FIELDS[:4])


def stack_model(url: str) -> str | None:
    """The model shape the bundled stack's emulated workers model (``GET /v1/devices``), or None."""
    import httpx

    try:
        body = httpx.get(f"{url.rstrip('/')}/v1/devices", timeout=5.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    shapes = {(d.get("emulation") or {}).get("models_shape") for d in body.get("devices", [])}
    shapes.discard(None)
    return shapes.pop() if len(shapes) == 1 else None


def body_from_window(
    con: Any, body: dict[str, Any], *, serving_urls: Sequence[str] = (), ask_stack: bool = True
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(recommend body, workload result, how)`` for the window ``body`` names (:data:`WINDOW_FIELDS`;
    the other fields are the recommender's, ``layout``/``model``/``target`` optional here).
    ``serving_urls``: the stacks the caller polls (a live window's target when there is one);
    ``ask_stack``: ask the stack which model its emulated GPUs model when ``model`` is not given.
    AnalyticsError names what is wrong or missing."""
    from analytics.reads import window_of
    from analytics.recommend.confidence import measured_from_store
    from analytics.recommend.window import (
        layout_from_describe,
        live_layout,
        scenario_row,
        stack_target,
        window_dispatch_delay,
        window_trace,
    )
    from analytics.workload import Workload
    from phaselens.workload_api import run_workload

    params = {k: body[k] for k in WINDOW_FIELDS if body.get(k) is not None}
    if params.get("dataset") in (None, "live") and "since" not in params and "start_s" not in params:
        params["since"] = "1h"
    rest = {k: v for k, v in body.items() if k not in WINDOW_FIELDS}
    given = [k for k in ("requests", "poisson", "duration", "window") if rest.get(k) is not None]
    if given:
        raise AnalyticsError(
            f"give the trace as a stored window (since, dataset, start_s, end_s) or as {given[0]}, not both",
            given[0],
        )
    result = run_workload(con, dict(params))
    window = window_of(con, params)
    observed = Workload.from_dict(result["observed"])
    wt = window_trace(con, window, observed)
    scenario = scenario_row(con, window)
    how: dict[str, Any] = {"dataset": window.dataset, "trace": wt.desc, "trace_trust": wt.trust}

    target = rest.get("target")
    if not target:
        urls = sorted({u.rstrip("/") for u in serving_urls})
        if scenario is not None:
            target = f"scenario:{window.dataset}"
        elif len(urls) == 1:
            target = f"stack:{urls[0]}"
        else:
            target = stack_target(con, window) or ("fleet:live" if wt.synthesized else None)
        if not target:
            raise AnalyticsError(
                "the window's serving stack is not known (no one serving endpoint polled in it): "
                "give what it is for with --for stack:URL | fleet:NAME (target)",
                "target",
            )
    model = rest.get("model")
    if not model:
        if scenario is not None and scenario.get("model"):
            model, how["model_from"] = scenario["model"], "the scenario's model"
        elif ask_stack and target.startswith("stack:") and (found := stack_model(target[6:])):
            model, how["model_from"] = (
                found,
                f"the shape the stack's emulated GPUs model ({target[6:]}/v1/devices)",
            )
        else:
            model, how["model_from"] = DEFAULT_MODEL, "the default (give --model)"
    layout = rest.get("layout")
    if layout:
        how["layout_from"] = "given"
    elif scenario is not None:
        layout, how["layout_from"] = layout_from_describe(scenario["layout"]), "the layout the scenario ran"
    elif wt.synthesized:
        raise AnalyticsError(
            "an external fleet's layout is not in the store (its engines export no roles the recommender can "
            "read): give the current layout with --layout",
            "layout",
        )
    else:
        layout, how["layout_from"] = live_layout(con, window, model)

    measured = rest.get("measured")
    if measured is None and not wt.synthesized:
        try:
            measured = measured_from_store(con, window.start_s, window.end_s, window=window)
        except ValueError as e:  # no ok request with a first token
            how["measured_note"] = f"nothing measured: {e}"
        else:
            measured["trust"] = _measured_trust(con, window)
    elif wt.synthesized:
        how["measured_note"] = (
            "not measured per request: an external fleet's engine histograms carry no per-request latency"
        )
    if rest.get("dispatch_delay_s") is None:
        dd = window_dispatch_delay(con, window, synthesized=wt.synthesized)
        rest["dispatch_delay_s"], how["dispatch_delay"] = dd.delay_s, dd.to_dict()
    else:
        how["dispatch_delay"] = {"how": "given"}
    out = rest | {
        "layout": layout,
        "model": model,
        "target": target,
        "requests": [[r.arrival_s, r.prompt_tokens, r.output_tokens] for r in wt.trace],
        "trace_desc": wt.desc,
        "window": [window.start_s, window.end_s],
    }
    if measured is not None:
        out["measured"] = measured
    return out, result, how


def _measured_trust(con: Any, window: Any) -> str:
    """The trust label of a window's measured figures: simulated (a scenario), emulated (the stack's
    GPUs are emulated) or measured."""
    if window.simulated:
        return "simulated"
    nodes, params = window.node_sql("node")
    emulated = con.execute(
        f"SELECT bool_or(emulated) FROM devices WHERE {nodes} AND worker IS NOT NULL AND since_s < ?",
        [*params, window.end_s],
    ).fetchone()[0]
    return "emulated" if emulated else "measured"


def store_window_recommendation(
    store: Any, row: dict[str, Any], workload: dict[str, Any], how: dict[str, Any], node: str
) -> str:
    """Store the observed (and synthesized) workload, then the recommendation with its
    ``details.inputs.workload_id`` and how the window's inputs were read (``from_window``); on the
    store's writer. Returns the recommendation's id."""
    from analytics.recommend.records import save_recommendation
    from phaselens.workload_api import save_workload

    ids = save_workload(store, workload, node)
    inputs = row["details"]["inputs"]
    inputs["workload_id"] = ids["observed_id"]
    inputs["dispatch_delay"] = how.get("dispatch_delay")
    inputs["from_window"] = how | {"synthesized_workload_id": ids["synthesized_id"]}
    return save_recommendation(store, row)


def recommend_window(
    store: Any,
    body: dict[str, Any],
    *,
    options: Any = None,
    serving_urls: Sequence[str] = (),
    node: str | None = None,
    progress: Callable[[str], None] | None = None,
    submit: Callable[[Callable[[], Any]], Any] | None = None,
) -> dict[str, Any]:
    """Read the window, recommend and store: the stored row. ``submit``: run the writes on the
    store's writer (the collector's ``submit(...).result()``); None: here (a process holding the
    store, ``phaselens recommend --db``). ``options``: ``SearchOptions`` (its ``min_gain_pct`` from
    the body). RecommendError / AnalyticsError on bad input."""
    from dataclasses import replace

    from analytics.recommend.choose import recommend
    from analytics.recommend.inputs import inputs_from_body
    from analytics.recommend.records import recommendation_row
    from analytics.recommend.search import SearchOptions

    node = node or socket.gethostname()
    with store.reader() as cur:
        rec_body, workload, how = body_from_window(cur, body, serving_urls=serving_urls)
    inputs, min_gain = inputs_from_body(rec_body)
    search = replace(options or SearchOptions(), min_gain_pct=min_gain)
    rec = recommend(inputs, search, progress=progress)
    row = recommendation_row(rec, node=node)

    def write() -> str:
        return store_window_recommendation(store, row, workload, how, node)

    if submit is None:
        write()
    else:
        submit(write)
    return row


#: the auto-apply job's search budget: a small slice, one refinement, two whole-trace runs
AUTO_APPLY_SEARCH = {"slice_requests": 100, "refine": 1, "max_hour_runs": 2, "goodput_max_evals": 4}


def window_recommender(collector: Any, policy: Any) -> Callable[[], str | None]:
    """The auto-apply job's ``recommend`` hook (``phaselens collect --auto-apply``): a fresh
    recommendation from the last ``policy.window_s`` of the watched stack's traffic at the policy's
    SLOs, with :data:`AUTO_APPLY_SEARCH`'s budget, stored (workload and row) on the collector's
    writer; its id. A collector watching several stacks keeps them in one live window (their
    workers would mix): then nothing is re-recommended (None) and the job decides on the stored."""
    import logging

    from analytics.recommend.search import SearchOptions

    log = logging.getLogger(__name__)
    urls = sorted({u.rstrip("/") for u in collector.settings.serving_urls})

    def recommend_now() -> str | None:
        if len(urls) != 1:
            log.info(
                "auto-apply: %d stacks watched; not re-recommending (one live window each needs one)",
                len(urls),
            )
            return None
        body = {
            "since": f"{policy.window_s:g}s",
            "slo_ttft_ms": policy.slo_ttft_ms,
            "slo_tpot_ms": policy.slo_tpot_ms,
            "target": f"stack:{urls[0]}",
        }
        row = recommend_window(
            collector.store,
            body,
            options=SearchOptions(**AUTO_APPLY_SEARCH),
            serving_urls=urls,
            node=collector.settings.node,
            submit=lambda write: collector.submit(write).result(timeout=120),
        )
        return str(row["recommendation_id"])

    return recommend_now
