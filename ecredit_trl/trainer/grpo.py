"""ECreditGRPOTrainer: TRL's GRPOTrainer with verifier rewards and counterfactual credit.

This module holds the trainer class and its hooks into TRL, each of which delegates (design
page, "Data flow of one training step"). Per generation batch, one
:class:`~ecredit_trl.trainer.round.Round` carries the round's state from generation to the
loss:

1. TRL runs the multi-turn tool loop with :class:`~ecredit_trl.agent.env.SWEAgentEnv`
   (``environment_factory``); every tool call is snapshotted and tagged with the assistant
   turn that made it (:meth:`ECreditGRPOTrainer._generate_single_turn` advances the turn
   counter). ``pipeline: overlapped`` (default): the rollouts' tool calls of each iteration
   of TRL's tool loop run in parallel (:mod:`ecredit_trl.agent.toolpool`, bounded by
   ``agent_concurrency``); ``pipeline: sequential``: one rollout's tool calls after another.
2. An ended episode becomes its record and query plan
   (:func:`~ecredit_trl.agent.episode_record.build_rollout_record`, record type
   :class:`~ecredit_trl.runs.rollout_record.RolloutRecord`); its factual trial plus (arms
   B/M) at most one counterfactual trial run through the
   :class:`~sandbox.trials.pool.VerifierPool` (when: :mod:`ecredit_trl.trainer.dispatch`;
   the trial rules and verdicts: :mod:`ecredit_trl.trainer.trials`), which fill the
   round's records (utility, reward, contrast D). The reward function
   :meth:`ECreditGRPOTrainer.verifier_reward` returns the terminal rewards; an unavailable
   utility gives ``None`` (TRL turns that advantage into 0) and is counted.
3. :meth:`ECreditGRPOTrainer._generate_and_score_completions` calls TRL's, then
   (:meth:`ECreditGRPOTrainer._credit_round`) replaces the (B,) advantages by ``(A[:, None] + C) * completion_mask * tool_mask``
   (:func:`~ecredit_trl.credit.injection.inject_credit` of the round's records) and writes the round's records
   (:func:`~ecredit_trl.runs.round_records.write_round`; stage timings:
   :mod:`ecredit_trl.runs.timings`).

Exact resume (design page, "Run records"): :class:`~ecredit_trl.trainer.checkpoint_state.ExactResumeMixin`.
The sandbox service is checked before every generation round and after a round with infra
errors (:mod:`ecredit_trl.runs.sandbox_health`); when it stays unreachable, every rank
raises :class:`~ecredit_trl.runs.faults.SandboxUnavailable` before anything of the round is
recorded or applied, and :meth:`ECreditGRPOTrainer.emergency_checkpoint` saves the state of
the last completed step.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from trl import GRPOTrainer

from ecredit_trl.agent.env import AgentContext, env_factory, release, release_sandbox
from ecredit_trl.agent.episode_record import build_rollout_record
from ecredit_trl.agent.scaffolds import get_scaffold
from ecredit_trl.agent.toolpool import ToolPrefetcher, prefetch_resets, timed_tool_dicts
from ecredit_trl.agent.vllm_server import server_generation
from ecredit_trl.config import ECreditConfig
from ecredit_trl.credit.injection import CreditInjection, inject_credit, rollout_credit
from ecredit_trl.credit.planning import (
    is_truncated,
    policy_token_turns,
)
from ecredit_trl.policy.vllm_deferred import load_trl_vllm_names
from ecredit_trl.policy.vllm_sync import colocate_engine, install_weight_route
from ecredit_trl.runs.outcomes import trial_retry
from ecredit_trl.runs.round_records import write_round
from ecredit_trl.runs.sandbox_health import (
    any_rank,
    probe_sandbox,
    require_sandbox,
    round_had_infra_errors,
)
from ecredit_trl.runs.timings import RoundClock, stage_timings
from ecredit_trl.trainer.agreement import (
    combine,
    disable_dropout,
    token_sums,
    trainer_logps,
)
from ecredit_trl.trainer.checkpoint_state import ExactResumeMixin, TrainerHooks
from ecredit_trl.trainer.dispatch import RoundDispatchMixin
from ecredit_trl.trainer.round import Round
from ecredit_trl.trainer.sampled_logprobs import record_sampled_logprobs
from sandbox.trials.pool import VerifierPool


class ECreditGRPOTrainer(ExactResumeMixin, RoundDispatchMixin, GRPOTrainer):
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
        self.scaffold = get_scaffold(args.scaffold, args.scaffold_config)
        self.agent_ctx = AgentContext(tasks=tasks, runtime=runtime, scaffold=self.scaffold,
                                      bash_timeout_s=args.bash_timeout_s,
                                      max_file_bytes=args.agent_max_file_mib * 2**20,
                                      tree_budget_bytes=args.agent_tree_budget_mib * 2**20,
                                      snapshot_ignore=tuple(args.snapshot_ignore))
        self.pool = VerifierPool(runtime, max_concurrency=args.verifier_concurrency,
                                 retry=trial_retry(args.verifier_retries))
        self._control = {}  # task id -> (GradeReport, log) of the empty-patch control
        self._generation_round = 0  # completed generation rounds (checkpointed)
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
        # the round in progress, for TRL's hooks (they take TRL's arguments only); None
        # between rounds. Code below the hooks takes the round as an argument.
        self.current_round: Round | None = None
        self._tool_executor = (ThreadPoolExecutor(max_workers=args.agent_concurrency,
                                                  thread_name_prefix="agent-tools")
                               if args.pipeline == "overlapped" else None)
        if args.use_vllm:  # vLLM's names for TRL's engine and client (imported only now)
            load_trl_vllm_names()
        with colocate_engine(args, model), \
                server_generation(args, self.run_dir, lambda: self.state.global_step):
            # vLLM on CPU: colocate's dtype and eager mode; server mode's weight route by files
            super().__init__(model=model, reward_funcs=[self.verifier_reward], args=args,
                             train_dataset=train_dataset, environment_factory=env_factory(
                                 self.agent_ctx, self.scaffold.env_class),
                             **kwargs)
        if args.disable_dropout:  # TRL's leaves the float rates attention layers read
            disable_dropout(self.model)
        self.vllm_weight_route = install_weight_route(self)  # "reload" on a CPU colocate run
        self.add_callback(TrainerHooks(self))

    # -- turn bookkeeping ------------------------------------------------------
    def _generate(self, prompts):
        """TRL's, noting the turn of every token the policy generated before any masking
        (``mask_truncated_completions`` zeroes truncated rows later; they still cost)."""
        rnd = self.current_round
        self.agent_ctx.turn = 0
        out = super()._generate(prompts)
        if rnd is not None:
            rnd.completion_ids = out[1]
            rnd.gen_turns = policy_token_turns([len(x) for x in out[1]], out[2])
        return out

    def _generate_single_turn(self, *args, **kwargs):
        rnd = self.current_round
        self.agent_ctx.turn += 1
        if rnd is not None and rnd.prefetcher is not None:
            rnd.prefetcher.generation_started()
        t0 = time.monotonic()
        if self.use_vllm or self.use_transformers_continuous_batching:
            out = super()._generate_single_turn(*args, **kwargs)
        else:  # TRL's transformers path returns no log-probabilities: record the sampler's
            model = self.accelerator.unwrap_model(self.model_wrapped)
            with record_sampled_logprobs(model) as recorders:
                ids, logps = super()._generate_single_turn(*args, **kwargs)
            # a seam that sampled nothing (no generate call) keeps what it returned
            out = (ids, recorders[-1].row_logprobs(ids)) if recorders else (ids, logps)
        if rnd is not None:
            rnd.clock.add("generation", t0, time.monotonic())
        return out

    # -- tool loop -----------------------------------------------------------------
    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *args):
        """TRL's tool loop with this pipeline's tool dicts (timed in place, or prefetched
        in parallel across rollouts: :class:`~ecredit_trl.agent.toolpool.ToolPrefetcher`);
        in the overlapped pipeline every rollout leaving the loop has its trials
        submitted at once (:meth:`_episode_ended`)."""
        real = self._sync_tool_dicts
        rnd = self.current_round
        if rnd is not None:
            rnd.completion_ids = completion_ids  # TRL updates it in place per row
        record = (lambda a, b: rnd.clock.add("tools", a, b)) if rnd is not None else (
            lambda a, b: None)
        if self._tool_executor is None or any(self._async_tool_dicts):
            self._sync_tool_dicts = timed_tool_dicts(real, record)
            try:
                return super()._tool_call_loop(prompts, prompt_ids, completion_ids,
                                               completions, *args)
            finally:
                self._sync_tool_dicts = real
        rnd.completions = completions
        pf = ToolPrefetcher(completions, real, self._tool_executor,
                            on_episode_end=lambda i: self._episode_ended(rnd, i))
        rnd.prefetcher, self._sync_tool_dicts = pf, pf.dicts
        try:
            out = super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions,
                                          *args)
            pf.finish()
        finally:
            rnd.prefetcher, self._sync_tool_dicts = None, real
            for a, b in pf.times.jobs:
                record(a, b)
        return out

    def _start_overlapped_round(self, rnd: Round, inputs) -> None:
        """Overlapped pipeline, start of a round: queue the empty-patch controls of the
        batch's tasks, then reset the environments TRL will hand out (its pool, in
        order) concurrently on the agent pool (:func:`~ecredit_trl.agent.toolpool.prefetch_resets`)."""
        self._queue_controls(rnd, {x["instance_id"] for x in inputs})
        if self._multi_environment:
            return
        pool = self._environment_pool[None]
        while len(pool) < len(inputs):  # TRL grows its pool the same way
            pool.append(self.environment_factories[None]())
        prefetch_resets(pool[:len(inputs)], list(inputs), self._tool_executor)

    # -- an ended episode (the agent side of trainer.dispatch) ------------------------
    def _release_container(self, env) -> None:
        release_sandbox(env)

    def _episode_record(self, env, completion, rollout_index: int, completion_ids):
        """The episode's record and plan (:func:`build_rollout_record`; truncation by TRL's
        rule on ``completion_ids``), then its working tree and snapshot store removed."""
        rec, plan = build_rollout_record(env, completion, tasks=self.tasks, cfg=self.ecfg,
                                         rollout_index=rollout_index,
                                         truncated=self._row_truncated(completion_ids))
        release(env)  # records built: the working tree and snapshot store go now
        return rec, plan

    def _row_truncated(self, ids) -> bool:
        """TRL's truncation rule for one row's completion ids (:func:`is_truncated`)."""
        return is_truncated(ids, [*self.eos_token_ids, self._tokenizer.pad_token_id])

    def verifier_reward(self, prompts, completions, environments=None, **kwargs) -> list[float | None]:
        """TRL reward function: verify every rollout of this process (factual + counterfactual:
        :meth:`~ecredit_trl.trainer.dispatch.RoundDispatchMixin._verify_round` of the
        round in progress, which keeps the records for the credit injection).

        Returns one terminal reward per rollout: 1.0/0.0 resolved (or the utility, with
        ``terminal_reward="utility"``), None when unavailable or the rollout was excluded
        before any trial.
        """
        rnd = self.current_round
        records = self._verify_round(rnd, environments, completions,
                                      kwargs.get("completion_ids") or rnd.completion_ids)
        rnd.infra = round_had_infra_errors(rnd.trials, records)
        return [r.reward for r in records]

    # -- credit injection ------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        """TRL's, inside one :class:`~ecredit_trl.trainer.round.Round`: generation, the
        tool loop and the reward function fill it; then the round's contrasts become the
        per-token advantages (:meth:`_credit_round`)."""
        t0 = time.monotonic()
        rnd = Round(index=self._generation_round, clock=RoundClock(start=t0))
        self._require_sandbox(f"before generation round {rnd.number}", check=True)
        self.current_round = rnd
        try:
            if self._tool_executor is not None:
                self._start_overlapped_round(rnd, inputs)
            out = super()._generate_and_score_completions(inputs)
        finally:
            self.current_round = None
        # trials that failed for infra reasons: is the service itself gone? (collective)
        self._require_sandbox(f"after the verifier trials of generation round {rnd.number}",
                              check=rnd.infra)
        rnd.agreement = self._sampling_agreement(out)
        out["advantages"] = self._credit_round(rnd, out, t0)
        self._generation_round += 1
        return out

    def _sampling_agreement(self, out: dict) -> dict[str, float] | None:
        """The round's sampling–training agreement over every rank (a collective): the
        sampler's log p of each generated token (``out["sampling_per_token_logps"]``)
        against the trainer's before the update, over ``completion_mask * tool_mask``
        (:mod:`ecredit_trl.trainer.agreement`). None when the sampler gave none."""
        sampling = out.get("sampling_per_token_logps")
        if sampling is None:
            return None
        mask = out["completion_mask"]
        if out.get("tool_mask") is not None:
            mask = mask * out["tool_mask"]
        sums = token_sums(sampling, trainer_logps(self, out), mask)
        return combine(self.accelerator.gather(sums[None].to(self.accelerator.device)).cpu())

    def _credit_round(self, rnd: Round, out: dict, t0: float) -> torch.Tensor:
        """The round's per-token advantages ``(A[:, None] + C) * completion_mask * tool_mask``
        (B, T) from TRL's (B,) ``out["advantages"]`` (its negative entries times
        ``negative_advantage_weight``) and the contrasts in ``rnd.records``
        (:func:`~ecredit_trl.credit.injection.inject_credit`); writes the round's records.
        ``t0``: the round's start (``time.monotonic()``)."""
        cfg = self.ecfg
        inj = inject_credit(cfg.arm, advantages=out["advantages"],
                            completion_mask=out["completion_mask"],
                            tool_mask=out.get("tool_mask"), records=rnd.records,
                            credit_lambda=cfg.credit_lambda, credit_cap=cfg.credit_cap,
                            negative_weight=cfg.negative_advantage_weight)
        end = time.monotonic()
        self._record_round(rnd, inj, wall_s=end - t0, timings=stage_timings(rnd.clock, end))
        return inj.per_token

    # -- records -------------------------------------------------------------------
    def _record_round(self, rnd: Round, inj: CreditInjection, *, wall_s: float,
                      timings: dict | None = None) -> None:
        """Write one round's records (:func:`~ecredit_trl.runs.round_records.write_round`)
        and log the ``ecredit/*`` metrics.

        ``inj``: the round's injection (``turns`` (B, T) credit turn map, -1 after submit;
        ``A`` (B,) float32; ``C`` (B, T); ``loss_mask`` (B, T) TRL's); ``rnd.gen_turns``:
        (B, T') turn of each policy token before any masking
        (:func:`~ecredit_trl.credit.injection.rollout_credit`)."""
        cfg = self.ecfg
        credit = rollout_credit(cfg.arm, rnd.records, turns=inj.turns, generated=rnd.gen_turns,
                                A=inj.A, C=inj.C, loss_mask=inj.loss_mask,
                                credit_lambda=cfg.credit_lambda, credit_cap=cfg.credit_cap,
                                A_group=inj.A_group)
        rows = write_round(rnd.records, credit, rnd.trials, accelerator=self.accelerator,
                           run_dir=self.run_dir, arm=cfg.arm, step=self.state.global_step + 1,
                           wall_s=wall_s, timings=timings, scaffold=self.scaffold.name,
                           agreement=rnd.agreement)
        mode = "train" if self.model.training else "eval"
        metrics = dict(rows.metrics)
        if rnd.agreement and not (self.use_vllm and self.vllm_importance_sampling_correction):
            metrics.update(rnd.agreement)  # (TRL logs them itself on that path)
        for k, v in metrics.items():
            self._metrics[mode][k].append(float(v))
        self.ledger_rows.append(rows.ledger)
        self.ledger_rows_total += 1
        self.trajectory_rows_total += len(rows.trajectories)

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
        return any_rank(self.accelerator, flag)

    def _require_sandbox(self, where: str, *, check: bool) -> None:
        """Health-check the runtime (when ``check``), then agree across ranks
        (:mod:`ecredit_trl.runs.sandbox_health`).

        Raises: SandboxUnavailable on every rank when any rank's runtime stayed
        unreachable after ``sandbox_retries`` attempts with backoff.
        """
        retries, error = (probe_sandbox(self.runtime, attempts=self.ecfg.sandbox_retries,
                                        backoff_s=self.ecfg.sandbox_retry_backoff_s)
                          if check else (0, None))
        self.sandbox_retries += retries
        require_sandbox(self.accelerator, error, where=where,
                        step=self.state.global_step + 1)


__all__ = ["ECreditGRPOTrainer"]
