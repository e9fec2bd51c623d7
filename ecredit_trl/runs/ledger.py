"""Rows of ``trajectories.jsonl`` and ``ledger.jsonl`` (design page, "Run records"), as pure
functions.

One generation round gives one trajectory row per rollout and one ledger row for the
round (counts summed over every rank). The trainer computes the credit and gathers
the counts across ranks; the functions here only assemble rows from what it hands them.
"""

from __future__ import annotations

from ecredit_trl.runs.outcomes import (
    AGENT_FAILURE_CLASSES,
    FAILURE_CLASSES,
    TRIAL_OUTCOMES,
    UNATTRIBUTED_REASONS,
)

EXCLUSION_ORDER = ("format_error", "no_eligible_block", "truncated", "no_original_utility")
"""Exclusion reasons, applied in this order (design page, "Exclusion reasons"; ``truncated``:
with ``mask_truncated_completions`` a truncated row is out of the loss, C = 0)."""
GUARD_EXCLUSIONS = ("sandbox_setup", "sandbox_error", "exec_garbled", "snapshot_error",
                    "disk_budget", "record_error")
"""Exclusions before any trial (design page, "Exclusion reasons"): the agent container could
not start, an exec or API call failed, an exec's output came back garbled and could not be
re-run, a snapshot failed, the disk budget ran out, building the rollout's records raised."""
EXCLUSIONS = GUARD_EXCLUSIONS + EXCLUSION_ORDER
"""Every exclusion reason; the ledger lists those of :data:`EXCLUSION_ORDER` (the method's:
``format_error``, ``no_eligible_block``, ``truncated``, ``no_original_utility``) always,
zeros included, and the guard ones when they occurred."""
POLICY_FAILURE_CLASSES = (*FAILURE_CLASSES, *AGENT_FAILURE_CLASSES)
"""``failure_class`` values of a rollout whose failure is charged to the policy (design page,
"Who caused a failure decides the reward"): its factual trial broke its limits or did not
apply while the control was healthy (``artifact_*``, :mod:`eval.integrity.attribution`), or
its agent exhausted its own container's disk budget, pids or memory (``agent_*``). Any other
value is counted as ``other``."""


def credit_magnitudes(token_turn, C_row, selected_turn: int | None) -> tuple[float, float]:
    """Mean |C| on the generated tokens of the selected turn and on every other generated
    token of one rollout (0.0 for an empty set).

    Args:
        token_turn: (T,) tensor, the turn of each token (≥ 0 generated, negative masked).
        C_row: (T,) tensor, the auxiliary per-token credit of the rollout.
        selected_turn: the selected block's turn, or None/0 (no token is selected).
    """
    sel_mask = (token_turn == selected_turn) if selected_turn else token_turn < -1
    gen_mask = token_turn >= 0
    c_abs = C_row.abs()
    sel_mean = float(c_abs[sel_mask].mean()) if sel_mask.any() else 0.0
    other = gen_mask & ~sel_mask
    other_mean = float(c_abs[other].mean()) if other.any() else 0.0
    return sel_mean, other_mean


def trajectory_row(rec, *, arm: str, step: int, generated_tokens: int,
                   tokens_per_turn: list[int], advantage: float, stats,
                   credited_tokens: int | None = None, scaffold: str = "ecredit") -> dict:
    """One ``trajectories.jsonl`` row: the rollout record ``rec``, its turns (generated
    tokens and writes per turn), its terminal advantage and its credit statistics
    (``stats``: :class:`~ecredit_trl.credit.coefficients.CreditStats`-like, with
    ``s``, ``cap_active``, ``m``, ``L``). Turns after the rollout's accepted ``submit``
    carry ``"after_submit": true`` (their tokens get C = 0 and are not in L).

    ``generated_tokens``: every token the policy generated (tool results excluded; tokens
    after submit and of a truncated row included); ``credited_tokens``: the row's tokens in
    TRL's loss (0 for a row masked as truncated); ``truncated``: TRL's rule (no EOS/pad at
    the end); ``scaffold``: the tool surface the rollout ran with (design page, "Generation engines and scaffolds")."""
    per_turn = tokens_per_turn
    sub = getattr(rec, "submit_turn", None)
    turns_json = [{"generated_tokens": per_turn[k] if k < len(per_turn) else 0,
                   "writes": rec.writes[k] if k < len(rec.writes) else {},
                   **({"after_submit": True} if sub is not None and k + 1 > sub else {})}
                  for k in range(rec.num_turns)]
    return {
        "task_id": rec.task_id, "rollout_index": rec.rollout_index, "scaffold": scaffold,
        "format_error": rec.format_error, "turns": turns_json,
        "arm": arm, "step": step, "generated_tokens": generated_tokens,
        "credited_tokens": credited_tokens, "truncated": getattr(rec, "truncated", False),
        "reward": rec.reward, "resolved": rec.resolved, "utility": rec.utility,
        "utility_ablated": rec.utility_ablated, "contrast": rec.contrast,
        "advantage": advantage, "selected_turn": rec.selected_turn,
        "selected_paths": rec.selected_paths, "eligible_turns": rec.eligible_turns,
        "generated_only": getattr(rec, "generated_only", []),
        "exclusion": rec.exclusion, "shrinkage": stats.s, "cap_active": stats.cap_active,
        "m": stats.m, "L": stats.L, "format_errors": rec.format_errors,
        "tool_calls": rec.tool_calls, "factual": rec.factual,
        "counterfactual": rec.counterfactual, "ablation": rec.ablation,
        "setup_error": rec.setup_error, "factual_outcome": rec.factual_outcome,
        "counterfactual_outcome": rec.counterfactual_outcome,
        "failure_class": getattr(rec, "failure_class", None),
        "failure_evidence": getattr(rec, "failure_evidence", None),
        "calls_not_run": rec.calls_not_run, "calls_after_submit": rec.calls_after_submit,
        "exec_retries": getattr(rec, "exec_retries", 0),
        "submit_turn": rec.submit_turn, "failure": rec.failure,
        "record_error": rec.record_error}


def round_counts(records, stats: list[dict], trials) -> dict[str, float]:
    """This rank's counts of one generation round, to be summed over ranks.

    Args:
        records: the rollout records of the round.
        stats: one dict per rollout with ``L`` (tokens the policy generated, before any
            masking), ``applied``, ``cap_active``, ``sel_mean``, ``other_mean`` and
            optionally ``credited`` (tokens in TRL's loss) and ``credit_nonzero`` (a
            nonzero C on a loss token).
        trials: (kind, TrialResult) pairs, kind in factual / counterfactual / control /
            counterfactual_discarded (overlapped pipeline: a counterfactual trial that ran
            before its rollout's factual utility turned out unavailable; not used).

    Returns: counts and seconds by name, plus ``outcome_<o>`` for every trial outcome,
    ``failed_<c>`` for every policy failure class (rollouts by ``failure_class``, factual
    trial or agent; ``failed_other`` for any other value), ``unattributed_<reason>`` (factual
    trials whose attributable failure stayed unavailable, by :data:`UNATTRIBUTED_REASONS`),
    ``failure_retries`` (attribution retries, all trials: apart from infra ``retries``) and
    ``failure_not_reproduced`` (trials whose first failure the retry did not repeat).
    ``protected_paths_touched`` counts the rollouts whose factual trial found the artifact
    changing a path of the verifier's protected set (test infrastructure put
    back to base before the tests ran), so a policy drifting toward test tampering shows.
    """
    local = {
        "rollouts": len(records),
        "generated_tokens": sum(s["L"] for s in stats),
        "credited_tokens": sum(s.get("credited", 0) for s in stats),
        "credit_rollouts": sum(1 for s in stats if s.get("credit_nonzero")),
        "trials_factual": sum(1 for k, _ in trials if k == "factual"),
        "trials_counterfactual": sum(1 for k, _ in trials if k == "counterfactual"),
        "trials_control": sum(1 for k, _ in trials if k == "control"),
        "counterfactual_discarded": sum(1 for k, _ in trials if k == "counterfactual_discarded"),
        "counterfactual_from_control": sum(
            1 for r in records
            if (getattr(r, "counterfactual", None) or {}).get("source") == "control"),
        "retries": sum(r.retries for _, r in trials),
        "failure_retries": sum(len(getattr(r, "failed_attempts", None) or []) for _, r in trials),
        "failure_not_reproduced": sum(1 for _, r in trials if getattr(r, "failed_attempts", None)
                                      and r.exit_class == "ok"),
        "infra_errors": sum(1 for _, r in trials if r.exit_class == "infra_error"),
        # ray backend: images a node had to pull for one of the round's trials
        "image_pulls": sum(1 for _, r in trials if getattr(r, "image_pull", "") == "pulled"),
        "protected_paths_touched": sum(1 for k, r in trials if k == "factual"
                                       and getattr(r, "protected_touched", None)),
        "queue_wait_s": sum(r.queue_wait_s for _, r in trials),
        "setup_s": sum(r.setup_s for _, r in trials),
        "verify_s": sum(r.apply_s + r.test_s for _, r in trials),
        "cleanup_s": sum(r.cleanup_s for _, r in trials),
        "resolved": sum(1 for r in records if r.resolved),
        "reward_unavailable": sum(1 for r in records if r.reward is None),
        "usable_contrasts": sum(1 for r in records if r.contrast is not None),
        "nonzero_contrasts": sum(1 for r in records if r.contrast not in (None, 0.0)),
        "cap_active": sum(1 for s in stats if s["cap_active"]),
        "credit_rule_applied": sum(1 for s in stats if s["applied"]),
        "format_error_rollouts": sum(1 for r in records if r.format_error),
        "format_errors": sum(r.format_errors for r in records),
        "calls_not_run": sum(r.calls_not_run for r in records),
        "calls_after_submit": sum(r.calls_after_submit for r in records),
        "exec_retries": sum(getattr(r, "exec_retries", 0) for r in records),
        "sel_abs_c": sum(s["sel_mean"] for s in stats),
        "other_abs_c": sum(s["other_mean"] for s in stats),
    }
    for x in EXCLUSIONS:  # rollouts by exclusion reason (fixed keys: summed over ranks)
        local[f"excluded_{x}"] = sum(1 for r in records if r.exclusion == x)
    classes = [getattr(r, "failure_class", None) for r in records]
    for c in POLICY_FAILURE_CLASSES:
        local[f"failed_{c}"] = classes.count(c)
    local["failed_other"] = sum(1 for c in classes if c and c not in POLICY_FAILURE_CLASSES)
    why = [(getattr(r, "failure_evidence", None) or {}).get("unattributed") for r in records]
    for u in UNATTRIBUTED_REASONS:
        local[f"unattributed_{u}"] = why.count(u)
    for o in TRIAL_OUTCOMES:  # factual + counterfactual results by how they were used
        local[f"outcome_{o}"] = sum(1 for r in records for x in (r.factual_outcome,
                                                                 r.counterfactual_outcome)
                                    if x == o)
    return local


def round_metrics(tot: dict[str, float]) -> dict[str, float]:
    """The ``ecredit/*`` training metrics of one round from its summed counts (rates are
    per rollout)."""
    n = max(1.0, tot["rollouts"])
    return {
        "ecredit/resolved_rate": tot["resolved"] / n,
        "ecredit/reward_unavailable": tot["reward_unavailable"],
        # masked share: rows whose reward is None (TRL gives them advantage 0): a policy
        # drifting toward breaking its sandbox would show here
        "ecredit/masked_share": tot["reward_unavailable"] / n,
        "ecredit/failure_attributed_share": sum(
            tot.get(f"failed_{c}", 0) for c in (*POLICY_FAILURE_CLASSES, "other")) / n,
        "ecredit/failure_retries": tot.get("failure_retries", 0),
        "ecredit/usable_contrasts": tot["usable_contrasts"],
        "ecredit/nonzero_contrasts": tot["nonzero_contrasts"],
        "ecredit/cap_active_rate": tot["cap_active"] / n,
        "ecredit/mean_abs_c_selected": tot["sel_abs_c"] / n,
        "ecredit/mean_abs_c_other": tot["other_abs_c"] / n,
        "ecredit/format_error_rate": tot["format_error_rollouts"] / n,
        "ecredit/protected_paths_touched": tot["protected_paths_touched"],
        "ecredit/trials_per_rollout": (tot["trials_factual"] + tot["trials_counterfactual"]) / n,
        "ecredit/queue_wait_s": tot["queue_wait_s"],
        "ecredit/service_s": tot["setup_s"] + tot["verify_s"] + tot["cleanup_s"],
    }


#: the ledger field of each sampling–training agreement figure (TRL's metric name → field)
AGREEMENT_FIELDS = {"sampling/sampling_logp_difference/mean": "sampling_logp_diff_mean",
                    "sampling/sampling_logp_difference/max": "sampling_logp_diff_max",
                    "sampling/importance_sampling_ratio/min": "importance_ratio_min",
                    "sampling/importance_sampling_ratio/mean": "importance_ratio_mean",
                    "sampling/importance_sampling_ratio/max": "importance_ratio_max"}


def agreement_fields(agreement: dict[str, float] | None) -> dict[str, float | None]:
    """The ledger's agreement fields (4 significant digits) from TRL-named figures; every
    field None when the round has none."""
    return {f: (None if agreement is None else float(f"{agreement[k]:.4g}"))
            for k, f in AGREEMENT_FIELDS.items()}


def ledger_row(tot: dict[str, float], *, step: int, arm: str, wall_s: float,
               gpu_hours: float, timings: dict[str, float] | None = None,
               agreement: dict[str, float] | None = None) -> dict:
    """One ``ledger.jsonl`` row: the round's summed counts as integers, seconds rounded to
    0.1 ms, wall seconds (``wall_s``: the generation round, i.e. environments, generation,
    tool calls, trials and scoring; the optimizer step follows) and GPU hours, the
    non-zero trial outcomes, and (when given) the round's stage timings
    (:func:`ecredit_trl.runs.timings.stage_timings`: ``generation_busy_s``,
    ``tool_busy_s``, ``verifier_busy_s``, ``generation_wait_s``, ``verifier_idle_s``,
    ``rollout_setup_s``). ``trials_counterfactual`` counts the used counterfactual trials
    (at most one per admitted rollout); ``counterfactual_discarded`` the ones that ran and
    were not used (their seconds are in the sums); ``counterfactual_from_control`` the
    rollouts whose empty ablation took U(P\\b) from the task's empty-patch control, no trial
    of their own (:mod:`ecredit_trl.trainer.trials`; their outcome is counted in
    ``trial_outcomes`` as the control's).

    Tokens and credit: ``generated_tokens`` every token the policy generated
    (tool results excluded; tokens after submit and of truncated rows included: they cost),
    ``credited_tokens`` the tokens in TRL's loss (``completion_mask * tool_mask``),
    ``credit_applied`` whether any nonzero C entered the advantages of a loss token this
    round, ``credit_rollouts`` on how many rollouts; ``rollouts_excluded`` always names the
    method's reasons (:data:`EXCLUSIONS`).

    Attribution: ``masked_share`` = ``reward_unavailable / rollouts`` (rows TRL
    masks); ``failures_attributed`` the rollouts whose failure was charged to the policy, by
    class (non-zero classes only); ``failures_unattributed`` the factual trials whose
    attributable failure stayed unavailable, by reason; ``failure_retries`` the attribution
    retries (infra ``retries`` apart) and ``failure_not_reproduced``; ``exec_retries`` the
    agent execs whose garbled output was re-run once (read-only calls).

    Sampling–training agreement (:data:`AGREEMENT_FIELDS`, from ``agreement``): mean and max
    |log p_sampler − log p_trainer| over the round's generated tokens, and the importance
    ratio's min / mean / max; None when the round has no figure."""
    return {"step": step, "arm": arm,
            "generated_tokens": int(tot["generated_tokens"]),
            "credited_tokens": int(tot.get("credited_tokens", 0)),
            "credit_applied": bool(tot.get("credit_rollouts", 0) > 0),
            "credit_rollouts": int(tot.get("credit_rollouts", 0)),
            "trials_factual": int(tot["trials_factual"]),
            "trials_counterfactual": int(tot["trials_counterfactual"]),
            "trials_control": int(tot["trials_control"]),
            "retries": int(tot["retries"]), "infra_errors": int(tot["infra_errors"]),
            "failure_retries": int(tot.get("failure_retries", 0)),
            "failure_not_reproduced": int(tot.get("failure_not_reproduced", 0)),
            "queue_wait_s": round(tot["queue_wait_s"], 4), "setup_s": round(tot["setup_s"], 4),
            "verify_s": round(tot["verify_s"], 4), "cleanup_s": round(tot["cleanup_s"], 4),
            "wall_s": round(wall_s, 4),
            "gpu_hours": gpu_hours,
            "rollouts": int(tot["rollouts"]), "resolved": int(tot["resolved"]),
            "reward_unavailable": int(tot["reward_unavailable"]),
            "masked_share": round(tot["reward_unavailable"] / max(1.0, tot["rollouts"]), 4),
            "failures_attributed": {c: int(tot[f"failed_{c}"])
                                    for c in (*POLICY_FAILURE_CLASSES, "other")
                                    if tot.get(f"failed_{c}")},
            "failures_unattributed": {u: int(tot[f"unattributed_{u}"])
                                      for u in UNATTRIBUTED_REASONS
                                      if tot.get(f"unattributed_{u}")},
            "usable_contrasts": int(tot["usable_contrasts"]),
            "nonzero_contrasts": int(tot["nonzero_contrasts"]),
            "cap_active": int(tot["cap_active"]),
            "format_error_rollouts": int(tot["format_error_rollouts"]),
            "protected_paths_touched": int(tot["protected_paths_touched"]),
            "calls_not_run": int(tot["calls_not_run"]),
            "calls_after_submit": int(tot["calls_after_submit"]),
            "exec_retries": int(tot.get("exec_retries", 0)),
            "rollouts_excluded": {x: int(tot[f"excluded_{x}"]) for x in EXCLUSIONS
                                  if tot[f"excluded_{x}"] or x in EXCLUSION_ORDER},
            "trial_outcomes": {o: int(tot[f"outcome_{o}"]) for o in TRIAL_OUTCOMES
                               if tot[f"outcome_{o}"]},
            "counterfactual_discarded": int(tot.get("counterfactual_discarded", 0)),
            "counterfactual_from_control": int(tot.get("counterfactual_from_control", 0)),
            "image_pulls": int(tot.get("image_pulls", 0)),
            **agreement_fields(agreement),
            **(timings or {})}
