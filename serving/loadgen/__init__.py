"""Open-loop HTTP load generator for OpenAI-compatible completion servers.

Each :class:`~serving.trace.TraceRequest` is sent at its arrival time (never earlier, whatever the
server's state: open loop) as a streaming ``POST /v1/completions`` with ``ignore_eos`` so that the
server generates exactly ``output_tokens`` tokens. Per request it measures time to first token
(send → first token chunk), every inter-token latency and end-to-end latency, and reads the
token counts from the final ``usage`` chunk. :func:`run_load` returns a :class:`LoadReport`;
:func:`format_report` renders it; :func:`add_load_arguments` / :func:`main_load` are the
``phaselens load`` subcommand.

The parts, each importable from here:

- ``report``: the per-request results, latency statistics, the run's report and its text;
- ``client``: the prompts, one streamed request timed token by token, the model and the emulated
  GPUs' counters read over HTTP;
- ``runner``: the open-loop schedule, the concurrency cap and the graceful stop (``run_load``);
- ``trace_options``: the options that choose the requests (a trace or Poisson arrivals), shared
  with ``phaselens simulate`` and ``goodput``;
- ``cli``: ``phaselens load`` itself.
"""

from serving.loadgen.cli import DEFAULT_URL, add_load_arguments, main_load
from serving.loadgen.client import emulation_during, fetch_emulation, fetch_model, synthetic_prompt
from serving.loadgen.report import (
    MAX_ERRORS_SHOWN,
    LatencyStats,
    LoadGenError,
    LoadReport,
    RequestResult,
    build_report,
    format_report,
    latency_stats,
    percentile,
)
from serving.loadgen.runner import STOP_GRACE_S, arun_load, run_load
from serving.loadgen.trace_options import add_trace_arguments, build_trace, trace_option_error

__all__ = [
    "DEFAULT_URL",
    "MAX_ERRORS_SHOWN",
    "STOP_GRACE_S",
    "LatencyStats",
    "LoadGenError",
    "LoadReport",
    "RequestResult",
    "add_load_arguments",
    "add_trace_arguments",
    "arun_load",
    "build_report",
    "build_trace",
    "emulation_during",
    "fetch_emulation",
    "fetch_model",
    "format_report",
    "latency_stats",
    "main_load",
    "percentile",
    "run_load",
    "synthetic_prompt",
    "trace_option_error",
]
