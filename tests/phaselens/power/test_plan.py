"""The sweep plan: points inside each device's bounds, a setting the device would refuse refused
before anything is tried (naming the bound), the time bound, and the common bounds of a role."""

from __future__ import annotations

import pytest

from phaselens.power.plan import (
    POWER_LIMIT,
    REFERENCE,
    SM_CLOCK,
    Bounds,
    CalibrateError,
    Setting,
    common_bounds,
    plan_sweep,
)
from serving.devices.emulated import EmulatedDevice


def h200(where: str = "worker-0") -> Bounds:
    """The bounds an emulated H200 reports through the control API (its real knob read)."""
    return Bounds.from_knobs(EmulatedDevice("h200").knobs(), where=where)


def test_points_lie_inside_the_devices_bounds_and_start_and_end_at_the_defaults() -> None:
    b = h200()
    plan = plan_sweep({"decode": [("worker-1", b)]}, points=4, point_s=5, settle_s=1)
    (role,) = plan.roles
    assert role.settings[0] == REFERENCE and role.settings[-1] == REFERENCE
    caps = [s.power_limit_w for s in role.settings if s.knob == POWER_LIMIT]
    tops = [s.sm_clock_max_mhz for s in role.settings if s.knob == SM_CLOCK]
    assert len(caps) == 4 and caps == sorted(caps, reverse=True)
    assert all(b.power_min_w <= c < b.power_default_w for c in caps) and caps[-1] == b.power_min_w
    assert len(tops) == 4 and all(t in b.clocks_mhz and t < b.clocks_mhz[-1] for t in tops)
    for s in role.settings:
        b.check(s)  # nothing the device would refuse


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"power_limits_w": [500, 900]}, "power limit 900 W is outside [200, 700] W of worker-0"),
        ({"power_limits_w": [150]}, "power limit 150 W is outside [200, 700] W"),
        ({"sm_clocks_mhz": [3000]}, "SM clock 3000 MHz is outside [345, 1980] MHz of worker-0"),
        ({"knobs": ["fan"]}, "unknown knob 'fan'"),
        ({"points": 0}, "--points must be in [1, 20]"),
    ],
)
def test_a_setting_the_device_would_refuse_is_refused_before_trying(kw: dict, words: str) -> None:
    with pytest.raises(CalibrateError) as e:
        plan_sweep({"decode": [("worker-0", h200())]}, **kw)
    assert words in str(e.value)


def test_the_device_refuses_the_same_settings_the_plan_refuses() -> None:
    dev, b = EmulatedDevice("h200"), h200()
    for bad in (
        Setting(POWER_LIMIT, power_limit_w=900.0),
        Setting(SM_CLOCK, sm_clock_min_mhz=345, sm_clock_max_mhz=3000),
    ):
        with pytest.raises(CalibrateError):
            b.check(bad)
        with pytest.raises(ValueError):
            if bad.knob == POWER_LIMIT:
                dev.set_power_limit_w(bad.power_limit_w)
            else:
                dev.set_sm_clock_range_mhz(bad.sm_clock_min_mhz, bad.sm_clock_max_mhz)


def test_a_plan_longer_than_max_minutes_is_refused_with_what_to_change() -> None:
    with pytest.raises(CalibrateError) as e:
        plan_sweep({"decode": [("w", h200())]}, points=10, point_s=60, max_minutes=5)
    assert "over --max-minutes 5" in str(e.value) and "fewer --points" in str(e.value)


def test_a_role_takes_only_what_every_device_accepts() -> None:
    a = Bounds("emulated:h200", 200.0, 700.0, 700.0, tuple(range(345, 1981, 15)), "worker-0")
    b = Bounds("emulated:x", 300.0, 600.0, 600.0, tuple(range(600, 1501, 15)), "worker-1")
    c = common_bounds([a, b])
    assert (c.power_min_w, c.power_max_w, c.clocks_mhz[0], c.clocks_mhz[-1]) == (300.0, 600.0, 600, 1500)
    with pytest.raises(CalibrateError, match="worker-1"):
        plan_sweep({"decode": [("worker-0", a), ("worker-1", b)]}, power_limits_w=[250])
