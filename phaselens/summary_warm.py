"""The newest scenario's Overview computed ahead: when the service starts on a store that holds a
scenario, and after each import (a scenario merged through ``POST /api/v1/import``, e.g. the demo's
simulated fleet), so that the first page load finds it computed instead of waiting for the hour's
summary (at 64 GPUs × 1 h of 100 ms samples: seconds of the GPU-interval table and the phases).

What is computed is exactly what the dashboard's Overview asks first for a scenario: its whole span
(:func:`dashboard.url_state.scenario_window`) at the fleet size of its GPUs, through the service's
own caches (:class:`phaselens.overview.OverviewService`, which has the whole summary completed on a
thread afterwards for the Bimodal page). A scenario's window never changes until the next import,
which changes the caches' keys and starts a new warm-up: nothing stale is ever answered. A live
window (it grows) is not computed ahead: the overview's rolling cache serves it as before.

Off with ``phaselens collect --no-summary-warm`` or ``$PHASELENS_SUMMARY_WARM=off`` (:func:`warm_enabled`):
the first page load computes the Overview instead. The tests' collectors run with it off (each start
otherwise spends CPU on a summary nobody asks for); the tests of the warm-up turn it on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from dashboard.url_state import scenario_duration_s, scenario_window

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often the import count is looked at
START_DELAY_S = 2.0  # the service's own start (its HTTP server) goes first
ENV = "PHASELENS_SUMMARY_WARM"
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def warm_enabled(no_summary_warm: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """Whether the service computes the Overview ahead: not with ``--no-summary-warm``, nor with
    ``$PHASELENS_SUMMARY_WARM`` set to off (0, false, no); on when unset or on (1, true, yes).
    ValueError naming the variable and the values allowed for anything else."""
    if no_summary_warm:
        return False
    raw = (os.environ if env is None else env).get(ENV, "").strip().lower()
    if raw in ("", *_ON):
        return True
    if raw in _OFF:
        return False
    raise ValueError(f"${ENV}={raw!r}: allowed: {', '.join(_ON)} (on) or {', '.join(_OFF)} (off)")


def overview_params(con: Any) -> dict[str, str] | None:
    """The query parameters the dashboard's Overview sends first for the store's newest scenario
    (as strings, as they arrive over HTTP, so that the cache keys are the page's); None when the
    store holds no scenario."""
    from analytics.window import SIM_PREFIX

    row = con.execute(
        "SELECT scenario_id, start_s, end_s FROM scenarios ORDER BY created_s DESC LIMIT 1"
    ).fetchone()
    if row is None:
        return None
    sid, s0, s1 = str(row[0]), float(row[1]), float(row[2])
    start_s, end_s = scenario_window(s0, 0.0, scenario_duration_s(s0, s1))
    # the page's default fleet size: its GPUs, as dashboard.common.gpu_keys tells them apart
    gpus = con.execute(
        """SELECT count(DISTINCT coalesce(nullif(uuid, ''), concat_ws('/', node, device, "index")))
           FROM devices WHERE node = ? AND since_s < ?""",
        [SIM_PREFIX + sid, end_s],
    ).fetchone()
    params = {"dataset": sid, "start_s": str(start_s), "end_s": str(end_s)}
    return params | {"fleet_gpus": str(max(1, int(gpus[0] or 0)))}


class SummaryWarmer:
    """A service job: at start and after each import, the newest scenario's Overview is computed
    (once per import count) on a thread of its own; ``health()`` says what it did last. Not
    ``enabled``: it never starts, and its health says ``off``."""

    def __init__(
        self,
        store: Any,
        imports: Callable[[], int],
        overviews: Any,
        poll_s: float = POLL_S,
        start_delay_s: float = START_DELAY_S,
        enabled: bool = True,
    ) -> None:
        self.store = store
        self._imports = imports
        self.overviews = overviews
        self._poll_s = poll_s
        self._start_delay_s = start_delay_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done_for: int | None = None
        self.enabled = enabled
        self.last: dict[str, Any] = {"state": "not started" if enabled else "off"}

    def start(self) -> None:
        if not self.enabled:  # --no-summary-warm / $PHASELENS_SUMMARY_WARM=off
            return
        self._thread = threading.Thread(target=self._run, daemon=True, name="summary-warm")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)  # a computation in flight is not interrupted; it is a daemon

    def health(self) -> dict[str, Any]:
        """The last warm-up: scenario, state (computed, failed, no scenario), when and how long."""
        return dict(self.last)

    def warm_once(self) -> None:
        """Compute the newest scenario's Overview now, if not done for the current import count."""
        imports = self._imports()
        if imports == self._done_for:
            return
        self._done_for = imports
        t = time.perf_counter()
        try:
            with self.store.reader() as cur:
                params = overview_params(cur)
            if params is None:
                self.last = {"state": "no scenario", "imports": imports}
                return
            self.overviews.get(params)
            self.last = {
                "state": "computed",
                "scenario": params["dataset"],
                "imports": imports,
                "at_s": time.time(),
                "took_s": round(time.perf_counter() - t, 3),
            }
        except Exception as e:  # a warm-up only: the page that asks computes again and reports it
            log.warning("summary warm-up failed: %s", e)
            self.last = {"state": "failed", "error": f"{type(e).__name__}: {e}", "imports": imports}

    def _run(self) -> None:
        self._stop.wait(self._start_delay_s)
        while not self._stop.is_set():
            self.warm_once()
            self._stop.wait(self._poll_s)
