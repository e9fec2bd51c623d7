"""ecredit-trl: counterfactual edit credit for software agents, trained with TRL."""

from ecredit_trl.policy.vllm_deferred import defer_trl_vllm_import

# before anything imports TRL's trainer (which imports vLLM whenever it is installed)
defer_trl_vllm_import()
