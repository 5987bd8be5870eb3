"""The simulation runs with Python's cyclic garbage collector paused, and puts it back as it was."""

from __future__ import annotations

import gc
import threading

from serving.config import preset
from serving.sim.layout import parse_layout
from serving.sim.simulator import Simulation, gc_paused
from serving.trace import poisson_trace


def _simulation(progress=None) -> Simulation:
    requests = poisson_trace(20.0, 40, prompt_tokens=200, output_tokens=20, seed=3)
    return Simulation(parse_layout("agg:1xh100-sxm"), preset("llama-3.1-8b"), requests, progress=progress)


def test_the_run_pauses_the_collector_and_restores_it() -> None:
    seen: list[bool] = []
    assert gc.isenabled()
    result = _simulation(lambda done_s, total_s: seen.append(gc.isenabled())).run()
    assert result.finished == 40
    assert seen and not any(seen)  # off throughout the loop
    assert gc.isenabled()  # back on after
    gc.disable()
    try:
        _simulation().run()
        assert not gc.isenabled()  # left off when it was off before
    finally:
        gc.enable()


def test_a_failing_run_restores_it_too() -> None:
    def boom(done_s: float, total_s: float) -> None:
        raise RuntimeError("progress failed")

    try:
        _simulation(boom).run()
    except RuntimeError:
        pass
    assert gc.isenabled()


def test_overlapping_pauses_restore_it_when_the_last_ends() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    entered.wait(10)
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_what_the_run_leaves_alive_goes_to_the_oldest_generation() -> None:
    result = _simulation().run()
    assert any(o is result for o in gc.get_objects(generation=2))  # no young collection walks it
    assert gc.get_freeze_count() == 0  # nothing left frozen
