"""The embedded default policy: a locally built tokenizer + tiny Llama, and its SFT warm start.

* :mod:`.tiny_model` — tokenizer (byte-level BPE, TRL's qwen3 template) and model builders.
* :mod:`.demos` — gold-patch demonstrations (view → str_replace → submit, real tool outputs).
* :mod:`.warmstart` — the SFT warm start on them (cached by a hash of tasks and recipe).
* :mod:`.families` — tiny local models of every family TRL parses tool calls for (tests).
* :mod:`.lora_defaults` — LoRA target modules per architecture, the manifest's LoRA record.
* :mod:`.run_inputs` — a run's tasks and starting policy (train.py and the study).
* :mod:`.preflight` — ``--model`` checks before training: location, chat template, LoRA.
"""
