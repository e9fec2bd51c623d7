"""The built-in scaffold ``ecredit``: bash + the editor commands + ``submit``
(:class:`ecredit_trl.agent.env.SWEAgentEnv`; design page, "Generation engines and scaffolds").

Its tools run inside :class:`~ecredit_trl.agent.env.SWEAgentEnv` itself (``parse`` / ``step``
are the env's methods), so this adapter only names the prompt and the tool surface.
"""

from __future__ import annotations

from ecredit_trl.agent.env import SWEAgentEnv
from ecredit_trl.agent.prompts import INSTRUCTION, policy_tools, task_prompt
from ecredit_trl.agent.scaffolds.base import Scaffold

__all__ = ["EcreditScaffold"]


class EcreditScaffold(Scaffold):
    """Today's tool surface and prompt (:func:`ecredit_trl.agent.prompts.task_prompt`)."""

    def __init__(self) -> None:
        super().__init__(name="ecredit", config={"instruction": INSTRUCTION},
                         source="built-in", env_class=SWEAgentEnv)

    def prompt(self, task) -> list[dict]:
        return task_prompt(task)

    def tools(self) -> list[dict]:
        return policy_tools()
