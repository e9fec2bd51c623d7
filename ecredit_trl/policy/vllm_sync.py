"""vLLM colocate mode (``use_vllm``, ``vllm_mode=colocate``) on a CPU host: the engine's
options and the weight route, chosen by the training device (design page, "Generation engines and scaffolds").

TRL 1.16 builds the colocated ``vllm.LLM`` from the model's path and pushes the trained
weights before each generation round with ``model.load_weights([(name, tensor)])``. Two things
differ on a CPU host, and only there:

- Weights: vLLM's CPU kernels repack every linear layer's weight at load time, so the loaded
  parameters have no ``weight_loader`` and TRL's push fails (``'Parameter' object has no
  attribute 'weight_loader'``). :func:`reload_weights` goes through the engine instead:
  ``collective_rpc("reload_weights", weights_iterator=..., is_checkpoint_format=True)`` with
  the checkpoint-format tensors TRL's own iterator yields (a LoRA adapter merged into them,
  unmerged afterwards), ``lm_head.weight`` added when the embeddings are tied (the
  checkpoint-format reload expects it), then a prefix-cache reset - what TRL does after its
  push. On CUDA TRL's push stays as it is.
- Engine options: TRL passes no dtype, and vLLM's CPU backend then runs in bfloat16; on CPU the
  engine gets the training model's dtype (float32 for the embedded CPU runs, so vLLM's greedy
  tokens equal the trainer's) and ``enforce_eager=True`` (no torch.compile: engine start
  10.7 s instead of 40-51 s for a tiny model here). ``VLLM_CPU_OMP_THREADS_BIND`` defaults to
  ``nobind`` (vLLM would otherwise pin the trainer's OpenMP threads to cores shared with the
  sandboxes) and ``VLLM_CPU_KVCACHE_SPACE`` to 1 (GiB); a user's values win.

Checked in ``tests/test_vllm_colocate.py`` (greedy tokens of vLLM equal HF's on the trained
weights after the sync, full weights and LoRA, and differ before it).
"""

from __future__ import annotations

import contextlib
import os
import types

from ecredit_trl.policy.vllm_deferred import load_trl_vllm_names

__all__ = ["CPU_ENV_DEFAULTS", "checkpoint_weights", "colocate_engine", "colocate_llm_kwargs",
           "install_weight_route", "reload_weights", "training_device_type",
           "weight_route"]

#: vLLM CPU settings given when unset (the reasons: module docstring).
CPU_ENV_DEFAULTS = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}


def weight_route(device_type: str, vllm_mode: str) -> str:
    """``"reload"`` (:func:`reload_weights`) for colocate mode on a CPU device, else ``"trl"``
    (TRL's own ``sync_weights``)."""
    return "reload" if vllm_mode == "colocate" and device_type == "cpu" else "trl"


def colocate_llm_kwargs(device_type: str, model_dtype) -> dict:
    """Extra ``vllm.LLM`` arguments of colocate mode: on CPU ``dtype`` (the training model's,
    e.g. ``"float32"``) and ``enforce_eager=True``; elsewhere none (TRL's as they are)."""
    if device_type != "cpu":
        return {}
    return {"dtype": str(model_dtype).removeprefix("torch."), "enforce_eager": True}


def training_device_type(args) -> str:
    """``"cpu"`` when the run trains on the CPU (``use_cpu``, or no CUDA device), else
    ``"cuda"`` - known before the trainer's accelerator exists."""
    import torch

    return "cpu" if args.use_cpu or not torch.cuda.is_available() else "cuda"


@contextlib.contextmanager
def colocate_engine(args, model):
    """While TRL builds its colocated engine (``GRPOTrainer.__init__`` with ``args``, a
    GRPOConfig, and ``model``): on a CPU colocate run its ``LLM`` takes
    :func:`colocate_llm_kwargs` too and :data:`CPU_ENV_DEFAULTS` fill unset variables.
    With ``use_vllm`` set, TRL's vLLM names are bound first
    (:func:`~ecredit_trl.policy.vllm_deferred.load_trl_vllm_names`; ImportError without vLLM).
    No other effect otherwise (no vLLM, server mode, a CUDA host)."""
    import torch

    if args.use_vllm:
        # TRL's vLLM names are bound only on demand (vllm_deferred): any trainer built in
        # this block needs them, TRL's own GRPOTrainer as much as ours
        load_trl_vllm_names()
    on = args.use_vllm and args.vllm_mode == "colocate"
    dtype = getattr(model, "dtype", torch.bfloat16 if args.bf16 else torch.float32)
    extra = colocate_llm_kwargs(training_device_type(args), dtype) if on else {}
    if not extra:
        yield
        return
    for k, v in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    import trl.generation.vllm_generation as vg  # vLLM extra: imported only when it is used

    real = vg.LLM

    def llm(*args, **kwargs):
        return real(*args, **{**kwargs, **extra})

    vg.LLM = llm
    try:
        yield
    finally:
        vg.LLM = real


def checkpoint_weights(generation) -> list[tuple[str, object]]:
    """The (name, tensor) pairs TRL's ``VLLMGeneration._iter_named_params`` yields (checkpoint
    names; a peft adapter merged in), each cloned (the adapter is unmerged once the iterator
    ends), plus ``lm_head.weight`` = the input embeddings when the model ties them and the
    iterator did not yield it."""
    weights = [(name, t.detach().clone()) for name, t in generation._iter_named_params()]
    model = generation.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "tie_word_embeddings", False) and "lm_head.weight" not in dict(weights):
        weights.append(("lm_head.weight", base.get_input_embeddings().weight.detach().clone()))
    return weights


def reload_weights(generation) -> int:
    """Push the training model's weights into the colocated engine through vLLM's
    ``reload_weights`` and reset its prefix cache (the CPU route; module docstring).
    Returns the number of tensors pushed."""
    weights = checkpoint_weights(generation)
    generation.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                             "is_checkpoint_format": True})
    generation.llm.reset_prefix_cache()
    return len(weights)


def install_weight_route(trainer) -> str:
    """Give ``trainer.vllm_generation`` the weight route of its device (:func:`weight_route`):
    on a CPU colocate run its ``sync_weights`` becomes :func:`reload_weights`. Returns the
    route name (``"trl"`` when vLLM is off)."""
    if not getattr(trainer, "use_vllm", False):
        return "trl"
    route = weight_route(trainer.accelerator.device.type, trainer.vllm_mode)
    if route == "reload":
        gen = trainer.vllm_generation
        gen.sync_weights = types.MethodType(reload_weights, gen)
    return route
