"""The options that choose a run's requests, shared by ``phaselens load``, ``simulate`` and
``goodput``: a trace to replay (the Azure CSV, scaled, windowed, clipped) or synthetic Poisson
arrivals (:func:`add_trace_arguments`, :func:`trace_option_error`, :func:`build_trace`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.trace import (
    TraceRequest,
    clip_trace,
    load_azure_trace_clipped,
    poisson_trace,
    vendored_trace_path,
)


def _number(kind: type, *, minimum: float, strict: bool, what: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses ``kind`` and enforces a lower bound."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (value <= minimum) if strict else (value < minimum):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_POS_FLOAT = _number(float, minimum=0, strict=True, what="a number > 0")
_NONNEG_FLOAT = _number(float, minimum=0, strict=False, what="a number >= 0")
_POS_INT = _number(int, minimum=1, strict=False, what="an integer >= 1")


def _token_spec(text: str) -> int | tuple[int, int]:
    """Parse ``N`` or ``MIN:MAX`` token counts."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] >= 1:
        return parts[0]
    if len(parts) == 2 and 1 <= parts[0] <= parts[1]:
        return parts[0], parts[1]
    raise argparse.ArgumentTypeError(f"expected N or MIN:MAX with 1 <= MIN <= MAX, got {text!r}")


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options that choose the requests (a trace or Poisson arrivals); see :func:`build_trace`."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="PATH",
        help="Azure LLM inference trace CSV to replay (default: the vendored 2,000-request slice)",
    )
    src.add_argument(
        "--poisson", type=_POS_FLOAT, default=None, metavar="RATE", help="synthetic Poisson arrivals, req/s"
    )
    # (flag, type, metavar, help) of the options that default to None: unset, as trace_option_error reads them
    optional = (
        ("--num-requests", _POS_INT, "N", "with --poisson: requests (100)"),
        ("--prompt-tokens", _token_spec, "N|MIN:MAX", "with --poisson (32:512)"),
        ("--output-tokens", _token_spec, "N|MIN:MAX", "with --poisson (16:128)"),
        ("--time-scale", _POS_FLOAT, "X", "trace: multiply times (0.1 = 10x faster)"),
        ("--rate-scale", _POS_FLOAT, "X", "trace: multiply the request rate"),
        ("--start", _NONNEG_FLOAT, "S", "trace: skip the first S s"),
        ("--duration", _POS_FLOAT, "S", "trace: replay S s of it"),
        ("--limit", _POS_INT, "N", "trace: first N requests only"),
        ("--max-prompt-tokens", _POS_INT, "N", "clip prompt lengths"),
        ("--max-output-tokens", _POS_INT, "N", "clip output lengths"),
    )
    for flag, kind, metavar, text in optional:
        parser.add_argument(flag, type=kind, default=None, metavar=metavar, help=text)
    parser.add_argument("--seed", metavar="N", type=int, default=0, help="prompt text and Poisson seed (0)")


_TRACE_ONLY = ("time_scale", "rate_scale", "start", "duration", "limit")
_POISSON_ONLY = ("num_requests", "prompt_tokens", "output_tokens")


def trace_option_error(args: argparse.Namespace) -> str | None:
    """A message for options that do not fit together, else None."""
    if args.poisson is not None:
        bad = [n for n in _TRACE_ONLY if getattr(args, n) is not None]
        if bad:
            return f"{_flags(bad)} apply to a trace, not to --poisson (use --num-requests)"
    else:
        bad = [n for n in _POISSON_ONLY if getattr(args, n) is not None]
        if bad:
            return f"{_flags(bad)} apply to --poisson only (use --limit/--duration with a trace)"
        if args.trace is not None and not args.trace.is_file():
            return f"--trace {args.trace}: no such file"
    return None


def _flags(names: list[str]) -> str:
    """Option names as flags."""
    return ", ".join("--" + n.replace("_", "-") for n in names)


def build_trace(args: argparse.Namespace) -> tuple[list[TraceRequest], int, str]:
    """The requests to send, the clipped count and a description of the source."""
    if args.poisson is not None:
        n = args.num_requests or 100
        reqs = poisson_trace(
            args.poisson,
            n,
            prompt_tokens=args.prompt_tokens or (32, 512),
            output_tokens=args.output_tokens or (16, 128),
            seed=args.seed,
        )
        clipped = clip_trace(
            reqs, max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
        )
        return clipped.requests, clipped.clipped, f"Poisson {args.poisson:g} req/s, {n} requests"
    path = args.trace or vendored_trace_path()
    loaded = load_azure_trace_clipped(
        path,
        time_scale=args.time_scale or 1.0,
        rate_scale=args.rate_scale or 1.0,
        limit=args.limit,
        start_s=args.start or 0.0,
        duration_s=args.duration,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
    )
    return loaded.requests, loaded.clipped, f"trace {path}"
