"""Turn maps and per-turn snapshot grouping (pure functions)."""

import pytest
import torch

from ecredit_trl.credit.planning import contrast, token_turns, turn_snapshots


def test_token_turns_from_tool_mask_and_padding():
    cm = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0, 0]])
    tm = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]])
    got = token_turns(cm, tm)
    assert got.tolist() == [[1, 1, -1, -1, 2, -1, 3, -1, -1], [1, 1, -1, -1, -1, -1, -1, -1, -1]]
    assert token_turns(cm, None)[0].tolist() == [1, 1, 1, 1, 1, 1, 1, -1, -1]


def test_turn_snapshots_groups_calls_by_turn():
    assert turn_snapshots("b", [1, 1, 3], ["t1", "t2", "t3"], 4) == ["b", "t2", "t2", "t3", "t3"]
    assert turn_snapshots("b", [], [], 2) == ["b", "b", "b"]
    with pytest.raises(ValueError, match="call_turns"):
        turn_snapshots("b", [5], ["t"], 2)
    with pytest.raises(ValueError, match="call_trees"):
        turn_snapshots("b", [1], [], 2)


def test_contrast_none_when_either_side_missing():
    assert contrast(1.0, 0.25) == 0.75
    assert contrast(None, 0.0) is None and contrast(0.0, None) is None


def _frozen_batch():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 40
    cm = torch.ones(B, T, dtype=torch.long)
    tm = torch.ones(B, T, dtype=torch.long)
    tm[:, 10:15] = 0
    tm[:, 25:30] = 0
    for b in range(B):
        cm[b, T - 2 * b:] = 0
    A = torch.randn(B, generator=g)
    D = [0.5, -1.0, None, 0.25, 2.0, 0.0]
    sel = [1, 2, 1, None, 3, 2]
    return A, cm, tm, D, sel


def test_per_token_advantages_b_and_m_carry_equal_signed_mass():
    from ecredit_trl.credit.planning import per_token_advantages

    A, cm, tm, D, sel = _frozen_batch()
    out = {}
    for arm in ("O", "B", "M", "E"):
        out[arm] = per_token_advantages(arm, advantages=A, completion_mask=cm, tool_mask=tm,
                                        contrasts=D, selected_turns=sel, credit_lambda=0.5,
                                        credit_cap=1.0)
    mask = (cm * tm).float()
    base = A[:, None] * mask
    assert torch.equal(out["O"][0], base)
    for arm in ("B", "M", "E"):
        adv, C, turns = out[arm]
        assert torch.all(adv[mask == 0] == 0)  # tool tokens and padding never credited
        assert torch.allclose(adv, base + C * mask)
    mass_b = (out["B"][0] - base).sum(dim=1)
    mass_m = (out["M"][0] - base).sum(dim=1)
    assert torch.allclose(mass_b, mass_m, atol=1e-5)
    assert mass_b[2] == 0 and mass_b[3] == 0  # D None / no selection
    assert mass_b[0] > 0 and mass_b[1] < 0
    # E reads A, never D
    D2 = [9.0, 9.0, 9.0, 9.0, 9.0, 9.0]
    from ecredit_trl.credit.planning import per_token_advantages as pta
    e2 = pta("E", advantages=A, completion_mask=cm, tool_mask=tm, contrasts=D2,
             selected_turns=sel, credit_lambda=0.5, credit_cap=1.0)[0]
    assert torch.equal(e2, out["E"][0])
