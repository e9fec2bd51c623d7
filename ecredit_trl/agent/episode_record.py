"""From an ended agent episode to the trainer's rollout record and credit query.

One pure-ish step per rollout, run when its episode ends and before any verifier trial
(design page, "Selection and restore": the choice is on record before any trial runs):
the tool-call counts (:func:`~ecredit_trl.agent.calls.count_calls`), an episode that ended
on a failure (:func:`~ecredit_trl.agent.failures.apply_episode_failure`), the per-turn
snapshots and writes, and the query plan
(:func:`~ecredit_trl.credit.planning.plan_query`: blocks, eligibility, selection, ablation).
It reads the environment's recorded calls and its snapshot store; the caller removes the
working tree afterwards.
"""

from __future__ import annotations

import traceback

from ecredit_trl.agent.calls import count_calls
from ecredit_trl.agent.failures import apply_episode_failure
from ecredit_trl.credit.planning import (
    QueryPlan,
    generated_by_turn,
    plan_query,
    turn_snapshots,
)
from ecredit_trl.credit.trajectory import turn_writes
from ecredit_trl.runs.rollout_record import RolloutRecord


def _call_rows(calls) -> list[dict]:
    """The record's ``tool_calls``: one JSON row per call that reached the environment."""
    return [{"turn": c.turn, "name": c.name, "ok": c.ok, "status": c.status,
             "seconds": round(c.seconds, 4), "error": c.error, "arguments": c.arguments}
            for c in calls]


def build_rollout_record(env, completion, *, tasks: dict, cfg, rollout_index: int,
                         truncated: bool) -> tuple[RolloutRecord, QueryPlan | None]:
    """One rollout's record and query plan, guarded: never raises for one rollout.

    Args:
        env: the rollout's ended :class:`~ecredit_trl.agent.env.SWEAgentEnv` (its ``calls``,
            ``base_tree``, ``snapshot_repo``, ``failure``, ``valid_calls``, ``setup_error``).
        completion: TRL's completion of the row (chat messages; anything else counts as none).
        tasks: instance id → task (the episode's task is looked up by ``env.task``).
        cfg: :class:`~ecredit_trl.config.ECreditConfig` (selection seed, test patterns,
            ``mask_truncated_completions``, ``terminal_reward``).
        rollout_index: the rollout's index in the run (seeds the selection).
        truncated: TRL's rule on the row's final ids. With ``mask_truncated_completions``
            the row is out of the loss, so an admitted rollout is excluded as ``truncated``
            (no counterfactual trial; its factual trial runs: the reward enters the group's
            advantages).

    Returns: ``(record, plan)``; ``plan`` is None when no trial runs: the episode ended on a
    failure (infra excluded by reason; the policy's own scored with the failure value, C = 0)
    or building the records raised (``exclusion="record_error"``, the traceback kept).
    """
    messages = completion if isinstance(completion, list) else []
    n_turns = max(1, sum(1 for m in messages if m.get("role") == "assistant"))
    calls = list(env.calls)
    rec = RolloutRecord(task_id=env.task.instance_id, rollout_index=rollout_index,
                        format_error=env.valid_calls == 0, num_turns=n_turns, snapshots=[],
                        setup_error=env.setup_error, truncated=truncated,
                        tool_calls=_call_rows(calls),
                        exec_retries=getattr(env, "exec_retries", 0))
    try:
        counts = count_calls(messages, calls)
        rec.format_errors, rec.submit_turn = counts.format_errors, counts.submit_turn
        rec.calls_not_run, rec.calls_after_submit = counts.calls_not_run, counts.calls_after_submit
        if env.failure is not None:  # infra: excluded; the policy's: scored (agent.failures)
            return apply_episode_failure(rec, env, tasks[rec.task_id], cfg, truncated), None
        turns = [min(c.turn, n_turns) for c in calls]
        snaps = turn_snapshots(env.base_tree, turns, [c.tree for c in calls], n_turns)
        rec.snapshots = snaps
        rec.writes = turn_writes(env.snapshot_repo, snaps)
        plan = plan_query(env.snapshot_repo, snaps, task_id=rec.task_id,
                          rollout_index=rollout_index, run_seed=cfg.selection_seed,
                          test_patterns=cfg.test_path_patterns, format_error=rec.format_error,
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
        rec.exclusion = "truncated"  # out of the loss: C = 0 on it, nothing to query
    rec.ablation = plan.ablation
    return rec, plan


__all__ = ["build_rollout_record"]
