"""Scaffolds: the tool surface and prompt a policy is trained and evaluated with (design
page, "Generation engines and scaffolds"). :func:`get_scaffold` makes one by name;
:mod:`.base` is the interface, :mod:`.ecredit` the built-in tools' adapter,
:mod:`.mini_swe_agent` mini-swe-agent's.
"""

from __future__ import annotations

from ecredit_trl.agent.scaffolds.base import FormatError, Scaffold, ScaffoldEnv
from ecredit_trl.agent.scaffolds.ecredit import EcreditScaffold
from ecredit_trl.agent.scaffolds.mini_swe_agent import EMBEDDED_CONFIG, MiniSweAgentScaffold

__all__ = ["SCAFFOLDS", "FormatError", "Scaffold", "ScaffoldEnv", "default_scaffold_config",
           "get_scaffold"]

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


def default_scaffold_config(name: str, config_file: str | None, *,
                            embedded_policy: bool) -> str | None:
    """The scaffold config a run uses: ``config_file`` when given; else, for
    ``mini-swe-agent`` with the embedded default policy (no ``--model``), the compact config
    shipped in this package (:data:`~ecredit_trl.agent.scaffolds.mini_swe_agent.EMBEDDED_CONFIG`);
    else None (mini-swe-agent's shipped SWE-bench config, or no config for ``ecredit``).

    The one place this rule lives (docs/scaffolds.md, "The embedded default"): the tiny
    policy's tokenizer was trained on the built-in format, where the shipped SWE-bench
    instructions cost ~2.5k tokens; a user's model gets mini-swe-agent's own config.
    """
    if config_file is not None or name != "mini-swe-agent" or not embedded_policy:
        return config_file
    return EMBEDDED_CONFIG
