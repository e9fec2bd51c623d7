"""The contrast D of one real GRPO step, from the counterfactual trial to the ``advantages``
tensor, followed through the round object (:class:`ecredit_trl.trainer.round.Round`).

`ecredit_trl.train.main` on one bundled task (Podman, real verifier trials, real TRL step)
with the tiny random policy, arm B. The policy writes no edits, so each rollout's plan is
given its artifacts when it is planned (as ``tests/test_attribution_step.py`` does): the
factual artifact is the task's gold patch (even rollouts) or nothing (odd ones), the ablated
artifact is empty, and turn 1 is the selected turn. Nothing else is patched: the trials, the
verdicts, the records, the injection and TRL's loss run as in training.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

pytestmark = [pytest.mark.podman, pytest.mark.slow]

LAMBDA, CAP = 0.5, 1.0
NEG_W = 0.5  # negative_advantage_weight: GRPO's negative advantages halved


@pytest.mark.parametrize("reuse", [False, True], ids=["own-trial", "from-control"])
def test_the_contrast_of_a_real_step_reaches_the_advantages_through_the_round(
        tmp_path, monkeypatch, tiny_policy, reuse):
    """``reuse`` False: every admitted row's empty ablation runs its own counterfactual trial;
    True (the default): it takes U(P\\b) from the task's empty-patch control trial of the
    same round, and no counterfactual trial runs."""
    import torch

    import ecredit_trl.agent.episode_record as record_mod
    from ecredit_trl.runs.outcomes import trial_verdict
    from ecredit_trl.train import main
    from ecredit_trl.trainer import ECreditGRPOTrainer
    from eval.tasks.splits import load_tasks

    tasks = {t.instance_id: t for t in load_tasks("bundled:train", purpose="train")}
    real_plan = record_mod.plan_query

    def plan_query(repo, snapshots, **kw):
        plan = real_plan(repo, snapshots, **kw)
        gold = kw["rollout_index"] % 2 == 0
        return dataclasses.replace(
            plan, selection=dataclasses.replace(plan.selection, selected_turn=1),
            final_artifact=tasks[kw["task_id"]].patch if gold else "", ablated_artifact="",
            exclusion=None)

    seen: dict = {}
    real_credit, real_record = ECreditGRPOTrainer._credit_round, ECreditGRPOTrainer._record_round

    def credit_round(self, rnd, out, t0):
        seen["A_trl"] = out["advantages"].clone()
        per_token = real_credit(self, rnd, out, t0)
        seen.update(rnd=rnd, per_token=per_token.clone(), current=self.current_round)
        return per_token

    def record_round(self, rnd, inj, **kw):
        seen.update(turns=inj.turns.clone(), loss_mask=inj.loss_mask.clone())
        return real_record(self, rnd, inj, **kw)

    monkeypatch.setattr(record_mod, "plan_query", plan_query)
    monkeypatch.setattr(ECreditGRPOTrainer, "_credit_round", credit_round)
    monkeypatch.setattr(ECreditGRPOTrainer, "_record_round", record_round)
    rc = main(["--arm", "B", "--model", str(tiny_policy), "--max_steps", "1",
               "--runs_dir", str(tmp_path / "runs"), "--max_tasks", "1",
               "--save_strategy", "no",
               "--mask_truncated_completions", "false",
               "--credit_lambda", str(LAMBDA), "--credit_cap", str(CAP),
               "--negative_advantage_weight", str(NEG_W),
               "--reuse_control_for_empty_ablation", str(reuse).lower()])
    assert rc == 0
    rnd = seen["rnd"]
    assert seen["current"] is None  # the round is an argument, not left on the trainer
    assert rnd.index == 0 and rnd.pending is None and rnd.records
    # 1. the counterfactual trial of each row is in the round (or, reused, the control's),
    #    and its record holds the contrast D = U(P) - U(P\b) of that trial's verdict
    trials = {res.trial_id: (kind, res) for kind, res in rnd.trials}
    (run,) = (tmp_path / "runs").iterdir()
    (ledger,) = [json.loads(x) for x in (run / "ledger.jsonl").read_text().splitlines()]
    if reuse:
        (control,) = [res for kind, res in rnd.trials if kind == "control"]
        assert control.exit_class == "ok"
        assert not any(kind.startswith("counterfactual") for kind, _ in rnd.trials)
        u_empty = trial_verdict(tasks[rnd.records[0].task_id], control, None).utility
        assert u_empty is not None and u_empty < 1.0  # the empty patch does not resolve
        admitted = [rec for rec in rnd.records if rec.exclusion is None]
        assert admitted and ledger["counterfactual_from_control"] == len(admitted)
        assert ledger["trials_counterfactual"] == 0
        for rec in admitted:
            assert rec.counterfactual == {"source": "control", "trial_id": control.trial_id}
            assert rec.utility_ablated == u_empty
            assert rec.contrast == rec.utility - u_empty
    else:
        for rec in rnd.records:
            kind, res = trials[f"cf-{rec.rollout_index}"]  # every row was admitted: one cf trial
            if rec.exclusion is not None:  # its factual utility was unavailable (infra): unused
                assert kind == "counterfactual_discarded" and rec.contrast is None
                continue
            assert kind == "counterfactual" and rec.counterfactual["trial_id"] == res.trial_id
            if rec.utility_ablated is None:  # the counterfactual trial gave no utility
                assert rec.contrast is None
                continue
            assert rec.contrast == rec.utility - rec.utility_ablated
            if rec.rollout_index % 2 == 0:
                assert rec.resolved is True and rec.utility == 1.0  # the gold patch
    assert any(rec.contrast is not None and rec.contrast > 0 for rec in rnd.records)
    # 2. the advantages TRL's loss gets: (A + C) on the loss tokens, with arm B's
    #    C = s·λ·D on every credited token (design page, "Credit arms") and TRL's negative
    #    advantages times negative_advantage_weight (the failed rows: the odd ones)
    A, per_token, turns, mask = seen["A_trl"], seen["per_token"], seen["turns"], seen["loss_mask"]
    assert per_token.shape == mask.shape and A.shape == (len(rnd.records),)
    assert bool((A < 0).any())
    A = torch.where(A < 0, A * NEG_W, A)
    credited = 0
    for i, rec in enumerate(rnd.records):
        gen = turns[i] >= 0
        L, m = int(gen.sum()), int((turns[i] == 1).sum())
        d = rec.contrast
        if m == 0 or d is None:  # no token in the selected turn, or no D: no credit
            c = torch.zeros_like(per_token[i])
        else:
            s = 1.0 if LAMBDA * d == 0 else min(1.0, CAP / (LAMBDA * abs(d) * L / m))
            c = torch.where(gen, torch.tensor(s * LAMBDA * d), torch.tensor(0.0))
        want = (A[i].float() + c) * mask[i].float()
        assert torch.allclose(per_token[i], want, atol=1e-6), (i, d, L, m)
        credited += int((c != 0).sum())
    assert credited > 0  # D changed some token's advantage
    # 3. the records keep the group's own advantage (a failed rollout's stays negative)
    rows = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert [r["advantage"] for r in rows] == pytest.approx(seen["A_trl"].tolist(), abs=1e-6)
