"""Bounds of the training fields ``ECreditConfig`` inherits from TRL's ``GRPOConfig`` and
transformers' ``TrainingArguments``, and the checks of field combinations (design page,
"Bad input").

Our own fields declare their bounds beside themselves (``metadata={"bounds": ...}``,
:mod:`sandbox.bounds`); the inherited ones a user can set are declared in
:data:`INHERITED`, one line per field, registered on ``ECreditConfig`` by ``config.py``.
Values that are legal upstream but meaningless here are refused with the reason, never
reinterpreted: ``max_steps <= 0`` ("train epochs instead") because a run counts steps (its
receipts, checkpoints, resume and schedule are in steps), ``top_p > 1``, ``temperature <= 0``
(GRPO samples; greedy decoding is an evaluation setting, ``eval.run --temperature 0``).
vLLM fields are not listed here (their checks sit with the vLLM generation settings).
"""

from __future__ import annotations

import os

from sandbox.bounds import BoundError, Choice, Float, Int, OutDir, Text

__all__ = ["INHERITED", "MIN_TURN_TOKENS", "SIZE_FIELDS", "check_combinations",
           "check_resume_sizes"]

_SEED = "numpy and torch seeds are 32-bit"
_RATIO = "a value < 1 is a fraction of the run's steps (transformers)"

INHERITED = {
    # sampling (TRL's generation settings)
    "temperature": Float(gt=0, why="GRPO samples; logits are divided by it"),
    "top_p": Float(gt=0, le=1, why="a probability mass"),
    "top_k": Int(ge=0, why="0 disables top-k"),
    "min_p": Float(ge=0, le=1, nullable=True, why="a probability"),
    "repetition_penalty": Float(gt=0, why="logits are divided or multiplied by it"),
    # optimisation
    "learning_rate": Float(ge=0, why="a negative rate ascends the loss"),
    "weight_decay": Float(ge=0),
    "warmup_steps": Float(ge=0, why=_RATIO),
    "max_grad_norm": Float(ge=0, why="0 turns clipping off"),
    "adam_beta1": Float(ge=0, lt=1),
    "adam_beta2": Float(ge=0, lt=1),
    "adam_epsilon": Float(gt=0),
    "beta": Float(ge=0, why="KL coefficient"),
    "epsilon": Float(ge=0, why="clip range"),
    "epsilon_high": Float(ge=0, nullable=True, why="upper clip range"),
    "num_iterations": Int(ge=1),
    "seed": Int(ge=0, le=2**32 - 1, why=_SEED),
    # lengths, steps and batch sizes
    "max_completion_length": Int(ge=1, why="tokens of the whole episode, tool results included"),
    "max_steps": Int(ge=1, why="a run counts steps (receipts, checkpoints, resume); "
                               "transformers' <= 0 'train epochs instead' is refused"),
    "num_train_epochs": Float(gt=0, why="unused: max_steps ends a run"),
    "per_device_train_batch_size": Int(ge=1),
    "per_device_eval_batch_size": Int(ge=1),
    "gradient_accumulation_steps": Int(ge=1),
    "num_generations": Int(ge=2, why="a GRPO group needs two completions to compare"),
    "num_generations_eval": Int(ge=1, nullable=True),
    "steps_per_generation": Int(ge=1, nullable=True),
    "generation_batch_size": Int(ge=1, nullable=True),
    "max_tool_calling_iterations": Int(ge=0, nullable=True, why="default max_turns - 1"),
    "dataloader_num_workers": Int(ge=0),
    # save / eval / logging cadence
    "save_steps": Float(gt=0, why=_RATIO),
    "eval_steps": Float(gt=0, nullable=True, why=_RATIO),
    "logging_steps": Float(gt=0, why=_RATIO),
    "save_total_limit": Int(ge=1, nullable=True, why="checkpoints kept; None keeps all"),
    "save_strategy": Choice("no", "steps", "epoch", "best"),
    "logging_strategy": Choice("no", "steps", "epoch"),
    "eval_strategy": Choice("no", "steps", "epoch"),
    # paths and names
    "output_dir": OutDir(nullable=True, why="default: runs_dir/<run name>"),
    "run_name": Text(nullable=True),
}
"""GRPOConfig / TrainingArguments field -> its bound (one line each; a field left out passes
through to TRL unchecked, as upstream)."""

#: Tokens below which ``max_completion_length`` cannot hold one assistant turn: the shortest
#: complete turn is a ``submit`` call in TRL's tool-call format
#: (``<tool_call>{"name": "submit", "arguments": {}}</tool_call>``, 57 characters), which
#: takes more than 16 tokens at the 3-4 characters per token of BPE tokenizers on such text.
MIN_TURN_TOKENS = 16

#: Fields that fix the data order and the groups of a run: a resume must keep them.
SIZE_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
               "steps_per_generation", "generation_batch_size")


def _world_size() -> int:
    """Processes of this launch, read as TRL's ``__post_init__`` will see them
    (``WORLD_SIZE``, set by accelerate and torchrun; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_combinations(cfg) -> None:
    """Checks across fields, before TRL's ``__post_init__`` divides by any of them.

    * the generation batch (``per_device_train_batch_size`` x processes x
      ``steps_per_generation``, which defaults to ``gradient_accumulation_steps``; or
      ``generation_batch_size``) must be a multiple of ``num_generations`` (TRL's rule: a
      batch holds whole groups);
    * ``max_completion_length`` >= :data:`MIN_TURN_TOKENS`.

    Raises: BoundError, one line naming the fields, their values and the rule.
    """
    world = _world_size()
    g = cfg.num_generations
    if cfg.generation_batch_size is not None:
        total, how = cfg.generation_batch_size, f"generation_batch_size {cfg.generation_batch_size}"
    else:
        spg = cfg.steps_per_generation or cfg.gradient_accumulation_steps
        src = "steps_per_generation" if cfg.steps_per_generation else "gradient_accumulation_steps"
        total = cfg.per_device_train_batch_size * world * spg
        how = (f"per_device_train_batch_size {cfg.per_device_train_batch_size} x processes "
               f"{world} x {src} {spg} = {total}")
    if g and total % g:
        raise BoundError(f"--num_generations: {g} does not divide the generation batch ({how}): "
                         "each batch must hold whole groups of num_generations completions "
                         "(TRL's rule); choose sizes whose product is a multiple of it")
    if cfg.max_completion_length is not None and cfg.max_completion_length < MIN_TURN_TOKENS:
        raise BoundError(f"--max_completion_length: {cfg.max_completion_length} is shorter than "
                         f"one turn's minimum ({MIN_TURN_TOKENS} tokens: the shortest complete "
                         "turn, a submit tool call); it budgets the whole episode")


def check_resume_sizes(recorded: dict, cfg, allowed: list[str]) -> None:
    """A resume must keep the sizes that fix the data order and the groups
    (:data:`SIZE_FIELDS`, and the world size) unless each change is accepted with
    ``--allow-changed FIELD`` (``allowed``, earlier resumes' acceptances included).

    Args:
        recorded: the run's manifest (``config.ecredit`` and ``world_size``).

    Raises: BoundError, one line listing each changed size (recorded -> now).
    """
    old = (recorded.get("config") or {}).get("ecredit") or {}
    now = {name: getattr(cfg, name) for name in SIZE_FIELDS} | {"world_size": cfg.world_size}
    old = {name: old.get(name) for name in SIZE_FIELDS} | {
        "world_size": recorded.get("world_size")}
    changed = [f"{k} {old[k]} -> {now[k]}" for k in now
               if old[k] is not None and old[k] != now[k] and k not in allowed]
    if changed:
        raise BoundError("resume refused: changed sizes (" + ", ".join(changed) + ") would change "
                         "the run's data order and groups; pass the original values, or accept "
                         "each with --allow-changed FIELD --reason TEXT")
