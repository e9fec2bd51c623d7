"""Power of a task-paired comparison: the minimum detectable difference (pure).

The study answers "no difference detected" only together with how large a difference it
could have seen (design page, "Evaluation": every comparison states its minimum detectable
difference). The estimate here is the **paired-variance** one (not the bootstrap): per task
t with both figures, d_t = a_t − b_t (each a_t the task's success over its n rollouts and the
seeds used, so the spread of d_t already carries the design's tasks × n × seeds); then

    SE  = s_d / √T                       s_d = sample SD of the T differences (ddof = 1)
    MDD = (z_{1−α/2} + z_{power}) · SE   two-sided level α, power = 1 − β

and, for planning, the tasks a design with the same per-task spread needs to detect δ:

    T(δ) = ⌈((z_{1−α/2} + z_{power}) · s_d / δ)²⌉

source: the normal-approximation sample size of a one-sample (paired) mean test,
n = (z_{α/2} + z_β)² σ² / δ², solved for δ (Chow, Shao & Wang, *Sample Size Calculations
in Clinical Research*, 2nd ed., 2008, §3.1; Cohen, *Statistical Power Analysis for the
Behavioral Sciences*, 2nd ed., 1988, ch. 2). With α = 0.05 and power 0.8 the factor is
1.95996 + 0.84162 = 2.80158. The normal quantile (not Student's t) is used, as in that
formula; with T ≥ 30 tasks the t quantile is within 4% of it.

Not estimable (None, with the reason): fewer than 2 paired tasks, or every d_t equal
(s_d = 0: the observed spread says nothing about a difference's spread, e.g. both arms at 0
on every task).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

__all__ = ["DEFAULT_POWER", "MDD_BASIS", "Power", "mdd", "tasks_needed", "z_factor"]

DEFAULT_POWER = 0.8
#: How :func:`mdd` estimates the standard error (shown beside every MDD).
MDD_BASIS = "paired variance: MDD = (z_{1-a/2} + z_power) * sd(d_t) / sqrt(T)"


@dataclass(frozen=True)
class Power:
    """The minimum detectable difference of one task-paired comparison.

    Attributes:
        mdd: the MDD in success units (a difference of mean per-task success, in [0, 1]
            terms); None when not estimable (see ``reason``).
        se: the standard error of the mean paired difference, s_d / √T (None likewise).
        sd: s_d, the sample SD (ddof = 1) of the paired differences (None for T < 2).
        n_tasks: T, the paired tasks.
        alpha: two-sided level; power: 1 − β.
        reason: why ``mdd`` is None ("" when it is not).
    """

    mdd: float | None
    se: float | None
    sd: float | None
    n_tasks: int
    alpha: float
    power: float
    reason: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def _check(alpha: float, power: float) -> None:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise ValueError(f"alpha: must be in (0, 1), got {alpha!r}")
    if not isinstance(power, (int, float)) or isinstance(power, bool) or not 0 < power < 1:
        raise ValueError(f"power: must be in (0, 1), got {power!r}")


def z_factor(alpha: float = 0.05, power: float = DEFAULT_POWER) -> float:
    """z_{1−α/2} + z_{power} (standard normal quantiles); 2.80158 for (0.05, 0.8).

    Raises: ValueError naming ``alpha`` or ``power`` outside (0, 1).
    """
    _check(alpha, power)
    nd = NormalDist()
    return nd.inv_cdf(1 - alpha / 2) + nd.inv_cdf(power)


def mdd(diffs: Sequence[float], *, alpha: float = 0.05, power: float = DEFAULT_POWER) -> Power:
    """The minimum detectable difference of the mean of ``diffs`` (see the module docstring).

    Args:
        diffs: shape (T,), the task-paired differences d_t = a_t − b_t (finite numbers).
        alpha: two-sided level (the study's ``bootstrap.alpha``).
        power: 1 − β (the study's ``bootstrap.power``, default 0.8).

    Returns: :class:`Power` (``mdd`` None with ``reason`` when not estimable).

    Raises: ValueError naming ``alpha``/``power`` outside (0, 1) or a value of ``diffs`` that
        is not a finite number.
    """
    _check(alpha, power)
    d = [float(x) for x in diffs]
    bad = [x for x in d if not math.isfinite(x)]
    if bad:
        raise ValueError(f"diffs: {len(bad)} value(s) not a finite number (first {bad[0]!r})")
    t = len(d)
    if t < 2:
        return Power(None, None, None, t, float(alpha), float(power),
                     f"{t} paired task(s): a spread needs at least 2")
    mean = sum(d) / t
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (t - 1))
    if sd == 0.0:
        return Power(None, 0.0, 0.0, t, float(alpha), float(power),
                     f"all {t} paired differences equal {mean:+.3f} (no spread to estimate from)")
    se = sd / math.sqrt(t)
    return Power(z_factor(alpha, power) * se, se, sd, t, float(alpha), float(power))


def tasks_needed(sd: float, delta: float, *, alpha: float = 0.05,
                 power: float = DEFAULT_POWER) -> int:
    """Paired tasks T a design with per-task spread ``sd`` needs to detect |Δ| ≥ ``delta``:
    ⌈((z_{1−α/2} + z_power) · sd / delta)²⌉ (the module docstring's source).

    Args:
        sd: s_d of the paired differences (success units), > 0.
        delta: the difference to detect (success units), > 0.

    Raises: ValueError naming ``sd``, ``delta``, ``alpha`` or ``power`` when out of range.
    """
    if not isinstance(sd, (int, float)) or not sd > 0 or not math.isfinite(sd):
        raise ValueError(f"sd: must be a finite number > 0, got {sd!r}")
    if not isinstance(delta, (int, float)) or not delta > 0 or not math.isfinite(delta):
        raise ValueError(f"delta: must be a finite number > 0, got {delta!r}")
    return math.ceil((z_factor(alpha, power) * sd / delta) ** 2)
