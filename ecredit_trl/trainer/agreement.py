"""Sampling–training agreement: the log-probability the sampler gave each generated token
against the one the trainer computes for it before the update (design page, "Sampling and
training agree").

Any difference makes training silently off-policy: a context the sampler saw that the
trainer does not (a re-tokenized tool turn, another chat template), dropout active in the
training forward, a precision gap between engines. The figures carry TRL's names
(``sampling/sampling_logp_difference/{mean,max}``, ``sampling/importance_sampling_ratio/
{min,mean,max}``), over generated tokens only: ``completion_mask * tool_mask``, so tool
results and padding never count.

This module holds the pure statistics and the trainer-side forward; the sampler-side
log-probabilities of the transformers path come from
:mod:`ecredit_trl.trainer.sampled_logprobs` (vLLM returns its own).
"""

from __future__ import annotations

import torch
from trl.models.utils import disable_gradient_checkpointing

#: the metric names, TRL's (``GRPOTrainer`` logs them on its vLLM path)
DIFF_MEAN = "sampling/sampling_logp_difference/mean"
DIFF_MAX = "sampling/sampling_logp_difference/max"
RATIO_MIN = "sampling/importance_sampling_ratio/min"
RATIO_MEAN = "sampling/importance_sampling_ratio/mean"
RATIO_MAX = "sampling/importance_sampling_ratio/max"
METRICS = (DIFF_MEAN, DIFF_MAX, RATIO_MIN, RATIO_MEAN, RATIO_MAX)

#: a healthy fp32 run on CPU stays below this mean |Δ log p| (nats per token). fp32 forward
#: passes of the same weights on the same ids differ by float rounding only (~1e-6 here);
#: the faults the metric exists for (a different context, dropout in the loss forward) move
#: it by 1e-2 or more. bf16 engines sit higher (verl calls a mean above 0.01 a precision
#: problem), so this bound is for fp32 only.
HEALTHY_FP32_MEAN = 1e-3


def disable_dropout(model: torch.nn.Module) -> list[str]:
    """Dropout off in the training forward, every kind: ``torch.nn.Dropout`` modules get
    ``p = 0`` (what TRL's ``disable_dropout`` does) and so do the float dropout rates
    attention layers read at call time (Llama's ``attention_dropout``, applied only in
    training mode, which TRL's leaves on). Returns the ``module.attribute`` names changed."""
    changed = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout) and module.p:
            module.p = 0.0
            changed.append(f"{name}.p")
        for attr, value in list(vars(module).items()):
            if "dropout" in attr and isinstance(value, float) and value > 0:
                setattr(module, attr, 0.0)
                changed.append(f"{name}.{attr}")
    return changed


def token_sums(sampling: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """This rank's sums for the agreement figures.

    Args:
        sampling: (B, T) float, log p of each generated token under the distribution the
            sampler drew it from (after temperature / top-p / top-k / min-p). NaN where the
            sampler gave none (vLLM): such tokens are left out.
        trainer: (B, T) float, log p the trainer computes for the same token.
        mask: (B, T) 0/1, the tokens that count (``completion_mask * tool_mask``).

    Returns: (6,) float64 ``[tokens, sum |Δ|, max |Δ|, sum r, min r, max r]`` with
    ``Δ = trainer − sampling`` and ``r = exp(Δ)`` (the importance ratio π_train / π_sampler,
    TRL's direction); with no token: ``[0, 0, -inf, 0, inf, -inf]`` (neutral for
    :func:`combine`).
    """
    delta = (trainer.double() - sampling.double())
    keep = mask.bool() & torch.isfinite(delta)
    d = delta[keep]
    if d.numel() == 0:
        return torch.tensor([0.0, 0.0, -torch.inf, 0.0, torch.inf, -torch.inf],
                            dtype=torch.float64)
    r = torch.exp(d)
    a = d.abs()
    return torch.stack([torch.tensor(float(d.numel()), dtype=torch.float64), a.sum(), a.max(),
                        r.sum(), r.min(), r.max()]).cpu()


def combine(rows: torch.Tensor) -> dict[str, float] | None:
    """The figures of a round from every rank's :func:`token_sums` ((R, 6), one row a rank):
    token-weighted means, extremes over all tokens. None when no rank had a token."""
    tokens = float(rows[:, 0].sum())
    if tokens == 0:
        return None
    return {DIFF_MEAN: float(rows[:, 1].sum()) / tokens, DIFF_MAX: float(rows[:, 2].max()),
            RATIO_MIN: float(rows[:, 4].min()), RATIO_MEAN: float(rows[:, 3].sum()) / tokens,
            RATIO_MAX: float(rows[:, 5].max())}


def trainer_logps(trainer, out: dict) -> torch.Tensor:
    """(B, T) log p the trainer's loss forward gives the round's completion tokens, before
    the update: TRL's ``old_per_token_logps`` when it computed them (vLLM importance
    sampling, misaligned generation), else one forward without gradient, in the model's
    current mode (training: dropout, if any is left on, acts as in the loss).

    ``trainer``: the ``GRPOTrainer``; ``out``: what its ``_generate_and_score_completions``
    returned (``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``).
    """
    old = out.get("old_per_token_logps")
    if old is not None:
        return old.detach()
    input_ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    keep = out["completion_ids"].size(1)
    with torch.no_grad(), disable_gradient_checkpointing(
            trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, keep,
            batch_size=trainer.args.per_device_train_batch_size)
    return logps


__all__ = ["DIFF_MAX", "DIFF_MEAN", "disable_dropout", "HEALTHY_FP32_MEAN", "METRICS",
           "RATIO_MAX", "RATIO_MEAN", "RATIO_MIN", "combine", "token_sums", "trainer_logps"]
