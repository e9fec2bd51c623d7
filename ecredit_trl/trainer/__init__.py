"""The trainer (design page, "Data flow of one training step"): TRL's GRPOTrainer with
verifier rewards and counterfactual credit, and the code that runs one generation round.

* :mod:`.grpo` — :class:`ECreditGRPOTrainer`, its hooks into TRL and the round's credit
  injection and records.
* :mod:`.round` — :class:`~.round.Round`, one generation round's state from generation to
  the loss (episodes, pending trials, controls, records with their contrast D).
* :mod:`.dispatch` — which verifier trials of a round run when (overlapped / sequential).
* :mod:`.trials` — the trial rules of a round: controls, factual and counterfactual trials,
  verdicts into records.
* :mod:`.checkpoint_state` — what a checkpoint holds beyond TRL's state (exact resume).
* :mod:`.agreement` — sampling–training agreement: the figures, the trainer-side forward,
  dropout off in training.
* :mod:`.sampled_logprobs` — the sampler's own log-probabilities on the transformers path.
"""

from ecredit_trl.trainer.grpo import ECreditGRPOTrainer

__all__ = ["ECreditGRPOTrainer"]
