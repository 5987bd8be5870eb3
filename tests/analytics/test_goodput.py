"""Goodput search on known latency curves, attainment of a run, and `phaselens goodput` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analytics.goodput import (
    Measurement,
    attainment_of,
    find_goodput,
    format_result,
    load_report_attainment,
)
from analytics.trust import SIMULATED
from analytics.window import AnalyticsError
from phaselens.cli import main
from serving.loadgen import RequestResult, build_report


def knee(rate: float) -> float:
    """A smooth monotone attainment curve: 1 / (1 + (rate / 50)^4); ≥ 0.9 up to 50 / √3 req/s."""
    return 1.0 / (1.0 + (rate / 50.0) ** 4)


GOODPUT_KNEE = 50.0 / math.sqrt(3.0)  # (r/50)^4 = 1/9


def test_smooth_curve_from_below_and_above() -> None:
    for initial in (1.0, 200.0):
        r = find_goodput(knee, initial_rate_rps=initial, rel_tol=0.01, max_evals=40)
        assert r.bounded
        assert GOODPUT_KNEE * 0.99 <= r.goodput_rps <= GOODPUT_KNEE
        assert knee(r.goodput_rps) >= 0.9
        rates = [m.rate_rps for m in r.sweep]
        assert rates == sorted(rates) and r.goodput_rps in rates
        assert not r.trust.notes


def test_step_curve_and_per_gpu() -> None:
    calls: list[float] = []

    def step(rate: float) -> float:
        calls.append(rate)
        return 1.0 if rate <= 37.0 else 0.5

    r = find_goodput(step, initial_rate_rps=4.0, rel_tol=0.02, gpus=4)
    assert 37.0 * 0.98 <= r.goodput_rps <= 37.0
    assert r.goodput_rps_per_gpu == pytest.approx(r.goodput_rps / 4)
    assert calls[:5] == [4.0, 8.0, 16.0, 32.0, 64.0]  # bracketing doubles until a miss
    assert len(calls) == len(set(calls))  # no rate measured twice
    assert r.to_dict()["goodput_rps_per_gpu"] == pytest.approx(r.goodput_rps / 4)


def test_target_is_configurable() -> None:
    r = find_goodput(knee, target=0.5, rel_tol=0.01, max_evals=40)
    assert 50.0 * 0.99 <= r.goodput_rps <= 50.0  # attainment 0.5 at exactly 50


def test_below_the_lowest_rate() -> None:
    r = find_goodput(lambda rate: 0.2, initial_rate_rps=1.0, min_rate_rps=0.25)
    assert r.goodput_rps == 0.0
    assert [m.rate_rps for m in r.sweep] == [0.25, 0.5, 1.0]
    assert any("below the lowest rate" in n for n in r.trust.notes)


def test_above_the_highest_rate() -> None:
    r = find_goodput(lambda rate: 1.0, initial_rate_rps=1.0, max_rate_rps=10.0)
    assert r.goodput_rps == 10.0 and not r.bounded
    assert "≥ 10.000 req/s" in format_result(r)


def test_nan_attainment_is_a_miss_and_measurements_pass_through() -> None:
    def measure(rate: float) -> Measurement:
        a = float("nan") if rate > 20 else 1.0
        return Measurement(rate, a, {"requests": 10})

    r = find_goodput(measure, initial_rate_rps=10.0, rel_tol=0.05)
    assert 19.0 <= r.goodput_rps <= 20.0
    assert all(m.details == {"requests": 10} for m in r.sweep)
    assert json.dumps(r.to_dict())  # NaN → null


def test_every_measured_point_is_in_the_sweep_and_brackets_the_goodput() -> None:
    r = find_goodput(knee, initial_rate_rps=3.0, rel_tol=0.01)
    met = [m.rate_rps for m in r.sweep if m.attainment >= 0.9]
    missed = [m.rate_rps for m in r.sweep if m.attainment < 0.9]
    assert max(met) == r.goodput_rps < min(missed) <= r.goodput_rps * 1.01


def test_max_evals_bounds_the_search() -> None:
    calls: list[float] = []

    def f(rate: float) -> float:
        calls.append(rate)
        return knee(rate)

    r = find_goodput(f, rel_tol=1e-6, max_evals=8)
    assert len(calls) == 8
    assert any("stopped after 8 evaluations" in n for n in r.trust.notes)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": 0.0},
        {"target": 1.5},
        {"min_rate_rps": 0.0},
        {"initial_rate_rps": 5.0, "max_rate_rps": 2.0},
        {"max_rate_rps": math.inf},
        {"rel_tol": 0.0},
        {"max_evals": 1},
        {"gpus": 0},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(AnalyticsError):
        find_goodput(knee, **kwargs)


def test_attainment_of_by_hand() -> None:
    a = attainment_of(
        [0.1, 0.2, 0.9, 0.1, None],
        [0.01, None, 0.01, 0.2, None],
        [True, True, True, True, False],
        slo_ttft_s=0.5,
        slo_tpot_s=0.05,
    )
    assert a == pytest.approx(2 / 5)  # ok+fast; one token; (TTFT miss); (TPOT miss); (failed)
    assert math.isnan(attainment_of([], [], [], slo_ttft_s=1, slo_tpot_s=1))


def test_load_report_attainment() -> None:
    def res(i: int, ttft: float, e2e: float, tokens: int, status: str = "ok") -> RequestResult:
        return RequestResult(
            i, 0.0, 10, tokens, status=status, ttft_s=ttft, e2e_s=e2e, completion_tokens=tokens
        )

    # TPOT = (e2e − ttft) / (tokens − 1): 0.9 / 9 = 0.1 (miss), 0.3 / 10 = 0.03 (meets)
    report = build_report(
        "u", "m", [res(0, 0.1, 1.0, 10), res(1, 0.2, 0.5, 11), res(2, 0.1, 0.2, 0, "error")], 1.0
    )
    m = load_report_attainment(report, slo_ttft_s=0.5, slo_tpot_s=0.05)
    assert m.attainment == pytest.approx(1 / 3)
    assert m.details["requests"] == 3 and m.details["failed"] == 1


# -- the command --------------------------------------------------------------------------------------


def test_goodput_command_on_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "g.json"
    argv = ["goodput", "--layout", "agg:1xh100-sxm", "--model", "llama-3.1-8b"]
    argv += ["--slo-ttft-ms", "200", "--slo-tpot-ms", "20", "--poisson", "8", "--num-requests", "120"]
    argv += ["--rel-tol", "0.1", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("SIMULATED: goodput sweep")
    assert "req/s per GPU [simulated]" in text
    r = json.loads(out.read_text())
    assert r["trust"]["labels"] == [SIMULATED] and r["gpus"] == 1 and r["bounded"]
    sweep = r["sweep"]
    met = [p["rate_rps"] for p in sweep if p["attainment"] >= 0.9]
    missed = [p["rate_rps"] for p in sweep if p["attainment"] < 0.9]
    assert met and missed and r["goodput_rps"] == max(met) < min(missed)
    assert all(p["requests"] == 120 for p in sweep)


def test_goodput_per_gpu_divides_by_the_layouts_gpus(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    argv = ["goodput", "--layout", "agg:2xh100-sxm", "--slo-ttft-ms", "200", "--slo-tpot-ms", "20"]
    argv += ["--poisson", "8", "--num-requests", "60", "--max-evals", "4", "--json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["gpus"] == 2 and r["goodput_rps_per_gpu"] == pytest.approx(r["goodput_rps"] / 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["goodput"], "--layout LAYOUT (simulator) or --url URL"),
        (["goodput", "--layout", "agg:1xh100-sxm", "--url", "http://x"], "one of them"),
        (
            ["goodput", "--layout", "agg:1xh100-sxm", "--slo-ttft-ms", "0"],
            "must be a finite number of milliseconds > 0",
        ),
        (["goodput", "--layout", "nonsense"], "nonsense"),
        (["goodput", "--layout", "agg:1xh100-sxm", "--poisson", "2", "--limit", "5"], "--limit"),
    ],
)
def test_goodput_command_refuses_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_goodput_command_with_an_unreachable_stack(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.serving.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["goodput", "--url", url, "--poisson", "1", "--num-requests", "2", "--max-evals", "2"]) == 1
    assert f"a run failed: {url}" in capsys.readouterr().err


@pytest.mark.slow
def test_goodput_command_against_a_live_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.serving.conftest import start_server, stop_server

    server = start_server("--mode", "aggregated", "--workers", "1", "--max-model-len", "256")
    try:
        out = tmp_path / "live.json"
        argv = ["goodput", "--url", server.url, "--slo-ttft-ms", "60000"]
        argv += ["--slo-tpot-ms", "10000", "--poisson", "2", "--num-requests", "4", "--prompt-tokens", "8"]
        argv += ["--output-tokens", "4", "--max-evals", "2", "--max-rate", "4", "--json", str(out)]
        assert main(argv) == 0
    finally:
        stop_server(server)
    r = json.loads(out.read_text())
    assert r["trust"]["labels"] in (["measured"], ["emulated"], ["emulated", "host-bound"])
    assert len(r["sweep"]) == 2 and all(p["requests"] == 4 for p in r["sweep"])
    assert r["goodput_rps"] == 4.0 and not r["bounded"]  # generous SLOs: every rate meets them
    assert "goodput sweep" in capsys.readouterr().out
