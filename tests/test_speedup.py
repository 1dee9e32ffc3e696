"""bebop.speedup: which runs a speedup may divide, the one statistic, and a prediction that says when it is beaten."""

from __future__ import annotations

import math

import pytest

from bebop import speedup


def meta(**changes) -> dict:
    """meta.json of a demo-like RL run: 8 prompts x 4 at 96 tokens, async, on the tiny policy."""
    config = {"task": "math", "prompts_per_step": 8, "group_size": 4, "max_new_tokens": 96, "temperature": 1.0,
              "gen_dtype": "auto", "backend": "bebop", "mode": "async", "rollout": "rs"}
    out = {"kind": "rl", "task": "math", "mode": "async", "rollout": "rs", "device": "cpu", "world_size": 1,
           "policy_parameters": 3175168, "config": config}
    for key, value in changes.items():
        (out["config"] if key in config and key not in ("task", "mode", "rollout") else out)[key] = value
    return out


def test_steady_steps_leave_out_the_first_and_the_last():
    records = [{"s": v} for v in (9.0, 1.0, 2.0, 4.0, 8.0)]
    assert [r["s"] for r in speedup.steady(records)] == [1.0, 2.0, 4.0]
    assert speedup.median(records, "s") == 2.0
    assert [r["s"] for r in speedup.steady(records[:2])] == [1.0] and speedup.steady(records[:1]) == records[:1]
    assert math.isnan(speedup.median([{"s": float("nan")}] * 3, "s"))  # no value logged: no number made up


def test_only_runs_of_the_same_workload_pair():
    plain = meta(rollout="none")
    assert speedup.differences(plain, meta()) == []  # decoding is not part of the workload
    assert speedup.differences(plain, meta(prompts_per_step=1)) == ["rows"]  # 4 rows against 32
    assert speedup.differences(plain, meta(mode="sync", max_new_tokens=64)) == ["mode", "max_new_tokens"]
    assert speedup.decodes_plainly(plain) and not speedup.decodes_plainly(meta())
    old = meta(rollout="none")
    del old["device"], old["config"]["backend"]  # a run from before these were recorded: not held against it
    assert speedup.differences(old, meta()) == []


@pytest.mark.parametrize("left, right, same", [
    ({}, {}, True),  # the same parameter count, neither names its policy
    ({"policy_parameters": 134515008}, {}, False),  # SmolLM2 against the tiny policy
    ({"policy": {"name": "smollm2", "hash": "ab"}}, {"policy": {"name": "smollm2", "hash": "ab"}}, True),
    ({"policy": {"name": "smollm2", "hash": "ab"}}, {"policy": {"name": "smollm2", "hash": "cd"}}, False),
    ({"policy": {"name": "smollm2"}, "policy_parameters": 3175168}, {}, True),  # one names it: compared by count
])
def test_policies_compare_by_name_hash_or_parameter_count(left, right, same):
    assert speedup.same_policy(meta(**left), meta(**right)) is same
    assert ("policy" in speedup.differences(meta(**left), meta(**right))) is not same


def test_a_run_that_names_its_policy_is_not_one_that_says_nothing():
    named, anonymous = meta(policy="smollm2"), meta()
    del named["policy_parameters"], anonymous["policy_parameters"]
    assert not speedup.same_policy(named, anonymous)
    del named["policy"]
    assert speedup.same_policy(named, anonymous)  # two synthetic runs: nothing tells them apart


def _records(steps: int, *, gen_s: float, draft_s: float, verify_s: float, accepted: int | None, length=60.0):
    rows = []
    for step in range(steps):
        row = {"step": step, "timing_s/gen": gen_s, "timing_s/step": gen_s + 0.5, "response_length/mean": length,
               "engine/num_steps": 10, "engine/draft_s": 10 * draft_s, "engine/verify_s": 10 * verify_s,
               "engine/advance_s": 0.0, "engine/num_row_steps": 40}
        if accepted is not None:
            row.update({"spec/num_drafts": 40, "spec/num_accepted_tokens": accepted})
        rows.append(row)
    return rows


def test_the_prediction_and_the_flag_when_a_measurement_beats_it():
    plain = _records(4, gen_s=2.0, draft_s=0.0, verify_s=0.01, accepted=None)
    spec = _records(4, gen_s=1.0, draft_s=0.005, verify_s=0.015, accepted=40)  # 2 tokens per row-step, cost 2 steps
    s = speedup.speedup(plain, spec)
    assert (s.tokens_per_row_step, s.step_cost, s.predicted) == pytest.approx((2.0, 2.0, 1.0))
    assert s.rollout == 2.0 and s.end_to_end == pytest.approx(2.5 / 1.5) and s.beyond
    assert s.note().startswith("measured 2.00x is 100% beyond the 1.00x predicted from measured costs")
    shorter = speedup.speedup(plain, _records(4, gen_s=1.0, draft_s=0.005, verify_s=0.015, accepted=40, length=30.0))
    assert "its responses were 50% shorter than the plain run's" in shorter.note()
    slow = speedup.speedup(plain, _records(4, gen_s=4.0, draft_s=0.005, verify_s=0.015, accepted=40))
    assert not slow.beyond and slow.note() == ""
