"""From a role's measured points to its cliff and its setting in each mode (no torch, no HTTP).

A point is ``{"setting": Setting.as_dict(), "figures": {...}}`` with the figures of
:func:`phaselens.power.live.point_figures` / :func:`phaselens.power.simulate.sim_figures`:
``output_tokens_per_s``, ``ttft_p50_s``/``p99``, ``itl_p50_s``/``p99``, ``power_w`` (per GPU of the
role), ``tokens_per_j`` (the phase's tokens per joule of the role's GPUs: prompt tokens for prefill,
output tokens for decode and mixed).

- **Reference**: the defaults, measured first and last; the figures are their mean and **noise** is
  how far the two differ in the phase's latency (TTFT p50 for prefill, ITL p50 for decode, the larger
  of the two for mixed).
- **Cliff** per knob: going down from the top, the first setting whose phase latency rises beyond
  noise: above the slower of the two reference runs by more than ``min_rise_pct``
  (:func:`rise_threshold_pct`, expressed as a rise over the reference mean).
- **Host-bound references** (:func:`cliff_basis`): where the reference runs of an emulated stack
  were host-bound (the host's CPU, not the modelled GPU, set the pace: the client latency measures
  the host and the knob's effect disappears into its noise), the noise, the threshold and the cliff
  are judged on the **modelled** GPU time the emulated devices report instead (``modeled_s_per_token``
  for prefill, ``modeled_iteration_s`` for decode: labelled emulated); without modelled figures no
  cliff is called from such a sweep. Either way the analysis says so (``cliff_basis``, ``cliff_note``).
- **Modes**: a setting is *accepted* only if its throughput is ≥ (1 − ε) × the reference's and its
  ITL p99 and TTFT p99 are within the SLO; **PERF** also needs no measurable slowdown (the phase
  latency within the threshold, p50 and p99); **BAL** takes the best tokens/J of the accepted;
  **EFF** the best tokens/J within a looser bound (ε × ``eff_eps_factor``, SLO ×
  ``eff_slo_factor``). The defaults are always a candidate: when nothing beats them, keep them.
- **End-to-end bound** (``max_e2e_slowdown``, a fraction; None: none): where the user gives one, a
  setting whose mean end-to-end latency (``e2e_mean_s``: arrival to last token) rises over the
  reference's by more than it is refused too, with the rise and the bound as its reason — in PERF and
  BAL at the bound, in EFF at ``eff_eps_factor`` × the bound (EFF's looser bound, as for ε). A request
  passes through every pool of a disaggregated layout, so the roles' rises add up:
  :func:`choose_across_roles` then picks, per mode, the settings of all roles together — the most
  joules saved whose e2e rises sum within the bound — and records what it gave up and why.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from phaselens.power.plan import DEFAULT, KNOBS, Setting, knob_value

MODES = ("perf", "bal", "eff")
LATENCY_KEYS = ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s")


@dataclass(frozen=True, slots=True)
class ChooseOptions:
    """ε, the SLO (None: the reference's p99 × (1 + ``slo_headroom``)), the noise floor and EFF's looser bound."""

    eps: float = 0.05
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    slo_headroom: float = 0.25
    min_rise_pct: float = 5.0
    eff_eps_factor: float = 2.0
    eff_slo_factor: float = 1.5
    max_e2e_slowdown: float | None = None

    def e2e_bound_pct(self, mode: str) -> float | None:
        """The mode's bound on the mean end-to-end latency rise, in % (None: no bound)."""
        if self.max_e2e_slowdown is None:
            return None
        return self.max_e2e_slowdown * 100.0 * (self.eff_eps_factor if mode == "eff" else 1.0)

    def check(self) -> None:
        from phaselens.power.plan import CalibrateError

        if not 0 <= self.eps < 1:
            raise CalibrateError(f"--eps must be in [0, 1), got {self.eps:g}")
        for name in ("slo_ttft_s", "slo_itl_s"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise CalibrateError(f"{name} must be a number > 0, got {v!r}")
        if not 0 <= self.min_rise_pct <= 100:
            raise CalibrateError(f"--min-rise-pct must be in [0, 100], got {self.min_rise_pct:g}")
        m = self.max_e2e_slowdown
        if m is not None and not (isinstance(m, int | float) and math.isfinite(m) and 0 <= m < 1):
            raise CalibrateError(
                f"--max-e2e-slowdown must be a fraction in [0, 1) (0.05: 5 % slower end to end), got {m!r}"
            )


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _rise_pct(value: Any, ref: Any) -> float | None:
    v, r = _num(value), _num(ref)
    return None if v is None or r is None or r <= 0 else (v / r - 1.0) * 100.0


#: what judges the cliff: the client's latency; the emulated GPU's modelled time (host-bound
#: references on an emulated stack); nothing (host-bound references without modelled figures)
CLIENT, MODELED, NO_CLIFF = "client", "modeled", "none"


def phase_latency_keys(phase: str, basis: str = CLIENT) -> tuple[str, ...]:
    """The latencies a phase's knob moves: TTFT for prefill, ITL for decode, both for mixed; on the
    ``modeled`` basis their emulated-GPU counterparts (GPU seconds per prompt token, per iteration)."""
    if basis == MODELED:
        return {"prefill": ("modeled_s_per_token",), "decode": ("modeled_iteration_s",)}.get(
            phase, ("modeled_s_per_token", "modeled_iteration_s")
        )
    return {"prefill": ("ttft_p50_s",), "decode": ("itl_p50_s",)}.get(phase, ("ttft_p50_s", "itl_p50_s"))


def _refs(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p["figures"] for p in points if p["setting"].get("knob", DEFAULT) == DEFAULT]


def cliff_basis(points: list[dict[str, Any]], phase: str) -> tuple[str, str | None]:
    """What judges the cliff, and why when it is not the client's latency: a reference run that was
    host-bound (``host_bound``: over 5 % of the emulated iterations ran past their modelled time)
    measured the host's CPU, not the knob — then the emulated GPU's modelled time where every point
    carries it, else no cliff at all."""
    refs = _refs(points)
    bound = [f for f in refs if f.get("host_bound")]
    if not bound:
        return CLIENT, None
    share = max((_num(f.get("host_bound_share")) or 0.0) for f in bound)
    why = (
        f"{len(bound)} of {len(refs)} reference runs host-bound ({share * 100:.0f} % of the emulated "
        "iterations ran past their modelled GPU time): the client latency measures the host's CPU, not the knob"
    )
    keys = phase_latency_keys(phase, MODELED)
    if all(_num(p["figures"].get(k)) for p in points for k in keys):
        return MODELED, why + "; the cliff is judged on the emulated GPU's modelled time (emulated)"
    return NO_CLIFF, why + "; no cliff is called from this sweep"


def reference_of(
    points: list[dict[str, Any]], phase: str, basis: str = CLIENT
) -> tuple[dict[str, Any], float]:
    """The mean figures of the default points and the noise (%): how far the phase latency (on
    ``basis``) of the first and the last differ, relative to the smaller."""
    refs = _refs(points)
    if not refs:
        raise ValueError("no reference (default settings) point was measured")
    keys = {k for f in refs for k in f}
    mean: dict[str, Any] = {}
    for k in keys:
        vals = [_num(f.get(k)) for f in refs]
        vals = [v for v in vals if v is not None]
        mean[k] = sum(vals) / len(vals) if vals else refs[0].get(k)
    noise = 0.0
    if len(refs) >= 2:
        for k in phase_latency_keys(phase, basis):
            a, b = _num(refs[0].get(k)), _num(refs[-1].get(k))
            if a and b:
                noise = max(noise, abs(a - b) / min(a, b) * 100.0)
    return mean, noise


def rise_threshold_pct(
    points: list[dict[str, Any]], ref: dict[str, Any], phase: str, floor_pct: float, basis: str = CLIENT
) -> float:
    """The rise over the reference mean that is beyond noise: above the slower of the reference runs
    by more than ``floor_pct`` (with one reference, or two that agree: ``floor_pct``)."""
    refs = _refs(points)
    out = floor_pct
    for k in phase_latency_keys(phase, basis):
        vals = [v for v in (_num(f.get(k)) for f in refs) if v is not None]
        mean = _num(ref.get(k))
        if vals and mean:
            out = max(out, (max(vals) * (1 + floor_pct / 100.0) / mean - 1.0) * 100.0)
    return out


def slowdown_pct(
    figures: dict[str, Any], ref: dict[str, Any], phase: str, basis: str = CLIENT
) -> float | None:
    """The phase latency's rise over the reference, % (the largest of the phase's keys on ``basis``)."""
    rises = [_rise_pct(figures.get(k), ref.get(k)) for k in phase_latency_keys(phase, basis)]
    rises = [r for r in rises if r is not None]
    return max(rises) if rises else None


def find_cliffs(
    points: list[dict[str, Any]], ref: dict[str, Any], phase: str, threshold_pct: float, basis: str = CLIENT
) -> dict[str, Any]:
    """Per knob swept: the first setting (from the top down) whose phase latency (on ``basis``) rose
    beyond ``threshold_pct``, with its rise; ``None`` for a knob that never crossed it (and for every
    knob on the ``none`` basis: no cliff is called)."""
    out: dict[str, Any] = {}
    for knob in KNOBS:
        swept = [p for p in points if p["setting"].get("knob") == knob]
        if not swept:
            continue
        out[knob] = None
        for p in swept if basis != NO_CLIFF else []:
            rise = slowdown_pct(p["figures"], ref, phase, basis)
            if rise is not None and rise > threshold_pct:
                out[knob] = {"setting": p["setting"], "rise_pct": round(rise, 2)}
                break
    return out


def slo_of(ref: dict[str, Any], o: ChooseOptions) -> dict[str, float | None]:
    """The SLO the choice holds to: given, else the reference's p99 × (1 + headroom)."""

    def derive(given: float | None, key: str) -> float | None:
        if given is not None:
            return given
        v = _num(ref.get(key))
        return None if v is None else v * (1 + o.slo_headroom)

    return {"ttft_p99_s": derive(o.slo_ttft_s, "ttft_p99_s"), "itl_p99_s": derive(o.slo_itl_s, "itl_p99_s")}


def e2e_rise_pct(figures: dict[str, Any], ref: dict[str, Any]) -> float | None:
    """The mean end-to-end latency's rise over the reference's, % (None where either lacks it)."""
    return _rise_pct(figures.get("e2e_mean_s"), ref.get("e2e_mean_s"))


def _why_not(
    f: dict[str, Any],
    ref: dict[str, Any],
    eps: float,
    slo: dict[str, float | None],
    factor: float,
    e2e_bound_pct: float | None = None,
) -> str | None:
    """Why a point is not accepted under (ε, SLO × factor, the end-to-end bound), else None."""
    tput, rtput = _num(f.get("output_tokens_per_s")), _num(ref.get("output_tokens_per_s"))
    if f.get("failed"):
        return f"{f['failed']} requests failed"
    if tput is None or rtput is None or tput < (1 - eps) * rtput:
        return f"throughput {tput or 0:.4g} tok/s under (1 − {eps:g}) × {rtput or 0:.4g}"
    for key, bound in slo.items():
        v = _num(f.get(key))
        if bound is not None and (v is None or v > bound * factor):
            return f"{key} {v if v is not None else float('nan'):.4g} s over {bound * factor:.4g} s"
    if e2e_bound_pct is not None:
        rise = e2e_rise_pct(f, ref)
        if rise is None:
            return "no end-to-end latency measured to hold to the e2e bound"
        if rise > e2e_bound_pct:
            return f"e2e mean latency +{rise:.1f} % over the bound +{e2e_bound_pct:g} %"
    return None


def choose_modes(
    points: list[dict[str, Any]], phase: str, options: ChooseOptions = ChooseOptions()
) -> dict[str, Any]:
    """The reference, noise, cliffs and the setting of each mode for one role's points."""
    basis, basis_note = cliff_basis(points, phase)
    judge = CLIENT if basis == NO_CLIFF else basis  # PERF's "no slowdown" still needs a latency
    ref, noise = reference_of(points, phase, judge)
    _, client_noise = reference_of(points, phase)
    threshold = rise_threshold_pct(points, ref, phase, options.min_rise_pct, judge)
    slo = slo_of(ref, options)
    ref_tpj = _num(ref.get("tokens_per_j"))
    rated = []
    for p in points:
        if p["setting"].get("knob", DEFAULT) == DEFAULT:
            continue
        f = p["figures"]
        rise = slowdown_pct(f, ref, phase, judge)
        p99_rise = max(
            (
                r
                for r in (
                    _rise_pct(f.get(k.replace("p50", "p99")), ref.get(k.replace("p50", "p99")))
                    for k in phase_latency_keys(phase, judge)
                )
                if r is not None
            ),
            default=None,
        )
        rated.append((p, rise, p99_rise))
    modes: dict[str, Any] = {}
    for mode in MODES:
        eps = options.eps * (options.eff_eps_factor if mode == "eff" else 1.0)
        factor = options.eff_slo_factor if mode == "eff" else 1.0
        accepted: list[dict[str, Any]] = []
        rejected = []
        for p, rise, p99_rise in rated:
            f = p["figures"]
            why = _why_not(f, ref, eps, slo, factor, options.e2e_bound_pct(mode))
            if why is None and mode == "perf" and ((rise or 0) > threshold or (p99_rise or 0) > threshold):
                why = f"slower: phase latency +{max(rise or 0, p99_rise or 0):.1f} % (threshold {threshold:.1f} %)"
            tpj = _num(f.get("tokens_per_j"))
            if why is None and (tpj is None or ref_tpj is None or tpj <= ref_tpj):
                why = "no tokens/J gain over the defaults"
            if why is not None:
                rejected.append({"setting": p["setting"]["label"], "why": why})
                continue
            accepted.append(p)
        if not accepted:
            modes[mode] = keep_defaults_entry("no setting beats the defaults within the bounds", rejected)
            continue
        best = max(accepted, key=lambda p: p["figures"]["tokens_per_j"])
        modes[mode] = mode_entry(best, ref, rejected)
        if options.max_e2e_slowdown is not None:  # what choose_across_roles may trade between roles
            modes[mode]["accepted"] = [_candidate(p, ref) for p in accepted]
    return {
        "reference": ref,
        "noise_pct": round(noise, 2),
        "client_noise_pct": round(client_noise, 2),
        "threshold_pct": round(threshold, 2),
        "slo": slo,
        "cliff_basis": basis,
        "cliff_note": basis_note,
        "cliff": find_cliffs(points, ref, phase, threshold, basis),
        "modes": modes,
        "options": {
            "eps": options.eps,
            "eff_eps": options.eps * options.eff_eps_factor,
            "eff_slo_factor": options.eff_slo_factor,
            "min_rise_pct": options.min_rise_pct,
            "max_e2e_slowdown": options.max_e2e_slowdown,
        },
    }


def keep_defaults_entry(reason: str, rejected: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode that keeps the defaults, and why."""
    return {
        "setting": Setting().as_dict(),
        "knob": DEFAULT,
        "keep_defaults": True,
        "reason": reason,
        "rejected": rejected,
    }


def mode_entry(p: dict[str, Any], ref: dict[str, Any], rejected: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode that takes point ``p``: its setting, figures and changes against the reference."""
    f = p["figures"]
    tpj, ref_tpj = _num(f.get("tokens_per_j")), _num(ref.get("tokens_per_j"))
    power, ref_power = _num(f.get("power_w")), _num(ref.get("power_w"))
    return {
        "setting": p["setting"],
        "knob": p["setting"]["knob"],
        "keep_defaults": False,
        "figures": f,
        "tokens_per_j_gain_pct": round((tpj / ref_tpj - 1) * 100, 2) if tpj and ref_tpj else None,
        "power_w_change": round(power - ref_power, 2)
        if power is not None and ref_power is not None
        else None,
        "latency_change_pct": {
            k: None if (r := _rise_pct(f.get(k), ref.get(k))) is None else round(r, 2) for k in LATENCY_KEYS
        },
        "throughput_change_pct": _rise_pct(f.get("output_tokens_per_s"), ref.get("output_tokens_per_s")),
        "e2e_change_pct": None if (e2e := e2e_rise_pct(f, ref)) is None else round(e2e, 2),
        "rejected": rejected,
    }


def energy_saved_j(figures: dict[str, Any], ref: dict[str, Any]) -> float:
    """The role's joules saved against the reference for the same phase tokens (its tokens/J gain in J)."""
    tokens = _num(ref.get("phase_tokens"))
    tpj, ref_tpj = _num(figures.get("tokens_per_j")), _num(ref.get("tokens_per_j"))
    if tokens and tpj and ref_tpj:
        return tokens / ref_tpj - tokens / tpj
    e, ref_e = _num(figures.get("energy_j")), _num(ref.get("energy_j"))
    return ref_e - e if e is not None and ref_e is not None else 0.0


def _candidate(p: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    return {
        "point": p,
        "e2e_change_pct": e2e_rise_pct(p["figures"], ref),
        "energy_saved_j": energy_saved_j(p["figures"], ref),
    }


def choose_across_roles(analyses: dict[str, dict[str, Any]], options: ChooseOptions) -> dict[str, Any]:
    """Hold the roles' settings together to the end-to-end bound (``options.max_e2e_slowdown``).

    A request passes through every role of a disaggregated layout, so the e2e rises of the roles'
    settings add up. Per mode, over each role's accepted settings (and its defaults), take the
    combination that saves the most joules (the fleet's tokens/J: the same tokens) whose rises sum
    within the mode's bound (ties: the smaller rise); a role whose own best no longer fits takes the
    combination's setting, its mode entry saying which it gave up and why (``budget``). Edits
    ``analyses`` in place (each role's ``choose_modes`` output) and returns, per mode, the
    combination's predicted e2e rise, joules saved and settings. Without a bound: nothing changes."""
    out: dict[str, Any] = {}
    if options.max_e2e_slowdown is None or not analyses:
        return out
    roles = list(analyses)
    for mode in MODES:
        bound = options.e2e_bound_pct(mode)
        assert bound is not None
        per_role = []
        for role in roles:
            m = analyses[role]["modes"][mode]
            keep = {"point": None, "e2e_change_pct": 0.0, "energy_saved_j": 0.0}
            per_role.append([keep, *m.get("accepted", [])])
        best: tuple[float, float, tuple[dict[str, Any], ...]] | None = None
        for combo in itertools.product(*per_role):
            rise = sum(max(0.0, c["e2e_change_pct"] or 0.0) for c in combo)
            if rise > bound + 1e-9:
                continue
            saved = sum(c["energy_saved_j"] for c in combo)
            if best is None or (saved, -rise) > (best[0], -best[1]):
                best = (saved, rise, combo)
        assert best is not None  # the defaults everywhere always fit
        saved, rise, combo = best
        for role, c in zip(roles, combo, strict=True):
            analysis, m = analyses[role], analyses[role]["modes"][mode]
            own = m["setting"]["label"]
            chosen = c["point"]["setting"]["label"] if c["point"] else Setting().label()
            budget = {
                "bound_pct": bound,
                "roles_rise_pct": round(rise, 2),
                "this_role_rise_pct": round(max(0.0, c["e2e_change_pct"] or 0.0), 2),
            }
            if chosen != own:
                why = (
                    f"{own} alone is within the bound, but with the other roles' settings the e2e rises "
                    f"would sum over +{bound:g} %: {chosen} saves the most joules together (+{rise:.1f} %)"
                )
                rejected = [*m["rejected"], {"setting": own, "why": why}]
                if c["point"] is None:
                    new = keep_defaults_entry(why, rejected)
                else:
                    new = mode_entry(c["point"], analysis["reference"], rejected)
                new["accepted"] = m.get("accepted", [])
                budget["instead_of"] = own
                analysis["modes"][mode] = m = new
            m["budget"] = budget
        out[mode] = {
            "bound_pct": bound,
            "e2e_change_pct": round(rise, 2),
            "energy_saved_j": round(saved, 1),
            "settings": {
                r: (c["point"]["setting"]["label"] if c["point"] else "default")
                for r, c in zip(roles, combo, strict=True)
            },
        }
    return out


def knee_brackets(
    points: list[dict[str, Any]], phase: str, options: ChooseOptions
) -> dict[str, list[tuple[Setting | None, Setting]]]:
    """Per knob, where each mode's bounds are first crossed going down: (the last setting within them
    — None: the knob's top —, the first past them). The sweep refines there (``--refine``): the best
    setting within a bound lies just above where the bound is crossed. With an end-to-end bound also
    (the top, the first setting swept): the roles share that bound (:func:`choose_across_roles`), so
    settings that cost little latency are worth having too."""
    basis, _ = cliff_basis(points, phase)
    basis = CLIENT if basis == NO_CLIFF else basis
    ref, _ = reference_of(points, phase, basis)
    threshold = rise_threshold_pct(points, ref, phase, options.min_rise_pct, basis)
    slo = slo_of(ref, options)
    out: dict[str, list[tuple[Setting | None, Setting]]] = {}
    for knob in KNOBS:
        swept = [
            (Setting.from_dict(p["setting"]), p["figures"])
            for p in points
            if p["setting"].get("knob") == knob
        ]
        swept.sort(key=lambda sf: -(knob_value(sf[0]) or 0))
        if options.max_e2e_slowdown is not None and swept:
            out.setdefault(knob, []).append((None, swept[0][0]))
        for mode in ("bal", "eff", "perf"):
            eps = options.eps * (options.eff_eps_factor if mode == "eff" else 1.0)
            factor = options.eff_slo_factor if mode == "eff" else 1.0
            above: Setting | None = None
            for setting, f in swept:
                refused = _why_not(f, ref, eps, slo, factor, options.e2e_bound_pct(mode)) is not None
                if mode == "perf" and not refused:
                    refused = (slowdown_pct(f, ref, phase, basis) or 0) > threshold
                if refused:
                    if (above, setting) not in out.setdefault(knob, []):
                        out[knob].append((above, setting))
                    break
                above = setting
    return out


def beyond_loosest(figures: dict[str, Any], ref: dict[str, Any], phase: str, options: ChooseOptions) -> bool:
    """True when a point is past every mode's bound (EFF's): going further down the knob is pointless.
    Judged against one reference run ``ref``: on the modelled time where that run was host-bound."""
    slo = slo_of(ref, options)
    eps = options.eps * options.eff_eps_factor
    why = _why_not(figures, ref, eps, slo, options.eff_slo_factor, options.e2e_bound_pct("eff"))
    basis = (
        MODELED
        if ref.get("host_bound")
        and all(_num(f.get(k)) for f in (figures, ref) for k in phase_latency_keys(phase, MODELED))
        else CLIENT
    )
    return why is not None and ((slowdown_pct(figures, ref, phase, basis) or 0) > options.min_rise_pct)


def combination_brackets(
    role_points: dict[str, tuple[str, list[dict[str, Any]]]], options: ChooseOptions
) -> dict[str, dict[str, list[tuple[Setting | None, Setting]]]]:
    """Where a second refinement pass looks (``--refine`` with an end-to-end bound): around each mode's
    setting of the roles' joint choice (:func:`choose_across_roles`) — per role and knob, between the
    chosen setting and its swept neighbours above (None: the knob's top) and below. The joint choice
    trades the roles' e2e rises against each other, so the best combination usually lies between the
    swept settings of the one it found. ``role_points``: role → (phase, points). Without a bound: {}."""
    if options.max_e2e_slowdown is None:
        return {}
    analyses = {role: choose_modes(points, phase, options) for role, (phase, points) in role_points.items()}
    choose_across_roles(analyses, options)
    out: dict[str, dict[str, list[tuple[Setting | None, Setting]]]] = {}
    for role, (_, points) in role_points.items():
        for mode in MODES:
            m = analyses[role]["modes"][mode]
            if m.get("keep_defaults"):
                continue
            chosen = Setting.from_dict(m["setting"])
            swept = sorted(
                {Setting.from_dict(p["setting"]) for p in points if p["setting"].get("knob") == chosen.knob},
                key=lambda s: -(knob_value(s) or 0),
            )
            at = swept.index(chosen)
            pairs = out.setdefault(role, {}).setdefault(chosen.knob, [])
            for pair in (
                (swept[at - 1] if at else None, chosen),
                (chosen, swept[at + 1] if at + 1 < len(swept) else None),
            ):
                if pair[1] is not None and pair not in pairs:
                    pairs.append(pair)  # type: ignore[arg-type]
    return out
