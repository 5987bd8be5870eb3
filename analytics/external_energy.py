"""The fits and the energy of the external attribution (analytics/external.py): exact NNLS for a
few columns, the MIG split of a physical GPU's energy among its instances, and the per-GPU power
model that apportions each interval's measured energy to its states (docs/analytics/external.md).
"""

from __future__ import annotations

import itertools
import json
import re

import numpy as np
import pandas as pd

from analytics.trust import ESTIMATED, Trust

STATES = ("prefill", "decode", "other_busy", "idle")
#: With fewer intervals than this, a GPU with several busy states gets one busy wattage: watts per
#: phase are not identifiable from so few (long) intervals.
MIN_PHASE_FIT_INTERVALS = 6


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns: the best of the least-squares fits over every
    subset of columns whose coefficients are all ≥ 0 (exact for the ≤ 4 columns used here)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n = x.shape[1]
    best, best_rss = np.zeros(n), float(np.sum(y * y))
    for r in range(1, n + 1):
        for cols in itertools.combinations(range(n), r):
            sub = x[:, cols]
            if not np.any(sub):
                continue
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            rss = float(np.sum((y - sub @ coef) ** 2))
            if rss < best_rss - 1e-15:
                best_rss = rss
                best = np.zeros(n)
                best[list(cols)] = coef
    return best


def r2(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    if len(y) < 2:
        return float("nan")
    ss = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - x @ coef) ** 2)) / ss if ss > 0 else float("nan")


def rel_rmse(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    """Root-mean-square residual over the mean of ``y`` (the fit's error per interval)."""
    if not len(y) or y.mean() <= 0:
        return float("nan")
    return float(np.sqrt(np.mean((y - x @ coef) ** 2)) / y.mean())


# --- MIG --------------------------------------------------------------------------------------------------

_SLICES = re.compile(r"^(\d+)g\.")


def mig_energy(iv: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """Give MIG instances their share of the physical GPU's interval energy (counted once)."""
    inst = iv["parent_uuid"].notna()
    if not inst.any():
        return iv
    parents = set(iv.loc[inst, "parent_uuid"])
    whole = iv[~inst & iv["uuid"].isin(parents)]
    iv = iv.copy()
    for parent in parents:
        w = whole[whole["uuid"] == parent]
        mine = iv.index[inst & (iv["parent_uuid"] == parent)]
        if w.empty:
            notes.append(f"MIG GPU {parent}: no whole-GPU samples, so no energy for its instances")
            iv.loc[mine, ["energy_j"]] = np.nan
            continue
        floor_w = float(np.nanmin(w["energy_j"] / w["dt_s"])) if w["energy_j"].notna().any() else 0.0
        energy_at = dict(zip(w["ts_s"], w["energy_j"], strict=True))
        src_at = dict(zip(w["ts_s"], w["energy_source"], strict=True))
        sub = iv.loc[mine]
        slices = sub["mig_profile"].map(
            lambda p: float(m.group(1)) if isinstance(p, str) and (m := _SLICES.match(p)) else 1.0
        )
        frac = (sub["busy_s"] / sub["dt_s"]).fillna(0.0)
        for ts, grp in sub.groupby("ts_s"):
            e = energy_at.get(ts)
            if e is None or not np.isfinite(e):
                iv.loc[grp.index, "energy_j"] = np.nan
                continue
            g = slices.loc[grp.index]
            dt = float(grp["dt_s"].iloc[0])
            base = min(e, floor_w * dt)
            dyn_w = g * frac.loc[grp.index]
            dyn = (e - base) * (dyn_w / dyn_w.sum() if dyn_w.sum() > 0 else g / g.sum())
            iv.loc[grp.index, "energy_j"] = base * g / g.sum() + dyn
            iv.loc[grp.index, "energy_source"] = src_at.get(ts)
        notes.append(
            f"MIG GPU {parent}: {len(sub['gpu'].unique())} instances; its energy counted once, split "
            f"by compute slices (floor {floor_w:.1f} W) and slices × busy fraction (the rest)"
        )
    # the physical GPU row of a MIG GPU has no activity of its own: its time is the instances'
    return iv[~(~inst & iv["uuid"].isin(parents))]


def apportion_energy(iv: pd.DataFrame, missing: list[str], trust: Trust) -> None:
    """Per GPU, fit watts per state and split each interval's measured energy by them.

    The model, in watts: ``energy_j / dt_s = w_idle + Σ_state x_state × busy_state_s / dt_s`` with
    ``w_idle ≥ 0`` and every excess ``x_state ≥ 0`` (a busy GPU draws at least its idle power), so a
    state's watts are ``w_idle + x_state``. Rows: every interval; for a GPU with one busy state (a
    pool) also every sample's own power reading against its own utilization (``POWER_USAGE`` and
    ``GPU_UTIL`` describe the last second or so), whose spread of busy fractions separates idle
    from busy watts when scrapes are long. For a GPU with several busy states those readings add
    more noise (the last second's phase mix is not the interval's) than they help, and they are
    left out.
    """
    busy_states = [s for s in STATES if s != "idle"]
    fallbacks: list[str] = []
    zero_idle: list[str] = []
    for s in STATES:
        iv[f"{s}_energy_j"] = np.nan
    iv["power_model"] = None
    for k, grp in iv.groupby("gpu"):
        e = grp["energy_j"].to_numpy(dtype=float)
        ok = np.isfinite(e)
        if not ok.any():
            missing.append(f"GPU {k}: no energy counter and no power: no energy attributed")
            continue
        dt = grp["dt_s"].to_numpy(dtype=float)
        t = grp[[f"{s}_s" for s in busy_states]].to_numpy(dtype=float)
        x = np.column_stack([np.ones(len(dt)), t / dt[:, None]])[ok]
        y = (e / dt)[ok]
        busy = t.sum(axis=1)
        mix = np.divide(t, busy[:, None], out=np.zeros_like(t), where=busy[:, None] > 0)
        util = grp["gpu_util_pct"].to_numpy(dtype=float) / 100.0
        power = grp["power_w"].to_numpy(dtype=float)
        pts = np.isfinite(util) & np.isfinite(power) & (busy > 0) | (
            np.isfinite(util) & np.isfinite(power) & (util == 0)
        )
        few = int(ok.sum()) < MIN_PHASE_FIT_INTERVALS
        active = t[ok].sum(axis=0) >= 0.01 * dt[ok].sum()
        if pts.any() and int(active.sum()) <= 1:  # one busy state: the readings' mix is exact
            xp = np.column_stack([np.ones(int(pts.sum())), util[pts, None] * mix[pts]])
            x = np.vstack([x, xp])
            y = np.concatenate([y, power[pts]])
        coef = nnls(x, y)
        # A fit is physical when every busy state that takes >= 1 % of the time draws at most 1.5 x
        # the power limit (else 2 x the highest reading; at least idle by construction); otherwise
        # (or with fewer than 3 intervals, or fewer than MIN_PHASE_FIT_INTERVALS and several busy states)
        # fall back to idle + one busy wattage, busy energy split by time (flagged).
        limit = grp["power_limit_w"].max() if "power_limit_w" in grp else np.nan
        cap = (
            1.5 * float(limit)
            if np.isfinite(limit)
            else (2.0 * float(np.nanmax(power)) if np.isfinite(power).any() else np.inf)
        )
        excess = coef[1:]
        bad = (
            int(ok.sum()) < 3
            or (few and int(active.sum()) > 1)  # phase watts not identifiable from a few intervals
            or bool(np.any(active & (coef[0] + excess > cap)))
        )
        if bad:
            x1 = np.column_stack([np.ones(int(ok.sum())), (busy / dt)[ok]])
            y1 = (e / dt)[ok]
            if pts.any():
                x1 = np.vstack([x1, np.column_stack([np.ones(int(pts.sum())), util[pts]])])
                y1 = np.concatenate([y1, power[pts]])
            c1 = nnls(x1, y1)
            coef = np.concatenate([[c1[0]], np.full(len(busy_states), c1[1])])
            fallbacks.append(str(k))
        if coef[0] <= 0 and (dt[ok].sum() - busy[ok].sum()) >= 0.01 * dt[ok].sum():
            zero_idle.append(str(k))
        watts = {"idle": coef[0], **{s: coef[0] + c for s, c in zip(busy_states, coef[1:], strict=True)}}
        w = np.array([watts[s] for s in STATES])
        parts = grp[[f"{s}_s" for s in STATES]].to_numpy(dtype=float) * w
        tot = parts.sum(axis=1)
        fallback = tot <= 0
        parts[fallback] = grp[[f"{s}_s" for s in STATES]].to_numpy(dtype=float)[fallback]
        tot = parts.sum(axis=1)
        share = np.divide(parts, tot[:, None], out=np.zeros_like(parts), where=tot[:, None] > 0)
        for j, s in enumerate(STATES):
            iv.loc[grp.index, f"{s}_energy_j"] = np.where(ok, e * share[:, j], np.nan)
        iv.loc[grp.index, "power_model"] = json.dumps({s: round(float(v), 1) for s, v in watts.items()})
    if zero_idle:
        trust.add(
            ESTIMATED,
            f"GPUs {', '.join(zero_idle)}: idle watts not identifiable (busy about equally in every "
            "interval); the fit gives idle 0 W, so their idle energy is understated",
        )
    if fallbacks:
        trust.add(
            ESTIMATED,
            f"GPUs {', '.join(fallbacks)}: too few or too alike intervals to fit watts per phase; "
            "their busy energy is split by busy time (one busy wattage)",
        )
