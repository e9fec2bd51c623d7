"""eval.stats.power: the minimum detectable difference of a task-paired comparison.

Expected values are computed here independently: the sample SD by hand (not
``statistics``), the normal quantiles as published constants (z_0.975 = 1.959963984540054,
z_0.8 = 0.8416212335729143, z_0.95 = 1.6448536269514722, z_0.9 = 1.2815515655446004).
"""

from __future__ import annotations

import math

import pytest

from eval.stats.power import mdd, tasks_needed, z_factor

Z975, Z80, Z95, Z90 = 1.959963984540054, 0.8416212335729143, 1.6448536269514722, 1.2815515655446004


def test_mdd_of_crafted_differences():
    d = [0.5, 0.25, 0.25, 0.25]  # mean .3125; squared deviations .0352, 3 x .0039
    sd = math.sqrt((0.1875 ** 2 + 3 * 0.0625 ** 2) / 3)  # = 0.125
    assert sd == pytest.approx(0.125)
    p = mdd(d)
    assert p.sd == pytest.approx(0.125) and p.se == pytest.approx(0.0625)
    assert p.mdd == pytest.approx((Z975 + Z80) * 0.0625, rel=1e-9)  # 0.175099
    assert round(p.mdd, 3) == 0.175 and p.n_tasks == 4 and p.reason == ""
    # another level and power: one-sided-looking numbers, still two-sided alpha = 0.1
    q = mdd(d, alpha=0.1, power=0.9)
    assert q.mdd == pytest.approx((Z95 + Z90) * 0.0625, rel=1e-9)
    assert z_factor() == pytest.approx(2.801585218, rel=1e-9)


def test_mdd_shrinks_with_tasks_as_one_over_root_t():
    d = [0.0, 0.5] * 8  # sd = sqrt(16 * .0625 / 15)
    sd = math.sqrt(16 * 0.25 ** 2 / 15)
    assert mdd(d).mdd == pytest.approx((Z975 + Z80) * sd / 4, rel=1e-9)
    assert mdd(d * 4).mdd < mdd(d).mdd


def test_not_estimable_says_why():
    flat = mdd([0.0] * 10)  # both arms 0 on every task (the embedded holdout)
    assert flat.mdd is None and flat.sd == 0.0 and "all 10 paired differences equal" in flat.reason
    one = mdd([0.5])
    assert one.mdd is None and one.sd is None and "at least 2" in one.reason
    assert mdd([]).n_tasks == 0


def test_tasks_needed_inverts_the_mdd():
    # sd .125, delta .05: ((2.8016 * .125 / .05)^2) = 49.05 -> 50 tasks
    assert tasks_needed(0.125, 0.05) == math.ceil(((Z975 + Z80) * 0.125 / 0.05) ** 2) == 50
    t = tasks_needed(0.3, 0.02)
    assert mdd([0.3, -0.3] * (t // 2 + 1)).mdd <= 0.02 + 1e-9


@pytest.mark.parametrize("call, named", [
    (lambda: mdd([0.1, 0.2], alpha=0), "alpha"),
    (lambda: mdd([0.1, 0.2], power=1.0), "power"),
    (lambda: mdd([0.1, float("nan")]), "diffs"),
    (lambda: tasks_needed(0.0, 0.1), "sd"),
    (lambda: tasks_needed(0.1, -1), "delta"),
])
def test_bad_input_names_the_argument(call, named):
    with pytest.raises(ValueError, match=named):
        call()
