"""Tests for ecredit_trl.credit.coefficients (source: the design page, "Credit arms")."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ecredit_trl.credit.arms import ARMS
from ecredit_trl.credit.coefficients import (
    CreditStats,
    credit_coefficients,
    credit_coefficients_batch,
    credit_stats,
)

settings.register_profile("credit", deadline=None, max_examples=150)
settings.load_profile("credit")

# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------

finite = dict(allow_nan=False, allow_infinity=False)
lambdas = st.floats(min_value=0.0, max_value=5.0, **finite)
caps = st.floats(min_value=1e-3, max_value=10.0, **finite)
contrasts = st.one_of(st.none(), st.floats(min_value=-2.0, max_value=2.0, **finite))
present_contrasts = st.floats(min_value=-2.0, max_value=2.0, **finite)
advantages = st.floats(min_value=-5.0, max_value=5.0, **finite)


@st.composite
def trajectories(draw, max_turns: int = 5, max_len: int = 48):
    """(token_turn list, selected_turn) with -1 for non-generated tokens."""
    k = draw(st.integers(min_value=1, max_value=max_turns))
    tt = draw(st.lists(st.integers(min_value=-1, max_value=k - 1), min_size=1, max_size=max_len))
    sel = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=k)))
    return tt, sel


@st.composite
def applied_trajectories(draw, max_turns: int = 5, max_len: int = 48):
    """Trajectories whose selected turn has m >= 1 generated tokens."""
    tt, _ = draw(trajectories(max_turns, max_len))
    gen_turns = sorted({t for t in tt if t >= 0})
    if not gen_turns:
        tt = tt + [0]
        gen_turns = [0]
    sel = draw(st.sampled_from(gen_turns))
    return tt, sel


def _c(arm, tt, sel, *, a=0.0, d=None, lam=1.0, cap=1.0):
    return credit_coefficients(
        arm,
        advantage=a,
        contrast=d,
        token_turn=torch.tensor(tt, dtype=torch.long),
        selected_turn=sel,
        credit_lambda=lam,
        credit_cap=cap,
    )


def _lm(tt, sel):
    L = sum(1 for t in tt if t >= 0)
    m = 0 if sel is None else sum(1 for t in tt if t == sel)
    return L, m


def _s(lam, d, L, m, cap):
    mag = lam * abs(d) * L / m
    return 1.0 if mag == 0 else min(1.0, cap / mag)


def _close(x, y, *, rel=1e-5, abs_=1e-6):
    return math.isclose(x, y, rel_tol=rel, abs_tol=abs_)


# ---------------------------------------------------------------------------
# hand-computed exact values
# T=10, turns: [-1, 0,0,0, 1,1, 2,2,2, -1] -> L=8; selected turn 1 -> m=2, L/m=4
# ---------------------------------------------------------------------------

TT = [-1, 0, 0, 0, 1, 1, 2, 2, 2, -1]
SEL = 1
GEN = [0.0 if t < 0 else 1.0 for t in TT]
ON_SEL = [1.0 if t == SEL else 0.0 for t in TT]


def _expect(values):
    return torch.tensor(values, dtype=torch.float32)


def _assert_exact(got, want):
    assert got.dtype == torch.float32 and got.shape == (10,)
    torch.testing.assert_close(got, _expect(want), rtol=1e-6, atol=1e-7)


def test_hand_example_cap_inactive():
    # λ=0.5, D=0.4, c=1.0: λ|D|L/m = 0.8 <= 1 -> s = 1
    kw = dict(a=0.3, d=0.4, lam=0.5, cap=1.0)
    _assert_exact(_c("O", TT, SEL, **kw), [0.0] * 10)
    _assert_exact(_c("B", TT, SEL, **kw), [0.2 * g for g in GEN])
    _assert_exact(_c("M", TT, SEL, **kw), [0.8 * x for x in ON_SEL])
    # E: λ·A·L/m = 0.5·0.3·4 = 0.6, inside [-1, 1]
    _assert_exact(_c("E", TT, SEL, **kw), [0.6 * x for x in ON_SEL])
    st_b = credit_stats(
        "B",
        contrast=0.4,
        token_turn=torch.tensor(TT),
        selected_turn=SEL,
        credit_lambda=0.5,
        credit_cap=1.0,
    )
    assert (st_b.L, st_b.m, st_b.s, st_b.cap_active) == (8, 2, 1.0, False)
    assert _close(st_b.signed_mass, 1.6) and _close(st_b.l1_mass, 1.6)
    st_m = credit_stats(
        "M",
        contrast=0.4,
        token_turn=torch.tensor(TT),
        selected_turn=SEL,
        credit_lambda=0.5,
        credit_cap=1.0,
    )
    assert _close(st_m.signed_mass, 1.6) and _close(st_m.l1_mass, 1.6)
    assert st_m.applied and st_m.reason is None


def test_hand_example_cap_active():
    # λ=0.5, D=0.4, c=0.5: s = 0.5 / 0.8 = 0.625
    kw = dict(a=0.3, d=0.4, lam=0.5, cap=0.5)
    _assert_exact(_c("B", TT, SEL, **kw), [0.125 * g for g in GEN])  # 0.625·0.5·0.4
    _assert_exact(_c("M", TT, SEL, **kw), [0.5 * x for x in ON_SEL])  # 0.125·4
    # E: 0.6 clipped to 0.5
    _assert_exact(_c("E", TT, SEL, **kw), [0.5 * x for x in ON_SEL])
    # negative signs
    kw_neg = dict(a=-0.3, d=-0.4, lam=0.5, cap=0.5)
    _assert_exact(_c("B", TT, SEL, **kw_neg), [-0.125 * g for g in GEN])
    _assert_exact(_c("M", TT, SEL, **kw_neg), [-0.5 * x for x in ON_SEL])
    _assert_exact(_c("E", TT, SEL, **kw_neg), [-0.5 * x for x in ON_SEL])
    for arm in ("B", "M"):
        s = credit_stats(
            arm,
            contrast=0.4,
            token_turn=torch.tensor(TT),
            selected_turn=SEL,
            credit_lambda=0.5,
            credit_cap=0.5,
        )
        assert math.isclose(s.s, 0.625) and s.cap_active
        # mass = s·λ·D·L = 0.625·0.5·0.4·8 = 1.0
        assert _close(s.signed_mass, 1.0) and _close(s.l1_mass, 1.0)
    e = credit_stats(
        "E",
        contrast=None,
        advantage=0.3,
        token_turn=torch.tensor(TT),
        selected_turn=SEL,
        credit_lambda=0.5,
        credit_cap=0.5,
    )
    assert math.isclose(e.s, 0.5 / 0.6) and e.cap_active and e.applied
    assert _close(e.signed_mass, 1.0)  # 0.5 on 2 tokens


def test_hand_example_other_turn_and_lambda_zero():
    # select turn 2 -> m = 3, L/m = 8/3
    got = _c("M", TT, 2, d=0.3, lam=1.0, cap=10.0)
    _assert_exact(got, [0.8 if t == 2 else 0.0 for t in TT])  # 0.3·8/3
    for arm in ARMS:
        _assert_exact(_c(arm, TT, SEL, a=1.0, d=0.4, lam=0.0, cap=1.0), [0.0] * 10)
    s = credit_stats(
        "M",
        contrast=0.4,
        token_turn=torch.tensor(TT),
        selected_turn=SEL,
        credit_lambda=0.0,
        credit_cap=1.0,
    )
    assert s.s == 1.0 and not s.cap_active and s.applied


def test_zero_contrast_is_applied_but_zero():
    for arm in ("B", "M"):
        s = credit_stats(
            arm,
            contrast=0.0,
            token_turn=torch.tensor(TT),
            selected_turn=SEL,
            credit_lambda=0.5,
            credit_cap=0.5,
        )
        assert s.applied and s.s == 1.0 and s.signed_mass == 0.0
        assert torch.count_nonzero(_c(arm, TT, SEL, d=0.0, lam=0.5, cap=0.5)) == 0


def test_infinite_cap_allowed():
    _assert_exact(_c("M", TT, SEL, d=0.4, lam=0.5, cap=math.inf), [0.8 * x for x in ON_SEL])
    _assert_exact(_c("E", TT, SEL, a=10.0, lam=0.5, cap=math.inf), [20.0 * x for x in ON_SEL])


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------


@given(applied_trajectories(), present_contrasts, lambdas, caps)
def test_b_and_m_carry_equal_mass(traj, d, lam, cap):
    tt, sel = traj
    L, m = _lm(tt, sel)
    s = _s(lam, d, L, m, cap)
    want = s * lam * d * L
    cb = _c("B", tt, sel, d=d, lam=lam, cap=cap).double()
    cm = _c("M", tt, sel, d=d, lam=lam, cap=cap).double()
    assert _close(float(cb.sum()), want)
    assert _close(float(cm.sum()), want)
    assert _close(float(cb.abs().sum()), abs(want))
    assert _close(float(cm.abs().sum()), abs(want))
    assert _close(float(cb.sum()), float(cm.sum()))
    assert _close(float(cb.abs().sum()), float(cm.abs().sum()))


@given(applied_trajectories(), present_contrasts, lambdas, caps)
def test_m_bounded_by_cap_and_shrinkage_in_unit_interval(traj, d, lam, cap):
    tt, sel = traj
    cm = _c("M", tt, sel, d=d, lam=lam, cap=cap)
    assert float(cm.abs().max()) <= cap * (1 + 1e-6) + 1e-7
    cb = _c("B", tt, sel, d=d, lam=lam, cap=cap)
    assert float(cb.abs().max()) <= cap * (1 + 1e-6) + 1e-7
    for arm in ("B", "M"):
        stt = credit_stats(
            arm,
            contrast=d,
            token_turn=torch.tensor(tt),
            selected_turn=sel,
            credit_lambda=lam,
            credit_cap=cap,
        )
        assert 0.0 < stt.s <= 1.0
        assert stt.cap_active == (stt.s < 1.0)
        L, m = _lm(tt, sel)
        assert (stt.L, stt.m) == (L, m)
        assert math.isclose(stt.s, _s(lam, d, L, m, cap), rel_tol=1e-12)


@given(applied_trajectories(), present_contrasts, lambdas, caps)
def test_support_of_b_and_m(traj, d, lam, cap):
    tt, sel = traj
    t = torch.tensor(tt)
    cb = _c("B", tt, sel, d=d, lam=lam, cap=cap)
    cm = _c("M", tt, sel, d=d, lam=lam, cap=cap)
    assert torch.all(cb[t < 0] == 0)
    assert torch.all(cm[t != sel] == 0)
    # B is constant over generated tokens, M constant over the selected turn
    assert torch.unique(cb[t >= 0]).numel() == 1
    assert torch.unique(cm[t == sel]).numel() == 1


@given(trajectories(), advantages, contrasts, contrasts, lambdas, caps)
def test_e_never_depends_on_contrast(traj, a, d1, d2, lam, cap):
    tt, sel = traj
    base = _c("E", tt, sel, a=a, d=None, lam=lam, cap=cap)
    assert torch.equal(base, _c("E", tt, sel, a=a, d=d1, lam=lam, cap=cap))
    assert torch.equal(base, _c("E", tt, sel, a=a, d=d2, lam=lam, cap=cap))
    assert float(base.abs().max()) <= cap * (1 + 1e-6) + 1e-7
    L, m = _lm(tt, sel)
    if m > 0:
        want = max(-cap, min(cap, lam * a * L / m))
        on = base[torch.tensor(tt) == sel]
        torch.testing.assert_close(on, torch.full_like(on, want), rtol=1e-6, atol=1e-7)


@given(trajectories(), advantages, contrasts, lambdas, caps)
def test_shape_dtype_and_masked_positions(traj, a, d, lam, cap):
    tt, sel = traj
    t = torch.tensor(tt)
    for arm in ARMS:
        c = _c(arm, tt, sel, a=a, d=d, lam=lam, cap=cap)
        assert c.dtype == torch.float32
        assert c.shape == (len(tt),)
        assert torch.all(c[t < 0] == 0)
        assert torch.all(torch.isfinite(c))


@given(trajectories(), advantages, contrasts, lambdas, caps)
def test_arm_o_is_zero(traj, a, d, lam, cap):
    tt, sel = traj
    assert torch.count_nonzero(_c("O", tt, sel, a=a, d=d, lam=lam, cap=cap)) == 0
    s = credit_stats(
        "O",
        contrast=d,
        token_turn=torch.tensor(tt),
        selected_turn=sel,
        credit_lambda=lam,
        credit_cap=cap,
    )
    assert not s.applied and s.reason == "arm_O" and s.l1_mass == 0.0


@given(trajectories(), advantages, present_contrasts, lambdas, caps)
def test_zero_when_no_contrast_no_selection_or_empty_turn(traj, a, d, lam, cap):
    tt, sel = traj
    L, m = _lm(tt, sel)
    for arm in ("B", "M"):
        assert torch.count_nonzero(_c(arm, tt, sel, a=a, d=None, lam=lam, cap=cap)) == 0
    for arm in ("B", "M", "E"):
        assert torch.count_nonzero(_c(arm, tt, None, a=a, d=d, lam=lam, cap=cap)) == 0
        if m == 0:
            assert torch.count_nonzero(_c(arm, tt, sel, a=a, d=d, lam=lam, cap=cap)) == 0


@given(trajectories(), advantages, contrasts, lambdas, caps)
def test_stats_reason_and_mass_match_coefficients(traj, a, d, lam, cap):
    tt, sel = traj
    L, m = _lm(tt, sel)
    for arm in ("B", "M", "E"):
        s = credit_stats(
            arm,
            contrast=d,
            advantage=a,
            token_turn=torch.tensor(tt),
            selected_turn=sel,
            credit_lambda=lam,
            credit_cap=cap,
        )
        assert isinstance(s, CreditStats) and (s.L, s.m) == (L, m) and s.arm == arm
        if sel is None:
            expected_reason = "no_selection"
        elif m == 0:
            expected_reason = "empty_turn"
        elif arm != "E" and d is None:
            expected_reason = "no_contrast"
        else:
            expected_reason = None
        assert s.reason == expected_reason
        assert s.applied == (expected_reason is None)
        c = _c(arm, tt, sel, a=a, d=d, lam=lam, cap=cap).double()
        assert math.isclose(s.signed_mass, float(c.sum()), rel_tol=1e-12, abs_tol=1e-12)
        assert math.isclose(s.l1_mass, float(c.abs().sum()), rel_tol=1e-12, abs_tol=1e-12)
        assert 0.0 < s.s <= 1.0 and s.cap_active == (s.s < 1.0)
        if not s.applied:
            assert s.l1_mass == 0.0 and s.s == 1.0


@st.composite
def batches(draw):
    B = draw(st.integers(min_value=1, max_value=6))
    T = draw(st.integers(min_value=1, max_value=32))
    k = draw(st.integers(min_value=1, max_value=4))
    rows = draw(
        st.lists(st.lists(st.integers(-1, k - 1), min_size=T, max_size=T), min_size=B, max_size=B)
    )
    sels = draw(st.lists(st.one_of(st.none(), st.integers(0, k)), min_size=B, max_size=B))
    advs = draw(st.lists(advantages, min_size=B, max_size=B))
    ds = draw(st.lists(contrasts, min_size=B, max_size=B))
    return rows, sels, advs, ds


@given(batches(), lambdas, caps, st.booleans())
def test_batch_equals_rowwise(batch, lam, cap, adv_as_tensor):
    rows, sels, advs, ds = batch
    tt = torch.tensor(rows, dtype=torch.long)
    for arm in ARMS:
        got = credit_coefficients_batch(
            arm,
            advantages=torch.tensor(advs) if adv_as_tensor else advs,
            contrasts=ds,
            token_turn=tt,
            selected_turns=sels,
            credit_lambda=lam,
            credit_cap=cap,
        )
        assert got.dtype == torch.float32 and got.shape == tt.shape
        for b in range(len(rows)):
            one = credit_coefficients(
                arm,
                advantage=advs[b],
                contrast=ds[b],
                token_turn=tt[b],
                selected_turn=sels[b],
                credit_lambda=lam,
                credit_cap=cap,
            )
            if adv_as_tensor:
                # advantages went through a float32 tensor; allow that rounding
                torch.testing.assert_close(got[b], one, rtol=1e-6, atol=1e-6)
            else:
                assert torch.equal(got[b], one)


def test_int32_token_turn_and_empty_rollout():
    c = credit_coefficients(
        "M",
        advantage=0.0,
        contrast=0.4,
        token_turn=torch.tensor(TT, dtype=torch.int32),
        selected_turn=SEL,
        credit_lambda=0.5,
        credit_cap=1.0,
    )
    _assert_exact(c, [0.8 * x for x in ON_SEL])
    empty = credit_coefficients(
        "B",
        advantage=0.0,
        contrast=0.4,
        token_turn=torch.empty(0, dtype=torch.long),
        selected_turn=0,
        credit_lambda=0.5,
        credit_cap=1.0,
    )
    assert empty.shape == (0,) and empty.dtype == torch.float32


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------

GOOD = dict(
    advantage=0.1,
    contrast=0.2,
    token_turn=torch.tensor(TT),
    selected_turn=SEL,
    credit_lambda=0.5,
    credit_cap=1.0,
)


@pytest.mark.parametrize("arm", ["X", "b", "", None, 1])
def test_bad_arm_raises(arm):
    with pytest.raises(ValueError, match="arm"):
        credit_coefficients(arm, **GOOD)
    with pytest.raises(ValueError, match="arm"):
        credit_stats(
            arm,
            contrast=0.2,
            token_turn=torch.tensor(TT),
            selected_turn=SEL,
            credit_lambda=0.5,
            credit_cap=1.0,
        )


@pytest.mark.parametrize(
    "field, value",
    [
        ("credit_lambda", -0.1),
        ("credit_lambda", math.nan),
        ("credit_lambda", math.inf),
        ("credit_cap", 0.0),
        ("credit_cap", -1.0),
        ("credit_cap", math.nan),
        ("advantage", math.nan),
        ("contrast", math.inf),
        ("contrast", "0.3x"),
        ("selected_turn", -1),
        ("selected_turn", 1.5),
        ("selected_turn", True),
        ("token_turn", torch.tensor([0.0, 1.0])),
        ("token_turn", torch.tensor([[0, 1]])),
        ("token_turn", torch.tensor([0, -2])),
        ("token_turn", [0, 1]),
    ],
)
def test_bad_argument_raises_naming_it(field, value):
    kw = dict(GOOD)
    kw[field] = value
    with pytest.raises(ValueError, match=field):
        credit_coefficients("M", **kw)


def test_batch_length_mismatch_raises():
    tt = torch.tensor([TT, TT])
    base = dict(
        advantages=[0.1, 0.2],
        contrasts=[0.1, None],
        token_turn=tt,
        selected_turns=[1, None],
        credit_lambda=0.5,
        credit_cap=1.0,
    )
    credit_coefficients_batch("B", **base)
    for field, value in [
        ("advantages", [0.1]),
        ("advantages", torch.zeros(3)),
        ("contrasts", [0.1]),
        ("selected_turns", [1, 2, 3]),
        ("token_turn", torch.tensor(TT)),
    ]:
        kw = dict(base)
        kw[field] = value
        with pytest.raises(ValueError, match=field):
            credit_coefficients_batch("B", **kw)
    kw = dict(base, contrasts=[0.1, math.nan])
    with pytest.raises(ValueError, match=r"contrasts\[1\]"):
        credit_coefficients_batch("B", **kw)
    kw = dict(base, advantages=torch.tensor([0.0, math.inf]))
    with pytest.raises(ValueError, match="advantages"):
        credit_coefficients_batch("B", **kw)


def test_stats_arm_e_requires_advantage():
    with pytest.raises(ValueError, match="advantage"):
        credit_stats(
            "E",
            contrast=None,
            token_turn=torch.tensor(TT),
            selected_turn=SEL,
            credit_lambda=0.5,
            credit_cap=1.0,
        )
