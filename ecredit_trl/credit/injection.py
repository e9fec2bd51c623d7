"""Credit injection: TRL's (B,) terminal advantages become per-token advantages A + C.

Two pure functions of one generation round, on this rank's rows (design page, "Credit
arms" and "Data flow of one training step"):

* :func:`inject_credit` — ``(A[:, None] + C) * completion_mask * tool_mask``, with C from
  :func:`~ecredit_trl.credit.planning.per_token_advantages` (arms O/B/M/E; the contrast D
  only for the counterfactual arms);
* :func:`rollout_credit` — per rollout, what the records need of that credit: tokens
  generated (L) and credited, tokens per turn, the rule's statistics
  (:func:`~ecredit_trl.credit.coefficients.credit_stats`) and the mean |C| on and off the
  selected turn.

The records are duck-typed (``contrast``, ``selected_turn``, ``submit_turn``,
``num_turns``: :class:`~ecredit_trl.runs.rollout_record.RolloutRecord`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ecredit_trl.credit.arms import COUNTERFACTUAL_ARMS
from ecredit_trl.credit.coefficients import CreditStats, credit_stats
from ecredit_trl.credit.planning import per_token_advantages
from ecredit_trl.runs.ledger import credit_magnitudes


@dataclass
class CreditInjection:
    """One round's injected credit (B rows, T completion tokens).

    ``per_token``: (B, T) float32, the advantages TRL's token-level loss uses;
    ``A``: (B,) float32 terminal advantages as trained on (negative ones weighted);
    ``A_group``: (B,) float32 TRL's group advantages before that weighting (what the records
    call ``advantage``); ``C``: (B, T) float32 coefficients;
    ``turns``: (B, T) int64 credit turn map (-1 on tool-result tokens and after submit);
    ``loss_mask``: (B, T) TRL's ``completion_mask * tool_mask``; ``contrasts``: the D each
    row's credit used (None: unavailable or not used by the arm).
    """

    per_token: torch.Tensor
    A: torch.Tensor
    A_group: torch.Tensor
    C: torch.Tensor
    turns: torch.Tensor
    loss_mask: torch.Tensor
    contrasts: list[float | None]


def arm_contrasts(arm: str, records: Sequence) -> list[float | None]:
    """The contrast D of each record as the arm uses it: arms B/M theirs, O/E None."""
    return [r.contrast if arm in COUNTERFACTUAL_ARMS else None for r in records]


def weight_negative(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """``advantages`` (any shape) with each negative entry multiplied by ``weight`` in
    [0, 1], the others unchanged (asymmetric REINFORCE, Le Roux et al. 2025: a failed
    rollout pushes its tokens down less than a resolved one pushes its tokens up).

    Raises: ValueError when ``weight`` is outside [0, 1].
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"negative_advantage_weight: {weight} is outside [0, 1]")
    if weight == 1.0:
        return advantages
    return torch.where(advantages < 0, advantages * weight, advantages)


def inject_credit(arm: str, *, advantages: torch.Tensor, completion_mask: torch.Tensor,
                  tool_mask: torch.Tensor | None, records: Sequence, credit_lambda: float,
                  credit_cap: float, negative_weight: float = 1.0) -> CreditInjection:
    """Per-token advantages of one round's rows.

    Args:
        arm: ``"O"``, ``"B"``, ``"M"`` or ``"E"``.
        advantages: (B,) TRL's terminal group advantages of this rank's rows.
        completion_mask, tool_mask: (B, T) TRL's masks (``tool_mask`` None: no tools).
        records: B rollout records, in row order.
        credit_lambda, credit_cap: λ ≥ 0 and c > 0 of the credit rule.
        negative_weight: w in [0, 1]; each negative terminal advantage is multiplied by it
            before the arm spreads it (1: GRPO's own; the contrast C is never weighted).

    Returns: :class:`CreditInjection`.

    Raises: RuntimeError when ``advantages`` is not (B,) for the B records (TRL's rows and
    the records would not line up).
    """
    if advantages.dim() != 1 or len(records) != advantages.shape[0]:
        raise RuntimeError(f"advantages: expected ({len(records)},) local rows, "
                           f"got {tuple(advantages.shape)}")
    contrasts = arm_contrasts(arm, records)
    trained = weight_negative(advantages, negative_weight)
    per_token, C, turns = per_token_advantages(
        arm, advantages=trained, completion_mask=completion_mask, tool_mask=tool_mask,
        contrasts=contrasts, selected_turns=[r.selected_turn for r in records],
        credit_lambda=credit_lambda, credit_cap=credit_cap,
        submit_turns=[r.submit_turn for r in records])
    loss_mask = completion_mask * (tool_mask if tool_mask is not None else 1)
    return CreditInjection(per_token=per_token, A=trained.to(torch.float32),
                           A_group=advantages.to(torch.float32), C=C, turns=turns,
                           loss_mask=loss_mask, contrasts=contrasts)


@dataclass
class RolloutCredit:
    """What one rollout's records hold of its credit.

    ``counts``: the per-rollout dict :func:`ecredit_trl.runs.ledger.round_counts` sums
    (``L``, ``applied``, ``cap_active``, ``sel_mean``, ``other_mean``, ``credited``,
    ``credit_nonzero``); ``stats``: the rule's :class:`CreditStats`; ``tokens_per_turn``:
    generated tokens of turns 1..K; ``advantage``: the rollout's GRPO group advantage
    (before ``negative_advantage_weight``: a failed rollout's stays negative).
    """

    counts: dict
    stats: CreditStats
    tokens_per_turn: list[int]
    advantage: float

    @property
    def generated_tokens(self) -> int:
        return self.counts["L"]

    @property
    def credited_tokens(self) -> int:
        return self.counts["credited"]


def rollout_credit(arm: str, records: Sequence, *, turns: torch.Tensor,
                   generated: torch.Tensor, A: torch.Tensor, C: torch.Tensor,
                   loss_mask: torch.Tensor, credit_lambda: float, credit_cap: float,
                   A_group: torch.Tensor | None = None) -> list[RolloutCredit]:
    """Per rollout, its credit as the records show it.

    Args:
        turns: (B, T) credit turn map (-1 after submit and on tool results).
        generated: (B, T') turn of each policy token before any masking (tokens after
            submit and of truncated rows were generated and cost: they count in L).
        A: (B,) float32 terminal advantages as trained on (the rule's statistics read
            them); C: (B, T) coefficients.
        loss_mask: (B, T) TRL's; its tokens are the ``credited`` ones.
        A_group: (B,) the group advantages before weighting, recorded as ``advantage``
            (None: ``A``, no weighting).

    Returns: one :class:`RolloutCredit` per record, in order.
    """
    out = []
    for i, rec in enumerate(records):
        row_turns, gen_turns = turns[i], generated[i]
        L = int((gen_turns >= 0).sum())
        st = credit_stats(arm, contrast=rec.contrast if arm in COUNTERFACTUAL_ARMS else None,
                          token_turn=row_turns.cpu(), selected_turn=rec.selected_turn,
                          credit_lambda=credit_lambda, credit_cap=credit_cap,
                          advantage=float(A[i]))
        sel_mean, other_mean = credit_magnitudes(row_turns, C[i], rec.selected_turn)
        per_turn = [int((gen_turns == k).sum()) for k in range(1, rec.num_turns + 1)]
        credited = int((loss_mask[i] > 0).sum())
        nonzero = bool(((C[i] != 0) & (loss_mask[i] > 0)).any())  # credit in the loss
        out.append(RolloutCredit(
            counts={"L": L, "applied": st.applied, "cap_active": st.cap_active,
                    "sel_mean": sel_mean, "other_mean": other_mean, "credited": credited,
                    "credit_nonzero": nonzero},
            stats=st, tokens_per_turn=per_turn,
            advantage=float((A if A_group is None else A_group)[i])))
    return out


__all__ = ["CreditInjection", "RolloutCredit", "arm_contrasts", "inject_credit",
           "rollout_credit", "weight_negative"]
