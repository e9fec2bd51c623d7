"""Tool-loop bookkeeping: calls TRL never ran and calls after submit are not
format errors; tokens generated after submit get C = 0 in every arm."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ecredit_trl.agent.calls import count_calls, submit_turn
from ecredit_trl.credit.planning import credit_turns, per_token_advantages, token_turns


@dataclass
class Call:
    name: str
    turn: int
    ok: bool = True
    status: str = "ok"


def _a(*names):
    return {"role": "assistant", "tool_calls": [{"type": "function",
                                                  "function": {"name": n, "arguments": {}}}
                                                 for n in names]}


def _t(n=1):
    return [{"role": "tool", "name": "x", "content": "out"}] * n


def test_calls_after_the_turn_cap_are_not_run_not_format_errors():
    # turn 1 view ran; turn 2 asked for two calls but TRL's turn cap stopped the loop
    msgs = [_a("view"), *_t(), _a("str_replace", "submit")]
    counts = count_calls(msgs, [Call("view", 1)])
    assert (counts.format_errors, counts.calls_not_run, counts.calls_after_submit) == (0, 2, 0)
    assert counts.submit_turn is None


def test_calls_after_submit_are_counted_apart():
    # turn 1: view; turn 2: submit then bash (refused); turn 3: two more calls (refused);
    # turn 4: one more call TRL never ran; turn 5: text only (no error after submit)
    calls = [Call("view", 1), Call("submit", 2), Call("bash", 2, False, "after_submit"),
             Call("bash", 3, False, "after_submit"), Call("view", 3, False, "after_submit")]
    msgs = [_a("view"), *_t(), _a("submit", "bash"), *_t(2), _a("bash", "view"), *_t(2),
            _a("bash"), {"role": "assistant", "content": "done"}]
    counts = count_calls(msgs, calls)
    assert (counts.format_errors, counts.calls_not_run, counts.calls_after_submit) == (0, 0, 4)
    assert counts.submit_turn == 2 == submit_turn(calls, 5)


def test_policy_errors_stay_format_errors_and_infra_calls_are_not():
    # turn 1: no call; turn 2: unknown tool (TRL ran it, the env never saw it) + an editor
    # error; turn 3: a call that failed in the sandbox (infra), then a refused one (ended)
    calls = [Call("view", 2, False, "error"), Call("bash", 3, False, "infra"),
             Call("view", 3, False, "ended")]
    msgs = [{"role": "assistant", "content": "hmm"}, _a("frobnicate", "view"), *_t(2),
            _a("bash", "view"), *_t(2)]
    counts = count_calls(msgs, calls)
    assert (counts.format_errors, counts.calls_not_run, counts.calls_after_submit) == (3, 0, 0)


def test_overlong_row_whose_tool_results_were_dropped_still_ran_its_calls():
    counts = count_calls([_a("view")], [Call("view", 1)])
    assert (counts.format_errors, counts.calls_not_run) == (0, 0)


def _batch():
    # row 0: turns 1, 2, 3 (3 tokens each) separated by tool tokens; row 1: turns 1, 2
    cm = torch.ones(2, 13, dtype=torch.long)
    tm = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1],
                       [1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]])
    cm[1, 11:] = 0
    return cm, tm


def test_credit_turn_map_drops_tokens_after_submit():
    cm, tm = _batch()
    turns = token_turns(cm, tm)
    got = credit_turns(turns, [2, None])
    assert got[0].tolist() == [1, 1, 1, -1, -1, 2, 2, 2, -1, -1, -1, -1, -1]
    assert torch.equal(got[1], turns[1])
    assert torch.equal(credit_turns(turns, None), turns)
    with pytest.raises(ValueError, match="submit_turns"):
        credit_turns(turns, [1])


@pytest.mark.parametrize("arm", ["O", "B", "M", "E"])
def test_tokens_after_submit_get_no_credit_in_any_arm(arm):
    """Row 0 submitted in turn 2 and then generated turn 3: C = 0 on turn 3 in every arm,
    A still applies there; B and M keep equal mass over the credited tokens (L = 6)."""
    cm, tm = _batch()
    A = torch.tensor([0.5, -0.25])
    kw = dict(advantages=A, completion_mask=cm, tool_mask=tm, contrasts=[0.5, 1.0],
              selected_turns=[2, 1], credit_lambda=0.5, credit_cap=10.0)
    adv, C, turns = per_token_advantages(arm, submit_turns=[2, None], **kw)
    after = torch.zeros_like(cm, dtype=torch.bool)
    after[0, 10:] = True
    assert torch.all(C[after] == 0)
    assert torch.allclose(adv[after], torch.full((3,), 0.5))
    assert int((turns[0] >= 0).sum()) == 6  # L counts credited tokens only
    if arm == "B":
        assert torch.allclose(C[0, :3], torch.full((3,), 0.25))  # s·λ·D = 0.5·0.5
    if arm == "M":
        assert torch.allclose(C[0, 5:8], torch.full((3,), 0.5))  # λ·D·L/m = 0.25·6/3
        assert float(C[0].sum()) == pytest.approx(1.5)  # = B's mass 0.25·6
    if arm == "E":
        assert torch.allclose(C[0, 5:8], torch.full((3,), 0.5))  # λ·A·L/m = 0.5·0.5·6/3
    _, C_no_submit, _ = per_token_advantages(arm, **kw)
    if arm in ("B", "M", "E"):
        assert not torch.equal(C_no_submit, C)  # without the submit record, turn 3 gets C
