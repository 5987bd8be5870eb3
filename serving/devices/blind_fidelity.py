"""The blind test of the GPU model v3 (issue 23 point 2; docs/FIDELITY.md, "Blind test"), set (a): the
``bloom-176b`` rows of Splitwise's profiling CSV, scored the way bench/fidelity_table.py scores that
CSV's Llama-2-70B rows. Set (b), Microsoft Vidur's per-operator profiles, is
:mod:`serving.devices.blind_vidur`; the printed report is bench/fidelity_blind.py.

Nothing here holds or was fitted on blind data: the CSV is read from a path at run time (it is not in
the repository), and the lead scores it once, after the model is frozen.

Units (what one figure is the median of, as the protocol defines them for the Llama rows):

* TTFT ``(hardware, tp, prompt_size, batch_size)``: median ``prompt_time`` over all its rows (every
  ``token_size``); modeled as one prefill iteration of ``batch_size`` prompts of ``prompt_size`` tokens
  (:func:`~serving.devices.published.prefill_work`), host time included.
* TPOT ``(hardware, tp, prompt_size, batch_size, token_size)``: median ``token_time``; modeled as the mean
  wall time of the ``token_size - 1`` decode steps of the batch, the one producing token ``k + 1``
  attending ``prompt_size + k`` tokens (every step, no sampling of steps).
* power (same key as TPOT), where the unit's median ``peak_power`` and ``average_power`` are both > 0
  (0 means not recorded): fractions of the GPU's TDP (A100 400 W, H100 700 W; the capped H100 too).
  Modeled as the power helper models the Llama rows (serving/devices/power_fidelity.py): peak = the
  busiest phase's busy power (the prompt iteration's, or a decode step's if higher); average = the
  energy of the prompt iteration and the decode steps (host gaps at the gap power) over their time.

Hardware: ``a100-80gb`` = A100-SXM-80GB over NVLink 3, ``h100-80gb`` = H100 SXM over NVLink 4,
``h100-80gb-pcap`` = the same H100 under a 490 W power limit (70 % of TDP). Engine profile
``splitwise-2023``. Every unit is scored: a blind set cannot be screened for anomalies; a unit the model
cannot run (unknown hardware, a TP degree that does not split the heads, a token time with no decode
step) is listed as not scored with its reason, never dropped silently.

BLOOM-176B (bigscience/bloom config.json): 70 layers, hidden 14336, 112 heads, multi-head attention
(112 KV heads, head dim 128), a GELU MLP of 4 x hidden = 57344 (not gated), vocabulary 250880 with tied
embeddings, ALiBi positions. Expressed as :data:`BLOOM_176B` with the gated width of the same weights
(:func:`~serving.devices.blind_components.equivalent_gated_intermediate`: 38232, weights +0.007 %):
GEMM FLOPs and weight bytes as BLOOM's; the activation's elementwise traffic is the gated shape's; the
biases (0.1 % of the weights) and the LayerNorms' extra parameters are not modeled; ALiBi has no rotary
kernel, which the model does not price apart.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.config import ModelConfig
from serving.devices.blind_components import equivalent_gated_intermediate
from serving.devices.errors import DeviceError, DeviceValueError
from serving.devices.gpu_model import predict_iteration
from serving.devices.gpu_specs import gpu_spec
from serving.devices.published import LINK_OF, decode_work, prefill_work

SPLITWISE_MODEL = "bloom-176b"
PROFILE = "splitwise-2023"
PCAP_POWER_LIMIT_W = 490.0
#: the CSV's hardware names -> (GPU model key, board power limit W or None for the TDP)
HARDWARE: dict[str, tuple[str, float | None]] = {
    "a100-80gb": ("a100-sxm-80gb", None),
    "h100-80gb": ("h100-sxm", None),
    "h100-80gb-pcap": ("h100-sxm", PCAP_POWER_LIMIT_W),
}
COLUMNS = (
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "peak_power",
    "average_power",
    "prompt_time",
    "token_time",
    "tensor_parallel",
)

BLOOM_176B = ModelConfig(
    name="bloom-176b",
    vocab_size=250_880,
    hidden_size=14_336,
    intermediate_size=equivalent_gated_intermediate(4 * 14_336),
    num_layers=70,
    num_heads=112,
    num_kv_heads=112,
    max_position=2048,
    tie_word_embeddings=True,
)
#: the Splitwise model names the scorer knows a shape for
SHAPES: dict[str, ModelConfig] = {SPLITWISE_MODEL: BLOOM_176B}


# -- units --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SplitwiseUnits:
    """Per-unit medians of one model's rows of the CSV (ms; power as fractions of TDP), the rows read,
    and the values rejected (``"line N: ..."``: not a number; the rest of the row still counts)."""

    ttft_ms: dict[tuple[str, int, int, int], float]
    tpot_ms: dict[tuple[str, int, int, int, int], float]
    peak_power_frac: dict[tuple[str, int, int, int, int], float]
    avg_power_frac: dict[tuple[str, int, int, int, int], float]
    rows: int
    rejected: tuple[str, ...] = ()


def load_splitwise_units(path: str | Path, model: str = SPLITWISE_MODEL) -> SplitwiseUnits:
    """Read the CSV at ``path`` and reduce ``model``'s rows to one median per unit (module docstring).
    Only the ``model`` column of the other models' rows is looked at. A value that is not a finite
    number is left out of its unit and listed in ``rejected`` (a row whose unit columns do not parse,
    wholly); an empty power cell reads as 0 (not recorded). Raises
    :class:`~serving.devices.errors.DeviceValueError` naming the file on a missing column or no row of
    ``model``."""
    path = Path(path)
    prompt: dict[tuple, list[float]] = defaultdict(list)
    token: dict[tuple, list[float]] = defaultdict(list)
    peak: dict[tuple, list[float]] = defaultdict(list)
    avg: dict[tuple, list[float]] = defaultdict(list)
    rejected: list[str] = []
    rows = 0
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise DeviceValueError(
                f"{path}: missing column(s) {', '.join(missing)}; a Splitwise perf_model.csv has "
                f"{', '.join(COLUMNS)}"
            )
        for line, row in enumerate(reader, start=2):
            if row["model"] != model:
                continue
            try:
                hw, tp = row["hardware"], parse_int(row["tensor_parallel"])
                n, b = parse_int(row["prompt_size"]), parse_int(row["batch_size"])
                t = parse_int(row["token_size"])
            except (TypeError, ValueError) as e:
                rejected.append(f"line {line}: unit columns: {e}")
                continue
            rows += 1
            for column, store, key in (
                ("prompt_time", prompt, (hw, tp, n, b)),
                ("token_time", token, (hw, tp, n, b, t)),
                ("peak_power", peak, (hw, tp, n, b, t)),
                ("average_power", avg, (hw, tp, n, b, t)),
            ):
                raw = row[column]
                if column.endswith("_power") and (raw or "").strip() == "":
                    raw = "0"
                try:
                    value = float(raw)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    value = math.nan
                if not math.isfinite(value):
                    rejected.append(f"line {line}: {column} {row[column]!r} is not a finite number")
                    continue
                store[key].append(value)
    if not rows:
        raise DeviceValueError(f"{path}: no {model!r} rows (is it Splitwise's data/perf_model.csv?)")

    def med(d: dict[tuple, list[float]]) -> dict[Any, float]:
        return {k: statistics.median(v) for k, v in sorted(d.items())}

    return SplitwiseUnits(med(prompt), med(token), med(peak), med(avg), rows, tuple(rejected))


def parse_int(value: str | None) -> int:
    """An integer cell (``"8"`` or ``"8.0"``); ``ValueError`` naming the value otherwise."""
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {value!r}") from None
    if not f.is_integer():
        raise ValueError(f"not an integer: {value!r}")
    return int(f)


# -- the model ----------------------------------------------------------------------------------------


def modeled_ttft_ms(shape: ModelConfig, hardware: str, tp: int, prompt: int, batch: int) -> float:
    """The model's prompt time of ``batch`` prompts of ``prompt`` tokens (one prefill iteration), ms."""
    gpu, limit = _hardware(hardware)
    est = predict_iteration(
        gpu,
        shape,
        prefill_work(prompt, batch),
        power_limit_w=limit,
        tp=tp,
        link=LINK_OF[gpu],
        profile=PROFILE,
    )
    return est.time_s * 1e3


def modeled_generation(
    shape: ModelConfig, hardware: str, tp: int, prompt: int, batch: int, tokens: int
) -> dict[str, float]:
    """The model's run of one TPOT/power unit: ``tpot_ms`` (mean decode step, ms), ``peak_frac`` and
    ``avg_frac`` (fractions of the GPU's TDP; module docstring)."""
    if tokens < 2:
        raise DeviceValueError(
            f"token_size {tokens}: a token time needs at least one decode step (token_size >= 2)"
        )
    gpu, limit = _hardware(hardware)

    def run(work: Any) -> Any:
        return predict_iteration(
            gpu, shape, work, power_limit_w=limit, tp=tp, link=LINK_OF[gpu], profile=PROFILE
        )

    pre = run(prefill_work(prompt, batch))
    energy_j, time_s, peak_w = pre.energy_j, pre.time_s, pre.power_w
    steps_s = 0.0
    for k in range(1, tokens):
        step = run(decode_work(batch, prompt + k))
        steps_s += step.time_s
        energy_j += step.energy_j
        peak_w = max(peak_w, step.power_w)
    tdp_w = gpu_spec(gpu).tdp_w
    return {
        "tpot_ms": steps_s / (tokens - 1) * 1e3,
        "peak_frac": peak_w / tdp_w,
        "avg_frac": energy_j / (time_s + steps_s) / tdp_w,
    }


def _hardware(hardware: str) -> tuple[str, float | None]:
    try:
        return HARDWARE[hardware]
    except KeyError:
        raise DeviceValueError(f"unknown hardware {hardware!r}; allowed: {', '.join(HARDWARE)}") from None


# -- scoring -------------------------------------------------------------------------------------------


def score_splitwise(units: SplitwiseUnits, shape: ModelConfig = BLOOM_176B) -> dict[str, Any]:
    """Every unit beside the model: ``{"rows": {figure: [row, ...]}, "not_scored": [...]}``, figures
    ``ttft``, ``tpot``, ``peak_power``, ``avg_power``; a row is ``{"unit", "measured", "modeled",
    "error"}`` (``error`` = (model - measured) / measured; ms or fractions of TDP)."""
    out: dict[str, list[dict[str, Any]]] = {"ttft": [], "tpot": [], "peak_power": [], "avg_power": []}
    skipped: list[dict[str, Any]] = []
    for key, ms in units.ttft_ms.items():
        try:
            modeled = modeled_ttft_ms(shape, *key)
        except (DeviceError, ValueError, ArithmeticError) as e:  # listed, never fatal to the one run
            skipped.append({"figure": "ttft", "unit": list(key), "reason": str(e)})
            continue
        out["ttft"].append(_row(key, ms, modeled))
    for key, ms in units.tpot_ms.items():
        peak, avg = units.peak_power_frac.get(key, 0.0), units.avg_power_frac.get(key, 0.0)
        power = peak > 0 and avg > 0
        try:
            m = modeled_generation(shape, *key)
        except (DeviceError, ValueError, ArithmeticError) as e:  # listed, never fatal to the one run
            for figure in ("tpot", "power") if power else ("tpot",):
                skipped.append({"figure": figure, "unit": list(key), "reason": str(e)})
            continue
        out["tpot"].append(_row(key, ms, m["tpot_ms"]))
        if power:
            out["peak_power"].append(_row(key, peak, m["peak_frac"]))
            out["avg_power"].append(_row(key, avg, m["avg_frac"]))
    return {"rows": out, "not_scored": skipped}


def _row(key: Sequence[Any], measured: float, modeled: float) -> dict[str, Any]:
    error = modeled / measured - 1.0 if measured > 0 else math.nan
    return {"unit": list(key), "measured": measured, "modeled": modeled, "error": error}


def error_stats(errors: Iterable[float]) -> dict[str, float]:
    """``n``, the median / p90 (nearest rank) / max of ``|error|``, the signed median (the bias), and the
    count within 15 %, over the finite errors (fractions); ``n_invalid`` counts the others (a measured
    0 or a non-finite figure), which are not dropped silently."""
    values = list(errors)
    finite = [e for e in values if math.isfinite(e)]
    a = sorted(abs(e) for e in finite)
    if not a:
        return {
            "n": 0,
            "n_invalid": len(values),
            "median": math.nan,
            "p90": math.nan,
            "max": math.nan,
            "signed_median": math.nan,
            "within_15pct": 0,
        }
    return {
        "n": len(a),
        "n_invalid": len(values) - len(finite),
        "median": statistics.median(a),
        "p90": a[max(0, math.ceil(0.9 * len(a)) - 1)],
        "max": a[-1],
        "signed_median": statistics.median(finite),
        "within_15pct": sum(e <= 0.15 for e in a),
    }


def summarize(rows: Sequence[dict[str, Any]], group: Any = None, worst: int = 5) -> dict[str, Any]:
    """:func:`error_stats` of ``rows``, the ``worst`` rows by ``|error|``, and, with ``group`` (a function
    of a row), the stats per group."""
    out: dict[str, Any] = {
        "all": error_stats(r["error"] for r in rows),
        "worst": sorted(
            (r for r in rows if math.isfinite(r["error"])), key=lambda r: abs(r["error"]), reverse=True
        )[:worst],
    }
    if group is not None:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            groups[str(group(r))].append(r["error"])
        out["by_group"] = {g: error_stats(errs) for g, errs in sorted(groups.items())}
    return out
