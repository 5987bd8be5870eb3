"""Request traces for the load generator: Azure LLM inference trace CSVs and synthetic Poisson arrivals.

A trace is a list of :class:`TraceRequest` sorted by arrival time, with ``arrival_s`` in seconds
relative to the start of the replay. The Azure Public Dataset traces (``TIMESTAMP,ContextTokens,
GeneratedTokens``) are read by :func:`load_azure_trace`; a slice of the 2023 conversation trace is
vendored (see ``serving/data/README.md`` for its CC-BY 4.0 attribution).
"""

from __future__ import annotations

import csv
import datetime as dt
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AZURE_COLUMNS",
    "SHARED_TRACE",
    "ClippedTrace",
    "TraceRequest",
    "clip_trace",
    "load_azure_trace",
    "load_azure_trace_clipped",
    "parse_timestamp_ns",
    "poisson_trace",
    "scale_arrivals",
    "vendored_trace_path",
]

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""Columns an Azure LLM inference trace CSV must have (others are ignored)."""

SHARED_TRACE = Path("/work/shared/data/azure_llm_inference_2023_conv.csv")
"""The full Azure 2023 conversation trace where this project's machines keep it (not vendored; the
benches and the external validation use it when present, else :func:`vendored_trace_path`)."""

_TIMESTAMP_RE = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:Z|[+-]00:?00)?$"
)
_NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace: when it arrives and how many prompt and output tokens it has."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class ClippedTrace:
    """A trace after clipping: the requests and how many of them had a token count clipped."""

    requests: list[TraceRequest]
    clipped: int
    clipped_prompt: int
    clipped_output: int


def vendored_trace_path() -> Path:
    """Path of the vendored slice of the Azure 2023 conversation trace (first 2,000 rows)."""
    return Path(__file__).resolve().parent / "data" / "azure_conv_2023_slice.csv"


def load_azure_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> list[TraceRequest]:
    """Read an Azure LLM inference trace CSV into a replayable trace.

    Steps, in order: parse every row (a bad row raises ``ValueError`` naming the file, the line and
    the problem); make times relative to the first row; keep the window ``[start_s, start_s +
    duration_s)`` of *trace* time and rebase it so ``start_s`` is 0; keep the first ``limit``
    requests; multiply arrival times by ``time_scale / rate_scale`` (``time_scale=0.1`` replays 10x
    faster, ``rate_scale=2`` sends twice the request rate); clip token counts to the maxima given.
    Use :func:`load_azure_trace_clipped` to also learn how many requests were clipped.
    """
    return load_azure_trace_clipped(
        path,
        time_scale=time_scale,
        rate_scale=rate_scale,
        limit=limit,
        start_s=start_s,
        duration_s=duration_s,
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
    ).requests


def load_azure_trace_clipped(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> ClippedTrace:
    """Like :func:`load_azure_trace`, but return the clipped counts along with the requests."""
    _check_window(start_s=start_s, duration_s=duration_s, limit=limit)
    rows = _read_azure_rows(Path(path))
    requests = _window(rows, start_s=start_s, duration_s=duration_s)
    if limit is not None:
        requests = requests[:limit]
    requests = scale_arrivals(requests, time_scale=time_scale, rate_scale=rate_scale)
    return clip_trace(requests, max_prompt_tokens=max_prompt_tokens, max_output_tokens=max_output_tokens)


def scale_arrivals(
    requests: Iterable[TraceRequest], *, time_scale: float = 1.0, rate_scale: float = 1.0
) -> list[TraceRequest]:
    """Multiply every arrival time by ``time_scale / rate_scale`` (both must be > 0)."""
    for name, value in (("time_scale", time_scale), ("rate_scale", rate_scale)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    factor = time_scale / rate_scale
    return [
        TraceRequest(r.arrival_s * factor, r.prompt_tokens, r.output_tokens) if factor != 1.0 else r
        for r in requests
    ]


def clip_trace(
    requests: Iterable[TraceRequest],
    *,
    max_prompt_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> ClippedTrace:
    """Clip prompt/output token counts to the maxima given (``None``: no limit); count the clipped."""
    for name, value in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value!r}")
    out: list[TraceRequest] = []
    clipped = clipped_prompt = clipped_output = 0
    for r in requests:
        prompt = r.prompt_tokens if max_prompt_tokens is None else min(r.prompt_tokens, max_prompt_tokens)
        output = r.output_tokens if max_output_tokens is None else min(r.output_tokens, max_output_tokens)
        clipped_prompt += prompt != r.prompt_tokens
        clipped_output += output != r.output_tokens
        if prompt != r.prompt_tokens or output != r.output_tokens:
            clipped += 1
            r = TraceRequest(r.arrival_s, prompt, output)
        out.append(r)
    return ClippedTrace(out, clipped, clipped_prompt, clipped_output)


def poisson_trace(
    rate_rps: float,
    n: int,
    *,
    prompt_tokens: int | tuple[int, int] = (32, 512),
    output_tokens: int | tuple[int, int] = (16, 128),
    seed: int = 0,
) -> list[TraceRequest]:
    """``n`` synthetic requests with Poisson arrivals at ``rate_rps`` (the first at 0 s).

    Token counts are a fixed int or drawn uniformly from an inclusive ``(min, max)`` range.
    The same ``seed`` always gives the same trace.
    """
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be > 0, got {rate_rps!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n!r}")
    p_lo, p_hi = _token_range("prompt_tokens", prompt_tokens)
    o_lo, o_hi = _token_range("output_tokens", output_tokens)
    rng = random.Random(seed)
    out: list[TraceRequest] = []
    t = 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate_rps)
        out.append(TraceRequest(t, rng.randint(p_lo, p_hi), rng.randint(o_lo, o_hi)))
    return out


def _token_range(name: str, value: int | Sequence[int]) -> tuple[int, int]:
    """Normalise an int or (min, max) token spec and check it."""
    if isinstance(value, int):
        lo = hi = value
    else:
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a (min, max) pair, got {value!r}")
        lo, hi = int(value[0]), int(value[1])
    if lo < 1 or hi < lo:
        raise ValueError(f"{name} must satisfy 1 <= min <= max, got {value!r}")
    return lo, hi


def _check_window(*, start_s: float, duration_s: float | None, limit: int | None) -> None:
    """Validate the window/limit arguments of the loader."""
    if not start_s >= 0:
        raise ValueError(f"start_s must be >= 0, got {start_s!r}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 or None, got {duration_s!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit!r}")


def _window(rows: list[TraceRequest], *, start_s: float, duration_s: float | None) -> list[TraceRequest]:
    """Keep rows in ``[start_s, start_s + duration_s)`` and shift them so ``start_s`` becomes 0."""
    end_s = float("inf") if duration_s is None else start_s + duration_s
    if start_s == 0 and duration_s is None:
        return rows
    return [
        TraceRequest(r.arrival_s - start_s, r.prompt_tokens, r.output_tokens)
        for r in rows
        if start_s <= r.arrival_s < end_s
    ]


def _read_azure_rows(path: Path) -> list[TraceRequest]:
    """Parse and validate every data row; arrivals relative to the first row."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected header {','.join(AZURE_COLUMNS)}")
        cols = _column_indices(path, [h.strip() for h in header])
        out: list[TraceRequest] = []
        first_ns = prev_ns = 0
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            ts_ns, prompt, output = _parse_row(path, reader.line_num, row, cols)
            if not out:
                first_ns = prev_ns = ts_ns
            elif ts_ns < prev_ns:
                raise ValueError(
                    f"{path}:{reader.line_num}: TIMESTAMP {row[cols[0]].strip()!r} is earlier than "
                    "the row before it; the trace must be sorted by time"
                )
            prev_ns = ts_ns
            out.append(TraceRequest((ts_ns - first_ns) / _NS_PER_S, prompt, output))
    return out


def _column_indices(path: Path, header: list[str]) -> tuple[int, int, int]:
    """Positions of the required columns in the header."""
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{path}:1: header {','.join(header)!r} lacks column(s) {', '.join(missing)}; "
            f"expected {','.join(AZURE_COLUMNS)}"
        )
    ts, ctx, gen = (header.index(c) for c in AZURE_COLUMNS)
    return ts, ctx, gen


def _parse_row(path: Path, line: int, row: list[str], cols: tuple[int, int, int]) -> tuple[int, int, int]:
    """Parse one data row into (timestamp ns, prompt tokens, output tokens)."""
    if len(row) <= max(cols):
        raise ValueError(f"{path}:{line}: expected at least {max(cols) + 1} fields, got {len(row)}: {row!r}")
    ts_text = row[cols[0]].strip()
    try:
        ts_ns = parse_timestamp_ns(ts_text)
    except ValueError as e:
        raise ValueError(f"{path}:{line}: bad TIMESTAMP {ts_text!r}: {e}") from None
    prompt = _parse_count(path, line, "ContextTokens", row[cols[1]])
    output = _parse_count(path, line, "GeneratedTokens", row[cols[2]])
    return ts_ns, prompt, output


def _parse_count(path: Path, line: int, column: str, text: str) -> int:
    """Parse a non-negative integer token count."""
    text = text.strip()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{path}:{line}: {column} {text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{path}:{line}: {column} {value} is negative")
    return value


def parse_timestamp_ns(text: str) -> int:
    """Parse ``YYYY-MM-DD HH:MM:SS[.fffffff]`` (UTC, up to 9 fractional digits) to ns since the epoch."""
    m = _TIMESTAMP_RE.match(text)
    if m is None:
        raise ValueError("expected 'YYYY-MM-DD HH:MM:SS.fffffff'")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = m.group(7) or ""
    try:
        moment = dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC)
    except ValueError as e:
        raise ValueError(str(e)) from None
    whole_s = int(moment.timestamp())
    return whole_s * _NS_PER_S + int(frac.ljust(9, "0") or "0")
