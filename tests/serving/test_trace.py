"""Tests for serving.trace: Azure trace CSV reading, scaling, windowing, clipping, Poisson traces."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import pytest

from serving.trace import (
    SHARED_TRACE,
    TraceRequest,
    clip_trace,
    load_azure_trace,
    load_azure_trace_clipped,
    parse_timestamp_ns,
    poisson_trace,
    scale_arrivals,
    vendored_trace_path,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SMALL = (
    HEADER + "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2224670,879,55\n"
    "2023-11-16 18:15:51.3910170,91,16\n"
    "2023-11-16 18:15:56.6805900,3000,700\n"
)


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    """Write a CSV into tmp_path and return its path."""
    path = tmp_path / name
    path.write_text(text, newline="")
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return write(tmp_path, SMALL)


# ------------------------------------------------------------------------------------------ parsing


def test_parses_seven_fractional_digits_relative_to_first_row(small: Path) -> None:
    reqs = load_azure_trace(small)
    assert [r.prompt_tokens for r in reqs] == [374, 396, 879, 91, 3000]
    assert [r.output_tokens for r in reqs] == [44, 109, 55, 16, 700]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert reqs[2].arrival_s == pytest.approx(4.541877, abs=1e-9)
    assert reqs[4].arrival_s == pytest.approx(10.0, abs=1e-9)


def test_parse_timestamp_ns_precision() -> None:
    a = parse_timestamp_ns("2023-11-16 18:15:46.6805900")
    b = parse_timestamp_ns("2023-11-16 18:15:46.6805901")
    assert b - a == 100  # one 7th-digit unit is 100 ns
    assert parse_timestamp_ns("1970-01-01 00:00:01") == 1_000_000_000
    assert parse_timestamp_ns("1970-01-02T00:00:00.5") == 86_400_500_000_000
    with pytest.raises(ValueError):
        parse_timestamp_ns("2023-13-01 00:00:00.0")


def test_extra_columns_other_order_blank_lines_and_crlf(tmp_path: Path) -> None:
    text = (
        "GeneratedTokens,Extra,TIMESTAMP,ContextTokens\r\n"
        "5,x,2024-05-10 00:00:00.0000000,10\r\n"
        "\r\n"
        "6,y,2024-05-10 00:00:01.5000000,20\r\n"
    )
    reqs = load_azure_trace(write(tmp_path, text))
    assert reqs == [TraceRequest(0.0, 10, 5), TraceRequest(1.5, 20, 6)]


def test_header_with_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(("\ufeff" + SMALL).encode("utf-8"))
    assert len(load_azure_trace(path)) == 5


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2023-11-16 18:15:47.1,abc,3", r"bad\.csv:3: ContextTokens 'abc' is not an integer"),
        ("2023-11-16 18:15:47.1,3,-1", r"bad\.csv:3: GeneratedTokens -1 is negative"),
        ("2023-11-16 18:15:47.1,3", r"bad\.csv:3: expected at least 3 fields, got 2"),
        ("16/11/2023 18:15:47,3,4", r"bad\.csv:3: bad TIMESTAMP '16/11/2023 18:15:47'"),
        ("2023-11-16 25:15:47.1,3,4", r"bad\.csv:3: bad TIMESTAMP .*hour"),
        ("2023-11-16 18:15:40.0,3,4", r"bad\.csv:3: TIMESTAMP .* earlier than the row before"),
    ],
)
def test_bad_row_names_file_line_and_problem(tmp_path: Path, line: str, expected: str) -> None:
    path = write(tmp_path, HEADER + "2023-11-16 18:15:46.6805900,374,44\n" + line + "\n", "bad.csv")
    with pytest.raises(ValueError, match=expected):
        load_azure_trace(path)


def test_bad_header_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"h\.csv:1: .*lacks column\(s\) GeneratedTokens"):
        load_azure_trace(write(tmp_path, "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,1\n", "h.csv"))
    with pytest.raises(ValueError, match=r"e\.csv: empty file"):
        load_azure_trace(write(tmp_path, "", "e.csv"))


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_azure_trace(tmp_path / "nope.csv")


# ------------------------------------------------------------------------------ scaling & windows


def test_time_scale_and_rate_scale(small: Path) -> None:
    base = [r.arrival_s for r in load_azure_trace(small)]
    fast = [r.arrival_s for r in load_azure_trace(small, time_scale=0.1)]
    double_rate = [r.arrival_s for r in load_azure_trace(small, rate_scale=2.0)]
    both = [r.arrival_s for r in load_azure_trace(small, time_scale=3.0, rate_scale=1.5)]
    assert fast == pytest.approx([b * 0.1 for b in base])
    assert double_rate == pytest.approx([b / 2 for b in base])
    assert both == pytest.approx([b * 2 for b in base])
    assert [r.prompt_tokens for r in load_azure_trace(small, time_scale=0.1)] == [374, 396, 879, 91, 3000]


@pytest.mark.parametrize("kwargs", [{"time_scale": 0}, {"rate_scale": -1.0}, {"time_scale": float("nan")}])
def test_bad_scale_rejected(small: Path, kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        load_azure_trace(small, **kwargs)


def test_scale_arrivals_keeps_tokens() -> None:
    reqs = [TraceRequest(1.0, 5, 6), TraceRequest(3.0, 7, 8)]
    assert scale_arrivals(reqs, time_scale=0.5) == [TraceRequest(0.5, 5, 6), TraceRequest(1.5, 7, 8)]


def test_window_and_limit(small: Path) -> None:
    window = load_azure_trace(small, start_s=4.0, duration_s=1.0)
    assert [r.prompt_tokens for r in window] == [396, 879, 91]
    assert window[0].arrival_s == pytest.approx(0.314579)  # rebased so start_s is 0
    assert [r.prompt_tokens for r in load_azure_trace(small, limit=2)] == [374, 396]
    limited_window = load_azure_trace(small, start_s=4.0, limit=1, time_scale=0.5)
    assert limited_window == [TraceRequest(pytest.approx(0.1572895), 396, 109)]
    for kwargs in ({"limit": 0}, {"start_s": -1.0}, {"duration_s": 0.0}):
        with pytest.raises(ValueError):
            load_azure_trace(small, **kwargs)


# ------------------------------------------------------------------------------------------ clipping


def test_clipping_counts(small: Path) -> None:
    loaded = load_azure_trace_clipped(small, max_prompt_tokens=400, max_output_tokens=100)
    assert [r.prompt_tokens for r in loaded.requests] == [374, 396, 400, 91, 400]
    assert [r.output_tokens for r in loaded.requests] == [44, 100, 55, 16, 100]
    assert (loaded.clipped, loaded.clipped_prompt, loaded.clipped_output) == (3, 2, 2)
    assert load_azure_trace(small, max_prompt_tokens=400, max_output_tokens=100) == loaded.requests
    assert load_azure_trace_clipped(small).clipped == 0


def test_clip_trace_validates() -> None:
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        clip_trace([TraceRequest(0, 1, 1)], max_prompt_tokens=0)


# ------------------------------------------------------------------------------------------ Poisson


def test_poisson_trace_deterministic_and_in_range() -> None:
    a = poisson_trace(10.0, 2000, prompt_tokens=(5, 50), output_tokens=7, seed=3)
    assert a == poisson_trace(10.0, 2000, prompt_tokens=(5, 50), output_tokens=7, seed=3)
    assert a != poisson_trace(10.0, 2000, prompt_tokens=(5, 50), output_tokens=7, seed=4)
    assert len(a) == 2000
    assert a[0].arrival_s == 0.0
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))
    assert all(5 <= r.prompt_tokens <= 50 and r.output_tokens == 7 for r in a)
    assert {r.prompt_tokens for r in a} >= {5, 50}
    mean_gap = a[-1].arrival_s / (len(a) - 1)
    assert mean_gap == pytest.approx(0.1, rel=0.1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_rps": 0.0},
        {"n": -1},
        {"prompt_tokens": (10, 5)},
        {"output_tokens": 0},
        {"prompt_tokens": (1, 2, 3)},
    ],
)
def test_poisson_trace_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"rate_rps": 1.0, "n": 3} | kwargs
    with pytest.raises(ValueError):
        poisson_trace(**args)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ vendored


def test_vendored_slice() -> None:
    path = vendored_trace_path()
    assert path.is_file()
    reqs = load_azure_trace(path)
    assert len(reqs) == 2000
    assert reqs[0] == TraceRequest(0.0, 374, 44)
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(reqs))
    assert 420 < reqs[-1].arrival_s < 430
    readme = (path.parent / "README.md").read_text()
    for needle in ("CC-BY 4.0", "Splitwise", "ISCA", "Azure Public Dataset", "2,000", "unmodified"):
        assert needle in readme


@pytest.mark.skipif(not SHARED_TRACE.is_file(), reason="shared Azure trace not present")
def test_vendored_slice_is_first_2000_rows_unmodified() -> None:
    with vendored_trace_path().open(newline="") as f:
        vendored = list(csv.reader(f))
    with SHARED_TRACE.open(newline="") as f:
        original = list(itertools.islice(csv.reader(f), 2001))
    assert vendored == original
