"""The fidelity protocol of the GPU model v3 (issue 23; docs/FIDELITY.md, "Protocol"): every llama2-70b
unit of Splitwise's profiling CSV as a scored :class:`~serving.devices.published.Point`, each in exactly
one of calibration / validation / test (or excluded as an anomaly, with its data-based reason), and the
fixed test set with the rule that generated it.

* TEST: fixed on 2026-12-05 04:55 UTC before any v3 mechanism was tried (:data:`TEST_UNITS`, 206 units:
  38 TTFT, 78 TPOT, 90 power): per (hardware, tp) and figure, the units v2 had not seen
  (:data:`SEEN_V2`) sorted by ``sha256(f"{figure}|{'|'.join(unit)}")``, the first ``ceil(n / 2)``
  (:func:`test_units_by_rule` regenerates it). Scored once, after the model is frozen.
* CALIBRATION (fixed 2026-12-05 04:46 UTC, commit c7bfc48, before any v3 mechanism was tried): of the remaining units of
  the uncapped GPUs (``h100-80gb``, ``a100-80gb``), per (hardware, tp) and figure, sorted by
  ``sha256(f"calibration|{figure}|{'|'.join(unit)}")``, the first ``ceil(m / 2)``
  (:func:`calibration_units_by_rule`). The power-capped H100's units are never calibration: their timing
  depends on the power model's clock under the cap (validation only).
* VALIDATION: every other unit.

Units (``unit`` = strings as the CSV writes them): TTFT ``(hardware, tp, prompt_size, batch_size)``, TPOT
and power ``(hardware, tp, prompt_size, batch_size, token_size)``. The power units are scored by the power
model's tables (docs/FIDELITY.md, "Power"), not here.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable

from serving.devices import published_gptfast, published_lmdeploy
from serving.devices.published import POINTS as OTHER_POINTS
from serving.devices.published import Point
from serving.devices.published_splitwise import TPOT_MS, TTFT_MS

Unit = tuple[str, ...]  # (figure, hardware, tp, prompt, batch[, token]) as strings
Key = tuple  # (figure, hardware, tp, prompt, batch[, token]) with ints

#: the CSV's hardware names -> (GPU model key, board power limit W); the capped H100 runs at 70 % of its
#: 700 W TDP (issue 23: "the cap is 70 % of TDP, 490 W")
HARDWARE: dict[str, tuple[str, float | None]] = {
    "h100-80gb": ("h100-sxm", None),
    "a100-80gb": ("a100-sxm-80gb", None),
    "h100-80gb-pcap": ("h100-sxm", 490.0),
}
PCAP_POWER_LIMIT_W = 490.0


def _seen_v2() -> frozenset[Key]:
    """Every Splitwise unit published.py held on main a227e6c, and the H100 batches of 512-token prompts
    (``prompt_step_evidence``): what v2's design looked at."""
    seen: set[Key] = set()
    for tp in (2, 4, 8):
        for hw in ("h100-80gb", "a100-80gb"):
            seen |= {("ttft", hw, tp, n, 1) for n in (128, 1024, 2048, 4096, 8192)}
            seen |= {("tpot", hw, tp, 512, b, 128) for b in (1, 8, 32)}
        seen |= {("ttft", "h100-80gb", tp, 512, b) for b in (1, 2, 4, 8, 16)}
    seen.add(("ttft", "h100-80gb", 8, 256, 1))
    return frozenset(seen)


SEEN_V2 = _seen_v2()

TEST_UNITS: tuple[Key, ...] = (
    ("ttft", "a100-80gb", 2, 256, 1),
    ("ttft", "a100-80gb", 2, 512, 2),
    ("ttft", "a100-80gb", 2, 512, 16),
    ("ttft", "a100-80gb", 2, 512, 64),
    ("ttft", "a100-80gb", 4, 512, 1),
    ("ttft", "a100-80gb", 4, 512, 8),
    ("ttft", "a100-80gb", 4, 512, 32),
    ("ttft", "a100-80gb", 4, 512, 64),
    ("ttft", "a100-80gb", 8, 256, 1),
    ("ttft", "a100-80gb", 8, 512, 1),
    ("ttft", "a100-80gb", 8, 512, 2),
    ("ttft", "a100-80gb", 8, 512, 64),
    ("ttft", "h100-80gb", 2, 256, 1),
    ("ttft", "h100-80gb", 2, 512, 32),
    ("ttft", "h100-80gb", 4, 512, 32),
    ("ttft", "h100-80gb", 4, 512, 64),
    ("ttft", "h100-80gb", 8, 512, 64),
    ("ttft", "h100-80gb-pcap", 2, 256, 1),
    ("ttft", "h100-80gb-pcap", 2, 512, 1),
    ("ttft", "h100-80gb-pcap", 2, 512, 4),
    ("ttft", "h100-80gb-pcap", 2, 512, 32),
    ("ttft", "h100-80gb-pcap", 2, 2048, 1),
    ("ttft", "h100-80gb-pcap", 2, 4096, 1),
    ("ttft", "h100-80gb-pcap", 2, 8192, 1),
    ("ttft", "h100-80gb-pcap", 4, 128, 1),
    ("ttft", "h100-80gb-pcap", 4, 256, 1),
    ("ttft", "h100-80gb-pcap", 4, 512, 4),
    ("ttft", "h100-80gb-pcap", 4, 512, 32),
    ("ttft", "h100-80gb-pcap", 4, 512, 64),
    ("ttft", "h100-80gb-pcap", 4, 1024, 1),
    ("ttft", "h100-80gb-pcap", 4, 4096, 1),
    ("ttft", "h100-80gb-pcap", 8, 256, 1),
    ("ttft", "h100-80gb-pcap", 8, 512, 1),
    ("ttft", "h100-80gb-pcap", 8, 512, 4),
    ("ttft", "h100-80gb-pcap", 8, 512, 8),
    ("ttft", "h100-80gb-pcap", 8, 512, 64),
    ("ttft", "h100-80gb-pcap", 8, 1024, 1),
    ("ttft", "h100-80gb-pcap", 8, 8192, 1),
    ("tpot", "a100-80gb", 2, 512, 1, 512),
    ("tpot", "a100-80gb", 2, 512, 1, 1024),
    ("tpot", "a100-80gb", 2, 512, 1, 4096),
    ("tpot", "a100-80gb", 2, 512, 4, 128),
    ("tpot", "a100-80gb", 2, 512, 16, 128),
    ("tpot", "a100-80gb", 2, 1024, 1, 128),
    ("tpot", "a100-80gb", 2, 2048, 1, 128),
    ("tpot", "a100-80gb", 2, 4096, 1, 128),
    ("tpot", "a100-80gb", 4, 512, 1, 256),
    ("tpot", "a100-80gb", 4, 512, 1, 512),
    ("tpot", "a100-80gb", 4, 512, 1, 1024),
    ("tpot", "a100-80gb", 4, 512, 1, 4096),
    ("tpot", "a100-80gb", 4, 512, 1, 8192),
    ("tpot", "a100-80gb", 4, 512, 2, 128),
    ("tpot", "a100-80gb", 4, 512, 4, 128),
    ("tpot", "a100-80gb", 4, 1024, 1, 128),
    ("tpot", "a100-80gb", 8, 128, 1, 128),
    ("tpot", "a100-80gb", 8, 256, 1, 128),
    ("tpot", "a100-80gb", 8, 512, 1, 256),
    ("tpot", "a100-80gb", 8, 512, 1, 512),
    ("tpot", "a100-80gb", 8, 512, 1, 1024),
    ("tpot", "a100-80gb", 8, 512, 1, 8192),
    ("tpot", "a100-80gb", 8, 512, 16, 128),
    ("tpot", "a100-80gb", 8, 1024, 1, 128),
    ("tpot", "h100-80gb", 2, 256, 1, 128),
    ("tpot", "h100-80gb", 2, 512, 1, 256),
    ("tpot", "h100-80gb", 2, 512, 1, 2048),
    ("tpot", "h100-80gb", 2, 512, 2, 128),
    ("tpot", "h100-80gb", 2, 512, 16, 128),
    ("tpot", "h100-80gb", 2, 2048, 1, 128),
    ("tpot", "h100-80gb", 2, 4096, 1, 128),
    ("tpot", "h100-80gb", 2, 8192, 1, 128),
    ("tpot", "h100-80gb", 4, 128, 1, 128),
    ("tpot", "h100-80gb", 4, 512, 1, 256),
    ("tpot", "h100-80gb", 4, 512, 1, 4096),
    ("tpot", "h100-80gb", 4, 512, 1, 8192),
    ("tpot", "h100-80gb", 4, 512, 2, 128),
    ("tpot", "h100-80gb", 4, 512, 4, 128),
    ("tpot", "h100-80gb", 4, 512, 64, 128),
    ("tpot", "h100-80gb", 4, 1024, 1, 128),
    ("tpot", "h100-80gb", 8, 256, 1, 128),
    ("tpot", "h100-80gb", 8, 512, 1, 256),
    ("tpot", "h100-80gb", 8, 512, 1, 1024),
    ("tpot", "h100-80gb", 8, 512, 1, 4096),
    ("tpot", "h100-80gb", 8, 512, 2, 128),
    ("tpot", "h100-80gb", 8, 1024, 1, 128),
    ("tpot", "h100-80gb", 8, 2048, 1, 128),
    ("tpot", "h100-80gb", 8, 4096, 1, 128),
    ("tpot", "h100-80gb-pcap", 2, 128, 1, 128),
    ("tpot", "h100-80gb-pcap", 2, 256, 1, 128),
    ("tpot", "h100-80gb-pcap", 2, 512, 1, 128),
    ("tpot", "h100-80gb-pcap", 2, 512, 1, 1024),
    ("tpot", "h100-80gb-pcap", 2, 512, 1, 2048),
    ("tpot", "h100-80gb-pcap", 2, 512, 1, 4096),
    ("tpot", "h100-80gb-pcap", 2, 512, 2, 128),
    ("tpot", "h100-80gb-pcap", 2, 512, 4, 128),
    ("tpot", "h100-80gb-pcap", 2, 512, 32, 128),
    ("tpot", "h100-80gb-pcap", 2, 8192, 1, 128),
    ("tpot", "h100-80gb-pcap", 4, 128, 1, 128),
    ("tpot", "h100-80gb-pcap", 4, 512, 1, 128),
    ("tpot", "h100-80gb-pcap", 4, 512, 1, 512),
    ("tpot", "h100-80gb-pcap", 4, 512, 1, 1024),
    ("tpot", "h100-80gb-pcap", 4, 512, 1, 8192),
    ("tpot", "h100-80gb-pcap", 4, 512, 2, 128),
    ("tpot", "h100-80gb-pcap", 4, 512, 8, 128),
    ("tpot", "h100-80gb-pcap", 4, 512, 32, 128),
    ("tpot", "h100-80gb-pcap", 4, 1024, 1, 128),
    ("tpot", "h100-80gb-pcap", 4, 8192, 1, 128),
    ("tpot", "h100-80gb-pcap", 8, 128, 1, 128),
    ("tpot", "h100-80gb-pcap", 8, 512, 1, 128),
    ("tpot", "h100-80gb-pcap", 8, 512, 1, 512),
    ("tpot", "h100-80gb-pcap", 8, 512, 1, 1024),
    ("tpot", "h100-80gb-pcap", 8, 512, 1, 4096),
    ("tpot", "h100-80gb-pcap", 8, 512, 1, 8192),
    ("tpot", "h100-80gb-pcap", 8, 512, 4, 128),
    ("tpot", "h100-80gb-pcap", 8, 512, 8, 128),
    ("tpot", "h100-80gb-pcap", 8, 512, 32, 128),
    ("tpot", "h100-80gb-pcap", 8, 1024, 1, 128),
    ("power", "a100-80gb", 2, 128, 1, 128),
    ("power", "a100-80gb", 2, 512, 1, 256),
    ("power", "a100-80gb", 2, 512, 1, 512),
    ("power", "a100-80gb", 2, 512, 1, 1024),
    ("power", "a100-80gb", 2, 512, 1, 2048),
    ("power", "a100-80gb", 2, 512, 1, 4096),
    ("power", "a100-80gb", 2, 512, 4, 128),
    ("power", "a100-80gb", 2, 512, 16, 128),
    ("power", "a100-80gb", 2, 2048, 1, 128),
    ("power", "a100-80gb", 2, 8192, 1, 128),
    ("power", "a100-80gb", 4, 256, 1, 128),
    ("power", "a100-80gb", 4, 512, 1, 128),
    ("power", "a100-80gb", 4, 512, 1, 1024),
    ("power", "a100-80gb", 4, 512, 1, 2048),
    ("power", "a100-80gb", 4, 512, 2, 128),
    ("power", "a100-80gb", 4, 512, 16, 128),
    ("power", "a100-80gb", 4, 512, 32, 128),
    ("power", "a100-80gb", 4, 1024, 1, 128),
    ("power", "a100-80gb", 4, 4096, 1, 128),
    ("power", "a100-80gb", 4, 8192, 1, 128),
    ("power", "a100-80gb", 8, 128, 1, 128),
    ("power", "a100-80gb", 8, 512, 1, 128),
    ("power", "a100-80gb", 8, 512, 1, 256),
    ("power", "a100-80gb", 8, 512, 1, 512),
    ("power", "a100-80gb", 8, 512, 1, 1024),
    ("power", "a100-80gb", 8, 512, 1, 4096),
    ("power", "a100-80gb", 8, 512, 1, 8192),
    ("power", "a100-80gb", 8, 512, 4, 128),
    ("power", "a100-80gb", 8, 512, 64, 128),
    ("power", "a100-80gb", 8, 8192, 1, 128),
    ("power", "h100-80gb", 2, 512, 1, 128),
    ("power", "h100-80gb", 2, 512, 1, 1024),
    ("power", "h100-80gb", 2, 512, 1, 2048),
    ("power", "h100-80gb", 2, 512, 1, 8192),
    ("power", "h100-80gb", 2, 512, 4, 128),
    ("power", "h100-80gb", 2, 512, 32, 128),
    ("power", "h100-80gb", 2, 512, 64, 128),
    ("power", "h100-80gb", 2, 1024, 1, 128),
    ("power", "h100-80gb", 2, 2048, 1, 128),
    ("power", "h100-80gb", 2, 8192, 1, 128),
    ("power", "h100-80gb", 4, 512, 1, 256),
    ("power", "h100-80gb", 4, 512, 1, 1024),
    ("power", "h100-80gb", 4, 512, 1, 4096),
    ("power", "h100-80gb", 4, 512, 1, 8192),
    ("power", "h100-80gb", 4, 512, 2, 128),
    ("power", "h100-80gb", 4, 512, 8, 128),
    ("power", "h100-80gb", 4, 512, 32, 128),
    ("power", "h100-80gb", 4, 1024, 1, 128),
    ("power", "h100-80gb", 4, 2048, 1, 128),
    ("power", "h100-80gb", 4, 8192, 1, 128),
    ("power", "h100-80gb", 8, 512, 1, 128),
    ("power", "h100-80gb", 8, 512, 1, 256),
    ("power", "h100-80gb", 8, 512, 1, 512),
    ("power", "h100-80gb", 8, 512, 1, 1024),
    ("power", "h100-80gb", 8, 512, 1, 4096),
    ("power", "h100-80gb", 8, 512, 4, 128),
    ("power", "h100-80gb", 8, 512, 8, 128),
    ("power", "h100-80gb", 8, 512, 16, 128),
    ("power", "h100-80gb", 8, 512, 64, 128),
    ("power", "h100-80gb", 8, 1024, 1, 128),
    ("power", "h100-80gb-pcap", 2, 512, 1, 1024),
    ("power", "h100-80gb-pcap", 2, 512, 1, 2048),
    ("power", "h100-80gb-pcap", 2, 512, 2, 128),
    ("power", "h100-80gb-pcap", 2, 512, 8, 128),
    ("power", "h100-80gb-pcap", 2, 512, 16, 128),
    ("power", "h100-80gb-pcap", 2, 512, 32, 128),
    ("power", "h100-80gb-pcap", 2, 512, 64, 128),
    ("power", "h100-80gb-pcap", 2, 1024, 1, 128),
    ("power", "h100-80gb-pcap", 2, 2048, 1, 128),
    ("power", "h100-80gb-pcap", 2, 4096, 1, 128),
    ("power", "h100-80gb-pcap", 4, 512, 1, 256),
    ("power", "h100-80gb-pcap", 4, 512, 1, 512),
    ("power", "h100-80gb-pcap", 4, 512, 1, 2048),
    ("power", "h100-80gb-pcap", 4, 512, 4, 128),
    ("power", "h100-80gb-pcap", 4, 512, 8, 128),
    ("power", "h100-80gb-pcap", 4, 512, 16, 128),
    ("power", "h100-80gb-pcap", 4, 512, 32, 128),
    ("power", "h100-80gb-pcap", 4, 512, 64, 128),
    ("power", "h100-80gb-pcap", 4, 2048, 1, 128),
    ("power", "h100-80gb-pcap", 4, 4096, 1, 128),
    ("power", "h100-80gb-pcap", 8, 256, 1, 128),
    ("power", "h100-80gb-pcap", 8, 512, 1, 128),
    ("power", "h100-80gb-pcap", 8, 512, 1, 512),
    ("power", "h100-80gb-pcap", 8, 512, 1, 2048),
    ("power", "h100-80gb-pcap", 8, 512, 1, 8192),
    ("power", "h100-80gb-pcap", 8, 512, 4, 128),
    ("power", "h100-80gb-pcap", 8, 512, 8, 128),
    ("power", "h100-80gb-pcap", 8, 512, 16, 128),
    ("power", "h100-80gb-pcap", 8, 512, 32, 128),
    ("power", "h100-80gb-pcap", 8, 1024, 1, 128),
)


def all_units() -> list[Key]:
    """Every llama2-70b unit of the CSV: TTFT, TPOT and power (power has TPOT's keys)."""
    ttft = [("ttft", *k) for k in TTFT_MS]
    tpot = [("tpot", *k) for k in TPOT_MS]
    power = [("power", *k) for k in TPOT_MS]
    return ttft + tpot + power


def _hash(salt: str, key: Key) -> str:
    return hashlib.sha256((salt + "|".join(str(x) for x in key)).encode()).hexdigest()


def _half_by_hash(keys: Iterable[Key], salt: str) -> set[Key]:
    """Per (figure, hardware, tp): the keys sorted by ``sha256(salt + "figure|unit...")``, the first half
    (rounded up)."""
    groups: dict[tuple, list[Key]] = defaultdict(list)
    for k in keys:
        groups[k[:3]].append(k)
    out: set[Key] = set()
    for ks in groups.values():
        ks.sort(key=lambda k: _hash(salt, k))
        out |= set(ks[: math.ceil(len(ks) / 2)])
    return out


def test_units_by_rule() -> set[Key]:
    """The test set regenerated by its rule (equals :data:`TEST_UNITS`; tests check it)."""
    return _half_by_hash((k for k in all_units() if k not in SEEN_V2), "")


# Units excluded from scoring, each with its data-based reason (printed by bench/fidelity_table.py).
_TP2_BATCH64 = (
    "TP 2, 64 prompts of 512: the prompt time is 0.12-0.15x that of 32 prompts on every GPU (H100 361 vs "
    "2398 ms, A100 794 vs 6633, capped H100 469 vs 3117) and the token time falls below batch 32's (H100 "
    "42.3 vs 52.3 ms, A100 67.2 vs 72.2): the run did not hold 64 sequences (one TP 2 rank keeps ~69 GB "
    "of weights of 80 GB); at TP 4/8 the same batch costs ~2x batch 32, as expected"
)
ANOMALIES: dict[Key, str] = {}
for _hw in HARDWARE:
    ANOMALIES["ttft", _hw, 2, 512, 64] = _TP2_BATCH64
    ANOMALIES["tpot", _hw, 2, 512, 64, 128] = _TP2_BATCH64


def calibration_units_by_rule() -> set[Key]:
    """The calibration units: half of the non-test, non-excluded units of the uncapped GPUs by the
    calibration hash (module docstring)."""
    test = set(TEST_UNITS)
    pool = [
        k
        for k in all_units()
        if k not in test and k not in ANOMALIES and k[1] != "h100-80gb-pcap" and k[0] != "power"
    ]
    return _half_by_hash(pool, "calibration|")


CALIBRATION_UNITS = frozenset(calibration_units_by_rule())


def role_of(key: Key) -> str:
    """``test``, ``excluded``, ``calibration`` or ``validation`` for one unit."""
    if key in ANOMALIES:
        return "excluded"
    if key in _TEST:
        return "test"
    return "calibration" if key in CALIBRATION_UNITS else "validation"


_TEST = frozenset(TEST_UNITS)


def splitwise_points() -> list[Point]:
    """Every TTFT and TPOT unit as a Point (role from :func:`role_of`); the capped H100 at 490 W."""
    out = []
    for (hw, tp, n, b), ms in TTFT_MS.items():
        gpu, limit = HARDWARE[hw]
        out.append(
            Point(
                "splitwise",
                gpu,
                "llama-2-70b",
                tp,
                "ttft",
                ms,
                "splitwise-2023",
                role_of(("ttft", hw, tp, n, b)),  # type: ignore[arg-type]
                n,
                b,
                power_limit_w=limit,
                what=f"{hw}: {b} x {n}-token prompt",
                note="fp16",
            )
        )
    for (hw, tp, n, b, t), ms in TPOT_MS.items():
        gpu, limit = HARDWARE[hw]
        out.append(
            Point(
                "splitwise",
                gpu,
                "llama-2-70b",
                tp,
                "tpot",
                ms,
                "splitwise-2023",
                role_of(("tpot", hw, tp, n, b, t)),  # type: ignore[arg-type]
                n,
                b,
                t,
                power_limit_w=limit,
                what=f"{hw}: token time, batch {b}, prompt {n}, {t} out",
                note="fp16",
            )
        )
    return out


def unit_of(p: Point) -> Key | None:
    """The Splitwise unit a point models (None for other sources)."""
    if p.source != "splitwise":
        return None
    hw = next(h for h, (g, lim) in HARDWARE.items() if g == p.gpu and lim == p.power_limit_w)
    if p.metric == "ttft":
        return ("ttft", hw, p.tp, p.tokens, p.batch)
    return ("tpot", hw, p.tp, p.tokens, p.batch, p.out_len)


SPLITWISE_POINTS = splitwise_points()
#: every scored point of every source: the others' (published.py) and Splitwise's units
POINTS: list[Point] = [
    *OTHER_POINTS,
    *SPLITWISE_POINTS,
    *published_lmdeploy.points(),
    *published_gptfast.points(),
]


def error_stats(errors: Iterable[float]) -> dict[str, float]:
    """``n`` and the median, p90 (nearest rank) and max of ``|error|`` (fractions; 0 when empty)."""
    a = sorted(abs(e) for e in errors)
    if not a:
        return {"n": 0, "median": 0.0, "p90": 0.0, "max": 0.0}
    mid = len(a) // 2
    median = a[mid] if len(a) % 2 else (a[mid - 1] + a[mid]) / 2
    return {"n": len(a), "median": median, "p90": a[max(0, math.ceil(0.9 * len(a)) - 1)], "max": a[-1]}


#: the issue-23 targets on the test set (TTFT and TPOT): median |error| and p90 |error|
TARGET_MEDIAN = 0.07
TARGET_P90 = 0.15


_A100_BATCH = (
    "A100 batches of 512-token prompts cost 20-55 ms per extra prompt more than one prompt of their tokens "
    "(TP 4: 4 x 512 571 ms vs one 2048-token prompt 403 ms; 16 x 512 2893 vs 8192 tokens 2278) while the "
    "H100's cost the same or less (attention is smaller); the model has one cost per token on both. The "
    "CSV's A100 prompt phase peaks at 1.00-1.03 of the 400 W TDP: a clock held down by the power limit "
    "(the power model's part) is the candidate, not modeled in this branch"
)
_A100_FLOOR = (
    "A100 floor-bound prompt: the prefill floor is priced in SM cycles (1.4x longer at the A100's 1410 MHz "
    "than at 1980); the measured A100 / H100 ratio of floor-bound prompts is ~1.3 (TP 4 128 tokens: 63.7 vs "
    "49.1 ms) and no A100 floor-bound unit is a calibration unit that could pin a split of the floor"
)
_PCAP = (
    "capped H100 (490 W): every measured prompt time is 1.30x the uncapped one; the power model of this "
    "branch does not slow a prefill at 490 W (issue 23 point 3, the power helper's mechanism)"
)
#: Splitwise units of the uncapped GPUs beyond 15 % (calibration, validation and -- since it was scored
#: once, 2026-12-05 05:05 UTC -- test), each with its reason; tests check the list is complete and true
KNOWN_MISSES: dict[Key, str] = {
    ("ttft", "a100-80gb", 4, 512, 4): _A100_BATCH,
    ("ttft", "a100-80gb", 4, 512, 16): _A100_BATCH,
    ("ttft", "a100-80gb", 8, 512, 16): _A100_BATCH,
    ("ttft", "a100-80gb", 8, 512, 32): _A100_BATCH,
    ("ttft", "a100-80gb", 4, 512, 8): _A100_BATCH,  # test
    ("ttft", "a100-80gb", 4, 512, 32): _A100_BATCH,  # test
    ("ttft", "a100-80gb", 4, 512, 64): _A100_BATCH,  # test
    ("ttft", "a100-80gb", 8, 512, 64): _A100_BATCH,  # test
    ("ttft", "a100-80gb", 4, 128, 1): _A100_FLOOR,
    ("ttft", "a100-80gb", 8, 128, 1): _A100_FLOOR,
}
#: every TTFT unit of the capped H100 may miss for this reason (the model is too fast there until the power
#: model slows a capped prefill; tests check it is only ever too fast)
CAPPED_TTFT_REASON = _PCAP
