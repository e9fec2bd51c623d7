"""Records the arm study relies on.

* Truncated rows under ``mask_truncated_completions``: the real trainer path in this
  process (``ecredit_trl.train.main``: Podman, the embedded policy, real TRL steps, real
  verifier trials), with the batch crafted at the generation seam: every rollout that
  generates its last turn (turn 3 of ``max_turns: 3``) loses that turn's EOS token, so
  TRL's own rule calls it truncated and masks it. One that made an edit block must be excluded as
  ``truncated`` (no counterfactual trial, not a usable contrast) in both pipelines, and
  the ledger must count its tokens as generated but not credited.
* Resume at or past ``max_steps`` trains nothing; a resume that raises ``max_steps``
  warns, records the schedule change and trains its next step at the rebuilt
  schedule's (non-zero) learning rate.
* The pure parts (truncation rule, token turns before masking, ledger fields, the
  rebuilt schedule's LR) on known values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# -- pure parts ---------------------------------------------------------------------------------
def test_truncation_rule_is_trls():
    from ecredit_trl.credit.planning import is_truncated
    from ecredit_trl.runs.ledger import EXCLUSION_ORDER

    stop = [7, 0]  # eos 7, pad 0
    assert is_truncated([5, 6, 9], stop) and not is_truncated([5, 7], stop)
    assert not is_truncated([5, 0], stop) and not is_truncated([], stop)
    # known before any trial, after the trees' reasons, before the factual one
    assert EXCLUSION_ORDER == ("format_error", "no_eligible_block", "truncated",
                               "no_original_utility")


def test_policy_token_turns_count_every_generated_token():
    from ecredit_trl.credit.planning import policy_token_turns, token_turns

    turns = policy_token_turns([5, 3], [[1, 1, 0, 0, 1], [1, 1, 1]])
    assert turns.tolist() == [[1, 1, -1, -1, 2], [1, 1, 1, -1, -1]]
    assert policy_token_turns([2], None).tolist() == [[1, 1]]
    # the masked view (TRL zeroes a truncated row's masks) loses the row entirely
    masked = token_turns(torch.tensor([[0, 0, 0, 0, 0]]), torch.tensor([[0, 0, 0, 0, 0]]))
    assert int((masked >= 0).sum()) == 0 and int((turns[0] >= 0).sum()) == 3


def test_ledger_separates_generated_and_credited_tokens_and_lists_exclusions():
    from ecredit_trl.runs.ledger import ledger_row, round_counts
    from ecredit_trl.runs.rollout_record import RolloutRecord

    recs = [RolloutRecord(task_id="t", rollout_index=i, format_error=False, num_turns=2,
                          snapshots=[]) for i in range(3)]
    recs[0].exclusion, recs[0].truncated = "truncated", True
    recs[1].exclusion = "no_eligible_block"
    base = {"applied": False, "cap_active": False, "sel_mean": 0.0, "other_mean": 0.0}
    stats = [dict(base, L=900, credited=0, credit_nonzero=False),
             dict(base, L=20, credited=20, credit_nonzero=False),
             dict(base, L=50, credited=40, credit_nonzero=True)]
    tot = {k: float(v) for k, v in round_counts(recs, stats, []).items()}
    row = ledger_row(tot, step=1, arm="M", wall_s=1.0, gpu_hours=0.0)
    assert (row["generated_tokens"], row["credited_tokens"]) == (970, 60)
    assert row["credit_applied"] is True and row["credit_rollouts"] == 1
    assert row["rollouts_excluded"] == {"format_error": 0, "no_eligible_block": 1,
                                        "truncated": 1, "no_original_utility": 0}
    none = ledger_row({k: 0.0 for k in tot}, step=2, arm="O", wall_s=1.0, gpu_hours=0.0)
    assert none["credit_applied"] is False and none["credit_rollouts"] == 0


def test_rebuilt_schedule_lr_and_schedule_change_of_a_checkpoint(tmp_path):
    from transformers import TrainingArguments, get_scheduler

    from ecredit_trl.runs.binding import lr_at, schedule_change, schedule_warning

    args = TrainingArguments(output_dir=str(tmp_path / "o"), learning_rate=1e-4,
                             report_to="none", use_cpu=True)
    assert lr_at(args, step=2, max_steps=2, base_lrs=[1e-4]) == [0.0]
    assert lr_at(args, step=2, max_steps=3, base_lrs=[1e-4, 2e-4]) == pytest.approx(
        [1e-4 / 3, 2e-4 / 3])
    # a real linear scheduler after 2 of 2 steps, saved as transformers saves it
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-4)
    sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=2)
    for _ in range(2):
        opt.step()
        sched.step()
    ck = tmp_path / "checkpoint-2"
    ck.mkdir()
    torch.save(sched.state_dict(), ck / "scheduler.pt")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 2}))
    args.max_steps = 2
    assert schedule_change(ck, args) is None  # same horizon: nothing changes
    args.max_steps = 5
    ch = schedule_change(ck, args)
    assert ch["old_max_steps"] == 2 and ch["new_max_steps"] == 5 and ch["step"] == 2
    assert ch["lr_checkpoint"] == 0.0 and ch["lr_next"] == pytest.approx(1e-4 * 3 / 5)
    assert ch["rebuilt"] is True
    line = schedule_warning(ch)
    assert "max_steps 2 -> 5 at step 2" in line and "6.000e-05" in line


# -- the trainer, for real -------------------------------------------------------------------------


TRAJ_KEYS = ("task_id", "rollout_index", "step", "truncated", "exclusion", "format_error",
             "selected_turn", "eligible_turns", "generated_tokens", "credited_tokens", "L",
             "turns", "calls_not_run")
LEDGER_KEYS = ("step", "generated_tokens", "credited_tokens", "rollouts_excluded",
               "usable_contrasts", "trials_counterfactual", "trials_factual")


def _cut_last_turn_eos(monkeypatch) -> list[int]:
    """Every rollout generating turn 3 (the last of ``max_turns: 3``) loses its final EOS
    token; returns a list that gets the number of rows cut at each such generation."""
    from trl import GRPOTrainer

    real = GRPOTrainer._generate_single_turn
    cuts: list[int] = []

    def gen(self, *args, **kwargs):
        ids, logps = real(self, *args, **kwargs)
        if self.agent_ctx.turn != 3:
            return ids, logps
        cut = [bool(x) and x[-1] in self.eos_token_ids for x in ids]
        ids = [x[:-1] if c else x for x, c in zip(ids, cut, strict=True)]
        if logps is not None:
            logps = [x[:-1] if c else x for x, c in zip(logps, cut, strict=True)]
        cuts.append(sum(cut))
        return ids, logps

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", gen)
    return cuts


@pytest.mark.podman
@pytest.mark.slow
def test_truncated_rows_are_excluded_not_queried_in_both_pipelines(tmp_path, monkeypatch,
                                                                   warm_policy):
    from ecredit_trl.train import main

    cuts = _cut_last_turn_eos(monkeypatch)
    runs = {}
    for pipeline in ("sequential", "overlapped"):
        rc = main(["--arm", "B", "--max_steps", "1", "--runs_dir", str(tmp_path / pipeline),
                   "--max_tasks", "2", "--save_strategy", "no", "--verifier_retries", "0",
                   "--pipeline", pipeline, "--agent_concurrency", "4",
                   "--mask_truncated_completions", "True"])
        assert rc == 0
        (runs[pipeline],) = (tmp_path / pipeline).iterdir()
    assert sum(cuts), "no rollout reached its last turn: the crafted batch did not happen"
    seq, ovl = runs["sequential"], runs["overlapped"]
    t_seq, t_ovl = _jsonl(seq / "trajectories.jsonl"), _jsonl(ovl / "trajectories.jsonl")
    l_seq, l_ovl = _jsonl(seq / "ledger.jsonl"), _jsonl(ovl / "ledger.jsonl")
    # both pipelines decide the same (the verifier's own flakes aside: test_pipeline's job)
    assert [{k: t[k] for k in TRAJ_KEYS} for t in t_ovl] == \
        [{k: t[k] for k in TRAJ_KEYS} for t in t_seq]
    assert [t["counterfactual"] is None for t in t_ovl] == \
        [t["counterfactual"] is None for t in t_seq]
    assert [{k: r[k] for k in LEDGER_KEYS} for r in l_ovl] == \
        [{k: r[k] for k in LEDGER_KEYS} for r in l_seq]
    truncated = [t for t in t_ovl if t["truncated"]]
    assert len(truncated) == sum(cuts) // 2  # every cut row, in each of the two runs
    for t in truncated:  # the trees' reasons first; every admitted one is now "truncated"
        admitted = not t["format_error"] and t["selected_turn"] is not None
        assert t["exclusion"] == ("truncated" if admitted else
                                  "format_error" if t["format_error"] else "no_eligible_block")
    excluded = [t for t in truncated if t["exclusion"] == "truncated"]
    assert excluded, "no truncated rollout had an eligible block"
    for t in excluded:  # planned, factual trial run (its reward counts), never queried
        assert t["selected_turn"] is not None and not t["format_error"]
        assert t["factual"] is not None and t["counterfactual"] is None
        assert t["contrast"] is None and t["credited_tokens"] == 0
        assert t["generated_tokens"] > 0 and t["L"] == 0
    for t in t_ovl:  # a row not truncated is in the loss with all its tokens
        if not t["truncated"]:
            assert t["exclusion"] != "truncated" and t["credited_tokens"] > 0
    ids = json.loads((ovl / "ranks" / "rank0.json").read_text())["trial_ids"]
    assert not {f"cf-{t['rollout_index']}" for t in excluded} & set(ids)
    assert sum(r["trials_counterfactual"] + r["counterfactual_discarded"]
               + r["counterfactual_from_control"] for r in l_ovl) == \
        sum(1 for t in t_ovl if t["counterfactual"] is not None)
    # the ledger: exclusions by reason, tokens generated vs credited, credit per step
    for r in l_ovl:
        rows = [t for t in t_ovl if t["step"] == r["step"]]
        assert set(r["rollouts_excluded"]) >= {"format_error", "no_eligible_block",
                                               "truncated", "no_original_utility"}
        for reason in ("format_error", "no_eligible_block", "truncated",
                       "no_original_utility"):
            assert r["rollouts_excluded"][reason] == sum(1 for t in rows
                                                         if t["exclusion"] == reason)
        assert r["usable_contrasts"] == sum(1 for t in rows if t["contrast"] is not None)
        assert r["generated_tokens"] == sum(t["generated_tokens"] for t in rows)
        assert r["credited_tokens"] == sum(t["credited_tokens"] for t in rows)
        assert r["credit_applied"] == (r["credit_rollouts"] > 0)
        assert r["credit_applied"] == any(t["contrast"] not in (None, 0.0) for t in rows)
    assert sum(r["generated_tokens"] for r in l_ovl) > sum(r["credited_tokens"] for r in l_ovl)


@pytest.mark.podman
@pytest.mark.slow
def test_resume_at_max_steps_trains_nothing_and_a_raised_horizon_keeps_a_live_lr(
        tmp_path, capsys, warm_policy):
    from ecredit_trl.train import main

    runs = tmp_path / "runs"
    args = ["--arm", "O", "--max_steps", "2", "--runs_dir", str(runs), "--max_tasks", "2",
            "--num_generations", "2", "--per_device_train_batch_size", "2",
            "--max_completion_length", "256", "--save_steps", "100", "--verifier_retries", "0",
            # a schedule that decays to 0 at its horizon (the default holds its rate), so a
            # raised horizon must rebuild it
            "--learning_rate", "1e-4", "--lr_scheduler_type", "linear", "--warmup_steps", "0"]
    assert main(args) == 0
    (run,) = runs.iterdir()
    ck = run / "checkpoint-2"  # saved at the last step (save_strategy "steps")
    assert [r["step"] for r in _jsonl(run / "ledger.jsonl")] == [1, 2]
    capsys.readouterr()

    # the final step's checkpoint of a run stopped before its checkpoint-final was written:
    # nothing to train, exit 0, a receipt, checkpoint-final made from checkpoint-2's weights
    shutil.rmtree(run / "checkpoint-final")
    assert main(["--resume-from", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "already at max_steps (2 of 2); nothing to train" in out
    assert "step 3/2" not in out
    assert [r["step"] for r in _jsonl(run / "ledger.jsonl")] == [1, 2]
    term = json.loads((run / "receipts" / "s01-termination.json").read_text())
    assert term["class"] == "completed" and term["step"] == 2
    assert term["already_at_max_steps"] is True and term["trained_steps"] == 0
    assert term["final_checkpoint"] == str(run / "checkpoint-final")
    final = json.loads((run / "receipts" / "s01-checkpoint-final.json").read_text())
    assert final["reason"] == "final" and final["step"] == 2
    assert not final["state_present"]["optimizer"]
    assert final["weights"]["sha256"] == json.loads(
        (run / "receipts" / "s00-checkpoint-000002.json").read_text())["weights"]["sha256"]
    assert (run / "checkpoint-final" / "config.json").is_file()

    # a raised horizon: one more step, at the rebuilt schedule's LR (not the old one's 0)
    assert main(["--resume-from", str(ck), "--max_steps", "3", "--allow-changed", "max_steps",
                 "--reason", "one more step"]) == 0
    out = capsys.readouterr().out
    res = json.loads((run / "receipts" / "s02-resume.json").read_text())
    sched = res["lr_schedule"]
    assert sched["old_max_steps"] == 2 and sched["new_max_steps"] == 3 and sched["step"] == 2
    assert sched["lr_checkpoint"] == 0.0  # linear decay to 0 over the old horizon
    assert sched["rebuilt"] is True and sched["lr_next"] == pytest.approx(1e-4 / 3)
    assert ("resume changes max_steps 2 -> 3 at step 2; the LR schedule is rebuilt for the "
            "new horizon; the next step uses learning rate 3.333e-05") in out
    assert [r["step"] for r in _jsonl(run / "ledger.jsonl")] == [1, 2, 3]
    logged = {r["step"]: r for r in _jsonl(run / "metrics.jsonl") if "learning_rate" in r}
    assert logged[3]["learning_rate"] == pytest.approx(sched["lr_next"])
    assert json.loads((run / "receipts" / "s02-termination.json").read_text())["step"] == 3
