"""The workload of a window, observed (from request rows or engine histograms), synthesized into a
trace that follows it, and compared (drift). See docs/RECOMMENDATIONS.md, "Workload".

* :mod:`analytics.workload.model`: :class:`Workload`, :class:`JointLengths` and their JSON form
* :mod:`analytics.workload.arrivals`: rate curve, hourly rates, burstiness
* :mod:`analytics.workload.observe`: :func:`observe` a store window
* :mod:`analytics.workload.synthesize`: :func:`synthesize_trace`, :func:`describe_trace`, the CSV
* :mod:`analytics.workload.drift`: :func:`workload_drift`
* :mod:`analytics.workload.stored`: the ``workloads`` table's rows
"""

from analytics.workload.drift import Drift, workload_drift
from analytics.workload.model import ENGINE_HISTOGRAMS, REQUESTS, TRACE, JointLengths, LengthStats, Workload
from analytics.workload.observe import (
    dispatch_rows,
    observe,
    observe_engine_histograms,
    observe_requests,
    requests_trace,
)
from analytics.workload.synthesize import describe_trace, synthesize_trace, write_trace_csv

__all__ = [
    "ENGINE_HISTOGRAMS",
    "REQUESTS",
    "TRACE",
    "Drift",
    "JointLengths",
    "LengthStats",
    "Workload",
    "describe_trace",
    "dispatch_rows",
    "observe",
    "observe_engine_histograms",
    "observe_requests",
    "requests_trace",
    "synthesize_trace",
    "workload_drift",
    "write_trace_csv",
]
