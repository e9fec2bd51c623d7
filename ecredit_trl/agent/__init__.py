"""The agent environment: tools over a rollout's sandbox, the editor, prompts, rollouts.

* :mod:`.env` — :class:`~.env.SWEAgentEnv`, TRL's ``environment_factory`` (bash + editor tools,
  one snapshot per tool call).
* :mod:`.editor` — SWE-agent ``str_replace_editor`` semantics on the host tree.
* :mod:`.prompts` — the one prompt/tool-schema builder shared by warm start, training, eval.
* :mod:`.generation` — the policy as rollouts see it: settings, seeds, TRL-style rendering,
  sampling and tool-call parsing.
* :mod:`.episode` — one episode of a policy in the environment (the turn rules of TRL's loop).
* :mod:`.episode_record` — an ended training episode → its rollout record and query plan.
* :mod:`.rollouts` — policy rollouts without updates (``ecredit-rollouts``), used by
  evaluation; :mod:`.batched` — many episodes in flight, one generation call per round.
* :mod:`.calls` — tool-loop bookkeeping of one rollout (format errors, calls after submit).
* :mod:`.failures` — how an episode ends on a failure, and who caused it.
* :mod:`.toolpool` — the tool calls of TRL's tool loop in parallel across rollouts.
* :mod:`.vllm_engine` — vLLM generation for batched evaluation rollouts.
* :mod:`.vllm_server` — training against a vLLM server (weight route, stale-weights guard);
  :mod:`.vllm_serve` starts one (``ecredit-vllm-serve``); :mod:`.vllm_worker` is its
  worker side of the file weight route.
* :mod:`.scaffolds` — the tool surface and prompt a policy runs with (adapters).
"""
