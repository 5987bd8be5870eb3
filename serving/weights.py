"""Build a model from a preset (random weights) or a local Hugging Face-format checkpoint folder.

A checkpoint folder holds `config.json` (a Llama config, see `ModelConfig.from_hf_config`) and one or
more `*.safetensors` files; when sharded, `model.safetensors.index.json` maps each tensor to its file.
Tensors are read one at a time (`safetensors.safe_open`) and copied into a model that was built
directly on the target device in the target dtype, so peak memory stays at one model plus one tensor.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from serving.config import PRESETS, ConfigError, ModelConfig, preset
from serving.model import LlamaForCausalLM

__all__ = ["WeightsError", "load_model", "model_dtype"]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
_INDEX = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_MAX_LISTED = 5
# torch's default dtype is process-global: serialise the builds that change it.
_BUILD_LOCK = threading.Lock()


class WeightsError(ValueError):
    """A checkpoint does not fit the model: missing, unexpected or mis-shaped tensors, bad files."""


def model_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map a dtype name ("float32"/"fp32", "bfloat16"/"bf16", "float16"/"fp16") to a torch dtype.

    A `torch.dtype` among those is returned as is; anything else raises `ConfigError`.
    """
    if isinstance(name, torch.dtype):
        if name in _DTYPES.values():
            return name
        raise ConfigError(f"model dtype {name} is not supported; allowed: {', '.join(_DTYPES)}")
    key = str(name).strip().lower().removeprefix("torch.")
    try:
        return _DTYPES[key]
    except KeyError:
        raise ConfigError(f"unknown model dtype {name!r}; allowed: {', '.join(_DTYPES)}") from None


def load_model(
    source: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model named by `source` on `device` in `dtype`; return it (in eval mode) and its shape.

    `source` is either a folder holding `config.json` and safetensors weights, or a preset name from
    `serving.config.PRESETS` (random weights drawn from `seed`). On the "meta" device nothing is
    allocated and nothing is read: a checkpoint's tensor names and shapes are still checked.

    Raises `ConfigError` for an unknown preset that is not a folder either (or a bad config/dtype)
    and `WeightsError` when the checkpoint's tensors do not match the model.
    """
    dtype = model_dtype(dtype)
    dev = torch.device(device)
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file():
        cfg = ModelConfig.from_hf_config(path / "config.json")
        model = _build(cfg, dev, dtype)
        _load_checkpoint(model, path, dev)
    elif str(source) in PRESETS:
        cfg = preset(str(source))
        model = _build(cfg, dev, dtype)
        if dev.type != "meta":
            model.init_random(seed)
    elif path.is_dir():
        raise WeightsError(f"{path}: folder has no config.json (a Hugging Face-format checkpoint needs one)")
    else:
        try:
            preset(str(source))
        except ConfigError as err:
            what = "a file" if path.exists() else "does not exist"
            raise ConfigError(
                f"{err}; and {str(source)!r} is not a checkpoint folder either ({what})"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover
    model.eval().requires_grad_(False)
    return model, cfg


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    with _BUILD_LOCK:
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(old)


def _build(cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """Construct the model with every parameter created on `device` in `dtype` (no fp32 CPU copy)."""
    with _default_dtype(dtype), device:
        return LlamaForCausalLM(cfg)


def _checkpoint_files(folder: Path) -> dict[str, Path]:
    """Map each tensor name in the checkpoint to the safetensors file that holds it."""
    index = folder / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise WeightsError(f"{index}: not a safetensors index ({err})") from None
        files = {name: folder / file for name, file in weight_map.items()}
        absent = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if absent:
            raise WeightsError(f"{index}: lists shard files that are absent: {_listed(absent)}")
        return files
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise WeightsError(f"{folder}: no *.safetensors files (and no {_INDEX})")
    files: dict[str, Path] = {}
    for shard in shards:
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in files:
                    raise WeightsError(
                        f"{folder}: tensor {name!r} is in both {files[name].name} and {shard.name}"
                    )
                files[name] = shard
    return files


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_MAX_LISTED])
    return shown + (f" (and {len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else "")


def _load_checkpoint(model: LlamaForCausalLM, folder: Path, device: torch.device) -> None:
    """Check the checkpoint's names and shapes against `model`, then copy its tensors in."""
    cfg = model.config
    params = model.state_dict(keep_vars=True)
    if cfg.tie_word_embeddings:
        params.pop("lm_head.weight")  # shares embed_tokens.weight; checkpoints usually omit it
    files = _checkpoint_files(folder)
    tied_extra = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    names = {n for n in files if not n.endswith(_IGNORED_SUFFIXES) and n not in tied_extra}

    missing = sorted(set(params) - names)
    unexpected = sorted(names - set(params))
    problems = []
    if missing:
        problems.append(f"missing tensors: {_listed(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_listed(unexpected)}")

    by_file: dict[Path, list[str]] = {}
    for name in sorted(names & set(params)):
        by_file.setdefault(files[name], []).append(name)
    mismatched = []
    for file, file_names in by_file.items():
        with safe_open(file, framework="pt") as f:
            for name in file_names:
                shape = tuple(f.get_slice(name).get_shape())
                want = tuple(params[name].shape)
                if shape != want:
                    mismatched.append(f"{name} {list(shape)} (expected {list(want)})")
    if mismatched:
        problems.append(f"wrong shapes: {_listed(mismatched)}")
    if problems:
        raise WeightsError(
            f"{folder}: checkpoint does not match the {cfg.name!r} config: " + "; ".join(problems)
        )
    if device.type == "meta":
        return

    with torch.no_grad():
        for file, file_names in by_file.items():
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in file_names:
                    params[name].copy_(f.get_tensor(name))
