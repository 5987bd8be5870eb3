"""Settings, bounds and the sweep plan of a power calibration (no torch, no HTTP).

A :class:`Setting` is one point of a sweep: the defaults, a power limit, or an SM-clock window
(``[low, high]`` MHz, locked with ``nvidia-smi -lgc low,high`` / ``nvmlDeviceSetGpuLockedClocks``).
:class:`Bounds` are what a device reports through the control API (``GET /control/workers/{id}/device``:
the power-limit range and default, the supported SM clocks); :meth:`Bounds.check` refuses a setting
the device would refuse, before anything is tried, naming the bound. :func:`plan_sweep` makes the
points per role (the reference — the defaults — first and last, so the two measure the noise; then
power limits from the top down, then clock windows from the top down) and :func:`check_time`
refuses a plan longer than ``--max-minutes``. :func:`between` makes the finer settings a sweep adds
near a knee (``--refine``): strictly between two swept settings, whole watts or supported clocks, each
checked against the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT = "default"
POWER_LIMIT = "power_limit"
SM_CLOCK = "sm_clock"
KNOBS = (POWER_LIMIT, SM_CLOCK)
PHASE_OF_ROLE = {"prefill": "prefill", "decode": "decode", "mixed": "mixed"}


class CalibrateError(ValueError):
    """A calibration that cannot run as asked; the message names what and what is allowed."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One knob setting: ``default`` (power limit and clocks reset), a ``power_limit`` (W) or an
    ``sm_clock`` window (MHz)."""

    knob: str = DEFAULT
    power_limit_w: float | None = None
    sm_clock_min_mhz: int | None = None
    sm_clock_max_mhz: int | None = None

    def label(self) -> str:
        """``default``, ``cap 560 W`` or ``SM 345-1410 MHz``."""
        if self.knob == POWER_LIMIT:
            return f"cap {self.power_limit_w:g} W"
        if self.knob == SM_CLOCK:
            return f"SM {self.sm_clock_min_mhz}-{self.sm_clock_max_mhz} MHz"
        return "default"

    def body(self) -> dict[str, Any]:
        """The control API's ``POST /control/workers/{id}/device`` body that sets it (from the defaults:
        every setting resets first, so a power limit never stays under a clock window)."""
        out: dict[str, Any] = {"reset": True}
        if self.knob == POWER_LIMIT:
            out["power_limit_w"] = self.power_limit_w
        elif self.knob == SM_CLOCK:
            out["sm_clock_min_mhz"] = self.sm_clock_min_mhz
            out["sm_clock_max_mhz"] = self.sm_clock_max_mhz
        return out

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None} | {"label": self.label()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Setting:
        return cls(
            str(d.get("knob") or DEFAULT),
            None if d.get("power_limit_w") is None else float(d["power_limit_w"]),
            None if d.get("sm_clock_min_mhz") is None else int(d["sm_clock_min_mhz"]),
            None if d.get("sm_clock_max_mhz") is None else int(d["sm_clock_max_mhz"]),
        )

    def layout_options(self, role: str) -> str:
        """The simulator's layout options for this setting on ``role``'s pool (``''`` for the defaults)."""
        if self.knob == POWER_LIMIT:
            return f":{role}.power_limit_w={self.power_limit_w:g}"
        if self.knob == SM_CLOCK:
            return f":{role}.sm_clock_mhz={self.sm_clock_min_mhz}-{self.sm_clock_max_mhz}"
        return ""


REFERENCE = Setting()


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one device accepts: power limits in ``[power_min_w, power_max_w]`` (default
    ``power_default_w``) and the SM clocks ``clocks_mhz`` (ascending); ``None`` where the device has
    no such knob."""

    device: str
    power_min_w: float | None = None
    power_max_w: float | None = None
    power_default_w: float | None = None
    clocks_mhz: tuple[int, ...] = ()
    where: str = ""  # e.g. "worker-0 (emulated:h200)", for messages

    @classmethod
    def from_knobs(cls, knobs: dict[str, Any], where: str = "") -> Bounds:
        """From the control API's knob read (``Device.knobs()``)."""
        clocks = knobs.get("supported_sm_clocks_mhz")
        if not clocks and knobs.get("supported_sm_clock_min_mhz") is not None:
            clocks = [knobs["supported_sm_clock_min_mhz"], knobs["supported_sm_clock_max_mhz"]]
        return cls(
            device=str(knobs.get("device") or ""),
            power_min_w=knobs.get("power_limit_min_w"),
            power_max_w=knobs.get("power_limit_max_w"),
            power_default_w=knobs.get("power_limit_default_w"),
            clocks_mhz=tuple(sorted(int(c) for c in clocks or ())),
            where=where or str(knobs.get("device") or ""),
        )

    def check(self, s: Setting) -> None:
        """CalibrateError when the device would refuse ``s`` (out of its bounds, or no such knob)."""
        if s.knob == POWER_LIMIT:
            if self.power_min_w is None or self.power_max_w is None:
                raise CalibrateError(f"{self.where} has no settable power limit; sweep --knobs sm_clock only")
            w = s.power_limit_w
            if w is None or not math.isfinite(w) or not self.power_min_w <= w <= self.power_max_w:
                raise CalibrateError(
                    f"power limit {w:g} W is outside [{self.power_min_w:g}, {self.power_max_w:g}] W of "
                    f"{self.where}: refused before trying it"
                )
        elif s.knob == SM_CLOCK:
            if not self.clocks_mhz:
                raise CalibrateError(f"{self.where} has no SM clock locking; sweep --knobs power_limit only")
            lo, hi = s.sm_clock_min_mhz, s.sm_clock_max_mhz
            if lo is None or hi is None:
                raise CalibrateError(f"SM clock window [{lo}, {hi}] MHz lacks a bound")
            for v in (hi, lo):
                if not self.clocks_mhz[0] <= v <= self.clocks_mhz[-1]:
                    raise CalibrateError(
                        f"SM clock {v} MHz is outside [{self.clocks_mhz[0]}, {self.clocks_mhz[-1]}] MHz of "
                        f"{self.where}: refused before trying it"
                    )
            if lo > hi:
                raise CalibrateError(f"SM clock window [{lo}, {hi}] MHz has min > max")
        elif s.knob != DEFAULT:
            raise CalibrateError(f"unknown knob {s.knob!r}; knobs: {', '.join(KNOBS)}")

    def nearest_clock(self, mhz: float) -> int:
        """The supported clock nearest ``mhz`` (ties: the lower)."""
        return min(self.clocks_mhz, key=lambda c: (abs(c - mhz), c))


def common_bounds(bounds: Sequence[Bounds]) -> Bounds:
    """The bounds every device of a role accepts (their intersection): a role's setting goes to all."""
    if not bounds:
        raise CalibrateError("no device to calibrate")
    if len(bounds) == 1:
        return bounds[0]
    pw = [b for b in bounds if b.power_min_w is not None and b.power_max_w is not None]
    clocks = set(bounds[0].clocks_mhz)
    for b in bounds[1:]:
        clocks &= set(b.clocks_mhz)
    lo = max(b.power_min_w for b in pw) if len(pw) == len(bounds) else None  # type: ignore[type-var]
    hi = min(b.power_max_w for b in pw) if len(pw) == len(bounds) else None  # type: ignore[type-var]
    if lo is not None and hi is not None and lo > hi:
        lo = hi = None
    defaults = {b.power_default_w for b in bounds}
    return Bounds(
        device=bounds[0].device,
        power_min_w=lo,
        power_max_w=hi,
        power_default_w=defaults.pop() if len(defaults) == 1 else hi,
        clocks_mhz=tuple(sorted(clocks)),
        where=" and ".join(b.where for b in bounds),
    )


def power_points(b: Bounds, n: int) -> list[Setting]:
    """``n`` power limits from just under the default down to the minimum, evenly spaced, whole watts."""
    if b.power_min_w is None or b.power_max_w is None or n < 1:
        return []
    top = b.power_default_w if b.power_default_w is not None else b.power_max_w
    step = (top - b.power_min_w) / n
    return [Setting(POWER_LIMIT, power_limit_w=float(round(top - step * (i + 1)))) for i in range(n)]


def clock_points(b: Bounds, n: int, floor_mhz: int | None = None) -> list[Setting]:
    """``n`` SM-clock windows ``[lowest, f]``, ``f`` from just under the highest supported clock down to
    ``floor_mhz`` (default: the lowest), each a supported clock."""
    if not b.clocks_mhz or n < 1:
        return []
    low, top = b.clocks_mhz[0], b.clocks_mhz[-1]
    floor = max(low, floor_mhz or low)
    step = (top - floor) / n
    highs: list[int] = []
    for i in range(n):
        f = b.nearest_clock(top - step * (i + 1))
        if f not in highs and f < top:
            highs.append(f)
    return [Setting(SM_CLOCK, sm_clock_min_mhz=low, sm_clock_max_mhz=f) for f in highs]


def knob_value(s: Setting) -> float | None:
    """How far a setting is down its knob: the power limit (W) or the window's top (MHz)."""
    return s.power_limit_w if s.knob == POWER_LIMIT else s.sm_clock_max_mhz if s.knob == SM_CLOCK else None


def between(b: Bounds, knob: str, above: Setting | None, below: Setting, n: int) -> list[Setting]:
    """Up to ``n`` settings of ``knob`` strictly between ``above`` (None: the knob's top, the default)
    and ``below``, evenly spaced, from the top down: whole watts, or windows ``[lowest, f]`` with
    ``f`` a supported clock. Every one passes :meth:`Bounds.check` (CalibrateError otherwise: never a
    setting the device would refuse)."""
    if n < 1 or knob not in KNOBS or below.knob != knob:
        return []
    if knob == POWER_LIMIT:
        if b.power_min_w is None or b.power_max_w is None:
            return []
        top = knob_value(above) if above is not None else (b.power_default_w or b.power_max_w)
    else:
        if not b.clocks_mhz:
            return []
        top = knob_value(above) if above is not None else b.clocks_mhz[-1]
    bottom = knob_value(below)
    if top is None or bottom is None or top - bottom <= 1:
        return []
    out: list[Setting] = []
    for i in range(1, n + 1):
        v = top - (top - bottom) * i / (n + 1)
        if knob == POWER_LIMIT:
            s = Setting(POWER_LIMIT, power_limit_w=float(round(v)))
        else:
            f = b.nearest_clock(v)
            s = Setting(SM_CLOCK, sm_clock_min_mhz=b.clocks_mhz[0], sm_clock_max_mhz=f)
        w = knob_value(s)
        if w is not None and bottom < w < top and s not in out:
            b.check(s)
            out.append(s)
    return out


def refine_settings(
    b: Bounds, brackets: dict[str, list[tuple[Setting | None, Setting]]], n: int, done: list[Setting]
) -> list[Setting]:
    """At most ``n`` settings per knob inside its brackets (:func:`phaselens.power.choose.knee_brackets`),
    shared among them, none already swept (``done``); each checked against ``b``."""
    out: list[Setting] = []
    for knob, pairs in brackets.items():
        if not pairs:
            continue
        each = max(1, n // len(pairs))
        added: list[Setting] = []
        for above, below in pairs:
            for s in between(b, knob, above, below, each):
                if len(added) < n and s not in done and s not in added:
                    added.append(s)
        out += added
    return out


def order_points(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A role's points in sweep order after refining: the references where they were (first, last), each
    knob's points from the top down (the cliff is the first rise going down)."""
    refs_first = []
    for p in points:
        if p["setting"].get("knob", DEFAULT) != DEFAULT:
            break
        refs_first.append(p)
    rest = points[len(refs_first) :]
    knobbed = [p for p in rest if p["setting"].get("knob", DEFAULT) != DEFAULT]
    closing = [p for p in rest if p["setting"].get("knob", DEFAULT) == DEFAULT]
    knobbed.sort(
        key=lambda p: (KNOBS.index(p["setting"]["knob"]), -(knob_value(Setting.from_dict(p["setting"])) or 0))
    )
    return refs_first + knobbed + closing


@dataclass(frozen=True, slots=True)
class RolePlan:
    """The settings swept on one role's devices (the reference first and last)."""

    role: str
    workers: tuple[str, ...]
    bounds: Bounds
    settings: tuple[Setting, ...]

    @property
    def phase(self) -> str:
        return PHASE_OF_ROLE[self.role]


@dataclass(frozen=True, slots=True)
class SweepPlan:
    """Every role's settings and how long one point takes (``point_s`` of load plus ``settle_s``)."""

    roles: tuple[RolePlan, ...]
    point_s: float
    settle_s: float
    max_minutes: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    refine: int = 0  # settings added near each knob's knee, per role and knob (at most)

    @property
    def points(self) -> int:
        """The settings planned, and the most the refinement may add."""
        refined = sum(self.refine * len({s.knob for s in r.settings} - {DEFAULT}) for r in self.roles)
        return sum(len(r.settings) for r in self.roles) + refined

    @property
    def estimated_s(self) -> float:
        """Every point's load and settle, each load's last requests finishing (a quarter more) and the
        warm-up before the first reference (a quarter of a point)."""
        return self.points * (self.point_s * 1.25 + self.settle_s) + self.point_s / 4

    def text(self) -> str:
        lines = [
            f"{self.points} points × ({self.point_s:g} s load + its tail + {self.settle_s:g} s settle) ≈ "
            f"{self.estimated_s / 60:.1f} min (bound --max-minutes {self.max_minutes:g})"
        ]
        for r in self.roles:
            b = r.bounds
            clocks = f"{b.clocks_mhz[0]}-{b.clocks_mhz[-1]} MHz" if b.clocks_mhz else "no clock locking"
            power = (
                f"{b.power_min_w:g}-{b.power_max_w:g} W" if b.power_min_w is not None else "no power limit"
            )
            lines.append(f"  {r.role} ({', '.join(r.workers)}; bounds {power}, SM {clocks}):")
            lines.append("    " + ", ".join(s.label() for s in r.settings))
        if self.refine:
            lines.append(
                f"  then up to {self.refine} finer settings per knob near its knee (between the last setting "
                "within the bounds and the first past them), each checked against the bounds"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def plan_sweep(
    roles: dict[str, list[tuple[str, Bounds]]],
    *,
    knobs: Sequence[str] = KNOBS,
    points: int = 4,
    power_limits_w: Sequence[float] | None = None,
    sm_clocks_mhz: Sequence[int] | None = None,
    clock_floor_mhz: int | None = None,
    point_s: float = 20.0,
    settle_s: float = 2.0,
    max_minutes: float = 30.0,
    refine: int = 0,
) -> SweepPlan:
    """The sweep of ``roles`` (role → its workers and their bounds). Explicit ``power_limits_w`` /
    ``sm_clocks_mhz`` (window tops) replace the evenly spaced points; each is checked against the
    bounds of every device of the role first (CalibrateError naming the device and the bound)."""
    for k in knobs:
        if k not in KNOBS:
            raise CalibrateError(f"unknown knob {k!r}; knobs: {', '.join(KNOBS)}")
    if not 1 <= points <= 20:
        raise CalibrateError(f"--points must be in [1, 20], got {points}")
    if not 1 <= point_s <= 3600:
        raise CalibrateError(f"--point-s must be in [1, 3600] s, got {point_s:g}")
    if not 0 <= settle_s <= 60:
        raise CalibrateError(f"--settle-s must be in [0, 60] s, got {settle_s:g}")
    if not 0 <= refine <= 10:
        raise CalibrateError(f"--refine must be in [0, 10] settings per knob, got {refine}")
    if not 0 < max_minutes <= 24 * 60:
        raise CalibrateError(f"--max-minutes must be in (0, 1440], got {max_minutes:g}")
    if not roles:
        raise CalibrateError("no role to calibrate: the stack has no ready worker of the roles asked for")
    out = []
    for role, workers in roles.items():
        each = [b for _, b in workers]
        b = common_bounds(each)
        settings: list[Setting] = [REFERENCE]
        if POWER_LIMIT in knobs:
            chosen = (
                [Setting(POWER_LIMIT, power_limit_w=float(w)) for w in power_limits_w]
                if power_limits_w
                else power_points(b, points)
            )
            settings += chosen
        if SM_CLOCK in knobs:
            if sm_clocks_mhz:
                low = b.clocks_mhz[0] if b.clocks_mhz else int(min(sm_clocks_mhz))
                settings += [
                    Setting(SM_CLOCK, sm_clock_min_mhz=low, sm_clock_max_mhz=int(f)) for f in sm_clocks_mhz
                ]
            else:
                settings += clock_points(b, points, clock_floor_mhz)
        for s in settings:
            for one in each:  # every device of the role must accept it
                one.check(s)
        settings.append(REFERENCE)
        out.append(RolePlan(role, tuple(w for w, _ in workers), b, tuple(settings)))
    plan = SweepPlan(tuple(out), point_s, settle_s, max_minutes, refine=refine)
    check_time(plan)
    return plan


def check_time(plan: SweepPlan) -> None:
    """CalibrateError when the plan would run longer than its ``max_minutes``."""
    if plan.estimated_s > plan.max_minutes * 60:
        raise CalibrateError(
            f"the sweep needs about {plan.estimated_s / 60:.1f} min ({plan.points} points of {plan.point_s:g} s "
            f"load, its tail and {plan.settle_s:g} s settle), over --max-minutes {plan.max_minutes:g}: give fewer --points, "
            "a shorter --point-s, fewer --roles or --knobs, or a larger --max-minutes"
        )
