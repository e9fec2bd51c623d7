"""The agent's prompt: one function shared by the warm start, the trainer and evaluation.

Whatever the policy sees at the start of a rollout is built here, so that the SFT
demonstrations (``ecredit_trl.policy.demos``), GRPO rollouts (``ecredit_trl.train``) and
evaluation render the same text.
"""

from __future__ import annotations

from ecredit_trl.agent.env import tool_schemas

INSTRUCTION = ("Fix the bug in the repository at /testbed described below. Use the tools to "
               "look at the code and edit it, then call submit.")
"""The fixed instruction that precedes the problem statement (part of the warm-start cache key)."""


def task_prompt(task) -> list[dict]:
    """The conversation a rollout starts from: one user message.

    Args:
        task: anything with a ``problem_statement`` string (``eval.tasks.schema.Task``).

    Returns:
        ``[{"role": "user", "content": INSTRUCTION + "\\n\\n" + problem_statement}]`` — a
        conversational ``prompt`` for TRL (the chat template adds the tool schemas).

    Raises:
        ValueError: the task has no non-empty ``problem_statement`` string (names the task).
    """
    ps = getattr(task, "problem_statement", None)
    if not isinstance(ps, str) or not ps.strip():
        raise ValueError(f"problem_statement: task {getattr(task, 'instance_id', task)!r} has "
                         "no problem statement")
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n{ps.strip()}"}]


def policy_tools() -> list[dict]:
    """The agent's tool schemas in the order TRL renders them for an ``environment_factory``.

    TRL 1.16 lists an environment's public methods with ``inspect.getmembers`` (sorted by
    name) and renders them in that order, so the schemas of
    ``ecredit_trl.agent.env.tool_schemas()`` are sorted by function name here; SFT
    demonstrations rendered with this list see the same system text as GRPO rollouts.

    Returns: list of ``{"type": "function", "function": {...}}`` dicts.
    """
    return sorted(tool_schemas(), key=lambda t: t["function"]["name"])
