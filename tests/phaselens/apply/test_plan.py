"""The plan: from the stack's workers and a recommendation to ordered, bounded steps (no stack)."""

from __future__ import annotations

import pytest

from phaselens.apply.plan import (
    ApplyError,
    can_serve,
    check_recommendation,
    counts,
    inverse,
    plan_for,
    plan_steps,
)
from phaselens.apply.testing import recommendation_row

URL = "http://127.0.0.1:1"


def live(*roles: str, state: str = "ready") -> dict:
    return {
        "workers": [
            {"id": f"worker-{i}", "role": r, "state": state, "device": "emulated:h200", "emulated": True}
            for i, r in enumerate(roles)
        ]
    }


def walk(workers: list[tuple[str, str]], steps: list) -> list[dict[str, int]]:
    """The role counts after each step (each must serve)."""
    state, out = counts(workers), []
    for s in steps:
        if s.from_role:
            state[s.from_role] -= 1
        if s.role:
            state[s.role] += 1
        assert can_serve(state), (s, state)
        out.append(dict(state))
    return out


def test_agg2_to_1p1d_switches_both_workers_in_a_serving_order() -> None:
    plan = plan_for(recommendation_row(URL, "agg:2xh200", "1p1d:h200"), live("mixed", "mixed"))
    assert [(s.action, s.role) for s in plan.steps] == [("set_role", "prefill"), ("set_role", "decode")]
    assert plan.after == {"mixed": 0, "prefill": 1, "decode": 1}
    assert walk(list(plan.workers_before), list(plan.steps))[-1] == plan.after
    assert "worker-1" in plan.text() and "2 mixed → 1 prefill + 1 decode" in plan.text()


def test_1p1d_to_agg_and_back_and_adds_before_removes() -> None:
    back = plan_for(recommendation_row(URL, "1p1d:h200", "agg:2xh200"), live("prefill", "decode"))
    assert [(s.action, s.role) for s in back.steps] == [("set_role", "mixed"), ("set_role", "mixed")]
    grow = plan_for(recommendation_row(URL, "agg:1xh200", "2p1d:h200"), live("mixed"))
    assert [s.action for s in grow.steps] == ["add_worker", "add_worker", "set_role"]
    assert walk(list(grow.workers_before), list(grow.steps))[-1] == {"mixed": 0, "prefill": 2, "decode": 1}
    shrink = plan_for(
        recommendation_row(URL, "2p2d:h200", "1p1d:h200"), live("prefill", "prefill", "decode", "decode")
    )
    assert [(s.action, s.worker) for s in shrink.steps] == [
        ("remove_worker", "worker-1"),
        ("remove_worker", "worker-3"),
    ]
    same = plan_for(recommendation_row(URL, "agg:2xh200", "agg:2xh200"), live("mixed", "mixed"))
    assert same.steps == () and "no change" in same.text()


def test_one_mixed_worker_to_1p1d_never_strands_the_pool() -> None:
    steps = plan_steps([("worker-0", "mixed")], {"mixed": 0, "prefill": 1, "decode": 1})
    assert [s.action for s in steps] == ["add_worker", "set_role"]
    walk([("worker-0", "mixed")], steps)
    # the inverse steps, newest first, walk back through serving layouts to where it started
    undo = [inverse(s, "worker-9" if s.action == "add_worker" else None) for s in reversed(steps)]
    assert walk([("worker-0", "prefill"), ("worker-9", "decode")], undo)[-1] == {
        "mixed": 1,
        "prefill": 0,
        "decode": 0,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "power_limit"}, "only layout and power"),
        ({"status": "applied"}, "only a proposed"),
        ({"target": "fleet:prod"}, "not the bundled stack"),
    ],
)
def test_refuses_what_cannot_be_applied(change: dict, message: str) -> None:
    row = recommendation_row(URL, "agg:2xh200", "1p1d:h200") | change
    with pytest.raises(ApplyError, match=message) as e:
        check_recommendation(row, row["recommendation_id"])
    assert e.value.status == 409
    with pytest.raises(ApplyError, match="no recommendation 'rec-nope'") as e:
        check_recommendation(None, "rec-nope")
    assert e.value.status == 404


def test_refuses_a_stale_layout_tp2_another_gpu_a_changing_stack_and_past_its_bounds() -> None:
    row = recommendation_row(URL, "agg:2xh200", "1p1d:h200")
    with pytest.raises(
        ApplyError, match=r"stale recommendation .* made for 2 mixed, the stack now has 1 prefill"
    ):
        plan_for(row, live("prefill", "decode"))
    with pytest.raises(ApplyError, match="tp 2"):
        plan_for(recommendation_row(URL, "agg:2xh200", "1p1d:h200:tp2"), live("mixed", "mixed"))
    with pytest.raises(ApplyError, match="for h100-sxm; the stack's workers are emulated h200"):
        plan_for(recommendation_row(URL, "agg:2xh200", "1p1d:h100-sxm"), live("mixed", "mixed"))
    with pytest.raises(ApplyError, match="is draining"):
        plan_for(row, live("mixed", "mixed", state="draining"))
    with pytest.raises(ApplyError, match="adds 5 workers; at most 4"):
        plan_for(recommendation_row(URL, "agg:2xh200", "agg:7xh200"), live("mixed", "mixed"))
    with pytest.raises(ApplyError, match=r"at most 1 .max_steps"):
        plan_for(row, live("mixed", "mixed"), max_steps=1)
    with pytest.raises(ApplyError, match="cannot serve"):
        plan_steps([("worker-0", "mixed")], {"mixed": 0, "prefill": 1, "decode": 0})
