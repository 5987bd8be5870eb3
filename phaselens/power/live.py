"""The calibration sweep on the live stack, through its control API (emulated GPUs here; NVML GPUs
through the same API on real hardware).

For each role of the plan and each of its settings: set the knob on every worker of the role
(``POST /control/workers/{id}/device``, a reset first), wait ``settle_s``, run the steady load
(:func:`serving.loadgen.run_load`) and read the devices' energy counters around it
(``GET /v1/devices``, as the apply guard does). Figures: the load's client-side TTFT and ITL
percentiles and throughput, the role's GPU energy → power per GPU and the phase's tokens per joule.

The knobs are put back as they were before the sweep (the defaults, unless someone had set them) at
the end, on any exception, and on SIGINT/SIGTERM (:func:`interruptible`: the signal raises
:class:`SweepInterrupted` in the main thread, the sweep's ``finally`` restores, with further
signals held off until it is done). The load runs on a worker thread so a signal is seen at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from phaselens.apply.stack import StackClient, StackError
from phaselens.power.choose import ChooseOptions, beyond_loosest, knee_brackets
from phaselens.power.load import LoadSpec, steady_trace
from phaselens.power.plan import DEFAULT, RolePlan, Setting, SweepPlan, order_points, refine_settings
from serving.loadgen import LoadReport, run_load

HOST_BOUND_SHARE = 0.05


class SweepInterrupted(Exception):
    """SIGINT or SIGTERM arrived during a sweep (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT/SIGTERM raise :class:`SweepInterrupted` inside (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise SweepInterrupted(signum)

    old = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _shielded() -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM off (recorded, not raised) while the knobs are restored."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = {sig: signal.signal(sig, lambda s, f: got.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield got
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def is_default(knobs: dict[str, Any]) -> bool:
    """The power limit at its default and the SM clocks unlocked."""
    limit, default = knobs.get("power_limit_w"), knobs.get("power_limit_default_w")
    return (limit is None or default is None or abs(limit - default) < 0.5) and knobs.get(
        "locked_sm_clock_min_mhz"
    ) is None


def restore_body(knobs: dict[str, Any]) -> dict[str, Any]:
    """The ``POST .../device`` body that puts a device back to the knob read ``knobs``."""
    body: dict[str, Any] = {"reset": True}
    limit, default = knobs.get("power_limit_w"), knobs.get("power_limit_default_w")
    if limit is not None and default is not None and abs(limit - default) >= 0.5:
        body["power_limit_w"] = limit
    if knobs.get("locked_sm_clock_min_mhz") is not None:
        body["sm_clock_min_mhz"] = knobs["locked_sm_clock_min_mhz"]
        body["sm_clock_max_mhz"] = knobs["locked_sm_clock_max_mhz"]
    return body


def same_knobs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same power limit (to 0.5 W) and clock lock."""
    la, lb = a.get("power_limit_w"), b.get("power_limit_w")
    same_limit = (la is None and lb is None) or (la is not None and lb is not None and abs(la - lb) < 0.5)
    return same_limit and all(
        a.get(k) == b.get(k) for k in ("locked_sm_clock_min_mhz", "locked_sm_clock_max_mhz")
    )


def _ms(stats: Any, q: str) -> float | None:
    v = getattr(stats, q)
    return None if v != v else v / 1000.0  # NaN (no sample) → None


def point_figures(
    report: LoadReport,
    c0: dict[str, dict[str, float]],
    c1: dict[str, dict[str, float]],
    wall_s: float,
    role_workers: tuple[str, ...],
    phase: str,
) -> dict[str, Any]:
    """One point's figures: the load's latency and throughput, the role's GPU energy, power and tokens/J;
    on emulated GPUs also the role's modelled GPU time (``modeled_s``, per iteration, per phase token)
    and the share of iterations the host could not pace (``host_bound`` over 5 %)."""

    def energy(workers: list[str]) -> float | None:
        vals = [
            c1[w]["energy_j"] - c0[w]["energy_j"]
            for w in workers
            if "energy_j" in c0.get(w, {}) and "energy_j" in c1.get(w, {})
        ]
        return sum(vals) if len(vals) == len(workers) and vals else None

    role_e = energy(list(role_workers))
    all_e = energy(sorted(set(c0) & set(c1)))
    iters = sum(c1[w].get("iterations", 0) - c0.get(w, {}).get("iterations", 0) for w in c1)
    lagged = sum(c1[w].get("lagged", 0) - c0.get(w, {}).get("lagged", 0) for w in c1)
    phase_tokens = report.prompt_tokens_total if phase == "prefill" else report.completion_tokens_total
    gpus = max(1, len(c1))
    host_bound = lagged / iters if iters else None
    # the emulated GPUs' modelled time of the role (what the knob changes, whatever the host's pace)
    modeled = [
        c1[w]["modeled_s"] - c0[w]["modeled_s"]
        for w in role_workers
        if "modeled_s" in c0.get(w, {}) and "modeled_s" in c1.get(w, {})
    ]
    role_iters = sum(
        c1[w].get("iterations", 0) - c0.get(w, {}).get("iterations", 0) for w in role_workers if w in c1
    )
    modeled_s = sum(modeled) if modeled and len(modeled) == len(role_workers) else None
    return {
        "requests": report.n_requests,
        "failed": report.n_failed,
        "duration_s": round(report.duration_s, 3),
        "output_tokens_per_s": report.output_tokens_per_s,
        "output_tokens_per_s_per_gpu": report.output_tokens_per_s / gpus,
        "ttft_p50_s": _ms(report.ttft, "p50_ms"),
        "ttft_p90_s": _ms(report.ttft, "p90_ms"),
        "ttft_p99_s": _ms(report.ttft, "p99_ms"),
        "itl_p50_s": _ms(report.itl, "p50_ms"),
        "itl_p90_s": _ms(report.itl, "p90_ms"),
        "itl_p99_s": _ms(report.itl, "p99_ms"),
        "e2e_p50_s": _ms(report.e2e, "p50_ms"),
        "e2e_mean_s": _ms(report.e2e, "mean_ms"),
        "energy_j": role_e,
        "power_w": role_e / wall_s / len(role_workers) if role_e is not None and wall_s > 0 else None,
        "phase_tokens": phase_tokens,
        "tokens_per_j": phase_tokens / role_e if role_e else None,
        "j_per_token": all_e / report.completion_tokens_total
        if all_e and report.completion_tokens_total
        else None,
        "modeled_s": modeled_s,
        "modeled_iteration_s": modeled_s / role_iters if modeled_s and role_iters > 0 else None,
        "modeled_s_per_token": modeled_s / phase_tokens if modeled_s and phase_tokens else None,
        "host_bound_share": host_bound,
        "host_bound": bool(host_bound is not None and host_bound > HOST_BOUND_SHARE),
    }


class LiveSweep:
    """One sweep of ``plan`` on the stack behind ``stack`` under ``load``; :meth:`run` restores the
    knobs however it ends."""

    def __init__(
        self,
        stack: StackClient,
        plan: SweepPlan,
        load: LoadSpec,
        options: ChooseOptions | None = None,
        *,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.stack, self.plan, self.load = stack, plan, load
        self.options = options or ChooseOptions()
        self.on_note = on_note or (lambda s: None)
        self.before: dict[str, dict[str, Any]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.restored: dict[str, Any] | None = None
        self._walls: list[float] = []
        self.started_s = 0.0

    def run(self) -> dict[str, dict[str, Any]]:
        """Sweep every role; the points per role (``points``, ``complete``, ``stopped``). The knobs are
        restored in every case (:attr:`restored`); an interrupt or error is re-raised after that."""
        self.started_s = time.time()
        workers = [w for r in self.plan.roles for w in r.workers]
        self.before = {w: self.stack.device_knobs(w) for w in workers}
        deadline = time.monotonic() + self.plan.max_minutes * 60
        trace = steady_trace(self.load, self.plan.point_s)
        try:
            # not measured: torch's first iterations on a fresh worker are slow (unpaced) and would
            # make the first reference look like a cliff
            _load_in_thread(self.stack.url, trace[: max(4, len(trace) // 4)])
            for role in self.plan.roles:
                self._role(role, trace, deadline)
        finally:
            self.restored = self.restore()
        return self.results

    def _role(self, role: RolePlan, trace: list[Any], deadline: float) -> None:
        out: dict[str, Any] = {
            "points": [],
            "complete": False,
            "stopped": None,
            "workers": list(role.workers),
        }
        self.results[role.role] = out
        first_ref: dict[str, Any] | None = None
        skip_knob: set[str] = set()
        settings = list(role.settings)
        refined_done = False
        i = 0
        while i < len(settings):
            setting = settings[i]
            last = i == len(settings) - 1
            i += 1
            if last and self.plan.refine and first_ref is not None and not refined_done:
                # finer settings near each knee, before the closing reference (checked against the bounds)
                refined_done = True
                brackets = knee_brackets(out["points"], role.phase, self.options)
                finer = refine_settings(role.bounds, brackets, self.plan.refine, settings)
                if finer:
                    self.on_note(
                        f"{role.role}: refining near the knees: {', '.join(s.label() for s in finer)}"
                    )
                    settings[i - 1 : i - 1] = finer
                    i -= 1
                    continue
            refined = setting not in role.settings  # never skipped, never skips its knob
            if setting.knob in skip_knob and not refined:
                continue
            # the next point takes as long as the slowest so far (its requests' tail included)
            if time.monotonic() + max([self.plan.point_s + self.plan.settle_s, *self._walls]) > deadline:
                out["stopped"] = f"--max-minutes {self.plan.max_minutes:g} reached before {setting.label()}"
                self.on_note(f"{role.role}: {out['stopped']}")
                return
            t0 = time.monotonic()
            figures = self._point(role, setting, trace)
            self._walls.append(time.monotonic() - t0)
            out["points"].append({"setting": setting.as_dict(), "figures": figures, "at_s": time.time()})
            self.on_note(f"{role.role}: {setting.label():<22} {_summary(figures)}")
            if setting.knob == DEFAULT and first_ref is None:
                first_ref = figures
            elif (
                first_ref is not None
                and not last
                and not refined
                and beyond_loosest(figures, first_ref, role.phase, self.options)
            ):
                skip_knob.add(setting.knob)
                self.on_note(
                    f"{role.role}: past every mode's bound at {setting.label()}; the rest of this knob is skipped"
                )
        out["points"] = order_points(out["points"])
        out["complete"] = True

    def _point(self, role: RolePlan, setting: Setting, trace: list[Any]) -> dict[str, Any]:
        for w in role.workers:
            self.stack.set_device(w, setting.body())
        time.sleep(self.plan.settle_s)
        c0 = self.stack.counters()
        t0 = time.monotonic()
        report = _load_in_thread(self.stack.url, trace)
        wall = time.monotonic() - t0
        c1 = self.stack.counters()
        return point_figures(report, c0, c1, wall, role.workers, role.phase)

    def restore(self) -> dict[str, Any]:
        """Put every swept worker's knobs back as they were before; read them back to check."""
        with _shielded() as held:
            errors: list[str] = []
            after: dict[str, Any] = {}
            for w, knobs in self.before.items():
                try:
                    self.stack.set_device(w, restore_body(knobs))
                    after[w] = self.stack.device_knobs(w)
                except StackError as e:
                    errors.append(f"{w}: {e}")
            ok = not errors and all(same_knobs(after[w], self.before[w]) for w in self.before)
            self.on_note(
                "knobs restored to what they were before the sweep"
                + (" (the defaults)" if all(is_default(k) for k in self.before.values()) else "")
                if ok
                else f"RESTORE FAILED: {'; '.join(errors) or 'the knobs read back differ'}"
            )
        return {
            "restored": ok,
            "before": self.before,
            "after": after,
            "errors": errors,
            "signals_held": held,
        }


def _load_in_thread(url: str, trace: list[Any]) -> LoadReport:
    """``run_load`` on a worker thread (so the main thread sees a signal at once)."""
    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["report"] = run_load(url, trace, progress=False)
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    t = threading.Thread(target=go, name="calibrate-load", daemon=True)
    t.start()
    while t.is_alive():
        t.join(0.2)
    if "error" in box:
        raise box["error"]
    return box["report"]


def _summary(f: dict[str, Any]) -> str:
    def ms(k: str) -> str:
        v = f.get(k)
        return "—" if v is None else f"{v * 1e3:.1f}"

    p = f.get("power_w")
    tpj = f.get("tokens_per_j")
    return (
        f"{f['output_tokens_per_s']:.1f} tok/s, TTFT p50/p99 {ms('ttft_p50_s')}/{ms('ttft_p99_s')} ms, "
        f"ITL p50/p99 {ms('itl_p50_s')}/{ms('itl_p99_s')} ms, "
        f"{'—' if p is None else f'{p:.0f}'} W/GPU, {'—' if tpj is None else f'{tpj:.3g}'} tok/J"
        + (" (host-bound)" if f.get("host_bound") else "")
    )
