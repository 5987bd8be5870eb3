"""Overview: the page a person understands in ten seconds — output tokens/s, $ per 1M input and
output tokens, J per output token, stranded / host-bound / idle share of GPU-time and SLO
attainment, each against the previous period of the same length; one sentence saying where the
money goes; a bar of where the GPU-time goes; the fleet size the yearly figure is scaled to.

Reads ``GET /api/v1/analytics/overview`` (computed and cached by the service from two analytics
summaries: ``analytics/overview.py``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import streamlit as st

from dashboard import common, compare, figures, share_bar
from dashboard.api import ApiError
from dashboard.figures import recommend as rf
from dashboard.page_trust import PageTrust


def _sentence(text: str) -> str:
    """The first letter upper case, the rest as written (``str.capitalize`` lowers "GPUs")."""
    return text[:1].upper() + text[1:]


WASTE_LABEL = (
    "Waste in this window (stranded, idle or host-bound GPU-time; not a saving a change is known to recover):"
)

TILE_ROWS = (
    ("output_tokens_per_s", "usd_per_1m_tokens", "usd_per_request", "j_per_output_token"),
    ("stranded_share", "host_bound_share", "idle_share", "slo_attainment"),
)


@st.cache_data(ttl=common.LIVE_TTL_S, show_spinner=False, max_entries=64)
def _read(url: str, params: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return common.client().overview(**dict(params))


def _params(sel: common.Selection, fleet_gpus: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"dataset": sel.dataset, "fleet_gpus": fleet_gpus}
    if sel.simulated:
        params |= {"start_s": sel.start_s, "end_s": sel.end_s}
    else:
        params["since"] = f"{float(sel.span_s or 3600.0):g}s"
        if sel.offset_s:  # the period before: the span up to its end
            params["end_s"] = float(int(sel.window()[1]))
        nodes = sorted({g.node for g in sel.gpus}) if sel.gpus != sel.all_gpus else []
        if nodes:
            params["node"] = nodes
    return params


@st.cache_data(ttl=10.0, show_spinner=False, max_entries=16)
def _best_recommendation(url: str, dataset: str) -> tuple[dict[str, Any] | None, str | None]:
    """The best proposed recommendation (with its details) and, when it is not about this data set,
    its target; (None, None) when none is proposed or the service has no recommendations."""
    api = common.client()
    try:
        best = rf.best_recommendation(api.recommendations(status="proposed", limit=500), dataset)
        if best is None:
            return None, None
        rec = api.recommendation(best["recommendation_id"])
    except ApiError:  # a service without the recommendations routes
        return None, None
    target = str(rec.get("target") or "")
    return rec, None if rf.is_for_dataset(target, dataset) else target


def recommendation_headline(sel: common.Selection, trust: PageTrust) -> None:
    """The headline: what the best recommendation saves at the SLOs (and how sure), linking to the
    Recommendations page; or that there is none and how to make one. Its trust label (a prediction:
    simulated) goes into the page's badge block and, where the page's figures are not simulated, beside it."""
    rec, other = _best_recommendation(common.api_url(), sel.dataset)
    st.markdown(f"#### {common.text_md(rf.headline_text(rec, target_note=other))}")
    if rec is not None:
        labels = [str(rf.details_of(rec).get("trust") or "simulated")]
        trust.add(labels)
        if trust.differs(labels):
            st.caption(f"The recommendation's figures: {', '.join(labels)}")
    st.page_link(
        "views/recommendations.py",
        label="Recommendations: candidates, confidence, apply" if rec else "Recommendations: make one",
        icon=":material/lightbulb:",
    )


def _utc(ts_s: float) -> str:
    return datetime.fromtimestamp(float(ts_s), UTC).strftime("%H:%M:%S")


def _busy_text(fig: dict[str, Any]) -> str | None:
    """The rate while serving, by its own name (never the headline): ``tokens/s while serving (busy
    time): 188 tokens/s (over the 21.4 min with a request in flight (36 % of the window))``."""
    if fig.get("busy_value") is None:
        return None
    value = figures.figure_text("output_tokens_per_s", fig["busy_value"])
    return f"{fig.get('busy_label') or 'tokens/s while serving (busy time)'}: {value} ({fig.get('busy_basis') or ''})"


#: the tiles' labels, short enough for a quarter of a 1280 px page (the analytics' own, longer label
#: opens the tile's help): the unit is in the value, or in the label where the value is a bare number
TILE_LABELS = {
    "output_tokens_per_s": "Output tokens/s",
    "usd_per_1m_tokens": "$ per 1M tokens, all in",
    "usd_per_request": "$ per request",
    "j_per_output_token": "J per output token",
    "stranded_share": "Stranded GPU-time",
    "host_bound_share": "Host-bound GPU-time",
    "idle_share": "Idle GPU-time",
    "slo_attainment": "SLO attainment",
}


def tile_value(key: str, value: float | None) -> str:
    """A tile's value, short enough for a quarter of a 1280 px page: the unit is in the tile's label
    (``Output tokens/s``: ``1,218``, not ``1,218 tokens/s``, cut to "1,218 toke…")."""
    text = figures.figure_text(key, value)
    return text.removesuffix(" tokens/s") if key == "output_tokens_per_s" else text


def no_trend_text(tiles: dict[str, Any]) -> str:
    """Why no tile has a trend, once, in words: a whole scenario has no earlier period of its length."""
    why = next((f.get("previous_no_data") for f in tiles.values() if f.get("previous_no_data")), None)
    why = str(why or "no previous period").removeprefix("no data: ")
    return f"No trend shown: {why}."


def _tile(col: Any, key: str, fig: dict[str, Any], *, any_previous: bool, trust: PageTrust) -> None:
    value = fig.get("value")
    previous = fig.get("previous")
    help_lines = []
    if value is None:
        help_lines.append(str(fig.get("no_data") or "no data"))
    if previous is None:
        help_lines.append(f"Previous period: {fig.get('previous_no_data') or 'no data'}")
    else:
        help_lines.append(f"Previous period: {figures.figure_text(key, previous)}")
    if fig.get("basis"):
        help_lines.insert(0, _sentence(str(fig["basis"])))
    busy = _busy_text(fig)
    if busy:
        help_lines.insert(1, busy)
    help_lines.insert(0, f"**{fig['label']}**")  # the figure's full name
    if key == "j_per_output_token" and fig.get("j_per_input_token") is not None:
        help_lines.append(f"Per input token: {figures.figure_text(key, fig['j_per_input_token'])}")
    with col:
        st.metric(
            TILE_LABELS.get(key, fig["label"]),
            tile_value(key, value),
            delta=figures.delta_text(fig),
            delta_color="normal" if fig.get("higher_is_better") else "inverse",
            help="\n\n".join(help_lines),
            border=True,
        )
        if value is None:
            st.caption(str(fig.get("no_data") or "no data"))
        else:
            trust.add(fig.get("trust") or [])
            if trust.differs(fig.get("trust") or []):  # a tile whose data differs from the page's
                st.caption(f"Figures: {', '.join(figures.ordered_labels(fig.get('trust') or []))}")
            if fig.get("basis"):
                st.caption(_sentence(str(fig["basis"])))
            if busy:
                st.caption(busy)
        if value is not None and previous is None and any_previous:
            st.caption(str(fig.get("previous_no_data") or "no previous period to compare"))


def render(sel: common.Selection, fleet_gpus: int | None, trust_slot: Any = None) -> None:
    """The page body (re-run every few seconds for live data with refresh on)."""
    trust = PageTrust(trust_slot)
    try:
        compare.body_or_compared(
            sel.compare,
            sel.compare_note,
            lambda: _body(sel, fleet_gpus, trust),
            lambda other: _compared(sel, other, fleet_gpus, trust),
        )
    finally:
        trust.render()


def _read_overview(sel: common.Selection, fleet_gpus: int | None) -> dict[str, Any]:
    params = _params(sel, fleet_gpus)
    return _read(common.api_url(), tuple(sorted((k, v) for k, v in params.items() if v is not None)))


def compare_rows(a: dict[str, Any], b: dict[str, Any]) -> list[compare.Row]:
    """The tiles' figures of windows A and B (two overview answers) as comparison rows."""
    rows = []
    for key in (k for row in TILE_ROWS for k in row):
        fa = (a.get("figures") or {}).get(key) or {}
        fb = (b.get("figures") or {}).get(key) or {}
        rows.append(
            compare.Row(
                key=key,
                label=TILE_LABELS.get(key, str(fa.get("label") or key)),
                a=fa.get("value"),
                b=fb.get("value"),
                a_text=figures.figure_text(key, fa.get("value")),
                b_text=figures.figure_text(key, fb.get("value")),
                ratio=(fa.get("unit") or fb.get("unit")) == "ratio",
                higher_is_better=bool(fa.get("higher_is_better", fb.get("higher_is_better"))),
            )
        )
    return rows


def _compared(
    sel: common.Selection, other: common.Selection, fleet_gpus: int | None, trust: PageTrust
) -> None:
    """Windows A (the view's) and B (the one compared) side by side: the tiles' figures with the change,
    then each window's GPU-time bar."""
    with common.service_errors():
        a = _read_overview(sel, fleet_gpus)
        b = _read_overview(other, fleet_gpus)
    for body in (a, b):
        main = list((body.get("gpu_time") or {}).get("trust") or [])
        main += [lb for f in (body.get("figures") or {}).values() for lb in f.get("trust") or []]
        trust.add(main, primary=True)
    st.caption(f"A: {common.describe_window(sel)} · B: {common.describe_window(other)}")
    st.markdown(compare.table_html(compare_rows(a, b), "A", "B"), unsafe_allow_html=True)
    left, right = compare.headers(common.describe_window(sel), common.describe_window(other))
    for col, s, body in ((left, sel, a), (right, other, b)):
        with col:
            gpu_time = body.get("gpu_time") or {}
            if body.get("empty") or gpu_time.get("shares") is None:
                common.empty_window("GPU time, tokens or requests", s)
                continue
            bar_labels = gpu_time.get("trust") or []
            st.html(share_bar.gpu_time_html(gpu_time, None, bar_labels if trust.differs(bar_labels) else []))


def _body(sel: common.Selection, fleet_gpus: int | None, trust: PageTrust) -> None:
    with common.service_errors():
        params = _params(sel, fleet_gpus)
        body = _read(common.api_url(), tuple(sorted((k, v) for k, v in params.items() if v is not None)))
    # the page's main labels: its GPU-time's and its tiles'
    main = list((body.get("gpu_time") or {}).get("trust") or [])
    main += [lb for f in (body.get("figures") or {}).values() for lb in f.get("trust") or []]
    trust.add(main, primary=True)
    with common.service_errors():  # about the data set, whatever the window holds
        recommendation_headline(sel, trust)
    if body.get("empty"):
        common.empty_window("GPU time, tokens or requests", sel)
        return
    tiles = body["figures"]
    w = body.get("window") or {}
    if not sel.simulated and w.get("end_s") and body.get("computed_at_s"):
        st.caption(
            common.plain_md(
                f"Figures of {_utc(w['start_s'])} – {_utc(w['end_s'])} UTC, computed {_utc(body['computed_at_s'])} UTC"
            )
        )
    money = body.get("money") or {}
    if money.get("sentence"):
        # the waste as measured, by its own name: not what a change is known to recover at the SLOs
        st.markdown(f"**{WASTE_LABEL}** {common.text_md(money['sentence'])}")
    # the GPU-time bar first, under the sentence it draws (above the fold at 1280 × 800), then the tiles
    gpu_time = body.get("gpu_time") or {}
    st.subheader("Where the GPU-time goes")
    if gpu_time.get("shares") is None:
        st.info(f"GPU-time split: {gpu_time.get('no_data') or 'no data'}", icon=":material/search_off:")
    else:
        chosen = sorted({g.pool for g in sel.gpus if g.pool}) if sel.gpus != sel.all_gpus else None
        # HTML, not Plotly: the landing page never loads the 4.7 MB Plotly bundle for one bar
        bar_labels = gpu_time.get("trust") or []
        st.html(share_bar.gpu_time_html(gpu_time, chosen, bar_labels if trust.differs(bar_labels) else []))
        nodes = params.get("node")
        scope = f"every GPU of node {', '.join(nodes)}" if nodes else "the whole data set"
        st.caption(
            "Stranded: busy, but with the compute (decode) or the memory bandwidth (prefill) idle. "
            f"Host-bound: the GPU waits on the host between iterations. The tiles cover {scope}"
            + (", the bar the pools chosen" if chosen else "")
            + " (the summary behind them is not split by GPU: the GPUs page charts each one)."
        )
    any_previous = any(f.get("previous") is not None for f in tiles.values())
    if not any_previous:  # no delta on any tile: said once, with the reason, not "no data" per tile
        st.caption(no_trend_text(tiles))
    for row in TILE_ROWS:
        cols = st.columns(len(row))
        for col, key in zip(cols, row, strict=True):
            _tile(col, key, tiles[key], any_previous=any_previous, trust=trust)
    notes = body.get("notes") or []
    if notes:
        with st.expander("How these figures were made"):
            for n in notes:
                st.markdown(f"- {n}")


st.title("Overview")  # before the sidebar's reads: the first paint does not wait on them
with common.service_errors():
    sel = common.sidebar()
st.caption(f"{common.describe_window(sel)} · against the previous period of the same length")
trust_slot = st.empty()  # the page's trust badges, under its title (filled by the fragment)
default_fleet = max(1, len({g.key for g in sel.all_gpus}))
fleet = st.columns([1, 3])[0].number_input(
    "Fleet size for the yearly figure, GPUs",
    min_value=1,
    max_value=1_000_000,
    value=default_fleet,
    step=1,
    key=f"fleet_gpus_{sel.dataset}",
    help="The window's cost profile scaled to this many GPUs running for a year.",
)


@st.fragment(run_every=sel.refresh_every_s)
def _live() -> None:
    render(sel, int(fleet), trust_slot)


_live()
