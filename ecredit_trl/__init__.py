"""ecredit-trl: counterfactual edit credit for software agents, trained with TRL.

The layout and where to change what: design page, "Layers" and "Where to change what".

* :mod:`.credit` — the method: edit blocks, selection, ablation, the contrast D, arms and
  their credit, the signal pilot.
* :mod:`.trainer` — ``ECreditGRPOTrainer`` and the code that runs a generation round.
* :mod:`.agent` — the agent environment, tools, prompts, rollouts and generation engines.
* :mod:`.policy` — the embedded policy, warm starts, tiny model families, model checks.
* :mod:`.runs` — run records: manifest, receipts, ledger, resume, faults.
* :mod:`.study` — the arm study (``ecredit-study``).
* :mod:`.config` — ``ECreditConfig`` (a TRL ``GRPOConfig``).
* :mod:`.train` — the main job (``accelerate launch ecredit_trl/train.py``).
"""

from ecredit_trl.policy.vllm_deferred import defer_trl_vllm_import

# before anything imports TRL's trainer (which imports vLLM whenever it is installed)
defer_trl_vllm_import()
