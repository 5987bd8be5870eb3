"""What every export target shares: the layout to deploy (from a layout string or a
recommendation's ``proposed`` JSON), the model's Hugging Face name, Kubernetes names, and each
pool's vLLM engine arguments (the fields AIConfigurator writes into its generated Dynamo
manifests: tensor/pipeline/data-parallel size, max-num-seqs, max-num-batched-tokens, plus the
chunked-prefill switch and the KV settings the layout fixes)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from serving.config import PRESETS, ConfigError
from serving.sim.layout import Layout, LayoutError, PoolSpec, check_layout, parse_layout

# The runtime image AIConfigurator 0.12.0 writes for Dynamo 1.3.0 with vLLM.
DEFAULT_IMAGE = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.3.0"
DEFAULT_HF_SECRET = "hf-token-secret"
FRONTEND_PORT = 8000
SHARED_MEMORY = "64Gi"  # what AIConfigurator gives a vLLM worker's /dev/shm
ANNOTATION = "phaselens.io"

# phaselens's model shapes -> the Hugging Face checkpoints they are the shape of.
HF_MODELS = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B-Instruct",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
}

# Node labels of NVIDIA's GPU feature discovery (``nvidia.com/gpu.product``), as AIConfigurator
# writes them for the same GPUs.
GPU_PRODUCTS = {
    "h100-sxm": "NVIDIA-H100-SXM5-80GB",
    "h200": "NVIDIA-H200",
    "a100-sxm-80gb": "NVIDIA-A100-SXM4-80GB",
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ExportError(ValueError):
    """A layout, model or recommendation that cannot be exported (the message names what and
    what is allowed)."""


@dataclass(frozen=True, slots=True)
class ExportSpec:
    """One layout to deploy, with the names and image the manifests use."""

    layout: Layout
    layout_text: str
    model: str  # phaselens shape name or a Hugging Face id
    hf_model: str
    name: str
    namespace: str | None = None
    image: str = DEFAULT_IMAGE
    hf_secret: str | None = DEFAULT_HF_SECRET
    recommendation_id: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)


def hf_model_of(model: str) -> str:
    """The Hugging Face id to serve for ``model``: a phaselens shape's checkpoint, or ``model``
    itself when it is already an ``org/name`` id."""
    if model in HF_MODELS:
        return HF_MODELS[model]
    if _HF_ID.match(model):
        return model
    raise ExportError(
        f"model {model!r} is neither a phaselens shape with a checkpoint ({', '.join(HF_MODELS)}) "
        "nor a Hugging Face id such as meta-llama/Llama-3.1-70B-Instruct"
    )


def k8s_name(text: str, *, limit: int = 45) -> str:
    """``text`` as a DNS-1123 label of at most ``limit`` characters (Grove and Dynamo prefix pod
    names with it, so it stays well under 63)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    if not name or not _DNS_LABEL.match(name):
        raise ExportError(f"name {text!r} gives no valid Kubernetes name (lowercase letters, digits, '-')")
    return name


def export_spec(
    layout_text: str,
    model: str,
    *,
    name: str | None = None,
    namespace: str | None = None,
    image: str | None = None,
    hf_secret: str | None = DEFAULT_HF_SECRET,
    recommendation_id: str | None = None,
) -> ExportSpec:
    """Parse and check ``layout_text`` for ``model``; ExportError names what is wrong.

    A phaselens shape is checked as the simulator checks it (TP divides the heads, the shard fits
    the GPU with room for KV, knobs within the GPU's bounds); a Hugging Face id is served as given.
    """
    try:
        layout = parse_layout(layout_text)
    except LayoutError as e:
        raise ExportError(str(e)) from e
    hf = hf_model_of(model)
    if model in PRESETS:
        try:
            check_layout(layout, PRESETS[model])
        except ConfigError as e:
            raise ExportError(f"layout {layout_text!r} cannot serve {model}: {e}") from e
    if namespace is not None and not _DNS_LABEL.match(namespace):
        raise ExportError(f"namespace {namespace!r} is not a DNS-1123 label (lowercase letters, digits, '-')")
    mode = "agg" if layout.mode == "aggregated" else _xpyd(layout)
    base = name or f"{model.rsplit('/', 1)[-1]}-{mode}-{layout.gpu}"
    annotations = {f"{ANNOTATION}/layout": layout_text.strip(), f"{ANNOTATION}/model": model}
    if recommendation_id:
        annotations[f"{ANNOTATION}/recommendation-id"] = recommendation_id
    annotations.update(_unexported_knobs(layout))
    return ExportSpec(
        layout=layout,
        layout_text=layout_text.strip(),
        model=model,
        hf_model=hf,
        name=k8s_name(base),
        namespace=namespace,
        image=image or DEFAULT_IMAGE,
        hf_secret=hf_secret,
        recommendation_id=recommendation_id,
        annotations=annotations,
    )


def spec_from_recommendation(rec: dict[str, Any], **options: Any) -> ExportSpec:
    """The ExportSpec of a recommendation row's ``proposed`` layout (docs: the shared contract,
    ``proposed`` = {"layout", "describe", "model", "gpus"}); JSON columns may arrive as text."""
    rid = rec.get("recommendation_id")
    proposed = _json_value(rec.get("proposed"), "proposed", rid)
    if not isinstance(proposed, dict) or not proposed.get("layout"):
        raise ExportError(f"recommendation {rid}: its proposed JSON has no 'layout' (got {proposed!r:.200})")
    if rec.get("kind") not in (None, "layout"):
        raise ExportError(f"recommendation {rid} is of kind {rec.get('kind')!r}; only layout ones export")
    model = options.pop("model", None) or proposed.get("model")
    if not model:
        raise ExportError(f"recommendation {rid}: its proposed JSON names no 'model'; pass --model")
    spec = export_spec(str(proposed["layout"]), str(model), recommendation_id=rid, **options)
    gpus = proposed.get("gpus")
    if gpus is not None and (not isinstance(gpus, int | float) or int(gpus) != spec.layout.gpus):
        raise ExportError(
            f"recommendation {rid}: proposed says {gpus} GPUs but its layout {spec.layout_text!r} "
            f"uses {spec.layout.gpus}"
        )
    return spec


def engine_args(spec: ExportSpec, pool: PoolSpec) -> list[str]:
    """The ``python3 -m dynamo.vllm`` arguments of one pool's workers (strings, as in a pod spec)."""
    args = [
        "--model", spec.hf_model,
        "--served-model-name", spec.hf_model,
        "--tensor-parallel-size", str(pool.tp),
        "--pipeline-parallel-size", "1",
        "--data-parallel-size", "1",
        "--max-num-seqs", str(pool.max_num_seqs),
        "--max-num-batched-tokens", str(pool.max_num_batched_tokens),
        "--enable-chunked-prefill" if pool.chunked_prefill else "--no-enable-chunked-prefill",
        "--gpu-memory-utilization", f"{spec.layout.gpu_memory_utilization:g}",
    ]  # fmt: skip
    if pool.kv_blocks is not None:
        args += ["--num-gpu-blocks-override", str(pool.kv_blocks)]
    if pool.role in ("prefill", "decode"):
        args += [
            "--disaggregation-mode", pool.role,
            "--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                                               separators=(",", ":")),
        ]  # fmt: skip
    return args


def worker_names(pool: PoolSpec) -> tuple[str, str]:
    """(Dynamo service name, Grove clique name) of a pool's workers, as AIConfigurator names them."""
    return {
        "mixed": ("VllmWorker", "worker"),
        "prefill": ("VllmPrefillWorker", "prefill"),
        "decode": ("VllmDecodeWorker", "decode"),
    }[pool.role]


def node_selector(spec: ExportSpec) -> dict[str, str]:
    """The GPU-product node selector of the layout's GPU (empty for a GPU without a known label)."""
    product = GPU_PRODUCTS.get(spec.layout.gpu)
    return {"nvidia.com/gpu.product": product} if product else {}


def _xpyd(layout: Layout) -> str:
    p, d = layout.pool("prefill"), layout.pool("decode")
    return f"{p.replicas if p else 0}p{d.replicas if d else 0}d"


def _unexported_knobs(layout: Layout) -> dict[str, str]:
    """Layout settings a Kubernetes manifest cannot carry (GPU power and clocks, the links): kept as
    annotations so the exported document loses nothing silently."""
    out: dict[str, str] = {}
    for p in layout.pools:
        if p.power_limit_w is not None:
            out[f"{ANNOTATION}/{p.role}-power-limit-w"] = f"{p.power_limit_w:g}"
        if p.sm_clock_mhz is not None:
            out[f"{ANNOTATION}/{p.role}-sm-clock-mhz"] = f"{p.sm_clock_mhz[0]}-{p.sm_clock_mhz[1]}"
    out[f"{ANNOTATION}/kv-link"] = layout.kv_link
    out[f"{ANNOTATION}/tp-link"] = layout.tp_link
    return out


def _json_value(value: Any, what: str, rid: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as e:
            raise ExportError(f"recommendation {rid}: its {what} column is not JSON ({e})") from e
    return value
