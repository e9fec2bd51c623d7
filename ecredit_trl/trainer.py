"""ECreditGRPOTrainer: TRL's GRPOTrainer with verifier rewards and counterfactual credit.

Per generation batch (DESIGN.md §2):

1. TRL runs the multi-turn tool loop with :class:`~ecredit_trl.agent.env.SWEAgentEnv`
   (``environment_factory``); every tool call is snapshotted and tagged with
   the assistant turn that made it (the trainer advances the turn counter
   before each generation).
2. The reward function :meth:`ECreditGRPOTrainer.verifier_reward` plans each
   rollout's query (blocks, eligibility, verifier-blind selection, ablation),
   runs the factual trials, then (arms B/M) one counterfactual trial per
   admitted rollout, all through the :class:`~sandbox.VerifierPool`. The
   terminal reward comes from the factual report; an unavailable utility
   gives ``None`` (TRL turns that advantage into 0) and is counted.
3. :meth:`_generate_and_score_completions` calls TRL's, then replaces the
   (B,) advantages by ``(A[:, None] + C) * completion_mask * tool_mask`` with
   C from :func:`~ecredit_trl.credit.coefficients.credit_coefficients_batch`, and writes
   the ledger row and the trajectories.

Exact resume (DESIGN.md §5): every checkpoint also holds
``ecredit_state[_<rank>].json`` (generation round, TRL's micro-step counter,
ledger/trajectory row counts, the empty-patch control logs) and, when a
checkpoint falls inside a ``steps_per_generation × num_iterations`` cycle,
TRL's buffered generation batch; :meth:`ECreditGRPOTrainer.restore_state`
reads them back. The sandbox service is checked before every generation round
and after a round with infra errors (bounded retries with backoff); when it
stays unreachable, every rank raises :class:`~ecredit_trl.runs.faults.SandboxUnavailable`
before anything of the round is recorded or applied, and
:meth:`ECreditGRPOTrainer.emergency_checkpoint` saves the state of the last
completed step (RNG states as they were at its end), so a resume continues
exactly.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from ecredit_trl.agent.env import AgentContext, env_factory
from ecredit_trl.config import ECreditConfig
from ecredit_trl.credit.coefficients import credit_stats
from ecredit_trl.credit.planning import (
    contrast,
    generated_by_turn,
    per_token_advantages,
    plan_query,
    turn_snapshots,
)
from ecredit_trl.credit.trajectory import turn_writes
from ecredit_trl.runs.faults import SandboxUnavailable
from ecredit_trl.runs.outcomes import TRIAL_OUTCOMES, trial_outcome
from ecredit_trl.runs.receipts import ECREDIT_STATE
from ecredit_trl.runs.records import append_jsonl, write_json
from sandbox import VerifierPool

COUNTERFACTUAL_ARMS = ("B", "M")


@dataclass
class RolloutRecord:
    """Everything the trainer knows about one rollout after verification."""

    task_id: str
    rollout_index: int
    format_error: bool
    num_turns: int
    snapshots: list[str]
    selected_turn: int | None = None
    selected_paths: list[str] = field(default_factory=list)
    eligible_turns: list[int] = field(default_factory=list)
    generated_only: list[dict] = field(default_factory=list)  # turns whose only files were generated
    exclusion: str | None = None
    reward: float | None = None
    resolved: bool | None = None
    utility: float | None = None
    utility_ablated: float | None = None
    contrast: float | None = None
    factual: dict | None = None
    counterfactual: dict | None = None
    format_errors: int = 0
    tool_calls: list[dict] = field(default_factory=list)
    writes: list[dict] = field(default_factory=list)
    ablation: dict | None = None
    setup_error: str | None = None
    factual_outcome: str | None = None
    counterfactual_outcome: str | None = None


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` whose shuffle depends only on (seed, epoch).

    TRL's sampler draws each epoch's permutation from one generator seeded once,
    so a resumed process (a fresh sampler) would replay epoch 0's order in a
    later epoch. Here epoch ``e`` shuffles with seed ``seed + 1000003 * e``
    (epoch 0 is TRL's order); transformers/accelerate call :meth:`set_epoch`
    before every epoch, so a resume in any epoch sees the same data order.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(int(self.seed) + 1000003 * self.epoch)
        return super().__iter__()


class _TrainerHooks(TrainerCallback):
    """Step-end hook of :class:`ECreditGRPOTrainer`: snapshot for exact emergency checkpoints,
    and the collective stop check of a signal-requested stop."""

    def __init__(self, trainer: ECreditGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        t._take_snapshot()
        stop = t.stop is not None and t.stop.requested
        if t._any_rank(stop):
            control.should_save = True
            control.should_training_stop = True
            t._checkpoint_reason = "signal"
        return control


class ECreditGRPOTrainer(GRPOTrainer):
    """GRPO with counterfactual edit credit (arms O/B/M/E).

    Args:
        model: a causal LM or its path (as for ``GRPOTrainer``).
        args: :class:`~ecredit_trl.config.ECreditConfig`.
        tasks: instance_id → task (``eval.tasks.Task``) for every training row.
        train_dataset: rows with ``prompt`` (chat messages) and ``instance_id``.
        runtime: sandbox runtime for agent sessions and verifier trials.
        run_dir: where ``ledger.jsonl`` and ``trajectories.jsonl`` are appended
            (main process only).
        kwargs: passed to ``GRPOTrainer`` (``processing_class``, ``peft_config``,
            ``callbacks``...).
    """

    def __init__(self, *, model, args: ECreditConfig, tasks: dict, train_dataset, runtime,
                 run_dir: str | Path, **kwargs) -> None:
        self.ecfg = args
        self.tasks = tasks
        self.runtime = runtime
        self.run_dir = Path(run_dir)
        self.agent_ctx = AgentContext(tasks=tasks, runtime=runtime,
                                      bash_timeout_s=args.bash_timeout_s,
                                      snapshot_ignore=tuple(args.snapshot_ignore))
        self.pool = VerifierPool(runtime, max_concurrency=args.verifier_concurrency,
                                 max_retries=args.verifier_retries)
        self._control = {}  # task id -> (GradeReport, log) of the empty-patch control
        self._batch_records: list[RolloutRecord] = []
        self._batch_trials: list = []
        self._generation_round = 0
        self.ledger_rows: list[dict] = []
        self.ledger_rows_total = 0  # rows in ledger.jsonl (all sessions of the run)
        self.trajectory_rows_total = 0  # rows in trajectories.jsonl (all sessions)
        self.verified_trial_ids: list[str] = []  # every trial this rank ran (for audits)
        self.receipts = None  # ecredit_trl.runs.receipts.RunReceipts (main process), set by train.py
        self.stop = None  # ecredit_trl.runs.faults.GracefulStop, set by train.py
        self.checkpoints: list[str] = []  # checkpoints saved by this session
        self.sandbox_retries = 0  # health-check retries this session (all rounds)
        self._snapshot: dict | None = None
        self._emergency = False
        self._checkpoint_reason: str | None = None
        self._round_infra = False
        super().__init__(model=model, reward_funcs=[self.verifier_reward], args=args,
                         train_dataset=train_dataset, environment_factory=env_factory(self.agent_ctx),
                         **kwargs)
        self.add_callback(_TrainerHooks(self))

    def _get_train_sampler(self, dataset=None):
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler:
            return EpochSeededRepeatSampler(
                data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
                batch_size=sampler.batch_size, repeat_count=sampler.repeat_count,
                shuffle=sampler.shuffle, seed=sampler.seed)
        return sampler

    # -- turn bookkeeping ------------------------------------------------------
    def _generate(self, prompts):
        self.agent_ctx.turn = 0
        return super()._generate(prompts)

    def _generate_single_turn(self, *args, **kwargs):
        self.agent_ctx.turn += 1
        return super()._generate_single_turn(*args, **kwargs)

    # -- verification ------------------------------------------------------------
    def _grade(self, task, log: str, control_log: str | None):
        from eval.grading import grade

        return grade(log, f2p=task.FAIL_TO_PASS, p2p=task.PASS_TO_PASS, parser=task.log_parser,
                     control_log=control_log)

    def _spec(self, task, artifact: str, trial_id: str):
        from eval.trialspec import task_trial_spec

        return task_trial_spec(task, artifact, trial_id, timeout_s=self.ecfg.trial_timeout_s,
                               labels={"ecredit.arm": self.ecfg.arm})

    def _ensure_controls(self, task_ids: set[str]) -> None:
        """Run the empty-patch control once per task and rank (for the attribution rule)."""
        missing = sorted(t for t in task_ids if t not in self._control)
        if not missing:
            return
        rank = self.accelerator.process_index
        specs = [self._spec(self.tasks[t], "", f"control-r{rank}-{self._generation_round}-{i}")
                 for i, t in enumerate(missing)]
        for tid, res in zip(missing, self.pool.map(specs), strict=True):
            self._batch_trials.append(("control", res))
            self.verified_trial_ids.append(res.trial_id)
            if res.exit_class == "ok":
                self._control[tid] = (self._grade(self.tasks[tid], res.log, None), res.log)

    def _utility_of(self, task, res) -> tuple[float | None, bool | None, str]:
        control = self._control.get(task.instance_id)
        return trial_outcome(task, res, control[1] if control else None)

    def verifier_reward(self, prompts, completions, environments=None, **kwargs) -> list[float | None]:
        """TRL reward function: verify every rollout of this process (factual + counterfactual).

        Returns one terminal reward per rollout: 1.0/0.0 resolved (or the
        utility, with ``terminal_reward="utility"``), None when unavailable.
        """
        cfg = self.ecfg
        self._batch_trials = []
        proc, nproc = self.accelerator.process_index, self.accelerator.num_processes
        n_local = len(environments)
        records: list[RolloutRecord] = []
        plans = []
        for i, (env, completion) in enumerate(zip(environments, completions, strict=True)):
            rollout_index = self._generation_round * n_local * nproc + proc * n_local + i
            messages = completion if isinstance(completion, list) else []
            n_turns = max(1, sum(1 for m in messages if m.get("role") == "assistant"))
            calls = env.calls
            turns = [min(c.turn, n_turns) for c in calls]
            snaps = turn_snapshots(env.base_tree, turns, [c.tree for c in calls], n_turns)
            fmt = _format_errors(messages, env)
            rec = RolloutRecord(task_id=env.task.instance_id, rollout_index=rollout_index,
                                format_error=env.valid_calls == 0, num_turns=n_turns,
                                snapshots=snaps, format_errors=fmt,
                                setup_error=env.setup_error,
                                tool_calls=[{"turn": c.turn, "name": c.name, "ok": c.ok,
                                             "seconds": round(c.seconds, 4), "error": c.error,
                                             "arguments": c.arguments} for c in calls])
            rec.writes = turn_writes(env.snapshot_repo, snaps)
            plan = plan_query(env.snapshot_repo, snaps, task_id=rec.task_id,
                              rollout_index=rollout_index, run_seed=cfg.selection_seed,
                              test_patterns=cfg.test_path_patterns,
                              format_error=rec.format_error,
                              generated=generated_by_turn(turns, [c.generated for c in calls],
                                                          n_turns))
            # the choice is on record before any trial runs
            rec.selected_turn = plan.selection.selected_turn
            rec.selected_paths = plan.selection.selected_paths
            rec.eligible_turns = plan.selection.eligible_turns
            rec.generated_only = plan.selection.generated_only
            rec.exclusion = plan.exclusion
            rec.ablation = plan.ablation
            records.append(rec)
            plans.append(plan)
        self._ensure_controls({r.task_id for r in records})

        # factual trials: one per rollout, empty artifacts included (a fresh sandbox each)
        specs = [self._spec(self.tasks[r.task_id], p.final_artifact, f"f-{r.rollout_index}")
                 for r, p in zip(records, plans, strict=True)]
        for rec, res in zip(records, self.pool.map(specs), strict=True):
            task = self.tasks[rec.task_id]
            self._batch_trials.append(("factual", res))
            self.verified_trial_ids.append(res.trial_id)
            rec.factual = res.to_json()
            rec.utility, rec.resolved, rec.factual_outcome = self._utility_of(task, res)
            if rec.utility is None:
                rec.reward = None
            elif cfg.terminal_reward == "utility":
                rec.reward = float(rec.utility)
            else:
                rec.reward = 1.0 if rec.resolved else 0.0
            if rec.exclusion is None and rec.utility is None:
                rec.exclusion = "no_original_utility"

        # counterfactual trials: exactly one per admitted rollout, arms B/M only
        if cfg.arm in COUNTERFACTUAL_ARMS:
            cf_idx = [i for i, r in enumerate(records) if r.exclusion is None]
            specs = [self._spec(self.tasks[records[i].task_id], plans[i].ablated_artifact or "",
                                f"cf-{records[i].rollout_index}") for i in cf_idx]
            for i, res in zip(cf_idx, self.pool.map(specs), strict=True):
                rec = records[i]
                self._batch_trials.append(("counterfactual", res))
                self.verified_trial_ids.append(res.trial_id)
                rec.counterfactual = res.to_json()
                rec.utility_ablated, _, rec.counterfactual_outcome = self._utility_of(
                    self.tasks[rec.task_id], res)
                rec.contrast = contrast(rec.utility, rec.utility_ablated)
        self._batch_records = records
        self._round_infra = any(r.exit_class == "infra_error" for _, r in self._batch_trials)
        return [r.reward for r in records]

    # -- credit injection ------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        t0 = time.monotonic()
        round_no = self._generation_round + 1
        self._require_sandbox(f"before generation round {round_no}", check=True)
        self._round_infra = False
        out = super()._generate_and_score_completions(inputs)
        # trials that failed for infra reasons: is the service itself gone? (collective)
        self._require_sandbox(f"after the verifier trials of generation round {round_no}",
                              check=self._round_infra)
        cfg = self.ecfg
        records = self._batch_records
        A = out["advantages"]
        if A.dim() != 1 or len(records) != A.shape[0]:
            raise RuntimeError(f"advantages: expected ({len(records)},) local rows, "
                               f"got {tuple(A.shape)}")
        contrasts = [r.contrast if cfg.arm in COUNTERFACTUAL_ARMS else None for r in records]
        out["advantages"], C, turns = per_token_advantages(
            cfg.arm, advantages=A, completion_mask=out["completion_mask"],
            tool_mask=out.get("tool_mask"), contrasts=contrasts,
            selected_turns=[r.selected_turn for r in records],
            credit_lambda=cfg.credit_lambda, credit_cap=cfg.credit_cap)
        A = A.to(torch.float32)
        self._record_batch(records, turns, A, C, time.monotonic() - t0)
        self._generation_round += 1
        return out

    # -- records -------------------------------------------------------------------
    def _record_batch(self, records, turns, A, C, wall_s: float) -> None:
        cfg = self.ecfg
        stats = []
        traj_rows = []
        for i, rec in enumerate(records):
            row_turns = turns[i]
            L = int((row_turns >= 0).sum())
            st = credit_stats(cfg.arm, contrast=rec.contrast if cfg.arm in COUNTERFACTUAL_ARMS
                              else None, token_turn=row_turns.cpu(),
                              selected_turn=rec.selected_turn, credit_lambda=cfg.credit_lambda,
                              credit_cap=cfg.credit_cap, advantage=float(A[i]))
            sel_mask = (row_turns == rec.selected_turn) if rec.selected_turn else row_turns < -1
            gen_mask = row_turns >= 0
            c_abs = C[i].abs()
            sel_mean = float(c_abs[sel_mask].mean()) if sel_mask.any() else 0.0
            other = gen_mask & ~sel_mask
            other_mean = float(c_abs[other].mean()) if other.any() else 0.0
            per_turn = [int((row_turns == k).sum()) for k in range(1, rec.num_turns + 1)]
            stats.append({"L": L, "applied": st.applied, "cap_active": st.cap_active,
                          "sel_mean": sel_mean, "other_mean": other_mean})
            turns_json = [{"generated_tokens": per_turn[k] if k < len(per_turn) else 0,
                           "writes": rec.writes[k] if k < len(rec.writes) else {}}
                          for k in range(rec.num_turns)]
            traj_rows.append({
                "task_id": rec.task_id, "rollout_index": rec.rollout_index,
                "format_error": rec.format_error, "turns": turns_json,
                "arm": cfg.arm, "step": self.state.global_step + 1, "generated_tokens": L,
                "reward": rec.reward, "resolved": rec.resolved, "utility": rec.utility,
                "utility_ablated": rec.utility_ablated, "contrast": rec.contrast,
                "advantage": float(A[i]), "selected_turn": rec.selected_turn,
                "selected_paths": rec.selected_paths, "eligible_turns": rec.eligible_turns,
                "exclusion": rec.exclusion, "shrinkage": st.s, "cap_active": st.cap_active,
                "m": st.m, "L": st.L, "format_errors": rec.format_errors,
                "tool_calls": rec.tool_calls, "factual": rec.factual,
                "counterfactual": rec.counterfactual, "ablation": rec.ablation,
                "setup_error": rec.setup_error, "factual_outcome": rec.factual_outcome,
                "counterfactual_outcome": rec.counterfactual_outcome})
        trials = self._batch_trials
        n = max(1, len(records))
        local = {
            "rollouts": len(records),
            "generated_tokens": sum(s["L"] for s in stats),
            "trials_factual": sum(1 for k, _ in trials if k == "factual"),
            "trials_counterfactual": sum(1 for k, _ in trials if k == "counterfactual"),
            "trials_control": sum(1 for k, _ in trials if k == "control"),
            "retries": sum(r.retries for _, r in trials),
            "infra_errors": sum(1 for _, r in trials if r.exit_class == "infra_error"),
            "queue_wait_s": sum(r.queue_wait_s for _, r in trials),
            "setup_s": sum(r.setup_s for _, r in trials),
            "verify_s": sum(r.apply_s + r.test_s for _, r in trials),
            "cleanup_s": sum(r.cleanup_s for _, r in trials),
            "resolved": sum(1 for r in records if r.resolved),
            "reward_unavailable": sum(1 for r in records if r.reward is None),
            "usable_contrasts": sum(1 for r in records if r.contrast is not None),
            "nonzero_contrasts": sum(1 for r in records if r.contrast not in (None, 0.0)),
            "cap_active": sum(1 for s in stats if s["cap_active"]),
            "credit_applied": sum(1 for s in stats if s["applied"]),
            "format_error_rollouts": sum(1 for r in records if r.format_error),
            "format_errors": sum(r.format_errors for r in records),
            "sel_abs_c": sum(s["sel_mean"] for s in stats),
            "other_abs_c": sum(s["other_mean"] for s in stats),
        }
        for o in TRIAL_OUTCOMES:  # factual + counterfactual trials by how their result was used
            local[f"outcome_{o}"] = sum(1 for r in records for x in (r.factual_outcome,
                                                                     r.counterfactual_outcome)
                                        if x == o)
        keys = sorted(local)
        vec = torch.tensor([[float(local[k]) for k in keys]], device=self.accelerator.device)
        total = self.accelerator.gather(vec).sum(dim=0).tolist()
        tot = dict(zip(keys, total, strict=True))
        from accelerate.utils import gather_object

        all_traj = gather_object(traj_rows) if self.accelerator.num_processes > 1 else traj_rows
        n = max(1.0, tot["rollouts"])
        metrics = {
            "ecredit/resolved_rate": tot["resolved"] / n,
            "ecredit/reward_unavailable": tot["reward_unavailable"],
            "ecredit/usable_contrasts": tot["usable_contrasts"],
            "ecredit/nonzero_contrasts": tot["nonzero_contrasts"],
            "ecredit/cap_active_rate": tot["cap_active"] / n,
            "ecredit/mean_abs_c_selected": tot["sel_abs_c"] / n,
            "ecredit/mean_abs_c_other": tot["other_abs_c"] / n,
            "ecredit/format_error_rate": tot["format_error_rollouts"] / n,
            "ecredit/trials_per_rollout": (tot["trials_factual"] + tot["trials_counterfactual"]) / n,
            "ecredit/queue_wait_s": tot["queue_wait_s"],
            "ecredit/service_s": tot["setup_s"] + tot["verify_s"] + tot["cleanup_s"],
        }
        mode = "train" if self.model.training else "eval"
        for k, v in metrics.items():
            self._metrics[mode][k].append(float(v))
        row = {"step": self.state.global_step + 1, "arm": cfg.arm,
               "generated_tokens": int(tot["generated_tokens"]),
               "trials_factual": int(tot["trials_factual"]),
               "trials_counterfactual": int(tot["trials_counterfactual"]),
               "trials_control": int(tot["trials_control"]),
               "retries": int(tot["retries"]), "infra_errors": int(tot["infra_errors"]),
               "queue_wait_s": round(tot["queue_wait_s"], 4), "setup_s": round(tot["setup_s"], 4),
               "verify_s": round(tot["verify_s"], 4), "cleanup_s": round(tot["cleanup_s"], 4),
               "wall_s": round(wall_s, 4),
               "gpu_hours": round(wall_s / 3600 * self.accelerator.num_processes, 6)
               if torch.cuda.is_available() else 0.0,
               "rollouts": int(tot["rollouts"]), "resolved": int(tot["resolved"]),
               "reward_unavailable": int(tot["reward_unavailable"]),
               "usable_contrasts": int(tot["usable_contrasts"]),
               "nonzero_contrasts": int(tot["nonzero_contrasts"]),
               "cap_active": int(tot["cap_active"]),
               "format_error_rollouts": int(tot["format_error_rollouts"]),
               "trial_outcomes": {o: int(tot[f"outcome_{o}"]) for o in TRIAL_OUTCOMES
                                  if tot[f"outcome_{o}"]}}
        self.ledger_rows.append(row)
        if self.accelerator.is_main_process:
            append_jsonl(self.run_dir / "ledger.jsonl", [row])
            append_jsonl(self.run_dir / "trajectories.jsonl", all_traj)
        self.ledger_rows_total += 1
        self.trajectory_rows_total += len(all_traj)

    # -- sandbox health ----------------------------------------------------------------
    def _any_rank(self, flag: bool) -> bool:
        """True when ``flag`` is True on any rank (a collective: every rank must call it)."""
        if self.accelerator.num_processes <= 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0], device=self.accelerator.device)
        return bool(self.accelerator.gather(t).max().item() > 0)

    def _require_sandbox(self, where: str, *, check: bool) -> None:
        """Health-check the runtime (when ``check``), then agree across ranks.

        Raises: SandboxUnavailable on every rank when any rank's runtime stayed
        unreachable after ``sandbox_retries`` attempts with backoff.
        """
        error = None
        probe = getattr(self.runtime, "check_available", None)
        if check and probe is not None:
            try:
                self.sandbox_retries += probe(attempts=self.ecfg.sandbox_retries,
                                              backoff_s=self.ecfg.sandbox_retry_backoff_s)
            except Exception as exc:  # PodmanUnavailable, or anything the client raised
                error = f"{type(exc).__name__}: {exc}"
        if self._any_rank(error is not None):
            raise SandboxUnavailable(f"sandbox service unavailable {where} (step "
                                     f"{self.state.global_step + 1}): "
                                     f"{error or 'reported by another rank'}")

    # -- exact resume ----------------------------------------------------------------------
    def _state_file(self) -> str:
        if self.accelerator.num_processes <= 1:
            return ECREDIT_STATE
        return ECREDIT_STATE.replace(".json", f"_{self.accelerator.process_index}.json")

    def _buffer_needed(self) -> bool:
        every = self.args.steps_per_generation * self.num_iterations
        return self._step % every != 0 and self._buffered_inputs is not None

    def _ecredit_state(self) -> dict:
        """The trainer's own counters and caches, as saved in every checkpoint (JSON)."""
        return {"generation_round": self._generation_round, "trl_step": self._step,
                "global_step": self.state.global_step,
                "ledger_rows_total": self.ledger_rows_total,
                "trajectory_rows_total": self.trajectory_rows_total,
                "controls": {tid: log for tid, (_, log) in sorted(self._control.items())},
                "verified_trial_ids": list(self.verified_trial_ids),
                "rank": self.accelerator.process_index,
                "world_size": self.accelerator.num_processes}

    def _take_snapshot(self) -> None:
        """State at the end of a step (what a checkpoint at this step holds)."""
        rng = {"python": random.getstate(), "numpy": np.random.get_state(),
               "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.random.get_rng_state_all()
        self._snapshot = {"rng": rng, "state": self._ecredit_state(),
                          "buffer": self._buffered_inputs if self._buffer_needed() else None,
                          "step": self.state.global_step}

    def _save_rng_state(self, output_dir: str) -> None:
        if not (self._emergency and self._snapshot):
            return super()._save_rng_state(output_dir)
        rng = dict(self._snapshot["rng"])
        if "cuda" in rng and self.args.parallel_mode.value != "distributed":
            rng["cuda"] = rng["cuda"][torch.cuda.current_device()]
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        name = ("rng_state.pth" if self.args.world_size <= 1
                else f"rng_state_{self.args.process_index}.pth")
        torch.save(rng, Path(output_dir) / name)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ck = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self._emergency and self._snapshot:
            state, buffer = self._snapshot["state"], self._snapshot["buffer"]
        else:
            state = self._ecredit_state()
            buffer = self._buffered_inputs if self._buffer_needed() else None
        state = dict(state, buffered_inputs=buffer is not None)
        write_json(ck / self._state_file(), state)
        if buffer is not None:
            torch.save(buffer, ck / self._state_file().replace(".json", "_buffer.pt"))
        self.accelerator.wait_for_everyone()
        reason = ("infra_stop" if self._emergency else self._checkpoint_reason or "save_steps")
        self._checkpoint_reason = None
        self.checkpoints.append(str(ck))
        if self.accelerator.is_main_process and self.receipts is not None:
            self.receipts.checkpoint(ck, step=self.state.global_step, reason=reason,
                                     counters={k: v for k, v in state.items()
                                               if k not in ("controls", "verified_trial_ids")})

    def emergency_checkpoint(self) -> str | None:
        """Save the state of the last completed step after an infra stop (every rank calls it).

        Model and optimizer are untouched since that step ended (the failed round
        never reached ``optimizer.step``); RNG states, TRL's step counter and our
        counters come from the snapshot taken at its end. Returns the checkpoint
        path, or None before the first completed step.
        """
        step = self.state.global_step
        if step == 0 or self._snapshot is None or self._snapshot["step"] != step:
            return None
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        ck = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if str(ck) in self.checkpoints:  # saved at this very step already
            return str(ck)
        self._emergency = True
        try:
            self._save_checkpoint(self.model, trial=None)
        finally:
            self._emergency = False
        return str(ck)

    def restore_state(self, checkpoint: str | Path) -> dict:
        """Read this rank's counters and caches back from ``checkpoint`` (before ``train``).

        Raises: FileNotFoundError / ValueError naming the state file.
        """
        ck = Path(checkpoint)
        path = ck / self._state_file()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; the checkpoint cannot be resumed exactly")
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from exc
        self._generation_round = int(state["generation_round"])
        self._step = int(state["trl_step"])
        self.ledger_rows_total = int(state["ledger_rows_total"])
        self.trajectory_rows_total = int(state["trajectory_rows_total"])
        self.verified_trial_ids = list(state.get("verified_trial_ids", []))
        self._control = {}
        for tid, log in state.get("controls", {}).items():
            if tid in self.tasks:
                self._control[tid] = (self._grade(self.tasks[tid], log, None), log)
        if state.get("buffered_inputs"):
            buf = path.with_name(path.name.replace(".json", "_buffer.pt"))
            self._buffered_inputs = torch.load(buf, weights_only=False)
        return state


def _format_errors(messages: list[dict], env) -> int:
    """Format errors of one rollout: assistant turns with no parseable tool call (before
    a submit), tool calls that never reached the environment (unknown tool, bad
    arguments) and calls the environment refused."""
    errors = 0
    submitted = False
    requested = 0
    for m in messages:
        if m.get("role") != "assistant":
            continue
        calls = m.get("tool_calls") or []
        if not calls and not submitted:
            errors += 1
        requested += len(calls)
        if any((c.get("function") or {}).get("name") == "submit" for c in calls):
            submitted = True
    reached = len(env.calls)
    errors += max(0, requested - reached)
    errors += sum(1 for c in env.calls if not c.ok)
    return errors


__all__ = ["ECreditGRPOTrainer", "RolloutRecord"]
