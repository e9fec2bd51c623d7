"""Scaffolds: the tool surface and prompt a policy is trained and evaluated with (design
page, "Generation engines and scaffolds"). :func:`get_scaffold` makes one by name;
:mod:`.base` is the interface.
"""

from __future__ import annotations

from ecredit_trl.agent.scaffolds.base import FormatError, Scaffold, ScaffoldEnv
from ecredit_trl.agent.scaffolds.ecredit import EcreditScaffold
from ecredit_trl.agent.scaffolds.mini_swe_agent import MiniSweAgentScaffold

__all__ = ["SCAFFOLDS", "FormatError", "Scaffold", "ScaffoldEnv", "get_scaffold"]

SCAFFOLDS = ("ecredit", "mini-swe-agent")
"""The ``--scaffold`` names."""


def get_scaffold(name: str = "ecredit", config_file: str | None = None) -> Scaffold:
    """The adapter named ``name`` (:data:`SCAFFOLDS`), with ``config_file`` (its own config
    format; only ``mini-swe-agent`` takes one).

    Raises: ValueError naming ``scaffold`` (unknown name) or ``scaffold_config`` (given to
    ``ecredit``; a bad file), FileNotFoundError (no mini-swe-agent config found).
    """
    if name == "ecredit":
        if config_file:
            raise ValueError("scaffold_config: the ecredit scaffold takes no config file")
        return EcreditScaffold()
    if name == "mini-swe-agent":
        return MiniSweAgentScaffold(config_file)
    raise ValueError(f"scaffold: unknown scaffold {name!r}; known: {', '.join(SCAFFOLDS)}")
