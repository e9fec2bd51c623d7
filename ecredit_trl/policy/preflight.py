"""Checks and settings of a user's ``--model`` before training starts: where it
is (a directory, or a hub id's snapshot in the local hub cache), whether TRL can parse tool
calls from its chat template, and the LoRA configuration of its architecture. Used by
``ecredit_trl/train.py`` before any receipt or rollout."""

from __future__ import annotations

from pathlib import Path

from ecredit_trl.policy.lora_defaults import resolve_lora
from eval.evaluation.modelref import hub_snapshot, looks_like_hub_id
from eval.evaluation.templatecheck import model_template_text, resolve_template_option

__all__ = ["check_template", "lora_config", "model_location"]


def model_location(model: str) -> str:
    """``--model`` as a directory: a local one as given, a hub id as its snapshot in the local
    hub cache (:func:`eval.evaluation.modelref.hub_snapshot`; nothing is downloaded).

    Raises: FileNotFoundError, one line: a path that is no directory, a hub id not cached.
    """
    if Path(model).expanduser().is_dir():
        return model
    if looks_like_hub_id(model):
        return str(hub_snapshot(model))
    raise FileNotFoundError(f"--model: no such model directory {model}")


def check_template(cfg, model_path, given: str) -> str:
    """Refuse, before any receipt or rollout, a policy whose chat template TRL
    has no tool-call parser for (``--chat_template NAME`` replaces it with TRL's copy).
    Reads the saved template text (no tokenizer load). Returns the TRL template name.

    Raises: TemplateRefused (one line), ValueError naming ``--chat_template``.
    """
    text = None if cfg.chat_template else model_template_text(model_path)
    return resolve_template_option(cfg.chat_template, text, str(given))[0]


def lora_config(margs, model_path):
    """peft ``LoraConfig`` of ``--lora_r`` with the architecture's defaults
    (:func:`ecredit_trl.policy.lora_defaults.resolve_lora`, the record the manifest keeps),
    or None for ``lora_r == 0``."""
    lora = resolve_lora(model_path, margs.lora_r, margs.lora_alpha, margs.lora_target_modules)
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=margs.lora_dropout,
                      task_type="CAUSAL_LM", target_modules=lora["target_modules"],
                      modules_to_save=lora["modules_to_save"] or None)
