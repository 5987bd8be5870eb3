"""Stranded compute and bandwidth in the phase attribution from work and time (issue 23 point 4):
decode time × (1 − MFU) and prefill time × (1 − MBU) where the iterations carry a count, SM / DRAM
activity where they do not, each figure labelled with its basis; through ``phaselens analyze``."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from analytics.attribution import phase_breakdown
from analytics.bimodal import CATEGORIES, idle_split
from analytics.overview import overview
from analytics.roofline import roofline
from analytics.stranded import BASIS_ACTIVITY, BASIS_MIXED, BASIS_ROOFLINE, basis_word
from phaselens.cli import main
from serving.devices.gpu_specs import gpu_spec_for_name
from tests.analytics.test_attribution import WINDOW, iteration, make_store, samples

H100 = gpu_spec_for_name("NVIDIA H100 80GB HBM3")
PEAK_F = H100.peak_flops_for("bf16")
PEAK_B = H100.bandwidth_bytes_s
# a decode-heavy second-by-second GPU: 0.8 s of decode in each of four seconds, 0.5 s of prefill in the
# fifth; each decode step does a different amount of work (MFU 2-5 %, as a memory-bound decode does)
DECODE = [(100.0 + k, 100.8 + k, (0.02 + 0.01 * k) * PEAK_F * 0.8, 0.6 * PEAK_B * 0.8) for k in range(4)]
PREFILL = (104.0, 104.5, 0.55 * PEAK_F * 0.5, 0.2 * PEAK_B * 0.5)
SM_PCT, DRAM_PCT = 50.0, 40.0


def _iterations(counted: bool, prefill_counted: bool | None = None, t0: float = 0.0) -> list[dict]:
    prefill_counted = counted if prefill_counted is None else prefill_counted
    rows = [
        iteration(
            t0 + a, t0 + b, "decode", decode_seqs=64, **({"flops": f, "hbm_bytes": m} if counted else {})
        )
        for a, b, f, m in DECODE
    ]
    a, b, f, m = PREFILL
    rows.append(
        iteration(
            a, b, "prefill", prefill_tokens=4096, **({"flops": f, "hbm_bytes": m} if prefill_counted else {})
        )
    )
    return rows


def _store(tmp_path: Path, name: str, iterations: list[dict], t0: float = 0.0) -> duckdb.DuckDBPyConnection:
    ts = [t0 + 100.0 + 0.5 * i for i in range(11)]  # 0.5 s samples over (100, 105]
    rows = samples(
        ts, [1_000_000 + 150_000 * i for i in range(11)], sm_active_pct=SM_PCT, dram_active_pct=DRAM_PCT
    )
    return make_store(tmp_path / name, {"gpu_samples": rows, "iterations": iterations})


def _mfu_mbu() -> tuple[float, float]:
    mfu = sum(f for *_t, f, _m in DECODE) / (sum(b - a for a, b, *_w in DECODE) * PEAK_F)
    a, b, _f, m = PREFILL
    return mfu, m / ((b - a) * PEAK_B)


@pytest.mark.parametrize("bucket_s", [0.0, None])
def test_a_decode_heavy_gpu_strands_decode_time_times_one_minus_mfu_exactly(tmp_path, bucket_s):
    con = _store(tmp_path, "counted.duckdb", _iterations(counted=True))
    pb = phase_breakdown(con, WINDOW, bucket_s=bucket_s)
    sp = idle_split(con, WINDOW, breakdown=pb)
    g = sp.per_gpu.iloc[0]
    mfu, mbu = _mfu_mbu()
    assert 0.02 < mfu < 0.05 and mbu == pytest.approx(0.2)
    # the roofline part reads the same MFU / MBU from the same rows
    fleet = {r["phase"]: r for r in roofline(con, WINDOW).table if r["scope"] == "fleet"}
    assert fleet["decode"]["mfu"] == pytest.approx(mfu, rel=1e-12)
    assert fleet["prefill"]["mbu"] == pytest.approx(mbu, rel=1e-12)
    decode_s, prefill_s = float(pb.per_gpu.iloc[0]["decode_s"]), float(pb.per_gpu.iloc[0]["prefill_s"])
    assert decode_s == pytest.approx(3.2) and prefill_s == pytest.approx(0.5)
    assert g["stranded_compute_s"] == pytest.approx(decode_s * (1 - mfu), rel=1e-12)
    assert g["productive_decode_s"] == pytest.approx(decode_s * mfu, rel=1e-9)
    assert g["stranded_bandwidth_s"] == pytest.approx(prefill_s * (1 - mbu), rel=1e-12)
    # still a partition of the GPU's time and its measured energy
    assert sum(g[f"frac_{c}"] for c in CATEGORIES) == pytest.approx(1.0, abs=1e-12)
    assert sum(g[f"energy_{c}_j"] for c in CATEGORIES) == pytest.approx(g["energy_j"], rel=1e-9)
    # labelled: every decode / prefill second split by the work counted
    assert sp.basis["compute"] == BASIS_ROOFLINE and sp.basis["bandwidth"] == BASIS_ROOFLINE
    assert "MFU" in sp.basis["compute_label"] and "MBU" in sp.basis["bandwidth_label"]
    assert g["decode_roofline_s"] == pytest.approx(decode_s) and g["decode_activity_s"] == 0.0
    # the SM-activity basis beside it: 50 % SM over 0.5 s samples of 0.4 s decode → capped at 100 %
    # busy, so that yardstick calls none of this decode time stranded while 1 − MFU calls ~97 % of it
    assert sp.basis["stranded_compute_decode_share"] == pytest.approx(1 - mfu, rel=1e-12)
    assert sp.basis["stranded_compute_sm_share"] < 0.5 < sp.basis["stranded_compute_decode_share"]
    con.close()


def test_without_a_work_count_the_split_falls_back_to_sm_activity_and_says_so(tmp_path):
    con = _store(tmp_path, "uncounted.duckdb", _iterations(counted=False))
    sp = idle_split(con, WINDOW, bucket_s=0)
    g = sp.per_gpu.iloc[0]
    assert sp.basis["compute"] == BASIS_ACTIVITY and sp.basis["bandwidth"] == BASIS_ACTIVITY
    assert "SM activity" in sp.basis["compute_label"] and "no work count" in sp.basis["compute_label"]
    assert "DRAM activity" in sp.basis["bandwidth_label"]
    assert g["decode_roofline_s"] == 0.0 and g["decode_activity_s"] == pytest.approx(3.2)
    # per sample interval: SM activity during busy time = 50 % × 0.5 s / 0.4 s busy → capped at 1
    assert g["stranded_compute_s"] == pytest.approx(g["stranded_compute_sm_s"], rel=1e-12)
    assert g["stranded_bandwidth_s"] == pytest.approx(g["stranded_bandwidth_dram_s"], rel=1e-12)
    assert any("SM activity" in n for n in sp.trust.notes)
    assert sum(g[f"frac_{c}"] for c in CATEGORIES) == pytest.approx(1.0, abs=1e-12)
    con.close()


def test_a_counted_decode_and_an_uncounted_prefill_are_each_labelled(tmp_path):
    con = _store(tmp_path, "half.duckdb", _iterations(counted=True, prefill_counted=False))
    sp = idle_split(con, WINDOW, bucket_s=0)
    assert sp.basis["compute"] == BASIS_ROOFLINE and sp.basis["bandwidth"] == BASIS_ACTIVITY
    assert basis_word(sp.basis) == BASIS_MIXED
    mfu, _mbu = _mfu_mbu()
    g = sp.per_gpu.iloc[0]
    assert g["stranded_compute_s"] == pytest.approx(3.2 * (1 - mfu), rel=1e-9)
    assert g["stranded_bandwidth_s"] == pytest.approx(g["stranded_bandwidth_dram_s"], rel=1e-12)
    con.close()


def test_a_mixed_iteration_splits_by_the_mixed_iterations_mfu_and_mbu(tmp_path):
    f, m = 0.3 * PEAK_F * 0.8, 0.25 * PEAK_B * 0.8  # MFU 30 %, MBU 25 % over 0.8 s
    its = [iteration(100.1, 100.9, "mixed", prefill_tokens=300, decode_seqs=100, flops=f, hbm_bytes=m)]
    con = _store(tmp_path, "mixed.duckdb", its)
    sp = idle_split(con, WINDOW, bucket_s=0)
    g = sp.per_gpu.iloc[0]
    # 3/4 of the 0.8 s is the prefill share by tokens, 1/4 the decode share
    assert g["stranded_compute_s"] == pytest.approx(0.2 * (1 - 0.3), rel=1e-9)
    assert g["stranded_bandwidth_s"] == pytest.approx(0.6 * (1 - 0.25), rel=1e-9)
    assert sp.basis["compute"] == BASIS_ROOFLINE == sp.basis["bandwidth"]
    con.close()


def test_analyze_and_the_overview_carry_the_basis(tmp_path, capsys):
    t0 = 1.8e9  # analyze takes epoch seconds from 2000 on
    con = _store(tmp_path, "analyze.duckdb", _iterations(counted=True, t0=t0), t0=t0)
    con.close()
    db = str(tmp_path / "analyze.duckdb")
    assert main(["analyze", "--db", db, "--start-s", str(t0 + 100), "--end-s", str(t0 + 105), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    cost = summary["parts"]["cost"]
    assert cost["stranded_basis"]["compute"] == BASIS_ROOFLINE
    mfu, _mbu = _mfu_mbu()
    # (epoch seconds near 1.8e9 keep about 0.1 µs: the decode seconds are 3.2 to 1e-7)
    assert cost["total"]["stranded_decode_s"] == pytest.approx(3.2 * (1 - mfu), rel=1e-6)
    assert any("1 − MFU" in n for n in cost["trust"]["notes"])
    tile = overview(summary, None)["figures"]["stranded_share"]
    assert tile["basis_kind"] == BASIS_ROOFLINE and tile["basis_label"] == "from MFU/MBU"
    assert tile["basis"].startswith("stranded = decode time × (1 − MFU) + prefill time × (1 − MBU)")
    assert (
        f"{100 * (1 - mfu):.1f} % of decode time" in tile["basis"]
        and "by SM / DRAM activity" in tile["basis"]
    )
    assert tile["decode_stranded_share"] == pytest.approx(1 - mfu, rel=1e-6)
    money = overview(summary, None)["money"]
    assert money["category"] == "stranded" and "; from MFU/MBU): " in money["sentence"]
