"""What every dashboard page shares: the sidebar (data set, time range, GPU and pool filters, live
refresh), cached reads of the collector's API, trust-label badges, and the friendly messages shown
instead of a stack trace when the service is unreachable or a window holds no data.

A page is one file under ``dashboard/views/``; it calls :func:`sidebar` for what the user chose
and reads through :func:`read_table` (or :func:`client`), inside :func:`service_errors`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import url_state
from dashboard.api import (
    API_URL_ENV,
    TIME_COLUMNS,
    ApiError,
    CollectorApi,
    ServiceUnavailable,
    TableRead,
    api_url,
)
from dashboard.figures import TRUST_COLOURS, TRUST_ORDER, label_figure, ordered_labels

# pages name these through here
__all__ = ["TRUST_COLOURS", "TRUST_ORDER", "TableRead", "label_figure", "ordered_labels"]

LIVE = "live"
SIM_PREFIX = "sim:"
LIVE_RANGES_S = {
    "last 5 minutes": 300.0,
    "last 15 minutes": 900.0,
    "last hour": 3600.0,
    "last 6 hours": 6 * 3600.0,
    "last 24 hours": 86_400.0,
}
REFRESH_S = 5.0  # live refresh period of a page's fragment
LIVE_TTL_S = 2.0  # how long a live read is reused (reruns within it, several charts of one page)
SCENARIO_TTL_S = 3600.0  # a scenario's rows never change once stored

SIDEBAR_KEYS = ("dataset", "live_range", "live_refresh", "range_", "pools_", "gpus_", "compare", "crange_")
NO_COMPARE = ""


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU as the filters know it: its key (UUID, else node/device/index) and what to call it."""

    key: str
    label: str
    node: str
    pool: str | None
    analytics_key: str | None = None  # the analytics' key of the GPU: node|source|device|index


@dataclass(frozen=True, slots=True)
class Selection:
    """What the sidebar selected. A live window ends now (moved on at each refresh); a scenario's
    window is fixed inside its virtual time span."""

    dataset: str  # "live" or a scenario id
    dataset_label: str
    span_s: float | None  # live: how far back from now
    start_s: float | None  # scenario: fixed window
    end_s: float | None
    gpus: tuple[Gpu, ...]  # the GPUs selected (all of the data set's when none was picked)
    all_gpus: tuple[Gpu, ...]
    live_refresh: bool
    offset_s: float = 0.0  # live: the window ends this long before now (the previous period's)
    compare: Selection | None = None  # the window compared with (B), when the sidebar picked one
    compare_note: str | None = None  # why nothing is compared although asked (no earlier period)

    @property
    def simulated(self) -> bool:
        return self.dataset != LIVE

    @property
    def node(self) -> str | None:
        """The node filter for table reads: the scenario's node, or None for live data."""
        return SIM_PREFIX + self.dataset if self.simulated else None

    def window(self) -> tuple[float, float]:
        """``(start_s, end_s)`` now: a live window ends at the current time."""
        if self.simulated:
            return float(self.start_s), float(self.end_s)  # type: ignore[arg-type]
        end = time.time() - self.offset_s
        return end - float(self.span_s or 3600.0), end

    @property
    def refresh_every_s(self) -> float | None:
        """The period for ``st.fragment(run_every=...)``: live data with refresh on, else None."""
        return REFRESH_S if self.live_refresh and not self.simulated else None


# -- reads -----------------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def _client(url: str) -> CollectorApi:
    return CollectorApi(url)


def client() -> CollectorApi:
    """The API client of ``$PHASELENS_API_URL`` (one per URL, shared by every session)."""
    return _client(api_url())


CONTROL_TOKEN_KEY = "control_token"


def control_client() -> CollectorApi:
    """The client for control requests (POSTs): the shared one, which sends
    ``$PHASELENS_CONTROL_TOKEN``, or — when a token was typed in this session
    (:func:`control_token_input`) — a client of this session's that sends that one."""
    typed = st.session_state.get(CONTROL_TOKEN_KEY)
    if not typed:
        return client()
    cached = st.session_state.get("_control_client")
    if cached is None or cached.token != typed or cached.base_url != api_url():
        cached = CollectorApi(api_url(), token=typed)
        st.session_state["_control_client"] = cached
    return cached


def control_token_input() -> None:
    """Where the dashboard has no control token (``$PHASELENS_CONTROL_TOKEN`` unset), a field to type
    the collector's for this browser session (never stored)."""
    if client().token:
        return
    with st.expander("Control token", icon=":material/key:"):
        st.text_input(
            "The collector's control token",
            type="password",
            key=CONTROL_TOKEN_KEY,
            help="Sent as `Authorization: Bearer` with making, applying and rolling back, when the collector "
            "has one (`phaselens collect --control-token`); kept in this browser session only. Or start the "
            "dashboard with PHASELENS_CONTROL_TOKEN set.",
        )


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False, max_entries=64)
def _read_live(url: str, table: str, start_s: float | None, end_s: float | None, max_rows: int) -> TableRead:
    """Live rows: read node by node (the live nodes that have devices), so that a scenario's rows
    in the same span of time never take up the read's row budget; every node when none is known."""
    nodes = _live_nodes(url) if table != "devices" else ()
    if not nodes:
        read = _client(url).table(table, start_s, end_s, max_rows=max_rows)
        return TableRead(_drop_simulated(read.rows), read.truncated)
    reads = [_client(url).table(table, start_s, end_s, node=n, max_rows=max_rows) for n in nodes]
    frames = [r.rows for r in reads if not r.rows.empty]
    if not frames:
        return TableRead(reads[0].rows, False)
    rows = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    time_col = TIME_COLUMNS.get(table)
    if len(frames) > 1 and time_col in rows:
        rows = rows.sort_values(time_col, kind="stable", ignore_index=True)
    return TableRead(rows, any(r.truncated for r in reads))


def _drop_simulated(rows: pd.DataFrame) -> pd.DataFrame:
    if rows.empty or "node" not in rows:
        return rows
    return rows[~rows["node"].astype(str).str.startswith(SIM_PREFIX)].reset_index(drop=True)


@st.cache_data(ttl=10.0, show_spinner=False)
def _live_nodes(url: str) -> tuple[str, ...]:
    """The nodes with live (not simulated) GPUs, from the devices table."""
    rows = _client(url).table("devices", None, None, max_rows=20_000).rows
    if rows.empty:
        return ()
    return tuple(sorted({str(n) for n in rows["node"] if not str(n).startswith(SIM_PREFIX)}))


@st.cache_data(ttl=SCENARIO_TTL_S, show_spinner=False, max_entries=64)
def _read_node(
    url: str, table: str, start_s: float | None, end_s: float | None, node: str, max_rows: int
) -> TableRead:
    return _client(url).table(table, start_s, end_s, node=node, max_rows=max_rows)


def read_table(
    sel: Selection, table: str, start_s: float | None, end_s: float | None, *, max_rows: int = 100_000
) -> TableRead:
    """Rows of ``table`` in the window for the selected data set only: a scenario's node, or every
    node that is not a scenario (live). Live reads are reused for a couple of seconds."""
    if sel.simulated:
        return _read_node(api_url(), table, start_s, end_s, sel.node, max_rows)
    # round live bounds to the second so that the charts of one rerun share one read
    s = None if start_s is None else float(int(start_s))
    e = None if end_s is None else float(int(end_s) + 1)
    return _read_live(api_url(), table, s, e, max_rows)


def window_params(sel: Selection) -> dict[str, Any]:
    """The analytics endpoints' window parameters of the selection (live bounds to the second, so
    that the reads of one rerun share one answer)."""
    start, end = sel.window()
    if not sel.simulated:
        start, end = float(int(start)), float(int(end) + 1)
    return {"dataset": sel.dataset, "start_s": start, "end_s": end}


@st.cache_data(ttl=LIVE_TTL_S, show_spinner=False, max_entries=64)
def _analytics_live(url: str, what: str, params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return getattr(_client(url), what)(**dict(params))


@st.cache_data(ttl=SCENARIO_TTL_S, show_spinner=False, max_entries=64)
def _analytics_scenario(url: str, what: str, params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return getattr(_client(url), what)(**dict(params))


def analytics(sel: Selection, what: str = "summary", **extra: Any) -> dict[str, Any]:
    """``GET /api/v1/analytics/<what>`` (``summary``, ``histogram`` or ``gpu_series``) of the selection's window,
    with ``extra`` query parameters (SLOs, prices, fleet size); answers are reused (live for a
    couple of seconds, a scenario's for an hour)."""
    if what not in ("summary", "histogram", "gpu_series"):
        raise ValueError(f"unknown analytics read {what!r}; reads: summary, histogram, gpu_series")
    params = window_params(sel) | {k: v for k, v in extra.items() if v is not None}
    read = _analytics_scenario if sel.simulated else _analytics_live
    return read(api_url(), what, tuple(sorted(params.items())))


def pool_filter(sel: Selection) -> set[str] | None:
    """The pools the sidebar narrowed to (None: all): the pools of the selected GPUs when GPUs or
    pools were picked."""
    if set(sel.gpus) == set(sel.all_gpus):
        return None
    return {g.pool or "unknown" for g in sel.gpus}


@st.cache_data(ttl=10.0, show_spinner=False)
def _scenarios(url: str) -> list[dict[str, Any]]:
    return _client(url).scenarios()


def gpu_key(row: pd.Series | dict[str, Any]) -> str:
    """A GPU's identity: its UUID, else ``node/device/index``."""
    uuid = row.get("uuid")
    if isinstance(uuid, str) and uuid:
        return uuid
    return f"{row.get('node')}/{row.get('device')}/{row.get('index')}"


def gpu_keys(df: pd.DataFrame) -> pd.Series:
    """:func:`gpu_key` of every row of a samples or devices frame."""
    if df.empty:
        return pd.Series([], dtype=object)
    fallback = df["node"].astype(str) + "/" + df["device"].astype(str) + "/" + df["index"].astype(str)
    if "uuid" not in df:
        return fallback
    return df["uuid"].where(df["uuid"].notna() & (df["uuid"].astype(str) != ""), fallback)


def _gpus(sel_node: str | None, end_s: float | None) -> tuple[Gpu, ...]:
    """The data set's GPUs from its ``devices`` rows (the newest row of each GPU up to ``end_s``)."""
    url = api_url()
    if sel_node is None:
        read = _read_live(url, "devices", None, None if end_s is None else float(int(end_s) + 1), 20_000)
    else:
        read = _read_node(url, "devices", None, end_s, sel_node, 20_000)
    df = read.rows
    if df.empty:
        return ()
    df = df.assign(_key=gpu_keys(df)).sort_values("since_s").drop_duplicates("_key", keep="last")
    nodes = df["node"].nunique()
    out = []
    for _, r in df.sort_values(["node", "index"], na_position="last").iterrows():
        idx = r.get("index")
        akey = f"{r['node']}|{r.get('source')}|{r.get('device')}|{'' if idx is None or pd.isna(idx) else int(idx)}"
        out.append(
            Gpu(r["_key"], gpu_label(r, with_node=nodes > 1), str(r["node"]), _pool(r.get("role")), akey)
        )
    return tuple(out)


def _pool(role: Any) -> str | None:
    return str(role) if isinstance(role, str) and role else None


def gpu_label(row: pd.Series | dict[str, Any], *, with_node: bool = False) -> str:
    """A readable GPU name: ``worker-0 · GPU 0 · H100 SXM (simulated)``."""
    parts = []
    if with_node:
        parts.append(str(row.get("node")))
    worker = row.get("worker")
    if isinstance(worker, str) and worker:
        parts.append(worker)
    idx = row.get("index")
    parts.append(f"GPU {int(idx)}" if idx is not None and not pd.isna(idx) else str(row.get("device")))
    name = row.get("name")
    if isinstance(name, str) and name:
        parts.append(name)
    return " · ".join(parts)


# -- errors ------------------------------------------------------------------------------------------


@contextmanager
def service_errors() -> Iterator[None]:
    """Show a clear message (never a stack trace) when the collector cannot be reached or refuses
    a read, and stop the page there."""
    try:
        yield
    except ServiceUnavailable as e:
        if e.bad_url:
            st.error(
                f"**`{API_URL_ENV}` is not an http(s) URL**: `{e.url}`. Give the collector's URL with its "
                f"scheme, e.g. `{API_URL_ENV}=http://127.0.0.1:8900`.",
                icon=":material/link_off:",
            )
            st.stop()
        st.error(
            f"**The phaselens service is not reachable** at `{e.url}`.\n\n"
            f"Start it with `phaselens collect --db phaselens.duckdb`, or point the dashboard at a "
            f"running one with `PHASELENS_API_URL=http://host:8900`.\n\n_Detail: {e.reason}_",
            icon=":material/power_off:",
        )
        st.stop()
    except ApiError as e:
        st.error(
            f"**The phaselens service refused a request**: {e.message}\n\n_`{e.method} {e.path}` → {e.status}_",
            icon=":material/error:",
        )
        st.stop()


def empty_window(what: str, sel: Selection) -> None:
    """The message for a window without data: what is missing and what to try."""
    hint = (
        "Pick a longer time range, another data set, or check the Health page for sources that are down."
        if not sel.simulated
        else "Widen the time range within the scenario, or pick another data set."
    )
    st.info(f"**No {what} in this window** ({describe_window(sel)}). {hint}", icon=":material/search_off:")


def describe_window(sel: Selection) -> str:
    """The data set and window in words, for markdown (colons escaped: :func:`plain_md`)."""
    start, end = sel.window()
    fmt = "%Y-%m-%d %H:%M:%S"
    a = datetime.fromtimestamp(start, UTC).strftime(fmt)
    b = datetime.fromtimestamp(end, UTC).strftime("%H:%M:%S")
    return plain_md(f"{sel.dataset_label}, {a} – {b} UTC")


def plain_md(text: str) -> str:
    """Plain ``text`` (no code spans) for Streamlit markdown with its colons escaped where a word
    follows (``04\\:20\\:13``, ``agg\\:8xh100-sxm\\:tp2``; shown as ``04:20:13``): Streamlit's
    frontend fetches and loads its 0.26 MB emoji library for any text with ``:word:`` in it, which
    clock times and layout names look like."""
    return re.sub(r":(?=[\w+-])", r"\\:", text)


def text_md(text: str) -> str:
    """:func:`plain_md` with dollar signs escaped too (two of them in one text would be read as LaTeX)."""
    return plain_md(text).replace("$", "\\$")


# -- trust labels ------------------------------------------------------------------------------------


def row_trust(df: pd.DataFrame) -> set[str]:
    """The trust labels of sample rows (``trust_label`` of docs/STORE.md, plus host-bound)."""
    if df.empty:
        return set()
    labels: set[str] = set()
    sim = df["node"].astype(str).str.startswith(SIM_PREFIX)
    if "source" in df:
        sim |= df["source"].astype(str) == "simulated"
    if sim.any():
        labels.add("simulated")
    emulated = (
        df["emulated"].fillna(False).astype(bool) if "emulated" in df else pd.Series(False, index=df.index)
    )
    if (emulated & ~sim).any():
        labels.add("emulated")
    if (~emulated & ~sim).any():
        labels.add("measured")
    if "host_bound_pct" in df and (pd.to_numeric(df["host_bound_pct"], errors="coerce").fillna(0) > 0).any():
        labels.add("host-bound")
    return labels


# -- sidebar -----------------------------------------------------------------------------------------


def _scenario_label(s: dict[str, Any]) -> str:
    name = s.get("name") or s["scenario_id"]
    model = s.get("model")
    return f"simulated · {name}" + (f" · {model}" if model else "") + f" ({s['scenario_id']})"


def _default_dataset(options: list[str]) -> str:
    """The data set a session opens on: the link's ``?dataset=``, else live when the collector has
    live GPUs, else the newest scenario (a fresh demo store holds only simulated data at first)."""
    asked = st.query_params.get("dataset")
    if asked in options:
        return asked
    if len(options) == 1 or _gpus(None, None):
        return LIVE
    return options[1]


def sidebar() -> Selection:
    """Render the sidebar and return what it selects. The data set, time range and comparison come
    from the link's query string on a session's first run (:mod:`dashboard.url_state`) and are written
    back to it on every run, so that the page's URL reproduces the view."""
    with st.sidebar:
        st.caption(f"Service: `{api_url()}`")
        scenarios = {s["scenario_id"]: s for s in _scenarios(api_url())}
        options = [LIVE, *scenarios]
        labels = {LIVE: "live (measured / emulated)"} | {k: _scenario_label(s) for k, s in scenarios.items()}
        if "dataset" not in st.session_state:
            st.session_state["dataset"] = _default_dataset(options)
        elif st.session_state["dataset"] not in options:  # a scenario deleted meanwhile
            st.session_state["dataset"] = LIVE
        dataset = st.selectbox(
            "Data set",
            options,
            format_func=labels.__getitem__,
            key="dataset",
            help="Live rows of the collector's own nodes, or one simulated scenario (never mixed).",
        )
        st.query_params["dataset"] = dataset
        window = _range_input(dataset, scenarios, "live_range", f"range_{dataset}", "Time range", "range")
        live_refresh = False
        if dataset == LIVE:
            live_refresh = st.toggle(
                "Live refresh", value=True, key="live_refresh", help=f"every {REFRESH_S:g} s"
            )
        node = SIM_PREFIX + dataset if dataset != LIVE else None
        gpus = _gpus(node, window[2])
        pools = sorted({g.pool for g in gpus if g.pool})
        chosen_pools = (
            st.multiselect("Pool", pools, key=f"pools_{dataset}", placeholder="all pools") if pools else []
        )
        in_pools = [g for g in gpus if not chosen_pools or g.pool in chosen_pools]
        by_label = {g.label: g for g in in_pools}
        chosen = st.multiselect("GPUs", list(by_label), key=f"gpus_{dataset}", placeholder="all GPUs")
        picked = tuple(by_label[c] for c in chosen) or tuple(in_pools)
        sel = Selection(
            dataset=dataset,
            dataset_label=labels[dataset],
            span_s=window[0],
            start_s=window[1],
            end_s=window[2],
            gpus=picked,
            all_gpus=gpus,
            live_refresh=live_refresh,
        )
        return _compare_input(sel, options, labels, scenarios)


def _range_input(
    dataset: str, scenarios: dict[str, Any], live_key: str, slider_key: str, label: str, param: str
) -> tuple[float | None, float | None, float | None]:
    """The time range of ``dataset`` (``(span_s, None, None)`` live, ``(None, start_s, end_s)`` a
    scenario), seeded from the link's ``param`` on first use and written back to it."""
    if dataset == LIVE:
        if live_key not in st.session_state:
            st.session_state[live_key] = url_state.live_range_of(st.query_params.get(param)) or "last hour"
        choice = st.selectbox(label, list(LIVE_RANGES_S), key=live_key)
        st.query_params[param] = url_state.live_range_code(choice)
        return LIVE_RANGES_S[choice], None, None
    sc = scenarios[dataset]
    s0, s1 = float(sc["start_s"]), float(sc["end_s"])
    dur = url_state.scenario_duration_s(s0, s1)
    if slider_key not in st.session_state:
        st.session_state[slider_key] = url_state.scenario_range_of(st.query_params.get(param), dur) or (
            0.0,
            dur,
        )
    a, b = st.slider(
        f"{label} (s into the scenario)", 0.0, dur, step=max(0.1, round(dur / 200, 1)), key=slider_key
    )
    st.query_params[param] = url_state.scenario_range_text(a, b)
    return None, *url_state.scenario_window(s0, a, b)


def _compare_input(
    sel: Selection, options: list[str], labels: dict[str, str], scenarios: dict[str, Any]
) -> Selection:
    """The "Compare with" choice (nothing, the previous period, another data set and its range), in
    the link as ``compare`` / ``compare_range``; ``sel`` with its :attr:`Selection.compare` set."""
    choices = [NO_COMPARE, url_state.PREVIOUS, *(o for o in options if o != sel.dataset)]
    if "compare" not in st.session_state:
        st.session_state["compare"] = (
            url_state.compare_of(st.query_params.get("compare"), options) or NO_COMPARE
        )
    if st.session_state["compare"] not in choices:  # the data set compared became the one viewed
        st.session_state["compare"] = NO_COMPARE
    names = {NO_COMPARE: "nothing", url_state.PREVIOUS: "the previous period of the same length"} | labels
    other = st.selectbox(
        "Compare with",
        choices,
        format_func=names.__getitem__,
        key="compare",
        help="Shown side by side (A: the range above, B: this) on the Overview, Cost and Latency pages.",
    )
    for param in ("compare", "compare_range"):
        st.query_params.pop(param, None)
    if other == NO_COMPARE:
        return sel
    st.query_params["compare"] = other
    if other == url_state.PREVIOUS:
        return _previous(sel, scenarios)
    span_s, start_s, end_s = _range_input(
        other, scenarios, "compare_live_range", f"crange_{other}", "Its time range", "compare_range"
    )
    node = SIM_PREFIX + other if other != LIVE else None
    gpus = _gpus(node, end_s)
    b = Selection(other, labels[other], span_s, start_s, end_s, gpus, gpus, False)
    return replace(sel, compare=b)


def _previous(sel: Selection, scenarios: dict[str, Any]) -> Selection:
    """``sel`` compared with the period of the same length just before its window."""
    if not sel.simulated:
        span = float(sel.span_s or 3600.0)
        b = replace(
            sel, offset_s=span, live_refresh=False, dataset_label=f"{sel.dataset_label}, the period before"
        )
        return replace(sel, compare=b)
    start, end = float(sel.start_s), float(sel.end_s)  # type: ignore[arg-type]
    first = start - (end - start)
    s0 = float(scenarios[sel.dataset]["start_s"])
    if start - s0 < 0.1:
        return replace(
            sel, compare_note="No earlier period to compare with: the range starts where the scenario does."
        )
    b = replace(
        sel, start_s=max(first, s0), end_s=start, dataset_label=f"{sel.dataset_label}, the period before"
    )
    return replace(sel, compare=b)


def keep_sidebar_state() -> None:
    """Carry the sidebar's choices over to the next page: Streamlit forgets a widget's value on a
    run that does not render it (a page without the sidebar), unless it is written back."""
    for key in list(st.session_state):
        if isinstance(key, str) and key.startswith(SIDEBAR_KEYS):
            st.session_state[key] = st.session_state[key]


def dataset_caption(sel: Selection) -> None:
    """One line under a page title: which data set and window the page shows."""
    st.caption(describe_window(sel))
