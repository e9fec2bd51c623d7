"""What a training run starts from: its tasks and its policy.

:func:`tasks_and_policy` resolves both exactly as the main job does, so the study's
step-0 baseline is the very policy its runs start from; :func:`load_policy` loads that
policy for training (tokenizer with the chosen chat template, model, LoRA config).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ecredit_trl.agent.scaffolds import default_scaffold_config
from ecredit_trl.policy.preflight import check_template, lora_config, model_location
from ecredit_trl.policy.scaffold_warmstart import scaffold_policy
from ecredit_trl.policy.warmstart import default_policy_tasks, ensure_default_policy
from eval.evaluation.templatecheck import resolve_template_option
from eval.tasks.presence import require_task_images
from eval.tasks.splits import load_tasks
from sandbox.cluster.dispatch import connect


def tasks_and_policy(cfg, margs) -> tuple[list, str | Path]:
    """The training tasks (``--max_tasks`` of them) and the policy's path: ``--model``, or
    the embedded policy, built and warm-started on every training task on first use
    (:func:`ecredit_trl.policy.warmstart.default_policy_tasks`). Sets ``cfg.scaffold_config``
    to the config the run uses (:func:`ecredit_trl.agent.scaffolds.default_scaffold_config`:
    with the embedded policy and ``--scaffold mini-swe-agent`` without ``--scaffold_config``,
    the compact config shipped in this package).

    Args:
        cfg: :class:`~ecredit_trl.config.ECreditConfig` (``tasks``, ``max_tasks``, the
            sandbox backend and runtime, ``chat_template``).
        margs: the main job's ``ModelArguments`` (``model``, ``warmstart_steps``).

    Raises: ValueError (no training tasks; image-held tasks without ``--model`` and without
    a bundled twin), FileNotFoundError (a local ``--model`` path that is no directory, a hub
    id not in the local hub cache), TemplateRefused (a chat template TRL has no tool-call
    parser for), RayUnavailable (``sandbox_backend=ray`` and no cluster answers, or one
    without token authentication that the run does not allow).
    """
    # one line before any task build, warm start or receipt: the cluster answers and enforces
    # token authentication; the sandbox nodes hold (or pull) the images, recorded from their
    # storage in the manifest
    if cfg.sandbox_backend == "ray":
        connect(cfg.ray_address, cfg.sandbox_allow_unauthenticated)  # the runtime reuses it
    all_tasks = load_tasks(cfg.tasks, purpose="train")
    if not all_tasks:
        raise ValueError(f"tasks: no training tasks in {cfg.tasks!r}")
    if cfg.runtime == "podman" and cfg.sandbox_backend == "local":
        require_task_images(all_tasks[: cfg.max_tasks] if cfg.max_tasks else all_tasks,
                            cfg.tasks)
    # the scaffold config of this run, set on cfg here so that every later get_scaffold (the
    # trainer, the manifest, the prompt-length check) and the recorded config see it
    cfg.scaffold_config = default_scaffold_config(cfg.scaffold, cfg.scaffold_config,
                                                  embedded_policy=margs.model is None)
    if margs.model is None:
        # warm-started on every training task, so --max_tasks reuses the cached policy (image
        # tasks: on their bundled twins; other image-only sets need --model)
        kw = {"steps": margs.warmstart_steps} if margs.warmstart_steps else {}
        warm_tasks = default_policy_tasks(cfg.tasks, all_tasks)
        model_path = ensure_default_policy(warm_tasks, **kw)
        # another scaffold: a short SFT on its format, from the built-in policy (cached apart)
        model_path = scaffold_policy(model_path, warm_tasks, cfg)
    else:
        model_path = model_location(margs.model)
    check_template(cfg, model_path, margs.model or "the embedded policy")
    tasks = all_tasks[: cfg.max_tasks] if cfg.max_tasks else all_tasks
    return tasks, model_path


def load_policy(cfg, margs, model_path):
    """(tokenizer, model, LoRA config or None) of the policy to train; the tokenizer carries
    TRL's template ``cfg.chat_template`` when given (saved with every checkpoint, so
    ``eval.run`` on the run needs no flag). The model is bfloat16 with ``cfg.bf16``, else
    float32."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # the loaded text is checked again: what the trainer parses with is what counts
    _, tokenizer.chat_template = resolve_template_option(
        cfg.chat_template, tokenizer.chat_template, str(margs.model or model_path))
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.bfloat16 if cfg.bf16 else torch.float32)
    return tokenizer, model, lora_config(margs, model_path)


__all__ = ["load_policy", "tasks_and_policy"]
