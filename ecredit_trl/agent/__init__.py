"""The agent environment: tools over a rollout's sandbox, the editor, prompts, rollouts.

* :mod:`.env` — :class:`~.env.SWEAgentEnv`, TRL's ``environment_factory`` (bash + editor tools,
  one snapshot per tool call).
* :mod:`.editor` — SWE-agent ``str_replace_editor`` semantics on the host tree.
* :mod:`.prompts` — the one prompt/tool-schema builder shared by warm start, training, eval.
* :mod:`.generation` — the policy as rollouts see it: settings, seeds, TRL-style rendering,
  sampling and tool-call parsing.
* :mod:`.episode_record` — an ended training episode → its rollout record and query plan.
* :mod:`.rollouts` — policy rollouts without updates (``python -m ecredit_trl.agent.rollouts``),
  used by evaluation.
"""
