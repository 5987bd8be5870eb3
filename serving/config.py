"""Model shapes and engine settings: small slotted dataclasses, presets by name."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting is invalid; the message names the setting and what is allowed."""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.x frequency-dependent RoPE scaling ("rope_type": "llama3")."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a Llama-architecture decoder."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position: int
    rope_theta: float = 500_000.0
    rms_norm_eps: float = 1e-5
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    head_dim_override: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim_override is None and self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    def param_count(self) -> int:
        """Number of parameters (embeddings and lm_head included)."""
        d, hd = self.hidden_size, self.head_dim
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * d * self.intermediate_size
        per_layer = attn + mlp + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V cache that one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelConfig:
        """Read a Hugging Face Llama `config.json`."""
        path = Path(path)
        raw = json.loads(path.read_text())
        arch = raw.get("model_type", "llama")
        if arch != "llama":
            raise ConfigError(f"{path}: model_type {arch!r} is not supported; allowed: 'llama'")
        scaling = raw.get("rope_scaling") or raw.get("rope_parameters")
        rope = None
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ConfigError(
                f"{path}: rope_type {rope_type!r} is not supported; allowed: 'default', 'llama3'"
            )
        if rope_type == "llama3":
            rope = RopeScaling(
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position=int(scaling["original_max_position_embeddings"]),
            )
        theta = raw.get("rope_theta")
        if theta is None and isinstance(scaling, dict):
            theta = scaling.get("rope_theta")
        eos = raw.get("eos_token_id")
        eos_ids = (
            tuple(int(e) for e in eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        )
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim")
        return cls(
            name=name or path.parent.name,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            max_position=int(raw.get("max_position_embeddings", 4096)),
            rope_theta=float(theta if theta is not None else 10_000.0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_scaling=rope,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            head_dim_override=int(head_dim) if head_dim and head_dim != hidden // heads else None,
        )


# Byte-level tokenizer: ids 0..255 are bytes, then BOS and EOS (see serving.tokenizer).
BYTE_VOCAB = 258
BYTE_BOS, BYTE_EOS = 256, 257

_LLAMA3_ROPE = RopeScaling(factor=32.0, original_max_position=8192)
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny",
        vocab_size=BYTE_VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        max_position=16384,
        bos_token_id=BYTE_BOS,
        eos_token_ids=(BYTE_EOS,),
    ),
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b",
        vocab_size=128_256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        max_position=131_072,
        rope_scaling=_LLAMA3_ROPE,
        tie_word_embeddings=True,
        bos_token_id=128_000,
        eos_token_ids=(128_001, 128_008, 128_009),
    ),
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b",
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        max_position=131_072,
        rope_scaling=RopeScaling(factor=8.0),
        bos_token_id=128_000,
        eos_token_ids=(128_001, 128_008, 128_009),
    ),
    "llama-3.1-70b": ModelConfig(
        name="llama-3.1-70b",
        vocab_size=128_256,
        hidden_size=8192,
        intermediate_size=28_672,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        max_position=131_072,
        rope_scaling=RopeScaling(factor=8.0),
        bos_token_id=128_000,
        eos_token_ids=(128_001, 128_008, 128_009),
    ),
}


def preset(name: str) -> ModelConfig:
    """Return the preset model shape called `name`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; allowed: {', '.join(PRESETS)}") from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Scheduler and KV-cache settings of one engine (one worker)."""

    block_size: int = 16
    num_blocks: int = 0  # 0: derived from kv_cache_bytes
    kv_cache_bytes: int = 256 * 2**20
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    chunked_prefill: bool = False
    max_model_len: int = 0  # 0: the model's max_position

    def __post_init__(self) -> None:
        for key in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be > 0, got {getattr(self, key)}")
        if self.num_blocks < 0 or self.kv_cache_bytes < 0 or self.max_model_len < 0:
            raise ConfigError("num_blocks, kv_cache_bytes and max_model_len must be >= 0")

    def resolved(self, model: ModelConfig, dtype_bytes: int) -> EngineConfig:
        """Fill in num_blocks and max_model_len from the model shape and the KV budget."""
        num_blocks = self.num_blocks or max(
            1, self.kv_cache_bytes // (model.kv_bytes_per_token(dtype_bytes) * self.block_size)
        )
        max_len = min(self.max_model_len or model.max_position, model.max_position)
        return replace(self, num_blocks=num_blocks, max_model_len=max_len)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling: greedy when temperature is 0 (or below `sampling.GREEDY_TEMPERATURE`).

    `stop_token_ids` end a request even with `ignore_eos` (as in vLLM); `ignore_eos` only ignores the
    model's EOS ids. A seeded request's token k always uses the same random draw (`serving.sampling`).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    presence_penalty: float = 0.0  # OpenAI's, in [-2, 2]: over the output tokens so far
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:  # NaN fails this too
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        for key in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, key) <= 2:
                raise ConfigError(f"{key} must be in [-2, 2], got {getattr(self, key)}")

    @property
    def penalized(self) -> bool:
        """Whether presence or frequency penalties change the logits."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0


def model_config_for(source: str | Path) -> ModelConfig:
    """The shape of a preset name or of a Hugging Face-format folder, without loading weights."""
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelConfig.from_hf_config(path / "config.json")
    if str(source) in PRESETS:
        return PRESETS[str(source)]
    raise ConfigError(
        f"unknown model {str(source)!r}; allowed: {', '.join(PRESETS)}, "
        "or a Hugging Face-format folder with config.json"
    )
