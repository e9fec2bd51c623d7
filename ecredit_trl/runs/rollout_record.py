"""The rollout record: everything the trainer knows about one rollout after verification.

Built when the rollout's episode ends (:func:`ecredit_trl.agent.episode_record.build_rollout_record`:
counts, snapshots, the verifier-blind selection and the ablation, all before any trial),
filled by the verifier trials (:mod:`ecredit_trl.trainer.trials`: utilities, outcomes, the
contrast) and written as one ``trajectories.jsonl`` row
(:func:`ecredit_trl.runs.ledger.trajectory_row`). A plain dataclass: it imports nothing of
the method, so the run records, the credit pipeline and the agent side all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RolloutRecord:
    """Everything the trainer knows about one rollout after verification.

    Identity and episode: ``task_id``, ``rollout_index`` (unique in the run: generation round,
    rank, row), ``num_turns`` (assistant turns, ≥ 1), ``snapshots`` (trees S_0..S_K),
    ``tool_calls`` / ``writes`` (per call / per turn), the call counts, ``submit_turn``.
    Query (fixed before any trial): ``selected_turn``, ``selected_paths``, ``eligible_turns``,
    ``generated_only``, ``ablation``, ``exclusion`` (a reason of the design page, "Exclusion
    reasons", or None). Verification: ``factual`` / ``counterfactual`` (trial results as
    JSON), ``utility`` / ``utility_ablated``, ``contrast`` D, ``reward``, ``resolved``, the
    outcomes, and ``failure_class`` / ``failure_evidence`` when a failure is charged to the
    policy (design page, "Who caused a failure decides the reward").
    """

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
    failure_evidence: dict | None = None  # control duration, limit, retry, ... of that failure
    calls_not_run: int = 0
    calls_after_submit: int = 0
    submit_turn: int | None = None
    failure: list[str] | None = None  # [reason, detail]: the episode ended on an infra failure
    record_error: str | None = None  # traceback: building this rollout's records raised
    truncated: bool = False  # TRL's rule: the completion does not end with EOS / pad
    exec_retries: int = 0  # garbled read-only execs re-run once (RolloutWorkspace.run)


__all__ = ["RolloutRecord"]
