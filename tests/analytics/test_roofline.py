"""MFU, MBU and stranded compute / bandwidth from a real store file to ``phaselens analyze`` (issue 23
point 4), and the unvalidated label of a B200 / FP8 scenario (point 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from analytics.roofline import roofline
from analytics.window import Window
from phaselens.cli import main
from serving.devices.gpu_specs import GPU_SPECS


@pytest.fixture(scope="module")
def sim_db(tmp_path_factory) -> Iterator[Path]:
    """Two small simulated scenarios in one store: 1P1D on H200 (bf16) and 2 aggregated B200s (fp8)."""
    db = tmp_path_factory.mktemp("roof") / "roof.duckdb"
    rc = main(
        ["simulate", "--no-progress", "--model", "llama-3.1-8b", "--poisson", "4", "--num-requests", "60",
         "--layout", "1p1d:h200", "--layout", "agg:2xb200:dtype=fp8", "--db", str(db)]
    )  # fmt: skip
    assert rc == 0
    yield db


def _scenario(con: duckdb.DuckDBPyConnection, gpu: str) -> tuple[str, Window]:
    sid, s, e = con.execute(
        "SELECT scenario_id, start_s, end_s FROM scenarios WHERE layout->>'gpu' = ?", [gpu]
    ).fetchone()
    return sid, Window(s, e + 1.0, dataset=sid)


def test_mfu_and_mbu_follow_from_the_stored_work_and_busy_time(sim_db: Path) -> None:
    con = duckdb.connect(str(sim_db), read_only=True)
    sid, w = _scenario(con, "h200")
    r = roofline(con, w)
    # the same figures straight from the rows: simulated busy time is compute_s (the store's rule)
    truth = dict(
        (phase, (f, b, busy))
        for phase, f, b, busy in con.execute(
            "SELECT phase, sum(flops), sum(hbm_bytes), sum(least(end_s - start_s, compute_s)) "
            "FROM iterations WHERE node = ? GROUP BY phase",
            ["sim:" + sid],
        ).fetchall()
    )
    spec = GPU_SPECS["h200"]
    rows = {x["phase"]: x for x in r.table if x["scope"] == "fleet"}
    assert set(rows) == {"prefill", "decode"}  # 1P1D: no mixed iterations
    for phase, (f, b, busy) in truth.items():
        assert rows[phase]["mfu"] == pytest.approx(f / (busy * spec.peak_flops_for("bf16")), rel=1e-9)
        assert rows[phase]["mbu"] == pytest.approx(b / (busy * spec.bandwidth_bytes_s), rel=1e-9)
        assert rows[phase]["trust"] == ["simulated"]
    assert (
        rows["prefill"]["mfu"] > 10 * rows["decode"]["mfu"] and rows["decode"]["mbu"] > rows["prefill"]["mbu"]
    )
    fleet = next(s for s in r.stranded if s["scope"] == "fleet")
    f, _b, busy = truth["decode"]
    assert fleet["stranded_compute_s"] == pytest.approx(busy * (1 - rows["decode"]["mfu"]), rel=1e-9)
    f, b, busy = truth["prefill"]
    assert fleet["stranded_bandwidth_s"] == pytest.approx(busy * (1 - rows["prefill"]["mbu"]), rel=1e-9)
    # the activities beside them: the decode GPU's tensor pipes idle, its DRAM busy
    assert fleet["tensor_active_decode_pct"] < 10 < fleet["sm_active_decode_pct"]
    assert rows["decode"]["dram_active_pct"] > 3 * fleet["tensor_active_decode_pct"]
    pools = {(x["role"], x["phase"]) for x in r.table if x["scope"] == "pool"}
    assert pools == {("prefill", "prefill"), ("decode", "decode")}
    con.close()


def test_analyze_shows_mfu_mbu_with_trust_labels_and_b200_fp8_is_unvalidated(sim_db: Path, capsys) -> None:
    con = duckdb.connect(str(sim_db), read_only=True)
    sid, _w = _scenario(con, "b200")
    con.close()
    assert main(["analyze", "--db", str(sim_db), "--dataset", sid, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    part = summary["parts"]["roofline"]
    assert "unvalidated" in summary["trust"]["labels"] and "unvalidated" in part["trust"]["labels"]
    assert any("B200" in n and "fp8" in n for n in part["trust"]["notes"])
    decode = next(x for x in part["table"] if x["scope"] == "fleet" and x["phase"] == "decode")
    assert decode["trust"] == ["simulated", "unvalidated"] and 0 < decode["mfu"] < 0.05
    # the fp8 peak (4,500 TFLOP/s) is the yardstick: achieved / peak = MFU
    assert decode["achieved_tflops_s"] / 4500 == pytest.approx(decode["mfu"], rel=1e-9)
    assert main(["analyze", "--db", str(sim_db), "--dataset", sid]) == 0
    text = capsys.readouterr().out
    assert "Against the roofline" in text and "Stranded (GPU-s)" in text and "simulated, unvalidated" in text
    # the H200 bf16 scenario is what the model was validated on: no such label anywhere in its summary
    con = duckdb.connect(str(sim_db), read_only=True)
    h200, _w = _scenario(con, "h200")
    con.close()
    assert main(["analyze", "--db", str(sim_db), "--dataset", h200, "--json"]) == 0
    assert "unvalidated" not in json.loads(capsys.readouterr().out)["trust"]["labels"]


def _event(worker: str, device: str, uuid: str, start_s: float, phase: str, flops: float | None) -> dict:
    return {
        "type": "iteration", "worker": worker, "device": device, "gpu_uuid": uuid, "gpu_index": 0,
        "start_s": start_s, "end_s": start_s + 0.02, "phase": phase, "batch_size": 8,
        "prefill_tokens": 512 if phase == "prefill" else 0, "decode_seqs": 8 if phase == "decode" else 0,
        "context_tokens": 4096, "kv_blocks_used": 10, "kv_blocks_total": 100, "preempted": 0,
        "compute_s": 0.02, "pacing_s": 0.0, "modeled_s": None, "lag_s": None,
        "flops": flops, "hbm_bytes": None if flops is None else 2.0e10,
    }  # fmt: skip


def test_a_real_gpu_s_engine_count_is_measured_and_unknown_devices_are_left_out(tmp_path: Path) -> None:
    """Iterations of a real H200 (the engine's count over measured time) are labelled measured; a CPU
    worker's (no peak) and uncounted rows are left out and said so; the event envelope carries the
    two fields through the store's contract checks."""
    from collector.store import Store
    from serving.telemetry import envelope

    with Store.open(tmp_path / "m.duckdb") as store:
        store.append(
            "devices",
            [
                {"node": "n1", "source": "nvml", "device": "cuda:0", "index": 0, "since_s": 1000.0,
                 "kind": "cuda", "uuid": "GPU-real", "name": "NVIDIA H200", "emulated": False,
                 "worker": "worker-0", "role": "mixed"},
            ],
        )  # fmt: skip
        events = [_event("worker-0", "cuda:0", "GPU-real", 1000.0 + i, "decode", 4.0e11) for i in range(5)]
        events.append(_event("worker-0", "cuda:0", "GPU-real", 1006.0, "decode", None))  # an older engine
        events += [_event("worker-1", "cpu", "cpu-0", 1000.5 + i, "prefill", 8.0e12) for i in range(2)]
        ingest = store.append_telemetry_batch(envelope("worker-0", 0, 1010.0, 0, events), "n1")
        assert ingest.rejected_events == 0
        store.flush()
        with store.reader() as cur:
            r = roofline(cur, Window(999.0, 1020.0))
    rows = [x for x in r.table if x["scope"] == "fleet"]
    assert [(x["phase"], x["trust"], x["iterations"]) for x in rows] == [("decode", ["measured"], 5)]
    # measured busy time is the whole step (no modeled time): 0.02 s each
    assert rows[0]["mfu"] == pytest.approx(5 * 4.0e11 / (5 * 0.02 * 989e12))
    assert r.trust.labels == {"measured"}
    assert any("1 iterations without a work count" in m for m in r.missing)
    assert any("2 iterations on GPUs without known peaks" in m for m in r.missing)


def test_an_emulated_fp8_gpu_is_read_at_the_fp8_peak_and_labelled_unvalidated(tmp_path: Path) -> None:
    """An emulated H200 modeling fp8 (``--emulate-dtype fp8``) reports its dtype in its name; the roofline
    takes the dense FP8 peak as its yardstick and labels its figures emulated and unvalidated, and the
    window's notes say why; a bf16 emulated H200 beside it stays validated."""
    from analytics.roofline import unvalidated_notes
    from collector.store import Store
    from serving.telemetry import envelope

    with Store.open(tmp_path / "e.duckdb") as store:
        store.append(
            "devices",
            [
                {"node": "n1", "source": "emulated", "device": "emulated:h200", "index": 0, "since_s": 1000.0,
                 "kind": "emulated", "uuid": "GPU-emulated-fp8", "name": "NVIDIA H200 (emulated, fp8, unvalidated)",
                 "emulated": True, "worker": "worker-0", "role": "mixed"},
                {"node": "n2", "source": "emulated", "device": "emulated:h200", "index": 0, "since_s": 1000.0,
                 "kind": "emulated", "uuid": "GPU-emulated-bf16", "name": "NVIDIA H200 (emulated)",
                 "emulated": True, "worker": "worker-0", "role": "mixed"},
            ],
        )  # fmt: skip
        for node, uuid in (("n1", "GPU-emulated-fp8"), ("n2", "GPU-emulated-bf16")):
            events = [
                _event("worker-0", "emulated:h200", uuid, 1000.0 + i, "decode", 4.0e11) for i in range(4)
            ]
            for e in events:
                e["modeled_s"] = 0.02
            ingest = store.append_telemetry_batch(envelope("worker-0", 0, 1010.0, 0, events), node)
            assert ingest.rejected_events == 0
        store.flush()
        with store.reader() as cur:
            fp8 = roofline(cur, Window(999.0, 1020.0, nodes=("n1",)))
            bf16 = roofline(cur, Window(999.0, 1020.0, nodes=("n2",)))
            notes = unvalidated_notes(cur, Window(999.0, 1020.0))
    row = next(x for x in fp8.table if x["scope"] == "fleet")
    assert row["trust"] == ["emulated", "unvalidated"]
    assert row["mfu"] == pytest.approx(4 * 4.0e11 / (4 * 0.02 * GPU_SPECS["h200"].fp8_tflops * 1e12))
    assert fp8.trust.labels == {"emulated", "unvalidated"}
    assert any("fp8 weights and KV" in n for n in fp8.trust.notes)
    row = next(x for x in bf16.table if x["scope"] == "fleet")
    assert row["trust"] == ["emulated"] and bf16.trust.labels == {"emulated"}
    assert notes == [next(n for n in fp8.trust.notes if "fp8" in n)]


def test_the_attributions_stranded_categories_rest_on_the_roofline_s_rule(sim_db: Path) -> None:
    """The Overview's stranded share (the attribution's categories) and the Bimodal page's stranded
    table (this part) are one figure on one basis: decode time × (1 − MFU), prefill time × (1 − MBU)."""
    from analytics.bimodal import idle_split

    con = duckdb.connect(str(sim_db), read_only=True)
    _sid, w = _scenario(con, "h200")
    fleet = next(s for s in roofline(con, w).stranded if s["scope"] == "fleet")
    split = idle_split(con, w)
    assert split.basis["compute"] == "roofline" and split.basis["bandwidth"] == "roofline"
    pools = split.per_pool.set_index("role")
    assert pools["stranded_compute_s"].sum() == pytest.approx(fleet["stranded_compute_s"], rel=0.01)
    # prefill is 0.3 s here: the iterations at the window's edges, outside any sample interval, weigh more
    assert pools["stranded_bandwidth_s"].sum() == pytest.approx(fleet["stranded_bandwidth_s"], rel=0.05)
    # beside them, the SM-activity yardstick calls far less of the decode time stranded
    assert split.basis["stranded_compute_sm_share"] < split.basis["stranded_compute_decode_share"] - 0.2
    con.close()
