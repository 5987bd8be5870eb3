"""Loading weights: parity with transformers' Llama, sharded checkpoints, presets, dtypes and errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from serving.config import ConfigError, preset
from serving.weights import WeightsError, load_model, model_dtype

HF_BASE: dict[str, Any] = {
    "vocab_size": 300,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 160,
    "max_position_embeddings": 256,
    "rope_theta": 10_000.0,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
VARIANTS = {
    "plain": {},
    "llama3-rope": {"rope_scaling": LLAMA3_ROPE, "num_hidden_layers": 3},
    "tied": {"tie_word_embeddings": True},
}


def _hf_checkpoint(folder: Path, **overrides: Any) -> Any:
    """Save a random transformers LlamaForCausalLM (norm weights perturbed too) to `folder`."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{**HF_BASE, **overrides}, attn_implementation="eager")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.05)
    return hf


def _seqs() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (1, 9, 100)]


def _assert_parity(hf: Any, folder: Path) -> None:
    model, cfg = load_model(folder)
    assert cfg.vocab_size == 300 and cfg.num_layers == hf.config.num_hidden_layers
    for ids in _seqs():
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].float()
        got = model.full_logits(ids)
        assert got.shape == want.shape
        assert (got - want).abs().max().item() < 1e-4, f"len {len(ids)}"


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(tmp_path: Path, variant: str) -> None:
    hf = _hf_checkpoint(tmp_path, **VARIANTS[variant])
    hf.save_pretrained(tmp_path)
    model, cfg = load_model(tmp_path)
    if variant == "tied":
        assert cfg.tie_word_embeddings
        assert model.lm_head.weight is model.model.embed_tokens.weight
    if variant == "llama3-rope":
        assert cfg.rope_scaling is not None and cfg.rope_scaling.original_max_position == 64
    _assert_parity(hf, tmp_path)


@pytest.mark.slow
def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    hf = _hf_checkpoint(tmp_path)
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    _assert_parity(hf, tmp_path)


@pytest.mark.slow
def test_shards_without_index_load(tmp_path: Path) -> None:
    hf = _hf_checkpoint(tmp_path)
    hf.save_pretrained(tmp_path, max_shard_size="50KB")
    (tmp_path / "model.safetensors.index.json").unlink()
    _assert_parity(hf, tmp_path)


# --- hand-written checkpoints (no transformers needed) -------------------------------------------

SMALL_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rope_theta": 10_000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def _small_tensors() -> dict[str, torch.Tensor]:
    d, f, kv = 32, 64, 2 * 8
    g = torch.Generator().manual_seed(0)
    t = {
        "model.embed_tokens.weight": torch.randn(300, d, generator=g),
        "model.norm.weight": torch.ones(d),
        "lm_head.weight": torch.randn(300, d, generator=g),
        "model.layers.0.input_layernorm.weight": torch.ones(d),
        "model.layers.0.post_attention_layernorm.weight": torch.ones(d),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(d, d, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(kv, d, generator=g),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(kv, d, generator=g),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(d, d, generator=g),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(f, d, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(f, d, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(d, f, generator=g),
    }
    return {k: v * 0.05 for k, v in t.items()}


def _write(folder: Path, tensors: dict[str, torch.Tensor], **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**SMALL_CONFIG, **config}))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_hand_written_checkpoint_loads_exact_values(tmp_path: Path) -> None:
    tensors = _small_tensors()
    model, cfg = load_model(_write(tmp_path / "m", tensors))
    assert cfg.name == "m" and cfg.num_layers == 1
    state = model.state_dict()
    for name, value in tensors.items():
        assert torch.equal(state[name], value), name
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training


def test_rotary_inv_freq_buffers_are_ignored(tmp_path: Path) -> None:
    tensors = {**_small_tensors(), "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(4)}
    load_model(_write(tmp_path, tensors))


def test_tied_checkpoint_may_carry_lm_head(tmp_path: Path) -> None:
    tensors = _small_tensors()
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    model, _ = load_model(_write(tmp_path, tensors, tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    tensors = _small_tensors()
    del tensors["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(WeightsError, match=r"missing tensors: model\.layers\.0\.mlp\.up_proj\.weight"):
        load_model(_write(tmp_path, tensors))


def test_untied_checkpoint_needs_lm_head(tmp_path: Path) -> None:
    tensors = _small_tensors()
    del tensors["lm_head.weight"]
    with pytest.raises(WeightsError, match=r"missing tensors: lm_head\.weight"):
        load_model(_write(tmp_path, tensors))


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    tensors = {**_small_tensors(), "model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 32)}
    with pytest.raises(
        WeightsError,
        match=r"wrong shapes: model\.layers\.0\.self_attn\.k_proj\.weight \[32, 32\] \(expected \[16, 32\]\)",
    ):
        load_model(_write(tmp_path, tensors))


def test_wrong_shape_is_caught_on_meta(tmp_path: Path) -> None:
    folder = _write(tmp_path, _small_tensors(), vocab_size=512)
    with pytest.raises(WeightsError, match=r"embed_tokens\.weight \[300, 32\] \(expected \[512, 32\]\)"):
        load_model(folder, device="meta")


def test_unexpected_tensors_are_named_and_capped(tmp_path: Path) -> None:
    extra = {f"model.layers.{i}.mlp.up_proj.weight": torch.zeros(1) for i in range(1, 9)}
    with pytest.raises(WeightsError, match=r"unexpected tensors: .*\(and 3 more\)") as err:
        load_model(_write(tmp_path, {**_small_tensors(), **extra}))
    assert "model.layers.1.mlp.up_proj.weight" in str(err.value)


def test_index_naming_absent_shard(tmp_path: Path) -> None:
    folder = _write(tmp_path, _small_tensors())
    index = {"weight_map": {name: "model-00002-of-00002.safetensors" for name in _small_tensors()}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=r"absent: model-00002-of-00002\.safetensors"):
        load_model(folder)


def test_folder_without_weights_or_config(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"no config\.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(SMALL_CONFIG))
    with pytest.raises(WeightsError, match=r"no \*\.safetensors"):
        load_model(tmp_path)


def test_checkpoint_loads_in_bf16(tmp_path: Path) -> None:
    tensors = _small_tensors()
    model, _ = load_model(_write(tmp_path, tensors), dtype="bf16")
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.inv_freq.dtype == torch.float32
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"].to(torch.bfloat16))
    assert torch.get_default_dtype() == torch.float32


# --- presets -------------------------------------------------------------------------------------


def test_unknown_preset_names_allowed_presets(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown model preset 'nope'.*tiny.*not a checkpoint folder"):
        load_model("nope")
    afile = tmp_path / "weights.safetensors"
    afile.write_bytes(b"")
    with pytest.raises(ConfigError, match="not a checkpoint folder either"):
        load_model(afile)


def test_preset_is_seeded_and_typed() -> None:
    a, cfg = load_model("tiny", seed=3)
    b, _ = load_model("tiny", seed=3)
    c, _ = load_model("tiny", seed=4)
    assert cfg == preset("tiny")
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    half, _ = load_model("tiny", dtype=torch.float16)
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    assert half.full_logits([256, 104, 105]).shape == (3, cfg.vocab_size)
    assert torch.get_default_dtype() == torch.float32


def test_big_preset_on_meta_allocates_nothing() -> None:
    model, cfg = load_model("llama-3.2-1b", device="meta", dtype="bf16")
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == cfg.param_count()
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tuple(model.model.embed_tokens.weight.shape) == (128_256, 2048)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_model_dtype(name: Any, dtype: torch.dtype) -> None:
    assert model_dtype(name) is dtype


def test_model_dtype_error_names_allowed() -> None:
    with pytest.raises(ConfigError, match=r"unknown model dtype 'int8'; allowed: float32, fp32, bfloat16"):
        model_dtype("int8")
    with pytest.raises(ConfigError, match="allowed"):
        model_dtype(torch.float64)


def test_saved_file_roundtrip_keeps_names(tmp_path: Path) -> None:
    """Our own state dict saved as safetensors loads back (names are Hugging Face's)."""
    model, _ = load_model(_write(tmp_path / "a", _small_tensors()))
    out = tmp_path / "b"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(SMALL_CONFIG))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    again, _ = load_model(out)
    assert set(load_file(str(out / "model.safetensors"))) == set(_small_tensors())
    torch.testing.assert_close(again.full_logits([1, 2, 3]), model.full_logits([1, 2, 3]))
