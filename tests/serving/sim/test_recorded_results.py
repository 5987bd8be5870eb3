"""A fixed small run gives, bit for bit, the telemetry recorded before the simulator's speed work
(issue 21, item 3: every request's token times, hence its latencies, and every event)."""

from __future__ import annotations

import hashlib
import json

import pytest

from serving.config import preset
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation
from serving.trace import load_azure_trace, vendored_trace_path

# SHA-256 of every batch (json, sorted keys) and of every request's (id, arrival, token times,
# finish), recorded on main at 4fe3ef3 for the first 120 s of the vendored conversation trace
RECORDED = {
    "agg:8xh100-sxm:tp2": (
        14993,
        "84feeb74b7f906b32e8d1daa85b87ea1902f3b6281dbf229d82e96544d0b2d49",
        "9e66d014c0aaa7d800f21088aebf84dab633e37db94d86f329abbee46d0309b8",
    ),
    "1p1d:h100-sxm:tp2": (
        6202,
        "c8b865b197682a1145f17617494efb9dab7674b25dccdc19d7933ddddbe7d8df",
        "bd7a5e9b4540c704b85d5c8af0fa293d83e1cf2a7578275540c00c842374cc12",
    ),
}


@pytest.mark.parametrize("layout", sorted(RECORDED))
def test_a_fixed_run_gives_the_recorded_telemetry_and_latencies(layout: str) -> None:
    requests = load_azure_trace(vendored_trace_path(), duration_s=120)
    result = Simulation(
        parse_layout(layout), preset("llama-3.1-70b"), requests, start_s=1.8e9, scenario="rec"
    ).run()
    telemetry, latencies = hashlib.sha256(), hashlib.sha256()
    for batch in result.batches:
        telemetry.update(json.dumps(batch, sort_keys=True).encode())
        for e in batch["events"]:
            if e["type"] == "request":
                latencies.update(
                    json.dumps([e["request_id"], e["arrival_s"], e["token_ts_s"], e["finish_s"]]).encode()
                )
    assert result.finished == len(requests) == 456
    assert (result.iterations, telemetry.hexdigest(), latencies.hexdigest()) == RECORDED[layout]
