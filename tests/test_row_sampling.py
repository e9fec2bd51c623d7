"""The batched rollout sampler's draw (``_RowSampling``) is the per-row
``torch.multinomial(probs[i:i+1], 1, generator=row's)`` it replaces: the same tokens and the
same generator states after every step, for every warper setting; finished rows (EOS seen or
limit reached) draw nothing; a row with no finite probability is refused as ``multinomial``
refuses it."""

from __future__ import annotations

import pytest
import torch

from ecredit_trl.agent.generation import GenerationSettings, RowSampler, _RowSampling, _warpers

V, START, EOS = 97, 4, [5, 11]


@pytest.mark.parametrize("kw,min_p", [({}, None), ({"temperature": 0.7, "top_k": 20}, None),
                                      ({"top_p": 0.8}, 0.05), ({"temperature": 1.3}, 0.1)])
def test_draws_and_generator_states_equal_per_row_multinomial(kw, min_p):
    settings = GenerationSettings(**kw)
    limits = torch.tensor([3, 6, 6, 1])
    rows = [RowSampler(100 + i, torch.device("cpu")) for i in range(4)]
    refs = [torch.Generator().manual_seed(100 + i) for i in range(4)]
    proc = _RowSampling(settings, rows, START, limits, EOS, min_p=min_p)
    warp = _warpers(settings, min_p)  # the warpers are unchanged; the draw is under test
    data = torch.Generator().manual_seed(0)
    ids = torch.randint(20, V, (4, START), generator=data)
    ref_done = [False] * 4
    drawn = 0
    for step in range(6):
        scores = torch.randn(4, V, generator=data) * 3
        out = proc(ids, scores.clone())
        probs = torch.softmax(warp(ids, scores.clone()), dim=-1)
        nxt = []
        for i in range(4):
            ref_done[i] = ref_done[i] or step >= int(limits[i])
            if ref_done[i]:
                nxt.append(int(EOS[0]))  # generate pads a finished row
                continue
            tok = int(torch.multinomial(probs[i:i + 1], 1, generator=refs[i]))
            drawn += 1
            assert out[i].argmax().item() == tok and out[i, tok] == 0
            assert torch.isinf(out[i]).sum() == V - 1
            # row 1 ends with an EOS at its third token (step 2): draws nothing after it
            if i == 1 and step == 2:
                tok, ref_done[1] = EOS[1], True
            nxt.append(tok)
        for i in range(4):
            assert torch.equal(rows[i].generator.get_state(), refs[i].get_state()), (step, i)
        ids = torch.cat([ids, torch.tensor(nxt)[:, None]], dim=1)
    assert drawn == 3 + 3 + 6 + 1 and ref_done == [True, True, False, True]


def test_a_row_without_finite_probabilities_is_refused_like_multinomial():
    rows = [RowSampler(1, torch.device("cpu")), RowSampler(2, torch.device("cpu"))]
    proc = _RowSampling(GenerationSettings(), rows, 1, torch.tensor([4, 4]), EOS)
    scores = torch.zeros(2, V)
    scores[1] = float("-inf")
    with pytest.raises(RuntimeError, match="probability tensor"):
        proc(torch.ones(2, 1, dtype=torch.long), scores)
    with pytest.raises(RuntimeError, match="probability tensor"):
        torch.multinomial(torch.softmax(scores[1:], dim=-1), 1)
    # a finished row may hold anything: row 1 has reached its limit, so only row 0 draws
    proc = _RowSampling(GenerationSettings(), rows, 1, torch.tensor([4, 0]), EOS)
    out = proc(torch.ones(2, 1, dtype=torch.long), scores)
    assert out[0].max() == 0
