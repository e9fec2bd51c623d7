"""From a finished rollout to its credit query: turns, snapshots, selection, ablation.

Pure functions (turn maps, snapshot grouping, contrast) plus :func:`plan_query`,
which reads git trees but never a verifier result (design page, "Selection and restore":
selection is verifier-blind and recorded before any trial runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ecredit_trl.credit.blocks import SelectionRecord, ablate, edit_blocks, eligibility
from ecredit_trl.credit.coefficients import credit_coefficients_batch
from sandbox.snapshots.snapshot import artifact


def is_truncated(ids: Sequence[int], stop_ids: Sequence[int]) -> bool:
    """TRL 1.16's truncation rule for one completion: its last token is neither an EOS nor
    the pad token (``GRPOTrainer._generate_and_score_completions``, ``is_truncated``).

    Args:
        ids: the row's completion token ids (tool-result tokens included), unpadded.
        stop_ids: the EOS token ids plus the pad token id.

    Returns: True when truncated. An empty completion is not (it has no token to mask).
    """
    return bool(ids) and int(ids[-1]) not in set(stop_ids)


def policy_token_turns(lengths: Sequence[int], tool_masks: Sequence[Sequence[int]] | None
                       ) -> torch.Tensor:
    """:func:`token_turns` of the completions as generated, before any masking (TRL's
    ``mask_truncated_completions`` zeroes the masks of truncated rows; their tokens were
    still generated and cost).

    Args:
        lengths: completion length per row (tokens, tool results included).
        tool_masks: per row, TRL's unpadded tool mask (1 policy token, 0 tool result), or
            None (every completion token is the policy's).

    Returns: (B, max(lengths, 1)) int64, -1 on padding and tool-result tokens.
    """
    T = max([1, *lengths])
    comp = torch.zeros((len(lengths), T), dtype=torch.long)
    tool = torch.ones((len(lengths), T), dtype=torch.long)
    for i, n in enumerate(lengths):
        comp[i, :n] = 1
        if tool_masks is not None:
            tool[i, :len(tool_masks[i])] = torch.tensor(list(tool_masks[i]), dtype=torch.long)
    return token_turns(comp, tool if tool_masks is not None else None)


def token_turns(completion_mask: torch.Tensor, tool_mask: torch.Tensor | None) -> torch.Tensor:
    """Turn index of every completion token, -1 where the token is not policy-generated.

    Args:
        completion_mask: (B, T) {0,1}; 1 on real completion tokens (TRL's mask).
        tool_mask: (B, T) {0,1} or None; 0 on tool-result tokens. TRL pads it
            with 1, so it is always combined with ``completion_mask``.

    Returns: (B, T) int64. Turn k (1-based) is the k-th run of generated tokens
    of the row: each assistant generation is one contiguous run, separated
    from the next by tool-result tokens.
    """
    gen = completion_mask.bool()
    if tool_mask is not None:
        gen = gen & tool_mask.bool()
    g = gen.long()
    starts = g.clone()
    starts[:, 1:] = (g[:, 1:] - g[:, :-1]).clamp(min=0)
    turn = starts.cumsum(dim=1)
    return torch.where(gen, turn, torch.full_like(turn, -1))


def credit_turns(turns: torch.Tensor, submit_turns: Sequence[int | None] | None) -> torch.Tensor:
    """The turn map the credit sees: tokens of turns after the row's submit become -1.

    Args:
        turns: (B, T) int64 from :func:`token_turns` (-1 on tokens that are not generated).
        submit_turns: per row, the 1-based turn whose call submitted the patch (None: no
            submit); None for the whole argument: no row submitted.

    Returns: (B, T) int64; equal to ``turns`` except that ``turns > submit_turn`` is -1.
    Tokens generated after ``submit`` get C = 0 in every arm and, like tool-result
    tokens, count in neither L nor m (design page, "Credit arms"), so B and M
    still carry the same mass s·λ·D·L.

    Raises: ValueError when ``submit_turns`` does not have one entry per row.
    """
    if submit_turns is None:
        return turns
    if len(submit_turns) != turns.shape[0]:
        raise ValueError(f"submit_turns: expected {turns.shape[0]} entries, got {len(submit_turns)}")
    big = torch.iinfo(torch.long).max
    cut = torch.tensor([big if s is None else int(s) for s in submit_turns],
                       dtype=torch.long, device=turns.device)
    return torch.where(turns > cut[:, None], torch.full_like(turns, -1), turns)


def per_token_advantages(arm: str, *, advantages: torch.Tensor, completion_mask: torch.Tensor,
                         tool_mask: torch.Tensor | None, contrasts: Sequence[float | None],
                         selected_turns: Sequence[int | None], credit_lambda: float,
                         credit_cap: float, submit_turns: Sequence[int | None] | None = None,
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token advantages ``(A[:, None] + C) * completion_mask * tool_mask`` (design page,
    "Data flow of one training step").

    Args:
        advantages: (B,) float — the terminal group advantages A from TRL.
        completion_mask, tool_mask: (B, T) {0,1} (``tool_mask`` may be None).
        contrasts: D per row (None: unavailable, or not used by the arm).
        selected_turns: the selected block's turn per row (None: no selection).
        submit_turns: per row, the turn of the accepted ``submit`` (None: none); tokens
            of later turns get C = 0 (:func:`credit_turns`). A still applies to them.

    Returns: ``(per_token, C, turns)``: (B, T) float32 advantages for TRL's
    token-level loss, (B, T) float32 coefficients C, (B, T) int64 credit turn map
    (:func:`credit_turns`: -1 on tool-result tokens and on tokens after submit).
    """
    turns = credit_turns(token_turns(completion_mask, tool_mask), submit_turns)
    A = advantages.to(torch.float32)
    C = credit_coefficients_batch(arm, advantages=A.detach().cpu().tolist(), contrasts=contrasts,
                                  token_turn=turns.cpu(), selected_turns=selected_turns,
                                  credit_lambda=credit_lambda, credit_cap=credit_cap).to(A.device)
    mask = completion_mask.to(torch.float32)
    if tool_mask is not None:
        mask = mask * tool_mask.to(torch.float32)
    return (A[:, None] + C) * mask, C, turns


def turn_snapshots(base_tree: str, call_turns: Sequence[int], call_trees: Sequence[str],
                   num_turns: int) -> list[str]:
    """Group per-call snapshots into per-turn snapshots ``[S_0, ..., S_K]``.

    Args:
        base_tree: S_0.
        call_turns: the turn (1-based) during which each tool call ran, non-decreasing.
        call_trees: the tree after each call, same length.
        num_turns: K, the number of assistant turns of the rollout.

    Returns: K + 1 tree ids; S_k is the tree after the last call of a turn ≤ k
    (a turn without a call leaves the tree as it was).

    Raises: ValueError when the lists differ in length or a call's turn is outside 1..K.
    """
    if len(call_turns) != len(call_trees):
        raise ValueError("call_trees: one tree per call expected")
    snaps = [base_tree]
    current = base_tree
    i = 0
    for k in range(1, num_turns + 1):
        while i < len(call_turns) and call_turns[i] <= k:
            if call_turns[i] < 1:
                raise ValueError(f"call_turns: turn {call_turns[i]} outside 1..{num_turns}")
            current = call_trees[i]
            i += 1
        snaps.append(current)
    if i != len(call_turns):
        raise ValueError(f"call_turns: turn {call_turns[i]} outside 1..{num_turns}")
    return snaps


def generated_by_turn(call_turns: Sequence[int], call_generated: Sequence[Sequence[str]],
                      num_turns: int) -> dict[int, list[str]]:
    """Turn (1-based, clipped to ``num_turns``) → generated files that appeared in its
    calls (``ToolCall.generated``), for ``SelectionRecord.generated_only``; turns
    without any are left out."""
    out: dict[int, list[str]] = {}
    for t, paths in zip(call_turns, call_generated, strict=True):
        if paths:
            out.setdefault(min(max(1, t), num_turns), []).extend(paths)
    return out


def contrast(u_factual: float | None, u_ablated: float | None) -> float | None:
    """D = U(P) − U(P\\b); None when either utility is unavailable (design page,
    "Utility and the missing-observation rule")."""
    if u_factual is None or u_ablated is None:
        return None
    return float(u_factual) - float(u_ablated)


@dataclass
class QueryPlan:
    """The verifier-blind part of one rollout's credit query.

    Attributes:
        selection: the recorded choice (blocks, eligibility, selected turn).
        final_artifact: patch base → S_K (may be "").
        ablated_artifact: patch base → S_K with the selected block restored, or None.
        ablation: :meth:`blocks.Ablation.to_json` of the selected block, or None.
        exclusion: first exclusion reason known from the trees
            (``format_error`` / ``no_eligible_block``) or None (the trainer may add
            ``truncated`` before any trial).
    """

    selection: SelectionRecord
    final_artifact: str
    ablated_artifact: str | None
    ablation: dict | None
    exclusion: str | None = None
    extra: dict = field(default_factory=dict)


def plan_query(repo, snapshots: Sequence[str], *, task_id: str, rollout_index: int,
               run_seed: int, test_patterns: Sequence[str], format_error: bool,
               generated: Mapping[int, Sequence[str]] | None = None) -> QueryPlan:
    """Blocks, eligibility, selection and ablation for one rollout (no verifier input).

    Args:
        repo: git repository holding the snapshot trees.
        snapshots: ``[S_0, ..., S_K]``.
        format_error: the trajectory never produced a valid tool call.
        generated: turn → generated files that appeared in it (not recorded; reported
            in ``selection.generated_only`` when the turn made no block).

    Returns: :class:`QueryPlan`. Raises SnapshotError for unknown trees.
    """
    blocks = edit_blocks(repo, snapshots)
    judged = eligibility(repo, snapshots, blocks, test_patterns=test_patterns)
    sel = SelectionRecord.build(task_id=task_id, rollout_index=rollout_index, run_seed=run_seed,
                                blocks=blocks, judged=judged, test_patterns=test_patterns,
                                generated=generated)
    final = artifact(repo, snapshots[0], snapshots[-1])
    exclusion = None
    if format_error:
        exclusion = "format_error"
    elif sel.selected_turn is None:
        exclusion = "no_eligible_block"
    ablated = abl = None
    if sel.selected_turn is not None:
        block = next(b for b in blocks if b.turn == sel.selected_turn)
        ab = ablate(repo, snapshots, block)
        ablated, abl = ab.artifact, ab.to_json()
    return QueryPlan(selection=sel, final_artifact=final, ablated_artifact=ablated,
                     ablation=abl, exclusion=exclusion)
