"""The trainer's seams as pure functions: credit injection (A + C per token), the
per-rollout credit the records show, and the collective sandbox health check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ecredit_trl.credit.injection import (
    arm_contrasts,
    inject_credit,
    rollout_credit,
    weight_negative,
)
from ecredit_trl.runs.faults import SandboxUnavailable
from ecredit_trl.runs.rollout_record import RolloutRecord
from ecredit_trl.runs.sandbox_health import (
    probe_sandbox,
    require_sandbox,
    round_had_infra_errors,
)


def _records(contrasts, selected=(1, 1), submit=(None, None)):
    recs = []
    for i, (d, k, s) in enumerate(zip(contrasts, selected, submit, strict=True)):
        r = RolloutRecord(task_id="t", rollout_index=i, format_error=False, num_turns=2,
                          snapshots=[])
        r.contrast, r.selected_turn, r.submit_turn = d, k, s
        recs.append(r)
    return recs


def _masks():
    # row 0: turn 1 (2 tokens), a tool result (1), turn 2 (2); row 1: turn 1 (3), padding (2)
    completion = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    tool = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]])
    return completion, tool


def test_inject_credit_is_a_plus_c_on_the_loss_tokens():
    completion, tool = _masks()
    A = torch.tensor([0.5, -0.5])
    recs = _records([1.0, None])
    inj = inject_credit("M", advantages=A, completion_mask=completion, tool_mask=tool,
                        records=recs, credit_lambda=0.5, credit_cap=1.0)
    assert inj.per_token.shape == inj.C.shape == inj.turns.shape == (2, 5)
    assert inj.per_token.dtype == torch.float32 and inj.A.dtype == torch.float32
    assert torch.equal(inj.loss_mask, completion * tool)
    assert torch.allclose(inj.per_token, (inj.A[:, None] + inj.C) * inj.loss_mask)
    assert inj.turns.tolist() == [[1, 1, -1, 2, 2], [1, 1, 1, -1, -1]]
    assert bool((inj.C[0] != 0).any()) and not bool((inj.C[1] != 0).any())  # D None: C = 0
    assert inj.contrasts == [1.0, None]


def test_arm_o_uses_no_contrast_and_gives_c_zero():
    completion, tool = _masks()
    recs = _records([1.0, -1.0])
    assert arm_contrasts("O", recs) == [None, None] and arm_contrasts("B", recs) == [1.0, -1.0]
    inj = inject_credit("O", advantages=torch.tensor([1.0, 0.0]), completion_mask=completion,
                        tool_mask=None, records=recs, credit_lambda=0.5, credit_cap=1.0)
    assert not bool((inj.C != 0).any())
    assert torch.equal(inj.loss_mask, completion)
    assert torch.allclose(inj.per_token, inj.A[:, None] * completion.float())


def test_negative_advantages_are_weighted_and_the_contrast_is_not():
    A = torch.tensor([1.5, -0.5, 0.0, -2.0])
    assert weight_negative(A, 0.25).tolist() == [1.5, -0.125, 0.0, -0.5]
    assert weight_negative(A, 0.0).tolist() == [1.5, 0.0, 0.0, 0.0]
    assert weight_negative(A, 1.0) is A  # GRPO's own, untouched
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="negative_advantage_weight"):
            weight_negative(A, bad)
    completion, tool = _masks()
    for arm in ("O", "M", "B", "E"):
        recs = _records([-1.0, 1.0])
        kw = dict(completion_mask=completion, tool_mask=tool, records=recs,
                  credit_lambda=0.5, credit_cap=1.0)
        full = inject_credit(arm, advantages=torch.tensor([0.5, -0.5]), **kw)
        half = inject_credit(arm, advantages=torch.tensor([0.5, -0.5]), negative_weight=0.5,
                             **kw)
        assert half.A.tolist() == [0.5, -0.25] and half.A_group.tolist() == [0.5, -0.5]
        assert torch.allclose(half.per_token[0], full.per_token[0])  # A > 0: unchanged
        if arm == "E":  # C is the terminal advantage refocused: the row scales with A
            assert torch.allclose(half.per_token[1], full.per_token[1] * 0.5)
        else:  # the contrast's credit (B, M; O: none) is never weighted
            assert torch.equal(half.C, full.C)
            assert torch.allclose(half.per_token[1], (-0.25 + half.C[1]) * half.loss_mask[1])


def test_inject_credit_refuses_rows_that_do_not_line_up():
    completion, tool = _masks()
    with pytest.raises(RuntimeError, match=r"expected \(3,\) local rows, got \(2,\)"):
        inject_credit("M", advantages=torch.tensor([0.0, 1.0]), completion_mask=completion,
                      tool_mask=tool, records=_records([1.0, None, None], (1, 1, 1),
                                                       (None, None, None)),
                      credit_lambda=0.5, credit_cap=1.0)


def test_rollout_credit_counts_generated_and_credited_tokens():
    completion, tool = _masks()
    recs = _records([1.0, None], submit=(1, None))  # row 0 submitted in turn 1
    inj = inject_credit("M", advantages=torch.tensor([0.5, -0.5]), completion_mask=completion,
                        tool_mask=tool, records=recs, credit_lambda=0.5, credit_cap=1.0)
    generated = torch.tensor([[1, 1, -1, 2, 2], [1, 1, 1, -1, -1]])  # before any masking
    out = rollout_credit("M", recs, turns=inj.turns, generated=generated, A=inj.A, C=inj.C,
                         loss_mask=inj.loss_mask, credit_lambda=0.5, credit_cap=1.0)
    assert [c.generated_tokens for c in out] == [4, 3]  # after-submit tokens still count
    assert [c.credited_tokens for c in out] == [4, 3]
    assert [c.tokens_per_turn for c in out] == [[2, 2], [3, 0]]
    assert inj.turns[0].tolist() == [1, 1, -1, -1, -1]  # C = 0 after submit
    assert out[0].counts["credit_nonzero"] and not out[1].counts["credit_nonzero"]
    assert [c.advantage for c in out] == [0.5, -0.5]
    # weighted for training, recorded as the group gave it: a failed rollout stays negative
    w = inject_credit("M", advantages=torch.tensor([0.5, -0.5]), completion_mask=completion,
                      tool_mask=tool, records=recs, credit_lambda=0.5, credit_cap=1.0,
                      negative_weight=0.0)
    rec = rollout_credit("M", recs, turns=w.turns, generated=generated, A=w.A, C=w.C,
                         loss_mask=w.loss_mask, credit_lambda=0.5, credit_cap=1.0,
                         A_group=w.A_group)
    assert w.A.tolist() == [0.5, 0.0] and [c.advantage for c in rec] == [0.5, -0.5]
    assert set(out[0].counts) == {"L", "applied", "cap_active", "sel_mean", "other_mean",
                                  "credited", "credit_nonzero"}


def test_sandbox_health_probe_and_collective_agreement():
    one = SimpleNamespace(num_processes=1)

    class Down:
        def check_available(self, attempts, backoff_s):
            raise ConnectionError(f"gone after {attempts}")

    class Up:
        def check_available(self, attempts, backoff_s):
            return 2

    assert probe_sandbox(Up(), attempts=3, backoff_s=0.0) == (2, None)
    assert probe_sandbox(object(), attempts=3, backoff_s=0.0) == (0, None)
    retries, error = probe_sandbox(Down(), attempts=3, backoff_s=0.0)
    assert retries == 0 and error == "ConnectionError: gone after 3"
    require_sandbox(one, None, where="before generation round 1", step=1)
    with pytest.raises(SandboxUnavailable, match=r"unavailable before generation round 2 "
                                                 r"\(step 5\): ConnectionError: gone after 3"):
        require_sandbox(one, error, where="before generation round 2", step=5)


def test_round_infra_errors_are_trials_or_uncharged_sandbox_failures():
    ok = SimpleNamespace(exit_class="ok")
    rec = RolloutRecord(task_id="t", rollout_index=0, format_error=False, num_turns=1,
                        snapshots=[])
    assert not round_had_infra_errors([("factual", ok)], [rec])
    assert round_had_infra_errors([("control", SimpleNamespace(exit_class="infra_error"))], [])
    rec.failure = ["sandbox_error", "exec failed"]
    assert round_had_infra_errors([], [rec])
    rec.failure_class = "agent_pids"  # the policy's own: not the service
    assert not round_had_infra_errors([], [rec])
    rec.failure, rec.failure_class = ["disk_budget", "big"], None
    assert not round_had_infra_errors([], [rec])
