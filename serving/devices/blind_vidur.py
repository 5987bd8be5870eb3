"""The blind test of the GPU model v3 (docs/FIDELITY.md, "Blind test"), set (b): Microsoft Vidur's
per-operator profiles of one transformer layer (github.com/microsoft/vidur,
``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv``), read at run time from a Vidur checkout or git
mirror; nothing of it is in this repository. Set (a) and the shared statistics are
:mod:`serving.devices.blind_fidelity`; the printed report is bench/fidelity_blind.py.

What is compared, per unit ``(gpu, model, tp, num_tokens)``:

* **measured**: the sum over one layer's linear and elementwise operators -- ``input_layernorm``,
  ``attn_pre_proj`` (QKV), ``attn_rope``, ``attn_post_proj`` (O), ``post_attention_layernorm``,
  ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``, ``add`` -- of each operator's
  ``time_stats.<op>.median`` (ms), i.e. everything in the file but the embedding (``emb``); attention
  itself is not in mlp.csv (Vidur's profiled layer replaces it by a random tensor). Vidur profiles one
  rank of a ``num_tensor_parallel_workers``-way shard with the all-reduces switched off
  (``reduce_results=False``), fp16, sarathi-serve's layers in eager PyTorch, 20 repeats; its default
  method sums the CUDA kernels launched inside each operator (torch profiler), so the figure is kernel
  time. An operator the layer does not run (an empty cell, e.g. no post-attention norm in a
  parallel-block model) counts 0. Several rows of one unit: the median of their sums.
* **modeled**: :func:`~serving.devices.blind_components.layer_gpu_s` -- the model's GPU time of one
  layer's non-attention work for a prefill of ``num_tokens`` tokens on one rank of the ``tp``-way shard,
  no all-reduce, no host time, engine profile ``vllm`` (sarathi-serve is a vLLM fork) unless told
  otherwise; it also prices the KV write of the new tokens (under 1 % of the layer's bytes), which
  Vidur's layer does not do.

Shapes come from each row's own columns (``n_head``, ``n_kv_head``, ``n_embd``, ``n_expanded_embd``,
``vocab_size``; the full model's, before sharding). A gated MLP (``use_gated_mlp``) is the shape type's
own; a non-gated (GELU) MLP is expressed with the gated width of the same weights
(:func:`~serving.devices.blind_components.equivalent_gated_intermediate`) and its units are flagged
``gated: False`` (reported apart as well as in the whole). GPUs: ``a100`` = A100-SXM-80GB, ``h100`` =
H100 SXM (Vidur's SKUs: 312 / 1000 fp16 TFLOPS, 80 GB); other GPU folders are listed as skipped.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import statistics
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.config import ConfigError, ModelConfig
from serving.devices.blind_components import equivalent_gated_intermediate, layer_gpu_s
from serving.devices.blind_fidelity import parse_int
from serving.devices.errors import DeviceError, DeviceValueError

ROOT = "data/profiling/compute"
GPUS: dict[str, str] = {"a100": "a100-sxm-80gb", "h100": "h100-sxm"}
PROFILE = "vllm"
#: the operators summed (everything in mlp.csv but the embedding)
OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
KEY_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")


@dataclass(frozen=True, slots=True)
class MlpFile:
    """One profile file: its GPU folder, ``org/model`` and text."""

    gpu: str
    model: str
    path: str
    text: str


# -- reading ------------------------------------------------------------------------------------------


def mlp_paths(repo: str | Path, rev: str = "HEAD") -> list[str]:
    """Paths (relative to the repository) of every ``mlp.csv`` under :data:`ROOT`: from the working tree
    when ``repo`` has one, else from the git repository (a bare mirror) at ``rev``."""
    repo = Path(repo)
    tree = repo / ROOT
    if tree.is_dir():
        return sorted(str(p.relative_to(repo)) for p in tree.rglob("mlp.csv"))
    listing = _git(repo, "ls-tree", "-r", "--name-only", rev, ROOT)
    return sorted(p for p in listing.splitlines() if p.endswith("/mlp.csv"))


def read_text(repo: str | Path, path: str, rev: str = "HEAD") -> str:
    """The text of ``path`` in ``repo`` (its working tree, else git at ``rev``)."""
    repo = Path(repo)
    if (repo / ROOT).is_dir():
        return (repo / path).read_text()
    return _git(repo, "show", f"{rev}:{path}")


def revision(repo: str | Path, rev: str = "HEAD") -> str | None:
    """The commit ``rev`` names in ``repo`` (None when it is not a git repository)."""
    try:
        return _git(Path(repo), "rev-parse", rev).strip()
    except DeviceValueError:
        return None


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeviceValueError(f"{repo}: cannot run git ({e})") from None
    if done.returncode:
        raise DeviceValueError(
            f"{repo}: not a Vidur checkout or git repository with {ROOT}/ (git {args[0]}: "
            f"{done.stderr.strip()[:200]})"
        )
    return done.stdout


def mlp_files(repo: str | Path, rev: str = "HEAD") -> tuple[list[MlpFile], list[dict[str, str]]]:
    """The profile files of the GPUs in :data:`GPUS`, and the others as ``{"path", "reason"}``."""
    files, skipped = [], []
    for path in mlp_paths(repo, rev):
        parts = path[len(ROOT) + 1 :].split("/")
        if len(parts) != 4:
            skipped.append({"path": path, "reason": "not <gpu>/<org>/<model>/mlp.csv"})
            continue
        gpu, org, model, _ = parts
        if gpu not in GPUS:
            skipped.append(
                {"path": path, "reason": f"GPU {gpu!r} is not modeled (allowed: {', '.join(GPUS)})"}
            )
            continue
        files.append(MlpFile(gpu, f"{org}/{model}", path, read_text(repo, path, rev)))
    if not files and not skipped:
        raise DeviceValueError(f"{repo}: no {ROOT}/<gpu>/<org>/<model>/mlp.csv")
    return files, skipped


# -- units --------------------------------------------------------------------------------------------


def parse_mlp_csv(text: str, source: str = "mlp.csv") -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of one mlp.csv -- ``tp``, ``tokens``, ``shape`` (the :data:`SHAPE_COLUMNS` as a tuple),
    ``layer_ms`` (the :data:`OPS` medians summed; None when no operator has a figure) and ``ops`` (how
    many had one) -- and the rows left out (``"source:line: why"``: a key or shape cell that does not
    parse, or an operator figure that is not a number). Raises :class:`DeviceValueError` naming the
    source on a missing key or shape column."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or ()
    missing = [c for c in (*SHAPE_COLUMNS, *KEY_COLUMNS) if c not in header]
    if missing:
        raise DeviceValueError(f"{source}: missing column(s) {', '.join(missing)}")
    rows, rejected = [], []
    for line, row in enumerate(reader, start=2):
        try:
            shape = (
                parse_int(row["n_head"]),
                parse_int(row["n_kv_head"]),
                parse_int(row["n_embd"]),
                parse_int(row["n_expanded_embd"]),
                parse_int(row["vocab_size"]),
                _bool(row["use_gated_mlp"]),
            )
            tokens, tp = parse_int(row["num_tokens"]), parse_int(row["num_tensor_parallel_workers"])
            times = [_float(row.get(f"time_stats.{op}.median")) for op in OPS]
        except (TypeError, ValueError) as e:
            rejected.append(f"{source}:{line}: {e}")
            continue
        present = [t for t in times if t is not None]
        rows.append(
            {
                "tp": tp,
                "tokens": tokens,
                "shape": shape,
                "layer_ms": sum(present) if present else None,
                "ops": len(present),
            }
        )
    return rows, rejected


def _float(value: str | None) -> float | None:
    # an empty or NaN cell: the operator did not run in this layer
    if value is None or value.strip() == "":
        return None
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"operator time {value!r} is not a number") from None
    return f if math.isfinite(f) else None


def _bool(value: str | None) -> bool:
    v = (value or "").strip().lower()
    if v in ("true", "1", "1.0"):
        return True
    if v in ("false", "0", "0.0"):
        return False
    raise ValueError(f"use_gated_mlp: not a boolean: {value!r}")


@functools.lru_cache(maxsize=256)
def shape_of(model: str, shape: tuple[int, int, int, int, int, bool]) -> ModelConfig:
    """The :class:`ModelConfig` of a profile row's shape columns (module docstring: a non-gated MLP as
    the gated width of the same weights). ``num_layers`` is 1: :func:`layer_gpu_s` sets its own."""
    n_head, n_kv_head, n_embd, mlp, vocab, gated = shape
    try:
        return ModelConfig(
            name=model,
            vocab_size=vocab,
            hidden_size=n_embd,
            intermediate_size=mlp if gated else equivalent_gated_intermediate(mlp),
            num_layers=1,
            num_heads=n_head,
            num_kv_heads=n_kv_head,
            max_position=4096,
        )
    except ConfigError as e:
        raise DeviceValueError(f"{model}: shape {shape} cannot be expressed: {e}") from None


def vidur_units(files: Iterable[MlpFile]) -> tuple[dict[tuple, dict[str, Any]], list[dict[str, Any]]]:
    """Per unit ``(gpu, model, tp, tokens)``: ``measured_ms`` (the median over the unit's rows of their
    summed operators), ``shape`` and ``rows``; and what is not scored, each with its reason: a file
    without the key columns, a row that does not parse or has no operator figure, a unit whose rows
    disagree on the shape."""
    sums: dict[tuple, list[float]] = defaultdict(list)
    shapes: dict[tuple, tuple] = {}
    conflicting: set[tuple] = set()
    skipped: list[dict[str, Any]] = []
    for f in files:
        try:
            parsed, rejected = parse_mlp_csv(f.text, f.path)
        except DeviceValueError as e:
            skipped.append({"unit": [f.gpu, f.model], "reason": str(e)})
            continue
        skipped += [{"unit": [f.gpu, f.model], "reason": why} for why in rejected]
        for r in parsed:
            key = (f.gpu, f.model, r["tp"], r["tokens"])
            if r["layer_ms"] is None:
                skipped.append({"unit": list(key), "reason": "no operator time in the row"})
                continue
            if shapes.setdefault(key, r["shape"]) != r["shape"]:
                conflicting.add(key)
            sums[key].append(r["layer_ms"])
    for key in sorted(conflicting):
        skipped.append({"unit": list(key), "reason": "the unit's rows differ in their shape columns"})
    units = {
        k: {"measured_ms": statistics.median(v), "shape": shapes[k], "rows": len(v)}
        for k, v in sorted(sums.items())
        if k not in conflicting
    }
    return units, skipped


# -- scoring ------------------------------------------------------------------------------------------


def score_vidur(files: Iterable[MlpFile], profile: str = PROFILE) -> dict[str, Any]:
    """Every unit beside the model: ``{"rows": [...], "not_scored": [...]}``; a row is ``{"unit",
    "measured", "modeled", "error", "gated"}`` (ms per layer; ``error`` = (model - measured) / measured)."""
    units, skipped = vidur_units(files)
    rows = []
    for key, u in units.items():
        gpu, model, tp, tokens = key
        try:
            shape = shape_of(model, u["shape"])
            modeled = layer_gpu_s(GPUS[gpu], shape, tokens, tp=tp, profile=profile) * 1e3
        except (DeviceError, ValueError, ArithmeticError) as e:  # listed, never fatal to the one run
            skipped.append({"unit": list(key), "reason": str(e)})
            continue
        measured = u["measured_ms"]
        rows.append(
            {
                "unit": list(key),
                "measured": measured,
                "modeled": modeled,
                "error": modeled / measured - 1.0 if measured > 0 else math.nan,
                "gated": u["shape"][5],
            }
        )
    return {"rows": rows, "not_scored": skipped}


TOKEN_BANDS = ("1-64", "65-512", "513-2048", ">2048")


def token_band(tokens: int) -> str:
    """The num_tokens band (:data:`TOKEN_BANDS`) a unit is reported in."""
    for top, name in zip((64, 512, 2048), TOKEN_BANDS[:-1], strict=True):
        if tokens <= top:
            return name
    return TOKEN_BANDS[-1]
