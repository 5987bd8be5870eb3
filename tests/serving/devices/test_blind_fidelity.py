"""The blind-test scorer (serving/devices/blind_fidelity.py, blind_vidur.py, blind_components.py) on
SYNTHETIC files written here: the same columns as Splitwise's perf_model.csv and Vidur's mlp.csv, made-up
numbers. The real blind data are never read by a test (the lead scores them once, docs/FIDELITY.md)."""

from __future__ import annotations

import csv
import math
import statistics
import subprocess
from pathlib import Path

import pytest

from serving.config import ModelConfig
from serving.devices import DeviceValueError, EngineProfile, predict_iteration, shard_shape
from serving.devices import blind_fidelity as bf
from serving.devices import blind_vidur as bv
from serving.devices.blind_components import (
    SLOPE_LAYERS,
    equivalent_gated_intermediate,
    layer_gpu_s,
    prefill_layer_work,
)
from serving.devices.gpu_specs import gpu_spec
from serving.devices.published import LLAMA2_7B, LLAMA2_70B, decode_work, prefill_work

SW_HEADER = [
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "peak_power",
    "average_power",
    "prompt_time",
    "token_time",
    "e2e_time",
    "tensor_parallel",
]


def _write_sw(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SW_HEADER)
        w.writeheader()
        for r in rows:
            w.writerow({"e2e_time": 0, "peak_power": 0, "average_power": 0, **r})
    return path


def _sw(hw: str, tp: int, n: int, b: int, t: int, prompt: float, token: float, **kw: float) -> dict:
    return dict(
        model="bloom-176b",
        hardware=hw,
        tensor_parallel=tp,
        prompt_size=n,
        batch_size=b,
        token_size=t,
        prompt_time=prompt,
        token_time=token,
        **kw,
    )


# -- the shapes and the layer helper -----------------------------------------------------------------------


def test_bloom_shape_has_bloom_176b_weights_and_attention() -> None:
    s = bf.BLOOM_176B
    assert (s.num_layers, s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim) == (
        70,
        14336,
        112,
        112,
        128,
    )
    # bigscience/bloom: 176,247,271,424 parameters (with biases and LayerNorm betas, not modeled)
    assert s.param_count() == pytest.approx(176_247_271_424, rel=1e-4)
    # the gated MLP carries the GELU MLP's two 14336 x 57344 matrices
    assert 3 * s.hidden_size * s.intermediate_size == pytest.approx(2 * 14336 * 57344, rel=1e-4)
    assert s.intermediate_size % 8 == 0


def test_equivalent_gated_intermediate() -> None:
    assert equivalent_gated_intermediate(57344) == 38232
    assert equivalent_gated_intermediate(10240) == 6824
    for w in (4096, 10240, 57344, 11111):
        assert abs(3 * equivalent_gated_intermediate(w) - 2 * w) <= 1.5 * 8
    with pytest.raises(DeviceValueError, match="mlp_width"):
        equivalent_gated_intermediate(0)


def test_layer_time_is_one_layer_without_all_reduce_host_or_per_iteration_work() -> None:
    tokens = 512
    per_layer = layer_gpu_s("h100-sxm", LLAMA2_70B, tokens, tp=2, profile="vllm")
    # the same as the rank's shard run alone, and as the tp=2 iteration's per-layer busy time minus its
    # all-reduces (which it does have)
    assert per_layer == pytest.approx(
        layer_gpu_s("h100-sxm", shard_shape(LLAMA2_70B, 2), tokens, tp=1, profile="vllm"), rel=1e-9
    )
    work = prefill_layer_work(tokens)
    busy = []
    for layers in (200, 400):
        est = predict_iteration(
            "h100-sxm",
            ModelConfig(**{**LLAMA2_70B.to_dict(), "num_layers": layers}),
            work,
            tp=2,
            profile="vllm",
        )
        assert est.comm_s > 0
        busy.append(est.busy_s - est.comm_s)
    assert per_layer == pytest.approx((busy[1] - busy[0]) / 200, rel=1e-6)
    # host time plays no part
    hosty = EngineProfile(
        name="hosty", step_s=1.0, per_layer_s=0.5, per_prefill_seq_s=2.0, kernels_per_layer=5.0
    )
    plain = EngineProfile(name="plain", kernels_per_layer=5.0)
    assert layer_gpu_s("h100-sxm", LLAMA2_70B, tokens, tp=2, profile=hosty) == pytest.approx(
        layer_gpu_s("h100-sxm", LLAMA2_70B, tokens, tp=2, profile=plain), rel=1e-12
    )
    # nor does the vocabulary (embedding, LM head) or the model's own layer count
    other = ModelConfig(**{**LLAMA2_70B.to_dict(), "vocab_size": 128_000, "num_layers": 3})
    assert layer_gpu_s("h100-sxm", other, tokens, tp=2, profile="vllm") == pytest.approx(per_layer, rel=1e-9)


def test_layer_time_follows_the_layer_weights() -> None:
    # one token: the layer streams its weights; 4096 tokens: its GEMMs' FLOPs -- within the small kernels'
    # share of the two bounds, and half of each at TP 2
    spec = gpu_spec("a100-sxm-80gb")
    layer_params = (
        LLAMA2_7B.param_count() - 2 * LLAMA2_7B.vocab_size * LLAMA2_7B.hidden_size
    ) / LLAMA2_7B.num_layers
    one = layer_gpu_s("a100-sxm-80gb", LLAMA2_7B, 1, profile="lean")
    assert 2 * layer_params / spec.bandwidth_bytes_s < one < 1.6 * 2 * layer_params / spec.bandwidth_bytes_s
    big = layer_gpu_s("a100-sxm-80gb", LLAMA2_7B, 4096, profile="lean")
    assert 2 * layer_params * 4096 / spec.peak_flops < big < 2.0 * 2 * layer_params * 4096 / spec.peak_flops
    assert layer_gpu_s("a100-sxm-80gb", LLAMA2_7B, 4096, tp=2, profile="lean") == pytest.approx(
        big / 2, rel=0.05
    )
    assert SLOPE_LAYERS[1] > SLOPE_LAYERS[0] >= 100
    with pytest.raises(DeviceValueError, match="tokens"):
        prefill_layer_work(0)


# -- (a) Splitwise bloom-176b ------------------------------------------------------------------------------


def test_splitwise_units_are_medians_of_the_model_rows_only(tmp_path: Path) -> None:
    rows = [
        # one TTFT unit over three token sizes (medians over all its rows), two TPOT units
        _sw("a100-80gb", 8, 512, 1, 128, 100.0, 40.0, peak_power=0.9, average_power=0.5),
        _sw("a100-80gb", 8, 512, 1, 128, 130.0, 44.0, peak_power=1.1, average_power=0.7),
        _sw("a100-80gb", 8, 512, 1, 128, 120.0, 41.0, peak_power=1.0, average_power=0.6),
        _sw("a100-80gb", 8, 512, 1, 256, 110.0, 50.0),
        _sw("a100-80gb", 8, 512, 1, 256, 90.0, 52.0),
        _sw("h100-80gb", 8, 128, 2, 128, 60.0, 30.0),
        # another model's row is not read beyond its model column (this one would not parse)
        {**_sw("llama2-70b", 8, 512, 1, 128, 1.0, 1.0), "model": "llama2-70b", "prompt_time": "oops"},
    ]
    units = bf.load_splitwise_units(_write_sw(tmp_path / "perf.csv", rows))
    assert units.rows == 6
    assert units.ttft_ms == {("a100-80gb", 8, 512, 1): 110.0, ("h100-80gb", 8, 128, 2): 60.0}
    assert units.tpot_ms == {
        ("a100-80gb", 8, 512, 1, 128): 41.0,
        ("a100-80gb", 8, 512, 1, 256): 51.0,
        ("h100-80gb", 8, 128, 2, 128): 30.0,
    }
    assert units.peak_power_frac[("a100-80gb", 8, 512, 1, 128)] == 1.0
    assert units.avg_power_frac[("a100-80gb", 8, 512, 1, 128)] == 0.6
    assert units.peak_power_frac[("a100-80gb", 8, 512, 1, 256)] == 0.0


def test_splitwise_bad_files_are_named_and_bad_values_listed(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("model,hardware\nbloom-176b,a100-80gb\n")
    with pytest.raises(DeviceValueError, match=r"missing column.*prompt_size"):
        bf.load_splitwise_units(p)
    none = _write_sw(
        tmp_path / "none.csv", [{**_sw("a100-80gb", 8, 512, 1, 128, 1, 1), "model": "llama2-70b"}]
    )
    with pytest.raises(DeviceValueError, match="no 'bloom-176b' rows"):
        bf.load_splitwise_units(none)
    # a bad value leaves its unit, the rest of its row counts; a bad unit column drops the row; both listed
    rows = [
        _sw("a100-80gb", 8, 512, 1, 128, 100.0, 40.0) | {"prompt_time": "x"},
        _sw("a100-80gb", 8, 512, 1, 128, 120.0, 42.0)
        | {"token_time": "nan", "peak_power": "", "average_power": ""},
        _sw("a100-80gb", 8, 512, 1, 128, 140.0, 44.0),
        _sw("a100-80gb", 8, 512, 1, 128, 1.0, 1.0) | {"tensor_parallel": "eight"},
    ]
    units = bf.load_splitwise_units(_write_sw(tmp_path / "bad2.csv", rows))
    assert units.rows == 3
    assert units.ttft_ms == {("a100-80gb", 8, 512, 1): 130.0}
    assert units.tpot_ms == {("a100-80gb", 8, 512, 1, 128): 42.0}
    assert units.peak_power_frac == {("a100-80gb", 8, 512, 1, 128): 0.0}  # empty cells: not recorded
    assert units.rejected == (
        "line 2: prompt_time 'x' is not a finite number",
        "line 3: token_time 'nan' is not a finite number",
        "line 5: unit columns: not an integer: 'eight'",
    )


def test_splitwise_scoring_joins_each_unit_to_its_model_figure(tmp_path: Path) -> None:
    shape = bf.BLOOM_176B
    ttft_a100 = (
        predict_iteration(
            "a100-sxm-80gb", shape, prefill_work(512, 2), tp=8, link="nvlink3", profile="splitwise-2023"
        ).time_s
        * 1e3
    )
    ttft_pcap = (
        predict_iteration(
            "h100-sxm",
            shape,
            prefill_work(2048, 1),
            tp=8,
            link="nvlink",
            profile="splitwise-2023",
            power_limit_w=490.0,
        ).time_s
        * 1e3
    )
    steps = [
        predict_iteration(
            "a100-sxm-80gb", shape, decode_work(2, 512 + k), tp=8, link="nvlink3", profile="splitwise-2023"
        )
        for k in (1, 2, 3)
    ]
    pre = predict_iteration(
        "a100-sxm-80gb", shape, prefill_work(512, 2), tp=8, link="nvlink3", profile="splitwise-2023"
    )
    tpot = statistics.fmean(s.time_s for s in steps) * 1e3
    peak = max(pre.power_w, *(s.power_w for s in steps)) / 400.0
    avg = (
        (pre.energy_j + sum(s.energy_j for s in steps)) / (pre.time_s + sum(s.time_s for s in steps)) / 400.0
    )
    rows = [
        # measured = model x 1.25 / x 0.8: errors of -20 % / +25 %
        _sw(
            "a100-80gb",
            8,
            512,
            2,
            4,
            ttft_a100 * 1.25,
            tpot * 1.25,
            peak_power=peak * 1.25,
            average_power=avg * 0.8,
        ),
        _sw("h100-80gb-pcap", 8, 2048, 1, 4, ttft_pcap * 0.8, 30.0),
        _sw("a100-80gb", 3, 512, 1, 4, 100.0, 40.0),  # TP 3 does not split 112 heads
        _sw("tpu-v5", 8, 512, 1, 4, 100.0, 40.0),  # unknown hardware
        _sw("h100-80gb", 8, 512, 1, 1, 100.0, 0.0),  # one token: no decode step
    ]
    scored = bf.score_splitwise(bf.load_splitwise_units(_write_sw(tmp_path / "p.csv", rows)))
    by = {f: {tuple(r["unit"]): r for r in rs} for f, rs in scored["rows"].items()}
    assert by["ttft"][("a100-80gb", 8, 512, 2)]["error"] == pytest.approx(-0.2, abs=1e-9)
    assert by["ttft"][("h100-80gb-pcap", 8, 2048, 1)]["error"] == pytest.approx(0.25, abs=1e-9)
    assert by["ttft"][("h100-80gb", 8, 512, 1)]["modeled"] > 0  # TTFT still scored for the one-token unit
    assert by["tpot"][("a100-80gb", 8, 512, 2, 4)]["error"] == pytest.approx(-0.2, abs=1e-9)
    assert by["peak_power"][("a100-80gb", 8, 512, 2, 4)]["error"] == pytest.approx(-0.2, abs=1e-9)
    assert by["avg_power"][("a100-80gb", 8, 512, 2, 4)]["error"] == pytest.approx(0.25, abs=1e-9)
    # power only where recorded; nothing dropped silently
    assert set(by["peak_power"]) == {("a100-80gb", 8, 512, 2, 4)}
    reasons = {(s["figure"], tuple(s["unit"])): s["reason"] for s in scored["not_scored"]}
    assert "tensor-parallel degree 3" in reasons["ttft", ("a100-80gb", 3, 512, 1)]
    assert "unknown hardware 'tpu-v5'" in reasons["tpot", ("tpu-v5", 8, 512, 1, 4)]
    assert "h100-80gb-pcap" in reasons["ttft", ("tpu-v5", 8, 512, 1)]  # the message lists what is allowed
    assert "token_size >= 2" in reasons["tpot", ("h100-80gb", 8, 512, 1, 1)]
    assert len(scored["not_scored"]) == 5


def test_capped_h100_is_modeled_under_its_limit() -> None:
    free = bf.modeled_ttft_ms(bf.BLOOM_176B, "h100-80gb", 8, 8192, 1)
    capped = bf.modeled_ttft_ms(bf.BLOOM_176B, "h100-80gb-pcap", 8, 8192, 1)
    limited = predict_iteration(
        "h100-sxm", bf.BLOOM_176B, prefill_work(8192), tp=8, profile="splitwise-2023", power_limit_w=490.0
    )
    assert capped == pytest.approx(limited.time_s * 1e3)
    assert capped >= free


def test_error_stats_and_summary() -> None:
    errs = [0.10, -0.20, 0.05, 0.30, -0.01, 0.02, 0.40, -0.03, 0.04, 0.06, math.nan]
    s = bf.error_stats(errs)
    a = sorted(abs(e) for e in errs if math.isfinite(e))
    assert s["n"] == 10 and s["n_invalid"] == 1
    assert s["median"] == pytest.approx((0.05 + 0.06) / 2)
    assert s["p90"] == pytest.approx(a[8]) == pytest.approx(0.30)  # nearest rank: ceil(0.9 * 10) = 9th
    assert s["max"] == pytest.approx(0.40)
    assert s["signed_median"] == pytest.approx((0.04 + 0.05) / 2)
    assert s["within_15pct"] == 7
    assert math.isnan(bf.error_stats([])["median"])
    rows = [
        {"unit": [g, i], "error": e}
        for i, (g, e) in enumerate(zip("aabbb", (0.1, -0.5, 0.2, 0.0, 0.3), strict=True))
    ]
    out = bf.summarize(rows, group=lambda r: r["unit"][0], worst=2)
    assert [r["error"] for r in out["worst"]] == [-0.5, 0.3]
    assert out["by_group"]["a"]["max"] == pytest.approx(0.5) and out["by_group"]["b"]["n"] == 3


# -- (b) Vidur -------------------------------------------------------------------------------------------------

_OPS_ALL = ("emb", *bv.OPS)


def _mlp_csv(rows: list[dict]) -> str:
    cols = [f"time_stats.{op}.{s}" for op in _OPS_ALL for s in ("min", "max", "mean", "median", "std")]
    cols += [
        "n_head",
        "n_kv_head",
        "n_embd",
        "n_expanded_embd",
        "vocab_size",
        "use_gated_mlp",
        "num_tokens",
        "num_tensor_parallel_workers",
    ]
    lines = [",".join(cols)]
    for r in rows:
        lines.append(",".join(str(r.get(c, "")) for c in cols))
    return "\n".join(lines) + "\n"


def _vrow(
    tokens: int, tp: int, op_ms: float = 0.1, *, gated: bool = True, shape=(32, 32, 4096, 11008, 32000), **ops
):
    r = dict(zip(("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size"), shape, strict=True))
    r |= {"use_gated_mlp": gated, "num_tokens": tokens, "num_tensor_parallel_workers": tp}
    r["time_stats.emb.median"] = 99.0  # excluded: must not count
    for op in bv.OPS:
        r[f"time_stats.{op}.median"] = ops.get(op, op_ms)
        r[f"time_stats.{op}.mean"] = 1000.0  # only medians count
    return r


def _vidur_tree(root: Path) -> Path:
    base = root / "data" / "profiling" / "compute"
    files = {
        "h100/meta-llama/Llama-2-7b-hf/mlp.csv": _mlp_csv(
            [
                _vrow(128, 1, post_attention_layernorm=""),  # an operator not run counts 0
                _vrow(1024, 2, 0.2),
                _vrow(1024, 2, 0.4),  # the same unit twice: the median of the sums
                _vrow(1024, 2, 0.9),
                _vrow(64, 3),  # TP 3: not scored
                _vrow(256, 1, **{op: "" for op in bv.OPS}),  # no operator figure
            ]
        ),
        "a100/microsoft/phi-2/mlp.csv": _mlp_csv(
            [_vrow(512, 2, 0.05, gated=False, shape=(32, 32, 2560, 10240, 51200))]
        ),
        "a40/meta-llama/Llama-2-7b-hf/mlp.csv": _mlp_csv([_vrow(128, 1)]),
        "h100/meta-llama/Llama-2-7b-hf/attention.csv": "not,read\n",
    }
    for rel, text in files.items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    return root


def _check_vidur(repo: Path) -> None:
    files, skipped_files = bv.mlp_files(repo)
    assert sorted((f.gpu, f.model) for f in files) == [
        ("a100", "microsoft/phi-2"),
        ("h100", "meta-llama/Llama-2-7b-hf"),
    ]
    assert [s["path"] for s in skipped_files] == [
        "data/profiling/compute/a40/meta-llama/Llama-2-7b-hf/mlp.csv"
    ]
    scored = bv.score_vidur(files)
    by = {tuple(r["unit"]): r for r in scored["rows"]}
    assert set(by) == {
        ("h100", "meta-llama/Llama-2-7b-hf", 1, 128),
        ("h100", "meta-llama/Llama-2-7b-hf", 2, 1024),
        ("a100", "microsoft/phi-2", 2, 512),
    }
    r = by["h100", "meta-llama/Llama-2-7b-hf", 1, 128]
    assert r["measured"] == pytest.approx(0.1 * 8)  # 8 of the 9 operators, no emb
    assert r["modeled"] == pytest.approx(layer_gpu_s("h100-sxm", LLAMA2_7B, 128, profile="vllm") * 1e3)
    assert r["error"] == pytest.approx(r["modeled"] / r["measured"] - 1.0)
    assert r["gated"] is True
    assert by["h100", "meta-llama/Llama-2-7b-hf", 2, 1024]["measured"] == pytest.approx(0.4 * 9)
    phi = by["a100", "microsoft/phi-2", 2, 512]
    assert phi["gated"] is False
    phi_shape = ModelConfig(
        name="phi",
        vocab_size=51200,
        hidden_size=2560,
        intermediate_size=6824,
        num_layers=1,
        num_heads=32,
        num_kv_heads=32,
        max_position=4096,
    )
    assert phi["modeled"] == pytest.approx(
        layer_gpu_s("a100-sxm-80gb", phi_shape, 512, tp=2, profile="vllm") * 1e3
    )
    reasons = {tuple(s["unit"]): s["reason"] for s in scored["not_scored"]}
    assert "tensor-parallel degree 3" in reasons["h100", "meta-llama/Llama-2-7b-hf", 3, 64]
    assert reasons["h100", "meta-llama/Llama-2-7b-hf", 1, 256] == "no operator time in the row"


def test_vidur_from_a_checkout(tmp_path: Path) -> None:
    _check_vidur(_vidur_tree(tmp_path / "vidur"))


def test_vidur_from_a_bare_git_mirror(tmp_path: Path) -> None:
    work = _vidur_tree(tmp_path / "work")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "synthetic"], check=True)
    bare = tmp_path / "mirror"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    assert not (bare / bv.ROOT).exists()
    _check_vidur(bare)
    assert bv.revision(bare) == bv.revision(work)
    with pytest.raises(DeviceValueError, match="not a Vidur checkout"):
        bv.mlp_files(tmp_path)


def test_vidur_bad_rows_and_files_are_listed_not_fatal() -> None:
    with pytest.raises(DeviceValueError, match=r"missing column.*num_tokens"):
        bv.parse_mlp_csv("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp\n", "x.csv")
    text = _mlp_csv(
        [_vrow(128, 1) | {"use_gated_mlp": "maybe"}, _vrow(256, 1, attn_rope="fast"), _vrow(512, 1)]
    )
    rows, rejected = bv.parse_mlp_csv(text, "y.csv")
    assert [r["tokens"] for r in rows] == [512]
    assert rejected == [
        "y.csv:2: use_gated_mlp: not a boolean: 'maybe'",
        "y.csv:3: operator time 'fast' is not a number",
    ]
    files = [
        bv.MlpFile("h100", "a/old", "old.csv", "n_head,num_tokens\n8,1\n"),
        bv.MlpFile("h100", "a/b", "b.csv", text),
        bv.MlpFile(
            "h100", "a/c", "c.csv", _mlp_csv([_vrow(64, 1), _vrow(64, 1, shape=(16, 16, 4096, 11008, 32000))])
        ),
    ]
    scored = bv.score_vidur(files)
    assert [tuple(r["unit"]) for r in scored["rows"]] == [("h100", "a/b", 1, 512)]
    reasons = [(s["unit"], s["reason"]) for s in scored["not_scored"]]
    assert (
        ["h100", "a/old"],
        "old.csv: missing column(s) n_kv_head, n_embd, n_expanded_embd, vocab_size, "
        "use_gated_mlp, num_tensor_parallel_workers",
    ) in reasons
    assert (
        ["h100", "a/b"],
        "y.csv:2: use_gated_mlp: not a boolean: 'maybe'",
    ) not in reasons  # source is b.csv
    assert (["h100", "a/b"], "b.csv:2: use_gated_mlp: not a boolean: 'maybe'") in reasons
    assert (["h100", "a/c", 1, 64], "the unit's rows differ in their shape columns") in reasons
    assert len(reasons) == 4
    assert bv.token_band(64) == "1-64" and bv.token_band(65) == "65-512" and bv.token_band(4096) == ">2048"
