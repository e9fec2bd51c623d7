"""The embedded default policy: a locally built tokenizer + tiny Llama, and its SFT warm start.

* :mod:`.tiny_model` — tokenizer (byte-level BPE, TRL's qwen3 template) and model builders.
* :mod:`.demos` — gold-patch demonstrations (view → str_replace → submit, real tool outputs).
* :mod:`.warmstart` — the SFT warm start on them (cached by a hash of tasks and recipe).
* :mod:`.site_demos` — a localized world's copy curriculum: demonstrations at mutation sites
  of the training functions, line-shifted (the warm-start recipe's ``site_demos``).
* :mod:`.families` — tiny local models of every family TRL parses tool calls for (tests).
* :mod:`.lora_defaults` — LoRA target modules per architecture, the manifest's LoRA record.
* :mod:`.run_inputs` — a run's tasks and starting policy (train.py and the study).
* :mod:`.preflight` — ``--model`` checks before training: location, chat template, LoRA.
* :mod:`.corpus` — the demonstrations as warm-start text and SFT examples.
* :mod:`.sft` — the one SFT path the three warm starts share (``run_sft_job``: job folder →
  model folder; the training child, torch threads, progress, saving).
* :mod:`.family_warmstart` — the SFT warm start of a tiny model of any family
  (``ecredit-family-warmstart``).
* :mod:`.harmful_sites` — where the positive control's harmful edit goes (screened by trials).
* :mod:`.scaffold_demos` / :mod:`.scaffold_warmstart` — demonstrations and the warm start in
  another scaffold's format.
* :mod:`.vllm_checks` — ``use_vllm`` settings checked before a run starts;
  :mod:`.vllm_deferred` — vLLM imported only when a run generates with it;
  :mod:`.vllm_sync` — vLLM colocate mode on a CPU host (engine options, weight route).
"""
