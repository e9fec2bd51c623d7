"""The embedded default policy: a locally built tokenizer + tiny Llama, and its SFT warm start.

* :mod:`.tiny_model` — tokenizer (byte-level BPE, TRL's qwen3 template) and model builders.
* :mod:`.warmstart` — gold-patch demonstrations and the SFT warm start (cached).
"""
