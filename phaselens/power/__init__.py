"""Per-phase power control (issue 24): calibrate power limits and SM-clock windows per GPU, engine
and phase, choose a setting per phase, recommend it and apply it through phaselens/apply/.

- :mod:`~phaselens.power.plan`: settings, a device's bounds (a setting outside them is refused
  before it is tried), the sweep plan and its time bound — no torch, no HTTP;
- :mod:`~phaselens.power.fingerprint`: what a calibration is keyed by (GPU model, driver, model,
  dtype, TP, engine version) and when a record is stale;
- :mod:`~phaselens.power.live`: the sweep on the live stack through its control API, restoring the
  knobs at the end, on an exception and on SIGINT/SIGTERM;
- :mod:`~phaselens.power.simulate`: the same sweep in the simulator for layouts not deployed;
- :mod:`~phaselens.power.choose`: the cliff and the PERF / BAL / EFF choices;
- :mod:`~phaselens.power.records`: ``power_calibrations`` rows and the ``power`` recommendation.

docs/POWER.md describes the method.
"""
