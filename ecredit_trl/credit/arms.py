"""The credit arms, defined once (design page, "Credit arms").

* ``O`` — plain GRPO: the terminal group advantage only, no credit.
* ``B`` — the counterfactual contrast D spread over every generated token.
* ``M`` — the same mass on the selected turn's generated tokens only.
* ``E`` — the group advantage re-weighted onto the selected turn (never reads D).

Every other module imports these names; a test checks that no other module writes a tuple
of arm letters.
"""

from __future__ import annotations

__all__ = ["ARMS", "COUNTERFACTUAL_ARMS", "CREDIT_ARMS"]

ARMS: tuple[str, ...] = ("O", "B", "M", "E")
"""Every arm, in report order."""
COUNTERFACTUAL_ARMS: tuple[str, ...] = ("B", "M")
"""Arms whose credit reads the contrast D, so each rollout also runs one counterfactual trial."""
CREDIT_ARMS: tuple[str, ...] = ("B", "M", "E")
"""Arms that add a per-token credit (arm O adds none), so their trajectories get a signal table."""
