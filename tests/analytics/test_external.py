"""External-fleet attribution: hand-computed small fleets scraped through the collector's own
dcgm-exporter and engine sources into a real store, and the simulator exposed as vLLM + DCGM
against its own truth (the 15-point target of issue 10, item 6)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import duckdb
import pytest

from analytics.external import ExternalAttributionError, external_attribution, nnls
from analytics.external_validation import COMPARED, store_scrapes, validate
from analytics.window import Window
from serving.trace import load_azure_trace, vendored_trace_path

NODE = "node-a"
T0 = 1_800_000_000.0


def gpu_lines(
    index: int, uuid: str, pod: str | None, fields: dict[str, float | None], extra: str = ""
) -> list[str]:
    labels = (
        f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",modelName="NVIDIA H100 80GB HBM3",Hostname="h"'
    )
    if pod:
        labels += f',pod="{pod}",namespace="llm",container="vllm"'
    labels += extra
    return [f"{name}{{{labels}}} {value}" for name, value in fields.items() if value is not None]


def vllm_page(
    iterations: float, prompt: float, generated: float, pod: str | None = None, dynamo: str | None = None
) -> str:
    base = 'engine="0",model_name="m"' + (f',pod="{pod}",namespace="llm"' if pod else "")
    lines = [
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{base}}} {prompt}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{base}}} {generated}",
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{{base},le="+Inf"}} {iterations}',
        f"vllm:iteration_tokens_total_count{{{base}}} {iterations}",
        f"vllm:iteration_tokens_total_sum{{{base}}} {prompt + generated}",
    ]
    if dynamo:
        dl = f'dynamo_component="{dynamo}",dynamo_endpoint="generate",dynamo_namespace="dyn"'
        dl += f',pod="{pod}",namespace="llm"' if pod else ""
        lines += [
            "# TYPE dynamo_component_inflight_requests gauge",
            f"dynamo_component_inflight_requests{{{dl}}} 1",
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Callable[..., duckdb.DuckDBPyConnection]]:
    """``fleet(times, dcgm_page, engine_pages)``: scrape the pages into a store; a cursor on it."""
    cons: list[duckdb.DuckDBPyConnection] = []

    def make(times: Sequence[float], dcgm: Callable[[int], str], engines: dict[str, Callable[[int], str]]):
        path = tmp_path / f"s{len(cons)}.duckdb"
        store_scrapes(path, times, dcgm, engines, node=NODE)
        cons.append(duckdb.connect(str(path), read_only=True))  # as analytics reads a stopped store
        return cons[-1]

    yield make
    for c in cons:
        c.close()


def window(times: Sequence[float]) -> Window:
    return Window(times[0], times[-1] + 1.0)


# --- the work model and the power model, by hand ----------------------------------------------------------

# c_iter 10 ms, c_prompt 1 ms/token, c_gen 2 ms/token over 10 s intervals, a pattern of three:
#   interval 1: 100 iterations, 2000 prompt, 500 generated -> busy 1 + 2 + 1 = 4 s (prefill 2 s)
#   interval 2: 200 iterations, 1000 prompt, 1000 generated -> busy 2 + 1 + 2 = 5 s (prefill 1 s)
#   interval 3: 100 iterations, 0 prompt, 200 generated -> busy 1 + 0 + 0.4 = 1.4 s (prefill 0)
# per pattern: prefill 3 s, decode 7.4 s, idle 19.6 s of 30 s. Power: idle 50 W, prefill 300 W,
# decode 200 W: energy 1300, 1350, 710 J; prefill 900 J, decode 1480 J, idle 980 J of 3360 J.
PATTERN = [((100, 2000, 500), 0.4, 1300.0), ((200, 1000, 1000), 0.5, 1350.0), ((100, 0, 200), 0.14, 710.0)]
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
URL_A = "http://vllm-a:8000/metrics"


def agg_series(repeats: int) -> tuple[list[float], list[tuple[float, ...]], list[float], list[int]]:
    """Sample times, cumulative engine counters, GR-engine activity and energy counter (mJ)."""
    times, cum, gr, mj = [T0], [(0.0, 0.0, 0.0)], [0.0], [5_000_000]
    for i in range(3 * repeats):
        work, busy, joules = PATTERN[i % 3]
        times.append(times[-1] + 10.0)
        cum.append(tuple(c + w for c, w in zip(cum[-1], work, strict=True)))
        gr.append(busy)
        mj.append(mj[-1] + round(joules * 1000))
    return times, cum, gr, mj


def agg_pages(repeats: int, power_w: Sequence[float] | None = None, energy: bool = True):
    times, cum, gr, mj = agg_series(repeats)

    def dcgm(i: int) -> str:
        fields = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr[i]}
        if energy:
            fields["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = mj[i]
        if power_w is not None:
            fields["DCGM_FI_DEV_POWER_USAGE"] = power_w[i]
        return "\n".join(gpu_lines(0, UUID_A, None, fields)) + "\n"

    return times, dcgm, (lambda i: vllm_page(*cum[i]))


AGG_TIMES, agg_dcgm, agg_engine = agg_pages(1)


def test_nnls_keeps_coefficients_non_negative() -> None:
    x = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    assert nnls(x, [2.0, 3.0, 5.0]) == pytest.approx([2.0, 3.0])
    # unconstrained [2.33, -1.33]; with b >= 0: b = 0 and a = (2 + 1) / 2 on the first column alone
    assert nnls(x, [2.0, -1.0, 1.0]) == pytest.approx([1.5, 0.0])


def test_aggregated_engine_split_by_the_fitted_work_model(fleet) -> None:
    times, dcgm, engine = agg_pages(4)  # 12 intervals: enough to fit watts per phase
    con = fleet(times, dcgm, {URL_A: engine})
    res = external_attribution(con, window(times), engine_gpus={URL_A: [UUID_A]})
    g = res.gpu(UUID_A)
    assert (g["pool"], g["method"], g["busy_measure"], g["energy_source"]) == (
        "mixed",
        "engine-metrics",
        "gr_engine_active",
        "counter",
    )
    assert (g["prefill_s"], g["decode_s"], g["idle_s"], g["other_busy_s"]) == pytest.approx(
        (12.0, 29.6, 78.4, 0.0)
    )
    assert g["prefill_share"] + g["decode_share"] + g["idle_share"] + g["other_busy_share"] == pytest.approx(
        1.0
    )
    e = res.engines.set_index("endpoint").loc[URL_A]
    assert (e["c_iter_s"], e["c_prompt_token_s"], e["c_gen_token_s"]) == pytest.approx((0.01, 0.001, 0.002))
    assert (e["iterations"], e["prompt_tokens"], e["generation_tokens"]) == (1600, 12000, 6800)
    assert e["decode_batch_mean"] == pytest.approx(6800 / 1600)
    # energy: the counter's rise, apportioned by the fitted watts, sums to what was measured
    assert g["energy_j"] == pytest.approx(13440.0)
    assert (g["prefill_energy_j"], g["decode_energy_j"], g["idle_energy_j"]) == pytest.approx(
        (3600.0, 5920.0, 3920.0)
    )
    assert g["power_model_w"] == '{"idle": 50.0, "prefill": 300.0, "decode": 200.0, "other_busy": 50.0}'
    assert "estimated" in res.trust.labels and "measured" in res.trust.labels
    assert res.missing == []
    assert res.to_dict()["per_gpu"][0]["gpu"] == UUID_A


def test_few_intervals_do_not_fit_watts_per_phase_and_say_so(fleet) -> None:
    con = fleet(AGG_TIMES, agg_dcgm, {URL_A: agg_engine})  # 3 intervals
    res = external_attribution(con, window(AGG_TIMES), engine_gpus={URL_A: [UUID_A]})
    g = res.gpu(UUID_A)
    assert (g["prefill_s"], g["decode_s"], g["idle_s"]) == pytest.approx((3.0, 7.4, 19.6))  # time still fits
    watts = json.loads(g["power_model_w"])
    assert watts["prefill"] == watts["decode"] > watts["idle"]  # one busy wattage
    iv = res.intervals  # within each interval, busy energy follows busy time
    assert (iv["prefill_energy_j"] * iv["decode_s"]).to_numpy() == pytest.approx(
        (iv["decode_energy_j"] * iv["prefill_s"]).to_numpy()
    )
    parts = sum(g[f"{s}_energy_j"] for s in ("prefill", "decode", "other_busy", "idle"))
    assert parts == pytest.approx(3360.0)
    assert any("too few or too alike intervals" in n for n in res.trust.notes)


def test_sglang_without_a_step_counter_fits_tokens_only(fleet) -> None:
    # SGLang exports prompt/generation token counters but no per-step histogram; busy here is
    # 1 ms per prompt token + 2 ms per generated token: (2000, 500) -> 3 s, (1000, 1000) -> 3 s,
    # (0, 200) -> 0.4 s, four times over: prefill 12 s, decode 13.6 s of 120 s.
    times, cum, _, mj = agg_series(4)
    busy = [0.0] + [(w[1] * 0.001 + w[2] * 0.002) / 10.0 for w in (PATTERN[i % 3][0] for i in range(12))]

    def dcgm(i: int) -> str:
        fields = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": busy[i], "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": mj[i]}
        return "\n".join(gpu_lines(0, UUID_A, None, fields)) + "\n"

    def sglang(i: int) -> str:
        _, prompt, generated = cum[i]
        return (
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}\n'
            "# TYPE sglang:generation_tokens_total counter\n"
            f'sglang:generation_tokens_total{{model_name="m"}} {generated}\n'
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="m"}} 3\n'
        )

    con = fleet(times, dcgm, {"http://sglang-0:30000/metrics": sglang})
    res = external_attribution(con, window(times), engine_gpus={"http://sglang-0:30000/metrics": [UUID_A]})
    g = res.gpu(UUID_A)
    assert (g["method"], g["prefill_s"], g["decode_s"]) == (
        "engine-metrics",
        pytest.approx(12.0),
        pytest.approx(13.6),
    )
    e = res.engines.iloc[0]
    assert (e["engine"], e["c_iter_s"], e["requests_running_mean"]) == ("sglang", 0.0, 3.0)
    assert any("no iteration_tokens_total" in n for n in res.trust.notes)


def test_engine_found_by_the_only_endpoint_on_the_gpus_node(fleet) -> None:
    con = fleet(AGG_TIMES, agg_dcgm, {f"http://{NODE}:8000/metrics": agg_engine})
    res = external_attribution(con, window(AGG_TIMES))
    assert res.gpu(UUID_A)["prefill_s"] == pytest.approx(3.0)
    assert any("only engine scraped on node" in n for n in res.trust.notes)


def test_engine_scraped_on_localhost_is_the_one_of_the_gpus_on_the_collectors_node(fleet) -> None:
    """A collector on the GPUs' machine scraping its engine at localhost: the URL host is never the
    node's name, but both rows carry the collector's node."""
    con = fleet(AGG_TIMES, agg_dcgm, {"http://localhost:8000/metrics": agg_engine})
    res = external_attribution(con, window(AGG_TIMES))
    assert res.gpu(UUID_A)["endpoint"] == "http://localhost:8000/metrics"
    assert res.gpu(UUID_A)["prefill_s"] == pytest.approx(3.0)


def test_energy_integrated_from_power_without_a_counter_and_flagged(fleet) -> None:
    times, dcgm, engine = agg_pages(1, power_w=[100.0, 200.0, 100.0, 300.0], energy=False)
    con = fleet(times, dcgm, {URL_A: engine})
    res = external_attribution(con, window(AGG_TIMES), engine_gpus={URL_A: [UUID_A]})
    g = res.gpu(UUID_A)
    assert g["energy_source"] == "integrated power"
    assert g["energy_j"] == pytest.approx(1500.0 + 1500.0 + 2000.0)  # trapezoids of 10 s
    parts = sum(g[f"{s}_energy_j"] for s in ("prefill", "decode", "other_busy", "idle"))
    assert parts == pytest.approx(g["energy_j"])
    assert any("integrated from power" in n for n in res.trust.notes)


def test_counter_reset_falls_back_to_power_for_that_interval(fleet) -> None:
    times, _, gr, _ = agg_series(1)
    energy = [5_000_000, 6_300_000, 100_000, 810_000]  # the driver reloaded before the third scrape

    def dcgm(i: int) -> str:
        fields = {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr[i],
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy[i],
            "DCGM_FI_DEV_POWER_USAGE": 120.0,
        }
        return "\n".join(gpu_lines(0, UUID_A, None, fields)) + "\n"

    con = fleet(times, dcgm, {URL_A: agg_engine})
    res = external_attribution(con, window(times), engine_gpus={URL_A: [UUID_A]})
    g = res.gpu(UUID_A)
    assert g["energy_j"] == pytest.approx(1300.0 + 1200.0 + 710.0)
    assert g["energy_source"] == "counter,integrated power"
    assert any("resets" in n for n in res.trust.notes)


# --- pools: Dynamo prefill / decode workers ----------------------------------------------------------------

UUID_P = "GPU-pppppppp-0000-0000-0000-000000000001"
UUID_D = "GPU-dddddddd-0000-0000-0000-000000000002"
POOL_GR = {UUID_P: [0.0, 0.2, 0.6, 0.1], UUID_D: [0.0, 0.9, 0.7, 0.8]}


def pool_dcgm(i: int) -> str:
    lines = []
    for idx, (uuid, pod) in enumerate(((UUID_P, "vllm-prefill-0"), (UUID_D, "vllm-decode-0"))):
        gr = POOL_GR[uuid]
        # 60 W idle, 400 W busy: the counter rises by (60 (1 - u) + 400 u) x 10 s per interval
        mj = 1_000_000 + sum((60 * (1 - u) + 400 * u) * 10_000 for u in gr[1 : i + 1])
        fields = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr[i], "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": round(mj)}
        lines += gpu_lines(idx, uuid, pod, fields)
    return "\n".join(lines) + "\n"


def pool_engines() -> dict[str, Callable[[int], str]]:
    return {
        "http://10.0.0.5:8000/metrics": lambda i: vllm_page(
            i, 100 * i, i, pod="vllm-prefill-0", dynamo="prefill"
        ),
        "http://10.0.0.6:8000/metrics": lambda i: vllm_page(
            50 * i, 0, 40 * i, pod="vllm-decode-0", dynamo="backend"
        ),
    }


def test_dynamo_pools_found_from_component_and_pod_labels(fleet) -> None:
    con = fleet(AGG_TIMES, pool_dcgm, pool_engines())
    res = external_attribution(con, window(AGG_TIMES))
    p, d = res.gpu(UUID_P), res.gpu(UUID_D)
    assert (p["pool"], p["method"], p["role_from"]) == ("prefill", "pool", "dynamo component")
    assert (d["pool"], d["method"]) == ("decode", "pool")  # 'backend' beside a prefill component
    assert (p["prefill_s"], p["decode_s"], p["idle_s"]) == pytest.approx((9.0, 0.0, 21.0))
    assert (d["prefill_s"], d["decode_s"], d["idle_s"]) == pytest.approx((0.0, 24.0, 6.0))
    # watts 60 idle / 400 busy: prefill 9 s x 400 W of 9 x 400 + 21 x 60 J
    assert p["prefill_energy_j"] == pytest.approx(3600.0, rel=1e-6)
    assert p["idle_energy_j"] == pytest.approx(1260.0, rel=1e-6)
    pools = res.per_pool.set_index("pool")
    assert pools.loc["decode", "decode_share"] == pytest.approx(0.8)
    assert pools.loc["prefill", "gpus"] == 1


def test_roles_argument_overrides_and_is_checked(fleet) -> None:
    con = fleet(AGG_TIMES, pool_dcgm, pool_engines())
    res = external_attribution(con, window(AGG_TIMES), roles={"vllm-decode-0": "prefill"})
    assert res.gpu(UUID_D)["pool"] == "prefill" and res.gpu(UUID_D)["role_from"] == "given"
    with pytest.raises(ExternalAttributionError, match="role 'verify' is not one of"):
        external_attribution(con, window(AGG_TIMES), roles={"vllm-decode-0": "verify"})
    with pytest.raises(ExternalAttributionError, match="match no GPU"):
        external_attribution(con, window(AGG_TIMES), roles={"vllm-nowhere": "decode"})
    with pytest.raises(ExternalAttributionError, match="no GPU 'GPU-missing'"):
        external_attribution(con, window(AGG_TIMES), engine_gpus={"http://x/metrics": ["GPU-missing"]})


def test_gpu_without_engine_or_role_is_busy_only_and_says_so(fleet) -> None:
    con = fleet(AGG_TIMES, agg_dcgm, {})
    res = external_attribution(con, window(AGG_TIMES))
    g = res.gpu(UUID_A)
    assert (g["method"], g["other_busy_s"], g["prefill_s"]) == ("busy-only", pytest.approx(10.4), 0.0)
    assert any("no engine or role known" in m for m in res.missing)


def test_empty_window_says_what_is_missing(fleet) -> None:
    con = fleet(AGG_TIMES, agg_dcgm, {URL_A: agg_engine})
    res = external_attribution(con, Window(T0 - 1000, T0 - 900))
    assert res.per_gpu.empty and res.missing == ["no GPU samples (two or more per GPU) in the window"]
    assert "estimated" in res.trust.labels


# --- MIG: per-instance activity, the physical GPU's energy once ---------------------------------------------

UUID_M = "GPU-5d4e2a1b-8c3f-4e6a-9b2d-7f1c0e3a6b58"
MIG = (
    ("1", "2g.12gb", "vllm-decode-0", 0.8),
    ("5", "1g.6gb", "vllm-prefill-0", 0.4),
    ("6", "1g.6gb", "", 0.0),
)
MIG_ENERGY_MJ = [900_000_000, 901_000_000, 902_500_000]  # 1000 J, then 1500 J over 10 s


def mig_dcgm(i: int) -> str:
    lines = []
    for gi, profile, pod, gr in MIG:
        extra = f',GPU_I_PROFILE="{profile}",GPU_I_ID="{gi}"'
        fields = {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr,
            "DCGM_FI_DEV_POWER_USAGE": 120.0,  # repeated on every instance, as the exporter does
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": MIG_ENERGY_MJ[i],
        }
        lines += gpu_lines(0, UUID_M, pod or None, fields, extra)
    return "\n".join(lines) + "\n"


def test_mig_instances_have_their_own_time_and_share_the_gpu_energy_once(fleet) -> None:
    times = AGG_TIMES[:3]
    con = fleet(times, mig_dcgm, {})
    res = external_attribution(
        con, window(times), roles={"vllm-decode-0": "decode", "vllm-prefill-0": "prefill"}
    )
    rows = res.per_gpu.set_index("gpu")
    assert sorted(rows.index) == [f"{UUID_M}/gi1", f"{UUID_M}/gi5", f"{UUID_M}/gi6"]
    assert rows["energy_j"].sum() == pytest.approx(2500.0)  # not 3 x 2500
    # floor 100 W (the lowest interval) split by slices 2:1:1, the rest (500 J) by slices x busy
    assert rows.loc[f"{UUID_M}/gi1", "energy_j"] == pytest.approx(500 + 500 + 400)
    assert rows.loc[f"{UUID_M}/gi5", "energy_j"] == pytest.approx(250 + 250 + 100)
    assert rows.loc[f"{UUID_M}/gi6", "energy_j"] == pytest.approx(500)
    assert rows.loc[f"{UUID_M}/gi1", "decode_s"] == pytest.approx(16.0)
    assert rows.loc[f"{UUID_M}/gi5", "prefill_s"] == pytest.approx(8.0)
    assert rows.loc[f"{UUID_M}/gi1", "mig_profile"] == "2g.12gb"
    assert any("counted once" in n for n in res.trust.notes)


# --- the simulator as an external fleet: error against its truth --------------------------------------------


@pytest.mark.parametrize(
    ("layout", "period_s", "duration_s"),
    [
        ("agg:1xh100-sxm", 1, 120.0),
        ("1p1d:h100-sxm", 1, 120.0),
        ("agg:1xh100-sxm", 30, None),  # the vendored slice's 424 s: 14 scrape intervals
        ("1p1d:h100-sxm", 30, None),
    ],
)
def test_estimate_within_15_points_of_the_simulators_truth(
    layout: str, period_s: int, duration_s: float | None
) -> None:
    requests = load_azure_trace(vendored_trace_path(), duration_s=duration_s)  # Azure 2023 conversation
    cmp, est, scraped = validate(layout, requests, period_s=period_s)
    assert len(cmp) == (1 if layout.startswith("agg") else 2)
    assert "simulated" in est.trust.labels and "estimated" in est.trust.labels
    assert scraped.rows["gpu_samples"] > 0 and scraped.rows["engine_metrics"] > 0
    assert set(cmp["method"]) == ({"engine-metrics"} if layout.startswith("agg") else {"pool"})
    for row in cmp.to_dict("records"):
        for c in COMPARED:
            assert abs(row[f"{c}_err_pts"]) <= 15.0, (layout, period_s, row["gpu"], c, row)
    assert cmp["prefill_share_true"].max() > 0.05  # a case with real prefill work, not a trivial one
    assert cmp["idle_share_true"].min() > 0.05
    # reconciliation: the attributed energy is the measured energy; the time fractions sum to 1
    per_gpu = est.per_gpu
    parts = sum(per_gpu[f"{s}_energy_j"] for s in ("prefill", "decode", "other_busy", "idle"))
    assert (parts - per_gpu["energy_j"]).abs().max() < 1e-6 * per_gpu["energy_j"].max()
    shares = sum(per_gpu[f"{s}_share"] for s in ("prefill", "decode", "other_busy", "idle"))
    assert shares.to_numpy() == pytest.approx(1.0)
