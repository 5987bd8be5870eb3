"""A workload observed from a real store (requests rows a simulated trace left there), synthesized
into a trace, and that trace simulated and observed again: the figures agree within stated bounds."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from analytics.window import AnalyticsError, Window, resolve_window
from analytics.workload import (
    REQUESTS,
    describe_trace,
    observe,
    synthesize_trace,
    workload_drift,
)
from tests.analytics.workload.conftest import RATE_RPS, known_trace, simulate_into


def _observe(db, scenario_id):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return observe(con, resolve_window(con, dataset=scenario_id))
    finally:
        con.close()


def _spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_rate_burstiness_and_lengths_are_recovered_and_poisson_is_told_from_bursty(simulated):
    got = {}
    for name, sim in simulated.items():
        w = _observe(sim.db, sim.scenario_id)
        got[name] = w
        assert w.source == REQUESTS and w.trust.labels == {"simulated"}
        assert w.request_count == len(sim.trace)
        # the window is the scenario's span (the last requests drain after the last arrival): ≤ 5 % low
        assert w.mean_rps == pytest.approx(len(sim.trace) / w.duration_s)
        assert 0.85 * RATE_RPS < w.mean_rps <= len(sim.trace) / sim.trace[-1].arrival_s * 1.001
        prompt = np.array([r.prompt_tokens for r in sim.trace])
        output = np.array([r.output_tokens for r in sim.trace])
        for q, key in ((50, "p50"), (90, "p90"), (99, "p99")):  # the same rows: within 1 %
            assert getattr(w.prompt_tokens, key) == pytest.approx(np.percentile(prompt, q), rel=0.01)
            assert getattr(w.output_tokens, key) == pytest.approx(np.percentile(output, q), rel=0.01)
        # joint, not two marginals: the retained pairs keep the prompt/output correlation
        pairs = np.array(w.lengths.pairs)
        assert len(pairs) == min(2048, len(sim.trace))
        assert _spearman(pairs[:, 0], pairs[:, 1]) == pytest.approx(_spearman(prompt, output), abs=0.1)
        assert w.prefix_reuse_ratio is None and "not known" in w.prefix_reuse_note
    assert 0.85 < got["poisson"].interarrival_cv < 1.15 and 0.85 < got["poisson"].burstiness_cv < 1.15
    assert 0.6 < got["poisson"].dispersion_index < 1.6
    assert 2.2 < got["bursty"].interarrival_cv < 4.0 and 2.2 < got["bursty"].burstiness_cv < 4.0
    assert got["bursty"].gamma_shape < 0.25 and got["bursty"].dispersion_index > 3.0


def test_the_synthesized_trace_simulated_and_observed_again_matches(simulated, tmp_path):
    for name, sim in simulated.items():
        observed = _observe(sim.db, sim.scenario_id)
        trace = synthesize_trace(observed, seed=7)
        assert trace == synthesize_trace(observed, seed=7)  # the same seed, the same trace
        db = tmp_path / f"{name}.duckdb"
        again = _observe(db, simulate_into(trace, db, tmp_path / f"{name}.csv"))
        drift = workload_drift(observed, again)
        assert not drift.stale, drift.reasons
        assert again.mean_rps == pytest.approx(observed.mean_rps, rel=0.15)
        assert again.interarrival_cv == pytest.approx(observed.interarrival_cv, rel=0.25)
        assert again.prompt_tokens.p50 == pytest.approx(observed.prompt_tokens.p50, rel=0.1)
        assert again.output_tokens.p90 == pytest.approx(observed.output_tokens.p90, rel=0.15)
        pairs = np.array([(r.prompt_tokens, r.output_tokens) for r in trace])
        assert _spearman(pairs[:, 0], pairs[:, 1]) > 0.4  # the joint survives synthesis


def test_drift_same_workload_is_not_stale_doubled_rate_or_longer_prompts_are(simulated):
    sim = simulated["poisson"]
    observed = _observe(sim.db, sim.scenario_id)
    start = observed.start_s
    same = describe_trace(known_trace(1.0, seed=11), start_s=start, duration_s=300.0)
    d = workload_drift(observed, same)
    assert not d.stale and d.score < 0.5, d.reasons

    doubled = describe_trace(synthesize_trace(observed, rate_scale=2.0, seed=3), start_s=start)
    d = workload_drift(observed, doubled)
    assert d.stale and d.distances["rate"] == pytest.approx(1.0, abs=0.1)
    assert any("mean rate" in r and "2.0" in r for r in d.reasons), d.reasons

    longer = describe_trace(known_trace(1.0, seed=12, prompt_scale=2.0), start_s=start, duration_s=300.0)
    d = workload_drift(observed, longer)
    assert d.stale and d.distances["prompt"] == pytest.approx(1.0, abs=0.15)
    assert d.distances["rate"] < 0.2 and d.distances["output"] < 0.15

    bursty = _observe(simulated["bursty"].db, simulated["bursty"].scenario_id)
    d = workload_drift(observed, bursty)
    assert d.stale and d.distances["burstiness"] > 1.0


def test_bad_input_gets_a_clear_error(simulated):
    sim = simulated["poisson"]
    con = duckdb.connect(str(sim.db), read_only=True)
    try:
        with pytest.raises(AnalyticsError, match="nothing to observe in the window"):
            observe(con, Window(1_000_000_000.0, 1_000_003_600.0))  # live, nothing then
        with pytest.raises(AnalyticsError, match="no requests arrived in the window"):
            observe(con, Window(1_000_000_000.0, 1_000_003_600.0), source="requests")
        with pytest.raises(AnalyticsError, match="unknown data set 'nope'"):
            resolve_window(con, dataset="nope")
        with pytest.raises(AnalyticsError, match="unknown workload source 'logs'"):
            observe(con, resolve_window(con, dataset=sim.scenario_id), source="logs")
        w = observe(con, resolve_window(con, dataset=sim.scenario_id))
    finally:
        con.close()
    for kwargs in ({"duration_s": 0.0}, {"rate_scale": -1.0}, {"duration_s": float("nan")}):
        with pytest.raises(ValueError, match="must be a finite number > 0"):
            synthesize_trace(w, **kwargs)
    with pytest.raises(ValueError, match="more than 2,000,000"):
        synthesize_trace(w, rate_scale=1e5)
    with pytest.raises(AnalyticsError, match="no requests"):
        describe_trace([])


def test_a_live_window_reads_the_live_nodes_only(tmp_path):
    """Live request rows (as the collector stores the bundled router's) next to a scenario's: the live
    window observes the live ones, labelled measured; a node filter narrows it."""
    import time

    from collector.store import Store

    now = time.time()
    trace = known_trace(1.0, seed=41)[:600]
    rows = [
        {
            "node": node,
            "source": "router",
            "request_id": f"{node}-{i}",
            "arrival_s": now - 400 + r.arrival_s,
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "status": "ok",
        }
        for node in ("box-1", "sim:other")
        for i, r in enumerate(trace)
    ]
    rows.append(
        {"node": "box-2", "source": "router", "request_id": "x", "arrival_s": now - 10, "status": "error"}
    )
    db = tmp_path / "live.duckdb"
    with Store.open(db) as store:
        store.append("requests", rows)
        store.flush()
    con = duckdb.connect(str(db), read_only=True)
    try:
        w = observe(con, resolve_window(con, since_s=600.0))
        one = observe(con, resolve_window(con, since_s=600.0, nodes=["box-1"]))
    finally:
        con.close()
    assert w.request_count == len(trace) + 1 and w.trust.labels == {
        "measured"
    }  # the failed one is an arrival
    assert any("without prompt or output tokens" in n for n in w.trust.notes)
    assert one.request_count == len(trace) and not one.trust.notes
    assert one.prompt_tokens.p50 == pytest.approx(np.percentile([r.prompt_tokens for r in trace], 50))
