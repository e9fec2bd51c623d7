"""ECreditGRPOTrainer: TRL's GRPOTrainer with verifier rewards and counterfactual credit.

Per generation batch (DESIGN.md §2):

1. TRL runs the multi-turn tool loop with :class:`~ecredit_trl.agent.env.SWEAgentEnv`
   (``environment_factory``); every tool call is snapshotted and tagged with
   the assistant turn that made it (the trainer advances the turn counter
   before each generation).
2. Each rollout's query is planned (blocks, eligibility, verifier-blind selection,
   ablation) and its factual trial plus (arms B/M) at most one counterfactual trial run
   through the :class:`~sandbox.VerifierPool` (:mod:`ecredit_trl.credit.pipeline`).
   ``pipeline: overlapped`` (default): the rollouts' tool calls of each iteration of
   TRL's tool loop run in parallel (:mod:`ecredit_trl.agent.toolpool`, bounded by
   ``agent_concurrency``) and a rollout's trials are submitted the moment its episode
   ends, while the others still generate; ``pipeline: sequential``: one rollout's tool
   calls after another, every trial after the last episode. The reward function
   :meth:`ECreditGRPOTrainer.verifier_reward` returns the terminal rewards from the
   factual reports; an unavailable utility gives ``None`` (TRL turns that advantage
   into 0) and is counted. A trial the artifact broke (hang, OOM, pids, output flood,
   apply failure while the control was healthy and the retry broke too:
   :mod:`eval.integrity.attribution`) is not unavailable: it gets the failure value.
3. :meth:`_generate_and_score_completions` calls TRL's, then replaces the (B,) advantages
   by ``(A[:, None] + C) * completion_mask * tool_mask`` with C from
   :func:`~ecredit_trl.credit.coefficients.credit_coefficients_batch`, and writes the ledger
   row (stage timings: :mod:`ecredit_trl.runs.timings`) and the trajectories. With
   ``mask_truncated_completions`` a truncated row (TRL's rule) is excluded as ``truncated``.

Exact resume (DESIGN.md §5): every checkpoint also holds ``ecredit_state[_<rank>].json``
(generation round, TRL's micro-step counter, ledger/trajectory row counts, the empty-patch
control logs) and, when a checkpoint falls inside a ``steps_per_generation ×
num_iterations`` cycle, TRL's buffered generation batch;
:meth:`ECreditGRPOTrainer.restore_state` reads them back. The sandbox service is checked
before every generation round and after a round with infra errors (bounded retries with
backoff); when it stays unreachable, every rank raises
:class:`~ecredit_trl.runs.faults.SandboxUnavailable` before anything of the round is
recorded or applied, and :meth:`ECreditGRPOTrainer.emergency_checkpoint` saves the state of
the last completed step (RNG states as they were at its end), so a resume continues exactly.
"""

from __future__ import annotations

import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import GRPOTrainer

from ecredit_trl.agent.calls import count_calls
from ecredit_trl.agent.env import AgentContext, env_factory, release, release_sandbox
from ecredit_trl.agent.failures import apply_episode_failure
from ecredit_trl.agent.toolpool import ToolPrefetcher, prefetch_resets, timed_tool_dicts
from ecredit_trl.config import ECreditConfig
from ecredit_trl.credit.arms import COUNTERFACTUAL_ARMS
from ecredit_trl.credit.coefficients import credit_stats
from ecredit_trl.credit.pipeline import PendingRollout, TrialPipelineMixin
from ecredit_trl.credit.planning import (
    generated_by_turn,
    is_truncated,
    per_token_advantages,
    plan_query,
    policy_token_turns,
    turn_snapshots,
)
from ecredit_trl.credit.trajectory import turn_writes
from ecredit_trl.runs.checkpoint_state import (
    ExactResumeMixin,
    TrainerHooks,
)
from ecredit_trl.runs.faults import SandboxUnavailable
from ecredit_trl.runs.ledger import (
    credit_magnitudes,
    ledger_row,
    round_counts,
    round_metrics,
    trajectory_row,
)
from ecredit_trl.runs.records import append_jsonl
from ecredit_trl.runs.timings import TIMING_FIELDS, RoundClock, stage_timings
from sandbox.trials.pool import VerifierPool


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
    failure_class: str | None = None  # artifact_* / agent_*: a failure charged to the policy
    failure_evidence: dict | None = None  # control duration, limit, retry, ... (issue 21 §2)
    calls_not_run: int = 0
    calls_after_submit: int = 0
    submit_turn: int | None = None
    failure: list[str] | None = None  # [reason, detail]: the episode ended on an infra failure
    record_error: str | None = None  # traceback: building this rollout's records raised
    truncated: bool = False  # TRL's rule: the completion does not end with EOS / pad


class ECreditGRPOTrainer(ExactResumeMixin, TrialPipelineMixin, GRPOTrainer):
    """GRPO with counterfactual edit credit (arms O/B/M/E).

    Args:
        model: a causal LM or its path (as for ``GRPOTrainer``).
        args: :class:`~ecredit_trl.config.ECreditConfig`.
        tasks: instance_id → task (``eval.tasks.schema.Task``) for every training row.
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
                                      max_file_bytes=args.agent_max_file_mib * 2**20,
                                      tree_budget_bytes=args.agent_tree_budget_mib * 2**20,
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
        self._round_clock: RoundClock | None = None  # stage intervals of the running round
        self._prefetcher: ToolPrefetcher | None = None  # set while TRL's tool loop runs
        self._round_controls: list = []  # overlapped: (task id, future) of the round's controls
        self._round_pending: dict | None = None  # overlapped: row -> future of PendingRollout
        self._loop_completions: list | None = None
        self._loop_completion_ids: list | None = None  # TRL's per-row ids (final at episode end)
        self._round_gen_turns = None  # (B, T) turn of each generated token, before masking
        self._tool_executor = (ThreadPoolExecutor(max_workers=args.agent_concurrency,
                                                  thread_name_prefix="agent-tools")
                               if args.pipeline == "overlapped" else None)
        super().__init__(model=model, reward_funcs=[self.verifier_reward], args=args,
                         train_dataset=train_dataset, environment_factory=env_factory(self.agent_ctx),
                         **kwargs)
        self.add_callback(TrainerHooks(self))

    # -- turn bookkeeping ------------------------------------------------------
    def _generate(self, prompts):
        """TRL's, noting the turn of every token the policy generated before any masking
        (``mask_truncated_completions`` zeroes truncated rows later; they still cost)."""
        self.agent_ctx.turn = 0
        out = super()._generate(prompts)
        self._loop_completion_ids = out[1]
        self._round_gen_turns = policy_token_turns([len(x) for x in out[1]], out[2])
        return out

    def _row_truncated(self, ids) -> bool:
        """TRL's truncation rule for one row's completion ids (:func:`is_truncated`)."""
        return is_truncated(ids, [*self.eos_token_ids, self._tokenizer.pad_token_id])

    def _start_overlapped_round(self, inputs) -> None:
        """Overlapped pipeline, start of a round: queue the empty-patch controls of the
        batch's tasks, then reset the environments TRL will hand out (its pool, in
        order) concurrently on the agent pool (:func:`~ecredit_trl.agent.toolpool.prefetch_resets`)."""
        self._round_pending = {}
        self._round_controls = self._submit_controls({x["instance_id"] for x in inputs})
        if self._multi_environment:
            return
        pool = self._environment_pool[None]
        while len(pool) < len(inputs):  # TRL grows its pool the same way
            pool.append(self.environment_factories[None]())
        prefetch_resets(pool[:len(inputs)], list(inputs), self._tool_executor)

    def _generate_single_turn(self, *args, **kwargs):
        self.agent_ctx.turn += 1
        if self._prefetcher is not None:
            self._prefetcher.generation_started()
        t0 = time.monotonic()
        out = super()._generate_single_turn(*args, **kwargs)
        if self._round_clock is not None:
            self._round_clock.add("generation", t0, time.monotonic())
        return out

    # -- tool loop -----------------------------------------------------------------
    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *args):
        """TRL's tool loop with this pipeline's tool dicts (timed in place, or prefetched
        in parallel across rollouts: :class:`~ecredit_trl.agent.toolpool.ToolPrefetcher`);
        in the overlapped pipeline every rollout leaving the loop has its trials
        submitted at once (:meth:`_episode_ended`)."""
        real = self._sync_tool_dicts
        self._loop_completion_ids = completion_ids  # TRL updates it in place per row
        clock = self._round_clock
        record = (lambda a, b: clock.add("tools", a, b)) if clock is not None else (
            lambda a, b: None)
        if self._tool_executor is None or any(self._async_tool_dicts):
            self._sync_tool_dicts = timed_tool_dicts(real, record)
            try:
                return super()._tool_call_loop(prompts, prompt_ids, completion_ids,
                                               completions, *args)
            finally:
                self._sync_tool_dicts = real
        self._loop_completions = completions
        pf = ToolPrefetcher(completions, real, self._tool_executor,
                            on_episode_end=self._episode_ended)
        self._prefetcher, self._sync_tool_dicts = pf, pf.dicts
        try:
            out = super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions,
                                          *args)
            pf.finish()
        finally:
            self._prefetcher, self._sync_tool_dicts = None, real
            for a, b in pf.times.jobs:
                record(a, b)
        return out

    def _episode_ended(self, i: int) -> None:
        """Overlapped pipeline: row ``i`` left the tool loop; build its records and submit
        its trials on the agent pool (:meth:`_finish_episode`)."""
        if self._round_pending is not None and i not in self._round_pending:
            self._round_pending[i] = self._tool_executor.submit(
                self._finish_episode, i, self._loop_completions[i])

    def _rollout_index(self, i: int, n_local: int) -> int:
        proc, nproc = self.accelerator.process_index, self.accelerator.num_processes
        return self._generation_round * n_local * nproc + proc * n_local + i

    def _finish_episode(self, i: int, completion) -> PendingRollout:
        """Release row ``i``'s container, build its record and plan, remove its tree, and
        submit its trials (overlapped pipeline; row ``i``'s ids are final: truncation known)."""
        env = self.environments[i]
        release_sandbox(env)
        rec, plan = self._rollout_record(env, completion,
                                         self._rollout_index(i, len(self.environments)),
                                         truncated=self._row_truncated(
                                             self._loop_completion_ids[i]))
        release(env)
        return self._submit_rollout_trials(rec, plan)

    def _rollout_record(self, env, completion, rollout_index: int, *, truncated: bool):
        """One rollout's record and query plan, guarded (issue 11 §2). ``truncated`` (TRL's
        rule on the row's final ids) with ``mask_truncated_completions``: the row is out of
        the loss, so an admitted rollout is excluded as ``truncated`` (no counterfactual
        trial; its factual trial runs: the reward enters the group's advantages).

        Returns ``(record, plan)``; ``plan`` is None when no trial runs: the episode ended on
        a failure (:func:`~ecredit_trl.agent.failures.apply_episode_failure`: infra excluded by
        reason; the policy's own scored with the failure value, C = 0) or building its records
        raised (``record_error``, the traceback kept). Never raises for one rollout's records.
        """
        cfg = self.ecfg
        messages = completion if isinstance(completion, list) else []
        n_turns = max(1, sum(1 for m in messages if m.get("role") == "assistant"))
        calls = list(env.calls)
        rec = RolloutRecord(task_id=env.task.instance_id, rollout_index=rollout_index,
                            format_error=env.valid_calls == 0, num_turns=n_turns, snapshots=[],
                            setup_error=env.setup_error, truncated=truncated,
                            tool_calls=[{"turn": c.turn, "name": c.name, "ok": c.ok,
                                         "status": c.status, "seconds": round(c.seconds, 4),
                                         "error": c.error, "arguments": c.arguments}
                                        for c in calls])
        try:
            counts = count_calls(messages, calls)
            rec.format_errors, rec.submit_turn = counts.format_errors, counts.submit_turn
            rec.calls_not_run, rec.calls_after_submit = (counts.calls_not_run,
                                                         counts.calls_after_submit)
            if env.failure is not None:  # infra: excluded; the policy's: scored (agent.failures)
                return apply_episode_failure(rec, env, self.tasks[rec.task_id], cfg, truncated), None
            turns = [min(c.turn, n_turns) for c in calls]
            snaps = turn_snapshots(env.base_tree, turns, [c.tree for c in calls], n_turns)
            rec.snapshots = snaps
            rec.writes = turn_writes(env.snapshot_repo, snaps)
            plan = plan_query(env.snapshot_repo, snaps, task_id=rec.task_id,
                              rollout_index=rollout_index, run_seed=cfg.selection_seed,
                              test_patterns=cfg.test_path_patterns,
                              format_error=rec.format_error,
                              generated=generated_by_turn(turns, [c.generated for c in calls],
                                                          n_turns))
        except Exception:  # noqa: BLE001 - one rollout's records never stop the run
            rec.exclusion, rec.record_error = "record_error", traceback.format_exc()
            return rec, None
        # the choice is on record before any trial runs
        rec.selected_turn = plan.selection.selected_turn
        rec.selected_paths = plan.selection.selected_paths
        rec.eligible_turns = plan.selection.eligible_turns
        rec.generated_only = plan.selection.generated_only
        rec.exclusion = plan.exclusion
        if rec.exclusion is None and truncated and cfg.mask_truncated_completions:
            rec.exclusion = "truncated"  # issue 14 §4: C = 0 on it, nothing to query
        rec.ablation = plan.ablation
        return rec, plan

    def verifier_reward(self, prompts, completions, environments=None, **kwargs) -> list[float | None]:
        """TRL reward function: verify every rollout of this process (factual + counterfactual).

        Every episode has ended when TRL calls it. Sequential pipeline: the agent
        containers are released first, each rollout's records are built under a guard
        (:meth:`_rollout_record`), then its working tree is removed, then the trials run.
        Overlapped pipeline: all that was done as each episode ended; the trials are
        collected here. Returns one terminal reward per rollout:
        1.0/0.0 resolved (or the utility, with ``terminal_reward="utility"``), None when
        unavailable or the rollout was excluded before any trial.
        """
        self._batch_trials = []
        if self._round_pending is not None:  # overlapped: the trials are under way
            pending = [self._round_pending[i].result() if i in self._round_pending
                       else self._finish_episode(i, completion)
                       for i, completion in enumerate(completions)]
            self._round_pending = None
            records = [p.record for p in pending]
            self._collect(self._round_controls, pending)
            self._batch_records = records
        else:
            self._verify_sequential(environments, completions,
                                    kwargs.get("completion_ids") or self._loop_completion_ids)
            records = self._batch_records
        self._round_infra = (any(r.exit_class == "infra_error" for _, r in self._batch_trials)
                             or any(r.failure and r.failure[0] in ("sandbox_setup",
                                    "sandbox_error") and not r.failure_class for r in records))
        return [r.reward for r in records]

    def _verify_sequential(self, environments, completions, completion_ids) -> None:
        """Sequential pipeline: release every container, build every record (removing each
        tree once built; ``completion_ids`` for truncation), then run the trials."""
        for env in environments:
            release_sandbox(env)
        records: list[RolloutRecord] = []
        plans = []
        for i, (env, completion) in enumerate(zip(environments, completions, strict=True)):
            rec, plan = self._rollout_record(env, completion,
                                             self._rollout_index(i, len(environments)),
                                             truncated=self._row_truncated(completion_ids[i]))
            release(env)  # records built: the working tree and snapshot store go now
            records.append(rec)
            plans.append(plan)
        self._verify(records, plans)
        self._batch_records = records

    # -- credit injection ------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        t0 = time.monotonic()
        round_no = self._generation_round + 1
        self._require_sandbox(f"before generation round {round_no}", check=True)
        self._round_infra = False
        self._round_clock = RoundClock(start=t0)
        self._round_pending = None
        if self._tool_executor is not None:
            self._start_overlapped_round(inputs)
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
            credit_lambda=cfg.credit_lambda, credit_cap=cfg.credit_cap,
            submit_turns=[r.submit_turn for r in records])
        A = A.to(torch.float32)
        loss_mask = out["completion_mask"] * out.get("tool_mask", 1)
        end = time.monotonic()
        timings = stage_timings(self._round_clock, end)
        self._round_clock = None
        self._record_batch(records, turns, self._round_gen_turns, A, C, end - t0, timings,
                           loss_mask=loss_mask)
        self._generation_round += 1
        return out

    # -- records -------------------------------------------------------------------
    def _record_batch(self, records, turns, generated, A, C, wall_s: float,
                      timings: dict | None = None, *, loss_mask) -> None:
        """Write one round's records: a trajectory row per rollout and the ledger row
        (counts summed over ranks, stage timings the maximum over ranks), and log the
        ``ecredit/*`` metrics.

        ``turns``: (B, T) credit turn map (-1 after submit); ``generated``: (B, T') turn of
        each policy token before any masking (after-submit and truncated rows' tokens cost
        too); ``loss_mask``: (B, T) TRL's, its tokens are the ``credited_tokens``."""
        cfg = self.ecfg
        step = self.state.global_step + 1
        stats = []
        traj_rows = []
        for i, rec in enumerate(records):
            row_turns, gen_turns = turns[i], generated[i]
            L = int((gen_turns >= 0).sum())
            st = credit_stats(cfg.arm, contrast=rec.contrast if cfg.arm in COUNTERFACTUAL_ARMS
                              else None, token_turn=row_turns.cpu(),
                              selected_turn=rec.selected_turn, credit_lambda=cfg.credit_lambda,
                              credit_cap=cfg.credit_cap, advantage=float(A[i]))
            sel_mean, other_mean = credit_magnitudes(row_turns, C[i], rec.selected_turn)
            per_turn = [int((gen_turns == k).sum()) for k in range(1, rec.num_turns + 1)]
            credited = int((loss_mask[i] > 0).sum())
            nonzero = bool(((C[i] != 0) & (loss_mask[i] > 0)).any())  # credit in the loss
            stats.append({"L": L, "applied": st.applied, "cap_active": st.cap_active,
                          "sel_mean": sel_mean, "other_mean": other_mean,
                          "credited": credited, "credit_nonzero": nonzero})
            traj_rows.append(trajectory_row(rec, arm=cfg.arm, step=step, generated_tokens=L,
                                            credited_tokens=credited,
                                            tokens_per_turn=per_turn, advantage=float(A[i]),
                                            stats=st))
        local = round_counts(records, stats, self._batch_trials)
        keys = sorted(local)
        vec = torch.tensor([[float(local[k]) for k in keys]], device=self.accelerator.device)
        total = self.accelerator.gather(vec).sum(dim=0).tolist()
        tot = dict(zip(keys, total, strict=True))
        if timings is not None:  # seconds of the slowest rank
            tvec = torch.tensor([[float(timings[k]) for k in TIMING_FIELDS]],
                                device=self.accelerator.device)
            tmax = self.accelerator.gather(tvec).max(dim=0).values.tolist()
            timings = {k: round(v, 4) for k, v in zip(TIMING_FIELDS, tmax, strict=True)}
        from accelerate.utils import gather_object

        all_traj = gather_object(traj_rows) if self.accelerator.num_processes > 1 else traj_rows
        mode = "train" if self.model.training else "eval"
        for k, v in round_metrics(tot).items():
            self._metrics[mode][k].append(float(v))
        gpu_hours = (round(wall_s / 3600 * self.accelerator.num_processes, 6)
                     if torch.cuda.is_available() else 0.0)
        row = ledger_row(tot, step=step, arm=cfg.arm, wall_s=wall_s, gpu_hours=gpu_hours,
                         timings=timings)
        self.ledger_rows.append(row)
        if self.accelerator.is_main_process:
            append_jsonl(self.run_dir / "ledger.jsonl", [row])
            append_jsonl(self.run_dir / "trajectories.jsonl", all_traj)
        self.ledger_rows_total += 1
        self.trajectory_rows_total += len(all_traj)

    def release_environments(self) -> None:
        """End of the session (any exit path): release every environment's container,
        working tree and snapshot store, and remove the run's temp root. Never raises."""
        envs = list(self.environments or [])
        for pool in (getattr(self, "_environment_pool", None) or {}).values():
            envs += list(pool)
        for env in envs:
            try:
                release(env)
            except Exception:  # noqa: BLE001 - cleanup goes on; gc removes what is left
                pass
        self.agent_ctx.close()
        if self._tool_executor is not None:
            self._tool_executor.shutdown(wait=True, cancel_futures=True)

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


__all__ = ["ECreditGRPOTrainer", "RolloutRecord"]
