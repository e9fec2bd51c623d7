"""The failure value: the utility of an observation charged to the policy.

One value for both rules that charge a failure to the policy, the artifact rule
(:mod:`eval.integrity.attribution`) and the agent rule (:mod:`eval.integrity.agent`): the
fixed-list contract's U as if no listed test passed (design page, "Utility and the
missing-observation rule").
"""

from __future__ import annotations


def failure_utility(f2p, p2p) -> float:
    """U as if no listed test passed, ``0 / |F2P| − 1[P2P non-empty]``: −1.0 when the task
    lists PASS_TO_PASS tests (``p2p``, any sized sequence), else 0.0; ``f2p`` is not read
    (its term is 0 either way)."""
    return 0.0 - (1.0 if len(p2p) else 0.0)


__all__ = ["failure_utility"]
