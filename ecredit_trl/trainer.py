"""ECreditGRPOTrainer: TRL's GRPOTrainer with verifier rewards and counterfactual credit.

Per generation batch (DESIGN.md §2):

1. TRL runs the multi-turn tool loop with :class:`~ecredit_trl.agent.SWEAgentEnv`
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
   C from :func:`~ecredit_trl.credit.credit_coefficients_batch`, and writes
   the ledger row and the trajectories.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import GRPOTrainer

from ecredit_trl.agent import AgentContext, env_factory
from ecredit_trl.config import ECreditConfig
from ecredit_trl.credit import credit_stats
from ecredit_trl.records import append_jsonl
from ecredit_trl.rollout_credit import (
    contrast,
    per_token_advantages,
    plan_query,
    turn_snapshots,
)
from sandbox import VerifierPool
from sandbox.snapshot import changed_paths

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
                                      bash_timeout_s=args.bash_timeout_s)
        self.pool = VerifierPool(runtime, max_concurrency=args.verifier_concurrency,
                                 max_retries=args.verifier_retries)
        self._control = {}  # task id -> (GradeReport, log) of the empty-patch control
        self._batch_records: list[RolloutRecord] = []
        self._batch_trials: list = []
        self._generation_round = 0
        self.ledger_rows: list[dict] = []
        self.verified_trial_ids: list[str] = []  # every trial this rank ran (for audits)
        super().__init__(model=model, reward_funcs=[self.verifier_reward], args=args,
                         train_dataset=train_dataset, environment_factory=env_factory(self.agent_ctx),
                         **kwargs)

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
        from eval.tasks import task_trial_spec

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

    def _utility_of(self, task, res) -> tuple[float | None, bool | None]:
        if res is None or res.exit_class != "ok":
            return None, None
        control = self._control.get(task.instance_id)
        rep = self._grade(task, res.log, control[1] if control else None)
        return rep.utility, (rep.resolved if rep.utility is not None else None)

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
            rec.writes = _turn_writes(env.workdir, snaps)
            plan = plan_query(env.workdir, snaps, task_id=rec.task_id,
                              rollout_index=rollout_index, run_seed=cfg.selection_seed,
                              test_patterns=cfg.test_path_patterns,
                              format_error=rec.format_error)
            # the choice is on record before any trial runs
            rec.selected_turn = plan.selection.selected_turn
            rec.selected_paths = plan.selection.selected_paths
            rec.eligible_turns = plan.selection.eligible_turns
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
            rec.utility, rec.resolved = self._utility_of(task, res)
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
                rec.utility_ablated, _ = self._utility_of(self.tasks[rec.task_id], res)
                rec.contrast = contrast(rec.utility, rec.utility_ablated)
        self._batch_records = records
        return [r.reward for r in records]

    # -- credit injection ------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        t0 = time.monotonic()
        out = super()._generate_and_score_completions(inputs)
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
                "arm": cfg.arm, "step": self.state.global_step, "generated_tokens": L,
                "reward": rec.reward, "resolved": rec.resolved, "utility": rec.utility,
                "utility_ablated": rec.utility_ablated, "contrast": rec.contrast,
                "advantage": float(A[i]), "selected_turn": rec.selected_turn,
                "selected_paths": rec.selected_paths, "eligible_turns": rec.eligible_turns,
                "exclusion": rec.exclusion, "shrinkage": st.s, "cap_active": st.cap_active,
                "m": st.m, "L": st.L, "format_errors": rec.format_errors,
                "tool_calls": rec.tool_calls, "factual": rec.factual,
                "counterfactual": rec.counterfactual, "ablation": rec.ablation,
                "setup_error": rec.setup_error})
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
               "format_error_rollouts": int(tot["format_error_rollouts"])}
        self.ledger_rows.append(row)
        if self.accelerator.is_main_process:
            append_jsonl(self.run_dir / "ledger.jsonl", [row])
            append_jsonl(self.run_dir / "trajectories.jsonl", all_traj)


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


def _turn_writes(repo, snaps: list[str]) -> list[dict]:
    """Per turn, the replay-format writes: path → text, None (deleted) or {"base64": ...}."""
    import subprocess

    out = []
    for k in range(1, len(snaps)):
        writes = {}
        if snaps[k] != snaps[k - 1]:
            for ch in changed_paths(repo, snaps[k - 1], snaps[k]):
                if ch.status == "D":
                    writes[ch.path] = None
                    continue
                blob = subprocess.run(["git", "-C", str(repo), "cat-file", "blob",
                                       f"{snaps[k]}:{ch.path}"], capture_output=True).stdout
                try:
                    writes[ch.path] = blob.decode("utf-8")
                except UnicodeDecodeError:
                    writes[ch.path] = {"base64": base64.b64encode(blob).decode()}
        out.append(writes)
    return out


__all__ = ["ECreditGRPOTrainer", "RolloutRecord"]
