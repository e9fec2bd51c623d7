"""The sampler's own log-probabilities on the transformers ``generate`` path.

TRL's transformers path returns no log-probabilities (its vLLM path does), so nothing could
compare what was sampled with what is trained (:mod:`ecredit_trl.trainer.agreement`). The
log-probability that matters is the one of the distribution the token was actually drawn
from: after temperature, top-k, top-p and min-p. transformers applies those warpers after
every logits processor a caller passes in, so a processor passed to ``generate`` would see
the scores before them; :func:`record_sampled_logprobs` appends its recorder to the end of
the processor list transformers builds (``_get_logits_processor``), where the scores are
exactly the ones ``generate`` samples from (``softmax(scores)``).

Memory: one (B, V) float32 tensor at a time plus one (B,) tensor per generated token (not
``output_scores``' (B, V) per token); host reads: two per ``generate`` call.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import LogitsProcessor


class SampledLogprobRecorder(LogitsProcessor):
    """Last logits processor of a sampling ``generate`` call: records log p of each drawn
    token under the final (warped) distribution.

    At decode step k it sees ``input_ids`` ending with the token drawn at step k − 1 and
    gathers that token's log-probability from the distribution it kept at step k − 1; the
    token of the last step is gathered by :meth:`row_logprobs` from the scores kept last.
    Scores pass through unchanged.
    """

    def __init__(self) -> None:
        self._prev: torch.Tensor | None = None  # (B, V) log-softmax of the last step
        self._steps: list[torch.Tensor] = []  # (B,) per drawn token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self._steps.append(self._prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self._prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def row_logprobs(self, completions: list[list[int]]) -> list[list[float]]:
        """Per row, log p of each token of ``completions[i]`` (the row's generated ids as
        ``generate`` returned them, possibly cut after its first EOS, as TRL does).

        Raises: RuntimeError when nothing was recorded (the recorder was not in the call),
        or a row is longer than the steps recorded.
        """
        if self._prev is None:
            raise RuntimeError("sampled log-probabilities: the recorder saw no decode step")
        steps = torch.stack(self._steps, dim=1) if self._steps else None  # (B, n - 1)
        rows = steps.cpu().tolist() if steps is not None else [[] for _ in completions]
        last_ids = torch.tensor([ids[-1] if ids else 0 for ids in completions],
                                device=self._prev.device)
        last = self._prev.gather(1, last_ids[:, None]).squeeze(1).cpu().tolist()
        out = []
        for i, ids in enumerate(completions):
            have = rows[i][:len(ids)]
            if len(ids) == len(rows[i]) + 1:  # drawn at the last step: the last kept scores
                have.append(last[i])
            elif len(ids) > len(rows[i]) + 1:
                raise RuntimeError(f"sampled log-probabilities: row {i} has {len(ids)} "
                                   f"tokens, {len(rows[i]) + 1} steps were recorded")
            out.append(have)
        return out


def generating_model(model):
    """The ``transformers`` model whose ``generate`` builds the processor list: ``model``
    itself, or the base model under a peft wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(inner, "_get_logits_processor"):
        raise TypeError(f"{type(inner).__name__} has no transformers generation mixin; the "
                        "sampled log-probabilities cannot be recorded")
    return inner


@contextmanager
def record_sampled_logprobs(model):
    """Within the block, every ``generate`` call of ``model`` (or of its peft base model)
    ends its logits processor list with one :class:`SampledLogprobRecorder`; yields a list
    that receives the recorder of each call, in call order. The model is left as it was.

    Raises: TypeError when ``model`` is no transformers generation model.
    """
    inner = generating_model(model)
    real = inner._get_logits_processor
    recorders: list[SampledLogprobRecorder] = []

    def with_recorder(*args, **kwargs):
        processors = real(*args, **kwargs)
        recorders.append(SampledLogprobRecorder())
        processors.append(recorders[-1])
        return processors

    inner._get_logits_processor = with_recorder  # this instance only, for this block
    try:
        yield recorders
    finally:
        del inner._get_logits_processor


__all__ = ["SampledLogprobRecorder", "generating_model", "record_sampled_logprobs"]
