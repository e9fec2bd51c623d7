"""The comparison pairs every study answers, defined once (design page, "Evaluation").

Each pair ``(a, b)`` is the paired difference ``a − b`` of per-task means over the same tasks;
arm letters are those of :mod:`ecredit_trl.credit.arms` (eval/ may not import ecredit_trl, so
the pairs live here and the study report imports them).
"""

from __future__ import annotations

__all__ = ["STANDARD_PAIRS"]

STANDARD_PAIRS: tuple[tuple[str, str], ...] = (("M", "B"), ("M", "O"), ("M", "E"))
"""The differences the study answers, primary first."""
