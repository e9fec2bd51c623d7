"""One generation round's state, from generation to the loss (design page, "Data flow of one
training step").

A :class:`Round` is made when :meth:`~ecredit_trl.trainer.grpo.ECreditGRPOTrainer._generate_and_score_completions`
starts and dropped when it returns. TRL's hooks that run inside it (generation, the tool
loop, the reward function) reach it through ``trainer.current_round``, because TRL calls
them with its own arguments; everything below those hooks (:mod:`.dispatch`, :mod:`.trials`,
the credit injection and the round's records) takes it as an argument. The contrast D of a
rollout is written into its record by the counterfactual trial
(:meth:`~ecredit_trl.trainer.trials.TrialPipelineMixin._take_counterfactual`), and the
records reach :func:`~ecredit_trl.credit.injection.inject_credit` as ``Round.records``.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ecredit_trl.agent.toolpool import ToolPrefetcher
from ecredit_trl.runs.rollout_record import RolloutRecord
from ecredit_trl.runs.timings import RoundClock


@dataclass
class Round:
    """A generation round of one rank.

    Attributes:
        index: the run's generation round before this one completes (0-based; seeds the
            rows' rollout indices and names the round's control trials).
        clock: stage intervals of the round (:class:`~ecredit_trl.runs.timings.RoundClock`).
        completions: TRL's per-row completions (chat messages) while its tool loop runs
            (overlapped pipeline), else None.
        completion_ids: TRL's per-row completion ids (final once a row's episode ended).
        gen_turns: (B, T) int tensor, the turn of every generated token before any masking.
        prefetcher: the tool-call prefetcher while TRL's tool loop runs (overlapped), else None.
        controls: overlapped: ``(task id, future)`` of the round's queued control trials.
        pending: overlapped: row → future of its :class:`~ecredit_trl.trainer.trials.PendingRollout`
            (None: sequential pipeline, or once collected).
        records: the round's rollout records in row order, filled by the trials (utility,
            reward, contrast D); what the credit injection reads.
        trials: ``(kind, TrialResult)`` of the round in order (controls, factual,
            counterfactual).
        infra: whether a trial of the round failed for infrastructure reasons.
        agreement: the round's sampling–training agreement figures over every rank
            (:func:`~ecredit_trl.trainer.agreement.combine`; None: no generated token
            counted or no sampler log-probabilities).
    """

    index: int
    clock: RoundClock
    completions: list | None = None
    completion_ids: list | None = None
    gen_turns: torch.Tensor | None = None
    prefetcher: ToolPrefetcher | None = None
    controls: list[tuple[str, Future]] = field(default_factory=list)
    pending: dict[int, Future] | None = None
    records: list[RolloutRecord] = field(default_factory=list)
    trials: list[tuple[str, object]] = field(default_factory=list)
    infra: bool = False
    agreement: dict[str, float] | None = None

    @property
    def number(self) -> int:
        """1-based number of the round in the run (as the progress lines name it)."""
        return self.index + 1


__all__ = ["Round"]
