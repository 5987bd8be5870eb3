"""A host-bound calibration tells the truth: on an emulated stack whose host cannot keep pace with the
modelled GPU, the client latency measures the host's CPU, not the knob. Host-boundness is forced
deterministically (not by loading the CPU): the emulated H200s model the ``tiny`` shape, whose
modelled iterations (~2 ms) are shorter than the host's own, so nearly every iteration lags. Through
``phaselens calibrate --execute``: the record is labelled host-bound, its confidence low with the
reason, the cliff judged on the emulated GPU's modelled time (and found: a compute-bound prefill at
345 MHz models ~1.7x slower), the recommendation's confidence low; without modelled figures no
cliff is called at all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import Store
from phaselens.cli import main
from phaselens.power.choose import MODELED, NO_CLIFF, choose_modes, slowdown_pct
from serving.sim.live_compare import serve_args_emulated
from serving.testing import Server, start_server, stop_server

from .conftest import TOKEN, at_defaults, knobs


@pytest.fixture(scope="module")
def host_bound_stack() -> Iterator[Server]:
    args = serve_args_emulated(disaggregated=True)
    args[args.index("--emulate-shape") + 1] = "tiny"  # modelled iterations shorter than the host's
    server = start_server(*args)
    yield server
    stop_server(server)


def test_host_bound_calibration_is_labelled_low_and_judges_the_cliff_on_modelled_time(
    host_bound_stack: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    rc = main(
        [
            "calibrate",
            "--url",
            host_bound_stack.url,
            "--token",
            TOKEN,
            "--execute",
            "--roles",
            "prefill",
            "--knobs",
            "sm_clock",
            "--sm-clocks",
            "345",
            "--point-s",
            "2",
            "--settle-s",
            "0.2",
            "--rate",
            "3",
            "--prompt-tokens",
            "256:512",
            "--output-tokens",
            "8:16",
            "--db",
            str(db),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert at_defaults(knobs(host_bound_stack, "worker-0"))
    with Store.open(db) as store:
        (row,) = store.query("SELECT * FROM power_calibrations").to_dict("records")
        (rec,) = store.query("SELECT details FROM recommendations").to_dict("records")
    points, details = json.loads(row["points"]), json.loads(row["details"])
    ref, cliff, choice = json.loads(row["reference"]), json.loads(row["cliff"]), details["choice"]
    refs = [p["figures"] for p in points if p["setting"]["knob"] == "default"]
    assert len(refs) == 2 and all(f["host_bound"] for f in refs), refs
    # the record says so: trust label, confidence low, the reason
    assert "host-bound" in json.loads(row["trust"]) and "emulated" in json.loads(row["trust"])
    assert choice["cliff_basis"] == MODELED
    assert "reference runs host-bound" in choice["cliff_note"] and "modelled time" in choice["cliff_note"]
    assert details["confidence"]["level"] == "low" and "host-bound" in details["confidence"]["reason"]
    assert "host-bound:" in out and "confidence low" in out
    # the cliff on the modelled GPU time: 345 MHz models the prefill well beyond the threshold
    assert cliff["sm_clock"] is not None and cliff["sm_clock"]["setting"]["sm_clock_max_mhz"] == 345
    (low,) = [p for p in points if p["setting"]["knob"] == "sm_clock"]
    assert slowdown_pct(low["figures"], ref, "prefill", MODELED) > choice["threshold_pct"]
    assert low["figures"]["modeled_s_per_token"] > refs[0]["modeled_s_per_token"]
    # the recommendation made from it is low confidence, with the reason
    conf = json.loads(rec["details"])["confidence"]
    assert conf["level"] == "low" and "host-bound" in conf["text"]

    # the same points without the modelled figures (e.g. a record of before them): no cliff is called
    bare = [
        {**p, "figures": {k: v for k, v in p["figures"].items() if not k.startswith("modeled")}}
        for p in points
    ]
    analysis = choose_modes(bare, "prefill")
    assert analysis["cliff_basis"] == NO_CLIFF and analysis["cliff"] == {"sm_clock": None}
    assert "no cliff is called" in analysis["cliff_note"]
